"""An in-process Flower ``Grid``: the real ServerApp and ClientApp code, no SuperLink.

:class:`LoopbackGrid` hands every pushed message straight to a ClientApp with that node's
persistent :class:`flwr.app.Context`, so a ServerApp's logic (and a ClientApp's) can be
debugged and tested in one process, with faults injected per node: a node that is down
(never replies), a node that joins late, a node whose replies are rewritten (garbage).
A deployment (:mod:`swarmjax.fl.runtime.flower.deployment`) runs the same code across processes.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

__all__ = ["LoopbackGrid", "LoopbackNode"]

# flwr's code for "the ClientApp raised an exception"
_CLIENT_APP_RAISED = 4


@dataclass
class LoopbackNode:
    """One simulated SuperNode.

    Attributes:
        context: its persistent context (``node_config`` holds its partition).
        up: False: messages to it are never answered (a node killed or unreachable).
        joins_after: the node is invisible to ``get_node_ids`` until this many messages
            have been pushed to the other nodes (a node that joins late).
        rewrite: applied to each of its replies before the server sees it (a faulty or
            malicious client); returning ``None`` loses the reply (the node died after
            computing it); ``None``: replies as the ClientApp made them.
    """

    context: Context
    up: bool = True
    joins_after: int = 0
    rewrite: Callable[[Message], Message | None] | None = None


@dataclass
class LoopbackGrid(Grid):
    """A ``Grid`` whose nodes run ``app`` in this process (see the module docs)."""

    app: ClientApp
    nodes: dict[int, LoopbackNode]
    pushed: int = 0
    _replies: dict[str, Message] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Messages take their run and sender from the process's task identity, which a
        # ServerApp process gets from its SuperLink; here this process plays the server.
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1

    @classmethod
    def with_partitions(
        cls, app: ClientApp, run_config: dict, partitions: Iterable[int], **node_config: object
    ) -> LoopbackGrid:
        """One node per partition id, node ids ``100 + partition``. The nodes share this
        process, so they leave its JAX configuration alone (``jax-cache-dir=""``)."""
        nodes = {}
        for pid in partitions:
            config = {"partition-id": pid, "jax-cache-dir": "", **node_config}
            ctx = Context(1, 100 + pid, config, RecordDict(), dict(run_config))
            nodes[100 + pid] = LoopbackNode(ctx)
        return cls(app, nodes)

    def set_run(self, run_id: int) -> None:
        del run_id

    @property
    def run(self) -> None:
        return None

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, ttl=ttl)

    def get_node_ids(self) -> list[int]:
        return [i for i, n in self.nodes.items() if self.pushed >= n.joins_after]

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            ids.append(msg.metadata.message_id)
            self.pushed += 1
            node = self.nodes.get(msg.metadata.dst_node_id)
            if node is None or not node.up:
                continue
            try:
                reply = self.app(message=msg, context=node.context)
            except Exception as err:  # the node answers with an error, as a SuperNode does
                reply = Message(Error(_CLIENT_APP_RAISED, repr(err)), reply_to=msg)
            if node.rewrite is not None:
                reply = node.rewrite(reply)
            if reply is not None:
                self._replies[msg.metadata.message_id] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        return self.pull_messages(self.push_messages(messages))
