"""The ClientApp: runs the algorithm's ``client`` functions for the partition its SuperNode
holds, keeping the client's state in the node's persistent context.

Messages it answers (the ServerApp sends them, :mod:`swarmjax.fl.runtime.flower.server`):

* ``query.hello``: reply ``{"partition-id": i, "worker": w}`` (read from the node
  configuration; ``w`` False: ``worker = false``, each message answered in its own
  process), after compiling the run's client functions into the persistent cache.
* ``train.secagg``: one stage of secure aggregation for an algorithm under a
  :class:`~swarmjax.privacy.distributed.DistributedDP` plan
  (:mod:`swarmjax.fl.runtime.flower.secagg`; its secrets stay in this process's memory).
* ``train.exchange``: content ``request`` (the Request pytree) and ``meta``
  (``round``, ``exchange``, ``setup``); runs ``exchange.client`` with the simulator's key
  ``client_key(run_key, round, exchange, i)`` and replies with ``reply`` (the Reply pytree)
  and, unless the algorithm accounts at the client level (then the server does),
  ``steps`` (its accounted step count, public).

The client's state (its swarm, optimiser state, accountant) is stored as an ``ArrayRecord``
in ``context.state`` and never leaves the node. :func:`answer` executes one message; this
module's ClientApp calls it in its own process (the loopback grid, Flower's simulation
runtime), a deployment's ClientApp (:mod:`swarmjax.fl.runtime.flower.relay`) hands the
message to the node's long-lived worker (:mod:`swarmjax.fl.runtime.flower.worker`), which
calls it there. Compiled functions are also kept in JAX's persistent compilation cache
(``jax-cache-dir`` in the node configuration, default ``~/.cache/swarmjax/jax``; ``""``:
leave JAX's configuration alone), so a restarted worker or a later run loads them.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.clientapp import ClientApp

from swarmjax.device import COMPILATION_CACHE, use_compilation_cache
from swarmjax.fl.protocol import client_init_key, client_key, steps_of
from swarmjax.fl.runtime.flower.records import from_record, to_record
from swarmjax.fl.runtime.flower.relay import STATE_KEY, make_relay_app
from swarmjax.fl.runtime.flower.task import (
    Task,
    client_level,
    load_task,
)

__all__ = [
    "STATE_KEY",
    "answer",
    "client_steps",
    "compute_reply",
    "make_client_app",
    "partition_id",
]


def partition_id(node: Context | Mapping[str, Any], num_clients: int) -> int:
    """This node's partition, ``node_config["partition-id"]`` in ``[0, num_clients)``
    (``node``: the node's context or its ``node_config``)."""
    raw = getattr(node, "node_config", node).get("partition-id")
    if raw is None:
        raise ValueError("node config 'partition-id' is missing (flower-supernode --node-config)")
    pid = int(raw)
    if not 0 <= pid < num_clients:
        raise ValueError(f"node config 'partition-id' must be in [0, {num_clients}); got {pid}")
    return pid


@functools.cache
def _jitted(task: Task, setup: bool, index: int) -> Callable:
    exchanges = task.algorithm.setup if setup else task.algorithm.exchanges
    return jax.jit(exchanges[index].client)


@functools.cache
def _jitted_init(task: Task) -> Callable:
    return jax.jit(task.algorithm.client_init)


@functools.cache
def _client_data(task: Task, pid: int) -> Any:
    return task.client_data(pid)


def client_steps(task: Task, state: Any) -> Any:
    """The client's record-level accounted steps, int32 ``()`` (its accounting's ``steps``
    with a zero server state: a record-level accounting reads the client's own count
    only)."""
    zero_server = jax.tree.map(lambda s: jax.numpy.zeros(s.shape, s.dtype), task.server_like)
    return steps_of(task.algorithm.accounting(), zero_server, state)


def _state(task: Task, stored: ArrayRecord | None, pid: int, data: Any) -> Any:
    if stored is not None:
        return from_record(stored, task.state_like)
    key = client_init_key(task.run_key, pid)
    return _jitted_init(task)(key, data, task.hyper, jax.numpy.int32(pid))


def compute_reply(task: Task, pid: int, stored: ArrayRecord | None, content: RecordDict) -> tuple:
    """``(reply, state)``: the exchange's Reply pytree that client ``pid`` computes for the
    message ``content`` (``request`` and ``meta``) with the simulator's key
    ``client_key(run_key, round, exchange, pid)``, and its new client state."""
    meta = content["meta"]
    setup, index, round_index = bool(meta["setup"]), int(meta["exchange"]), int(meta["round"])
    exchanges = task.algorithm.setup if setup else task.algorithm.exchanges
    if not 0 <= index < len(exchanges):
        raise ValueError(f"exchange index must be in [0, {len(exchanges)}); got {index}")
    data = _client_data(task, pid)
    state = _state(task, stored, pid, data)
    request_like = jax.eval_shape(exchanges[index].request, task.server_like)
    request = from_record(content["request"], request_like)
    key = client_key(task.run_key, round_index, index, pid)
    return _jitted(task, setup, index)(state, data, request, key, task.hyper)


def _run_exchange(
    task: Task, pid: int, stored: ArrayRecord | None, content: RecordDict
) -> tuple[RecordDict, ArrayRecord]:
    state, reply = compute_reply(task, pid, stored, content)
    out = RecordDict({"reply": to_record(reply)})
    if not client_level(task.algorithm):
        out["steps"] = to_record(client_steps(task, state))
    return out, to_record(state)


@contextlib.contextmanager
def _compiling(cache_dir: str | os.PathLike) -> Iterator[None]:
    """One node at a time compiles into a cache folder: nodes that share a machine (and
    its cache) compile the run's functions once, the others then load them (same programs:
    every partition is padded to the same shapes)."""
    if not str(cache_dir):
        yield
        return
    folder = Path(cache_dir).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".swarmjax-compile.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _warm_up(task: Task, pid: int) -> None:
    """Compile every client function of the run into the persistent cache (during the
    join phase, whose timeout is long, so that exchanges only load executables)."""
    data = _client_data(task, pid)
    key = client_key(task.run_key, 0, 0, pid)
    for setup, exchanges in ((True, task.algorithm.setup), (False, task.algorithm.exchanges)):
        for index, ex in enumerate(exchanges):
            request_like = jax.eval_shape(ex.request, task.server_like)
            fn = _jitted(task, setup, index)
            fn.lower(task.state_like, data, request_like, key, task.hyper).compile()
    _jitted_init(task).lower(
        client_init_key(task.run_key, pid), data, task.hyper, jax.numpy.int32(pid)
    ).compile()


def answer(
    kind: str,
    content: RecordDict,
    stored: ArrayRecord | None,
    run_config: Mapping[str, Any],
    node_config: Mapping[str, Any],
) -> tuple[RecordDict, ArrayRecord | None]:
    """Answer one message of the ServerApp for the node ``node_config`` describes: ``kind``
    is ``"hello"``, ``"exchange"`` or ``"secagg"``, ``content`` the message's content,
    ``stored`` the client's state as the node keeps it (``None`` before its first
    exchange). Returns the
    reply's content and the client's new state (``None`` for a hello).

    The one place a message is executed: the in-process ClientApp (:func:`make_client_app`,
    loopback tests, Flower's simulation runtime) and the node's worker
    (:mod:`swarmjax.fl.runtime.flower.worker`) both call it."""
    use_compilation_cache(node_config.get("jax-cache-dir", COMPILATION_CACHE))
    task = load_task(run_config)
    pid = partition_id(node_config, task.num_clients)
    if kind == "hello":
        with _compiling(node_config.get("jax-cache-dir", COMPILATION_CACHE)):
            _warm_up(task, pid)
        worker = bool(node_config.get("worker", True))  # False: a process per message
        return RecordDict({"hello": ConfigRecord({"partition-id": pid, "worker": worker})}), None
    if kind == "exchange":
        return _run_exchange(task, pid, stored, content)
    if kind == "secagg":  # a stage of secure aggregation (its round state stays in memory)
        from swarmjax.fl.runtime.flower.secagg import answer_stage

        return answer_stage(task, pid, stored, content, run_config)
    raise ValueError(f"unknown message kind {kind!r}")


def make_client_app() -> ClientApp:
    """A ClientApp that runs any :class:`~swarmjax.fl.runtime.flower.task.Task`'s algorithm
    in its own process (:func:`answer` per message; no worker)."""
    return make_relay_app(in_process=True)
