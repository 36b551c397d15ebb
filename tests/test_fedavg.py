"""FedAvg on the protocol simulator, the centralised ceiling and byte accounting on digits."""

from __future__ import annotations

import dataclasses
import math

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.fl.algorithms.common import weighted_average
from swarmjax.fl.algorithms.fedavg import FedAvg, FedAvgHyper
from swarmjax.fl.algorithms.local_only import LocalOnly, centralised_clients
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data import load_dataset
from swarmjax.fl.data.clients import stack_clients
from swarmjax.fl.data.partition import iid_partition
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import Execution, simulate
from swarmjax.fl.runtime import simulator as sim
from swarmjax.models import from_haiku, mlp, paper_mlp, param_bytes
from tests.reproducible import SECRET

ROUNDS = 12
MODEL = mlp((32,), 10, (8, 8, 1))
ALG = FedAvg(MODEL, LocalTraining(epochs=1, batch_size=32))


@pytest.fixture(scope="module")
def digits():
    data = load_dataset("digits")
    part = iid_partition(data.y_train, 5, seed=0)
    clients = stack_clients(data.x_train, data.y_train, part.indices)
    return data, clients, (data.x_test, data.y_test)


def _fedavg(clients, test, *, rounds=ROUNDS, seeds=(0, 1), common_random_numbers=False, **kw):
    """FedAvg's runs under the tests' supplied secret, so calls compare draw for draw."""
    kw.setdefault("secret", SECRET)
    spec = RunSpec(rounds, 1e-5, tuple(seeds), common_random_numbers=common_random_numbers)
    variants = Variants.grid(ALG, clients, spec, epsilon_target=[math.inf], learning_rate=[0.3])
    return simulate(ALG, clients, test, variants, **kw)


@pytest.fixture(scope="module")
def fed(digits):
    _, clients, test = digits
    return _fedavg(clients, test)


def test_fedavg_on_iid_digits_approaches_the_centralised_model(digits, fed):
    _, clients, test = digits
    union = centralised_clients(clients)
    central_alg = LocalOnly(MODEL, LocalTraining(batch_size=32))
    spec = RunSpec(ROUNDS, 1e-5, (0, 1))
    central = simulate(
        central_alg, union, test, Variants.grid(central_alg, union, spec, learning_rate=[0.3])
    )
    last = fed.history[fed.history["round"] == ROUNDS]
    ceiling = central.history[central.history["round"] == ROUNDS]
    fed_acc, central_acc = last["test_accuracy"].mean(), ceiling["test_accuracy"].mean()
    assert central_acc > 0.9
    assert fed_acc > central_acc - 0.05, (fed_acc, central_acc)
    first = fed.history[fed.history["round"] == 1]["test_accuracy"].mean()
    assert fed_acc > first + 0.1


def test_history_has_public_metrics_and_exact_bytes(fed):
    hist = fed.history
    assert len(hist) == 2 * ROUNDS and set(hist["seed"]) == {0, 1}
    model_bytes = 4 * (64 * 32 + 32 + 32 * 10 + 10)
    # down: the model to each of 5 clients; up: each client's model and its weight |D_i|
    assert (hist["bytes_down"] == 5 * model_bytes).all()
    assert (hist["bytes_up"] == 5 * (model_bytes + 4)).all()
    assert hist["cum_bytes_up"].max() == ROUNDS * 5 * (model_bytes + 4)
    assert np.isfinite(hist[["test_loss", "test_accuracy"]].to_numpy()).all()
    assert "train_loss" not in hist  # a statistic of private data: never released
    assert jax.tree.leaves(fed.server.params)[0].shape[0] == 2  # run axis


def test_one_seed_alone_and_in_chunks_equals_it_inside_the_batch(digits, fed):
    _, clients, test = digits
    alone = _fedavg(clients, test, rounds=4, seeds=[1], execution=Execution(rounds_per_call=2))
    batched = fed.history[(fed.history["seed"] == 1) & (fed.history["round"] <= 4)]
    np.testing.assert_allclose(
        alone.history["test_accuracy"].to_numpy(), batched["test_accuracy"].to_numpy(), atol=1e-6
    )


def test_runs_vmap_over_learning_rates_with_a_haiku_model(digits):
    """Numeric hyper-parameters are a vmapped axis of one compiled run, and any (init,
    apply) pair works: here a Haiku MLP."""
    _, clients, test = digits

    def forward(x):
        return hk.nets.MLP([32, 10])(x.reshape(x.shape[0], -1))

    model = from_haiku(hk.without_apply_rng(hk.transform(forward)), (8, 8, 1), 10)
    alg = FedAvg(model, LocalTraining(epochs=1, batch_size=64))
    n = clients.num_clients
    variants = Variants(  # learning rate 0 is not a valid setting: built by hand here
        hyper=FedAvgHyper(
            learning_rate=jnp.array([0.0, 0.5]),
            noise_multiplier=jnp.zeros((2, n)),
            server_lr=jnp.ones(2),
        ),
        labels={"learning_rate": [0.0, 0.5]},
        spec=RunSpec(3, 1e-5),
    )
    res = simulate(alg, clients, test, variants)
    acc = res.metrics["test_accuracy"]
    assert acc.shape == (2, 3)
    assert acc[0, 0] == acc[0, 2]  # learning rate 0: the model never moves
    assert acc[1, 2] > 0.5 > acc[0, 2]  # chance is 0.1


def test_bad_model_fails_before_compiling(digits, monkeypatch):
    _, clients, test = digits

    def never(*args, **kwargs):
        raise AssertionError("compiled despite bad input")

    monkeypatch.setattr(sim, "init_runs", never)
    monkeypatch.setattr(sim, "run_rounds", never)

    def run(alg, rounds=1, **kw):
        variants = Variants.grid(alg, clients, RunSpec(rounds, 1e-5), **kw)
        return simulate(alg, clients, test, variants)

    with pytest.raises(ValueError, match="labels must be in"):
        run(FedAvg(mlp((8,), 5, (8, 8, 1))))
    with pytest.raises(ValueError, match="cannot take inputs"):
        run(FedAvg(paper_mlp()))
    with pytest.raises(ValueError, match="learning_rate"):
        run(FedAvg(MODEL), learning_rate=-1.0)
    with pytest.raises(ValueError, match="rounds"):
        run(FedAvg(MODEL), rounds=0)


def test_weighted_average_is_exact():
    params = {"w": jnp.array([[1.0, 2.0], [3.0, 6.0]]), "b": jnp.array([0.0, 4.0])}
    avg = weighted_average(params, jnp.array([1.0, 3.0]))
    np.testing.assert_allclose(avg["w"], [2.5, 5.0])
    np.testing.assert_allclose(avg["b"], 3.0)


def test_the_history_counts_fedavgs_bytes_exactly(digits):
    """Per round every client downloads the model and uploads its model and its weight (one
    float32): the history's byte columns are these counts, exactly."""
    shapes = jax.eval_shape(paper_mlp().init, jax.random.key(0))
    size = 784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10  # 269,322 parameters
    assert param_bytes(shapes) == 4 * size == 1_077_288
    _, clients, test = digits
    spec = RunSpec(rounds=2, delta=1e-5)
    res = simulate(ALG, clients, test, Variants.grid(ALG, clients, spec, learning_rate=0.3))
    model = param_bytes(jax.eval_shape(MODEL.init, jax.random.key(0)))
    assert model == 4 * (64 * 32 + 32 + 32 * 10 + 10)
    n, h = clients.num_clients, res.history
    assert (h["bytes_down"] == n * model).all()
    assert (h["bytes_up"] == n * (model + 4)).all()
    np.testing.assert_array_equal(h["cum_bytes_up"], np.array([1, 2]) * n * (model + 4))


def test_a_cohort_round_trains_and_sends_only_the_cohort(digits):
    """``cohort=k``: k clients drawn uniformly without replacement per round (public), only
    they train and upload; the history's bytes are k messages each way."""
    _, clients, test = digits
    alg = FedAvg(MODEL, LocalTraining(batch_size=32), cohort=2)
    spec = RunSpec(4, 1e-5, (0,))
    diagnosed = Execution(diagnostics=True)
    res = simulate(alg, clients, test, Variants.grid(alg, clients, spec), execution=diagnosed)
    np.testing.assert_array_equal(res.private_diagnostics["selected"], 2)
    model_bytes = 4 * (64 * 32 + 32 + 32 * 10 + 10)
    assert (res.history["bytes_up"] == 2 * (model_bytes + 4)).all()
    assert (res.history["bytes_down"] == 2 * model_bytes).all()
    loss = np.asarray(res.private_diagnostics["loss"])[0]  # (rounds, N): last
    trained = np.diff(loss, axis=0, prepend=0.0) != 0  # a client's loss moves when it trains
    assert (trained.sum(axis=1) == 2).all() and trained.any(axis=0).sum() > 2  # cohorts vary
    with pytest.raises(ValueError, match="cohort"):
        Variants.grid(FedAvg(MODEL, cohort=6), clients, spec)


def test_server_optimisers_step_along_the_pseudo_gradient(digits, fed):
    """Server SGD at lr 1 is plain FedAvg (to float rounding); FedAdam and FedYogi learn."""
    _, clients, test = digits
    spec = RunSpec(ROUNDS, 1e-5, (0, 1))
    grid = {"epsilon_target": [math.inf], "learning_rate": [0.3]}
    sgd = FedAvg(MODEL, LocalTraining(epochs=1, batch_size=32), server_optimizer="sgd")
    # two algorithms are two releases with independent keys: pair them on purpose (one
    # supplied secret and common random numbers)
    res = simulate(
        sgd,
        clients,
        test,
        Variants.grid(sgd, clients, dataclasses.replace(spec, common_random_numbers=True), **grid),
        secret=SECRET,
    )
    plain = _fedavg(clients, test, common_random_numbers=True)
    np.testing.assert_allclose(
        res.history["test_accuracy"], plain.history["test_accuracy"], atol=0.02
    )
    for name in ("adam", "yogi"):
        alg = FedAvg(MODEL, LocalTraining(batch_size=32), server_optimizer=name)
        grid = Variants.grid(alg, clients, spec, server_lr=0.01)
        out = simulate(alg, clients, test, grid, secret=SECRET)  # deterministic, as before
        assert out.history["test_accuracy"].iloc[-1] > 0.5, name
        assert jax.tree.leaves(out.server.opt_state)  # the optimiser's moments are kept


def test_clients_in_blocks_give_the_vmapped_numbers(digits, fed):
    """``client_map=k`` (lax.map over blocks of k vmapped clients) computes what the vmap
    does, to float rounding; a block count below 1 is refused."""
    _, clients, test = digits
    blocks = _fedavg(clients, test, rounds=2, seeds=(1,), execution=Execution(client_map=2))
    batched = fed.history[(fed.history["seed"] == 1) & (fed.history["round"] <= 2)]
    np.testing.assert_allclose(
        blocks.history["test_loss"].to_numpy(), batched["test_loss"].to_numpy(), rtol=1e-5
    )
    with pytest.raises(ValueError, match="client_map"):
        _fedavg(clients, test, rounds=1, execution=Execution(client_map=0))
