"""A SuperNode's worker: one long-lived process that answers the node's messages.

``python -m swarmjax.fl.runtime.flower.worker FOLDER --watch PID`` listens on
``FOLDER/worker.sock`` (a Unix domain socket; the folder is the node's, mode 0700) and
answers one request at a time with :func:`swarmjax.fl.runtime.flower.client.answer`, the
function the in-process ClientApp calls too. Started by the relay ClientApp
(:mod:`swarmjax.fl.runtime.flower.relay`) on the node's first message; it keeps what a
fresh process would rebuild for every message (JAX, the task, the partition's data, the
jitted client functions) and nothing else: the client's state comes with each request
from ``context.state`` and goes back with the reply, so a worker that dies or is replaced
loses nothing. It exits when process ``PID`` (the node's SuperExec) is gone or after
``--idle-timeout`` seconds without a request. It answers only over its socket.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import socket
import time
import traceback
from pathlib import Path

from swarmjax.fl.runtime.flower.relay import (
    ALIVE_FILE,
    PID_FILE,
    SOCKET,
    pack_message,
    receive,
    send,
    unpack_message,
)

__all__ = ["serve"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _bind(folder: Path) -> socket.socket:
    path = folder / SOCKET
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a dead worker's socket (the relay holds the node's start lock)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    os.chmod(path, 0o600)
    server.listen(8)
    return server


def _handle(conn: socket.socket) -> None:
    from swarmjax.fl.runtime.flower.client import answer

    header, content, stored = unpack_message(receive(conn))
    t0 = time.perf_counter()
    try:
        out, state = answer(
            header["kind"], content, stored, header["run_config"], header["node_config"]
        )
        frame = pack_message({}, out, state)
    except Exception as err:  # the relay raises it in the ClientApp: an error reply
        traceback.print_exc()
        frame = pack_message({"error": repr(err)}, {}, None)
    print(f"{header['kind']}: {time.perf_counter() - t0:.3f} s", flush=True)
    send(conn, frame)


def serve(folder: Path, watch: int | None, idle_timeout: float, tick: float = 0.5) -> None:
    """Answer requests on ``folder``'s socket until ``watch`` dies or ``idle_timeout``
    seconds pass without one; at once if another worker is alive in ``folder``."""
    alive = open(folder / ALIVE_FILE, "w")  # locked while this worker lives
    try:
        fcntl.flock(alive, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return
    server = _bind(folder)
    (folder / PID_FILE).write_text(str(os.getpid()))
    import swarmjax.fl.runtime.flower.client  # noqa: F401  JAX, while requests queue

    server.settimeout(tick)
    last = time.monotonic()
    try:
        while True:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                if watch is not None and not _alive(watch):
                    return
                if time.monotonic() - last > idle_timeout:
                    return
                continue
            with conn:
                conn.settimeout(None)
                try:
                    _handle(conn)
                except (ConnectionError, OSError):
                    traceback.print_exc()  # the ClientApp went away; serve the next one
            last = time.monotonic()
    finally:
        server.close()
        with contextlib.suppress(FileNotFoundError):
            if (folder / PID_FILE).read_text() == str(os.getpid()):
                (folder / SOCKET).unlink()
                (folder / PID_FILE).unlink()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--watch", type=int, default=None, help="exit when this pid is gone")
    parser.add_argument("--idle-timeout", type=float, default=1800.0)
    args = parser.parse_args(argv)
    watch = args.watch if args.watch and args.watch > 1 else None
    serve(args.folder, watch, args.idle_timeout)


if __name__ == "__main__":
    main()
