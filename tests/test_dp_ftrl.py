"""User-level DP-FTRL on the protocol: the Flower runtime equals the simulator, the record
names the scheme and its epsilon is dp-accounting's, the cohorts follow the public
schedule, the prefix-sum baseline releases DP-SGD's noised sum, pfl's noise cohort, and
refusals before any work.

One compiled run: the Flower deployment of a 3-client task (banded factorization, adaptive
clipping, 3 rounds) and the same task in the simulator; the rest calls ``aggregate`` on a
tiny model or fails before compiling."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant

from swarmjax.fl.algorithms.dp_ftrl import dp_ftrl
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.protocol import RunSpec, Slots, Variants
from swarmjax.fl.runtime.flower.tasks import digits_clients
from swarmjax.models import mlp
from swarmjax.privacy import accounting
from swarmjax.privacy.ftrl import correlated_noise, noise_state
from swarmjax.privacy.mechanisms import gaussian_mechanism
from swarmjax.privacy.noise import CorrelatedNoise
from swarmjax.privacy.participation import MinSeparation
from swarmjax.privacy.user_level import ClippedUpdate, UserLevelDP
from tests.reproducible import SECRET

CONFIG = {
    "task": "swarmjax.fl.runtime.flower.tasks:digits",
    "algorithm": "dp-ftrl",
    "rounds": 3,
    "train-size": 150,
    "hidden": 8,
    "num-clients": 3,
    "cohort": 1,
    "min-separation": 2,
    "factorization": "banded",
}

pytest.importorskip("flwr", reason="the flower extra is not installed")

from swarmjax.fl.runtime.flower import client as flower_client  # noqa: E402
from swarmjax.fl.runtime.flower import loopback  # noqa: E402
from swarmjax.fl.runtime.flower import server as flower_server  # noqa: E402
from swarmjax.fl.runtime.flower import task as flower_task  # noqa: E402

SMALL = {"train-size": 60, "num-clients": 6}


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """The task on the Flower runtime (LoopbackGrid: the real ServerApp and ClientApps) and
    in the simulator, all reading one supplied secret (``secret-file``) so that they draw
    the same numbers."""
    key = SECRET.save(tmp_path_factory.mktemp("secret") / "secret.key")
    config = {**CONFIG, "secret-file": str(key)}
    deployment = flower_task.load_task(config)
    assert deployment.secret == SECRET
    app = flower_client.make_client_app()
    grid = loopback.LoopbackGrid.with_partitions(app, config, (0, 1, 2))
    fast = flower_server.ServerSettings(join_timeout=1.0, reply_timeout=1.0)
    run = flower_server.drive(grid, deployment, fast)
    return deployment, run, flower_task.simulate_task(deployment)


def test_flower_equals_the_simulator(deployed):
    _, run, sim = deployed
    for x, y in zip(jax.tree.leaves(run.server), jax.tree.leaves(sim.server), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=1e-6)
    for col in ("test_accuracy", "test_loss", "clip_norm", "epsilon_max", "bytes_up"):
        np.testing.assert_allclose(run.history[col], sim.history[col], rtol=0, atol=1e-6)
    np.testing.assert_allclose(run.privacy.epsilon, sim.privacy.epsilon)
    assert run.privacy.covers == sim.privacy.covers
    assert (run.operator.messages["status"] == "ok").all()


def test_cohorts_follow_the_public_schedule(deployed):
    task, run, _ = deployed
    schedule = np.asarray(task.hyper.plan.schedule)
    assert schedule.shape == (3, 1)
    sent = run.operator.messages[~run.operator.messages["setup"]]
    for t in range(3):
        assert sorted(sent.loc[sent["round"] == t + 1, "client"]) == sorted(schedule[t])


def test_record_names_the_scheme_and_its_epsilon_is_dp_accountings(deployed):
    """b = 2 over 3 rounds: k = 2; z = 1 is the accounted multiplier of the whole run, so
    every client's epsilon, from round 1 on, is dp-accounting's for ONE Gaussian of
    multiplier 1 (its own PLD at swarmjax's interval, computed here)."""
    task, run, _ = deployed
    alg = task.algorithm
    participation = alg.plan.participation
    assert (
        alg.plan.noise.factorization,
        participation.min_separation,
        participation.max_participations,
    ) == ("banded", 2, 2)
    (line, bit) = run.privacy.covers
    assert "'banded' matrix factorization" in line and "'cyclic'" in line
    assert "k=2 times at least b=2 rounds apart" in line and "cohorts of 1" in line
    assert "SIMULATED" not in line
    assert "sigma_b" in bit
    z = float(task.hyper.plan.noise_multiplier)
    assert z == 1.0
    pld = pld_privacy_accountant.PLDAccountant(
        value_discretization_interval=accounting.PLD_INTERVAL
    )
    pld.compose(dp_accounting.GaussianDpEvent(z))
    expected = pld.get_epsilon(task.delta)
    np.testing.assert_allclose(run.privacy.epsilon, expected, rtol=1e-9)
    plan = alg.plan.privacy_plan(3, 1.0, task.variants.spec).calibrate(math.inf)
    assert plan.participations == 2
    assert dataclasses.replace(plan, noise_multiplier=z).epsilon() == pytest.approx(expected)


@functools.cache
def small():
    """Six digits clients and a 2-unit model (for direct calls to ``aggregate``)."""
    clients, test = digits_clients(SMALL)
    model = mlp((2,), 10, clients.x.shape[2:])
    return clients, test, model


def _one_round(alg, hyper_values, updates):
    """``aggregate`` of round 1 for replies ``updates`` (``(S, ...)`` per leaf, every slot
    replying): the server before and after, the resolved hyper and the aggregate key."""
    clients, _, _ = small()
    spec = RunSpec(rounds=4, delta=1e-3)
    variants = Variants.grid(alg, clients, spec, **hyper_values)
    hyper = jax.tree.map(lambda a: a[0], variants.hyper)
    server = alg.server_init(jax.random.key(0), hyper)
    cohort = alg.plan.participation.cohort
    slots = Slots(
        mask=jnp.ones(cohort, bool), ids=jnp.arange(cohort, dtype=jnp.int32), num_clients=6
    )
    key = jax.random.key(5)
    new = jax.jit(alg.aggregate)(server, ClippedUpdate(update=updates), slots, key, hyper)
    return server, new, hyper, key


def _updates(model, cohort, seed=1):
    like = model.init(jax.random.key(0))
    leaves, treedef = jax.tree.flatten(like)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return treedef.unflatten(
        [0.01 * jax.random.normal(k, (cohort, *x.shape)) for k, x in zip(keys, leaves, strict=True)]
    )


def test_prefix_sum_releases_dp_sgds_noised_sum():
    """With the plain prefix-sum factorization the server's step is ``-lr / m`` times DP-SGD's
    Gaussian mechanism on the clipped sum, same key, std ``z clip sqrt(k)``: the released sum
    of DP-FTRL's baseline is DP-SGD's (DP-FedAvg's ``noise_release='float'``)."""
    _, _, model = small()
    alg = dp_ftrl(
        model,
        MinSeparation(2, min_separation=2),
        noise=CorrelatedNoise("prefix-sum"),
        clipping="fixed",
    )
    updates = _updates(model, 2)
    server, new, hyper, key = _one_round(alg, {"noise_multiplier": 0.9}, updates)
    k = float(hyper.plan.participations)
    assert k == 2.0 and float(hyper.plan.strategy.sensitivity) == pytest.approx(math.sqrt(2))
    total = jax.tree.map(lambda u: jnp.sum(u, 0), updates)
    released = gaussian_mechanism(
        jax.random.split(key)[0],
        total,
        l2_sensitivity=server.plan.clip,
        noise_multiplier=0.9 * hyper.plan.strategy.sensitivity,
    )
    expected = jax.tree.map(
        lambda w, r: w + float(hyper.inner.server_lr) * r / 2, server.params, released
    )
    for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_adaptive_clipping_scales_each_rounds_output_not_the_stream():
    """The mechanism runs on the normalised sums ``x_t / C_t``: round ``t`` adds ``C_t``
    times row ``t`` of ``C^{-1}`` applied to noise of CONSTANT std (a stream of noises
    scaled by the past clip norms would not be the analysed mechanism). Zero updates, two
    rounds of a banded strategy; ``C_2 != C_1`` after the first noised count."""
    clients, _, model = small()
    alg = dp_ftrl(
        model,
        MinSeparation(2, min_separation=3),
        noise=CorrelatedNoise("banded"),
        clipping="adaptive",
    )
    spec = RunSpec(rounds=4, delta=1e-3)
    hyper = jax.tree.map(lambda a: a[0], Variants.grid(alg, clients, spec, clip_lr=1.0).hyper)
    zero = jax.tree.map(jnp.zeros_like, _updates(model, 2))
    bits = jnp.zeros(2, jnp.float32)
    slots = Slots(mask=jnp.ones(2, bool), ids=jnp.arange(2, dtype=jnp.int32), num_clients=6)
    step = jax.jit(alg.aggregate)
    keys = [jax.random.key(11), jax.random.key(12)]
    servers = [alg.server_init(jax.random.key(0), hyper)]
    for key in keys:
        replies = ClippedUpdate(update=zero, unclipped=bits)
        servers.append(step(servers[-1], replies, slots, key, hyper))
    clips = [float(s.plan.clip) for s in servers]
    assert clips[1] != clips[0]
    strategy = hyper.plan.strategy
    std = alg.plan.sum_noise(hyper.plan) * strategy.sensitivity
    like = jax.tree.map(lambda u: u[0], zero)  # one model's shapes
    state = noise_state(strategy, like)
    lr = float(hyper.inner.server_lr)
    for t, key in enumerate(keys):
        noise, state = correlated_noise(strategy, state, jax.random.split(key)[0], like, std)
        moved = jax.tree.map(jnp.subtract, servers[t + 1].params, servers[t].params)
        for a, e in zip(jax.tree.leaves(moved), jax.tree.leaves(noise), strict=True):
            np.testing.assert_allclose(a, lr * clips[t] * e / 2, rtol=1e-4, atol=1e-8)


def test_noise_cohort_scales_the_noise_and_the_record_says_so():
    """pfl's noise cohort: the noise on this run's sum is ``m / M`` of the deployment's; the
    record states the simulated cohort and that epsilon holds only for it. Not the
    default."""
    assert inspect.signature(dp_ftrl).parameters["noise_cohort"].default is None
    assert UserLevelDP.__dataclass_fields__["noise_cohort"].default is None
    _, _, model = small()
    zero = jax.tree.map(jnp.zeros_like, _updates(model, 2))
    moves = []
    for cohort in (None, 20):
        alg = dp_ftrl(
            model,
            MinSeparation(2),
            noise=CorrelatedNoise("prefix-sum"),
            clipping="fixed",
            noise_cohort=cohort,
        )
        server, new, _, _ = _one_round(alg, {}, zero)
        moves.append(jax.tree.map(jnp.subtract, new.params, server.params))
    for a, b in zip(*map(jax.tree.leaves, moves), strict=True):
        np.testing.assert_allclose(b, a * 2 / 20, rtol=1e-4, atol=1e-7)
    note = alg.exchanges[0].protection["update"].note
    assert "SIMULATED COHORT OF 20" in note and "only for a deployment with cohorts of 20" in note


def test_a_schedule_breaking_the_scheme_is_refused_before_any_work():
    """A client scheduled more often, or closer, than the scheme allows: the grid (hence the
    run) refuses it, naming the client, before anything compiles."""
    clients, _, model = small()
    prefix_sum = CorrelatedNoise("prefix-sum")
    alg = dp_ftrl(model, MinSeparation(1, min_separation=2, max_participations=2), noise=prefix_sum)
    spec = RunSpec(rounds=4, delta=1e-3)
    close = jnp.asarray([[0], [2], [0], [3]], jnp.int32)  # client 0 two rounds apart: b = 2 holds
    Variants.grid(alg, clients, spec, schedule=close)
    close = jnp.asarray([[0], [0], [1], [2]], jnp.int32)
    with pytest.raises(ValueError, match=r"schedule refused: client 0 .* rounds 1 and 2"):
        Variants.grid(alg, clients, spec, schedule=close)
    thrice = dp_ftrl(
        model, MinSeparation(1, min_separation=1, max_participations=2), noise=prefix_sum
    )
    with pytest.raises(ValueError, match="client 0 would participate 3 times"):
        Variants.grid(thrice, clients, spec, schedule=jnp.asarray([[0], [0], [1], [0]], jnp.int32))


@pytest.mark.parametrize(
    ("settings", "name"),
    [
        ({"cohort": 1, "min_separation": 5}, "min_separation must be <= rounds"),
        ({"cohort": 1, "min_separation": 2, "max_participations": 3}, "max_participations"),
        ({"cohort": 2, "factorization": "tree"}, "factorization"),
        ({"cohort": 3, "min_separation": 3}, "cohort must be <="),
        ({"cohort": 7}, "cohort must be <= num_clients"),
        ({"cohort": 2, "noise_cohort": 2}, "noise_cohort"),
        ({"cohort": 2, "schedule": "single"}, "cohort"),
    ],
)
def test_bad_input_is_one_line_naming_the_option(settings, name):
    _, _, model = small()
    settings = dict(settings)
    factorization = settings.pop("factorization", "blt")
    noise_cohort = settings.pop("noise_cohort", None)
    spec = RunSpec(rounds=4, delta=1e-3)
    with pytest.raises(ValueError, match=name) as info:
        dp_ftrl(
            model,
            MinSeparation(**settings).for_run(6, spec.rounds),
            noise=CorrelatedNoise(factorization),
            noise_cohort=noise_cohort,
        )
    assert "\n" not in str(info.value)


def test_training_settings_are_checked_like_dp_fedavg():
    clients, _, model = small()
    with pytest.raises(ValueError, match="clipping"):
        dp_ftrl(model, MinSeparation(2), clipping="none").client_data(clients)
    with pytest.raises(ValueError, match="server_momentum"):
        dp_ftrl(
            model, MinSeparation(2), server_momentum=1.5, training=LocalTraining(batch_size=5)
        ).client_data(clients)
