"""FedAvg, the centralised ceiling and byte accounting on the digits set."""

from __future__ import annotations

from functools import partial

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.fl import _runner, comm
from swarmjax.fl.centralized import CentralizedConfig, run_centralized
from swarmjax.fl.clients import stack_clients
from swarmjax.fl.data import load_dataset
from swarmjax.fl.fedavg import (
    FedAvgConfig,
    FedAvgHyper,
    fedavg_run,
    run_fedavg,
    weighted_average,
)
from swarmjax.fl.partition import iid_partition
from swarmjax.models import from_haiku, mlp, paper_mlp

ROUNDS = 12
MODEL = mlp((32,), 10, (8, 8, 1))


@pytest.fixture(scope="module")
def digits():
    data = load_dataset("digits")
    part = iid_partition(data.y_train, 5, seed=0)
    clients = stack_clients(data.x_train, data.y_train, part.indices)
    return data, clients, (data.x_test, data.y_test)


@pytest.fixture(scope="module")
def fed(digits):
    _, clients, test = digits
    config = FedAvgConfig(MODEL, local_epochs=1, batch_size=32)
    return run_fedavg(config, clients, test, rounds=ROUNDS, learning_rate=0.3, seeds=[0, 1])


def test_fedavg_on_iid_digits_approaches_the_centralised_model(digits, fed):
    data, _, test = digits
    central = run_centralized(
        CentralizedConfig(MODEL, batch_size=32),
        data.x_train,
        data.y_train,
        test,
        epochs=ROUNDS,
        learning_rate=0.3,
        seeds=[0, 1],
    )
    last = fed.history[fed.history["round"] == ROUNDS]
    ceiling = central.history[central.history["epoch"] == ROUNDS]
    fed_acc, central_acc = last["test_accuracy"].mean(), ceiling["test_accuracy"].mean()
    assert central_acc > 0.9
    assert fed_acc > central_acc - 0.05, (fed_acc, central_acc)
    first = fed.history[fed.history["round"] == 1]["test_accuracy"].mean()
    assert fed_acc > first + 0.1


def test_history_has_metrics_and_exact_bytes(fed, digits):
    _, clients, _ = digits
    hist = fed.history
    assert len(hist) == 2 * ROUNDS and set(hist["seed"]) == {0, 1}
    model_bytes = 4 * (64 * 32 + 32 + 32 * 10 + 10)
    assert (hist["bytes_up"] == 5 * model_bytes).all() and (
        hist["bytes_down"] == 5 * model_bytes
    ).all()
    assert hist["cum_bytes_up"].max() == ROUNDS * 5 * model_bytes
    assert np.isfinite(hist[["test_loss", "train_loss"]].to_numpy()).all()
    assert jax.tree.leaves(fed.state.params)[0].shape[0] == 2  # seed axis
    np.testing.assert_array_equal(fed.state.round, [ROUNDS, ROUNDS])
    del clients


def test_one_seed_alone_and_in_chunks_equals_it_inside_the_batch(fed, digits):
    _, clients, test = digits
    config = FedAvgConfig(MODEL, local_epochs=1, batch_size=32)
    alone = run_fedavg(
        config, clients, test, rounds=4, learning_rate=0.3, seeds=1, rounds_per_call=2
    )
    batched = fed.history[(fed.history["seed"] == 1) & (fed.history["round"] <= 4)]
    np.testing.assert_allclose(
        alone.history["test_accuracy"].to_numpy(), batched["test_accuracy"].to_numpy(), atol=1e-6
    )


def test_fedavg_run_vmaps_over_learning_rates_with_a_haiku_model(digits):
    """The pure run is vmappable over numeric hyper-parameters, and any (init, apply) pair
    works: here a Haiku MLP."""
    _, clients, test = digits

    def forward(x):
        return hk.nets.MLP([32, 10])(x.reshape(x.shape[0], -1))

    model = from_haiku(hk.without_apply_rng(hk.transform(forward)), (8, 8, 1), 10)
    config = FedAvgConfig(model, local_epochs=1, batch_size=64)
    run = jax.jit(
        jax.vmap(partial(fedavg_run, config=config, rounds=3), in_axes=(None, 0, None, None))
    )
    test = (jnp.asarray(test[0]), jnp.asarray(test[1]))
    hyper = FedAvgHyper(learning_rate=jnp.array([0.0, 0.5]))
    _, metrics = run(jax.random.key(0), hyper, clients, test)
    acc = np.asarray(metrics["test_accuracy"])
    assert acc.shape == (2, 3)
    assert acc[0, 0] == acc[0, 2]  # learning rate 0: the model never moves
    assert acc[1, 2] > 0.5 > acc[0, 2]  # chance is 0.1
    np.testing.assert_array_equal(metrics["client_steps"][0, 0], np.ceil(clients.sizes / 64))


def test_bad_model_fails_before_compiling(digits, monkeypatch):
    _, clients, test = digits

    def never(*args, **kwargs):
        raise AssertionError("compiled despite bad input")

    monkeypatch.setattr(_runner, "init_over_seeds", never)
    monkeypatch.setattr(_runner, "rounds_over_seeds", never)
    five = mlp((8,), 5, (8, 8, 1))
    with pytest.raises(ValueError, match="labels must be in"):
        run_fedavg(FedAvgConfig(five), clients, test, rounds=1)
    with pytest.raises(ValueError, match="9 classes"):
        run_fedavg(FedAvgConfig(MODEL), clients, test, rounds=1, num_classes=9)
    with pytest.raises(ValueError, match="cannot take inputs"):
        run_fedavg(FedAvgConfig(paper_mlp()), clients, test, rounds=1)
    with pytest.raises(ValueError, match="learning_rate"):
        run_fedavg(FedAvgConfig(MODEL), clients, test, rounds=1, learning_rate=-1.0)
    with pytest.raises(ValueError, match="rounds"):
        run_fedavg(FedAvgConfig(MODEL), clients, test, rounds=0)


def test_weighted_average_is_exact():
    params = {"w": jnp.array([[1.0, 2.0], [3.0, 6.0]]), "b": jnp.array([0.0, 4.0])}
    avg = weighted_average(params, jnp.array([1.0, 3.0]))
    np.testing.assert_allclose(avg["w"], [2.5, 5.0])
    np.testing.assert_allclose(avg["b"], 3.0)


def test_byte_counts_exact_for_the_paper_mlp():
    shapes = jax.eval_shape(paper_mlp().init, jax.random.key(0))
    size = 784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10  # 269,322 parameters
    assert comm.model_bytes(shapes) == 4 * size == 1_077_288
    avg = comm.fedavg_bytes(shapes, 5)
    assert (avg.up, avg.down) == (5 * 1_077_288, 5 * 1_077_288)
    pso = comm.pso_bytes(shapes, 5)
    assert (pso.up, pso.down) == (5 * 4 + 1_077_288, 5 * 1_077_288)
    assert comm.upload_saving(pso, avg) == pytest.approx(1 - (20 + 1_077_288) / 5_386_440)
    assert comm.pso_bytes(shapes, 5, loss_dtype="float64").up == 5 * 8 + 1_077_288
    assert avg.times(10).total == 20 * 5_386_440
    table = comm.per_round_table(pso, 3)
    np.testing.assert_array_equal(table["cum_bytes_up"], np.array([1, 2, 3]) * pso.up)
    with pytest.raises(ValueError, match="num_clients"):
        comm.fedavg_bytes(shapes, 0)
