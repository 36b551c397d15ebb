"""``python -m experiments.cross_device --algorithms dp-ftrl`` on bundled digits: DP-FTRL
beside DP-FedAvg at several epsilons (one run each), the accuracy-against-epsilon figure,
the summary rows and the privacy ledger; pfl's noise cohort stated as a guarantee for
another deployment only; DP-FTRL's options refused in one line before any work."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from experiments import cross_device
from tests.argv import override
from tests.secret_keys import MadeKeys, check_randomness_stated

SMALL = [
    "--quick",
    "--datasets", "digits",
    "--clients", "40",
    "--rows-per-client", "20",
    "--cohort", "5",
    "--rounds", "2",
    "--test-size", "100",
]  # fmt: skip


def test_dp_ftrl_beside_dp_fedavg_at_two_epsilons(tmp_path, capsys, monkeypatch):
    made = MadeKeys(monkeypatch)
    out = tmp_path / "xd"
    argv = [*SMALL, "--algorithms", "dp-ftrl", "dp-fedavg", "--epsilons", "2", "8", "--audit", "8"]
    cross_device.main([*argv, "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    runs = {(r["algorithm"], r["epsilon_target"]): r for r in summary["runs"]}
    assert list(runs) == [
        ("dp-ftrl", 2.0),
        ("dp-ftrl", 8.0),
        ("dp-fedavg", 2.0),
        ("dp-fedavg", 8.0),
    ]
    for (_, target), r in runs.items():
        assert target * 0.99 <= r["epsilon"] <= target  # calibrated to each target
        assert r["guarantee"] == "this run's own (user-level)"
    ftrl = runs[("dp-ftrl", 2.0)]
    # the scheme that held: b = min(40 // 5, 2 rounds) = 2, k = ceil(2 / 2) = 1
    assert (ftrl["factorization"], ftrl["schedule"]) == ("blt", "cyclic")
    assert (ftrl["min_separation"], ftrl["max_participations"]) == (2, 1)
    assert ftrl["noise_cohort"] is None and "'blt' matrix factorization" in ftrl["covers"][0]
    assert "factorization" not in runs[("dp-fedavg", 2.0)]
    assert summary["profile"]["epsilons"] == [2.0, 8.0]
    assert (out / "accuracy_vs_epsilon.png").stat().st_size > 0
    assert (out / "epsilon_rounds.png").stat().st_size > 0  # the DP runs' epsilon per round
    assert (out / "accuracy_per_round.png").stat().st_size > 0
    history = pd.read_csv(out / "history.csv")
    assert set(history["run"]) == {
        f"{a}-epsilon-{e}" for a in ("dp-ftrl", "dp-fedavg") for e in (2, 8)
    }
    assert (out / "checkpoints" / "dp-ftrl-epsilon-8").is_dir()
    ledger = json.loads((out / "privacy_ledger.json").read_text())
    *releases, timing = ledger["releases"]
    assert [(r["algorithm"], r["variant"]["epsilon_target"]) for r in releases] == list(runs)
    assert timing["algorithm"] == "wall-clock timing" and not timing["private"]
    client = ledger["composed"]["client"]
    assert client["releases"] == [0, 1, 2, 3]
    assert client["epsilon"] > 8.0  # the four releases published together
    check_randomness_stated(ledger)
    made.assert_not_compiled()  # no secret key a constant of a compiled program
    privacy = json.loads((out / "privacy.json").read_text())
    assert set(privacy) == {f"{a}-epsilon-{e}" for a in ("dp-ftrl", "dp-fedavg") for e in (2, 8)}
    printed = capsys.readouterr().out
    assert "dp-ftrl-epsilon-8" in printed and "privacy ledger:" in printed
    # --audit 8: every DP run's canaries, each seed's bound beside its accounted epsilon
    for r in runs.values():
        assert 0.0 <= r["epsilon_lower"] < math.inf
    for r in releases:
        assert r["audit"]["canaries"] == 8 and r["audit"]["unit"] == "client"
        assert r["audit"]["epsilon"] == pytest.approx(r["epsilon"])
    lines = [line for line in printed.splitlines() if "empirical epsilon >=" in line]
    assert len(lines) == len(releases) and all("accounted epsilon" in x for x in lines)


def test_the_noise_cohort_is_a_guarantee_for_another_deployment_only(tmp_path, capsys):
    out = tmp_path / "xd"
    argv = [*SMALL, "--algorithms", "dp-ftrl", "--epsilons", "8", "--noise-cohort", "20"]
    cross_device.main([*argv, "--factorization", "prefix-sum", "--out", str(out)])
    (row,) = json.loads((out / "summary.json").read_text())["runs"]
    assert row["noise_cohort"] == 20 and row["factorization"] == "prefix-sum"
    assert row["guarantee"].startswith("holds ONLY for a deployment with cohorts of 20 clients")
    assert "no such guarantee" in row["guarantee"]
    assert any("SIMULATED COHORT OF 20" in c for c in row["covers"])
    privacy = json.loads((out / "privacy.json").read_text())
    assert privacy["dp-ftrl"]["guarantee"] == row["guarantee"]
    printed = capsys.readouterr().out
    assert "holds ONLY for a deployment with cohorts of 20 clients" in printed
    ledger = json.loads((out / "privacy_ledger.json").read_text())
    release, timing = ledger["releases"]
    assert timing["algorithm"] == "wall-clock timing"
    assert release["epsilon"] in ("inf", None)  # no epsilon covers this run: never composed
    assert release["variant"]["deployment_epsilon"] == pytest.approx(row["epsilon"])
    assert release["variant"]["guarantee"] == row["guarantee"]
    assert "client" not in ledger["composed"]
    assert ledger["non_private_releases"]["releases"] == [0, 1]


_override = override


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--algorithms", "fedavg", "dp-fedavg", "--factorization", "banded"],
         "--factorization does not apply: it is a DP-FTRL option (add dp-ftrl to --algorithms)"),
        (["--algorithms", "dp-fedavg", "--noise-cohort", "50"], "--noise-cohort does not apply"),
        (["--algorithms", "dp-fedavg", "--min-separation", "1"], "--min-separation does not apply"),
        (["--algorithms", "dp-ftrl", "--min-separation", "5"],
         "--algorithms dp-ftrl: --min-separation 5 must be <= rounds (2)"),
        (["--algorithms", "dp-ftrl", "--max-participations", "2"],
         "--max-participations 2 must be <= ceil(rounds / min_separation) = 1"),
        (["--algorithms", "dp-ftrl", "--noise-cohort", "5"], "--noise-cohort 5 must be > cohort"),
        (["--algorithms", "dp-ftrl", "--schedule", "single", "--max-participations", "1"],
         "--max-participations does not apply: --schedule single"),
        (["--algorithms", "dp-ftrl", "--schedule", "single", "--rounds", "9"],
         "--cohort 5 must be <= num_clients // min_separation"),
        (["--algorithms", "dp-ftrl", "--factorization", "tree"], "--factorization: invalid choice"),
        (["--algorithms", "dp-ftrl", "--epsilons", "2", "2"], "--epsilons lists 2 more than once"),
        (["--algorithms", "fedsgd"], "--algorithms: invalid choice: 'fedsgd'"),
        (["--algorithms", "fedavg", "--audit", "8"], "--audit does not apply"),
        (["--algorithms", "dp-ftrl", "--noise-cohort", "50", "--audit", "8"],
         "--audit with --noise-cohort"),
    ],
    ids=["factorization-no-ftrl", "noise-cohort-no-ftrl", "min-sep-no-ftrl", "min-sep-rounds",
         "participations", "noise-cohort-small", "single-k", "single-cohort", "factorization",
         "epsilon-twice", "unknown", "audit-no-dp", "audit-noise-cohort"],
)  # fmt: skip
def test_bad_input_is_one_line_before_any_work(tmp_path, capsys, monkeypatch, extra, message):
    def no_work(*args, **kwargs):
        raise AssertionError("work started before the arguments were checked")

    monkeypatch.setattr(cross_device, "partition", no_work)
    monkeypatch.setattr(cross_device, "simulate", no_work)
    with pytest.raises(SystemExit) as exc:
        cross_device.main([*_override(SMALL, extra), "--out", str(tmp_path / "bad")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_a_value_from_the_profile_is_named_as_such(tmp_path, capsys, monkeypatch):
    """A refusal names the option that changes a value the user did not give (here the
    quick profile's cohort of 10: 11 rounds of 10 clients once each need 110 clients)."""
    monkeypatch.setattr(cross_device, "simulate", None)  # no run may start
    argv = ["--quick", "--datasets", "digits", "--rows-per-client", "10", "--test-size", "100"]
    argv += ["--algorithms", "dp-ftrl", "--schedule", "single", "--rounds", "11"]
    with pytest.raises(SystemExit) as exc:
        cross_device.main([*argv, "--out", str(tmp_path / "bad")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "the cohort of 10 (the profile's; --cohort changes it) must be <=" in err, err


@pytest.mark.parametrize(
    ("extra", "message"),
    [(["--epsilons", "8", "--bits", "8"], "--bits 8 cannot carry a cohort of 5 at epsilon 8"),
     (["--epsilons", "0.01"], "the default bits per coordinate (--bits changes it) cannot carry")],
    ids=["given", "default"],
)  # fmt: skip
def test_too_few_bits_for_the_model_are_one_line_before_any_run(
    tmp_path, capsys, monkeypatch, extra, message
):
    """What needs the model's size and the clients (a distributed plan's bits against the
    noise its epsilon needs at the rounding's sensitivity) is checked for every run once
    the data is loaded, before the first run starts: one line naming --bits, not a
    traceback from inside the run."""
    monkeypatch.setattr(cross_device, "simulate", None)  # no run may start
    argv = [*SMALL, "--algorithms", "fedavg", "dp-fedavg-secagg", *extra]
    with pytest.raises(SystemExit) as exc:
        cross_device.main([*argv, "--out", str(tmp_path / "bad")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
