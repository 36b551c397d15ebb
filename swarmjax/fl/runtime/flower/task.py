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
import numpy as np
from jaxtyping import Array, PRNGKeyArray, PyTree

from swarmjax.fl.protocol import (
    Accounting,
    Algorithm,
    Variants,
    client_init_key,
    privacy_unit,
    row_shapes,
    run_keys,
    server_init_key,
    variant_identities,
)
from swarmjax.fl.runtime.simulator import num_clients, simulate
from swarmjax.privacy.secret import Secret

__all__ = [
    "SERVER_KEYS",
    "TEST_KEYS",
    "Task",
    "client_level",
    "load_task",
    "simulate_task",
    "stacked_task",
]


def _audits_in_clients(accounting: Accounting | None) -> bool:
    """Whether canaries ride in the clients' states (:meth:`Accounting.audited` scores them
    from states a deployment never gathers): a record-level accounting with an ``audit``,
    or any accounting of one's own that overrides ``audited``."""
    from swarmjax.fl.algorithms.common import RecordLevel

    if accounting is None:
        return False
    if isinstance(accounting, RecordLevel):
        return accounting.audit is not None
    return type(accounting).audited is not Accounting.audited


@dataclass(frozen=True, eq=False)  # identity hash: a process builds its task once
class Task:
    """One federated run as a deployment executes it.

    Attributes:
        algorithm: the protocol algorithm (the same object the simulator runs).
        variants: ONE variant (``variants.size == 1``) and ONE seed: the hyper pytree with a
            leading axis of 1, its labels and the run's
            :class:`~swarmjax.fl.protocol.RunSpec`; the algorithm, hyper values and labels
            make the run's release identity, which enters the run key exactly as in the
            simulator.
        num_clients: ``N``, the number of partitions (client slots).
        client_data: ``partition_id ->`` that one client's data (no client axis; a slice of
            ``algorithm.client_data(...)``); called only on the SuperNode that holds it.
        data_like: shapes and dtypes of one client's data (``jax.ShapeDtypeStruct`` leaves;
            public: the padded size is part of the configuration).
        test: the public ``(x, y)`` test set of ``algorithm.evaluate``.
        stacked: all clients' stacked ``ClientData`` (the simulator's input), when the task
            was built from it (:func:`stacked_task`); a deployment never sends it anywhere.
        secret: the run's supplied secret (reproducible mode: every process given the same
            one draws the simulator's numbers, and the guarantee holds only while it is
            kept), or ``None``: each process draws its own from operating-system entropy
            (the server's noise and cohorts from the ServerApp's, each client's draws from
            its SuperNode's, so no process can regenerate another's noise).
    """

    algorithm: Algorithm
    variants: Variants
    num_clients: int
    client_data: Callable[[int], PyTree]
    data_like: PyTree
    test: tuple[Array, Array]

    stacked: PyTree = None
    secret: Secret | None = None

    def __post_init__(self) -> None:
        if self.variants.size != 1:
            raise ValueError(f"variants must hold exactly 1 variant; got {self.variants.size}")
        if len(self.variants.spec.seeds) != 1:
            raise ValueError(f"a task runs one seed; got {self.variants.spec.seeds}")
        if _audits_in_clients(self.algorithm.accounting()):
            raise ValueError(
                f"audit: {type(self.algorithm).__name__}(audit=...) runs in the simulator only "
                "(its report is built by simulate's finish); deploy it with audit=None"
            )

    @property
    def rounds(self) -> int:
        """Training rounds ``T``."""
        return self.variants.spec.rounds

    @property
    def sizes(self) -> np.ndarray | None:
        """``(N,)`` the clients' row counts ``|D_i|`` (public under record-level DP, whose
        ``q_i = B / |D_i|`` the privacy record states and whose ``sigma_i`` the task's
        hyper-parameters were calibrated from), read from :attr:`stacked`; ``None`` for a
        task built without it."""
        sizes = getattr(self.stacked, "sizes", None)
        return None if sizes is None else np.asarray(sizes)

    @property
    def seed(self) -> int:
        """The run seed."""
        return self.variants.spec.seeds[0]

    @property
    def delta(self) -> float:
        """The delta of the privacy record."""
        return self.variants.spec.delta

    @property
    def hyper(self) -> PyTree:
        """The variant's hyper pytree without the variant axis."""
        return jax.tree.map(lambda a: a[0], self.variants.hyper)

    @functools.cached_property
    def run_key(self) -> PRNGKeyArray:
        """This process's key of the (variant, seed) run: the simulator's key under the
        task's secret (:func:`~swarmjax.fl.protocol.run_keys`), or under a secret this
        process draws once from operating-system entropy when the task has none."""
        secret = Secret.generate() if self.secret is None else self.secret
        identities = variant_identities(self.algorithm, self.variants)
        crn = self.variants.spec.common_random_numbers
        return run_keys(secret, [self.seed], identities, common_random_numbers=crn)[0]

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


def client_level(alg: Any) -> bool:
    """Whether ``alg`` is accounted at the client level: by the server, from its own state
    (the clients then report no steps with their replies)."""
    return privacy_unit(alg.accounting()) == "client"


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
SERVER_KEYS = ("join-timeout", "reply-timeout", "reject-nonfinite", "out-dir", "jax-cache-dir")


# run configuration keys for tests only (fault injection: which clients misbehave, not what
# runs; swarmjax.fl.runtime.flower.secagg.FAULT_KEY)
TEST_KEYS = ("secagg-fault-injection",)


def load_task(run_config: Mapping[str, Any]) -> Task:
    """The :class:`Task` the run configuration names (built once per process; the
    :data:`SERVER_KEYS` and :data:`TEST_KEYS` do not enter it)."""
    skip = SERVER_KEYS + TEST_KEYS
    return _load(_freeze({k: v for k, v in run_config.items() if k not in skip}))


def stacked_task(
    algorithm: Algorithm,
    variants: Variants,
    clients: PyTree,
    test: tuple[Array, Array],
    secret: Secret | None = None,
) -> Task:
    """A deployment's task from the simulator's inputs.

    Args:
        algorithm: the protocol algorithm.
        variants: ONE variant with ONE seed (its spec gives rounds, delta and seed).
        clients: stacked client data (usually ``ClientData``, a leading client axis).
        test: the public ``(x, y)`` test set.
        secret: the run's supplied secret (:attr:`Task.secret`), or ``None``.

    Returns:
        A :class:`Task` in which client ``i`` holds slice ``i`` of
        ``algorithm.client_data(clients)`` (and ``stacked`` keeps ``clients`` for
        :func:`simulate_task`).
    """
    data = algorithm.client_data(clients)

    def one(pid: int) -> PyTree:
        return jax.tree.map(lambda a: a[pid], data)

    like = row_shapes(data)
    return Task(algorithm, variants, num_clients(data), one, like, test, clients, secret)


def simulate_task(task: Task) -> Any:
    """The same run in the simulator (``swarmjax.fl.runtime.simulator.simulate`` on the
    task's stacked clients): the reference a deployment is compared with."""
    if task.stacked is None:
        raise ValueError("task.stacked is None: build the task with stacked_task to simulate it")
    return simulate(task.algorithm, task.stacked, task.test, task.variants, secret=task.secret)
