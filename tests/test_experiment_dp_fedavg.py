"""experiments.dp_fedavg under the privacy plan: a client count whose Poisson buffer needs the
add-one neighbour (103 at q = 0.1 was refused before the plan sized it), the ledger beside the
results (reused calls included), and the accountant option reaching calibration, records and
ledger (PLD's smaller noise at equal epsilon: tests/test_plan.py)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from experiments import dp_fedavg
from swarmjax.privacy import accounting
from swarmjax.privacy.ledger import Ledger
from tests.secret_keys import MadeKeys, check_randomness_stated
from tests.test_released_files import check_released_files


def _strict(name: str) -> float:
    raise ValueError(f"non-strict JSON constant {name}")


def _check_audit(out: str, folder) -> None:
    """``--audit 16``: each private run's line beside its accounted epsilon, its figures in
    the ledger and the summary; the non-private run is not audited."""
    lines = [line for line in out.splitlines() if "empirical epsilon >=" in line]
    assert len(lines) == 2  # adaptive and fixed C=1 at epsilon 8; the non-private run is not
    data = json.loads((folder / "privacy_ledger.json").read_text(), parse_constant=_strict)
    audited = [r for r in data["releases"] if r["audit"] is not None]
    assert len(audited) == 2 and all(r["epsilon"] < math.inf for r in audited)
    for line, release in zip(lines, audited, strict=True):
        audit = release["audit"]
        assert audit["canaries"] == 16 and audit["unit"] == "client"
        assert audit["epsilon"] == pytest.approx(release["epsilon"])
        assert f"accounted epsilon {audit['epsilon']:.3f}" in line
        assert f">= {audit['epsilon_lower']:.3f}" in line
    summary = pd.read_csv(folder / "summary.csv")
    private = summary[summary.method != "non-private"]
    assert private.epsilon_lower.notna().all() and (private.epsilon_lower >= 0).all()
    assert summary[summary.method == "non-private"].epsilon_lower.isna().all()


def _must_not_run(*args, **kwargs):
    raise RuntimeError("a finished setting ran again")


def test_clients_103_runs_writes_its_ledger_and_resumes(
    tmp_path, capsys, monkeypatch, data_dir
) -> None:
    """The run, its ledger and audit lines; a rerun (compute patched to fail) finishes from
    the saved calls with the same summary, audit lines and ledger; another ``--epsilons``
    computes again."""
    argv = ["--quick", "--clients", "103", "--rounds", "2", "--data-dir", str(data_dir)]
    argv += ["--accountant", "rdp", "--audit", "16", "--out", str(tmp_path)]
    made = MadeKeys(monkeypatch)
    dp_fedavg.main(argv)
    made.assert_not_compiled()  # no secret key a constant of a compiled program
    out = capsys.readouterr().out
    _check_audit(out, tmp_path)
    first = pd.read_csv(tmp_path / "summary.csv")
    assert list(first.method) == ["non-private", "adaptive", "fixed C=1"]
    # a rerun reuses the audited calls: the same lines, from the saved releases
    monkeypatch.setattr(dp_fedavg, "run_one", _must_not_run)
    dp_fedavg.main(argv)
    log = capsys.readouterr().out
    assert "3 run(s) reused" in log
    again = [line for line in log.splitlines() if "empirical" in line]
    assert again[1:] == [line for line in out.splitlines() if "empirical epsilon >=" in line]
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "summary.csv"), first)
    summary = first
    private = summary[summary.method != "non-private"]
    assert len(private) == 2 and (private.epsilon <= private.epsilon_target).all()
    text = (tmp_path / "privacy_ledger.json").read_text()
    data = json.loads(text, parse_constant=_strict)
    assert data["accountant"] == "rdp" and len(data["releases"]) == 3
    check_randomness_stated(data)
    assert {r["accountant"] for r in data["releases"]} == {"rdp"}
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["accountant"] == "rdp" and config["capacity"] is not None
    assert data["composed"]["client"]["delta"] == pytest.approx(1e-5)  # min(1e-5, 0.1 / 103)
    assert "privacy ledger:" in out and "DP releases" in out and "together" in out
    # the composition equals an independent one of the two DP releases' events
    ledger = Ledger.load(tmp_path / "privacy_ledger.json")
    events = [ev for r in ledger.releases if r.private for _, ev, _ in r.groups]
    overflow = sum(p for r in ledger.releases if r.private for _, _, p in r.groups)
    import dp_accounting

    joint = accounting.event_epsilon(
        dp_accounting.ComposedDpEvent(events), 1e-5, accountant="rdp", overflow=overflow
    )
    composed = ledger.composed()["client"].epsilon
    assert composed == pytest.approx(joint, rel=1e-9)
    assert max(r.epsilon for r in ledger.releases if r.private) < composed < math.inf
    # a rerun reuses every call and still lists every release
    dp_fedavg.main(argv)
    again = json.loads((tmp_path / "privacy_ledger.json").read_text(), parse_constant=_strict)
    assert len(again["releases"]) == 3
    assert again["composed"]["client"]["epsilon"] == data["composed"]["client"]["epsilon"]
    # every file written is a release, public or kept back (the MIA under private/)
    seen = check_released_files(tmp_path, dp_fedavg)
    assert seen["private/mia_advantage.csv"] == "not released"
    with pytest.raises(RuntimeError, match="ran again"):  # last: it writes into the folder
        dp_fedavg.main([*argv, "--epsilons", "4"])


@pytest.mark.parametrize(
    ("audit", "named"),
    [("1", "--audit: must be >= 2"), ("30000", "--audit 30000 exceeds the model's 25450")],
)
def test_bad_audit_is_one_line_before_any_work(tmp_path, capsys, audit, named) -> None:
    argv = ["--quick", "--audit", audit, "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit_info:
        dp_fedavg.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert named in err and "\n" not in err
    assert not (tmp_path / "out").exists()
