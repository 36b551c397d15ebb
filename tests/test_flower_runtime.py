"""The Flower runtime in one process (LoopbackGrid: the real ServerApp and ClientApp code,
no SuperLink): same numbers as the simulator, and the faults a deployment meets."""

import functools
import logging
import os

import pytest

pytest.importorskip("flwr", reason="the flower extra is not installed")

import jax
import numpy as np
import pandas as pd
from flwr.app import ArrayRecord, Message, RecordDict

from swarmjax.fl.runtime.flower.client import make_client_app
from swarmjax.fl.runtime.flower.loopback import LoopbackGrid
from swarmjax.fl.runtime.flower.server import ServerSettings, drive
from swarmjax.fl.runtime.flower.task import load_task, simulate_task
from tests.reproducible import SECRET, secret_file

# The smallest settings that still run every code path: 150 digits rows (50 per client, the
# Poisson batch of 32 stays below them), an 8-unit hidden layer, 2 rounds (1 for
# Fed-DP-PSO, whose setup exchange plus both exchanges compile the longest), 2 particles.
# SWARMJAX_FLOWER_FULL=1: the larger settings (300 rows, 16 units, 2 rounds, 3 particles).
FULL = os.environ.get("SWARMJAX_FLOWER_FULL") == "1"
BASE = {"task": "swarmjax.fl.runtime.flower.tasks:digits", "rounds": 2}
BASE |= {"train-size": 300, "hidden": 16} if FULL else {"train-size": 150, "hidden": 8}
SIZES = {"fed-dp-pso": {"particles": 3} if FULL else {"rounds": 1, "particles": 2}}
FAST = ServerSettings(join_timeout=1.0, reply_timeout=1.0)


def config(algorithm: str, **extra: object) -> dict:
    """The run config of ``algorithm`` at the suite's sizes. Tests that use the same config
    share one Task, so its functions compile once per process. Every process (server,
    clients) and the simulator read the tests' supplied secret (``secret-file``), so they
    draw the same numbers; ``**{"secret-file": ""}`` lets each process draw its own."""
    return {
        **BASE,
        "algorithm": algorithm,
        "secret-file": secret_file(),
        **SIZES.get(algorithm, {}),
        **extra,
    }


def _grid(config, partitions=(0, 1, 2)):
    return LoopbackGrid.with_partitions(make_client_app(), config, partitions)


@functools.cache
def _simulate(frozen):
    return simulate_task(load_task(dict(frozen)))


def simulated(config):
    """The simulator's run of ``config`` (once per config and process)."""
    return _simulate(tuple(sorted(config.items())))


def assert_same_run(run, sim, atol=1e-6):
    assert list(run.history.columns) == list(sim.history.columns)
    for x, y in zip(jax.tree.leaves(run.server), jax.tree.leaves(sim.server), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=atol)
    for col in ("test_accuracy", "test_loss", "epsilon_max"):
        np.testing.assert_allclose(run.history[col], sim.history[col], rtol=0, atol=atol)
    np.testing.assert_allclose(run.privacy.epsilon, sim.privacy.epsilon)
    assert run.privacy.covers == sim.privacy.covers
    assert run.privacy.not_covered == sim.privacy.not_covered


@pytest.mark.parametrize("algorithm", ["fedavg", "dp-fedavg", "fed-dp-pso"])
def test_same_numbers_as_the_simulator(algorithm):
    cfg = config(algorithm)
    run = drive(_grid(cfg), load_task(cfg), FAST)
    sim = simulated(cfg)
    assert_same_run(run, sim)
    assert (run.operator.messages["status"] == "ok").all()
    # one report makes both Results: the same history (columns, dtypes, values: labels,
    # released counts, bytes, epsilon_max), metrics, runs and algorithm
    pd.testing.assert_frame_equal(run.history, sim.history, rtol=0, atol=1e-6)
    assert run.metrics.keys() == sim.metrics.keys()
    for name, value in run.metrics.items():
        np.testing.assert_allclose(value, sim.metrics[name], rtol=0, atol=1e-6)
    pd.testing.assert_frame_equal(run.runs, sim.runs)
    assert run.algorithm == sim.algorithm and run.clients is None and sim.operator is None
    # released bytes: what was carried (public selection) or, for DP-FedAvg's secret
    # Poisson sampling, the expected count x message size; both equal the simulator's
    np.testing.assert_allclose(run.history["bytes_up"], sim.history["bytes_up"], rtol=1e-12)
    np.testing.assert_allclose(run.history["bytes_down"], sim.history["bytes_down"], rtol=1e-12)
    trained = run.operator.messages[
        ~run.operator.messages["setup"]
    ]  # the setup round is not in the history
    carried = trained.groupby("round")["bytes_up"].sum()
    if algorithm == "dp-fedavg":  # the realised messages stay in the operator's log
        assert np.isfinite(run.privacy.epsilon).all()
        per_client = run.operator.messages["bytes_up"].max()
        assert (carried % per_client == 0).all()
    else:
        np.testing.assert_array_equal(carried, run.history["bytes_up"])


def test_the_server_app_greets_while_it_loads_and_compiles_nothing_after_warm_up(monkeypatch):
    """The deployment's ServerApp path: the hello goes out before the server imports JAX
    (answered in a thread), ``serve`` compiles every server function in ``warm_up`` (so
    a round only runs them) and the run has the simulator's numbers."""
    from swarmjax.fl.runtime.flower import server
    from swarmjax.fl.runtime.flower.server_app import Hello

    waits = {"join-timeout": 5.0, "reply-timeout": 5.0, "jax-cache-dir": ""}  # not the Task
    cfg = config("fed-dp-pso")
    grid = _grid(cfg)
    hello = Hello(grid, timeout=5.0, poll=0.01)
    assert sorted(hello.nodes) == [100, 101, 102]
    compiled = {}
    drive = server.drive

    def drive_and_count(*args):
        before = {key: fn._cache_size() for key, fn in server._JITS.items()}
        run = drive(*args)
        compiled.update(before=before, after={k: f._cache_size() for k, f in server._JITS.items()})
        return run

    monkeypatch.setattr(server, "drive", drive_and_count)
    run = server.serve(grid, {**cfg, **waits}, hello)
    assert compiled["after"] == compiled["before"]
    assert_same_run(run, simulated(cfg))
    assert (run.operator.messages["status"] == "ok").all()


def test_the_experiment_over_flower(tmp_path, capsys):
    """``python -m experiments.fed_dp_pso --runtime flower``: its settings, its one-line
    errors, and the function it calls run end to end over an in-process grid (the
    deployment itself is tested in test_flower_deployment.py)."""
    from experiments import fed_dp_pso
    from experiments._flower import run_over_flower

    args = fed_dp_pso.parse_args(["--runtime", "flower", "--quick", "--epsilons", "5"])
    expected = {
        "algorithm": "fed-dp-pso",
        "rounds": 2,
        "particles": 5,
        "target-epsilon": 5.0,
        "batch-size": 64,
        "eval-batch-size": 2000,
        "eval-subset": "",
        "selection-metric": "loss",
        "refine-start": "pbest",
        "pso-learning-rate": 0.005,
        "reading": "paper",
    }
    assert fed_dp_pso.flower_config(args) == expected
    for argv, error in (
        (["--epsilons", "inf"], "give a finite --epsilons"),
        (["--datasets", "mnist"], "runs the digits task: drop --datasets"),
    ):
        with pytest.raises(SystemExit) as exit_:
            fed_dp_pso.main(["--runtime", "flower", *argv, "--out", str(tmp_path)])
        assert exit_.value.code == 2 and error in capsys.readouterr().err

    def in_process(cfg, task, out):
        return drive(_grid(cfg), task, ServerSettings.from_run_config(cfg))

    summary = run_over_flower(config("fed-dp-pso"), tmp_path, runner=in_process)
    assert summary["max_abs_model_difference"] <= 1e-6
    assert (tmp_path / "flower" / "released" / "privacy.json").exists()
    assert (tmp_path / "flower_summary.json").exists()
    printed = capsys.readouterr().out
    assert "largest |flower - simulator|" in printed and "covers: " in printed


def test_dropped_client_round_finishes_and_spend_stays_correct(caplog):
    cfg = config("fedavg")
    grid = _grid(cfg)
    calls = {"n": 0}

    def dies_in_round_two(reply: Message) -> Message | None:
        calls["n"] += 1  # 1: hello, 2: round 1, 3: round 2 (computed, then the node died)
        return None if calls["n"] == 3 else reply

    grid.nodes[101].rewrite = dies_in_round_two
    with caplog.at_level(logging.WARNING, logger="swarmjax.fl.runtime.flower"):
        run = drive(grid, load_task(cfg), FAST)
    status = run.operator.messages.set_index(["round", "client"])["status"]
    assert status[(1, 1)] == "ok"
    assert status[(2, 1)].startswith("no reply")
    assert "client 1 left out" in caplog.text
    assert list(run.history["round"]) == [1, 2]  # the run did not hang
    assert run.history["bytes_up"].iloc[1] == 2 * run.operator.messages["bytes_up"].iloc[0]
    # the spend released by client 1 is that of round 1 (its round-2 model never left it);
    # the clients that answered counted round 2's steps
    steps = run.privacy.steps[0]
    assert steps[1, 1] == steps[0, 1] > 0
    assert (steps[1, [0, 2]] == 2 * steps[0, [0, 2]]).all()


def test_garbage_reply_is_rejected_with_a_logged_reason(caplog):
    cfg = config("fedavg")
    grid = _grid(cfg)

    def garbage(reply: Message) -> Message:
        if "reply" in reply.content:
            reply.content = RecordDict({"reply": ArrayRecord([np.zeros(3)])})
        return reply

    grid.nodes[102].rewrite = garbage
    with caplog.at_level(logging.WARNING, logger="swarmjax.fl.runtime.flower"):
        run = drive(grid, load_task(cfg), FAST)
    row = run.operator.messages.set_index(["round", "client"]).loc[(1, 2)]
    assert row["status"].startswith("rejected: fields missing")
    assert "client 2 left out: rejected" in caplog.text
    # the round used clients 0 and 1: the same model as a run where client 2 is down
    grid2 = _grid(cfg)
    grid2.nodes[102].up = False
    other = drive(grid2, load_task(cfg), FAST)
    for x, y in zip(jax.tree.leaves(run.server), jax.tree.leaves(other.server), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_late_node_joins_between_rounds():
    cfg = config("fedavg")
    grid = _grid(cfg)
    grid.nodes[102].joins_after = 3  # visible once round 1's messages went out
    run = drive(grid, load_task(cfg), FAST)
    ok = run.operator.messages[run.operator.messages["status"] == "ok"]
    clients = ok.groupby("round")["client"].apply(sorted)
    assert clients[1] == [0, 1] and clients[2] == [0, 1, 2]
    absent = run.operator.messages.set_index(["round", "client"])["status"][(1, 2)]
    assert absent == "no node holds this partition"


def test_a_partition_claimed_twice_is_refused(caplog):
    cfg = config("fedavg")
    grid = _grid(cfg, partitions=(0, 1))
    twin = _grid(cfg, partitions=(1,)).nodes[101]
    grid.nodes[999] = twin
    with caplog.at_level(logging.WARNING, logger="swarmjax.fl.runtime.flower"):
        run = drive(grid, load_task(cfg), FAST)
    assert "partition 1 is out of range or taken" in caplog.text
    ok = run.operator.messages[run.operator.messages["status"] == "ok"]
    assert ok.groupby("round")["client"].apply(sorted).tolist() == [[0, 1], [0, 1]]
    assert set(ok["node"]) == {100, 101}


def test_a_task_reads_its_secret_file_or_draws_its_own():
    """``secret-file`` names the supplied secret every process reads (reproducible mode,
    the simulator's keys); without it each process draws its own from OS entropy, so
    its run key is neither the simulator's under the supplied secret nor another
    process's."""
    from swarmjax.fl.runtime.flower.tasks import digits

    supplied = load_task(config("fedavg"))
    assert supplied.secret == SECRET
    assert supplied.run_key is supplied.run_key  # one key per Task (per process)
    own = [digits(config("fedavg", **{"secret-file": ""})) for _ in range(2)]
    assert own[0].secret is None and own[1].secret is None
    words = [np.asarray(jax.random.key_data(t.run_key)) for t in (supplied, *own)]
    assert words[0].shape == (8,)  # a 256-bit ChaCha20 key
    assert not np.array_equal(words[0], words[1]) and not np.array_equal(words[1], words[2])
    with pytest.raises(ValueError, match="secret file") as err:
        load_task(config("fedavg", **{"secret-file": "/nonexistent/secret.key"}))
    assert "\n" not in str(err.value)


def test_bad_settings_fail_before_any_work():
    from flwr.app import Context

    from swarmjax.fl.runtime.flower.client import partition_id

    with pytest.raises(ValueError, match="reply_timeout must be a finite number > 0"):
        ServerSettings(reply_timeout=0)
    with pytest.raises(ValueError, match="run config 'task' must name a factory"):
        load_task({"task": "swarmjax.fl.runtime.flower.tasks.digits"})
    with pytest.raises(ValueError, match="algorithm"):
        load_task({**BASE, "algorithm": "fedsgd"})
    ctx = Context(1, 1, {"partition-id": 3}, RecordDict(), {})
    with pytest.raises(ValueError, match=r"'partition-id' must be in \[0, 3\); got 3"):
        partition_id(ctx, 3)
    with pytest.raises(ValueError, match="'partition-id' is missing"):
        partition_id(Context(1, 1, {}, RecordDict(), {}), 3)
