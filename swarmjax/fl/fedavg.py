"""FedAvg (McMahan et al. 2017) as a pure round function, a scanned run and a runner.

Each round every client starts from the global model, trains ``local_epochs`` epochs
(:func:`swarmjax.fl.local.local_train`, all clients under one vmap) and the server
aggregates the client models with ``config.aggregate`` (default: average weighted by
``|D_i|``). All clients take part in every round (the seed-000 setting, N = 5).

Layers, from the inside out:

* :func:`fedavg_round` ``(state, key, hyper, clients, test, *, config) -> (state, metrics)``
  - one round; partially apply everything but ``state, key`` for a ``(state, key)`` step.
* :func:`fedavg_rounds` scans ``rounds`` rounds (round ``t`` uses ``fold_in(key, t)``).
* :func:`fedavg_run` ``(key, hyper, clients, test, *, config, rounds)``: init + rounds; pure,
  so it can be vmapped over seeds (keys) and numeric hyper-parameters.
* :func:`run_fedavg`: validates inputs, jits once, vmaps over seeds, adds exact byte
  counts and returns a :class:`RunResult` with a pandas history.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
import pandas as pd
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray, PyTree

from swarmjax.fl import comm
from swarmjax.fl._runner import (
    TestSet,
    check_federated_inputs,
    check_run_inputs,
    history_frame,
    run_from_key,
    run_over_seeds,
    scan_rounds,
)
from swarmjax.fl.clients import ClientData
from swarmjax.fl.local import GradFn, Sampler, local_train_clients
from swarmjax.models import Model, evaluate

__all__ = [
    "Aggregator",
    "FedAvgConfig",
    "FedAvgHyper",
    "FedAvgState",
    "RunResult",
    "check_federated_inputs",
    "fedavg_init",
    "fedavg_round",
    "fedavg_rounds",
    "fedavg_run",
    "run_fedavg",
    "weighted_average",
]

Aggregator = Callable[[PyTree, Float[Array, " clients"]], PyTree]


def weighted_average(client_params: PyTree, weights: Float[Array, " clients"]) -> PyTree:
    """Server rule of FedAvg: ``sum_i w_i theta_i / sum_i w_i`` leaf by leaf.

    ``client_params`` has a leading client axis; ``weights`` are e.g. ``|D_i|``.
    """
    w = weights.astype(jnp.float32) / jnp.sum(weights)
    return jax.tree.map(
        lambda leaf: jnp.tensordot(w, leaf, axes=1).astype(leaf.dtype), client_params
    )


@flax.struct.dataclass
class FedAvgState:
    """Global model and the number of rounds done (a pytree)."""

    params: PyTree
    round: Int[Array, ""]


@flax.struct.dataclass
class FedAvgHyper:
    """Numeric hyper-parameters (array leaves: vmappable). ``learning_rate`` feeds
    ``config.optimizer``."""

    learning_rate: Float[Array, ""]


@dataclass(frozen=True)
class FedAvgConfig:
    """Static (shape-determining) settings of FedAvg; hashable, used as a jit static arg.

    Attributes:
        model: the ``(init, apply)`` pair.
        local_epochs: E, local epochs per round.
        batch_size: B, local mini-batch size.
        optimizer: ``learning_rate -> optax.GradientTransformation`` (fresh state per round).
        aggregate: ``(client_params, weights) -> params``; weights are ``|D_i|``.
        grad_fn: local per-step gradient (default non-private, see ``local_train``).
        sampler: local batch sampler (default shuffled epochs).
        eval_batch_size: chunk size for test evaluation (None: one pass).
    """

    model: Model
    local_epochs: int = 1
    batch_size: int = 32
    optimizer: Callable[[Any], optax.GradientTransformation] = optax.sgd
    aggregate: Aggregator = weighted_average
    grad_fn: GradFn | None = None
    sampler: Sampler | None = None
    eval_batch_size: int | None = None


def fedavg_init(key: PRNGKeyArray, config: FedAvgConfig) -> FedAvgState:
    """Fresh global model ``config.model.init(key)`` at round 0."""
    return FedAvgState(params=config.model.init(key), round=jnp.zeros((), jnp.int32))


def fedavg_round(
    state: FedAvgState,
    key: PRNGKeyArray,
    hyper: FedAvgHyper,
    clients: ClientData,
    test: TestSet,
    *,
    config: FedAvgConfig,
) -> tuple[FedAvgState, dict[str, Array]]:
    """One FedAvg round. Metrics: ``test_loss`` (nats), ``test_accuracy``, ``train_loss``
    (mean local loss weighted by ``|D_i|``) and ``client_steps`` ``(clients,)``."""
    local = local_train_clients(
        state.params,
        clients,
        key,
        apply_fn=config.model.apply,
        optimizer=config.optimizer(hyper.learning_rate),
        epochs=config.local_epochs,
        batch_size=config.batch_size,
        grad_fn=config.grad_fn,
        sampler=config.sampler,
    )
    weights = clients.sizes.astype(jnp.float32)
    params = config.aggregate(local.params, weights)
    test_loss, test_acc = evaluate(config.model.apply, params, *test, config.eval_batch_size)
    metrics = {
        "test_loss": test_loss,
        "test_accuracy": test_acc,
        "train_loss": jnp.sum(weights * local.loss) / jnp.sum(weights),
        "client_steps": local.steps,
    }
    return FedAvgState(params=params, round=state.round + 1), metrics


def fedavg_rounds(
    state: FedAvgState,
    key: PRNGKeyArray,
    hyper: FedAvgHyper,
    clients: ClientData,
    test: TestSet,
    *,
    config: FedAvgConfig,
    rounds: int,
) -> tuple[FedAvgState, dict[str, Array]]:
    """Scan ``rounds`` rounds; round ``t`` (from ``state.round``) uses ``fold_in(key, t)``."""
    return scan_rounds(
        fedavg_round, state, key, (hyper, clients, test), config=config, rounds=rounds
    )


def fedavg_run(
    key: PRNGKeyArray,
    hyper: FedAvgHyper,
    clients: ClientData,
    test: TestSet,
    *,
    config: FedAvgConfig,
    rounds: int,
) -> tuple[FedAvgState, dict[str, Array]]:
    """A whole run from one key (init, then ``rounds`` rounds); vmap it over keys/hypers."""
    args = (hyper, clients, test)
    return run_from_key(fedavg_init, fedavg_round, key, (), args, config=config, rounds=rounds)


@dataclass(frozen=True)
class RunResult:
    """Output of a runner: final state (leading seed axis) and a long history table."""

    state: Any
    history: pd.DataFrame
    seeds: list[int]


def run_fedavg(
    config: FedAvgConfig,
    clients: ClientData,
    test: tuple[ArrayLike, ArrayLike],
    *,
    rounds: int,
    learning_rate: float = 0.1,
    seeds: int | Sequence[int] = 0,
    num_classes: int | None = None,
    rounds_per_call: int | None = None,
    progress: bool = False,
) -> RunResult:
    """Run FedAvg for every seed at once (vmap) and return the history.

    History columns: ``seed, round, test_loss, test_accuracy, train_loss, bytes_up,
    bytes_down, cum_bytes_up, cum_bytes_down`` (exact bytes, :mod:`swarmjax.fl.comm`).
    The state has a leading seed axis. ``rounds_per_call`` splits the scan into chunks
    (same result) so ``progress`` can show a bar.
    """
    rounds, test = check_run_inputs(
        config.model,
        clients,
        test,
        rounds=rounds,
        local_epochs=config.local_epochs,
        batch_size=config.batch_size,
        learning_rate=learning_rate,
        num_classes=num_classes,
    )
    hyper = FedAvgHyper(learning_rate=jnp.asarray(learning_rate, jnp.float32))
    states, metrics, seed_list = run_over_seeds(
        fedavg_init,
        fedavg_round,
        seeds,
        rounds,
        init_args=(),
        args=(hyper, clients, test),
        config=config,
        rounds_per_call=rounds_per_call,
        progress=progress,
        desc="FedAvg",
    )
    params_shape = jax.eval_shape(config.model.init, jax.random.key(0))
    cost = comm.fedavg_bytes(params_shape, clients.num_clients)
    history = history_frame(seed_list, metrics, comm.per_round_table(cost, rounds), "round")
    return RunResult(state=states, history=history, seeds=seed_list)
