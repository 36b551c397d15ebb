"""The centralised ceiling: the same model trained on the union of all clients' data.

It reuses :func:`swarmjax.fl.local.local_train` on one "client" holding every training
example, one epoch per scanned step (optimiser state carried across epochs), and reports
the same metrics as FedAvg after every epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import flax.struct
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray, PyTree

from swarmjax._validation import check_int
from swarmjax.fl._runner import (
    TestSet,
    check_run_inputs,
    history_frame,
    run_from_key,
    run_over_seeds,
)
from swarmjax.fl.clients import ClientData, client, stack_clients
from swarmjax.fl.fedavg import RunResult
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
    args = (hyper, data, test)
    return run_from_key(
        _init, centralized_epoch, key, (hyper,), args, config=config, rounds=epochs, counter="epoch"
    )


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
    check_int("epochs", epochs, 1)
    data = stack_clients(x, y, [np.arange(np.shape(y)[0])])
    epochs, test = check_run_inputs(
        config.model,
        data,
        test,
        rounds=epochs,
        batch_size=config.batch_size,
        learning_rate=learning_rate,
        num_classes=num_classes,
        rounds_name="epochs",
    )
    data = client(data, 0)
    hyper = CentralizedHyper(learning_rate=jnp.asarray(learning_rate, jnp.float32))
    states, metrics, seed_list = run_over_seeds(
        _init,
        centralized_epoch,
        seeds,
        epochs,
        init_args=(hyper,),
        args=(hyper, data, test),
        config=config,
        counter="epoch",
        rounds_per_call=epochs_per_call,
        progress=progress,
        desc="central",
    )
    return RunResult(
        state=states, history=history_frame(seed_list, metrics, {}, "epoch"), seeds=seed_list
    )
