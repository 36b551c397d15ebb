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

import threading
import time

from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

__all__ = ["HELLO", "Hello", "make_server_app", "send_all"]

HELLO = "query.hello"  # the message kind of the greeting (content: empty)


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
    timeout = float(config.get("reply-timeout", 120.0))
    hello = Hello(grid, max(timeout, float(config.get("join-timeout", 120.0))), poll=0.05)
    from swarmjax.fl.runtime.flower.server import serve  # JAX: while the nodes answer

    serve(grid, config, hello)


def make_server_app() -> ServerApp:
    """A ServerApp that runs the run configuration's
    :class:`~swarmjax.fl.runtime.flower.task.Task` (see the module docs)."""
    app = ServerApp()
    app.main()(_main)
    return app
