"""The deployment's ClientApp: a relay that imports almost nothing (no JAX, no swarmjax
algorithm code) and hands each message to its SuperNode's worker.

Flower (1.21 to at least 1.42) starts a fresh ``flwr-clientapp`` process for every message.
A ClientApp that imported JAX and swarmjax, built the task and loaded its executables
would pay that start-up on every message; this one forwards the message instead, over a
Unix domain socket in a per-node folder (mode 0700), to a worker process
(:mod:`swarmjax.fl.runtime.flower.worker`) that lives as long as its SuperNode and keeps
the task, the partition and the compiled client functions in memory.

What crosses the socket: the message content (the Request's arrays and the exchange's
``meta``), the run and node configuration, and the client's state as the node stores it
in ``context.state``; back: the reply content (Reply, step count) and the new state, which the
relay stores in ``context.state`` again. The worker keeps no state of its own that a
restart could lose, and nothing but the reply leaves the node. The worker is started on
first use (detached, in its own session) and restarted transparently if it died; it exits
when the process that started this relay (the node's SuperExec) is gone, or after
``worker-idle-timeout`` seconds without a message.

Node configuration keys: ``worker-dir`` (the folder of the socket, the worker's pid file
and log; default ``<tmp>/swarmjax-flower-<uid>/node-<node id>``), ``worker`` (``false``:
run the algorithm in the ClientApp's own process, as Flower's simulation runtime does;
a secure-aggregation run refuses such a node: ``secagg.check_worker``),
``worker-idle-timeout`` (seconds, default 1800).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

__all__ = [
    "STATE_KEY",
    "WorkerError",
    "ask_worker",
    "make_relay_app",
    "pack",
    "pack_message",
    "receive",
    "send",
    "start_worker",
    "unpack",
    "unpack_message",
    "worker_dir",
]

STATE_KEY = "swarmjax.state"  # = swarmjax.fl.runtime.flower.client.STATE_KEY
SOCKET, PID_FILE, LOG_FILE = "worker.sock", "worker.pid", "worker.log"
LOCK_FILE, ALIVE_FILE = "lock", "worker.lock"  # starters' lock; held by the live worker
START_TIMEOUT = 300.0  # seconds for a fresh worker to listen (Python + imports, loaded CPU)
_HEADER = struct.Struct("!Q")


class WorkerError(RuntimeError):
    """The worker failed to answer (its reason, or why it could not be reached)."""


# --------------------------------------------------------------------------- the wire
# One frame: 8-byte length, a JSON header, then the arrays' bytes one after the other. The
# header describes a RecordDict: ArrayRecords as (name, dtype, shape, stype, size) per
# array (the bytes are Flower's own serialisation, passed through untouched), ConfigRecords
# as JSON (bool/int/float/str: exact). Nothing is pickled.


def pack(header: dict[str, Any], records: RecordDict | dict[str, Any]) -> bytes:
    """``header`` (JSON-able) and ``records`` (ArrayRecords / ConfigRecords) as one frame."""
    blobs: list[bytes] = []
    described: dict[str, Any] = {}
    for name, record in records.items():
        if isinstance(record, ArrayRecord):
            items = []
            for key, arr in record.items():
                items.append([key, arr.dtype, list(arr.shape), arr.stype, len(arr.data)])
                blobs.append(arr.data)
            described[name] = {"arrays": items}
        elif isinstance(record, ConfigRecord):
            described[name] = {"config": dict(record)}
        else:
            raise TypeError(f"record {name!r}: cannot relay a {type(record).__name__}")
    head = json.dumps({**header, "records": described}).encode()
    return b"".join([_HEADER.pack(len(head)), head, *blobs])


def unpack(frame: bytes) -> tuple[dict[str, Any], RecordDict]:
    """The ``(header, records)`` that :func:`pack` wrote."""
    (n,) = _HEADER.unpack_from(frame)
    header = json.loads(frame[_HEADER.size : _HEADER.size + n])
    offset = _HEADER.size + n
    records = RecordDict()
    for name, desc in header.pop("records").items():
        if "config" in desc:
            records[name] = ConfigRecord(desc["config"])
            continue
        record = ArrayRecord()
        for key, dtype, shape, stype, size in desc["arrays"]:
            data = bytes(frame[offset : offset + size])
            record[key] = Array(dtype=dtype, shape=tuple(shape), stype=stype, data=data)
            offset += size
        records[name] = record
    return header, records


def pack_message(header: dict[str, Any], content: RecordDict, state: ArrayRecord | None) -> bytes:
    """A message's content and the client's state (``None``: none) as one frame."""
    records = {"content." + k: v for k, v in content.items()}
    if state is not None:
        records["state"] = state
    return pack(header, records)


def unpack_message(frame: bytes) -> tuple[dict[str, Any], RecordDict, ArrayRecord | None]:
    """The ``(header, content, state)`` that :func:`pack_message` wrote."""
    header, records = unpack(frame)
    content = RecordDict({k[8:]: v for k, v in records.items() if k.startswith("content.")})
    state = records["state"] if "state" in records else None
    return header, content, state


def send(sock: socket.socket, frame: bytes) -> None:
    """Write one frame (length-prefixed) to ``sock``."""
    sock.sendall(_HEADER.pack(len(frame)) + frame)


def receive(sock: socket.socket) -> bytes:
    """Read one frame from ``sock``; ``ConnectionError`` if the peer closed first."""
    (n,) = _HEADER.unpack(_read(sock, _HEADER.size))
    return bytes(_read(sock, n))


def _read(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("the worker closed the connection")
        got += k
    return buf


# ------------------------------------------------------------------------- the worker


def worker_dir(node_config: dict[str, Any], node_id: int) -> Path:
    """The node's worker folder (``worker-dir``, or one per node id under the temp dir)."""
    raw = node_config.get("worker-dir", "")
    if raw:
        return Path(str(raw))
    return Path(tempfile.gettempdir()) / f"swarmjax-flower-{os.getuid()}" / f"node-{node_id}"


def _check_owner(folder: Path) -> None:
    """The folder (and so the socket the state goes to) must be this user's, and private."""
    info = folder.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise WorkerError(f"worker-dir {folder} must belong to this user with mode 0700")


def _connect(folder: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(folder / SOCKET))
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    return sock


def start_worker(folder: Path, watch: int, idle_timeout: float = 1800.0) -> subprocess.Popen:
    """Start a worker for the node whose folder is ``folder`` (detached, in its own
    session), exiting when process ``watch`` is gone; one that finds another worker alive
    in ``folder`` exits at once (status 0)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_owner(folder)
    if len(str(folder / SOCKET)) > 100:
        raise WorkerError(f"worker-dir {folder} is too long for a Unix socket path")
    args = [sys.executable, "-m", "swarmjax.fl.runtime.flower.worker", str(folder)]
    args += ["--watch", str(watch), "--idle-timeout", str(idle_timeout)]
    with open(folder / LOG_FILE, "ab") as log:
        return subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives this ClientApp process
            close_fds=True,
        )


def _worker(folder: Path, idle_timeout: float) -> socket.socket:
    """A connection to the node's worker, starting one if none listens."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_owner(folder)
    sock = _connect(folder)
    if sock is not None:
        return sock
    with open(folder / LOCK_FILE, "w") as lock:  # one starter per node at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        sock = _connect(folder)
        if sock is not None:
            return sock
        # the worker watches this ClientApp's parent: the node's SuperExec
        proc = start_worker(folder, os.getppid(), idle_timeout)
        deadline = time.monotonic() + START_TIMEOUT
        while (sock := _connect(folder)) is None:
            # status 0: another worker was alive in the folder (it is binding its socket)
            if proc.poll() not in (None, 0) or time.monotonic() > deadline:
                tail = (folder / LOG_FILE).read_text(errors="replace")[-3000:]
                raise WorkerError(f"the swarmjax worker did not start ({folder}):\n{tail}")
            time.sleep(0.02)
        return sock


def ask_worker(
    kind: str,
    content: RecordDict,
    stored: ArrayRecord | None,
    run_config: dict[str, Any],
    node_config: dict[str, Any],
    folder: Path,
) -> tuple[RecordDict, ArrayRecord | None]:
    """Have the node's worker answer one message (``swarmjax...client.answer`` there).
    A worker that dies before answering is restarted and asked again (the state it needs
    comes with the request)."""
    header = {"kind": kind, "run_config": dict(run_config), "node_config": dict(node_config)}
    frame = pack_message(header, content, stored)
    idle = float(node_config.get("worker-idle-timeout", 1800.0))
    for attempt in range(2):
        try:
            with contextlib.closing(_worker(folder, idle)) as sock:
                send(sock, frame)
                answer = receive(sock)
            break
        except (ConnectionError, BrokenPipeError):
            if attempt:
                raise WorkerError(f"the swarmjax worker in {folder} died twice") from None
    head, out, state = unpack_message(answer)
    if "error" in head:
        raise WorkerError(head["error"])
    return out, state


def _in_ray() -> bool:
    """Whether this process is connected to Ray (Flower's simulation runs ClientApps in Ray
    actors, which live on between messages); merely importing Ray does not count."""
    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())


def _relay(kind: str, in_process: bool) -> Callable[[Message, Context], Message]:
    def handle(msg: Message, context: Context) -> Message:
        node_config, run_config = dict(context.node_config), dict(context.run_config)
        stored = context.state[STATE_KEY] if STATE_KEY in context.state else None
        if in_process or not node_config.get("worker", True) or _in_ray():
            # in this process: asked for, or a Flower simulation (its Ray actors live on)
            from swarmjax.fl.runtime.flower.client import answer

            content, state = answer(kind, msg.content, stored, run_config, node_config)
        else:
            folder = worker_dir(node_config, context.node_id)
            content, state = ask_worker(kind, msg.content, stored, run_config, node_config, folder)
        if state is not None:
            context.state[STATE_KEY] = state
        return Message(content, reply_to=msg)

    return handle


def make_relay_app(in_process: bool = False) -> ClientApp:
    """The ClientApp ``flower_app`` deploys (see the module docs); ``in_process``: answer
    every message in the ClientApp's own process (what
    :func:`swarmjax.fl.runtime.flower.client.make_client_app` returns)."""
    app = ClientApp()
    app.query("hello")(_relay("hello", in_process))
    app.train("exchange")(_relay("exchange", in_process))
    app.train("secagg")(_relay("secagg", in_process))
    return app
