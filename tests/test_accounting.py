"""Accountant: published values, calibration round trip, monotonicity, composition, errors."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmjax.privacy import accounting as acc

OPACUS_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
# TF-Privacy's compute_dp_sgd_privacy grid.
TF_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))


def test_opacus_published_value():
    # Opacus tests/accountants_test.py: sigma 1.5, q 0.04, 2250 steps, delta 1e-5 -> 7.32911.
    # dp-accounting's fractional-order series is 3e-5 (relative) more conservative.
    eps = acc.epsilon(0.04, 1.5, 2250, 1e-5, accountant="rdp", orders=OPACUS_ORDERS)
    assert eps == pytest.approx(7.32911117143, abs=1e-3)
    assert eps >= 7.32911117143 - 1e-9
    assert acc.epsilon(0.04, 1.5, 2250, 1e-5, accountant="rdp") == pytest.approx(eps, rel=1e-9)


def test_tf_privacy_published_value():
    # TF-Privacy: n 60000, batch 150, sigma 1.3, 15 epochs, delta 1e-5 -> 0.7242234.
    q, steps = 150 / 60000, 15 * 60000 // 150
    assert acc.epsilon(q, 1.3, steps, 1e-5, accountant="rdp", orders=TF_ORDERS) == pytest.approx(
        0.72422340, 1e-6
    )


def test_pld_is_tighter_but_close():
    rdp = acc.epsilon(0.04, 1.5, 2250, 1e-5, accountant="rdp")
    pld = acc.epsilon(0.04, 1.5, 2250, 1e-5, accountant="pld")
    assert 0.85 * rdp < pld < rdp


def test_sigma_for_epsilon_round_trip_and_tight():
    q, steps, delta, target = 0.01, 500, 1e-5, 2.0
    sigma = acc.sigma_for_epsilon(target, q, steps, delta)
    assert acc.epsilon(q, sigma, steps, delta) <= target
    assert acc.epsilon(q, sigma * (1 - 2e-3), steps, delta) > target


def test_sigma_for_epsilon_special_cases():
    assert acc.sigma_for_epsilon(math.inf, 0.1, 100, 1e-5) == 0.0
    assert acc.sigma_for_epsilon(1.0, 0.1, 0, 1e-5) == 0.0
    assert acc.epsilon(0.1, 0.0, 10, 1e-5) == math.inf  # explicit zero noise is no privacy
    assert acc.epsilon(0.1, 1.0, 0, 1e-5) == 0.0


@settings(max_examples=6, deadline=None)
@given(
    q=st.floats(0.001, 0.5),
    sigma=st.floats(0.6, 5.0),
    steps=st.integers(1, 2000),
    factor=st.floats(1.05, 3.0),
)
def test_epsilon_monotone(q, sigma, steps, factor):
    base = acc.epsilon(q, sigma, steps, 1e-5)
    assert acc.epsilon(q, sigma * factor, steps, 1e-5) <= base + 1e-12
    assert acc.epsilon(min(1.0, q * factor), sigma, steps, 1e-5) >= base - 1e-12
    assert acc.epsilon(q, sigma, int(steps * factor) + 1, 1e-5) >= base - 1e-12


def test_accountant_heterogeneous_steps_match_dp_accounting():
    ours = acc.PrivacyAccountant(accountant="rdp")
    for _ in range(30):
        ours.step(0.02, 1.1)
    ours.step(0.05, 2.0, count=70)
    ref = rdp_privacy_accountant.RdpAccountant()
    ref.compose(
        dp_accounting.ComposedDpEvent(
            [
                dp_accounting.SelfComposedDpEvent(
                    dp_accounting.PoissonSampledDpEvent(0.02, dp_accounting.GaussianDpEvent(1.1)),
                    30,
                ),
                dp_accounting.SelfComposedDpEvent(
                    dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(2.0)),
                    70,
                ),
            ]
        )
    )
    assert ours.steps == 100
    assert ours.epsilon(1e-5) == pytest.approx(ref.get_epsilon(1e-5), rel=1e-9)
    ours.step(0.05, 0.0)
    assert ours.epsilon(1e-5) == math.inf


def test_accountant_pld_option_matches_function():
    ours = acc.PrivacyAccountant(accountant="pld")
    ours.step(0.05, 1.2, count=10)
    ours.step(0.05, 1.2, count=15)
    assert ours.epsilon(1e-5) == pytest.approx(
        acc.epsilon(0.05, 1.2, 25, 1e-5, accountant="pld"), rel=1e-6
    )


def test_compositions():
    assert acc.basic_composition([0.5, 1.0, 0.25]) == (1.75, 0.0)
    assert acc.basic_composition([1.0, 2.0], [1e-6, 2e-6]) == pytest.approx((3.0, 3e-6))
    eps, delta = acc.advanced_composition(0.1, 100, 1e-5, delta=1e-7)
    # sqrt(200 ln 1e5) * 0.1 + 100 * 0.1 * (e^0.1 - 1)
    assert eps == pytest.approx(4.79853 + 1.05171, abs=1e-4)
    assert delta == pytest.approx(100 * 1e-7 + 1e-5)
    assert acc.parallel_composition([0.3, 2.5, 1.0]) == 2.5
    assert acc.parallel_composition([]) == 0.0


def test_mechanism_epsilons_reexported():
    assert float(acc.randomized_response_epsilon(0.6, 8)) == pytest.approx(2.3514, abs=1e-4)
    assert float(acc.random_dictatorship_epsilon(7)) == pytest.approx(math.log(14 / 8))
    assert acc.gaussian_sigma(0.5, 1e-5) > 0


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: acc.epsilon(0.0, 1.0, 10, 1e-5), "q"),
        (lambda: acc.epsilon(1.5, 1.0, 10, 1e-5), "q"),
        (lambda: acc.epsilon(0.1, -1.0, 10, 1e-5), "sigma"),
        (lambda: acc.epsilon(0.1, 1.0, -1, 1e-5), "steps"),
        (lambda: acc.epsilon(0.1, 1.0, 10, 0.0), "delta"),
        (lambda: acc.epsilon(0.1, 1.0, 10, 1.0), "delta"),
        (lambda: acc.epsilon(0.1, 1.0, 10, 1e-5, accountant="gdp"), "accountant"),
        (lambda: acc.sigma_for_epsilon(0.0, 0.1, 10, 1e-5), "target_epsilon"),
        (lambda: acc.sigma_for_epsilon(-1.0, 0.1, 10, 1e-5), "target_epsilon"),
        (lambda: acc.sigma_for_epsilon(1.0, 0.1, 10, 2.0), "delta"),
        (lambda: acc.PrivacyAccountant().step(0.1, 1.0, count=-1), "count"),
        (lambda: acc.PrivacyAccountant(orders=[0.5, 2.0]), "orders"),
        (lambda: acc.advanced_composition(-0.1, 10, 1e-5), "epsilon"),
        (lambda: acc.advanced_composition(0.1, 10, 0.0), "delta_prime"),
        (lambda: acc.basic_composition([1.0, -1.0]), "epsilons"),
    ],
)
def test_invalid_input_names_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_convergence_warnings_dropped_and_only_those(caplog) -> None:
    """dp-accounting logs "failed to converge" for fractional orders at large q; the module
    drops exactly that message (the order is excluded, which only raises epsilon)."""
    import logging

    q, sigma = 64 / 300, 1.0  # a small client: large q, moderate sigma
    with caplog.at_level("WARNING", logger="absl"):
        raw = rdp_privacy_accountant.RdpAccountant(list(acc.DEFAULT_ORDERS))
        raw.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)))
    assert [r for r in caplog.records if "failed to converge" in r.getMessage()], (
        "the library no longer warns here: this test needs another (q, sigma)"
    )
    caplog.clear()
    with caplog.at_level("WARNING", logger="absl"):
        acc._rdp_leaf.cache_clear()
        eps = acc.epsilon(q, sigma, 10, 1e-5, accountant="rdp")
        logging.getLogger("absl").warning("another warning")
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "failed to converge" in m]
    assert "another warning" in messages
    assert not logging.getLogger("absl").filters
    assert math.isfinite(eps)


def test_accountant_delta_covers_sampler_overflow():
    q, sigma, steps, delta = 0.01, 1.1, 1000, 1e-5
    exact = acc.epsilon(q, sigma, steps, delta)
    running = acc.PrivacyAccountant()
    running.step(q, sigma, count=steps, overflow_prob=1e-12)
    eps = running.epsilon(delta)
    assert eps > exact
    # the exact-Poisson mechanism at the remaining delta is within eps: (eps, delta) in total
    rest = delta - steps * 1e-12 * (1 + math.exp(eps))
    assert acc.epsilon(q, sigma, steps, rest) <= eps
    assert acc.epsilon(q, sigma, steps, delta, overflow_prob=1e-12) == eps
    # an overflow term as large as delta leaves nothing: no finite epsilon
    assert acc.epsilon(q, sigma, steps, delta, overflow_prob=1e-8) == math.inf


# --------------------------------------------------------------------- events and PLD


def _reference_pld(event, delta, interval=acc.PLD_INTERVAL):
    from dp_accounting.pld import pld_privacy_accountant

    ref = pld_privacy_accountant.PLDAccountant(value_discretization_interval=interval)
    ref.compose(event)
    return ref.get_epsilon(delta)


def test_default_accountant_is_pld_and_agrees_with_dp_accounting():
    q, sigma, steps, delta = 50 / 1200, 1.0, 100, 1 / 1200
    ours = acc.epsilon(q, sigma, steps, delta)
    event = acc.poisson_gaussian_event(q, sigma, steps)
    assert ours == pytest.approx(_reference_pld(event, delta), rel=1e-9)
    # pessimistic discretisation: the coarser interval never reports less than the finer
    assert ours >= _reference_pld(event, delta, interval=1e-4) - 1e-12
    assert ours < acc.epsilon(q, sigma, steps, delta, accountant="rdp")


def test_composed_events_match_dp_accounting_both_accountants():
    event = dp_accounting.ComposedDpEvent(
        [
            acc.poisson_gaussian_event(0.02, 1.1, 30),
            acc.poisson_gaussian_event(0.05, 2.0, 70),
            dp_accounting.LaplaceDpEvent(4.0),
        ]
    )
    assert acc.event_epsilon(event, 1e-5) == pytest.approx(_reference_pld(event, 1e-5), 1e-9)
    ref = rdp_privacy_accountant.RdpAccountant()
    ref.compose(event)
    assert acc.event_epsilon(event, 1e-5, accountant="rdp") == pytest.approx(
        ref.get_epsilon(1e-5), rel=1e-9
    )


def test_pure_event_bounds():
    # pure epsilon-DP: at delta > 0 never above epsilon, and RDP min(eps, a eps^2 / 2) >= PLD
    for eps in (0.1, 1.0, 3.0):
        pld = acc.event_epsilon(acc.PureDpEvent(eps), 1e-6)
        rdp = acc.event_epsilon(acc.PureDpEvent(eps), 1e-6, accountant="rdp")
        assert pld <= eps + 1e-9
        assert pld <= rdp + 1e-9
        assert pld > 0.9 * eps


def test_event_dict_round_trip_and_unknown_kind():
    event = dp_accounting.ComposedDpEvent(
        [acc.poisson_gaussian_event(0.1, 1.0, 10), acc.PureDpEvent(0.5)]
    )
    again = acc.event_from_dict(acc.event_to_dict(event))
    assert again == event
    with pytest.raises(ValueError, match="event kind"):
        acc.event_from_dict({"kind": "zcdp", "rho": 1.0})
    with pytest.raises(ValueError, match="not one swarmjax accounts"):
        acc.event_to_dict(dp_accounting.ZCDpEvent(1.0))


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_epsilon_curve_is_the_composition_after_each_round(accountant):
    rounds = [acc.poisson_gaussian_event(0.05, 1.2, k) for k in (3, 0, 5, 2)]
    curve = acc.epsilon_curve(rounds, 1e-5, accountant=accountant, overflow=[1e-12] * 4)
    for t in range(4):
        steps = sum((3, 0, 5, 2)[: t + 1])
        expect = acc.epsilon(
            0.05, 1.2, steps, 1e-5, accountant=accountant, overflow_prob=1e-12 * (t + 1) / steps
        )
        assert curve[t] == pytest.approx(expect, rel=1e-7)
    assert np.all(np.diff(curve) >= -1e-12)
    assert acc.epsilon_curve([dp_accounting.NonPrivateDpEvent()], 1e-5)[0] == math.inf


@settings(max_examples=5, deadline=None)
@given(
    q=st.floats(0.005, 0.3),
    sigma=st.floats(0.7, 3.0),
    rounds=st.integers(1, 40),
    per_round=st.integers(1, 5),
)
def test_record_curve_never_below_an_independent_pld(q, sigma, rounds, per_round):
    """Numbers stay honest: the record's per-round curve (chained per-round PLDs at the
    coarse pessimistic interval) is never below dp-accounting's own PLD at its finer default
    interval for the same events."""
    curve = acc.epsilon_curve([acc.poisson_gaussian_event(q, sigma, per_round)] * rounds, 1e-5)
    for t in (0, rounds - 1):
        event = acc.poisson_gaussian_event(q, sigma, per_round * (t + 1))
        assert curve[t] >= _reference_pld(event, 1e-5, interval=1e-4) - 1e-9
