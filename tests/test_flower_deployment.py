"""A real deployment: SuperLink + 3 SuperNodes as separate processes on 127.0.0.1, runs
submitted with ``flwr run``: same numbers and bytes as the simulator, and a SuperNode
killed in the middle of a round. Every process is stopped even when a test fails."""

import time

import pytest

pytest.importorskip("flwr", reason="the flower extra is not installed")

import psutil

from swarmjax.flower.deployment import LocalDeployment
from swarmjax.flower.server import read_run
from swarmjax.flower.task import load_task
from tests.test_flower_runtime import BASE, _simulate, assert_same_run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    cache = tmp_path_factory.mktemp("jax-cache")
    with LocalDeployment(node_config={"jax-cache-dir": str(cache)}) as d:
        pids = [p.pid for p in d._procs]
        yield d
    # nothing this deployment started survives it
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def _run(deployment, config):
    try:
        return deployment.run(config, timeout=400)
    except RuntimeError as err:
        pytest.fail(f"{err}\n{deployment.logs()}")


def test_same_numbers_and_bytes_as_the_simulator(deployment, tmp_path):
    config = {**BASE, "algorithm": "fedavg", "rounds": 2, "out-dir": str(tmp_path)}
    _run(deployment, config)
    run = read_run(tmp_path, load_task(config))
    sim = _simulate(config)
    assert_same_run(run, sim)
    assert (run.messages["status"] == "ok").all() and len(run.messages) == 6
    # the array bytes Flower carried are swarmjax's communication accounting; on the wire
    # each array adds an np.save header and its field name
    assert list(run.history["bytes_up"]) == list(sim.history["bytes_up"])
    assert list(run.history["bytes_down"]) == list(sim.history["bytes_down"])
    assert (run.messages["wire_up"] > run.messages["bytes_up"]).all()


def test_supernode_killed_mid_round(deployment, tmp_path):
    config = {**BASE, "algorithm": "fedavg", "rounds": 2, "out-dir": str(tmp_path)}
    config["reply-timeout"] = 60.0  # the nodes compiled while joining; a round loads it
    log = deployment.workdir / "node1.log"
    seen = len(log.read_bytes())  # the earlier runs' lines
    proc = deployment.start_run(config)
    deadline = time.monotonic() + 300
    while b"round-2-train" not in log.read_bytes()[seen:]:
        assert time.monotonic() < deadline and proc.poll() is None, deployment.logs()
        time.sleep(0.2)
    deployment.kill_node(1)  # SIGKILL while its round-2 message is in flight
    try:
        deployment.finish(proc, timeout=300)
    except RuntimeError as err:
        pytest.fail(f"{err}\n{deployment.logs()}")
    finally:
        deployment.start_node(1)
    run = read_run(tmp_path, load_task(config))
    status = run.messages.set_index(["round", "client"])["status"]
    assert (status.loc[1] == "ok").all()
    assert status[(2, 1)] != "ok" and status[(2, 0)] == status[(2, 2)] == "ok"
    assert list(run.history["round"]) == [1, 2]
    steps = run.privacy.steps[0]
    assert steps[1, 1] == steps[0, 1] > 0  # client 1 released nothing in round 2
