"""DP-FedAvg: clipping bounds, reduction to FedAvg, adaptive quantile, accounting, errors."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from swarmjax.fl.clients import stack_clients
from swarmjax.fl.data import load_dataset
from swarmjax.fl.dp_fedavg import (
    DPFedAvgConfig,
    adaptive_clip_update,
    clip_updates,
    dp_fedavg_hyper,
    dp_fedavg_init,
    dp_fedavg_round,
    effective_noise_multiplier,
    epsilon_per_round,
    global_norm,
    rounds_to_target,
    run_dp_fedavg,
    sum_noise_multiplier,
)
from swarmjax.fl.fedavg import FedAvgConfig, FedAvgHyper, FedAvgState, fedavg_round
from swarmjax.fl.partition import iid_partition
from swarmjax.models import mlp
from swarmjax.privacy import accounting

MODEL = mlp((16,), 10, (8, 8, 1))
NUM_CLIENTS, PER_CLIENT = 10, 140


@pytest.fixture(scope="module")
def digits():
    """10 equal clients of 140 digits each (equal sizes: FedAvg's weights are then uniform)."""
    data = load_dataset("digits")
    x, y = data.x_train[: NUM_CLIENTS * PER_CLIENT], data.y_train[: NUM_CLIENTS * PER_CLIENT]
    part = iid_partition(y, NUM_CLIENTS, seed=0)
    clients = stack_clients(x, y, part.indices)
    return clients, (jnp.asarray(data.x_test), jnp.asarray(data.y_test))


# Full-batch local steps (B = |D_i|): local training is deterministic GD, whatever the key.
CONFIG = DPFedAvgConfig(MODEL, local_epochs=2, batch_size=PER_CLIENT)


_dp_round = jax.jit(partial(dp_fedavg_round, config=CONFIG))  # one compilation for all tests
_dp_init = jax.jit(partial(dp_fedavg_init, config=CONFIG))


def _dp_rounds(params, hyper, clients, test, rounds):
    """``rounds`` rounds from ``params`` with a Python loop over the jitted round."""
    state = _dp_init(jax.random.key(0), hyper).replace(params=params)
    history = []
    for t in range(rounds):
        state, metrics = _dp_round(state, jax.random.key(t), hyper, clients, test)
        history.append(metrics)
    return state, jax.tree.map(lambda *xs: np.stack(xs), *history)


def _full_participation(**kw):
    args = dict(sample_rate=1.0, noise_multiplier=0.0, clipping="fixed", client_lr=0.5)
    return dp_fedavg_hyper(**(args | kw))


def _tree_dist(a, b) -> float:
    return float(global_norm(jax.tree.map(jnp.subtract, a, b)))


def test_clip_updates_bounds_every_client_and_keeps_small_ones():
    rng = np.random.default_rng(0)
    scales = np.array([0.01, 0.5, 3.0, 40.0, 7.0, 0.2], np.float32)
    deltas = {
        "a": rng.normal(size=(6, 5, 3)).astype(np.float32) * scales[:, None, None],
        "b": {"c": rng.normal(size=(6, 7)).astype(np.float32) * scales[:, None]},
    }
    mask = jnp.array([True, True, True, True, False, True])
    clip = 1.0
    clipped, norms = jax.jit(clip_updates)(deltas, clip, mask)
    per_client = jax.vmap(global_norm)(clipped)
    np.testing.assert_allclose(norms, jax.vmap(global_norm)(deltas), rtol=1e-6)
    assert np.all(np.asarray(per_client) <= clip * (1 + 1e-5))
    assert float(per_client[4]) == 0.0  # not sampled: contributes nothing
    small = np.asarray(norms <= clip) & np.asarray(mask)
    assert small.any() and (~small).any()
    for leaf, orig in zip(jax.tree.leaves(clipped), jax.tree.leaves(deltas), strict=True):
        np.testing.assert_allclose(leaf[small], orig[small], rtol=1e-6)  # unchanged below C
    big = np.asarray(norms > clip) & np.asarray(mask)
    np.testing.assert_allclose(np.asarray(per_client)[big], clip, rtol=1e-5)  # on the sphere


def test_one_round_moves_the_model_by_at_most_the_clip_norm(digits):
    clients, test = digits
    params = MODEL.init(jax.random.key(3))
    clip = 0.05
    state, m = _dp_rounds(params, _full_participation(clip=clip), clients, test, 1)
    # No noise, q = 1: w_1 - w_0 = (1/N) sum_k clip(Delta_k), a mean of vectors of norm <= C.
    assert _tree_dist(state.params, params) <= clip * (1 + 1e-5)
    assert float(m["fraction_clipped"][0]) == 1.0  # lr 0.5: every update exceeds 0.05


def test_no_noise_full_participation_equals_fedavg(digits):
    clients, test = digits
    params = MODEL.init(jax.random.key(4))
    rounds = 3
    state, dp_metrics = _dp_rounds(params, _full_participation(clip=1e6), clients, test, rounds)
    fed_round = jax.jit(partial(fedavg_round, config=FedAvgConfig(MODEL, 2, PER_CLIENT)))
    fed_state = FedAvgState(params=params, round=jnp.zeros((), jnp.int32))
    fed_hyper = FedAvgHyper(learning_rate=jnp.float32(0.5))
    fed_acc = []
    for t in range(rounds):
        fed_state, fed_metrics = fed_round(
            fed_state, jax.random.key(100 + t), fed_hyper, clients, test
        )
        fed_acc.append(fed_metrics["test_accuracy"])
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(fed_state.params), strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(dp_metrics["test_accuracy"], fed_acc, atol=1e-6)
    assert _tree_dist(state.params, params) > 0.1  # it did train
    assert np.all(np.asarray(dp_metrics["participants"]) == NUM_CLIENTS)


def test_noise_on_the_sum_has_std_sigma_delta_times_clip(digits):
    clients, test = digits
    params = MODEL.init(jax.random.key(5))
    clip, z, sigma_b = 0.3, 1.2, 1.0
    hyper = _full_participation(
        clip=clip,
        clipping="adaptive",
        noise_multiplier=z,
        count_noise=sigma_b,
        client_lr=1e-9,  # updates ~ 0: the model moves by the noise / (q N) only
    )
    state, _ = _dp_rounds(params, hyper, clients, test, 1)
    moved = np.concatenate(
        [
            np.ravel(a - b)
            for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params), strict=True)
        ]
    )
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


@pytest.mark.parametrize("gamma", [0.5, 0.8])
def test_adaptive_clipping_converges_to_the_target_quantile(gamma):
    m, s = 100, 1.0  # norms ~ lognormal(0, s): gamma-quantile exp(s Phi^-1(gamma))

    def step(clip, k):
        k_norm, k_count = jax.random.split(k)
        norms = jnp.exp(s * jax.random.normal(k_norm, (m,)))
        clip, _ = adaptive_clip_update(
            k_count,
            clip,
            norms,
            jnp.ones(m, bool),
            expected_clients=m,
            count_noise=m / 20,
            target_quantile=gamma,
            clip_lr=0.2,
        )
        return clip, clip

    keys = jax.random.split(jax.random.key(0), 400)
    _, path = jax.lax.scan(step, jnp.float32(0.01), keys)  # start 2 orders of magnitude off
    target = np.exp(s * stats.norm.ppf(gamma))
    assert abs(np.log(np.mean(path[-100:])) - np.log(target)) < 0.1
    assert float(path[20]) > 0.01  # it moved toward the target


def test_fixed_clipping_keeps_the_norm_and_skips_the_count():
    clip, below = adaptive_clip_update(
        jax.random.key(0),
        0.7,
        jnp.array([0.1, 5.0]),
        jnp.ones(2, bool),
        expected_clients=2.0,
        count_noise=0.0,
        target_quantile=0.5,
        clip_lr=0.0,
    )
    assert float(clip) == pytest.approx(0.7)
    assert float(below) == pytest.approx(0.5)
    hyper = dp_fedavg_hyper(sample_rate=0.1, noise_multiplier=1.0, clipping="fixed")
    assert float(hyper.clip_lr) == 0.0 and float(hyper.sum_noise) == 1.0


@pytest.fixture(scope="module")
def run(digits):
    clients, test = digits
    config = DPFedAvgConfig(MODEL, batch_size=20)
    return run_dp_fedavg(
        config,
        clients,
        test,
        rounds=12,
        sample_rate=0.5,
        noise_multiplier=0.8,
        clipping="adaptive",
        clip=0.2,
        client_lr=0.3,
        seeds=[0, 1],
    )


def test_epsilon_grows_with_rounds_as_the_accountant_says(run):
    spec = run.privacy
    eps = run.history[run.history["seed"] == 0]["epsilon"].to_numpy()
    assert np.all(np.diff(eps) > 0)
    for t in (1, 5, 12):
        expected = accounting.epsilon(spec.sample_rate, spec.noise_multiplier, t, spec.delta)
        assert eps[t - 1] == pytest.approx(expected, rel=1e-9)
    np.testing.assert_allclose(
        effective_noise_multiplier(spec.sum_noise, spec.count_noise), spec.noise_multiplier, 1e-5
    )
    np.testing.assert_allclose(epsilon_per_round(0.5, 0.8, 12, spec.delta), eps)


def test_run_history_reports_clip_participants_bytes_and_learns(run):
    h = run.history
    assert len(h) == 24 and set(h["seed"]) == {0, 1}
    assert 0.2 < h["participants"].mean() / NUM_CLIENTS < 0.8  # Poisson, q_c = 0.5
    first = h[h["round"] == 1]
    assert np.allclose(first["clip_norm"], 0.2)
    assert h["clip_norm"].nunique() > 2  # the norm adapts
    model_bytes = sum(leaf.size * 4 for leaf in jax.tree.leaves(MODEL.init(jax.random.key(0))))
    np.testing.assert_array_equal(h["bytes_down"], h["participants"] * model_bytes)
    np.testing.assert_array_equal(h["bytes_up"], h["participants"] * (model_bytes + 4))
    assert h["test_accuracy"].iloc[-1] > 0.3  # 10 classes: well above chance
    reached = rounds_to_target(h, 0.3)
    assert reached.index.tolist() == [0, 1] and reached.notna().any()
    assert rounds_to_target(h, 1.01).isna().all()


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"sample_rate": 0.0}, "sample_rate"),
        ({"sample_rate": 1.5}, "sample_rate"),
        ({"noise_multiplier": -0.1}, "noise_multiplier"),
        ({"clip": 0.0}, "clip"),
        ({"target_quantile": 0.0}, "target_quantile"),
        ({"target_quantile": 1.0}, "target_quantile"),
        ({"clip_lr": -1.0}, "clip_lr"),
        ({"count_noise": 0.4, "noise_multiplier": 1.0}, "count_noise"),
        ({"clipping": "median"}, "clipping"),
        ({"client_lr": 0.0}, "client_lr"),
    ],
)
def test_bad_hyper_parameters_raise_naming_the_parameter(kwargs, name):
    args = {"sample_rate": 0.1, "noise_multiplier": 1.0, "count_noise": 5.0} | kwargs
    with pytest.raises(ValueError, match=name):
        dp_fedavg_hyper(**args)


def test_runner_rejects_bad_input_before_compiling(digits):
    clients, test = digits
    kw = dict(rounds=2, sample_rate=0.5, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="delta"):
        run_dp_fedavg(CONFIG, clients, test, delta=1.0, **kw)
    with pytest.raises(ValueError, match="server_momentum"):
        run_dp_fedavg(DPFedAvgConfig(MODEL, server_momentum=1.0), clients, test, **kw)
    with pytest.raises(ValueError, match="rounds"):
        run_dp_fedavg(CONFIG, clients, test, **(kw | {"rounds": 0}))
