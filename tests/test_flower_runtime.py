"""The Flower runtime in one process (LoopbackGrid: the real ServerApp and ClientApp code,
no SuperLink): same numbers as the simulator, and the faults a deployment meets."""

import logging

import pytest

pytest.importorskip("flwr", reason="the flower extra is not installed")

import jax
import numpy as np
from flwr.app import ArrayRecord, Message, RecordDict

from swarmjax.flower.client import make_client_app
from swarmjax.flower.loopback import LoopbackGrid
from swarmjax.flower.server import ServerSettings, drive
from swarmjax.flower.task import load_task, simulate_task

BASE = {"task": "swarmjax.flower.tasks:digits", "train-size": 300, "hidden": 16}
FAST = ServerSettings(join_timeout=1.0, reply_timeout=1.0)


def _grid(config, partitions=(0, 1, 2)):
    return LoopbackGrid.with_partitions(make_client_app(), config, partitions)


def _simulate(config):
    task = load_task(config)
    return simulate_task(task)


def assert_same_run(run, sim, atol=1e-6):
    a = jax.tree.leaves(run.server)
    b = jax.tree.leaves(jax.tree.map(lambda x: x[0], sim.server))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=atol)
    for col in ("test_accuracy", "test_loss", "epsilon_max"):
        np.testing.assert_allclose(run.history[col], sim.history[col], rtol=0, atol=atol)
    np.testing.assert_allclose(run.privacy.epsilon, sim.privacy.epsilon)
    assert run.privacy.covers == sim.privacy.covers
    assert run.privacy.not_covered == sim.privacy.not_covered


# Fed-DP-PSO compiles the longest: one round (setup + both exchanges), 2 particles
SIZES = {"fed-dp-pso": {"rounds": 1, "particles": 2, "train-size": 150}}


@pytest.mark.parametrize("algorithm", ["fedavg", "dp-fedavg", "fed-dp-pso"])
def test_same_numbers_as_the_simulator(algorithm):
    config = {**BASE, "algorithm": algorithm, "rounds": 2, **SIZES.get(algorithm, {})}
    run = drive(_grid(config), load_task(config), FAST)
    sim = _simulate(config)
    assert_same_run(run, sim)
    assert (run.messages["status"] == "ok").all()
    # released bytes: what was carried (public selection) or, for DP-FedAvg's secret
    # Poisson sampling, the expected count x message size; both equal the simulator's
    np.testing.assert_allclose(run.history["bytes_up"], sim.history["bytes_up"], rtol=1e-12)
    np.testing.assert_allclose(run.history["bytes_down"], sim.history["bytes_down"], rtol=1e-12)
    carried = run.messages.groupby("round")["bytes_up"].sum()
    if algorithm == "dp-fedavg":  # the realised messages stay in the operator's log
        assert np.isfinite(run.privacy.epsilon).all()
        per_client = run.messages["bytes_up"].max()
        assert (carried % per_client == 0).all()
    else:
        np.testing.assert_array_equal(carried, run.history["bytes_up"])


def test_dropped_client_round_finishes_and_spend_stays_correct(caplog):
    config = {**BASE, "algorithm": "fedavg", "rounds": 2}
    grid = _grid(config)
    calls = {"n": 0}

    def dies_in_round_two(reply: Message) -> Message | None:
        calls["n"] += 1  # 1: hello, 2: round 1, 3: round 2 (computed, then the node died)
        return None if calls["n"] == 3 else reply

    grid.nodes[101].rewrite = dies_in_round_two
    with caplog.at_level(logging.WARNING, logger="swarmjax.flower"):
        run = drive(grid, load_task(config), FAST)
    status = run.messages.set_index(["round", "client"])["status"]
    assert status[(1, 1)] == "ok"
    assert status[(2, 1)].startswith("no reply")
    assert "client 1 left out" in caplog.text
    assert list(run.history["round"]) == [1, 2]  # the run did not hang
    assert run.history["bytes_up"].iloc[1] == 2 * run.messages["bytes_up"].iloc[0]
    # the spend released by client 1 is that of round 1 (its round-2 model never left it);
    # the clients that answered counted round 2's steps
    steps = run.privacy.steps[0]
    assert steps[1, 1] == steps[0, 1] > 0
    assert (steps[1, [0, 2]] == 2 * steps[0, [0, 2]]).all()


def test_garbage_reply_is_rejected_with_a_logged_reason(caplog):
    config = {**BASE, "algorithm": "fedavg", "rounds": 1}
    grid = _grid(config)

    def garbage(reply: Message) -> Message:
        if "reply" in reply.content:
            reply.content = RecordDict({"reply": ArrayRecord([np.zeros(3)])})
        return reply

    grid.nodes[102].rewrite = garbage
    with caplog.at_level(logging.WARNING, logger="swarmjax.flower"):
        run = drive(grid, load_task(config), FAST)
    row = run.messages.set_index("client").loc[2]
    assert row["status"].startswith("rejected: fields missing")
    assert "client 2 left out: rejected" in caplog.text
    # the round used clients 0 and 1: the same model as a run where client 2 is down
    grid2 = _grid(config)
    grid2.nodes[102].up = False
    other = drive(grid2, load_task(config), FAST)
    for x, y in zip(jax.tree.leaves(run.server), jax.tree.leaves(other.server), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_late_node_joins_between_rounds():
    config = {**BASE, "algorithm": "fedavg", "rounds": 2}
    grid = _grid(config)
    grid.nodes[102].joins_after = 3  # visible once round 1's messages went out
    run = drive(grid, load_task(config), FAST)
    ok = run.messages[run.messages["status"] == "ok"]
    clients = ok.groupby("round")["client"].apply(sorted)
    assert clients[1] == [0, 1] and clients[2] == [0, 1, 2]
    absent = run.messages.set_index(["round", "client"])["status"][(1, 2)]
    assert absent == "no node holds this partition"


def test_a_partition_claimed_twice_is_refused(caplog):
    config = {**BASE, "algorithm": "fedavg", "rounds": 1}
    grid = _grid(config, partitions=(0, 1))
    twin = _grid(config, partitions=(1,)).nodes[101]
    grid.nodes[999] = twin
    with caplog.at_level(logging.WARNING, logger="swarmjax.flower"):
        run = drive(grid, load_task(config), FAST)
    assert "partition 1 is out of range or taken" in caplog.text
    ok = run.messages[run.messages["status"] == "ok"]
    assert sorted(ok["client"]) == [0, 1] and set(ok["node"]) == {100, 101}


def test_bad_settings_fail_before_any_work():
    from flwr.app import Context

    from swarmjax.flower.client import partition_id

    with pytest.raises(ValueError, match="reply_timeout must be a finite number > 0"):
        ServerSettings(reply_timeout=0)
    with pytest.raises(ValueError, match="run config 'task' must name a factory"):
        load_task({"task": "swarmjax.flower.tasks.digits"})
    with pytest.raises(ValueError, match="algorithm"):
        load_task({**BASE, "algorithm": "fedsgd"})
    ctx = Context(1, 1, {"partition-id": 3}, RecordDict(), {})
    with pytest.raises(ValueError, match=r"'partition-id' must be in \[0, 3\); got 3"):
        partition_id(ctx, 3)
    with pytest.raises(ValueError, match="'partition-id' is missing"):
        partition_id(Context(1, 1, {}, RecordDict(), {}), 3)
