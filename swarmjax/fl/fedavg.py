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
from functools import partial
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray, PyTree

from swarmjax._validation import check_int, check_positive
from swarmjax.fl import comm
from swarmjax.fl._runner import history_frame, run_chunked, seed_keys
from swarmjax.fl.clients import ClientData
from swarmjax.fl.local import GradFn, Sampler, local_train_clients
from swarmjax.models import Model, check_model, evaluate

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
TestSet = tuple[Array, Array]


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

    def body(s: FedAvgState, _: None) -> tuple[FedAvgState, dict[str, Array]]:
        return fedavg_round(
            s, jax.random.fold_in(key, s.round), hyper, clients, test, config=config
        )

    return jax.lax.scan(body, state, None, length=rounds)


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
    init_key, loop_key = jax.random.split(key)
    state = fedavg_init(init_key, config)
    return fedavg_rounds(state, loop_key, hyper, clients, test, config=config, rounds=rounds)


@partial(jax.jit, static_argnames=("config",))
def _init_over_seeds(keys: PRNGKeyArray, config: FedAvgConfig) -> FedAvgState:
    return jax.vmap(lambda k: fedavg_init(k, config))(keys)


@partial(jax.jit, static_argnames=("config", "rounds"))
def _rounds_over_seeds(
    states: FedAvgState,
    keys: PRNGKeyArray,
    hyper: FedAvgHyper,
    clients: ClientData,
    test: TestSet,
    config: FedAvgConfig,
    rounds: int,
) -> tuple[FedAvgState, dict[str, Array]]:
    def one(s: FedAvgState, k: PRNGKeyArray) -> tuple[FedAvgState, dict[str, Array]]:
        return fedavg_rounds(s, k, hyper, clients, test, config=config, rounds=rounds)

    return jax.vmap(one)(states, keys)


@dataclass(frozen=True)
class RunResult:
    """Output of a runner: final state (leading seed axis) and a long history table."""

    state: Any
    history: pd.DataFrame
    seeds: list[int]


def check_federated_inputs(
    model: Model,
    clients: ClientData,
    test: TestSet,
    num_classes: int | None = None,
) -> None:
    """Raise ``ValueError`` (before any compilation) on mismatched model and data.

    Checks the example shape of clients and test set against ``model.input_shape``, the
    model's output size against ``num_classes`` (when given), and every label against the
    model's output size.
    """
    example_shape = tuple(clients.x.shape[2:])
    if tuple(test[0].shape[1:]) != example_shape:
        raise ValueError(
            f"test examples have shape {tuple(test[0].shape[1:])}, clients {example_shape}"
        )
    check_model(model, model.num_classes if num_classes is None else num_classes, example_shape)
    labels = np.concatenate([np.asarray(clients.y)[np.asarray(clients.mask)], np.asarray(test[1])])
    if labels.min() < 0 or labels.max() >= model.num_classes:
        raise ValueError(
            f"labels must be in [0, {model.num_classes - 1}] for model {model.name!r} with "
            f"{model.num_classes} outputs; got [{labels.min()}, {labels.max()}]"
        )


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
    rounds = check_int("rounds", rounds, 1)
    check_int("local_epochs", config.local_epochs, 1)
    check_int("batch_size", config.batch_size, 1)
    check_positive("learning_rate", learning_rate)
    test = (jnp.asarray(test[0], jnp.float32), jnp.asarray(test[1], jnp.int32))
    check_federated_inputs(config.model, clients, test, num_classes)

    keys, seed_list = seed_keys(seeds)
    split = jax.vmap(jax.random.split)(keys)
    states = _init_over_seeds(split[:, 0], config)
    hyper = FedAvgHyper(learning_rate=jnp.asarray(learning_rate, jnp.float32))

    def chunk(s: FedAvgState, n: int) -> tuple[FedAvgState, dict[str, Array]]:
        return _rounds_over_seeds(s, split[:, 1], hyper, clients, test, config, n)

    states, metrics = run_chunked(
        chunk, states, rounds, rounds_per_call=rounds_per_call, progress=progress, desc="FedAvg"
    )
    params_shape = jax.eval_shape(config.model.init, jax.random.key(0))
    cost = comm.fedavg_bytes(params_shape, clients.num_clients)
    history = history_frame(seed_list, metrics, comm.per_round_table(cost, rounds), "round")
    return RunResult(state=states, history=history, seeds=seed_list)
