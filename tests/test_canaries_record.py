"""Record-level gradient canaries for DP-SGD / DP-Adam (swarmjax.privacy.canaries.
GradientCanaries with dpsgd.dp_grad(canary_sum=...)): the broken-mechanism drill (noise
scaled down tenfold from the test, never by a production flag), the one-run bound of the
real mechanism below its accounted epsilon, and bad input.

200 random records, Poisson rate 0.8, 40 steps, claimed epsilon 2 at delta 1e-5; 512
canaries on a 1,994-parameter MLP.  The clip norm (1000) is large against the records'
gradients (a public hyper-parameter), so the records hardly reach along any canary
direction and the drill measures the noise alone.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from swarmjax import models
from swarmjax.privacy import accounting, dpsgd
from swarmjax.privacy.canaries import (
    CanaryAudit,
    GradientCanaries,
    canary_directions,
    canary_dots,
)

N, Q, STEPS, DELTA, CLIP, EPSILON = 200, 0.8, 40, 1e-5, 1000.0, 2.0
MODEL = models.mlp((64,), 10, (4, 5, 1))  # 1,994 parameters
AUDIT = CanaryAudit(512, score="gradient")


@pytest.fixture(scope="module")
def records():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 4, 5, 1)).astype(np.float32)
    return x, rng.integers(0, 10, N)


@pytest.fixture(scope="module")
def sigma():
    return accounting.sigma_for_epsilon(EPSILON, Q, STEPS, DELTA)


def _train(records, sigma, optimizer, audit=AUDIT):
    """One DP run with gradient canaries: ``(initial params, final params, canaries)``."""
    x, y = records
    params = MODEL.init(jax.random.key(0))
    canaries = GradientCanaries.create(jax.random.key(1), audit, params, CLIP)

    @jax.jit
    def train(params, canaries):
        def step(carry, t):
            p, opt, c = carry
            k = dpsgd.noise_key(jax.random.key(2), t)
            mask = jax.random.bernoulli(jax.random.fold_in(k, 0), Q, (N,))
            extra, _ = c.gradient_sum(jax.random.fold_in(k, 1), Q)
            g = dpsgd.dp_grad(
                jax.random.fold_in(k, 2),
                p,
                x,
                y,
                mask,
                apply_fn=MODEL.apply,
                loss_fn=models.cross_entropy,
                clip_norm=CLIP,
                noise_multiplier=sigma,
                expected_batch_size=Q * N,
                canary_sum=extra,
            )
            updates, opt = optimizer.update(g, opt, p)
            return (optax.apply_updates(p, updates), opt, c.observe(g)), None

        start = (params, optimizer.init(params), canaries)
        return jax.lax.scan(step, start, jnp.arange(STEPS))[0]

    final, _, canaries = train(params, canaries)
    return params, final, canaries


def test_real_dp_sgd_stays_below_the_accounted_epsilon(records, sigma):
    params, final, canaries = _train(records, sigma, optax.sgd(1e-5))
    report = canaries.report(AUDIT, epsilon=EPSILON, delta=DELTA)
    assert report.unit == "record" and report.score == "gradient"
    assert 0.0 <= report.epsilon_lower < EPSILON and not report.exceeds
    # SGD's final change is -lr * (sum of noised gradients): the black-box cosine ranks the
    # canaries as the white-box sum does, so both give the same bound
    black_box = CanaryAudit(512, score="cosine")
    cosine = canaries.report(black_box, epsilon=EPSILON, delta=DELTA, initial=params, final=final)
    assert cosine.epsilon_lower == pytest.approx(report.epsilon_lower, abs=1e-6)
    assert cosine.auroc == pytest.approx(report.auroc, abs=1e-6)


def test_real_dp_adam_stays_below_the_accounted_epsilon(records, sigma):
    _, _, canaries = _train(records, sigma, optax.adamw(1e-4, weight_decay=1e-4))
    report = canaries.report(AUDIT, epsilon=EPSILON, delta=DELTA)
    assert 0.0 <= report.epsilon_lower < EPSILON and not report.exceeds


def test_tenfold_less_noise_is_caught(records, sigma, monkeypatch):
    real = dpsgd.gaussian_mechanism

    def weak(key, value, *, l2_sensitivity, noise_multiplier):
        return real(
            key, value, l2_sensitivity=l2_sensitivity, noise_multiplier=noise_multiplier / 10
        )

    monkeypatch.setattr(dpsgd, "gaussian_mechanism", weak)
    _, _, canaries = _train(records, sigma, optax.sgd(1e-5))
    report = canaries.report(AUDIT, epsilon=EPSILON, delta=DELTA)
    assert report.epsilon_lower > EPSILON and report.exceeds
    assert report.tpr_at_fpr > 0.9


def test_canary_sum_is_drawn_at_the_rate_and_of_clip_norm():
    params = MODEL.init(jax.random.key(0))
    canaries = GradientCanaries.create(jax.random.key(3), CanaryAudit(64), params, 2.5)
    total, drawn = canaries.gradient_sum(jax.random.key(4), 1.0)
    assert np.array_equal(drawn, canaries.included)  # q = 1: every in canary, no out one
    # orthonormal directions: the sum's norm is C sqrt(drawn), its dots C on drawn ones
    dots = np.asarray(canary_dots(canaries.directions, total))
    np.testing.assert_allclose(dots, np.where(drawn, 2.5, 0.0), atol=1e-4)
    _, none = canaries.gradient_sum(jax.random.key(4), 0.0)
    assert not np.any(none)


def test_directions_are_orthonormal():
    like = {"a": jnp.zeros((7, 3)), "b": jnp.zeros((5,))}
    dirs = canary_directions(jax.random.key(0), like, 20)
    flat = np.concatenate([np.asarray(dirs["a"]).reshape(20, -1), np.asarray(dirs["b"])], axis=1)
    np.testing.assert_allclose(flat @ flat.T, np.eye(20), atol=1e-5)


def test_bad_input_names_the_option():
    params = MODEL.init(jax.random.key(0))
    with pytest.raises(ValueError, match=r"^audit canaries must be <= 1994 "):
        GradientCanaries.create(jax.random.key(0), CanaryAudit(1995), params, 1.0)
    with pytest.raises(ValueError, match=r"^clip_norm must be in \(0.0, inf\)"):
        GradientCanaries.create(jax.random.key(0), CanaryAudit(8), params, 0.0)
    canaries = GradientCanaries.create(jax.random.key(0), CanaryAudit(8), params, 1.0)
    with pytest.raises(ValueError, match="audit score 'cosine' needs initial= and final="):
        canaries.report(CanaryAudit(8), epsilon=1.0, delta=DELTA)


def test_gathered_canary_sum_is_the_dense_sum():
    """A block smaller than the drawn count takes several passes: the same sum as the
    dense product over every canary; the released sum scores as per-step dots would."""
    params = MODEL.init(jax.random.key(0))
    dense = GradientCanaries.create(jax.random.key(3), CanaryAudit(64), params, 2.5)
    blocked = GradientCanaries.create(jax.random.key(3), CanaryAudit(64), params, 2.5, 0.05)
    assert dense.block == 64 and 1 < blocked.block < 64
    for rate in (0.05, 0.9):  # one pass; many passes (about 29 drawn over a block of ~12)
        want, drawn = dense.gradient_sum(jax.random.key(5), rate)
        got, same = jax.jit(blocked.gradient_sum)(jax.random.key(5), rate)
        assert np.array_equal(drawn, same)
        for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5)
    g1, g2 = (jax.tree.map(lambda p, s=s: jnp.full(p.shape, s), params) for s in (0.5, -2.0))
    seen = dense.observe(g1).observe(g2)
    want = canary_dots(dense.directions, g1) + canary_dots(dense.directions, g2)
    np.testing.assert_allclose(seen.scores, want, atol=1e-4)
