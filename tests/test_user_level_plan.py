"""What a user-level plan answers for the experiments and benchmarks (issue 46, item 4: every
DP decision in swarmjax/privacy): the delta it defaults to for its unit, what its epsilon
covers (a noise cohort's guarantee belongs to another deployment), how a ledger must list
such a run, its settings as a summary row states them (a min-separation's b and k resolved),
and the multiplier of the noise it adds to the sum."""

from __future__ import annotations

import math

import numpy as np
import pytest

from swarmjax.privacy.clipping import AdaptiveClipping, FixedClipping, sum_noise_multiplier
from swarmjax.privacy.ledger import Ledger, Release
from swarmjax.privacy.noise import CorrelatedNoise, GaussianNoise
from swarmjax.privacy.participation import FixedCohort, MinSeparation, Poisson
from swarmjax.privacy.plan import RELATIONS, default_delta
from swarmjax.privacy.user_level import UserLevelDP

FTRL = UserLevelDP(MinSeparation(5), FixedClipping(), CorrelatedNoise("prefix-sum"))
ELSEWHERE = UserLevelDP(MinSeparation(5), FixedClipping(), CorrelatedNoise(), noise_cohort=20)


def test_the_delta_defaults_for_clients_and_a_given_one_is_checked():
    assert UserLevelDP.delta_for(1200) == default_delta(1200) == 1e-5
    assert UserLevelDP.delta_for(10**6) == pytest.approx(1e-7)  # 0.1 / clients, not records
    assert UserLevelDP().delta_for(1200, 1 / 1200) == 1 / 1200
    for bad, named in ((1.5, "delta"), (0.0, "delta"), (math.nan, "delta")):
        with pytest.raises(ValueError, match=named) as err:
            UserLevelDP.delta_for(1200, bad)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="num_clients"):
        UserLevelDP.delta_for(0)


def test_a_noise_cohort_epsilon_holds_only_for_that_deployment():
    assert UserLevelDP().own_guarantee and FTRL.own_guarantee
    assert UserLevelDP().guarantee() == "this run's own (user-level)"
    assert not ELSEWHERE.own_guarantee
    text = ELSEWHERE.guarantee()
    assert text.startswith("holds ONLY for a deployment with cohorts of 20 clients")
    assert "cohorts of 5 with 5/20 of that noise" in text and "no such guarantee" in text
    assert ELSEWHERE.noise_scale == 5 / 20


def _release(epsilon: float = 2.0) -> Release:
    return Release(
        algorithm="dp-ftrl",
        variant={"epsilon_target": 2.0},
        seed=0,
        unit="client",
        relation=RELATIONS["client"],
        delta=1e-5,
        epsilon=epsilon,
        accountant="pld",
        path="history.csv",
    )


def test_a_ledger_lists_a_noise_cohort_run_without_composing_it(tmp_path):
    own = _release()
    assert FTRL.released(own) is own  # the run's own guarantee: listed as it is
    moved = ELSEWHERE.released(_release(2.0))
    assert moved.epsilon == math.inf and not moved.private
    assert moved.variant == {
        "epsilon_target": 2.0,
        "deployment_epsilon": 2.0,
        "guarantee": ELSEWHERE.guarantee(),
    }
    ledger = Ledger(tmp_path, "plans")
    ledger.add(moved)
    assert "client" not in ledger.composed()  # no epsilon covers it: never composed
    ledger.add(own)
    assert ledger.composed()["client"].releases == (1,)


def test_settings_name_the_plan_as_it_holds_for_the_run():
    got = FTRL.settings(40, 2)  # b = min(40 // 5, 2) = 2, k = ceil(2 / 2) = 1
    assert got == {
        "participation": "min-separation",
        "cohort": 5,
        "min_separation": 2,
        "max_participations": 1,
        "schedule": "cyclic",
        "schedule_seed": 0,
        "clipping": "fixed",
        "noise": "correlated",
        "factorization": "prefix-sum",
        "bands": None,
        "buffers": None,
        "noise_cohort": None,
    }
    assert ELSEWHERE.settings(40, 2)["noise_cohort"] == 20
    single = UserLevelDP(MinSeparation(5, schedule="single"), noise=CorrelatedNoise())
    assert single.settings(40, 6)["min_separation"] == 6  # b = T, k = 1
    assert single.settings(40, 6)["max_participations"] == 1
    poisson = UserLevelDP(Poisson(158), noise=GaussianNoise("float")).settings(1200, 100)
    assert poisson == {
        "participation": "poisson",
        "capacity": 158,
        "clipping": "adaptive",
        "noise": "gaussian",
        "noise_release": "float",
        "noise_cohort": None,
    }
    assert "factorization" not in poisson  # a setting of a strategy the plan does not use
    fixed = UserLevelDP(FixedCohort(10), FixedClipping()).settings(100, 3)
    assert fixed["participation"] == "fixed" and fixed["cohort"] == 10
    with pytest.raises(ValueError, match="cohort must be <= num_clients"):
        FTRL.settings(4, 2)


def test_the_noise_on_the_sum_is_what_release_adds():
    hyper = (
        UserLevelDP()
        .default_hyper(100, 3)
        .replace(noise_multiplier=np.float32(1.2), count_noise=np.float32(5.0))
    )
    fixed = UserLevelDP(clipping=FixedClipping())
    assert float(fixed.sum_noise(hyper)) == pytest.approx(1.2)
    adaptive = UserLevelDP(clipping=AdaptiveClipping())
    assert float(adaptive.sum_noise(hyper)) == pytest.approx(float(sum_noise_multiplier(1.2, 5.0)))
    assert float(adaptive.sum_noise(hyper)) > 1.2  # the count takes a share of the budget
    # k counts per event (min-separation): the count's std per event is sigma_b / sqrt(k)
    k4 = hyper.replace(participations=np.float32(4.0))
    assert float(adaptive.sum_noise(k4)) == pytest.approx(float(sum_noise_multiplier(1.2, 2.5)))
    # a noise cohort scales this run's noise by m / noise_cohort
    assert float(ELSEWHERE.sum_noise(hyper)) == pytest.approx(1.2 * 5 / 20)
    # a variant axis is kept
    grid = hyper.replace(noise_multiplier=np.float32([0.5, 1.0]), count_noise=np.float32([5, 5]))
    assert fixed.sum_noise(grid).shape == (2,)
