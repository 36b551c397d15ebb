"""Fed-DP-PSO's design-choice options (the authors' notebooks' readings): each changes what
it should and nothing else, and keeps the privacy accounting as it was."""

from __future__ import annotations

import dataclasses
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments import fed_dp_pso as experiment
from experiments import fed_dp_pso_study
from swarmjax import swarm
from swarmjax.fl.algorithms.fed_dp_pso import READINGS, FedDPPSO, fed_dp_pso, reading_hyper
from swarmjax.fl.client.training import LocalTraining, RecordDP, make_optimizer
from swarmjax.fl.data import load_dataset
from swarmjax.fl.data.clients import stack_clients
from swarmjax.fl.data.partition import iid_partition
from swarmjax.fl.data.transforms import PIXEL_STD_FLOOR, scale_inputs
from swarmjax.fl.protocol import RunSpec, Variants, coverage
from swarmjax.fl.runtime import simulate
from swarmjax.models import mlp, param_bytes

MODEL = mlp((8,), 10, (8, 8, 1))
PLAIN = LocalTraining(batch_size=32, optimizer="adam")
S = 3


@pytest.fixture(scope="module")
def setup():
    data = load_dataset("digits")
    part = iid_partition(data.y_train[:300], 2, seed=0)
    clients = stack_clients(data.x_train, data.y_train, part.indices)
    return clients, (data.x_test[:200], data.y_test[:200])


def _one(tree, i=0):
    return jax.tree.map(lambda a: a[i], tree)


def _client(alg, clients, learning_rate=0.01, pso=None):
    """(data of client 0, hyper of variant 0, its initial state)."""
    extra = {} if pso is None else {"pso": pso}
    spec = RunSpec(rounds=2, delta=1e-5)
    hyper = _one(Variants.grid(alg, clients, spec, learning_rate=learning_rate, **extra).hyper)
    data = _one(alg.client_data(clients))
    state = alg.client_init(jax.random.key(1), data, hyper, jnp.int32(0))
    return data, hyper, state


def test_shared_init_starts_every_particle_near_one_public_model(setup):
    clients, _ = setup
    alg = FedDPPSO(MODEL, PLAIN, particles=S, init="shared")
    data, hyper, state = _client(alg, clients)
    server = alg.server_init(jax.random.key(0), hyper)
    new, reply = alg.start_swarm(state, data, server.gbest, jax.random.key(2), hyper)
    assert reply == ()  # nothing goes up at setup: gbest stays theta_0
    assert [ex.name for ex in alg.setup] == ["init"] and coverage(alg.setup) == ((), ())
    chex.assert_trees_all_equal_shapes_and_dtypes(new.swarm, state.swarm)
    dev = jax.tree.map(lambda p, g: p - g[None], new.swarm.position, server.gbest)
    flat = jnp.concatenate([d.reshape(S, -1) for d in jax.tree.leaves(dev)], axis=1)
    assert abs(float(jnp.std(flat)) - alg.init_scale) < 0.2 * alg.init_scale
    assert float(jnp.min(jnp.abs(flat[0] - flat[1]))) >= 0  # particles differ:
    assert float(jnp.max(jnp.abs(flat[0] - flat[1]))) > alg.init_scale
    chex.assert_trees_all_equal(new.swarm.best_position, new.swarm.position)
    assert np.all(np.isfinite(np.asarray(new.swarm.best_loss)))
    assert new.swarm.seed == state.swarm.seed and int(new.swarm.iteration) == 0
    chex.assert_trees_all_equal(_counted(new), _counted(state))  # its S scores counted at init
    # independent inits are unrelated networks, far apart
    indep = FedDPPSO(MODEL, PLAIN, particles=S)
    _, _, other = _client(indep, clients)
    gap = jax.tree.map(lambda p: p[0] - p[1], other.swarm.position)
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(gap)) > 10 * alg.init_scale
    assert [ex.name for ex in indep.setup] == ["report", "upload"]


def _counted(state):
    """What a client's accountant keeps: its DP steps and their noise multiplier."""
    return state.steps, state.noise_multiplier


def _train(alg, state, data, hyper, gbest, key=3):
    return alg.train(state, data, gbest, jax.random.key(key), hyper)


def test_refine_update_always_replaces_the_refined_slots_pbest(setup):
    clients, _ = setup
    kept = FedDPPSO(MODEL, PLAIN, particles=S, refine_update="if_better")
    always = dataclasses.replace(kept, refine_update="always")
    # a huge step size makes the refined model worse than the pbest it started from
    data, hyper, state = _client(kept, clients, learning_rate=5.0)
    gbest = _one(state.swarm.position)
    a, _ = _train(kept, state, data, hyper, gbest)
    b, _ = _train(always, state, data, hyper, gbest)
    chex.assert_trees_all_equal(a.swarm.position, b.swarm.position)  # same moves, same refine
    chex.assert_trees_all_equal(a.swarm.velocity, b.swarm.velocity)
    chex.assert_trees_all_equal(_counted(a), _counted(b))
    differs = np.asarray(a.swarm.best_loss != b.swarm.best_loss)
    assert differs.sum() == 1
    j = int(np.argmax(differs))
    assert b.swarm.best_loss[j] > a.swarm.best_loss[j]  # kept although worse
    chex.assert_trees_all_equal(_one(b.swarm.best_position, j), _one(b.swarm.position, j))
    for i in set(range(S)) - {j}:
        chex.assert_trees_all_equal(_one(a.swarm.best_position, i), _one(b.swarm.best_position, i))


def test_persistent_optimizer_state_lives_in_the_client_and_carries_over(setup):
    clients, _ = setup
    fresh = FedDPPSO(MODEL, PLAIN, particles=S)
    kept = dataclasses.replace(fresh, optimizer_state="persistent")
    data, hyper, s_fresh = _client(fresh, clients)
    _, _, s_kept = _client(kept, clients)
    assert s_fresh.opt_state == ()
    assert int(optax.tree_utils.tree_get(s_kept.opt_state, "count")) == 0
    gbest = _one(s_fresh.swarm.position)
    a, _ = _train(fresh, s_fresh, data, hyper, gbest)
    b, _ = _train(kept, s_kept, data, hyper, gbest)
    # round 1: a fresh state and the initial persistent state are the same
    chex.assert_trees_all_close(a.swarm.best_position, b.swarm.best_position)
    steps = int(b.refine_steps)
    assert steps > 0 and int(optax.tree_utils.tree_get(b.opt_state, "count")) == steps
    a2, _ = _train(fresh, a, data, hyper, gbest, key=4)
    b2, _ = _train(kept, b, data, hyper, gbest, key=4)
    assert int(optax.tree_utils.tree_get(b2.opt_state, "count")) == 2 * steps
    chex.assert_trees_all_equal(_counted(a2), _counted(b2))  # nothing new accounted
    gap = jax.tree.map(lambda x, y: jnp.max(jnp.abs(x - y)), a2.swarm.position, b2.swarm.position)
    assert max(float(g) for g in jax.tree.leaves(gap)) > 0  # round 2 differs


def test_tensor_coefficients_one_pair_per_particle_and_tensor(setup):
    clients, _ = setup
    alg = FedDPPSO(MODEL, PLAIN, particles=S, tensor_coefficients=True)
    pso = swarm.PSOHyperParams(inertia=0.0, cognitive=0.0, social=1.0)
    data, hyper, state = _client(alg, clients, pso=pso)
    r1, r2 = alg.tensor_coeffs(state.swarm)
    for r, leaf in zip(jax.tree.leaves(r1), jax.tree.leaves(state.swarm.position), strict=True):
        chex.assert_shape(r, (S,) + (1,) * (leaf.ndim - 1))
    stacked = jnp.stack([r.reshape(S) for r in jax.tree.leaves(r2)], axis=1)  # (S, tensors)
    assert np.all((stacked >= 0) & (stacked < 1))
    assert len(np.unique(np.asarray(stacked))) == stacked.size  # per particle AND tensor
    gbest = _one(state.swarm.position, 1)
    new, _ = _train(alg, state, data, hyper, gbest)
    # v = r2 (g - x): the ratio is one number per (particle, tensor), r2 itself
    for v, x, g, r in zip(
        *(jax.tree.leaves(t) for t in (new.swarm.velocity, state.swarm.position, gbest, r2)),
        strict=True,
    ):
        diff = g[None] - x
        ok = jnp.abs(diff) > 1e-3
        ratio = jnp.where(ok, v / jnp.where(ok, diff, 1.0), r)
        np.testing.assert_allclose(ratio, jnp.broadcast_to(r, ratio.shape), rtol=1e-3, atol=1e-4)


def test_velocity_clamp_bounds_every_coordinate(setup):
    clients, _ = setup
    alg = FedDPPSO(MODEL, PLAIN, particles=S, tensor_coefficients=True)
    for clamp, within in ((0.1, True), (math.inf, False)):
        pso = swarm.PSOHyperParams(velocity_clamp=clamp)
        data, hyper, state = _client(alg, clients, pso=pso)
        new, _ = _train(alg, state, data, hyper, _one(state.swarm.position, 1))
        top = max(float(jnp.max(jnp.abs(v))) for v in jax.tree.leaves(new.swarm.velocity))
        assert (top <= 0.1 + 1e-6) == within


def test_coupled_l2_adds_the_decay_to_the_gradient_before_adam():
    params = {"w": jnp.asarray([2.0, -0.5, 0.0])}
    zero = jax.tree.map(jnp.zeros_like, params)

    def first_update(tx):
        return tx.update(zero, tx.init(params), params)[0]["w"]

    coupled = first_update(make_optimizer("adam", 0.1, weight_decay=0.01))
    decoupled = first_update(make_optimizer("adamw", 0.1, weight_decay=0.01))
    np.testing.assert_allclose(first_update(make_optimizer("adam", 0.1)), 0.0)
    # Adam normalises the decay gradient: the first step is -lr sign(w), whatever lambda
    np.testing.assert_allclose(coupled, [-0.1, 0.1, 0.0], atol=1e-6)
    np.testing.assert_allclose(decoupled, [-0.1 * 0.01 * 2.0, 0.1 * 0.01 * 0.5, 0.0], rtol=1e-6)


def test_pixel_public_scaling_uses_only_held_out_rows():
    ds = load_dataset("digits")
    out = scale_inputs(ds, "pixel_public", 200, seed=3)
    n = len(ds.y_train)
    chex.assert_shape(out.x_train, (n - 200, *ds.input_shape))
    chex.assert_shape(out.x_test, ds.x_test.shape)
    public = np.zeros(n, bool)
    public[np.random.default_rng(3).choice(n, 200, replace=False)] = True
    mean = ds.x_train[public].mean(axis=0)
    std = np.maximum(ds.x_train[public].std(axis=0), PIXEL_STD_FLOOR)
    np.testing.assert_allclose(out.x_train, (ds.x_train[~public] - mean) / std, atol=1e-5)
    np.testing.assert_array_equal(out.y_train, ds.y_train[~public])
    np.testing.assert_allclose(out.x_test, (ds.x_test - mean) / std, atol=1e-5)
    assert scale_inputs(ds, "none", 200) is ds
    with pytest.raises(ValueError, match="public_rows"):
        scale_inputs(ds, "pixel_public", n)
    with pytest.raises(ValueError, match="input_scaling"):
        scale_inputs(ds, "pixel", 10)


def test_the_authors_reading_runs_with_the_same_accounting(setup):
    """Every option on, with DP-Adam: one compiled run; the epsilon covers the same DP-Adam
    steps as before and nothing new is released; every round moves N scores and one model
    up, the model to every client down."""
    clients, test = setup
    reading = dataclasses.replace(READINGS["authors"], decay=1e-3)
    dp = RecordDP.for_sizes(clients.sizes, 32)
    alg = fed_dp_pso(MODEL, reading, batch_size=32, record_dp=dp, particles=S)
    spec = RunSpec(rounds=2, delta=1e-5, seeds=(0, 1))
    hyper = reading_hyper(reading)
    variants = Variants.grid(alg, clients, spec, epsilon_target=8.0, learning_rate=0.01, **hyper)
    res = simulate(alg, clients, test, variants)
    assert len(res.history) == 4 and res.history.test_accuracy.notna().all()
    assert res.privacy.not_covered == ("train.score: unprotected: exact statistic of private data",)
    per_round = np.ceil(np.asarray(clients.sizes) / 32)
    np.testing.assert_array_equal(res.privacy.steps[:, -1], np.broadcast_to(2 * per_round, (2, 2)))
    assert float(res.privacy.final_epsilon.max()) <= 8.0
    chex.assert_tree_all_finite(res.server.gbest)
    model = param_bytes(jax.eval_shape(MODEL.init, jax.random.key(0)))
    n = clients.num_clients
    assert (res.history.bytes_up == n * 4 + model).all()
    assert (res.history.bytes_down == n * model).all()


def test_bad_options_fail_naming_the_field(setup):
    clients, test = setup
    for field, value in (
        ("init", "random"),
        ("refine_update", "sometimes"),
        ("optimizer_state", "shared"),
        ("init_scale", 0.0),
    ):
        with pytest.raises(ValueError, match=field):
            FedDPPSO(MODEL, PLAIN, **{field: value}).client_data(clients, test)


@pytest.mark.parametrize(
    "bad",
    [
        ["--init", "random"],
        ["--init-scale", "0"],
        ["--velocity-clamp", "-1"],
        ["--decay", "-1"],
        ["--input-scaling", "pixel"],
        ["--reading", "notebooks"],
        ["--tensor-coefficients", "maybe"],
    ],
)
def test_bad_reading_flags_are_rejected_in_one_line(bad, capsys):
    with pytest.raises(SystemExit):
        experiment.main(["--quick", *bad])
    err = capsys.readouterr().err
    assert bad[0] in err and len(err.strip().splitlines()) == 1


def test_a_flag_overrides_its_reading():
    args = experiment.parse_args(["--reading", "authors", "--init", "independent"])
    reading = experiment.reading(args)
    assert reading == dataclasses.replace(READINGS["authors"], init="independent")
    assert reading.refine_update == "always" and reading.velocity_clamp == 0.1
    args = experiment.parse_args(["--tensor-coefficients", "yes", "--decay", "0"])
    assert experiment.reading(args) == dataclasses.replace(
        READINGS["paper"], tensor_coefficients=True, decay=0.0
    )
    default = experiment.profile(experiment.parse_args([]))
    assert default.reading == READINGS["paper"] and default.reading_name == "paper"
    alg = FedDPPSO(MODEL)  # the library's defaults are the same reading
    assert alg.refine_update == "always" and alg.training.optimizer == "adam"


@pytest.mark.parametrize("bad", [["--readings", "paper"], ["--rounds", "1"], ["--epsilons", "0"]])
def test_the_study_rejects_bad_flags_in_one_line(bad, capsys):
    with pytest.raises(SystemExit):
        fed_dp_pso_study.main(["--quick", *bad])
    err = capsys.readouterr().err
    assert bad[0] in err and len(err.strip().splitlines()) == 1


def test_the_study_never_reads_the_test_split():
    """The study's evaluation split is cut from the training split."""
    plan = dict(fed_dp_pso_study.PRESETS["quick"])
    ds, public = fed_dp_pso_study.splits("digits", plan, None)
    full = load_dataset("digits")
    assert len(ds.y_test) == plan["val_rows"] and public.sum() == plan["public_rows"]
    assert len(ds.y_train) + len(ds.y_test) == len(full.y_train)
    train_rows = {r.tobytes() for r in full.x_train}
    assert all(r.tobytes() in train_rows for r in ds.x_test)
