"""Flax NNX models (``models.from_nnx``): through the simulator (FedAvg), record-level DP and
the Flower runtime, equal to the same network built with linen; BatchNorm and Dropout in
eval mode; refusals in one line."""

from __future__ import annotations

from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jaxtyping import Array, PRNGKeyArray, PyTree

from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.client.training import LocalTraining, RecordDP
from swarmjax.fl.data import load_dataset, partition, stack_clients
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import simulate
from swarmjax.models import Model, check_model, from_flax, from_nnx, mlp
from tests.reproducible import SECRET, secret_file

SHAPE, CLASSES, HIDDEN = (8, 8, 1), 10, 8


class TinyMLP(nnx.Module):
    """64-8-10 with ReLU, optionally BatchNorm after the hidden layer and Dropout before the
    output: the linen ``mlp((8,), 10, (8, 8, 1))`` when neither is there."""

    def __init__(self, *, rngs: nnx.Rngs, dropout: float = 0.0, batch_norm: bool = False):
        self.dense0 = nnx.Linear(64, HIDDEN, rngs=rngs)
        self.norm = nnx.BatchNorm(HIDDEN, rngs=rngs) if batch_norm else None
        self.drop = nnx.Dropout(dropout, rngs=rngs)
        self.dense1 = nnx.Linear(HIDDEN, CLASSES, rngs=rngs)

    def __call__(self, x: Array) -> Array:
        h = nnx.relu(self.dense0(x.reshape(x.shape[0], -1)))
        if self.norm is not None:
            h = self.norm(h)
        return self.dense1(self.drop(h))


@dataclass(frozen=True, eq=False)
class _Fixed:
    """``key -> params``: the same parameters whatever the key."""

    params: PyTree

    def __call__(self, key: PRNGKeyArray) -> PyTree:
        del key
        return self.params


def as_linen(model: Model) -> Model:
    """The linen ``mlp`` starting from the NNX model's parameters (renamed Dense_0/1)."""
    p = model.init(jax.random.key(0))
    named = {"params": {"Dense_0": p["dense0"], "Dense_1": p["dense1"]}}
    linen = mlp((HIDDEN,), CLASSES, SHAPE)
    return Model(_Fixed(named), linen.apply, CLASSES, SHAPE, "linen")


@pytest.fixture(scope="module")
def digits():
    data = load_dataset("digits")
    n = 150
    part = partition(data.y_train[:n], 3, "iid", seed=0)
    clients = stack_clients(data.x_train[:n], data.y_train[:n], part.indices)
    return clients, (jnp.asarray(data.x_test), jnp.asarray(data.y_test))


def run(model: Model, clients, test, training: LocalTraining, epsilon: float | None = None):
    """Two FedAvg rounds; one supplied secret and common random numbers, so two models
    (two calls) draw the same batches and noise whatever their release identities."""
    alg = FedAvg(model, training)
    spec = RunSpec(rounds=2, delta=1e-5, common_random_numbers=True)
    variants = Variants.grid(alg, clients, spec, epsilon_target=epsilon, learning_rate=0.2)
    return simulate(alg, clients, test, variants, secret=SECRET)


def assert_same(a, b, atol: float) -> None:
    """Same global model (NNX names vs linen names) and the same history."""
    pa, pb = a.server.params, b.server.params["params"]
    for nnx_name, linen_name in (("dense0", "Dense_0"), ("dense1", "Dense_1")):
        for leaf in ("kernel", "bias"):
            np.testing.assert_allclose(pa[nnx_name][leaf], pb[linen_name][leaf], rtol=0, atol=atol)
    for col in ("test_loss", "test_accuracy", "epsilon_max", "bytes_up"):
        np.testing.assert_allclose(a.history[col], b.history[col], rtol=0, atol=atol)


def test_params_are_the_nnx_params_and_a_factory_initialises_per_key():
    model = from_nnx(lambda rngs: TinyMLP(rngs=rngs), SHAPE, CLASSES)
    check_model(model, CLASSES)
    p0, p1 = model.init(jax.random.key(0)), jax.jit(model.init)(jax.random.key(1))
    assert jax.tree.map(jnp.shape, p0) == {
        "dense0": {"bias": (HIDDEN,), "kernel": (64, HIDDEN)},
        "dense1": {"bias": (CLASSES,), "kernel": (HIDDEN, CLASSES)},
    }
    assert not np.allclose(p0["dense0"]["kernel"], p1["dense0"]["kernel"])
    expected = nnx.to_pure_dict(nnx.state(TinyMLP(rngs=nnx.Rngs(jax.random.key(1))), nnx.Param))
    jax.tree.map(np.testing.assert_array_equal, p1, expected)
    # an instance: its parameters, copied when wrapped, whatever the key
    module = TinyMLP(rngs=nnx.Rngs(3))
    fixed = from_nnx(module, SHAPE, CLASSES)
    module.dense0.kernel[...] = 0.0  # later changes to the instance do not leak in
    got = fixed.init(jax.random.key(7))
    assert np.abs(np.asarray(got["dense0"]["kernel"])).max() > 0
    x = jnp.linspace(0, 1, 2 * 64).reshape(2, *SHAPE)
    np.testing.assert_allclose(fixed.apply(got, x), TinyMLP(rngs=nnx.Rngs(3))(x), atol=1e-6)


def test_fedavg_with_an_nnx_model_equals_the_linen_network(digits):
    clients, test = digits
    model = from_nnx(TinyMLP(rngs=nnx.Rngs(0)), SHAPE, CLASSES)
    training = LocalTraining(batch_size=25)
    a, b = run(model, clients, test, training), run(as_linen(model), clients, test, training)
    assert_same(a, b, atol=1e-5)
    assert a.history["test_loss"].iloc[-1] < a.history["test_loss"].iloc[0]  # it learns


def test_record_level_dp_with_an_nnx_model_equals_the_linen_network(digits):
    """DP-SGD clips an NNX model's per-example gradients on the generic path, linen's on
    the fast path: the same noised updates to float rounding, the same privacy record."""
    clients, test = digits
    # dropout in eval mode is the identity: the same network as linen's
    module = TinyMLP(rngs=nnx.Rngs(1), dropout=0.5)
    model = from_nnx(module, SHAPE, CLASSES, name="nnx", eval_mode=True)
    training = LocalTraining(batch_size=25, record_dp=RecordDP(clip_norm=1.0))
    a = run(model, clients, test, training, epsilon=4.0)
    b = run(as_linen(model), clients, test, training, epsilon=4.0)
    assert_same(a, b, atol=1e-4)
    np.testing.assert_allclose(a.privacy.epsilon, b.privacy.epsilon)
    assert a.privacy.unit == "record" and np.all(a.privacy.final_epsilon <= 4.0 + 1e-6)


def nnx_task(config: dict):
    """Flower task factory (named in the run config as ``<this module>:nnx_task``): FedAvg
    with the NNX MLP on the digits clients the ready-made tasks build."""
    from swarmjax.fl.runtime.flower.task import stacked_task
    from swarmjax.fl.runtime.flower.tasks import digits_clients
    from swarmjax.privacy.secret import Secret

    clients, test = digits_clients(config)
    alg = FedAvg(from_nnx(TinyMLP, SHAPE, CLASSES), LocalTraining(batch_size=25))
    spec = RunSpec(rounds=int(config["rounds"]), delta=1e-5)
    grid = Variants.grid(alg, clients, spec, learning_rate=0.2)
    secret = Secret.from_file(config["secret-file"]) if config.get("secret-file") else None
    return stacked_task(alg, grid, clients, test, secret)


def test_an_nnx_model_on_the_flower_runtime_matches_the_simulator():
    pytest.importorskip("flwr", reason="the flower extra is not installed")
    from swarmjax.fl.runtime.flower.client import make_client_app
    from swarmjax.fl.runtime.flower.loopback import LoopbackGrid
    from swarmjax.fl.runtime.flower.server import ServerSettings, drive
    from swarmjax.fl.runtime.flower.task import load_task, simulate_task

    # every process and the simulator read one supplied secret: the same draws
    config = {
        "task": f"{__name__}:nnx_task",
        "rounds": 2,
        "train-size": 150,
        "secret-file": secret_file(),
    }
    grid = LoopbackGrid.with_partitions(make_client_app(), config, (0, 1, 2))
    task = load_task(config)
    flower = drive(grid, task, ServerSettings(join_timeout=1.0, reply_timeout=1.0))
    sim = simulate_task(task)
    got, want = flower.server.params, sim.server.params  # both: one run
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=0, atol=1e-6), got, want)
    for col in ("test_loss", "test_accuracy"):
        np.testing.assert_allclose(flower.history[col], sim.history[col], rtol=0, atol=1e-6)
    assert (flower.operator.messages["status"] == "ok").all()


@pytest.mark.parametrize(
    ("settings", "updated"),
    [({"dropout": 0.5}, "drop.rngs.count"), ({"batch_norm": True}, "norm.mean, norm.var")],
)
def test_dropout_and_batch_norm_in_training_mode_are_refused_in_one_line(settings, updated):
    with pytest.raises(ValueError, match="eval_mode=True") as err:
        from_nnx(lambda rngs: TinyMLP(rngs=rngs, **settings), SHAPE, CLASSES)
    message = str(err.value)
    assert "\n" not in message and f"updates {updated} " in message


def test_batch_norm_in_eval_mode_keeps_its_statistics_as_fixed_state():
    """BatchNorm's scale and bias are trained parameters; its running statistics are fixed
    state inside apply (never trained, averaged or sent); the forward pass is the module's
    own in eval mode, per example as DP-SGD calls it."""
    module = TinyMLP(rngs=nnx.Rngs(2), batch_norm=True, dropout=0.5)
    model = from_nnx(module, SHAPE, CLASSES, eval_mode=True)
    params = model.init(jax.random.key(0))
    assert set(params["norm"]) == {"scale", "bias"}
    assert set(model.apply.fixed["norm"]) == {"mean", "var"}
    x = jnp.linspace(-1, 1, 4 * 64).reshape(4, *SHAPE)
    reference = nnx.clone(module)
    reference.eval()
    np.testing.assert_allclose(jax.jit(model.apply)(params, x), reference(x), atol=1e-6)
    one = jax.vmap(lambda xi: model.apply(params, xi[None])[0])(x)  # per-example, as DP-SGD
    np.testing.assert_allclose(one, reference(x), atol=1e-6)
    grads = jax.grad(lambda p: jnp.sum(model.apply(p, x)))(params)
    assert jax.tree.structure(grads) == jax.tree.structure(params)


def test_from_flax_points_an_nnx_module_to_from_nnx_and_from_nnx_refuses_other_objects():
    with pytest.raises(TypeError, match=r"Flax NNX module: use swarmjax\.models\.from_nnx"):
        from_flax(TinyMLP(rngs=nnx.Rngs(0)), SHAPE, CLASSES)
    with pytest.raises(TypeError, match=r"nnx\.Module or a factory"):
        from_nnx(3, SHAPE, CLASSES)
    with pytest.raises(TypeError, match=r"must return an nnx\.Module"):
        from_nnx(lambda rngs: nn.Dense(3), SHAPE, CLASSES)
    with pytest.raises(ValueError, match="num_classes"):
        from_nnx(TinyMLP, SHAPE, 1)
