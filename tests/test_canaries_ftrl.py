"""Client-level canaries in DP-FTRL (``CentralUserLevel.canary_hook`` under a ``MinSeparation``
plan): the broken-mechanism drill under correlated (BLT) noise, canaries on the public
(k, b) schedule, and bad input.

One small federation (40 clients of 20 digits), fixed clipping, cohorts of 20 on a cyclic
schedule (b = 2, k = 10 over 20 rounds), claimed epsilon 2; 512 canaries on a
1,210-parameter model.  Local steps are small (client lr 0.01), so the real clients'
updates hardly reach along any canary direction.
"""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.fl.algorithms.dp_ftrl import dp_ftrl
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import simulate
from swarmjax.privacy.canaries import CanaryAudit
from swarmjax.privacy.noise import CorrelatedNoise
from swarmjax.privacy.participation import MinSeparation
from tests import test_canaries as _canaries
from tests.test_canaries import MODEL, NUM_CLIENTS, PER_CLIENT

COHORT = 20
EPSILON, DELTA = 2.0, 1e-5
SPEC = RunSpec(20, DELTA, (0,))
AUDIT = CanaryAudit(512)
SETTINGS = dict(initial_clip=1.0, learning_rate=0.01)
TRAINING = LocalTraining(epochs=1, batch_size=PER_CLIENT)
federation = _canaries.federation  # the fixture: 40 clients of 20 digits


def _alg(noise=None, **settings):
    """DP-FTRL on the run's public schedule (``b`` and ``k`` explicit), the epsilon target
    checked reachable before any work."""
    alg = dp_ftrl(
        MODEL,
        MinSeparation(COHORT).for_run(NUM_CLIENTS, SPEC.rounds),
        noise=noise,
        training=TRAINING,
        clipping="fixed",
        **settings,
    )
    alg.plan.privacy_plan(NUM_CLIENTS, 1.0, SPEC).calibrate(EPSILON)
    return alg


class TenfoldLessNoise(CorrelatedNoise):
    """Test-only break: the server's correlated noise has a tenth of the std the accountant
    is told about (the claimed epsilon is the unbroken one's)."""

    def add(self, key, total, clip, multiplier, reach, state, strategy):
        return super().add(key, total, clip, multiplier / 10.0, reach, state, strategy)


def _run(alg, federation, audit=AUDIT):
    clients, test = federation
    variants = Variants.grid(alg, clients, SPEC, epsilon_target=EPSILON, **SETTINGS)
    return simulate(alg, clients, test, variants, audit=audit)


def test_real_mechanism_stays_below_the_accounted_epsilon(federation):
    alg = _alg()
    participation = alg.plan.participation
    assert (participation.min_separation, participation.max_participations) == (2, 10)
    (report,) = _run(alg, federation).audit
    assert report.epsilon == pytest.approx(EPSILON, rel=1e-3)
    assert report.canaries == 512 and 0 < report.included < 512
    assert 0.0 <= report.epsilon_lower < report.epsilon
    assert not report.exceeds and report.verdict in ("ok", "cannot tell")
    assert "power: at most" in report.line()


def test_tenfold_less_noise_is_caught(federation):
    (report,) = _run(_alg(TenfoldLessNoise()), federation).audit
    assert report.epsilon == pytest.approx(EPSILON, rel=1e-3)  # the unbroken claim
    assert report.epsilon_lower > report.epsilon
    assert report.exceeds and "broken mechanism" in report.line()


@pytest.mark.parametrize(
    ("settings", "rounds", "expected"),
    [
        # b = 2, k = 10: canary i at rounds (i mod 2) + 2j, j < 10
        ({"min_separation": 2}, 20, [[r % 2 == i % 2 for i in range(6)] for r in range(20)]),
        # k capped at 3 over b = 4: rounds (i mod 4) + 4j, j < 3
        (
            {"min_separation": 4, "max_participations": 3},
            16,
            [[r % 4 == i % 4 and r // 4 < 3 for i in range(6)] for r in range(16)],
        ),
        # single: each canary once, at round i mod T
        ({"schedule": "single"}, 4, [[r == i % 4 for i in range(6)] for r in range(4)]),
    ],
)
def test_canaries_follow_the_public_min_separation_scheme(settings, rounds, expected):
    cohort, spec = 2, RunSpec(rounds, DELTA, (0,))
    alg = dp_ftrl(MODEL, MinSeparation(cohort, **settings).for_run(16, spec.rounds))
    hook = alg.accounting().canary_hook()
    included = jnp.asarray([True, True, False, True, True, True])
    schedule = jnp.zeros((rounds, cohort), jnp.int32)
    taking = np.stack(
        [
            np.asarray(
                hook.participate(_Server(schedule, jnp.int32(r)), jax.random.key(0), r, included)
            )
            for r in range(rounds + 2)  # past the last round: nobody
        ]
    )
    want = np.asarray(expected) & np.asarray(included)[None]
    np.testing.assert_array_equal(taking[:rounds], want)
    assert not taking[rounds:].any()
    b = alg.plan.participation.min_separation or rounds
    k = alg.plan.participation.max_participations or 1
    for i in range(6):  # each canary: at most k times, at least b rounds apart
        (rounds_in,) = np.nonzero(taking[:, i])
        assert len(rounds_in) <= k and (np.diff(rounds_in) >= b).all()


class _Server:
    """The two fields of the plan's state the canaries' participation reads (the public
    schedule, rounds done)."""

    def __init__(self, schedule, rounds):
        self.plan = SimpleNamespace(schedule=schedule, rounds=rounds)


@pytest.mark.parametrize(
    ("alg", "named"),
    [
        # b left to the run: the canaries' slots would be unknown
        (
            dp_ftrl(MODEL, MinSeparation(COHORT), training=TRAINING, clipping="fixed"),
            "MinSeparation's min_separation",
        ),
        # noise for a cohort of 40: the claimed epsilon is another deployment's
        (_alg(noise_cohort=40), "the run's own guarantee: noise_cohort=40"),
    ],
)
def test_audit_refuses_before_any_work(federation, alg, named):
    with pytest.raises(ValueError, match=f"^audit needs {named}") as info:
        _run(alg, federation)
    assert "\n" not in str(info.value)
