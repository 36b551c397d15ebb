"""A user-level privacy plan on any summed algorithm (issue 46): central DP on FedAdam and
FedProx, DP-FTRL's correlated noise under FedYogi's server step, DP-FedAvg as FedAvg plus a
plan, the plan's noise on a user algorithm, and one-line refusals of pairs that cannot hold.

Small on purpose: 12 digits clients, a 16-unit MLP, two rounds, one compiled call each.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
import pytest

from swarmjax.fl.algorithms.client_level_dp_fedavg import dp_fedavg
from swarmjax.fl.algorithms.combined import CombinedAggregator
from swarmjax.fl.algorithms.dp_ftrl import dp_ftrl
from swarmjax.fl.algorithms.fed_dp_pso import fedpso
from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.algorithms.fedprox import FedProx
from swarmjax.fl.client.training import LocalTraining, RecordDP
from swarmjax.fl.data import load_dataset
from swarmjax.fl.data.clients import stack_clients
from swarmjax.fl.data.partition import iid_partition
from swarmjax.fl.private import Private, private
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import Execution, simulate
from swarmjax.models import mlp
from swarmjax.privacy.clipping import FixedClipping
from swarmjax.privacy.noise import CorrelatedNoise, GaussianNoise
from swarmjax.privacy.participation import FixedCohort, MinSeparation, Poisson
from swarmjax.privacy.user_level import UserLevelDP
from tests.reproducible import SECRET

MODEL = mlp((16,), 10, (8, 8, 1))
N, PER_CLIENT, ROUNDS, DELTA, EPS = 12, 40, 2, 1e-3, 4.0
TRAINING = LocalTraining(epochs=1, batch_size=10)
SPEC = RunSpec(ROUNDS, DELTA, (0,))
RATE = 0.5


@pytest.fixture(scope="module")
def digits():
    data = load_dataset("digits")
    x, y = data.x_train[: N * PER_CLIENT], data.y_train[: N * PER_CLIENT]
    clients = stack_clients(x, y, iid_partition(y, N, seed=0).indices)
    return clients, (data.x_test[:200], data.y_test[:200])


def _poisson() -> Poisson:
    return Poisson.for_run(N, RATE, ROUNDS, DELTA, EPS)


def _run(alg, digits, **grid):
    clients, test = digits
    variants = Variants.grid(alg, clients, SPEC, epsilon_target=EPS, **grid)
    return simulate(
        alg, clients, test, variants, secret=SECRET, execution=Execution(progress=False)
    )


def _same_guarantee(res, reference) -> None:
    """The guarantee checks DP-FedAvg's tests make: client level, calibrated to the
    target, end to end, and the epsilon curve of the same plan."""
    p = res.privacy
    assert p.unit == "client" and p.relation.startswith("client-level")
    assert p.end_to_end
    assert float(np.max(p.final_epsilon)) <= EPS + 1e-9
    np.testing.assert_array_equal(p.noise_multiplier, reference.noise_multiplier)
    np.testing.assert_allclose(p.epsilon, reference.epsilon, rtol=0, atol=0)


@pytest.fixture(scope="module")
def dp_fedavg_run(digits):
    alg = dp_fedavg(MODEL, participation=_poisson(), training=TRAINING, clipping="adaptive")
    return alg, _run(alg, digits, sample_rate=RATE, learning_rate=0.3)


def test_dp_fedavg_is_fedavg_plus_a_plan(dp_fedavg_run, digits):
    alg, res = dp_fedavg_run
    assert isinstance(alg, Private) and type(alg.algorithm) is FedAvg
    by_hand = private(
        FedAvg(MODEL, TRAINING, server_optimizer="sgd", weighting="uniform"),
        UserLevelDP(_poisson()),
    )
    assert by_hand == alg  # the same static settings: the same release identity and keys
    again = _run(by_hand, digits, sample_rate=RATE, learning_rate=0.3)
    for a, b in zip(
        jax.tree.leaves(res.server.params), jax.tree.leaves(again.server.params), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    assert float(np.max(res.privacy.final_epsilon)) <= EPS + 1e-9
    # one event: the plan that calibrated z states the record's final epsilon
    plan = alg.plan.privacy_plan(N, RATE, SPEC)
    z = float(res.privacy.noise_multiplier[0, 0])
    stated = dataclasses.replace(plan, noise_multiplier=z).epsilon()
    np.testing.assert_allclose(res.privacy.final_epsilon, stated, rtol=1e-9)


@pytest.mark.parametrize("inner", ["fedadam", "fedprox"])
def test_central_dp_on_fedadam_and_fedprox(inner, dp_fedavg_run, digits):
    """FedAdam and FedProx take the plan without a new class: the same plan, the same
    epsilon curve and noise multiplier as DP-FedAvg's, and a model that moved."""
    if inner == "fedadam":
        alg = FedAvg(MODEL, TRAINING, server_optimizer="adam", weighting="uniform")
        grid = {"server_lr": 0.01}
    else:
        alg = FedProx(MODEL, TRAINING, server_optimizer="sgd", weighting="uniform")
        grid = {"mu": 0.1}
    dp = private(alg, UserLevelDP(_poisson()))
    res = _run(dp, digits, sample_rate=RATE, learning_rate=0.3, **grid)
    _same_guarantee(res, dp_fedavg_run[1].privacy)
    assert "clip_norm" in res.history.columns and res.history["test_accuracy"].notna().all()
    assert any(
        not np.array_equal(a, b)
        for a, b in zip(
            jax.tree.leaves(res.server.params),
            jax.tree.leaves(jax.vmap(MODEL.init)(jax.random.split(jax.random.key(0), 1))),
            strict=True,
        )
    )


def test_dp_ftrl_with_fedyogi_server_step(digits):
    """DP-FTRL's correlated noise under FedYogi's server optimiser, as one constructor
    argument and as a plan on FedYogi by hand: the same algorithm, one whole-run Gaussian
    event calibrated to the target."""
    schedule = MinSeparation(4).for_run(N, ROUNDS)
    alg = dp_ftrl(MODEL, schedule, training=TRAINING, clipping="fixed", server_optimizer="yogi")
    yogi = FedAvg(MODEL, TRAINING, server_optimizer="yogi", weighting="uniform")
    plan = UserLevelDP(schedule, FixedClipping(), CorrelatedNoise())
    assert private(yogi, plan) == alg
    res = _run(alg, digits, learning_rate=0.3, server_lr=0.01)
    p = res.privacy
    assert p.unit == "client" and float(np.max(p.final_epsilon)) <= EPS + 1e-9
    plan_eps = plan.privacy_plan(N, 1.0, SPEC).calibrate(EPS)
    np.testing.assert_allclose(p.noise_multiplier, plan_eps.noise_multiplier, rtol=1e-6)
    assert np.all(np.asarray(p.steps)[:, -1] == 1)  # the whole run is one event


def test_the_plans_noise_reaches_a_user_algorithm(digits):
    """No training (learning rate 0: every update is 0), a plain server step: the model
    moves by exactly the released noise, std ``z C / m`` per coordinate for a fixed cohort
    of ``m`` (float release), so the noise really is the plan's."""
    m, clip = 6, 2.0
    alg = private(
        FedAvg(MODEL, TRAINING, server_optimizer=None, weighting="uniform"),
        UserLevelDP(FixedCohort(m), FixedClipping(), GaussianNoise("float")),
    )
    clients, test = digits
    spec = RunSpec(1, DELTA, (0,))
    variants = Variants.grid(
        alg, clients, spec, noise_multiplier=1.5, initial_clip=clip, learning_rate=1e-30
    )
    res = simulate(alg, clients, test, variants, secret=SECRET, execution=Execution(progress=False))
    # the initial model: the algorithm's own init from the run's server-init key
    from swarmjax.fl.protocol import run_keys, server_init_key, variant_identities

    key = run_keys(SECRET, (0,), variant_identities(alg, variants), False)[0]
    w0 = MODEL.init(server_init_key(key))
    moved = np.concatenate(
        [
            (np.asarray(a)[0] - np.asarray(b)).ravel()
            for a, b in zip(jax.tree.leaves(res.server.params), jax.tree.leaves(w0), strict=True)
        ]
    )
    expected = 1.5 * clip / m
    assert moved.size > 1000
    np.testing.assert_allclose(np.std(moved), expected, rtol=0.1)
    assert abs(np.mean(moved)) < 4 * expected / math.sqrt(moved.size)


# ------------------------------------------------------------------------- refusals


def _refused(match: str, make) -> None:
    with pytest.raises(ValueError, match=match) as info:
        make()
    assert "\n" not in str(info.value)


def test_a_plan_on_an_algorithm_without_a_summed_exchange_is_one_line():
    combined = FedAvg(MODEL, TRAINING, combine=CombinedAggregator(), weighting="uniform")
    _refused("one summed exchange", lambda: private(combined, UserLevelDP()))
    pso = fedpso(MODEL)  # no summed exchange: the server ranks reported scores
    _refused("one round exchange|summed exchange", lambda: private(pso, UserLevelDP()))


def test_a_plan_whose_unit_does_not_match_is_one_line():
    record = FedAvg(MODEL, LocalTraining(batch_size=10, record_dp=RecordDP()), weighting="uniform")
    _refused("record-level claim", lambda: private(record, UserLevelDP()))
    _refused("cohort must be None", lambda: private(FedAvg(MODEL, cohort=4), UserLevelDP()))
    _refused("weighting must be 'uniform'", lambda: private(FedAvg(MODEL), UserLevelDP()))


def test_min_separation_with_poisson_amplification_is_one_line(digits):
    clients, _ = digits
    _refused(
        "MinSeparation takes noise=CorrelatedNoise",
        lambda: UserLevelDP(MinSeparation(4), noise=GaussianNoise()),
    )
    _refused(
        "needs participation=MinSeparation", lambda: UserLevelDP(Poisson(), noise=CorrelatedNoise())
    )
    _refused("noise_cohort needs a public cohort", lambda: UserLevelDP(noise_cohort=100))
    alg = dp_ftrl(MODEL, MinSeparation(4).for_run(N, ROUNDS), training=TRAINING)
    _refused(
        "sample_rate applies to Poisson participation only",
        lambda: Variants.grid(alg, clients, SPEC, sample_rate=0.5),
    )


def test_the_old_hyper_name_is_refused_naming_the_new_one(digits):
    clients, _ = digits
    alg = dp_fedavg(MODEL, training=TRAINING)
    _refused(
        "renamed: it is now 'learning_rate'",
        lambda: Variants.grid(alg, clients, SPEC, client_lr=0.1),
    )
