"""The deployment's ServerApp: it greets the nodes first and imports JAX while they answer.

``flwr run`` starts a fresh ``flwr-serverapp`` process for every run. Importing JAX and
swarmjax, building the task and compiling the server's functions take seconds, and so does
the first exchange (``query.hello``: each node says its partition; a node's worker warms up
its client functions before it answers). This module imports only Flower: its ServerApp
pushes the hello to every node present, collects the replies in a thread, and meanwhile
imports :mod:`swarmjax.fl.runtime.flower.server`, which loads the task, compiles (or loads
from JAX's persistent cache) every server function and then drives the run, starting
from the replies the thread collected.

:func:`send_all` is the ServerApp's one transport: push messages, pull their replies
every ``poll`` seconds until all are in or ``timeout`` passes.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

__all__ = ["HELLO", "Hello", "ServerSettings", "make_server_app", "send_all"]

HELLO = "query.hello"  # the message kind of the greeting (content: empty)


@dataclass(frozen=True)
class ServerSettings:
    """How the ServerApp waits for nodes (run configuration keys in brackets).

    Attributes:
        join_timeout: seconds to wait for all ``N`` partitions before round 1 [join-timeout];
            the run starts with the nodes present then (at least one); nodes that join
            later are added between rounds.
        reply_timeout: seconds one exchange waits for replies [reply-timeout].
        poll: seconds between two pulls of replies.
        reject_nonfinite: leave out replies holding NaN or inf [reject-nonfinite].
        out_dir: where the results are written [out-dir] (``None``: not written).
    """

    join_timeout: float = 120.0
    reply_timeout: float = 120.0
    poll: float = 0.25
    reject_nonfinite: bool = True
    out_dir: Path | None = None

    def __post_init__(self) -> None:
        for name in ("join_timeout", "reply_timeout", "poll"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number > 0; got {value!r}")

    @classmethod
    def from_run_config(cls, config: dict[str, Any]) -> ServerSettings:
        out = config.get("out-dir") or None
        return cls(
            join_timeout=float(config.get("join-timeout", cls.join_timeout)),
            reply_timeout=float(config.get("reply-timeout", cls.reply_timeout)),
            reject_nonfinite=bool(config.get("reject-nonfinite", cls.reject_nonfinite)),
            out_dir=Path(out) if out else None,
        )


def send_all(
    grid: Grid,
    contents: dict[int, RecordDict],
    kind: str,
    group: str,
    timeout: float,
    poll: float,
) -> dict[int, Message | str]:
    """Send ``contents[node]`` to each node; ``node -> reply``, or the reason there is none
    (no reply within ``timeout`` seconds)."""
    msgs = [
        Message(content, dst_node_id=node, message_type=kind, group_id=group)
        for node, content in contents.items()
    ]
    ids = list(grid.push_messages(msgs))
    pending = dict(zip(ids, contents, strict=True))
    out: dict[int, Message | str] = {}
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for reply in grid.pull_messages(list(pending)):
            node = pending.pop(reply.metadata.reply_to_message_id, None)
            if node is not None:
                out[node] = reply
        if pending:
            time.sleep(poll)
    for node in pending.values():
        out[node] = f"no reply within {timeout:g} s"
    return out


class Hello:
    """The hello to every node present at construction, answered in a background thread.

    The thread is the grid's only user until :meth:`replies` returns (Flower's grid is not
    shared between threads).
    """

    def __init__(self, grid: Grid, timeout: float, poll: float) -> None:
        self.nodes = list(grid.get_node_ids())
        self._replies: dict[int, Message | str] = {}
        self._error: BaseException | None = None

        def ask() -> None:
            try:
                hello = {node: RecordDict() for node in self.nodes}
                self._replies = send_all(grid, hello, HELLO, "hello", timeout, poll)
            except BaseException as err:  # re-raised by replies() in the main thread
                self._error = err

        self._thread = threading.Thread(target=ask, name="swarmjax-hello", daemon=True)
        self._thread.start()

    def replies(self) -> dict[int, Message | str]:
        """``node -> reply`` (or why there is none) for every node asked; waits for them."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._replies


def _main(grid: Grid, context: Context) -> None:
    config = dict(context.run_config)
    settings = ServerSettings.from_run_config(config)
    timeout = max(settings.reply_timeout, settings.join_timeout)  # as the later greetings
    hello = Hello(grid, timeout, settings.poll)
    from swarmjax.fl.runtime.flower.server import serve  # JAX: while the nodes answer

    serve(grid, config, hello)


def make_server_app() -> ServerApp:
    """A ServerApp that runs the run configuration's
    :class:`~swarmjax.fl.runtime.flower.task.Task` (see the module docs)."""
    app = ServerApp()
    app.main()(_main)
    return app
