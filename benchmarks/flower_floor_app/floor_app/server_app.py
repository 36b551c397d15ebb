"""``server``: a hello to every node, then ``rounds`` x ``exchanges`` echo exchanges with
all ``num-clients`` nodes; writes ``floor.json`` (seconds per round) to ``out-dir``."""

import json
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

server = ServerApp()


def _exchange(grid: Grid, nodes: list[int], kind: str, size: int, timeout: float) -> None:
    request = ArrayRecord({"x": Array(np.arange(size, dtype=np.float32))})
    msgs = [
        Message(RecordDict({"request": request}), dst_node_id=n, message_type=kind) for n in nodes
    ]
    # push, then pull every 0.05 s as swarmjax's ServerApp does (Grid.send_and_receive
    # would sleep 3 s between pulls)
    pending = set(grid.push_messages(msgs))
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for reply in grid.pull_messages(list(pending)):
            if reply.has_error():
                raise RuntimeError(f"{kind}: error reply {reply.error.reason}")
            pending.discard(reply.metadata.reply_to_message_id)
        if pending:
            time.sleep(0.05)
    if pending:
        raise RuntimeError(f"{kind}: {len(pending)} of {len(nodes)} nodes did not answer")


@server.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    n, size = int(config["num-clients"]), int(config["size"])
    timeout = float(config["reply-timeout"])
    deadline = time.monotonic() + float(config["join-timeout"])
    while len(nodes := sorted(grid.get_node_ids())) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(nodes)} of {n} nodes joined")
        time.sleep(0.05)
    nodes = nodes[:n]
    _exchange(grid, nodes, "query.hello", size, timeout)
    seconds = []
    for _ in range(int(config["rounds"])):
        t0 = time.perf_counter()
        for _ in range(int(config["exchanges"])):
            _exchange(grid, nodes, "train.exchange", size, timeout)
        seconds.append(time.perf_counter() - t0)
    if config["out-dir"]:
        out = Path(str(config["out-dir"]))
        out.mkdir(parents=True, exist_ok=True)
        (out / "floor.json").write_text(json.dumps({"seconds": seconds}))
