"""The centralised ceiling: the same model trained on the union of all clients' data.

It reuses :func:`swarmjax.fl.local.local_train` on one "client" holding every training
example, one epoch per scanned step (optimiser state carried across epochs), and reports
the same metrics as FedAvg after every epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray, PyTree

from swarmjax._validation import check_int, check_positive
from swarmjax.fl._runner import history_frame, run_chunked, seed_keys
from swarmjax.fl.clients import ClientData, client, stack_clients
from swarmjax.fl.fedavg import RunResult, TestSet, check_federated_inputs
from swarmjax.fl.local import local_train
from swarmjax.models import Model, evaluate

__all__ = [
    "CentralizedConfig",
    "CentralizedHyper",
    "CentralizedState",
    "centralized_epoch",
    "centralized_run",
    "run_centralized",
]


@dataclass(frozen=True)
class CentralizedConfig:
    """Static settings: model, batch size, ``learning_rate -> optax`` optimiser, eval chunk."""

    model: Model
    batch_size: int = 32
    optimizer: Callable[[Any], optax.GradientTransformation] = optax.sgd
    eval_batch_size: int | None = None


@flax.struct.dataclass
class CentralizedHyper:
    """Numeric hyper-parameters (vmappable leaves)."""

    learning_rate: Float[Array, ""]


@flax.struct.dataclass
class CentralizedState:
    """Parameters, optimiser state and epochs done."""

    params: PyTree
    opt_state: PyTree
    epoch: Int[Array, ""]


def _init(
    key: PRNGKeyArray, hyper: CentralizedHyper, config: CentralizedConfig
) -> CentralizedState:
    params = config.model.init(key)
    opt_state = config.optimizer(hyper.learning_rate).init(params)
    return CentralizedState(params=params, opt_state=opt_state, epoch=jnp.zeros((), jnp.int32))


def centralized_epoch(
    state: CentralizedState,
    key: PRNGKeyArray,
    hyper: CentralizedHyper,
    data: ClientData,
    test: TestSet,
    *,
    config: CentralizedConfig,
) -> tuple[CentralizedState, dict[str, Array]]:
    """One epoch over all of ``data`` (a single unstacked ``ClientData``), then evaluate."""
    out = local_train(
        state.params,
        data,
        key,
        apply_fn=config.model.apply,
        optimizer=config.optimizer(hyper.learning_rate),
        epochs=1,
        batch_size=config.batch_size,
        opt_state=state.opt_state,
    )
    test_loss, test_acc = evaluate(config.model.apply, out.params, *test, config.eval_batch_size)
    metrics = {"test_loss": test_loss, "test_accuracy": test_acc, "train_loss": out.loss}
    return CentralizedState(
        params=out.params, opt_state=out.opt_state, epoch=state.epoch + 1
    ), metrics


def _epochs(
    state: CentralizedState,
    key: PRNGKeyArray,
    hyper: CentralizedHyper,
    data: ClientData,
    test: TestSet,
    *,
    config: CentralizedConfig,
    epochs: int,
) -> tuple[CentralizedState, dict[str, Array]]:
    def body(s: CentralizedState, _: None) -> tuple[CentralizedState, dict[str, Array]]:
        k = jax.random.fold_in(key, s.epoch)
        return centralized_epoch(s, k, hyper, data, test, config=config)

    return jax.lax.scan(body, state, None, length=epochs)


def centralized_run(
    key: PRNGKeyArray,
    hyper: CentralizedHyper,
    data: ClientData,
    test: TestSet,
    *,
    config: CentralizedConfig,
    epochs: int,
) -> tuple[CentralizedState, dict[str, Array]]:
    """A whole run from one key; pure, vmappable over keys and hypers."""
    init_key, loop_key = jax.random.split(key)
    state = _init(init_key, hyper, config)
    return _epochs(state, loop_key, hyper, data, test, config=config, epochs=epochs)


@partial(jax.jit, static_argnames=("config",))
def _init_over_seeds(
    keys: PRNGKeyArray, hyper: CentralizedHyper, config: CentralizedConfig
) -> CentralizedState:
    return jax.vmap(lambda k: _init(k, hyper, config))(keys)


@partial(jax.jit, static_argnames=("config", "epochs"))
def _epochs_over_seeds(
    states: CentralizedState,
    keys: PRNGKeyArray,
    hyper: CentralizedHyper,
    data: ClientData,
    test: TestSet,
    config: CentralizedConfig,
    epochs: int,
) -> tuple[CentralizedState, dict[str, Array]]:
    def one(s: CentralizedState, k: PRNGKeyArray) -> tuple[CentralizedState, dict[str, Array]]:
        return _epochs(s, k, hyper, data, test, config=config, epochs=epochs)

    return jax.vmap(one)(states, keys)


def run_centralized(
    config: CentralizedConfig,
    x: ArrayLike,
    y: ArrayLike,
    test: tuple[ArrayLike, ArrayLike],
    *,
    epochs: int,
    learning_rate: float = 0.1,
    seeds: int | Sequence[int] = 0,
    num_classes: int | None = None,
    epochs_per_call: int | None = None,
    progress: bool = False,
) -> RunResult:
    """Train on all of ``(x, y)`` for every seed at once; history per epoch.

    History columns: ``seed, epoch, test_loss, test_accuracy, train_loss``.
    """
    epochs = check_int("epochs", epochs, 1)
    check_int("batch_size", config.batch_size, 1)
    check_positive("learning_rate", learning_rate)
    data = stack_clients(x, y, [np.arange(np.shape(y)[0])])
    test = (jnp.asarray(test[0], jnp.float32), jnp.asarray(test[1], jnp.int32))
    check_federated_inputs(config.model, data, test, num_classes)
    data = client(data, 0)

    keys, seed_list = seed_keys(seeds)
    split = jax.vmap(jax.random.split)(keys)
    hyper = CentralizedHyper(learning_rate=jnp.asarray(learning_rate, jnp.float32))
    states = _init_over_seeds(split[:, 0], hyper, config)

    def chunk(s: CentralizedState, n: int) -> tuple[CentralizedState, dict[str, Array]]:
        return _epochs_over_seeds(s, split[:, 1], hyper, data, test, config, n)

    states, metrics = run_chunked(
        chunk, states, epochs, rounds_per_call=epochs_per_call, progress=progress, desc="central"
    )
    return RunResult(
        state=states, history=history_frame(seed_list, metrics, {}, "epoch"), seeds=seed_list
    )
