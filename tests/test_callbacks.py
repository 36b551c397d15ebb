"""Per-round callbacks of ``simulate`` (issue 50 item 7): every round once and in order, the
values the history holds, and the ready adapters (JSON lines, CSV, TensorBoard event files
read back through their protobuf records); a loop of one's own notifies the same way."""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pandas as pd
import pytest

from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data import load_dataset
from swarmjax.fl.data.clients import stack_clients
from swarmjax.fl.data.partition import iid_partition
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import Execution, simulate
from swarmjax.fl.runtime import simulator as sim
from swarmjax.fl.runtime.callbacks import CsvRows, JsonLines, TensorBoard, notify
from swarmjax.models import mlp

ROUNDS = 3
ALG = FedAvg(mlp((16,), 10, (8, 8, 1)), LocalTraining(epochs=1, batch_size=32))


@pytest.fixture(scope="module")
def setting():
    data = load_dataset("digits")
    part = iid_partition(data.y_train[:600], 3, seed=0)
    clients = stack_clients(data.x_train[:600], data.y_train[:600], part.indices)
    spec = RunSpec(ROUNDS, 1e-5, (0, 1))
    variants = Variants.grid(
        ALG, clients, spec, epsilon_target=[math.inf], learning_rate=[0.1, 0.3]
    )
    return clients, (data.x_test, data.y_test), variants


def _events(folder) -> list[tuple[str, int, float]]:
    """(tag, step, value) of every scalar in the TensorBoard event files of ``folder`` (the
    TFRecord framing: length, its CRC, the Event protobuf, its CRC)."""
    from tensorboardX.proto import event_pb2

    out = []
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        at = 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            event = event_pb2.Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4
            for value in event.summary.value:
                out.append((value.tag, int(event.step), float(value.simple_value)))
    return out


def test_callbacks_see_every_round_once_with_the_history_values(setting, tmp_path):
    clients, test, variants = setting
    seen = []
    board = TensorBoard(tmp_path / "tb")
    lines, rows = JsonLines(tmp_path / "rounds.jsonl"), CsvRows(tmp_path / "rounds.csv")

    def collect(round_, metrics, runs):
        seen.append((round_, {k: np.array(v) for k, v in metrics.items()}, runs.copy()))

    execution = Execution(rounds_per_call=2, callbacks=(collect, lines, rows, board))
    res = simulate(ALG, clients, test, variants, execution=execution)
    board.close()
    lines.close()
    rows.close()
    assert [r for r, _, _ in seen] == [1, 2, 3]  # calls of 2 and 1 rounds, each round once
    h = res.history
    for round_, metrics, runs in seen:
        pd.testing.assert_frame_equal(runs, res.runs)
        want = h[h["round"] == round_]["test_accuracy"].to_numpy()
        np.testing.assert_array_equal(metrics["test_accuracy"], want)
    logged = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert len(logged) == ROUNDS * res.runs.shape[0]
    assert [x["round"] for x in logged] == [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]
    table = pd.read_csv(tmp_path / "rounds.csv")
    np.testing.assert_allclose(
        table["test_accuracy"].to_numpy(),
        h["test_accuracy"].to_numpy()[np.argsort(h["round"].to_numpy(), kind="stable")],
        rtol=1e-6,
    )
    scalars = _events(tmp_path / "tb")
    accuracy = [s for s in scalars if s[0].startswith("test_accuracy/")]
    assert len(accuracy) == ROUNDS * res.runs.shape[0]
    tags = {s[0] for s in accuracy}
    # tensorboardX keeps tags to [A-Za-z0-9_./-]: "epsilon_target=inf,..." becomes "_"-joined
    assert "test_accuracy/epsilon_target_inf_learning_rate_0.3_seed_1" in tags
    last = [v for tag, step, v in accuracy if step == ROUNDS]
    assert sorted(last) == pytest.approx(sorted(h[h["round"] == ROUNDS]["test_accuracy"]))


def test_a_loop_of_ones_own_notifies_the_same_rounds(setting):
    clients, test, variants = setting
    seen = []
    run = sim.start(ALG, clients, test, variants)
    labels = pd.DataFrame(dict(run.labels))
    while run.done < ROUNDS:
        run, metrics = sim.advance(run, 1)
        notify([lambda r, m, runs: seen.append(r)], run.done, metrics, labels)
    assert seen == [1, 2, 3]


def test_a_run_longer_than_an_hour_is_announced(setting, monkeypatch):
    """After the second compiled call, a run whose rounds left take more than an hour at the
    measured pace gets one warning line (here the clock is made to run 1,000 s a call)."""
    clients, test, variants = setting
    assert not sim.long_run_warning(10.0, 100)
    with pytest.warns(UserWarning, match="hours left"):
        assert sim.long_run_warning(10.0, 1000)
    clock = iter(range(0, 10**6, 1000))
    monkeypatch.setattr(sim.time, "perf_counter", lambda: float(next(clock)))
    with pytest.warns(UserWarning, match="hours left"):
        monkeypatch.setattr(sim, "LONG_RUN_SECONDS", 500.0)
        simulate(ALG, clients, test, variants, execution=Execution(rounds_per_call=1))
