"""What a deployment runs: one :class:`Task` (an algorithm, its hyper-parameters, the data
each client holds, the public test set), built the same way in every process.

The ServerApp and every ClientApp build the task from the run configuration: its ``task``
entry names a factory ``"package.module:function"`` that takes the run configuration (a
dict) and returns a :class:`Task`. A process builds it once (cached) and reuses it for every
message; a SuperNode takes only its own partition (``client_data(partition_id)``), the
server only the public parts (shapes, test set).
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
from jaxtyping import Array, PRNGKeyArray, PyTree

from swarmjax.fl.protocol import Algorithm, client_init_key, server_init_key
from swarmjax.fl.runtime.simulator import Variants, num_clients, run_keys, simulate

__all__ = ["SERVER_KEYS", "Task", "load_task", "simulate_task", "stacked_task"]


@dataclass(frozen=True, eq=False)  # identity hash: a process builds its task once
class Task:
    """One federated run as a deployment executes it.

    Attributes:
        algorithm: the protocol algorithm (the same object the simulator runs).
        variants: ONE variant (``variants.size == 1``): the hyper pytree with a leading axis
            of 1 and its labels; the labels enter the run key exactly as in the simulator.
        num_clients: ``N``, the number of partitions (client slots).
        client_data: ``partition_id ->`` that one client's data (no client axis; usually a
            ``ClientData``); called only on the SuperNode that holds the partition.
        data_like: shapes and dtypes of one client's data (``jax.ShapeDtypeStruct`` leaves;
            public: the padded size is part of the configuration).
        test: the public ``(x, y)`` test set of ``algorithm.evaluate``.
        rounds: training rounds ``T``.
        seed: the run seed (``run_keys([seed], [labels])`` as in the simulator).
        delta: the delta of the privacy record.
        stacked: all clients' data stacked (the simulator's input), when the task was built
            from it (:func:`stacked_task`); a deployment never sends it anywhere.
    """

    algorithm: Algorithm
    variants: Variants
    num_clients: int
    client_data: Callable[[int], PyTree]
    data_like: PyTree
    test: tuple[Array, Array]
    rounds: int
    seed: int
    delta: float

    stacked: PyTree = None

    def __post_init__(self) -> None:
        if self.variants.size != 1:
            raise ValueError(f"variants must hold exactly 1 variant; got {self.variants.size}")

    @property
    def hyper(self) -> PyTree:
        """The variant's hyper pytree without the variant axis."""
        return jax.tree.map(lambda a: a[0], self.variants.hyper)

    @functools.cached_property
    def run_key(self) -> PRNGKeyArray:
        """The simulator's key of this (variant, seed) run."""
        labels = {k: v[0] for k, v in self.variants.labels.items()}
        return run_keys([self.seed], [labels], common_random_numbers=False)[0]

    @functools.cached_property
    def server_like(self) -> PyTree:
        """Shapes of the server state."""
        return jax.eval_shape(self.algorithm.server_init, server_init_key(self.run_key), self.hyper)

    @functools.cached_property
    def state_like(self) -> PyTree:
        """Shapes of one client's state."""
        return jax.eval_shape(
            self.algorithm.client_init,
            client_init_key(self.run_key, 0),
            self.data_like,
            self.hyper,
            jax.numpy.int32(0),
        )


def _freeze(config: Mapping[str, Any]) -> str:
    return json.dumps(dict(config), sort_keys=True, default=str)


@functools.cache
def _load(frozen: str) -> Task:
    config = json.loads(frozen)
    ref = config.get("task")
    if not isinstance(ref, str) or ref.count(":") != 1:
        raise ValueError(
            f"run config 'task' must name a factory as 'package.module:function'; got {ref!r}"
        )
    module, name = ref.split(":")
    factory = getattr(importlib.import_module(module), name)
    task = factory(config)
    if not isinstance(task, Task):
        raise TypeError(f"task factory {ref} returned {type(task).__name__}, not Task")
    return task


# run configuration keys that say how the ServerApp waits and writes, not what runs: runs
# that differ only in these share one Task (and its compiled functions)
SERVER_KEYS = ("join-timeout", "reply-timeout", "reject-nonfinite", "out-dir")


def load_task(run_config: Mapping[str, Any]) -> Task:
    """The :class:`Task` the run configuration names (built once per process; the
    :data:`SERVER_KEYS` do not enter it)."""
    return _load(_freeze({k: v for k, v in run_config.items() if k not in SERVER_KEYS}))


def stacked_task(
    algorithm: Algorithm,
    variants: Variants,
    clients: PyTree,
    test: tuple[Array, Array],
    *,
    rounds: int,
    seed: int,
    delta: float,
) -> Task:
    """A :class:`Task` over stacked clients (the simulator's input, any pytree with a leading
    client axis): client ``i`` holds slice ``i``."""

    def one(pid: int) -> PyTree:
        return jax.tree.map(lambda a: a[pid], clients)

    like = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), clients)
    n = num_clients(clients)
    return Task(algorithm, variants, n, one, like, test, rounds, seed, delta, clients)


def simulate_task(task: Task) -> Any:
    """The same run in the simulator (``swarmjax.fl.runtime.simulator.simulate`` on the
    task's stacked clients): the reference a deployment is compared with."""
    if task.stacked is None:
        raise ValueError("task.stacked is None: build the task with stacked_task to simulate it")
    return simulate(
        task.algorithm,
        task.stacked,
        task.test,
        variants=task.variants,
        seeds=task.seed,
        rounds=task.rounds,
        delta=task.delta,
    )
