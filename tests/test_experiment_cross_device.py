"""experiments.cross_device end to end on bundled digits (many small clients, a cohort per
round, FedAvg and user-level DP-FedAvg), its outputs, its resume from checkpoints, and its
one-line errors."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from experiments import cross_device
from tests.argv import override
from tests.secret_keys import MadeKeys, check_randomness_stated
from tests.test_released_files import check_released_files

ARGS = [
    "--quick",
    "--datasets", "digits",
    "--clients", "40",
    "--rows-per-client", "20",
    "--cohort", "5",
    "--rounds", "2",
    "--algorithms", "fedavg", "dp-fedavg",
    "--test-size", "200",
]  # fmt: skip


def test_runs_writes_its_results_and_resumes(tmp_path, monkeypatch):
    made = MadeKeys(monkeypatch)
    out = tmp_path / "xd"
    cross_device.main([*ARGS, "--out", str(out)])
    history = pd.read_csv(out / "history.csv")
    assert set(history["algorithm"]) == {"fedavg", "dp-fedavg"}
    assert len(history) == 2 * 2  # algorithms x rounds (one seed)
    summary = json.loads((out / "summary.json").read_text())
    runs = {r["algorithm"]: r for r in summary["runs"]}
    assert runs["fedavg"]["epsilon"] is None  # strict JSON: inf is null, with the reason
    assert "infinite" in runs["fedavg"]["epsilon_null_reason"]
    assert "first 200 rows" in summary["test_sets"]["history"]
    assert summary["peak_memory_gib"] > 0
    assert 0 < runs["dp-fedavg"]["epsilon"] <= 8.0  # the quick profile's target
    assert runs["dp-fedavg"]["covers"] and not runs["dp-fedavg"]["not_covered"]
    assert (out / "accuracy_per_round.png").stat().st_size > 0
    assert (out / "accuracy_vs_epsilon.png").stat().st_size > 0
    assert (out / "epsilon_rounds.png").stat().st_size > 0  # the DP runs' epsilon per round
    assert (out / "checkpoints" / "fedavg" / "outputs_2.npz").exists()
    ledger = json.loads((out / "privacy_ledger.json").read_text())
    names = ["fedavg", "dp-fedavg", "wall-clock timing"]  # the wall time: not covered
    assert [r["algorithm"] for r in ledger["releases"]] == names
    assert ledger["non_private_releases"]["releases"] == [0, 2]
    client = ledger["composed"]["client"]
    assert client["releases"] == [1] and client["accountant"] == "pld"
    assert client["epsilon"] == pytest.approx(runs["dp-fedavg"]["epsilon"], rel=1e-6)
    assert {n["folder"] for n in ledger["not_released"]} == {
        str(out / "checkpoints" / a) for a in ("fedavg", "dp-fedavg")
    }
    assert (out / "checkpoints" / "fedavg" / "NOT_RELEASED.txt").exists()
    check_randomness_stated(ledger)
    made.assert_not_compiled()  # no secret key a constant of a compiled program
    cross_device.main([*ARGS, "--out", str(out)])  # resumes: both runs are finished
    again = pd.read_csv(out / "history.csv")
    pd.testing.assert_frame_equal(history, again)
    check_released_files(out, cross_device)  # each file a release, public or kept back


_override = override


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--cohort", "50"], "--cohort 50 must be <= --clients 40"),
        (["--clients", "1000"], "exceed the"),
        (["--delta", "1.5"], "--delta: must be in (0, 1)"),
        (["--accountant", "gdp"], "--accountant: invalid choice"),
        (["--epsilons", "0"], "--epsilons"),
        (["--devices", "99"], "--devices 99: 1 cpu device(s) present"),
        (["--devices", "0"], "--devices"),
    ],
)
def test_bad_input_is_one_line_before_any_work(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as exc:
        cross_device.main([*_override(ARGS, extra), "--out", str(tmp_path / "bad")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
