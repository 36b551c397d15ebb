"""The per-round epsilon curve's fast lookup: the same numbers as dp-accounting's own lookups
(to their tolerance), never below them by more than that, and each one a statement that
dp-accounting's hockey-stick divergence confirms (overflow charge included)."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import common, privacy_loss_distribution

from swarmjax.privacy import accounting as acc

DELTA = 1 / 1200
Q = 50 / 1200  # benchmarks.vs_pfl's Poisson cohort rate


def _plds():
    """Symmetric (Gaussian, q = 1) and asymmetric (subsampled) PLDs, Laplace, pure DP and a
    heterogeneous composition, each a few rounds (milliseconds to build)."""
    hetero = dp_accounting.ComposedDpEvent(
        [
            acc.poisson_gaussian_event(Q, 0.8, 2),
            acc.poisson_gaussian_event(0.1, 1.3, 1),
            acc.PureDpEvent(0.05),
        ]
    )
    laplace = dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.LaplaceDpEvent(2.0))
    events = {
        "gaussian": acc.poisson_gaussian_event(1.0, 4.0, 3),
        "poisson_gaussian": acc.poisson_gaussian_event(Q, 0.7, 4),
        "laplace": laplace,
        "pure": acc.PureDpEvent(0.3),
        "heterogeneous": hetero,
    }
    return {name: acc._pld(event) for name, event in events.items()}


PLDS = _plds()


def _holds(pld, eps: float, delta: float, overflow: float) -> bool:
    """dp-accounting's own statement: delta_mech(eps) + P (1 + e^eps) <= delta."""
    return float(pld.get_delta_for_epsilon(eps)) + overflow * (1.0 + math.exp(eps)) <= delta


@pytest.mark.parametrize("name", sorted(PLDS))
@pytest.mark.parametrize("overflow", [0.0, 5e-10, 1e-5])
def test_fast_lookup_is_dp_accountings_value_and_holds(name, overflow):
    pld = PLDS[name]
    fast = acc._pld_with_overflow(pld, DELTA, overflow)
    reference = acc._pld_with_overflow_bisection(pld, DELTA, overflow)
    assert math.isfinite(fast) and fast >= 0.0
    assert _holds(pld, fast, DELTA, overflow)
    # the bisection stops within 1e-9 (relative) above the smallest valid epsilon
    assert reference - 2e-9 * reference - 1e-12 <= fast <= reference + 1e-11 * reference + 1e-14
    if overflow == 0.0:
        assert fast == pytest.approx(float(pld.get_epsilon_for_delta(DELTA)), rel=1e-11, abs=1e-14)
    if fast > 1e-6:  # the smallest such epsilon: a little less does not hold
        assert not _holds(pld, fast * (1.0 - 1e-7), DELTA, overflow)


def test_fast_lookup_is_infinite_when_nothing_holds():
    pld = PLDS["poisson_gaussian"]
    # the overflow charge alone, P (1 + e^0) >= delta: no epsilon can hold
    assert acc._pld_with_overflow(pld, DELTA, DELTA / 2) == math.inf
    assert acc._pld_with_overflow_bisection(pld, DELTA, DELTA / 2) == math.inf
    # an infinite-loss mass above delta (an (1, 0.01)-DP release at delta 1/1200): none either
    weak = privacy_loss_distribution.from_privacy_parameters(
        common.DifferentialPrivacyParameters(1.0, 0.01), value_discretization_interval=1e-3
    )
    assert float(weak.get_epsilon_for_delta(DELTA)) == math.inf
    assert acc._pld_with_overflow(weak, DELTA, 0.0) == math.inf
    assert acc._pld_with_overflow(weak, DELTA, 1e-10) == math.inf
    assert acc._pld_with_overflow(weak, 0.02, 0.0) == pytest.approx(
        float(weak.get_epsilon_for_delta(0.02)), rel=1e-11
    )


def test_a_pmf_without_the_fields_read_falls_back_to_dp_accountings_lookup(monkeypatch):
    """The fast lookup reads dp-accounting's dense PMF fields, which have no public getter;
    a version that names them otherwise gives NaN there, and the lookup is dp-accounting's
    own (the bisection), never an error or a smaller epsilon."""
    pld = PLDS["poisson_gaussian"]

    class Renamed:
        def to_dense_pmf(self):
            return object()  # none of _probs, _infinity_mass, _lower_loss, _discretization

    fast = acc._pmf_epsilon
    assert math.isnan(fast(Renamed(), DELTA, 0.0))
    monkeypatch.setattr(acc, "_pmf_epsilon", lambda pmf, d, p: fast(Renamed(), d, p))
    assert acc._pld_with_overflow(pld, DELTA, 1e-6) == acc._pld_with_overflow_bisection(
        pld, DELTA, 1e-6
    )


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_heterogeneous_curve_is_each_prefix_composed(accountant):
    """Rounds of different rates, noise and step counts, a round without a step and a pure-DP
    release, with a per-round overflow charge: each value is the composition of its prefix
    (by :func:`event_epsilon`, a different composition order: self-compositions)."""
    rounds = [
        acc.poisson_gaussian_event(Q, 0.9, 1),
        acc.poisson_gaussian_event(Q, 0.9, 2),
        dp_accounting.NoOpDpEvent(),
        acc.poisson_gaussian_event(0.1, 1.5, 1),
        acc.PureDpEvent(0.1),
        acc.poisson_gaussian_event(Q, 0.9, 1),
    ]
    overflow = [1e-10, 2e-10, 0.0, 3e-11, 0.0, 1e-10]
    curve = acc.epsilon_curve(rounds, DELTA, accountant=accountant, overflow=overflow)
    for t in range(len(rounds)):
        prefix = [e for e in rounds[: t + 1] if not isinstance(e, dp_accounting.NoOpDpEvent)]
        want = acc.event_epsilon(
            dp_accounting.ComposedDpEvent(prefix),
            DELTA,
            accountant=accountant,
            overflow=float(np.sum(overflow[: t + 1])),
        )
        assert curve[t] == pytest.approx(want, rel=1e-5)
    assert curve[2] == curve[1]  # the round without a step
    assert np.all(np.diff(curve) >= 0.0)


def test_vs_pfl_curve_holds_at_every_round_by_dp_accounting():
    """vs_pfl's DP configuration (rate 50/1200, overflow charged): every value of the curve
    holds by dp-accounting's divergence of the same composed PLD, and equals the lookup that
    uses dp-accounting's lookups alone to their 1e-9 bisection tolerance."""
    sigma, rounds, p = 0.7, 6, 4.9e-10
    leaf = acc._pld(acc.poisson_gaussian_event(Q, sigma, 1))
    curve = acc.epsilon_curve([acc.poisson_gaussian_event(Q, sigma, 1)] * rounds, DELTA,
                              overflow=[p] * rounds)  # fmt: skip
    pld = leaf
    for t in range(rounds):
        pld = leaf if t == 0 else pld.compose(leaf)
        assert _holds(pld, curve[t], DELTA, (t + 1) * p)
        reference = acc._pld_with_overflow_bisection(pld, DELTA, (t + 1) * p)
        assert curve[t] == pytest.approx(reference, rel=2e-9)
    final = acc.epsilon(Q, sigma, rounds, DELTA, overflow_prob=p)  # calibration's route
    assert curve[-1] == pytest.approx(final, rel=1e-5)


def test_blas_threads_are_restored_after_accounting():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    before = [i["num_threads"] for i in threadpoolctl.threadpool_info()]
    acc.epsilon_curve([acc.poisson_gaussian_event(Q, 1.0, 1)] * 2, DELTA)
    acc.event_epsilon(acc.poisson_gaussian_event(Q, 1.0, 2), DELTA)
    assert [i["num_threads"] for i in threadpoolctl.threadpool_info()] == before


def test_vs_pfl_times_the_same_record_again():
    """benchmarks.vs_pfl's share of the privacy record in a round rebuilds the record from the
    run's (uniform, one group) spend and gets the run's final epsilon back."""
    from types import SimpleNamespace

    from benchmarks.vs_pfl import record_seconds
    from swarmjax.fl.runtime.result import privacy_record

    shape = (2, 3, 5)  # runs, rounds, clients
    record = privacy_record(
        np.broadcast_to(np.arange(1, 4)[None, :, None], shape),
        (),
        unit="client",
        delta=DELTA,
        rates=acc.Rates(np.full(shape, np.float32(Q)), np.full(shape, 0.9), np.full(5, 4.9e-10)),
    )
    assert [len(g) for g in record.groups] == [1, 1]  # one group a run: the fast path
    assert record.groups[0][0][0] is None  # ... of every client
    assert record_seconds(SimpleNamespace(privacy=record)) > 0.0
