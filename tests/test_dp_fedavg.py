"""Client-level DP-FedAvg on the protocol: clipping bounds, reduction to FedAvg, the noise
on the sum, the adaptive quantile, accounting, errors.

Compiled programs are shared: every run below goes through the simulator with two seeds and
one round per compiled call, so each algorithm (fixed, adaptive, FedAvg) compiles once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from swarmjax.fl.algorithms.client_level_dp_fedavg import dp_fedavg, rounds_to_target
from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.client.training import LocalTraining, clip_update
from swarmjax.fl.data import load_dataset
from swarmjax.fl.data.clients import stack_clients
from swarmjax.fl.data.partition import iid_partition
from swarmjax.fl.protocol import RunSpec, Slots, Variants
from swarmjax.fl.runtime import Execution, simulate
from swarmjax.models import mlp, param_bytes
from swarmjax.privacy import accounting
from swarmjax.privacy.clipping import effective_noise_multiplier, sum_noise_multiplier
from swarmjax.privacy.user_level import ClippedUpdate
from tests.reproducible import SECRET

MODEL = mlp((16,), 10, (8, 8, 1))
NUM_CLIENTS, PER_CLIENT = 10, 140
DELTA = 1e-3
SEEDS = [0, 1]

# Full-batch local steps (B = |D_i|): local training is deterministic GD, whatever the key.
FULL_BATCH = LocalTraining(epochs=2, batch_size=PER_CLIENT)
FIXED = dp_fedavg(MODEL, training=FULL_BATCH, clipping="fixed")
ADAPTIVE = dp_fedavg(MODEL, training=FULL_BATCH, clipping="adaptive")


@pytest.fixture(scope="module")
def digits():
    """10 equal clients of 140 digits each (equal sizes: FedAvg's weights are then uniform)."""
    data = load_dataset("digits")
    x, y = data.x_train[: NUM_CLIENTS * PER_CLIENT], data.y_train[: NUM_CLIENTS * PER_CLIENT]
    part = iid_partition(y, NUM_CLIENTS, seed=0)
    clients = stack_clients(x, y, part.indices)
    return clients, (data.x_test, data.y_test)


def _run(alg, clients, test, rounds, **kw):
    """``rounds`` rounds of both seeds; one supplied secret and common random numbers, so
    equal seeds start from the same model whatever the algorithm and the call."""
    spec = RunSpec(rounds, DELTA, tuple(SEEDS), common_random_numbers=True)
    variants = Variants.grid(alg, clients, spec, **kw)
    return simulate(
        alg,
        clients,
        test,
        variants,
        secret=SECRET,
        execution=Execution(rounds_per_call=1),
    )


def _full_participation(**kw):
    return {"sample_rate": 1.0, "noise_multiplier": 0.0, "learning_rate": 0.5} | kw


def _initial_params(alg, clients, test):
    """The runs' initial global models (leading run axis): the algorithm's own init."""
    from swarmjax.fl.protocol import release_identity, run_keys, server_init_key

    # common random numbers: every variant's run key is the secret's key with the seed folded
    # in, whatever its identity
    keys = run_keys(SECRET, SEEDS, [release_identity(alg, None, {})], True)
    return jax.vmap(lambda k: alg.algorithm.model.init(server_init_key(k)))(keys)


def _global_norm(tree) -> np.ndarray:
    """L2 norm over all leaves, per run (leading axis)."""
    return np.sqrt(sum(np.sum(np.square(a), axis=tuple(range(1, a.ndim))) for a in tree))


def _moved(a, b) -> list[np.ndarray]:
    return [
        np.asarray(x) - np.asarray(y)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    ]


def test_clip_update_bounds_every_client_and_keeps_small_ones():
    rng = np.random.default_rng(0)
    scales = np.array([0.01, 0.5, 3.0, 40.0, 7.0, 0.2], np.float32)
    deltas = {
        "a": rng.normal(size=(6, 5, 3)).astype(np.float32) * scales[:, None, None],
        "b": {"c": rng.normal(size=(6, 7)).astype(np.float32) * scales[:, None]},
    }
    clip = 1.0
    clipped, norms, finite = jax.jit(jax.vmap(clip_update, in_axes=(0, None)))(deltas, clip)
    assert np.all(finite)
    per_client = _global_norm(jax.tree.leaves(clipped))
    np.testing.assert_allclose(norms, _global_norm(jax.tree.leaves(deltas)), rtol=1e-6)
    assert np.all(per_client <= clip * (1 + 1e-5))
    small = np.asarray(norms) <= clip
    assert small.any() and (~small).any()
    for leaf, orig in zip(jax.tree.leaves(clipped), jax.tree.leaves(deltas), strict=True):
        np.testing.assert_allclose(leaf[small], orig[small], rtol=1e-6)  # unchanged below C
    np.testing.assert_allclose(per_client[~small], clip, rtol=1e-5)  # on the sphere


@pytest.fixture(scope="module")
def fixed_runs(digits):
    clients, test = digits
    return {
        "tight": _run(FIXED, clients, test, 1, **_full_participation(initial_clip=0.05)),
        "loose": _run(FIXED, clients, test, 3, **_full_participation(initial_clip=1e6)),
    }


def test_one_round_moves_the_model_by_at_most_the_clip_norm(digits, fixed_runs):
    clients, test = digits
    start = _initial_params(FIXED, clients, test)
    res = fixed_runs["tight"]
    # No noise, q = 1: w_1 - w_0 = (1/N) sum_k clip(Delta_k), a mean of vectors of norm <= C.
    moved = _global_norm(_moved(res.server.params, start))
    assert np.all(moved <= 0.05 * (1 + 1e-5)) and np.all(moved > 0)
    np.testing.assert_allclose(res.history["clip_norm"], 0.05)  # fixed: C never moves
    assert "noisy_unclipped_fraction" not in res.history  # fixed: no count is made


def test_no_noise_full_participation_equals_fedavg(digits, fixed_runs):
    clients, test = digits
    dp = fixed_runs["loose"]
    fed = _run(FedAvg(MODEL, FULL_BATCH), clients, test, 3, learning_rate=0.5)
    for a, b in zip(
        jax.tree.leaves(dp.server.params), jax.tree.leaves(fed.server.params), strict=True
    ):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(dp.history["test_accuracy"], fed.history["test_accuracy"], atol=1e-6)
    start = _initial_params(FIXED, clients, test)
    assert np.all(_global_norm(_moved(dp.server.params, start)) > 0.1)  # it did train
    # q = 1: every client is selected every round (realised counts: diagnostics only)
    np.testing.assert_array_equal(dp.history["bytes_down"] / dp.history["bytes_down"][0], 1)


def test_noise_on_the_sum_has_std_sigma_delta_times_clip(digits):
    clients, test = digits
    clip, z, sigma_b = 0.3, 1.2, 1.0
    kw = _full_participation(initial_clip=clip, noise_multiplier=z, count_noise=sigma_b)
    res = _run(ADAPTIVE, clients, test, 1, **(kw | {"learning_rate": 1e-9}))
    # updates ~ 0: the model moves by the noise / (q N) only
    start = _initial_params(ADAPTIVE, clients, test)
    moved = np.concatenate([d[0].ravel() for d in _moved(res.server.params, start)])
    expected_std = float(sum_noise_multiplier(z, sigma_b)) * clip / NUM_CLIENTS
    assert float(sum_noise_multiplier(z, sigma_b)) > z  # the count query costs sum noise
    assert moved.size > 1000
    assert abs(moved.std() / expected_std - 1) < 0.1
    assert abs(moved.mean()) < 4 * expected_std / np.sqrt(moved.size)


def test_noise_multiplier_algebra_round_trips():
    z, sigma_b = np.array([0.5, 1.0, 2.0]), np.array([5.0, 0.6, 3.0])
    s = sum_noise_multiplier(z, sigma_b)
    np.testing.assert_allclose(effective_noise_multiplier(s, sigma_b), z, rtol=1e-5)
    assert float(sum_noise_multiplier(0.0, 1.0)) == 0.0


TINY = mlp((2,), 2, (1,))  # the quantile test's model: its update is zero


@pytest.mark.parametrize("gamma", [0.5, 0.8])
def test_adaptive_clipping_converges_to_the_target_quantile(gamma):
    """The server's clip norm, fed unclipped bits of lognormal norms, settles at the
    gamma-quantile ``exp(s Phi^-1(gamma))`` through the noised count."""
    m, s = 100, 1.0
    alg = dp_fedavg(TINY, clipping="adaptive")
    fake = stack_clients(np.zeros((m, 1), np.float32), np.zeros(m, int), np.arange(m)[:, None])
    hyper = jax.tree.map(
        lambda a: a[0],
        Variants.grid(
            alg,
            fake,
            RunSpec(1, DELTA),
            sample_rate=1.0,
            noise_multiplier=0.0,
            initial_clip=0.01,  # start 2 orders of magnitude off
            target_quantile=gamma,
            clip_lr=0.2,
            count_noise=m / 20,
        ).hyper,
    )
    zeros = jax.tree.map(lambda a: jnp.zeros((m, *a.shape)), TINY.init(jax.random.key(0)))
    mask = jnp.ones(m, bool)

    def step(server, k):
        k_norm, k_agg = jax.random.split(k)
        norms = jnp.exp(s * jax.random.normal(k_norm, (m,)))
        bits = (norms <= server.plan.clip).astype(jnp.float32)
        server = alg.aggregate(
            server, ClippedUpdate(zeros, bits), Slots.everyone(mask), k_agg, hyper
        )
        return server, server.plan.clip

    server = alg.server_init(jax.random.key(1), hyper)
    keys = jax.random.split(jax.random.key(0), 400)
    _, path = jax.jit(lambda s0: jax.lax.scan(step, s0, keys))(server)
    target = np.exp(s * stats.norm.ppf(gamma))
    assert abs(np.log(np.mean(path[-100:])) - np.log(target)) < 0.1
    assert float(path[20]) > 0.01  # it moved toward the target


def test_fixed_clipping_keeps_the_norm_and_makes_no_count(digits):
    clients, _ = digits
    hyper = jax.tree.map(
        lambda a: a[0],
        Variants.grid(FIXED, clients, RunSpec(1, DELTA), sample_rate=0.1, initial_clip=0.7).hyper,
    )
    assert float(hyper.plan.clip_lr) == 0.0 and float(hyper.plan.count_noise) == 0.0
    server = FIXED.server_init(jax.random.key(0), hyper)
    zeros = jax.tree.map(lambda a: jnp.zeros((NUM_CLIENTS, *a.shape)), server.params)
    out = FIXED.aggregate(
        server,
        ClippedUpdate(zeros),
        Slots.everyone(jnp.ones(NUM_CLIENTS, bool)),
        jax.random.key(1),
        hyper,
    )
    assert float(out.plan.clip) == pytest.approx(0.7)
    assert np.isnan(float(out.plan.noisy_unclipped_fraction))  # fixed: nothing counted
    assert "unclipped" not in FIXED.exchanges[0].protection  # and no bit is sent


@pytest.fixture(scope="module")
def run(digits):
    clients, test = digits
    kw = dict(sample_rate=0.5, noise_multiplier=0.8, initial_clip=0.2, learning_rate=0.3)
    return _run(ADAPTIVE, clients, test, 12, **kw)


def test_epsilon_grows_with_rounds_as_the_accountant_says(run):
    rec = run.privacy
    assert rec.unit == "client" and rec.end_to_end
    eps = rec.epsilon[0, :, 0]  # run 0, every round, client 0 (all clients spend alike)
    assert np.all(np.diff(eps) > 0)
    np.testing.assert_array_equal(rec.epsilon, rec.epsilon[:, :, :1].repeat(NUM_CLIENTS, 2))
    for t in (1, 5, 12):
        expected = accounting.epsilon(0.5, float(np.float32(0.8)), t, DELTA)
        assert eps[t - 1] == pytest.approx(expected, rel=1e-6)
    np.testing.assert_allclose(rec.noise_multiplier, np.float32(0.8))
    np.testing.assert_allclose(run.history["epsilon_max"], np.tile(eps, 2))


def test_run_history_reports_clip_bytes_and_learns(run):
    h = run.history
    assert len(h) == 24 and set(h["seed"]) == set(SEEDS)
    assert h["clip_norm"].nunique() > 2  # the norm adapts
    assert h["noisy_unclipped_fraction"].notna().all()  # the noised count is released
    model_bytes = param_bytes(jax.eval_shape(MODEL.init, jax.random.key(0)))
    expected = 0.5 * NUM_CLIENTS  # released bytes use the expected participants
    np.testing.assert_allclose(h["bytes_down"], expected * (model_bytes + 4))  # model + C_t
    np.testing.assert_allclose(h["bytes_up"], expected * (model_bytes + 4))  # update + bit
    assert "participants" not in h
    selected = run.private_diagnostics or {}
    assert selected == {}  # realised participants are private (diagnostics only on request)
    assert h["test_accuracy"].iloc[-1] > 0.3  # 10 classes: well above chance
    reached = rounds_to_target(h, 0.3)
    assert len(reached) == 2 and reached.notna().any()
    assert rounds_to_target(h, 1.01).isna().all()


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"sample_rate": 0.0}, "sample_rate"),
        ({"sample_rate": 1.5}, "sample_rate"),
        ({"noise_multiplier": -0.1}, "noise_multiplier"),
        ({"initial_clip": 0.0}, "clip"),
        ({"target_quantile": 0.0}, "target_quantile"),
        ({"target_quantile": 1.0}, "target_quantile"),
        ({"clip_lr": -1.0}, "clip_lr"),
        ({"count_noise": 0.4, "noise_multiplier": 1.0}, "count_noise"),
        ({"learning_rate": 0.0}, "learning_rate"),
    ],
)
def test_bad_hyper_parameters_raise_naming_the_parameter(digits, kwargs, name):
    clients, _ = digits
    args = {"sample_rate": 0.1, "noise_multiplier": 1.0, "count_noise": 5.0} | kwargs
    with pytest.raises(ValueError, match=name):
        Variants.grid(ADAPTIVE, clients, RunSpec(1, DELTA), **args)


def test_bad_settings_raise_before_compiling(digits):
    clients, test = digits
    kw = dict(sample_rate=0.5, noise_multiplier=1.0)
    spec = RunSpec(2, DELTA)
    with pytest.raises(ValueError, match="clipping"):
        Variants.grid(dp_fedavg(MODEL, clipping="median"), clients, spec, **kw)
    with pytest.raises(ValueError, match="server_momentum"):
        Variants.grid(dp_fedavg(MODEL, server_momentum=1.0), clients, spec, **kw)
    with pytest.raises(ValueError, match="delta"):
        RunSpec(2, 1.0)
    with pytest.raises(ValueError, match="rounds"):
        RunSpec(0, DELTA)
    variants = Variants.grid(ADAPTIVE, clients, spec, **kw)
    bad_test = (test[0][:, :4], test[1])
    with pytest.raises(ValueError, match="test examples have shape"):
        simulate(ADAPTIVE, clients, bad_test, variants)


def test_a_bfloat16_update_is_clipped_in_float32_and_stays_within_the_bound():
    """Scaling a bfloat16 update and rounding it back to bfloat16 can leave its norm above
    C; the clipped update is float32, within C to float32 rounding."""
    rng = np.random.default_rng(3)
    update = {"w": jnp.asarray(rng.normal(size=(64, 33)) * 7.0, jnp.bfloat16)}
    clipped, norm, finite = clip_update(update, 0.37)
    assert finite and float(norm) > 0.37
    assert clipped["w"].dtype == jnp.float32
    total = float(jnp.sqrt(jnp.sum(jnp.square(clipped["w"]))))
    assert total <= 0.37 * (1 + 1e-6)
