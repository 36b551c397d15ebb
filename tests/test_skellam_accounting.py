"""Skellam accounting: the RDP bound against exact divergences, the rounding bound, the
Gaussian limit, an exact (eps, delta) profile, calibration, and accounting.py's registration."""

from __future__ import annotations

import functools
import math

import dp_accounting
import mpmath
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import ive

from swarmjax.privacy import accounting as acc
from swarmjax.privacy import skellam as sk

ORDERS = np.arange(2, 65)  # the integer orders the exhaustive check covers
MUS = (0.25, 1.0, 4.0, 16.0, 64.0)


def _square_partitions(budget: int, largest: int) -> list[tuple[int, ...]]:
    """Nonincreasing tuples of positive integers with sum of squares <= budget."""
    out: list[tuple[int, ...]] = [()]
    for first in range(min(largest, math.isqrt(budget)), 0, -1):
        out += [(first, *rest) for rest in _square_partitions(budget - first * first, first)]
    return out


@functools.cache
def _exact_curve(mu: float, shift: int) -> np.ndarray:
    return np.array([sk.skellam_rdp_exact_1d(float(a), mu, shift) for a in ORDERS])


def test_bound_dominates_exact_for_every_integer_shift_vector():
    # Every integer vector with ||v||_2 <= 4 (up to sign and permutation: 57 of them, from
    # (1,) to sixteen ones), every order 2..64: the bound at the vector's own norms is never
    # below the exact RDP (the sum of per-coordinate divergences).
    vectors = [v for v in _square_partitions(16, 4) if v]
    assert len(vectors) == 57
    worst_ratio, worst_gap = math.inf, math.inf
    for mu in MUS:
        for v in vectors:
            exact = sum(_exact_curve(mu, s) for s in v)
            bound = sk.skellam_rdp(ORDERS, mu, sum(v), math.sqrt(sum(s * s for s in v)))
            assert np.all(bound >= exact * (1 + 1e-12)), (mu, v)
            worst_ratio = min(worst_ratio, float(np.min(bound / exact)))
            worst_gap = min(worst_gap, float(np.min(bound - exact)))
    # measured: worst bound / exact = 1.0094 (mu 64, v = (4,), order 2); never below 1
    assert 1.0 < worst_ratio < 1.05
    assert worst_gap > 0.0


def test_exact_divergence_against_high_precision():
    # Independent: the defining sum in 50-digit arithmetic with mpmath's Bessel function.
    mpmath.mp.dps = 50
    for alpha, mu, shift in [(2, 1.0, 1), (7, 4.0, 3), (64, 0.25, 4), (33, 16.0, 2)]:

        def p(k: int, mu=mu) -> mpmath.mpf:
            return mpmath.exp(-2 * mpmath.mpf(mu)) * mpmath.besseli(abs(k), 2 * mpmath.mpf(mu))

        total = mpmath.fsum(
            p(k - shift) ** alpha * p(k) ** (1 - alpha) for k in range(-200, 260 + shift)
        )
        want = float(mpmath.log(total) / (alpha - 1))
        assert sk.skellam_rdp_exact_1d(alpha, mu, shift) == pytest.approx(want, rel=1e-11)
    assert sk.skellam_rdp_exact_1d(3.5, 2.0, 0) == 0.0
    assert sk.skellam_rdp_exact_1d(3.0, 2.0, -2) == sk.skellam_rdp_exact_1d(3.0, 2.0, 2)


def test_tail_inequalities_used_for_the_summation_range():
    # P(n+1)/P(n) <= mu/(n+1) and P(m)/P(m+1) <= (m+1)/mu + mu/(m+2), where ive is exact.
    for mu in (0.25, 1.0, 9.0, 40.0):
        n = np.arange(0, 300)
        p = ive(n, 2 * mu)
        ok = p[1:] > 1e-280
        ratio = p[1:][ok] / p[:-1][ok]
        assert np.all(ratio <= mu / (n[:-1][ok] + 1) * (1 + 1e-12))
        m = n[:-1][ok]
        assert np.all(1 / ratio <= ((m + 1) / mu + mu / (m + 2)) * (1 + 1e-12))
    # the far pmf (from the series) joins the one from ive
    table = sk._log_pmf(4.0, 511)
    direct = np.log(ive(np.arange(150, 200), 8.0))
    assert np.allclose(table[150:200], direct, rtol=1e-12)


def test_bound_only_at_integer_orders_and_edge_cases():
    out = sk.skellam_rdp([1.5, 2.0, 2.5, 3.0, math.inf], 10.0, 4.0, 2.0)
    assert np.isinf(out[[0, 2, 4]]).all() and np.isfinite(out[[1, 3]]).all()
    # alpha Delta2^2/(4 mu) + min(((2 alpha - 1) Delta2^2 + 6 Delta1)/(16 mu^2), 3 Delta1/(4 mu))
    assert out[1] == pytest.approx(2 * 4 / 40 + min((3 * 4 + 24) / 1600, 12 / 40), rel=1e-15)
    assert np.all(sk.skellam_rdp([2, 3], 0.0, 0.0, 0.0) == 0.0)
    assert np.all(np.isinf(sk.skellam_rdp([2, 3], 0.0, 1.0, 1.0)))
    for bad in (
        lambda: sk.skellam_rdp([1.0], 1.0, 1.0, 1.0),
        lambda: sk.skellam_rdp([2], -1.0, 1.0, 1.0),
        lambda: sk.skellam_rdp([2], 1.0, math.nan, 1.0),
        lambda: sk.skellam_rdp_exact_1d(1.0, 1.0, 1),
        lambda: sk.skellam_rdp_exact_1d(2.0, 0.0, 1),
        lambda: sk.skellam_rdp_exact_1d(2.0, 1.0, 1.5),
        lambda: sk.rounded_l2_bound(1.0, 0, 0.1),
        lambda: sk.rounded_l2_bound(1.0, 8, 1.0),
        lambda: sk.l1_bound(-1.0, 8),
        lambda: sk.skellam_epsilon(1.0, 1.0, 1.0, -1, 1e-5),
        lambda: sk.skellam_mu_for_epsilon(0.0, 1.0, 1.0, 1, 1e-5),
    ):
        with pytest.raises(ValueError):
            bad()


@settings(max_examples=60, deadline=None)
@given(
    mu=st.floats(0.01, 1e6),
    d2=st.floats(0.1, 100.0),
    d1_over=st.floats(1.0, 50.0),
    factor=st.floats(1.01, 10.0),
)
def test_bound_is_monotone_and_above_the_gaussian_term(mu, d2, d1_over, factor):
    d1 = d2 * d1_over
    base = sk.skellam_rdp(ORDERS, mu, d1, d2)
    assert np.all(base >= ORDERS * d2**2 / (2 * (2 * mu)))  # Gaussian, variance 2 mu
    assert np.all(sk.skellam_rdp(ORDERS, mu * factor, d1, d2) <= base)
    assert np.all(sk.skellam_rdp(ORDERS, mu, d1 * factor, d2 * factor) >= base)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-6, 6), min_size=1, max_size=40))
def test_l1_bound_holds_for_integer_vectors(v):
    x = np.asarray(v, np.float64)
    assert np.abs(x).sum() <= sk.l1_bound(float(np.linalg.norm(x)), x.size) * (1 + 1e-12)


def test_rounding_bound_empirically():
    # Unconditional randomized rounding exceeds the bound with frequency <= beta.  Counts are
    # Binomial(N, p) with p <= beta under the claim: allow 5 standard deviations (a false
    # failure has probability < 3e-7; the seed is fixed anyway).  Half-integer coordinates
    # maximise the rounding variance; random directions are the typical case.
    rng = np.random.default_rng(47)
    n = 4000
    for d, c in ((64, 4.0), (256, 16.0), (1024, 8.0)):
        half = np.full(d, c / math.sqrt(d))
        half = np.floor(half) + 0.5
        half *= c / np.linalg.norm(half)
        direction = rng.normal(size=d)
        for x in (half, direction * c / np.linalg.norm(direction)):
            low = np.floor(x)
            up = rng.random((n, d)) < (x - low)
            norms = np.linalg.norm(low + up, axis=1)
            assert norms.max() <= sk.rounded_l2_bound(c, d, 0.0) + 1e-9
            for beta in (0.5, 0.1, 0.01):
                bound = sk.rounded_l2_bound(c, d, beta)
                assert bound < c + math.sqrt(d)  # the probabilistic branch is the one tested
                count = int(np.sum(norms > bound))
                assert count <= n * beta + 5 * math.sqrt(n * beta * (1 - beta)), (d, c, beta)
    # the data can tell the d/4 term: without it the half-integer vector (d 64, c 4, every
    # coordinate 1/2) would exceed the beta = 0.5 bound in ~95 % of draws, not <= 50 %
    x = np.full(64, 0.5)
    norms_sq = np.sum((rng.random((n, 64)) < 0.5), axis=1)
    without = 16.0 + math.sqrt(2 * math.log(2.0)) * (4.0 + 4.0)
    assert np.mean(norms_sq > without) > 0.5
    assert np.mean(norms_sq > sk.rounded_l2_bound(float(np.linalg.norm(x)), 64, 0.5) ** 2) <= 0.5
    # the statement itself
    c, d, beta = 3.0, 100, 0.05
    want = math.sqrt(c * c + d / 4 + math.sqrt(2 * math.log(1 / beta)) * (c + math.sqrt(d) / 2))
    assert sk.rounded_l2_bound(c, d, beta) == pytest.approx(min(want, c + 10.0), rel=1e-15)
    assert sk.l1_bound(3.0, 4) == 6.0 and sk.l1_bound(3.0, 100) == 9.0


def test_gaussian_limit():
    # mu >> Delta2^2: the Skellam epsilon is at least, and within 3 % of, the Gaussian one
    # with the same variance (sigma = sqrt(2 mu) / Delta2), on the same integer orders.
    l2, l1, steps, delta = 5.0, 25.0, 50, 1e-5
    for mu in (2e3, 2e4, 2e5):
        skellam = sk.skellam_epsilon(mu, l1, l2, steps, delta)
        gauss = dp_accounting.SelfComposedDpEvent(
            dp_accounting.GaussianDpEvent(math.sqrt(2 * mu) / l2), steps
        )
        ref = acc.event_epsilon(gauss, delta, accountant="rdp", orders=sk.SKELLAM_ORDERS)
        assert ref <= skellam <= 1.03 * ref, (mu, skellam, ref)
    # far from the limit the discreteness costs more
    small = sk.skellam_epsilon(2.0, 2.0, math.sqrt(2.0), 1, delta)
    gauss_small = acc.event_epsilon(
        dp_accounting.GaussianDpEvent(math.sqrt(4.0) / math.sqrt(2.0)),
        delta,
        accountant="rdp",
        orders=sk.SKELLAM_ORDERS,
    )
    assert small > 1.1 * gauss_small


def _skellam_pld(mu: float, shift: int, pessimistic: bool) -> pld_lib.PrivacyLossDistribution:
    """PLD of Sk(mu) + shift against Sk(mu); the pmfs' truncated mass (< 1e-30) goes to the
    infinite privacy loss, so the pessimistic PLD bounds the exact mechanism."""
    half = math.ceil(mu + 40 * math.sqrt(mu) + 40)
    k = np.arange(-half, half + shift + 1)
    lower = np.log(ive(np.abs(k), 2 * mu))
    upper = np.log(ive(np.abs(k - shift), 2 * mu))
    log_lower = {int(a): float(b) for a, b in zip(k, lower, strict=True)}
    log_upper = {int(a): float(b) for a, b in zip(k, upper, strict=True)}
    for name, table in (("rest_lower", log_lower), ("rest_upper", log_upper)):
        missing = max(1.0 - math.fsum(np.exp(list(table.values()))), 0.0) + 1e-30
        assert missing < 1e-12
        table[name] = math.log(missing)
    return pld_lib.from_two_probability_mass_functions(
        log_lower, log_upper, pessimistic_estimate=pessimistic,
        value_discretization_interval=1e-4, symmetric=False,
    )  # fmt: skip


def test_rdp_epsilon_bounds_the_exact_profile():
    # 1-D, integer shift, T compositions: the RDP epsilon is >= the pessimistic PLD's (itself
    # >= the exact epsilon), and not far above it.
    delta, ratios = 1e-5, []
    for mu, shift, steps in ((20.0, 1, 10), (3.0, 2, 5), (200.0, 3, 20)):
        ours = sk.skellam_epsilon(mu, float(shift), float(shift), steps, delta)
        upper = _skellam_pld(mu, shift, True).self_compose(steps).get_epsilon_for_delta(delta)
        lower = _skellam_pld(mu, shift, False).self_compose(steps).get_epsilon_for_delta(delta)
        assert lower <= upper <= ours
        ratios.append(ours / upper)
    # measured ours / pessimistic PLD: 1.11 (mu 20), 1.33 (mu 3), 1.09 (mu 200); the
    # optimistic PLD is within 1e-3 of the pessimistic one, so these are ours / exact
    assert max(ratios) < 1.5


def test_mu_for_epsilon_is_the_smallest_that_meets_the_target():
    l2 = sk.rounded_l2_bound(100.0, 1024, math.exp(-0.5))
    l1 = sk.l1_bound(l2, 1024)
    for target in (0.5, 4.0):
        mu = sk.skellam_mu_for_epsilon(target, l1, l2, 100, 1e-5, rtol=1e-4)
        assert sk.skellam_epsilon(mu, l1, l2, 100, 1e-5) <= target
        assert sk.skellam_epsilon(mu * (1 - 2e-4), l1, l2, 100, 1e-5) > target
    assert sk.skellam_mu_for_epsilon(math.inf, l1, l2, 100, 1e-5) == 0.0
    assert sk.skellam_mu_for_epsilon(1.0, l1, l2, 0, 1e-5) == 0.0
    with pytest.raises(ValueError, match="mu > 1e15"):
        sk.skellam_mu_for_epsilon(1e-9, 1e6, 1e3, 10**6, 1e-5)
    assert sk.skellam_epsilon(0.0, 1.0, 1.0, 3, 1e-5) == math.inf
    assert sk.skellam_epsilon(5.0, 1.0, 1.0, 0, 1e-5) == 0.0


def test_registration_in_accounting():
    one = sk.SkellamDpEvent(6.0, 3.0, 50.0)
    event = dp_accounting.ComposedDpEvent(
        [dp_accounting.SelfComposedDpEvent(one, 4), dp_accounting.GaussianDpEvent(2.0)]
    )
    assert acc.event_from_dict(acc.event_to_dict(event)) == event
    assert acc.event_to_dict(one) == {
        "kind": "skellam", "l1_sensitivity": 6.0, "l2_sensitivity": 3.0, "mu": 50.0,
    }  # fmt: skip
    # RDP on DEFAULT_ORDERS: the Skellam leaf is inf at fractional orders, so epsilon comes
    # from the integer orders, where the Gaussian's curve is alpha / (2 sigma^2).
    grid = np.asarray(acc.DEFAULT_ORDERS)
    integer = grid[grid == np.floor(grid)]
    curve = 4 * sk.skellam_rdp(integer, 50.0, 6.0, 3.0) + integer / (2 * 2.0**2)
    want, _ = dp_accounting.rdp.rdp_privacy_accountant.compute_epsilon(integer, curve, 1e-6)
    assert acc.event_epsilon(event, 1e-6, accountant="rdp") == pytest.approx(want, rel=1e-12)
    # PLD refuses, wherever the event sits
    for call in (
        lambda: acc.event_epsilon(event, 1e-6),
        lambda: acc.event_epsilon(event, 1e-6, accountant="pld"),
        lambda: acc.epsilon_curve([dp_accounting.GaussianDpEvent(1.0), one], 1e-6),
    ):
        with pytest.raises(ValueError, match="use accountant='rdp'"):
            call()
    curve_rdp = acc.epsilon_curve([one, one], 1e-6, accountant="rdp")
    assert curve_rdp[1] == pytest.approx(
        acc.event_epsilon(dp_accounting.SelfComposedDpEvent(one, 2), 1e-6, accountant="rdp")
    )
    with pytest.raises(ValueError, match="amplification"):
        acc.event_epsilon(dp_accounting.PoissonSampledDpEvent(0.1, one), 1e-6, accountant="rdp")
    assert acc.event_epsilon(sk.SkellamDpEvent(1.0, 1.0, 0.0), 1e-6, accountant="rdp") == math.inf
    none = dp_accounting.SelfComposedDpEvent(one, 0)  # 0 * inf must not become nan
    assert acc.event_epsilon(none, 1e-6, accountant="rdp") == 0.0
    with pytest.raises(ValueError, match="mu"):
        acc.event_epsilon(sk.SkellamDpEvent(1.0, 1.0, -1.0), 1e-6, accountant="rdp")
