"""Privacy plans: the one entry point for overflow, buffer sizing, calibration and delta."""

from __future__ import annotations

import dataclasses
import math

import dp_accounting
import pytest
from scipy import stats

from swarmjax.privacy import accounting
from swarmjax.privacy.plan import (
    COMPOSED_EPSILON,
    RELATIONS,
    PrivacyPlan,
    check_delta,
    default_delta,
)


def test_default_delta_is_a_tenth_over_the_units_and_at_most_1e_5():
    assert default_delta(100) == 1e-5  # 0.1 / 100 = 1e-3 is too loose for a small dataset
    assert default_delta(1200) == 1e-5
    assert default_delta(60000) == pytest.approx(0.1 / 60000)
    assert default_delta(10_000) == pytest.approx(1e-5)  # where the two rules meet
    with pytest.raises(ValueError, match="units"):
        default_delta(0)


@pytest.mark.parametrize("bad", [0.0, 1.0, -1e-3, 1.5, math.nan, "x", True])
def test_delta_outside_the_open_interval_is_one_line(bad):
    with pytest.raises(ValueError, match="delta") as err:
        check_delta(bad)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="delta"):
        PrivacyPlan("client", 100, 0.1, 10, bad)


def test_a_delta_not_below_one_over_the_units_is_warned_in_one_line(recwarn):
    PrivacyPlan("client", 100, 0.1, 10, 0.5)
    PrivacyPlan("record", 20, 0.1, 10, 0.05)  # exactly 1 / 20: still no guarantee
    PrivacyPlan("client", 100, 0.1, 10, 1e-3)  # below: nothing said
    texts = [str(w.message) for w in recwarn.list]
    assert len(texts) == 2 and all("\n" not in t for t in texts)
    assert texts[0].startswith("delta 0.5 is not below 1/100 (one over the plan's clients)")
    assert "default_delta gives 1e-05" in texts[0]
    assert texts[1].startswith("delta 0.05 is not below 1/20 (one over the plan's records)")


def test_overflow_is_charged_on_the_worse_neighbour():
    client = PrivacyPlan("client", 100, 0.1, 20, 1e-5, capacity=22)
    record = PrivacyPlan("record", 100, 0.1, 20, 1e-5, capacity=22)
    assert client.overflow_prob == pytest.approx(stats.binom.sf(22, 101, 0.1), rel=1e-12)
    assert record.overflow_prob == pytest.approx(stats.binom.sf(22, 100, 0.1), rel=1e-12)
    assert client.overflow == pytest.approx(20 * client.overflow_prob)
    assert client.relation == RELATIONS["client"] and "N is public" in client.relation
    # a buffer that holds every candidate of both neighbours cannot overflow
    assert PrivacyPlan("client", 100, 0.1, 20, 1e-5, capacity=101).overflow_prob == 0.0
    assert PrivacyPlan("client", 100, 0.1, 20, 1e-5, capacity=100).overflow_prob > 0.0
    assert PrivacyPlan("record", 100, 0.1, 20, 1e-5, capacity=100).overflow_prob == 0.0
    assert PrivacyPlan("client", 100, 0.1, 20, 1e-5).overflow_prob == 0.0


def test_sized_buffer_bounds_the_charge_and_never_goes_below_the_floor():
    # sized for the run's own epsilon alone (composed_epsilon no larger): the old rule
    plan = PrivacyPlan("client", 1200, 50 / 1200, 100, 1 / 1200).sized(2.0, composed_epsilon=2.0)
    assert plan.capacity == 97
    assert plan.steps * plan.overflow_prob * (1 + math.exp(2.0)) <= 1e-3 * plan.delta
    smaller = PrivacyPlan("client", 1200, 50 / 1200, 100, 1 / 1200, capacity=96)
    assert smaller.steps * smaller.overflow_prob * (1 + math.exp(2.0)) > 1e-3 * plan.delta
    assert PrivacyPlan("client", 1200, 50 / 1200, 0, 1 / 1200).sized(2.0).capacity == (
        plan.floor_capacity()
    )
    with pytest.raises(ValueError, match="capacity must be >= 97"):
        PrivacyPlan("client", 1200, 50 / 1200, 2, 1 / 1200, capacity=91).check_capacity()


def test_default_buffer_keeps_the_charge_negligible_up_to_a_composed_epsilon_of_64():
    """vs_pfl's work: the charge at any composed epsilon up to 64 is at most 1e-3 delta;
    the buffer grows from 97 to 158 slots (expected cohort 50)."""
    base = PrivacyPlan("client", 1200, 50 / 1200, 100, 1 / 1200)
    plan = base.sized(2.0)
    assert COMPOSED_EPSILON == 64.0 and plan.capacity == 158
    assert plan.overflow * (1 + math.exp(64.0)) <= 1e-3 * plan.delta
    shorter = dataclasses.replace(plan, capacity=157)
    assert shorter.overflow * (1 + math.exp(64.0)) > 1e-3 * plan.delta
    # a run whose own bound is larger is sized for it; infinite bounds get the floor
    assert base.sized(100.0).capacity > plan.capacity
    assert base.sized(math.inf).capacity == base.floor_capacity() == 97
    # the noise is calibrated as before: the old buffer's charge was 1e-3 delta at most
    assert (
        plan.calibrate(2.0).noise_multiplier
        == base.sized(2.0, composed_epsilon=2.0).calibrate(2.0).noise_multiplier
    )
    with pytest.raises(ValueError, match="composed_epsilon"):
        base.sized(2.0, composed_epsilon=0.0)


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_calibration_meets_the_target_by_its_own_accountant(accountant):
    plan = PrivacyPlan("client", 1200, 50 / 1200, 100, 1 / 1200, accountant=accountant)
    tuned = plan.sized(2.0).calibrate(2.0)
    eps = tuned.epsilon()
    assert 0.99 * 2.0 <= eps <= 2.0
    # the event is what dp-accounting composes: the same epsilon without the overflow term
    direct = accounting.event_epsilon(tuned.event, tuned.delta, accountant=accountant)
    assert direct <= eps
    assert isinstance(tuned.event, dp_accounting.SelfComposedDpEvent)
    assert plan.calibrate(math.inf).noise_multiplier == 0.0


def test_pld_calibrates_less_noise_than_rdp_at_the_same_target():
    pld = PrivacyPlan("client", 1200, 50 / 1200, 100, 1 / 1200).calibrate(2.0)
    rdp = PrivacyPlan("client", 1200, 50 / 1200, 100, 1 / 1200, accountant="rdp").calibrate(2.0)
    assert pld.noise_multiplier < 0.95 * rdp.noise_multiplier
    # and RDP overstates the epsilon of the PLD-calibrated noise
    assert (
        rdp.__class__(**{**rdp.__dict__, "noise_multiplier": pld.noise_multiplier}).epsilon() > 2.0
    )


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"unit": "user"}, "unit"),
        ({"population": 0}, "population"),
        ({"rate": 0.0}, "sample_rate"),
        ({"steps": -1}, "steps"),
        ({"accountant": "gdp"}, "accountant"),
        ({"capacity": 0}, "capacity"),
        ({"noise_multiplier": -1.0}, "noise_multiplier"),
    ],
)
def test_bad_plans_name_the_setting(kwargs, name):
    base = {"unit": "client", "population": 100, "rate": 0.1, "steps": 5, "delta": 1e-3}
    with pytest.raises(ValueError, match=name) as err:
        PrivacyPlan(**{**base, **kwargs})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_record_epsilon_agrees_with_dp_accounting_directly(accountant):
    """The privacy record of a run composes its per-round events with the accountant it
    names; the final epsilon equals dp-accounting's own accountant on the same events (PLD
    at the record's interval), and is never below PLD at dp-accounting's finer default."""
    import numpy as np
    from dp_accounting.pld import pld_privacy_accountant
    from dp_accounting.rdp import rdp_privacy_accountant

    from swarmjax.fl.runtime.result import privacy_record

    runs, rounds, clients, q, z, delta = 1, 30, 4, 0.05, 1.1, 1e-5
    shape = (runs, rounds, clients)
    steps = np.broadcast_to(np.arange(1, rounds + 1)[None, :, None], shape)
    record = privacy_record(
        steps,
        (),
        unit="client",
        delta=delta,
        rates=accounting.Rates(np.full(shape, q), np.full(shape, z)),
        accountant=accountant,
    )
    assert record.accountant == accountant
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), rounds
    )
    if accountant == "pld":
        ref = pld_privacy_accountant.PLDAccountant(
            value_discretization_interval=accounting.PLD_INTERVAL
        )
        fine = pld_privacy_accountant.PLDAccountant()
        fine.compose(event)
        assert record.final_epsilon.max() >= fine.get_epsilon(delta) - 1e-12
    else:
        ref = rdp_privacy_accountant.RdpAccountant()
    ref.compose(event)
    np.testing.assert_allclose(record.final_epsilon, ref.get_epsilon(delta), rtol=1e-7)
    ((ids, run_event, overflow),) = record.run_events(0)
    assert ids is None and overflow == 0.0
    assert accounting.event_epsilon(run_event, delta, accountant=accountant) == pytest.approx(
        ref.get_epsilon(delta), rel=1e-7
    )


def test_fixed_cohort_is_charged_every_step_without_amplification():
    fixed = PrivacyPlan.fixed_cohort("client", 1200, 50, 100, 1 / 1200).calibrate(2.0)
    assert fixed.participation == "fixed" and fixed.rate == 1.0 and fixed.capacity == 50
    assert fixed.overflow_prob == 0.0
    assert fixed.event == dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(fixed.noise_multiplier), 100
    )
    poisson = PrivacyPlan("client", 1200, 50 / 1200, 100, 1 / 1200).calibrate(2.0)
    assert fixed.noise_multiplier > 5 * poisson.noise_multiplier  # no amplification claimed
    with pytest.raises(ValueError, match="cohort must be <= population"):
        PrivacyPlan.fixed_cohort("client", 10, 11, 5, 1e-3)
    with pytest.raises(ValueError, match="sample_rate must be 1 for a fixed cohort"):
        PrivacyPlan("client", 10, 0.5, 5, 1e-3, participation="fixed")
    with pytest.raises(ValueError, match="participation"):
        PrivacyPlan("client", 10, 0.5, 5, 1e-3, participation="min-separation")


def test_record_groups_clients_by_their_whole_run_event_extra_epsilon_included():
    """Clients with equal steps but different noised-release epsilons (e.g. Fed-DP-PSO's
    Laplace scores) have different whole-run events: the ledger must not give one client's
    event to the other."""
    import numpy as np

    from swarmjax.fl.runtime.result import privacy_record

    shape = (1, 2, 3)
    extra = np.zeros(shape)
    extra[0, :, 2] = [0.5, 1.0]
    record = privacy_record(
        np.broadcast_to(np.arange(1, 3)[None, :, None], shape),
        (),
        unit="record",
        delta=1e-5,
        rates=accounting.Rates(np.full(shape, 0.1), np.ones(shape), extra_epsilon=extra),
    )
    groups = {ids: event for ids, event, _ in record.run_events(0)}
    assert set(groups) == {(0, 1), (2,)}
    assert accounting.PureDpEvent(1.0) in groups[(2,)].events
    assert accounting.event_epsilon(groups[(2,)], 1e-5) > accounting.event_epsilon(
        groups[(0, 1)], 1e-5
    )
