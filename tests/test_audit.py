"""Audits: the epsilon lower bound passes correct mechanisms and catches broken ones."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from swarmjax.privacy import accounting, audit, mechanisms

N = 200_000
# A correct mechanism fails an audit with probability <= 1 - confidence; at 0.999 a suite of
# a dozen audits stays reliable under any random stream (at 0.95 one in ~20 streams fails).
CONFIDENCE = 0.999


def _keys(seed):
    return jax.random.fold_in(jax.random.key(seed), 0), jax.random.fold_in(jax.random.key(seed), 1)


def _laplace(scale_factor, claimed_eps=1.0):
    ka, kb = _keys(0)
    sens = scale_factor  # noise scale = sens / eps; the neighbours differ by 1
    a = mechanisms.laplace_mechanism(ka, jnp.zeros(N), l1_sensitivity=sens, epsilon=claimed_eps)
    b = mechanisms.laplace_mechanism(kb, jnp.ones(N), l1_sensitivity=sens, epsilon=claimed_eps)
    return np.asarray(a), np.asarray(b)


def test_laplace_correct_passes_and_half_scale_is_caught():
    ok = audit.empirical_epsilon_lower_bound(*_laplace(1.0), confidence=CONFIDENCE)
    assert ok.epsilon_lower <= 1.0
    assert ok.epsilon_lower > 0.8  # the audit is not vacuous
    broken = audit.empirical_epsilon_lower_bound(*_laplace(0.5))
    assert broken.epsilon_lower > 1.0
    assert broken.epsilon_hat == pytest.approx(2.0, abs=0.2)


def _gaussian(sigma, delta_shift=1.0):
    ka, kb = _keys(1)
    kw = dict(l2_sensitivity=1.0, noise_multiplier=sigma)
    a = mechanisms.gaussian_mechanism(ka, jnp.zeros(N), **kw)
    b = mechanisms.gaussian_mechanism(kb, jnp.full(N, delta_shift), **kw)
    return np.asarray(a), np.asarray(b)


@pytest.mark.parametrize("calibration", ["classical", "accountant"])
def test_gaussian_correct_passes_and_half_noise_is_caught(calibration):
    eps, delta = 0.9, 1e-3
    if calibration == "classical":
        sigma = mechanisms.gaussian_sigma(eps, delta)
    else:
        sigma = accounting.sigma_for_epsilon(eps, 1.0, 1, delta)
    ok = audit.empirical_epsilon_lower_bound(*_gaussian(sigma), delta=delta, confidence=CONFIDENCE)
    assert ok.epsilon_lower <= eps
    broken = audit.empirical_epsilon_lower_bound(*_gaussian(sigma / 2), delta=delta)
    assert broken.epsilon_lower > eps


@pytest.mark.parametrize("keep_prob", [0.6, 0.7, 0.8, 0.9])
def test_randomized_response_k8(keep_prob):
    k = 8
    ka, kb = _keys(2)
    a = mechanisms.randomized_response(ka, jnp.zeros(N, jnp.int32), k, keep_prob)
    b = mechanisms.randomized_response(kb, jnp.ones(N, jnp.int32), k, keep_prob)
    result = audit.empirical_epsilon_lower_bound(
        np.asarray(a), np.asarray(b), confidence=CONFIDENCE
    )
    claimed = float(mechanisms.randomized_response_epsilon(keep_prob, k))
    assert result.epsilon_lower <= claimed
    assert result.epsilon_lower > 0.9 * claimed
    assert "==" in result.event  # discrete outputs detected from the integer dtype
    wrong_claim = math.log(keep_prob / (1 - keep_prob))  # forgets the c - 1 other categories
    assert result.epsilon_lower > wrong_claim


def test_random_dictatorship_and_a_broken_variant():
    m = 4
    votes_d = jnp.array([0, 0, 1, 0])  # three real voters, fourth slot padding
    mask_d = jnp.array([True, True, True, False])
    mask_d2 = jnp.array([True, True, True, True])  # D' adds a voter for alternative 0...
    votes_d2 = votes_d.at[3].set(3)  # ...who prefers alternative 3 (no real vote in D)
    ka, kb = _keys(3)
    keys_a = jax.random.split(ka, N)
    keys_b = jax.random.split(kb, N)
    run = jax.jit(
        jax.vmap(
            lambda k, v, msk: mechanisms.random_dictatorship(k, v, msk, m)[0],
            in_axes=(0, None, None),
        )
    )
    a, b = np.asarray(run(keys_a, votes_d, mask_d)), np.asarray(run(keys_b, votes_d2, mask_d2))
    claimed = float(mechanisms.random_dictatorship_epsilon(3 + m))
    result = audit.empirical_epsilon_lower_bound(a, b, confidence=CONFIDENCE)
    assert result.epsilon_lower <= claimed

    # Without dummy voters alternative 3 is impossible under D: epsilon is infinite.
    def no_dummies(key, votes, msk):
        counts = mechanisms.vote_counts(votes, msk, m).astype(jnp.float32)
        return jax.random.categorical(key, jnp.log(counts))

    run_broken = jax.jit(jax.vmap(no_dummies, in_axes=(0, None, None)))
    a = np.asarray(run_broken(keys_a, votes_d, mask_d))
    b = np.asarray(run_broken(keys_b, votes_d2, mask_d2))
    assert audit.empirical_epsilon_lower_bound(a, b).epsilon_lower > 3 * claimed


def test_identical_distributions_give_no_privacy_loss():
    rng = np.random.default_rng(0)
    result = audit.empirical_epsilon_lower_bound(rng.normal(size=50_000), rng.normal(size=50_000))
    assert result.epsilon_lower < 0.05


def test_membership_inference_advantage():
    adv, thr = audit.membership_inference_advantage([0.1, 0.2], [0.3, 0.4])
    assert adv == 1.0 and thr == 0.2
    assert audit.membership_inference_advantage([0.5, 0.6], [0.1, 0.2]) == (0.0, -math.inf)
    rng = np.random.default_rng(1)
    members, nonmembers = rng.normal(0.0, 1.0, 20_000), rng.normal(1.0, 1.0, 20_000)
    adv, thr = audit.membership_inference_advantage(members, nonmembers)
    assert adv == pytest.approx(2 * stats.norm.cdf(0.5) - 1, abs=0.02)
    assert thr == pytest.approx(0.5, abs=0.2)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (
            lambda: audit.empirical_epsilon_lower_bound(np.zeros(10), np.ones(10), delta=1.0),
            "delta",
        ),
        (
            lambda: audit.empirical_epsilon_lower_bound(np.zeros(10), np.ones(10), confidence=1.0),
            "confidence",
        ),
        (lambda: audit.empirical_epsilon_lower_bound(np.zeros((10, 2)), np.ones(10)), "samples_a"),
        (lambda: audit.empirical_epsilon_lower_bound(np.zeros(10), [np.inf] * 10), "samples_b"),
        (lambda: audit.membership_inference_advantage([], [1.0]), "member_losses"),
        (lambda: audit.membership_inference_advantage([1.0], [np.nan]), "nonmember_losses"),
    ],
)
def test_invalid_input_names_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()
