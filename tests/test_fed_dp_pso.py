"""Fed-DP-PSO, FedPSO and FedAvg + DP-SGD: server rule, privacy accounting, sanity, errors."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.fl import load_dataset, partition, stack_clients
from swarmjax.fl.clients import client
from swarmjax.fl.dp_local import poisson_sampler, sampler_capacity
from swarmjax.fl.fed_dp_pso import (
    COVERAGE_PAPER,
    COVERAGE_PRIVATE_SELECTION,
    FedDPPSOConfig,
    refine,
    run_fed_dp_pso,
    server_select,
)
from swarmjax.fl.local import local_train
from swarmjax.models import mlp
from swarmjax.privacy.accounting import epsilon


@pytest.fixture(scope="module")
def digits():
    ds = load_dataset("digits", standardize=True)
    part = partition(ds.y_train, 3, "iid", seed=0)
    clients = stack_clients(ds.x_train, ds.y_train, part.indices)
    return ds, clients, mlp((16,), 10, ds.input_shape)


@pytest.mark.parametrize("n", [1, 2, 3, 6])
def test_server_picks_uniformly_among_top_three(n: int) -> None:
    losses = jnp.asarray(np.random.default_rng(n).permutation(n).astype(np.float32))
    keys = jax.random.split(jax.random.key(0), 6000)
    picks = np.asarray(jax.vmap(lambda k: server_select(k, losses, 3))(keys))
    top = set(np.argsort(np.asarray(losses))[: min(3, n)].tolist())
    assert set(picks.tolist()) == top
    counts = np.bincount(picks, minlength=n)[sorted(top)]
    expected = len(keys) / len(top)
    # 4.5 standard deviations of a binomial count: fails for a biased rule.
    assert np.all(np.abs(counts - expected) < 4.5 * math.sqrt(expected)), counts


def test_epsilon_inf_is_plain_adam(digits) -> None:
    _, clients, model = digits
    cfg = FedDPPSOConfig(model=model, batch_size=32, dp=False)
    params = model.init(jax.random.key(1))
    one = client(clients, 0)
    key = jax.random.key(2)
    got = refine(params, one, key, jnp.float32(5.0), jnp.float32(0.01), cfg)
    import optax

    want = local_train(
        params,
        one,
        key,
        apply_fn=model.apply,
        optimizer=optax.adamw(0.01, weight_decay=cfg.weight_decay),
        epochs=1,
        batch_size=32,
    )
    for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(want.params), strict=True):
        np.testing.assert_array_equal(a, b)
    # The DP path with the same inputs clips and adds noise: it must differ.
    dp_cfg = FedDPPSOConfig(model=model, batch_size=32, dp=True, capacity=80)
    dp = refine(params, one, key, jnp.float32(5.0), jnp.float32(0.01), dp_cfg)
    assert not np.allclose(jax.tree.leaves(dp.params)[0], jax.tree.leaves(want.params)[0])


def test_poisson_sampler_rates_and_active_steps() -> None:
    mask = jnp.arange(100) < 40
    sample = poisson_sampler(10, sampler_capacity([40], 10))
    keys = jax.random.split(jax.random.key(0), 400)
    batches = jax.vmap(lambda k: sample(k, mask, jnp.int32(40)))(keys)
    assert batches.idx.shape[1] == 10  # ceil(max_n / B) static steps
    np.testing.assert_array_equal(np.asarray(batches.active[0]), np.arange(10) < 4)
    taken = np.asarray(batches.mask)
    assert not taken[:, 4:].any()  # inactive steps sample nothing
    assert np.all(np.asarray(batches.idx)[taken] < 40)  # padding never sampled
    mean = taken[:, :4].sum(-1).mean()
    assert abs(mean - 10.0) < 0.5  # E|batch| = q |D_i| = B


def test_dp_run_epsilon_within_target_and_recomputable(digits) -> None:
    ds, clients, model = digits
    cfg = FedDPPSOConfig(model=model, particles=2, batch_size=64)
    res = run_fed_dp_pso(
        cfg, clients, (ds.x_test, ds.y_test), rounds=2, target_epsilon=4.0, learning_rate=0.01
    )
    priv = res.privacy
    assert priv["covers"] == COVERAGE_PAPER
    final = priv["epsilon"][-1]
    assert np.all(final <= 4.0) and np.all(final > 3.5)
    for i, (q, sigma, per) in enumerate(
        zip(priv["q"], priv["sigma"], priv["steps_per_round"], strict=True)
    ):
        assert sigma > 0
        assert per == math.ceil(int(clients.sizes[i]) / 64)
        for t in range(2):
            want = epsilon(q, sigma, (t + 1) * per, priv["delta"])
            assert res.history[f"epsilon_client_{i}"].iloc[t] == pytest.approx(want)
    assert (res.history["epsilon_max"] <= 4.0).all()


def test_private_selection_adds_its_budget(digits) -> None:
    ds, clients, model = digits
    cfg = FedDPPSOConfig(model=model, particles=2, batch_size=64, private_selection=True)
    res = run_fed_dp_pso(
        cfg,
        clients,
        (ds.x_test, ds.y_test),
        rounds=1,
        selection_epsilon=0.5,
        target_epsilon=3.0,
    )
    assert res.privacy["covers"] == COVERAGE_PRIVATE_SELECTION
    assert res.privacy["selection_releases"] == 2 + 1 * 3
    assert res.privacy["epsilon"][-1].max() <= 3.5 + 1e-9
    assert res.privacy["epsilon"][-1].min() > 3.0


def test_short_run_on_digits_beats_chance(digits) -> None:
    ds, clients, model = digits
    cfg = FedDPPSOConfig(model=model, particles=3, batch_size=32)
    res = run_fed_dp_pso(cfg, clients, (ds.x_test, ds.y_test), rounds=3, learning_rate=0.01)
    acc = res.history["test_accuracy"].iloc[-1]
    assert acc > 0.6, acc  # chance is 0.1
    assert set(res.history["leader"]) <= {0, 1, 2}
    assert np.isinf(res.privacy["epsilon"]).all()


def test_bad_input_raises_before_compiling(digits) -> None:
    ds, clients, model = digits
    test = (ds.x_test, ds.y_test)
    with pytest.raises(ValueError, match="batch_size"):
        run_fed_dp_pso(FedDPPSOConfig(model=model, batch_size=10_000), clients, test, rounds=1)
    with pytest.raises(ValueError, match="particles"):
        run_fed_dp_pso(FedDPPSOConfig(model=model, particles=0), clients, test, rounds=1)
    with pytest.raises(ValueError, match="target_epsilon"):
        run_fed_dp_pso(FedDPPSOConfig(model=model), clients, test, rounds=1, target_epsilon=0)
    with pytest.raises(ValueError, match="classes"):
        run_fed_dp_pso(
            FedDPPSOConfig(model=mlp((8,), 4, ds.input_shape)),
            clients,
            test,
            rounds=1,
            num_classes=10,
        )
    with pytest.raises(ValueError, match="rounds"):
        run_fed_dp_pso(FedDPPSOConfig(model=model), clients, test, rounds=0)


def test_fedpso_and_fedavg_dp_run(digits) -> None:
    from swarmjax.fl.fedavg_dp import run_fedavg_dp
    from swarmjax.fl.fedpso import run_fedpso

    ds, clients, model = digits
    test = (ds.x_test, ds.y_test)
    pso = run_fedpso(model, clients, test, rounds=2, learning_rate=0.1)
    assert pso.history["test_accuracy"].iloc[-1] > 0.5
    dp = run_fedavg_dp(model, clients, test, rounds=2, target_epsilon=4.0, learning_rate=0.01)
    assert (dp.history["epsilon_max"] <= 4.0).all()
    q, sigma, per = dp.privacy["q"][0], dp.privacy["sigma"][0], dp.privacy["steps_per_round"][0]
    assert dp.history["epsilon_client_0"].iloc[1] == pytest.approx(epsilon(q, sigma, 2 * per, 1e-5))
