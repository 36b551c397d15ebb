"""A real deployment: SuperLink + 3 SuperNodes as separate processes on 127.0.0.1, runs
submitted with ``flwr run``. One test, so that one deployment serves it under xdist:
DP-FedAvg (adaptive clipping, Poisson client sampling; one round) and Fed-DP-PSO (its
report and fetch exchanges; one round) give the simulator's model, history, privacy record
and bytes; then FedAvg's round 1 gives the simulator's numbers and bytes, and a SuperNode
SIGKILLed while its round-2 message is in flight leaves a round that finishes with the
other two clients, the same model and privacy record as the in-process runtime with that
reply lost, and no process behind (workers included). Every process is stopped even when
the test fails. Flower starts a fresh ClientApp process for every message; swarmjax's
ClientApp only relays the message to its node's worker, so an exchange costs about what
Flower's own trivial app costs: ``benchmarks.flower_round`` measures the two on one
deployment (a speed target is a benchmark's, not a timed test's; RESULTS.md).

SWARMJAX_FLOWER_FULL=1 runs every test at the larger sizes and also FedAvg's two rounds
uninterrupted over the same deployment.
"""

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import jax
import numpy as np
import pytest

pytest.importorskip("flwr", reason="the flower extra is not installed")

import psutil
from flwr.app import Message

from swarmjax.fl.runtime.flower.deployment import LocalDeployment
from swarmjax.fl.runtime.flower.server import drive, read_run
from swarmjax.fl.runtime.flower.task import load_task
from tests.test_flower_runtime import FAST, FULL, _grid, assert_same_run, config, simulated

pytestmark = pytest.mark.slow


# seed 1: under the tests' SECRET (the config's secret-file) its round-1 Poisson draw
# selects two of the three clients
DP_FEDAVG = config("dp-fedavg", rounds=1, seed=1)


@pytest.fixture(scope="module")
def expected():
    """The in-process runs the deployment is compared with (the simulator's three runs and
    the loopback run that loses node 1's round-2 reply), computed in a thread while the
    deployment starts and runs: its processes mostly wait on Flower's polls, so this
    overlaps the test's waits instead of following them. Requested before ``deployment``,
    so it starts first."""
    with ThreadPoolExecutor(1) as pool:
        futures = {
            "dp-fedavg": pool.submit(simulated, DP_FEDAVG),
            "fed-dp-pso": pool.submit(simulated, config("fed-dp-pso")),
            "fedavg": pool.submit(simulated, config("fedavg")),
            "lost": pool.submit(lambda: _lost_in_round_two(101)),
        }
        yield futures
        for future in futures.values():  # a failed test leaves none running
            future.cancel()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    # the suite's own compilation cache (tests/conftest.py) when there is one: the nodes,
    # their workers and the ServerApp load what the suite's processes compiled already
    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or tmp_path_factory.mktemp("jax-cache")
    with LocalDeployment(node_config={"jax-cache-dir": str(cache)}, task_poll_interval=0.5) as d:
        pids = [p.pid for p in d._procs]
        yield d
        pids += [w.pid for w in d.workers().values()]
    # nothing this deployment started survives it
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def _lost_in_round_two(node: int):
    """The in-process run of ``config("fedavg")`` where ``node`` computes round 2 and its
    reply is lost (what killing its SuperNode does)."""
    cfg = config("fedavg")
    grid = _grid(cfg)
    seen = {"n": 0}

    def lose_round_two(reply: Message) -> Message | None:
        seen["n"] += 1  # 1: hello, 2: round 1, 3: round 2
        return None if seen["n"] == 3 else reply

    grid.nodes[node].rewrite = lose_round_two
    return drive(grid, load_task(cfg), FAST)


def _assert_deployment_equals_simulator(
    deployment, cfg: dict, out: Path, sim: Future | None = None
) -> None:
    """Run ``cfg`` over the deployment (writing to ``out``) and compare it with the
    simulator's run of the same config (``sim``: that run, being computed): model,
    history, privacy record, bytes carried."""
    try:
        deployment.run({**cfg, "out-dir": str(out), "join-timeout": 1200.0}, timeout=1800)
    except RuntimeError as err:
        pytest.fail(f"{err}\n{deployment.logs()}")
    run = read_run(out, load_task(cfg))
    sim = simulated(cfg) if sim is None else sim.result()
    assert_same_run(run, sim)
    assert len(run.operator.messages) > 0 and (run.operator.messages["status"] == "ok").all()
    for col in ("bytes_up", "bytes_down"):
        np.testing.assert_allclose(run.history[col], sim.history[col], rtol=1e-12)


def test_deployment_gives_the_simulators_numbers_and_survives_a_killed_supernode(
    expected, deployment, tmp_path
):
    _assert_deployment_equals_simulator(
        deployment, DP_FEDAVG, tmp_path / "dp-fedavg", expected["dp-fedavg"]
    )
    _assert_deployment_equals_simulator(
        deployment, config("fed-dp-pso"), tmp_path / "fed-dp-pso", expected["fed-dp-pso"]
    )

    # reply-timeout: a live node answers within seconds (it compiled while joining); the
    # killed node's exchange ends when it runs out
    cfg = config("fedavg", **{"out-dir": str(tmp_path / "fedavg"), "reply-timeout": 30.0})
    log = deployment.workdir / "node1.log"
    seen = len(log.read_bytes())
    proc = deployment.start_run(cfg)
    deadline = time.monotonic() + 300
    while b"round-2-train" not in log.read_bytes()[seen:]:
        assert time.monotonic() < deadline and proc.poll() is None, deployment.logs()
        time.sleep(0.1)
    deployment.kill_node(1)  # SIGKILL while its round-2 message is in flight
    try:
        deployment.finish(proc, timeout=300)
    except RuntimeError as err:
        pytest.fail(f"{err}\n{deployment.logs()}")
    finally:
        if FULL:  # the opt-in run below uses all three nodes
            deployment.start_node(1)
    task = load_task(cfg)
    run = read_run(tmp_path / "fedavg", task)
    sim = expected["fedavg"].result()

    # round 1: the simulator's numbers; the array bytes Flower carried are swarmjax's
    # communication accounting (on the wire each array adds an np.save header and its name)
    first, sim_first = run.history.iloc[:1], sim.history.iloc[:1]
    for col in ("test_accuracy", "test_loss", "bytes_up", "bytes_down"):
        np.testing.assert_allclose(first[col], sim_first[col], rtol=0, atol=1e-6)
    np.testing.assert_allclose(run.privacy.epsilon[:, 0], sim.privacy.epsilon[:, 0])
    messages = run.operator.messages.set_index(["round", "client"])
    assert (messages.loc[1, "status"] == "ok").all()
    assert (messages.loc[1, "wire_up"] > messages.loc[1, "bytes_up"]).all()

    # round 2: finished (no hang) with the clients that answered; client 1's spend is that
    # of round 1; model, history and privacy as the in-process runtime with that reply lost
    assert messages.loc[(2, 1), "status"] != "ok"
    assert messages.loc[(2, 0), "status"] == messages.loc[(2, 2), "status"] == "ok"
    assert list(run.history["round"]) == [1, 2]
    assert run.history["bytes_up"].iloc[1] == 2 / 3 * sim.history["bytes_up"].iloc[1]
    steps = run.privacy.steps[0]
    assert steps[1, 1] == steps[0, 1] > 0
    other = expected["lost"].result()
    for x, y in zip(jax.tree.leaves(run.server), jax.tree.leaves(other.server), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=1e-6)
    for col in ("test_accuracy", "test_loss", "epsilon_max", "bytes_up", "bytes_down"):
        np.testing.assert_allclose(run.history[col], other.history[col], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(run.privacy.steps, other.privacy.steps)
    np.testing.assert_allclose(run.privacy.epsilon, other.privacy.epsilon)


@pytest.mark.skipif(not FULL, reason="opt-in: SWARMJAX_FLOWER_FULL=1 (minutes)")
def test_fedavg_over_the_deployment_with_no_fault(deployment, tmp_path):
    _assert_deployment_equals_simulator(deployment, config("fedavg"), tmp_path / "fedavg")
