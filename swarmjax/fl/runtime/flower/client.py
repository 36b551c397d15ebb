"""The ClientApp: runs the algorithm's ``client`` functions for the partition its SuperNode
holds, keeping the client's state in the node's persistent context.

Messages it answers (the ServerApp sends them, :mod:`swarmjax.fl.runtime.flower.server`):

* ``query.hello``: reply ``{"partition-id": i}`` (read from the node configuration),
  after compiling the run's client functions into the persistent cache.
* ``train.exchange``: content ``request`` (the Request pytree) and ``meta``
  (``round``, ``exchange``, ``setup``); runs ``exchange.client`` with the simulator's key
  ``client_key(run_key, round, exchange, i)`` and replies with ``reply`` (the Reply pytree)
  and, unless the algorithm accounts at the client level (then the server does),
  ``spend`` (the client's :class:`~swarmjax.fl.protocol.Spend`: counts and rates, public).

The client's state (its swarm, optimiser state, accountant) is stored as an ``ArrayRecord``
in ``context.state`` and never leaves the node. Flower 1.41 starts one ClientApp process
per message, so the compiled functions are kept in JAX's persistent compilation cache
(``jax-cache-dir`` in the node configuration, default ``~/.cache/swarmjax/jax``): the
first message of a node compiles, later ones (and later runs) load the executable.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from swarmjax.fl.protocol import client_init_key, client_key
from swarmjax.fl.runtime.flower.records import from_record, to_record
from swarmjax.fl.runtime.flower.task import Task, load_task

__all__ = ["STATE_KEY", "client_spend", "make_client_app", "partition_id"]

STATE_KEY = "swarmjax.state"
DEFAULT_CACHE = Path.home() / ".cache" / "swarmjax" / "jax"


def use_compilation_cache(path: str | os.PathLike) -> None:
    """Keep every compiled function in ``path`` (JAX's persistent cache) from now on;
    ``""`` leaves the process's JAX configuration alone (an in-process loopback node)."""
    if not str(path):
        return
    Path(path).mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def partition_id(context: Context, num_clients: int) -> int:
    """This node's partition, ``node_config["partition-id"]`` in ``[0, num_clients)``."""
    raw = context.node_config.get("partition-id")
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


def client_spend(task: Task, state: Any) -> Any:
    """The client's record-level spend (``algorithm.spend`` with a zero server state: a
    record-level algorithm reads the client's own accountant only)."""
    zero_server = jax.tree.map(lambda s: jax.numpy.zeros(s.shape, s.dtype), task.server_like)
    return task.algorithm.spend(zero_server, state)


def _state(task: Task, context: Context, pid: int, data: Any) -> Any:
    if STATE_KEY in context.state:
        return from_record(context.state[STATE_KEY], task.state_like)
    key = client_init_key(task.run_key, pid)
    return _jitted_init(task)(key, data, task.hyper, jax.numpy.int32(pid))


def _exchange(msg: Message, context: Context) -> Message:
    use_compilation_cache(context.node_config.get("jax-cache-dir", DEFAULT_CACHE))
    task = load_task(context.run_config)
    pid = partition_id(context, task.num_clients)
    meta = msg.content["meta"]
    setup, index, round_index = bool(meta["setup"]), int(meta["exchange"]), int(meta["round"])
    exchanges = task.algorithm.setup if setup else task.algorithm.exchanges
    if not 0 <= index < len(exchanges):
        raise ValueError(f"exchange index must be in [0, {len(exchanges)}); got {index}")
    data = _client_data(task, pid)
    state = _state(task, context, pid, data)
    request_like = jax.eval_shape(exchanges[index].request, task.server_like)
    request = from_record(msg.content["request"], request_like)
    key = client_key(task.run_key, round_index, index, pid)
    state, reply = _jitted(task, setup, index)(state, data, request, key, task.hyper)
    context.state[STATE_KEY] = to_record(state)
    content = RecordDict({"reply": to_record(reply)})
    if task.algorithm.privacy_unit != "client":
        content["spend"] = to_record(client_spend(task, state))
    return Message(content, reply_to=msg)


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


def _hello(msg: Message, context: Context) -> Message:
    use_compilation_cache(context.node_config.get("jax-cache-dir", DEFAULT_CACHE))
    task = load_task(context.run_config)
    pid = partition_id(context, task.num_clients)
    _warm_up(task, pid)
    return Message(RecordDict({"hello": ConfigRecord({"partition-id": pid})}), reply_to=msg)


def make_client_app() -> ClientApp:
    """A ClientApp that runs any :class:`~swarmjax.fl.runtime.flower.task.Task`'s algorithm."""
    app = ClientApp()
    app.query("hello")(_hello)
    app.train("exchange")(_exchange)
    return app
