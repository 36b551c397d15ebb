"""The deployment's ClientApp path without a SuperLink: the relay ClientApp (no JAX in its
process) and the per-node worker processes it starts, driven by the real ServerApp code
over the in-process LoopbackGrid. Same numbers as the simulator; a worker killed between
rounds is restarted on the next message and loses nothing (the state lives in the node's
context); the relay's wire format carries Flower's records bit for bit."""

import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("flwr", reason="the flower extra is not installed")

import psutil
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from swarmjax.fl.runtime.flower import relay
from swarmjax.fl.runtime.flower.loopback import LoopbackGrid
from swarmjax.fl.runtime.flower.server import drive
from swarmjax.fl.runtime.flower.task import load_task
from tests.test_flower_runtime import FAST, assert_same_run, config, simulated


def test_the_apps_entry_modules_import_no_jax():
    """Both entry modules in one fresh process (one interpreter start instead of two):
    after each import nothing of JAX or of the algorithms is loaded, so the exit status
    names the first module that pulled them in (1: relay, 2: server_app)."""
    code = (
        "import sys\n"
        "for status, module in enumerate(('relay', 'server_app'), 1):\n"
        "    __import__(f'swarmjax.fl.runtime.flower.{module}')\n"
        "    if any(m == 'jax' or m.startswith('swarmjax.fl.algorithms') for m in sys.modules):\n"
        "        sys.exit(status)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_the_wire_carries_records_bit_for_bit():
    x = np.array([np.nan, -0.0, 1e-45, np.inf], np.float32)
    content = RecordDict(
        {
            "request": ArrayRecord({"a": Array(x), "b": Array(np.arange(6).reshape(2, 3))}),
            "meta": ConfigRecord({"round": 3, "setup": False, "lr": 0.1, "name": "é"}),
        }
    )
    state = ArrayRecord({"s": Array(np.zeros((0, 2), np.uint8))})
    header, back, state_back = relay.unpack_message(relay.pack_message({"k": 1}, content, state))
    assert header == {"k": 1}
    assert dict(back["meta"]) == dict(content["meta"])
    for name in ("a", "b"):
        got, sent = back["request"][name], content["request"][name]
        assert (got.data, got.dtype, tuple(got.shape)) == (sent.data, sent.dtype, sent.shape)
    assert state_back["s"].numpy().shape == (0, 2)
    _, _, none = relay.unpack_message(relay.pack_message({}, RecordDict(), None))
    assert none is None


@pytest.fixture
def worker_grid(tmp_path):
    """FedAvg's loopback grid whose 3 nodes run the relay ClientApp, each with a worker.
    The three workers are started here at once, as a deployment starts each node's
    (``LocalDeployment.start_node``), so that their imports overlap: the loopback grid
    asks its nodes one after the other, and a relay that found no worker would start each
    in turn. The relay's own start of a worker is what the restart below exercises."""
    cfg = config("fedavg")
    grid = LoopbackGrid.with_partitions(relay.make_relay_app(), cfg, (0, 1, 2))
    for node in grid.nodes.values():
        pid = node.context.node_config["partition-id"]
        node.context.node_config["worker-dir"] = str(tmp_path / f"w{pid}")
        relay.start_worker(tmp_path / f"w{pid}", os.getpid())
    yield cfg, grid, tmp_path
    for pid in range(3):  # the workers watch this test's parent process: stop them here
        pid_file = tmp_path / f"w{pid}" / relay.PID_FILE
        if pid_file.exists():
            try:
                psutil.Process(int(pid_file.read_text())).kill()
            except psutil.NoSuchProcess:
                pass


@pytest.mark.slow
def test_workers_give_the_simulators_numbers_and_survive_a_restart(worker_grid):
    cfg, grid, tmp = worker_grid
    seen = {"n": 0}
    pid_file = tmp / "w1" / relay.PID_FILE

    def kill_worker_after_round_one(reply: Message) -> Message:
        seen["n"] += 1  # 1: hello, 2: round 1
        if seen["n"] == 2:
            seen["pid"] = int(pid_file.read_text())
            os.kill(seen["pid"], signal.SIGKILL)
        return reply

    grid.nodes[101].rewrite = kill_worker_after_round_one
    # the simulator's run in a thread meanwhile: this process mostly waits on the workers
    with ThreadPoolExecutor(1) as pool:
        sim = pool.submit(simulated, cfg)
        run = drive(grid, load_task(cfg), FAST)
    assert (run.operator.messages["status"] == "ok").all()
    assert_same_run(run, sim.result())
    # node 1's worker was started again (its log holds both lives); the state came along
    assert int(pid_file.read_text()) != seen["pid"]
    log = (tmp / "w1" / relay.LOG_FILE).read_text()
    assert log.count("hello:") == 1 and log.count("exchange:") == 2
    assert "exchange:" in (tmp / "w0" / relay.LOG_FILE).read_text()
    assert all(relay.STATE_KEY in n.context.state for n in grid.nodes.values())


def test_flower_executables_are_found_without_an_activated_environment(monkeypatch, tmp_path):
    from swarmjax.fl.runtime.flower import deployment

    monkeypatch.setenv("PATH", "/nonexistent")  # as `venv/bin/python -m pytest` leaves it
    assert (deployment.flower_bin() / "flower-superexec").exists()
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    with pytest.raises(FileNotFoundError, match="flwr"):
        deployment.flower_bin()
    (tmp_path / "flwr").touch()
    with pytest.raises(FileNotFoundError, match="flower-superexec"):
        deployment.flower_bin()
