"""DP-FTRL's matrix-factorization noise (swarmjax.privacy.ftrl) and its privacy plan: the
noise's covariance, the sensitivity against brute force, the prefix-sum baseline against
DP-SGD's mechanism, the state's size, epsilon against dp-accounting, schedules and bad input.

The strategies are small (6 rounds) and cached per process; the BLT has one buffer (its
optimisation by jax-privacy is the slowest step of the file)."""

from __future__ import annotations

import itertools

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from swarmjax.privacy import accounting
from swarmjax.privacy.ftrl import (
    Participation,
    build_strategy,
    check_schedule,
    cohort_schedule,
    correlated_noise,
    noise_state,
    strategy_matrix,
)
from swarmjax.privacy.mechanisms import gaussian_mechanism
from swarmjax.privacy.plan import PrivacyPlan

T, B, K = 6, 2, 3
SCHEME = Participation(T, B, K)
KWARGS = {"blt": {"buffers": 1}, "banded": {}, "prefix-sum": {}}


def strategy(name):
    return build_strategy(name, SCHEME, **KWARGS[name])


def draws(s, rounds: int, coords: int, std: float, seed: int = 0) -> np.ndarray:
    """``(rounds, coords)`` noise of ``s``: each coordinate one independent run."""
    like = {"w": jnp.zeros((coords,), jnp.float32)}

    @jax.jit
    def run(key):
        def step(state, t):
            noise, state = correlated_noise(s, state, jax.random.fold_in(key, t), like, std)
            return state, noise["w"]

        return jax.lax.scan(step, noise_state(s, like), jnp.arange(rounds))[1]

    return np.asarray(run(jax.random.key(seed)), np.float64)


@pytest.mark.parametrize("name", ["blt", "banded", "prefix-sum"])
def test_noise_covariance_is_the_factorizations(name):
    """Over rounds the noise is ``s (C^{-1} z)`` with ``z ~ N(0, I)``: its covariance is
    ``s^2 C^{-1} C^{-T}`` with ``C`` materialised by jax-privacy. 60,000 independent
    coordinates: every entry's standard error is below ``sqrt(2) s^2 / 245``; we allow 5 of
    them."""
    s, std, coords = strategy(name), 0.7, 60_000
    x = draws(s, T, coords, std)
    empirical = x @ x.T / coords
    c_inv = np.linalg.inv(strategy_matrix(s, T))
    expected = std**2 * c_inv @ c_inv.T
    scale = np.sqrt(np.outer(np.diag(expected), np.diag(expected)) + expected**2)
    assert np.all(np.abs(empirical - expected) <= 5 * scale / np.sqrt(coords))
    assert np.abs(x.mean()) < 5 * std / np.sqrt(coords)
    if name != "prefix-sum":  # the noise really is correlated
        assert np.abs(expected - np.diag(np.diag(expected))).max() > 0.05 * std**2


@pytest.mark.parametrize("name", ["blt", "banded", "prefix-sum"])
def test_sensitivity_equals_brute_force_over_participation_patterns(name):
    """jax-privacy's ``(k, b)``-min-separation sensitivity equals the largest ``||C u||`` over
    every pattern of at most ``k`` rounds at least ``b`` apart (``u`` their indicator: the
    strategies' entries are non-negative, so same-direction contributions are the worst),
    enumerated here without jax-privacy."""
    s = strategy(name)
    c = strategy_matrix(s, T)
    assert c.min() >= -1e-7
    best = 0.0
    for size in range(1, K + 1):
        for rounds in itertools.combinations(range(T), size):
            if all(j - i >= B for i, j in itertools.pairwise(rounds)):
                u = np.zeros(T)
                u[list(rounds)] = 1.0
                best = max(best, float(np.linalg.norm(c @ u)))
    np.testing.assert_allclose(float(s.sensitivity), best, rtol=1e-5)


def test_prefix_sum_releases_equal_dp_sgds_gaussian_mechanism():
    """The claim: with the plain prefix-sum factorization (``C = I``), the sum released in
    round ``t``, ``x_t + (C^{-1} z)_t``, is bit for bit DP-SGD's Gaussian mechanism on
    ``x_t`` with the same key and std ``z clip sens`` (``sens = sqrt(k)``), so the released
    prefix sums are ``A x + A z`` (``B = A``): independent noise each round."""
    s = strategy("prefix-sum")
    np.testing.assert_allclose(float(s.sensitivity), np.sqrt(K), rtol=1e-6)
    multiplier, clip = 1.3, 0.4
    std = (multiplier * s.sensitivity) * clip  # as gaussian_mechanism multiplies
    xs = jax.random.normal(jax.random.key(7), (T, 5, 3))
    keys = [jax.random.fold_in(jax.random.key(3), t) for t in range(T)]
    state = noise_state(s, xs[0])
    released, dpsgd = [], []
    for t in range(T):
        noise, state = correlated_noise(s, state, keys[t], xs[t], std)
        released.append(xs[t] + noise)
        dpsgd.append(
            gaussian_mechanism(
                keys[t], xs[t], l2_sensitivity=clip, noise_multiplier=multiplier * s.sensitivity
            )
        )
    np.testing.assert_array_equal(np.stack(released), np.stack(dpsgd))
    z = np.stack(dpsgd) - np.asarray(xs)
    np.testing.assert_allclose(
        np.cumsum(np.stack(released), 0), np.cumsum(xs, 0) + np.cumsum(z, 0), atol=1e-5
    )


def test_the_noise_state_does_not_grow_with_the_rounds():
    """A BLT keeps its buffers, a band its last ``bands`` noises (and a round index), the
    prefix sum nothing, over the flattened ``P = 15`` coordinates: the same for 6 rounds as
    for 60."""
    like = {"w": jnp.zeros((4, 3)), "b": jnp.zeros((3,))}

    def shapes(state):
        return sorted((a.shape for a in jax.tree.leaves(state)), key=str)

    assert shapes(noise_state(strategy("blt"), like)) == [(1, 15)]
    for rounds in (6, 60):
        band = build_strategy("banded", Participation(rounds, 2, 3), bands=2)
        assert shapes(noise_state(band, like)) == [(), (2, 15)]
    assert jax.tree.leaves(noise_state(strategy("prefix-sum"), like)) == []


def test_plan_epsilon_equals_dp_accountings_gaussian():
    """The min-separation plan's epsilon is dp-accounting's for ONE Gaussian mechanism of
    multiplier ``z``, computed here with dp-accounting's own PLD (swarmjax's discretisation
    interval) and RDP accountants; calibration reaches the target from below."""
    spec = dict(unit="client", population=1200, cohort=50, steps=96, delta=1 / 1200)
    plan = PrivacyPlan.min_separation_cohorts(**spec, min_separation=24, max_participations=None)
    assert plan.participations == 4 and plan.overflow == 0.0
    calibrated = plan.calibrate(2.0)
    z = calibrated.noise_multiplier
    pld = pld_privacy_accountant.PLDAccountant(
        value_discretization_interval=accounting.PLD_INTERVAL
    )
    pld.compose(dp_accounting.GaussianDpEvent(z))
    assert calibrated.epsilon() == pytest.approx(pld.get_epsilon(1 / 1200), rel=1e-9)
    assert 1.99 < calibrated.epsilon() <= 2.0
    rdp_plan = PrivacyPlan.min_separation_cohorts(
        **spec, min_separation=24, max_participations=None, accountant="rdp"
    )
    rdp_plan = rdp_plan.calibrate(2.0)
    rdp = rdp_privacy_accountant.RdpAccountant(list(accounting.DEFAULT_ORDERS))
    rdp.compose(dp_accounting.GaussianDpEvent(rdp_plan.noise_multiplier))
    assert rdp_plan.epsilon() == pytest.approx(rdp.get_epsilon(1 / 1200), rel=1e-9)


@pytest.mark.parametrize("kind", ["cyclic", "random", "single"])
def test_schedules_keep_the_scheme(kind):
    scheme = Participation.single(8) if kind == "single" else Participation(12, 3, 3)
    n, m = (40, 5) if kind == "single" else (20, 4)
    s = cohort_schedule(kind, n, m, scheme, seed=2)
    assert s.shape == (scheme.rounds, m) and s.dtype == np.int32
    counts = np.bincount(s.ravel(), minlength=n)
    assert counts.max() <= scheme.participations
    for c in range(n):
        rounds = np.flatnonzero((s == c).any(axis=1))
        assert np.all(np.diff(rounds) >= scheme.min_separation)
    np.testing.assert_array_equal(s, cohort_schedule(kind, n, m, scheme, seed=2))


def test_a_schedule_that_breaks_the_scheme_is_refused_naming_the_client():
    scheme = Participation(6, 3, 2)
    check_schedule(cohort_schedule("cyclic", 6, 2, scheme), 6, scheme)
    close = np.array([[0], [1], [0], [2], [3], [4]], np.int32)  # client 0 in rounds 1 and 3
    with pytest.raises(ValueError, match=r"schedule refused: client 0 .* rounds 1 and 3"):
        check_schedule(close, 6, scheme)
    often = np.array([[0], [1], [2], [0], [1], [0]], np.int32)  # client 0 three times
    with pytest.raises(ValueError, match=r"client 0 would participate 3 times.*k=2"):
        check_schedule(often, 6, scheme)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: Participation(5, 6), "min_separation"),
        (lambda: Participation(10, 4, 4), "max_participations"),
        (lambda: build_strategy("tree", SCHEME), "factorization"),
        (lambda: build_strategy("banded", SCHEME, bands=3), "bands"),
        (lambda: cohort_schedule("cyclic", 10, 3, Participation(8, 4)), "cohort"),
        (lambda: cohort_schedule("cyclic", 10, 4, Participation(8, 2, 2)), "cohort"),
        (lambda: cohort_schedule("single", 10, 2, Participation(8, 2)), "single"),
        (lambda: cohort_schedule("cyclic", 3, 4, Participation(8, 1)), "cohort"),
        (
            lambda: PrivacyPlan("client", 10, 1.0, 5, 1e-3, participation="min-separation"),
            "min_separation",
        ),
    ],
)
def test_bad_input_is_one_line_naming_the_option(call, name):
    with pytest.raises(ValueError, match=name) as info:
        call()
    assert "\n" not in str(info.value)
