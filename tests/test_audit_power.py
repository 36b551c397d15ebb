"""The canary audit states its power and says "cannot tell" when it cannot see
(swarmjax.privacy.canaries: power_epsilon, detectable_noise_factor, the audit's own delta,
the f-DP/GDP estimate, verdicts).

Mechanism-level drills, no training: each canary's score is what a white-box score of a
Poisson-subsampled Gaussian mechanism gives, ``sum_t (in_i b_it + sigma z_it)`` over ``T``
steps (``b_it`` ~ Bernoulli(q), ``z_it`` ~ N(0, 1)), with ``sigma`` calibrated by the
accountant to the claimed epsilon, and the noise secretly divided by a factor in the
broken runs while the claim stays.  Seeded numpy draws: fast and reproducible.
"""

from __future__ import annotations

import functools
import math

import dp_accounting
import numpy as np
import pytest

from swarmjax.privacy import accounting
from swarmjax.privacy.canaries import (
    DEFAULT_CANARIES,
    DETECT_FACTOR,
    CanaryAudit,
    CanaryReport,
    accounted_curve,
    audit_scores,
    detectable_noise_factor,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    power_epsilon,
)


@functools.cache  # four tests audit the same mechanism: its curve's points computed once
def _mechanism(q, steps, epsilon, delta):
    """``(sigma, delta -> accounted epsilon)`` of a Poisson-subsampled Gaussian run."""
    sigma = accounting.sigma_for_epsilon(epsilon, q, steps, delta)

    @functools.cache
    def curve(d):
        return accounting.epsilon(q, sigma, steps, d)

    return sigma, curve


def _scores(rng, canaries, q, steps, sigma, divide=1.0):
    """``(scores, included)`` of ``canaries`` canaries of the mechanism, its noise divided
    by ``divide`` (the secret break)."""
    included = rng.random(canaries) < 0.5
    taken = rng.binomial(steps, q, canaries) * included
    noise = rng.normal(size=canaries) * sigma * math.sqrt(steps) / divide
    return taken + noise, included


def _report(scores, included, epsilon, delta, curve, canaries=None):
    audit = CanaryAudit(canaries or scores.size)
    return audit_scores(
        scores, included, audit=audit, epsilon=epsilon, delta=delta, unit="client",
        accounted=curve,
    )  # fmt: skip


# the profile: cross_device --quick at epsilon 2, 20 rounds at q = 0.1, delta 1e-3
Q, T, EPS, DELTA = 0.1, 20, 2.0, 1e-3


def test_the_one_run_bound_collapses_when_delta_times_canaries_is_large():
    # the finding: delta 1e-3 x 500 canaries can certify at most ~1.5, below epsilon 2
    assert power_epsilon(250, 250, 1e-3) < 1.5
    assert power_epsilon(250, 250, 1e-6) > 4.0  # the audit's own small delta lifts it
    # and it grows only like log M: about 4.8 at 1,000 canaries, 7.1 at 10,000
    assert 4.6 < power_epsilon(500, 500, 1e-8) < 5.0
    assert power_epsilon(5000, 5000, 1e-10) < 7.5


def test_power_below_the_accounted_epsilon_says_cannot_tell():
    # perfectly separated scores, at the run's delta (no accountant curve): the bound
    # cannot exceed epsilon 2 whatever the scores, so the report cannot say "ok"
    included = np.arange(500) % 2 == 0
    scores = included.astype(float) + np.arange(500) * 1e-6
    report = audit_scores(
        scores, included, audit=CanaryAudit(500), epsilon=EPS, delta=DELTA, unit="client"
    )
    assert report.audit_delta == DELTA and report.accounted_curve is False
    assert report.power_epsilon < EPS and report.epsilon_lower <= report.power_epsilon
    assert report.detectable_noise_factor == math.inf
    assert report.verdict == "cannot tell" and not report.sees
    assert "cannot tell" in report.line() and "power: at most" in report.line()
    # likewise a fixed audit delta with too few canaries for the accounted epsilon there
    _, curve = _mechanism(Q, T, 8.0, DELTA)
    null = np.random.default_rng(0).normal(size=500)
    report = _report(null, included, 8.0, DELTA, curve)
    assert report.power_epsilon < report.epsilon_audit_delta
    assert report.verdict == "cannot tell"


def test_tenfold_less_noise_never_says_ok():
    sigma, curve = _mechanism(Q, T, EPS, DELTA)
    rng = np.random.default_rng(1)
    for canaries in (500, DEFAULT_CANARIES):
        scores, included = _scores(rng, canaries, Q, T, sigma, divide=10.0)
        report = _report(scores, included, EPS, DELTA, curve)
        assert report.verdict in ("violation", "suspect"), report.line()
        assert report.auroc > 0.9
        # without the accountant's curve (the run's delta only) it still is not "ok"
        plain = audit_scores(
            scores, included, audit=CanaryAudit(canaries), epsilon=EPS, delta=DELTA,
            unit="client",
        )  # fmt: skip
        assert plain.verdict != "ok"


def test_the_correct_mechanism_says_ok_or_cannot_tell_with_its_power():
    sigma, curve = _mechanism(Q, T, EPS, DELTA)
    rng = np.random.default_rng(2)
    for _ in range(3):
        scores, included = _scores(rng, DEFAULT_CANARIES, Q, T, sigma)
        report = _report(scores, included, EPS, DELTA, curve)
        assert report.verdict in ("ok", "cannot tell"), report.line()
        assert report.epsilon_lower <= report.epsilon_audit_delta
        assert report.audit_delta < DELTA  # its own delta, not the run's
        assert report.epsilon_audit_delta == pytest.approx(curve(report.audit_delta))
        assert report.power_epsilon > report.epsilon_audit_delta
        assert 1.0 <= report.detectable_noise_factor < 10.0
        assert report.gdp_mu <= report.gdp_mu_accounted
        assert report.auroc_lower <= report.auroc_accounted


def test_an_exactly_gaussian_mechanism_with_a_fourfold_error_is_caught():
    # q = 1: the mechanism is exactly mu-GDP and its canaries are ideal, so the default
    # size's stated detectable factor (<= 4) is what happens
    sigma, curve = _mechanism(1.0, 10, EPS, 1e-5)
    factor = detectable_noise_factor(
        gdp_mu(EPS, 1e-5), curve(1e-6), canaries=DEFAULT_CANARIES, delta=1e-6
    )
    assert factor <= DETECT_FACTOR
    rng = np.random.default_rng(3)
    caught = 0
    for _ in range(3):
        scores, included = _scores(rng, DEFAULT_CANARIES, 1.0, 10, sigma, divide=4.0)
        report = _report(scores, included, EPS, 1e-5, curve)
        assert report.verdict != "ok"
        caught += report.verdict == "violation"
    assert caught >= 2


def test_gdp_relations():
    for mu in (0.3, 1.0, 3.0):
        for delta in (1e-3, 1e-6):
            eps = gdp_epsilon(mu, delta)
            assert gdp_delta(eps, mu) == pytest.approx(delta, rel=1e-6)
            assert gdp_mu(eps, delta) == pytest.approx(mu, rel=1e-6)
    # the Gaussian mechanism of noise multiplier s is (1 / s)-GDP
    s = dp_accounting.get_sigma_gaussian(2.0, 1e-5)
    assert gdp_mu(2.0, 1e-5) == pytest.approx(1.0 / s, rel=1e-4)


def test_the_gdp_estimate_of_pure_noise_is_zero():
    # jax-privacy's epsilon_from_gdp takes |mu| over thresholds and reports > 0 for
    # scores without any signal; the one-run f-DP audit used here does not
    rng = np.random.default_rng(4)
    included = rng.random(1000) < 0.5
    _, curve = _mechanism(Q, T, EPS, DELTA)
    report = _report(rng.normal(size=1000), included, EPS, DELTA, curve)
    assert report.epsilon_gdp == 0.0 and report.gdp_mu == 0.0


def test_accounted_curve_of_a_record_and_a_fixed_audit_delta():
    sigma, curve = _mechanism(Q, T, EPS, DELTA)

    class Record:  # what accounted_curve reads of a PrivacyRecord
        accountant = "pld"

        def run_events(self, run):
            return [(None, accounting.poisson_gaussian_event(Q, sigma, T), 0.0)]

    at = accounted_curve(Record(), 0)
    assert at(1e-6) == pytest.approx(curve(1e-6), rel=1e-6)
    rng = np.random.default_rng(5)
    scores, included = _scores(rng, 600, Q, T, sigma)
    report = audit_scores(
        scores, included, audit=CanaryAudit(600, delta=1e-7), epsilon=EPS, delta=DELTA,
        unit="client", accounted=at,
    )  # fmt: skip
    assert report.audit_delta == 1e-7 and report.accounted_curve is True
    assert report.epsilon_audit_delta == pytest.approx(curve(1e-7), rel=1e-6)
    # a curve that is infinite at tiny deltas (an overflow charge eating them) still has
    # a finite Gaussian cover and a finite verdict
    capped = audit_scores(
        scores, included, audit=CanaryAudit(600), epsilon=EPS, delta=DELTA, unit="client",
        accounted=lambda d: curve(d) if d >= 1e-7 else math.inf,
    )  # fmt: skip
    assert math.isfinite(capped.gdp_mu_accounted) and capped.audit_delta >= 1e-7
    assert capped.verdict in ("ok", "cannot tell")
    with pytest.raises(ValueError, match=r"audit delta must be in \(0.0, 1.0\)"):
        CanaryAudit(8, delta=0.0)


def test_reports_round_trip_and_old_reports_load():
    included = np.arange(40) % 2 == 0
    scores = np.random.default_rng(6).normal(size=40)
    report = audit_scores(
        scores, included, audit=CanaryAudit(40), epsilon=8.0, delta=1e-5, unit="record"
    )
    data = report.to_dict()
    assert data["detectable_noise_factor"] == math.inf and data["verdict"] == "cannot tell"
    for key in ("power_epsilon", "audit_delta", "epsilon_gdp", "gdp_method"):
        assert key in data
    assert CanaryReport.from_dict(data) == report
    written = {k: ("inf" if v == math.inf else v) for k, v in data.items()}  # as a ledger
    assert CanaryReport.from_dict(written) == report
    old = {k: data[k] for k in list(data)[:14]}  # the fields before power was stated
    loaded = CanaryReport.from_dict(old)
    assert loaded.verdict is None and loaded.power_epsilon is None
    assert "empirical epsilon >=" in loaded.line()
