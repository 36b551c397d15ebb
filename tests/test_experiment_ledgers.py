"""Every experiment writes a privacy ledger beside its results (issue 35, item 4).

Each experiment runs its ``--quick`` profile with the smallest settings, then:

* ``privacy_ledger.json`` is strict JSON (no ``NaN``/``Infinity`` tokens) and names the
  accountant the command chose;
* it lists every run the experiment wrote, counted from the experiment's own outputs;
* what is private, what is not, the selections and the not-released folders are the ones
  the experiment's privacy model says (``experiments/*`` docstrings);
* a rerun that reuses every saved call (the compute patched to fail) writes the same
  releases, selections and not-released folders.

Also the pieces the ledgers are built from: ``run_sweep(..., ledger=...)`` and PAASO's
releases, APDIM's noise streams and events, Fed-DP-PSO's non-end-to-end runs.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import dp_accounting
import numpy as np
import pandas as pd
import pytest

from experiments import _fed_dp_pso_parts, apdim, combined_learning, fed_dp_pso, paaso
from experiments import fed_dp_pso_study as study
from swarmjax import resume, sweep
from swarmjax.paaso_sweep import (
    AGENT_RELATION,
    NOT_RELEASED,
    PAASOTask,
    expand_phi,
    run_release,
)
from swarmjax.privacy.accounting import PureDpEvent, event_epsilon
from swarmjax.privacy.ledger import JSON_NAME, MARKDOWN_NAME, Ledger, saved_releases
from swarmjax.privacy.mechanisms import random_dictatorship_epsilon
from swarmjax.privacy.secret import (
    GENERATOR,
    SUPPLIED_CONDITION,
    Secret,
    fingerprints,
    joint_fingerprint,
    randomness,
)
from tests.secret_keys import MadeKeys, check_randomness_stated
from tests.test_released_files import check_released_files


@pytest.fixture(autouse=True)
def _fixed_code_fingerprint(monkeypatch):
    """Saved calls keyed by a fixed code fingerprint: a rerun must reuse them even when the
    package's source changes between the two runs (others editing the checkout)."""
    monkeypatch.setattr(resume, "code_fingerprint", lambda *code: "fixed")
    monkeypatch.setattr(paaso, "code_fingerprint", lambda *code: "fixed")


def _no_constant(name: str):
    raise AssertionError(f"the ledger holds the non-JSON constant {name}")


_MADE: list[MadeKeys] = []  # the current test's recorder of secret keys


@pytest.fixture(autouse=True)
def _record_secret_keys(monkeypatch):
    """Record every secret key the test makes, for :func:`_ledger`'s search of the
    programs compiled during the test (``tests/secret_keys.py``)."""
    _MADE[:] = [MadeKeys(monkeypatch)]


def _ledger(out, accountant: str) -> dict:
    """The ledger file of ``out``, checked strict JSON, naming ``accountant``, equal to
    what :meth:`Ledger.load` recomputes from its events, and complete: every private
    release states the secret its noise came from and its key's fingerprint, so no
    composed statement has releases of unstated randomness."""
    text = (out / JSON_NAME).read_text()
    assert "NaN" not in text and "Infinity" not in text
    data = json.loads(text, parse_constant=_no_constant)
    assert (out / MARKDOWN_NAME).stat().st_size > 0
    assert data["accountant"] == accountant
    assert {r["accountant"] for r in data["releases"]} == {accountant}
    loaded = Ledger.load(out / JSON_NAME)
    for unit, comp in loaded.composed().items():
        stated = data["composed"][unit]["epsilon"]
        assert stated == "inf" if math.isinf(comp.epsilon) else stated == comp.epsilon
    check_randomness_stated(data)
    _MADE[0].assert_not_compiled()
    return data


def _same_entries(first: dict, second: dict) -> None:
    """Two writes of one experiment list the same releases, selections and folders."""
    for key in ("releases", "selections", "not_released", "composed", "non_private_releases"):
        assert second[key] == first[key], key


def _must_not_run(*args, **kwargs):
    raise RuntimeError("a saved call ran again")


# ---------------------------------------------------------------------------- fed_dp_pso


def test_fed_dp_pso_ledger(tmp_path, monkeypatch):
    """Fed-DP-PSO's models are chosen by exact scores: its runs are NOT private (with the
    epsilon of their DP-Adam steps as a label); the Fig. 3 FedAvg + DP-Adam run is a
    record-level DP release at --delta by --accountant."""
    argv = ["--quick", "--rounds", "1", "--epsilons", "5", "--particles", "2"]
    argv += ["--accountant", "rdp", "--delta", "1e-4", "--out", str(tmp_path)]
    fed_dp_pso.main(argv)
    data = _ledger(tmp_path, "rdp")
    pso_runs = pd.read_csv(tmp_path / "rounds.csv")[["epsilon_target", "seed"]].drop_duplicates()
    fig3_runs = len(pd.read_csv(tmp_path / "fig3.csv"))  # one seed per epsilon
    releases = data["releases"]
    assert len(releases) == len(pso_runs) + fig3_runs == 2
    pso, fedavg = releases
    assert pso["algorithm"] == "fed_dp_pso" and not pso["private"] and pso["epsilon"] == "inf"
    assert "exact statistic" in pso["variant"]["not_covered"]
    assert 0 < pso["variant"]["epsilon_of_covered_steps"] <= 5.0
    assert fedavg["algorithm"] == "fedavg_dp_adam" and fedavg["private"]
    assert fedavg["unit"] == "record" and fedavg["delta"] == 1e-4 and fedavg["epsilon"] <= 5.0
    assert fedavg["path"] == str(tmp_path / "fig3.csv")
    assert data["non_private_releases"]["releases"] == [0]
    assert data["composed"]["record"]["releases"] == [1]
    assert data["selections"] == []
    # the call store (its cache and each call's secret) is never released
    (kept,) = data["not_released"]
    assert kept["folder"].startswith(str(tmp_path / "calls")) and "secret" in kept["why"]
    monkeypatch.setattr(fed_dp_pso, "simulate", _must_not_run)
    monkeypatch.setattr(_fed_dp_pso_parts, "simulate", _must_not_run)
    fed_dp_pso.main(argv)
    _same_entries(data, _ledger(tmp_path, "rdp"))
    check_released_files(tmp_path, fed_dp_pso)  # each file a release, public or kept back


def test_fed_dp_pso_study_ledger(tmp_path, monkeypatch):
    """The study's runs (epsilon inf: no DP) and its readings compared per cell on the
    validation split, held out of the client pool: selections by a public score."""
    argv = ["--quick", "--readings", "current", "authors", "--no-partition-readings"]
    argv += ["--accountant", "rdp", "--out", str(tmp_path)]
    study.main(argv)
    data = _ledger(tmp_path, "rdp")
    runs = pd.read_csv(tmp_path / "runs.csv")  # one row per run and seed
    *releases, partitions = data["releases"]  # and the partitions' label statistics
    assert len(releases) == len(runs) == 6
    assert not any(r["private"] for r in data["releases"])
    assert partitions["algorithm"] == "partition statistics"
    assert "class counts" in partitions["variant"]["not_covered"]
    cells = runs.groupby(["dataset", "partition", "epsilon"]).size()
    assert len(data["selections"]) == len(cells) == 3
    for selection in data["selections"]:
        assert selection["score"] == "public" and selection["event"] is None
        readings = {data["releases"][i]["path"] for i in selection["candidates"]}
        assert len(selection["candidates"]) == 2 and readings == {str(tmp_path / "rounds.csv")}
    monkeypatch.setattr(study, "simulate", _must_not_run)
    study.main(argv)
    _same_entries(data, _ledger(tmp_path, "rdp"))
    check_released_files(tmp_path, study)


def test_fed_dp_pso_lists_runs_that_are_not_end_to_end_as_not_private():
    """The rule behind Fed-DP-PSO's listing (saved_releases), on a run with a record that
    covers everything and on the same run whose record names an exact statistic."""

    class Record:
        unit, relation, delta, accountant, shares_randomness = "record", "zero-out", 1e-5, "pld", 0
        final_epsilon = np.array([[0.5, 0.7]])
        covers = ("upload.model: accounted",)
        not_covered: tuple[str, ...] = ()

        def run_events(self, run):
            return [(None, PureDpEvent(0.7), 0.0)]

    class Result:
        privacy = Record()
        runs = pd.DataFrame({"epsilon_target": [1.0], "seed": [3]})

    (whole,) = saved_releases(Result(), algorithm="x", path="h.csv")
    assert whole["private"] and whole["epsilon"] == 0.7 and whole["seed"] == 3
    Record.not_covered = ("train.score: unprotected",)
    (partial,) = saved_releases(Result(), algorithm="x", path="h.csv")
    assert not partial["private"] and partial["groups"] == [] and partial["epsilon"] == math.inf
    assert partial["variant"]["epsilon_of_covered_steps"] == 0.7
    assert partial["variant"]["not_covered"] == "train.score: unprotected"


def test_fed_dp_pso_flower_runs_are_listed_as_not_private(tmp_path):
    """``--runtime flower``: the deployment and its simulator twin, at the run's delta,
    and the operator-only folder as not released."""
    server = pytest.importorskip("swarmjax.fl.runtime.flower.server")
    (tmp_path / "flower" / server.RELEASED).mkdir(parents=True)
    (tmp_path / "flower" / server.RELEASED / "privacy.json").write_text('{"delta": 2e-5}')
    ledger = Ledger(tmp_path, "fed_dp_pso")
    config = {"target-epsilon": 5.0, "reading": "paper"}
    fed_dp_pso._flower_ledger(ledger, config, {"epsilon": [[4.1, 4.9]]}, tmp_path)
    assert [r.algorithm for r in ledger.releases] == [
        "fed_dp_pso (flower)",
        "fed_dp_pso (simulator)",
    ]
    assert ledger.non_private == (0, 1)
    assert {r.delta for r in ledger.releases} == {2e-5}
    assert ledger.releases[0].variant["epsilon_of_covered_steps"] == 4.9
    assert ledger.not_released[0]["folder"] == str(tmp_path / "flower" / "operator")


def test_fed_dp_pso_flower_takes_the_delta_and_refuses_another_accountant():
    args = fed_dp_pso.parse_args(["--runtime", "flower", "--quick", "--epsilons", "5"])
    assert "delta" not in fed_dp_pso.flower_config(args)  # the task's own default
    args = fed_dp_pso.parse_args(["--runtime", "flower", "--epsilons", "5", "--delta", "1e-6"])
    assert fed_dp_pso.flower_config(args)["delta"] == 1e-6
    args = fed_dp_pso.parse_args(["--runtime", "flower", "--epsilons", "5", "--accountant", "rdp"])
    with pytest.raises(fed_dp_pso._cli.UserError, match="--accountant"):
        fed_dp_pso.flower_config(args)


def rerun_from_saved_calls(main, argv, first, out, capsys) -> str:
    """Rerun ``main(argv)`` (its compute patched to fail by the caller): the same
    ``summary.csv`` as ``first``; returns what the rerun printed."""
    capsys.readouterr()
    main(argv)
    log = capsys.readouterr().out
    pd.testing.assert_frame_equal(pd.read_csv(out / "summary.csv"), first)
    return log


# ----------------------------------------------------------------------- combined_learning


def test_combined_learning_ledger_and_resume(tmp_path, monkeypatch, capsys):
    """No run has DP: every run (CL, FedAvg, each client alone per split; the centralised
    model) is listed as not private, with its setting's labels. The same run resumes: a
    rerun reuses every finished setting (same summary and ledger), ``--restart`` computes
    again (compute patched to fail)."""
    argv = ["--quick", "--rounds", "1", "--out", str(tmp_path)]
    combined_learning.main(argv)
    first = pd.read_csv(tmp_path / "summary.csv")
    assert set(first.split) == {"uniform", "arbitrary"} and first.K.eq(2).all()  # 2 classes
    assert first[["CL_final", "FedAvg_final", "central_final"]].stack().between(0, 1).all()
    data = _ledger(tmp_path, "pld")
    history = pd.read_csv(tmp_path / "history.csv")
    central = pd.read_csv(tmp_path / "central.csv")
    runs = len(history[["split", "method", "seed"]].drop_duplicates()) + central.seed.nunique()
    assert len(data["releases"]) == runs == 7
    assert data["non_private_releases"]["releases"] == list(range(runs))
    assert data["composed"] == {}
    methods = {(r["algorithm"], r["variant"].get("split")) for r in data["releases"]}
    assert methods == {("central", None)} | {
        (m, s) for m in ("CL", "FedAvg", "alone") for s in ("uniform", "arbitrary")
    }
    monkeypatch.setattr(combined_learning, "run_setting", _must_not_run)
    monkeypatch.setattr(combined_learning, "run_central", _must_not_run)
    log = rerun_from_saved_calls(combined_learning.main, argv, first, tmp_path, capsys)
    assert "uniform_K2" in log
    _same_entries(data, _ledger(tmp_path, "pld"))
    # no run draws a secret (no DP); the call store is kept back all the same
    assert [n["folder"] for n in data["not_released"]] == [
        str(p) for p in (tmp_path / "calls").iterdir()
    ]
    check_released_files(tmp_path, combined_learning, secrets=False)
    with pytest.raises(RuntimeError, match="ran again"):  # last: it may clear the folder
        combined_learning.main([*argv, "--restart"])


# ----------------------------------------------------------------------------------- apdim


def test_apdim_ledger_and_resume(tmp_path, monkeypatch, capsys, data_dir):
    """The correct mode's noised tables are record-level DP releases (per-feature Laplace
    events, the table's client id, epsilon as claimed); the paper mode's, the clean
    baseline, the attack scores and the plans are listed as not private. The same run
    resumes: a rerun reuses both saved calls (same summary and ledger), another ``--seeds``
    computes again (compute patched to fail)."""
    argv = ["--quick", "--datasets", "heart", "--skip-timing", "--data-dir", str(data_dir)]
    argv += ["--delta", "1e-6", "--out", str(tmp_path)]
    apdim.main(argv)
    first = pd.read_csv(tmp_path / "summary.csv")
    assert set(first.dataset) == {"heart"} and set(first["mode"]) == {"correct", "paper"}
    assert first[["f1_apdim", "f1_uniform"]].stack().between(0, 1).all()
    data = _ledger(tmp_path, "pld")
    f1 = pd.read_csv(tmp_path / "f1.csv")
    noised = f1[f1["mode"] != "clean"][["mode", "mechanism", "epsilon", "seed"]]
    params = pd.read_csv(tmp_path / "params.csv")
    tables = len(noised.drop_duplicates()) + len(params)
    releases = data["releases"]
    assert len(releases) == tables + 4 == 20  # + clean baseline, attack scores, plans, seconds
    private = [r for r in releases if r["private"]]
    correct = len(noised.query("mode == 'correct'").drop_duplicates())
    assert len(private) == correct + len(params.query("mode == 'correct'")) == 8
    for r in private:
        assert r["relation"] == apdim.RELATION and r["delta"] == 1e-6
        assert r["epsilon"] == pytest.approx(r["variant"]["epsilon"], rel=1e-6)
        ((group,),) = [r["groups"]]
        assert group["clients"] == [list(apdim.DATASETS).index("heart")]
    paper = [r for r in releases if r["variant"].get("mode") == "paper"]
    assert len(paper) == 8 and not any(r["private"] for r in paper)
    assert all(r["variant"]["record_epsilon"] > 50 * r["variant"]["epsilon"] for r in paper)
    assert {r["algorithm"] for r in releases if not r["private"]} >= {"attack", "apdim_plan"}
    assert data["composed"]["record"]["epsilon"] <= sum(r["epsilon"] for r in private) + 1e-9
    # every noised table states its call's fresh secret and its own key (distinct keys)
    drawn = [r["randomness"] for r in releases if r["variant"].get("mode") in ("correct", "paper")]
    assert len(drawn) == 16 and {d["secret"] for d in drawn} == {"entropy"}
    assert len({d["fingerprint"] for d in drawn}) == 16
    assert data["composed"]["record"]["randomness"]["unstated"] == []
    monkeypatch.setattr(apdim, "run_utility", _must_not_run)
    monkeypatch.setattr(apdim, "run_params", _must_not_run)
    log = rerun_from_saved_calls(apdim.main, argv, first, tmp_path, capsys)
    assert "utility_heart" in log and "params_heart" in log
    _same_entries(data, _ledger(tmp_path, "pld"))
    check_released_files(tmp_path, apdim)  # each file a release, public or kept back
    with pytest.raises(RuntimeError, match="ran again"):  # last: it writes into the folder
        apdim.main([*argv, "--seeds", "2"])


def test_apdim_releases_never_share_noise():
    """Every (table, plan, seed) draws from its own seed: the same key under two plans would
    be one standard Laplace draw at two scales, and two such rows give the clean row."""
    seeds = {
        apdim.release_seed(name, mode, mechanism, seed)
        for name in apdim.DATASETS
        for mode, mechanism in apdim.PLANS
        for seed in range(5)
    }
    assert len(seeds) == len(apdim.DATASETS) * len(apdim.PLANS) * 5


def test_apdim_event_is_the_rows_per_feature_laplace_composition():
    """The event of a row is its features' Laplace mechanisms: at a tiny delta its epsilon
    is the pure epsilon sum 1 / scale; equal scales fold into one self-composition."""
    scales = [2.0, 4.0, 4.0]
    event = apdim.laplace_event(scales)
    assert event == dp_accounting.ComposedDpEvent(
        [
            dp_accounting.LaplaceDpEvent(2.0),
            dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(4.0), 2),
        ]
    )
    assert event_epsilon(event, 1e-12) == pytest.approx(1.0, abs=1e-6)
    release = apdim.table_release(
        "cmc", {"mechanism": "uniform", "epsilon": 1.0}, scales, 0, private=True, path="f1.csv",
        delta=1e-5, accountant="pld",
    )  # fmt: skip
    assert release.algorithm == "uniform_laplace" and release.epsilon == pytest.approx(1.0)
    assert release.groups[0][0] == (list(apdim.DATASETS).index("cmc"),)


# ----------------------------------------------------------------------------------- paaso


def _sweep_configs(folder) -> int:
    rows = sweep.load_results(folder)
    columns = [c for c in rows.columns if c not in _OUTPUTS]
    return len(rows[columns].drop_duplicates())


_OUTPUTS = {"chunk", "run_id", "seed", "final_objective", "gap", "x1", "x2", "nonfinite"}
_OUTPUTS |= {"mean_voters", "drd_eps_mean", "drd_eps_bound", "drd_eps_basic"}
_OUTPUTS |= {"drd_eps_advanced", "pram_eps_vote", "pram_eps_basic"}


def test_paaso_ledger(tmp_path, monkeypatch):
    """One release per configuration of every sweep (voting: agent-level DP, each run from
    its own secret key, so the configurations compose to a finite joint epsilon; PSO and
    FL: not private), the best configuration per (strategy, function) as public
    selections, the sweep folders (their raw rows and secrets) as not released. The
    figures are drawn but not rendered to PNG/PDF (half the run's time; the ledger never
    lists them, and the PAASO figures are checked in tests/test_experiment_report.py)."""
    from matplotlib.figure import Figure

    monkeypatch.setattr(paaso, "_setup_devices", lambda count: None)  # JAX already started
    monkeypatch.setattr(Figure, "savefig", lambda self, *args, **kwargs: None)
    argv = ["--quick", "--runs", "2", "--iterations", "10", "--no-progress"]
    argv += ["--cpu-devices", "1", "--out", str(tmp_path)]
    paaso.main(argv)
    data = _ledger(tmp_path, "pld")
    folders = sorted(p for p in (tmp_path / "calls").glob("*/*") if p.is_dir())
    assert len(data["releases"]) == sum(_sweep_configs(f) for f in folders)
    assert sorted(n["folder"] for n in data["not_released"]) == [str(f) for f in folders]
    assert len(folders) == 7  # search, fig1 .. fig5, kalpha
    assert {n["why"] for n in data["not_released"]} == {NOT_RELEASED}
    for r in data["releases"]:
        voting = r["algorithm"] in ("paaso_adrd", "paaso_bdrd", "paaso_pbdrd")
        assert r["private"] == voting
        assert r["randomness"]["secret"] == "entropy"  # each sweep's own fresh secret
        assert len(r["randomness"]["fingerprint"]) == 32  # of the configuration's run keys
        assert r["variant"]["runs"] == 2
        if voting:
            assert r["unit"] == "client" and r["relation"] == AGENT_RELATION
    # each configuration's swarms are its own data source (parallel composition): one
    # finite statement per configuration, equal to its release's epsilon
    voting = [r for r in data["releases"] if r["private"]]
    composed = data["composed"]
    assert len(composed) == len(voting) == len({r["data"] for r in voting})
    by_source = {r["data"]: float(r["epsilon"]) for r in voting}
    for key, statement in composed.items():
        assert key.startswith("client:paaso swarms ")
        assert float(statement["epsilon"]) == pytest.approx(by_source[key.split(":", 1)[1]])
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert len(data["selections"]) == len(summary) == 5
    for selection, strategy in zip(data["selections"], sorted(summary.strategy), strict=True):
        assert selection["score"] == "public" and strategy in selection["name"]
        chosen = {data["releases"][i]["algorithm"] for i in selection["candidates"]}
        assert chosen == {f"paaso_{strategy}"}
    monkeypatch.setattr(sweep._Compiled, "__call__", _must_not_run)
    paaso.main(argv)
    _same_entries(data, _ledger(tmp_path, "pld"))


def test_paaso_readings_study_lists_every_configuration(tmp_path, monkeypatch):
    """``--readings-study``: each table's configurations (the studies patched to return a
    table of two rows each) become releases written at the table's CSV."""
    from experiments import _paaso_readings as readings

    tables = {
        "run_readings": pd.DataFrame(
            {"strategy": ["pso", "pbdrd"], "inertia": "typo", "w": 0.4, "vmax_factor": 0.1,
             "clip_positions": True, "fl_rule": ["-", "direction"], "speed": [np.nan, 5.0],
             "mean_100": [1.0, 2.0]}
        ),
        "run_agents_study": pd.DataFrame(
            {"vmax_factor": 0.1, "speed": 5.0, "num_agents": [50, 200], "area_300": [3.0, 2.0]}
        ),
        "run_fl_step_study": pd.DataFrame(
            {"setting": ["Fig. 2", "Fig. 4"], "w": [0.4, 0.005], "w_g": [0.005, 0.01],
             "speed": 5.0, "mean_100": [4.0, 5.0]}
        ),
    }  # fmt: skip
    seen = []
    for name, table in tables.items():

        def study_table(runs, iterations, table=table, name=name, secret=None):
            seen.append((name, runs, iterations))
            return table

        monkeypatch.setattr(readings, name, study_table)
    ledger = Ledger(tmp_path, "paaso", delta=1e-3)
    args = paaso.parse_args(["--out", str(tmp_path)])
    args.out, args.ledger = tmp_path, ledger
    paaso._readings_study(args, {"runs": 3, "iterations": 7})
    assert seen == [("run_readings", 3, 7), ("run_agents_study", 6, 7), ("run_fl_step_study", 3, 7)]
    algorithms = [r.algorithm for r in ledger.releases]
    assert algorithms == ["paaso_pso", "paaso_pbdrd", *["paaso_bdrd"] * 2, *["paaso_fl"] * 2]
    assert ledger.non_private == (0, 4, 5)
    pso, pbdrd, bdrd50, bdrd200 = ledger.releases[:4]
    assert "speed" not in pso.variant and pbdrd.variant["speed"] == 5.0
    assert pbdrd.variant["iterations"] == 7 and pbdrd.variant["seeds"] == "0..2"
    assert bdrd200.variant["seeds"] == "0..5" and bdrd200.epsilon > bdrd50.epsilon
    assert bdrd50.path == str(tmp_path / "readings_agents.csv")
    assert (tmp_path / "readings_fl_step.csv").exists()
    # each study keyed by a fresh secret of its own: every release says so (no fingerprint:
    # the study's keys are folded per table row, see experiments/_paaso_readings.py)
    assert {r.secret for r in ledger.releases} == {"entropy"}
    assert {r.randomness["generator"] for r in ledger.releases} == {GENERATOR}
    for statement in ledger.composed().values():  # one per configuration's swarms
        assert "keyed by operating-system entropy" in statement.statement("paaso", "f")


def test_the_readings_studies_fingerprint_each_configurations_keys():
    """Each row of a readings study carries the joint fingerprint of its runs' keys: the
    study's secret with the configuration's index and the run folded in (derived here with
    ``jax.random.fold_in``), distinct per row; its release states it with the secret's
    source (tiny studies: 2 runs of 4 iterations)."""
    import jax

    from experiments import _paaso_readings as readings

    secret = Secret.from_bytes(b"a test secret for the readings studies")
    root = secret.key()

    def joint(config: int, runs: int) -> str:
        keys = [jax.random.fold_in(jax.random.fold_in(root, config), r) for r in range(runs)]
        return joint_fingerprint(fingerprints(jax.numpy.stack(keys)))

    table = readings.run_readings(
        runs=2, iterations=4, strategies=("bdrd",), vmax_factors=(0.1,), speeds=(1.0, 5.0),
        fl_rules=("direction",), clip_positions=(True,), secret=secret,
    )  # fmt: skip
    assert len(table) == 4  # 2 inertias x 2 speeds
    assert list(table.key_fingerprint) == [joint(c, 2) for c in range(4)]
    agents = readings.run_agents_study(
        runs=2, iterations=4, agents=(5, 6), readings=((0.1, 1.0), (0.1, 5.0)), early=2,
        secret=secret,
    )  # fmt: skip
    # rows by (reading i, agent count a); keys by a * readings + i
    want = [joint(a * 2 + i, 2) for i in range(2) for a in range(2)]
    assert list(agents.key_fingerprint) == want
    step = readings.run_fl_step_study(runs=2, iterations=4, speeds=(1.0,), secret=secret)
    assert list(step.key_fingerprint) == [joint(0, 2), joint(1, 2)]
    drawn = randomness(secret.source, False)
    labels = ["vmax_factor", "speed", "num_agents"]
    on = {"seeds": 2, "iterations": 4, "delta": 1e-3, "accountant": "pld"}
    released = paaso.study_releases(agents, labels, "a.csv", randomness=drawn, **on)
    assert [r.fingerprint for r in released] == want
    assert {r.secret for r in released} == {"supplied"}


def test_the_readings_keys_are_never_constants_of_a_compiled_program(monkeypatch):
    """The study's secret key reaches its program as an argument: a program that closed
    over it would hold its words as constants, which any persistent compilation cache
    writes to disk (measured: a closed-over key's words are in the cached executable)."""
    import jax

    from experiments import _paaso_readings as readings

    secret = Secret.from_bytes(b"a test secret for the readings studies")
    words = [str(int(w)) for w in np.asarray(jax.random.key_data(secret.key()))]
    texts, real_jit = [], jax.jit

    def spy(fun, **kwargs):
        jitted = real_jit(fun, **kwargs)

        def call(*args):
            texts.append(jitted.lower(*args).as_text())
            return jitted(*args)

        return call

    monkeypatch.setattr(readings.jax, "jit", spy)
    readings.study_keys(secret, 0, 2, 2)
    assert len(texts) == 1 and not any(w in texts[0] for w in words)
    root = secret.key()
    closed = real_jit(lambda i: jax.random.key_data(jax.random.fold_in(root, i)))
    assert all(w in closed.lower(np.uint32(0)).as_text() for w in words)  # the check bites
    _MADE[0].assert_not_compiled()  # the study's programs, cached by this suite
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):  # the cache search bites too
        closed(np.uint32(0)).block_until_ready()
        with pytest.raises(AssertionError, match="a secret key is compiled into"):
            _MADE[0].assert_not_compiled()


GRID = {
    "function": "f4",
    "num_agents": 10,
    "k_alpha": 4,
    "iterations": 5,
    "w": 0.4,
    "phi": 1.0,
    "seed": [0, 1, 2],
}


def test_run_sweep_adds_one_release_per_configuration(tmp_path):
    """One voting configuration: a finite agent-level epsilon, the DRD bound composed over
    the iterations; a second one draws its own keys, so the unit composes both."""
    ledger = Ledger(tmp_path / "ledger", "sweep", delta=1e-3, accountant="rdp")
    grid = expand_phi({**GRID, "strategy": ["pso", "bdrd"]})
    rows = sweep.run_sweep(PAASOTask(), grid, tmp_path / "a", progress=False, ledger=ledger)
    assert len(rows) == 6 and len(ledger.releases) == 2
    pso, bdrd = sorted(ledger.releases, key=lambda r: r.algorithm != "paaso_pso")
    assert not pso.private and bdrd.unit == "client" and bdrd.seed is None
    assert bdrd.variant["runs"] == 3 and bdrd.variant["seeds"] == "0..2"
    bound = float(random_dictatorship_epsilon(np.asarray(10 + 4)))
    event = dp_accounting.SelfComposedDpEvent(PureDpEvent(bound), 5)
    assert bdrd.groups == ((None, event, 0.0),)
    assert bdrd.epsilon == pytest.approx(event_epsilon(event, 1e-3, accountant="rdp"))
    assert ledger.composed()["client"].epsilon == pytest.approx(bdrd.epsilon)
    assert bdrd.data.startswith("paaso swarms ") and bdrd.data != pso.data
    assert bdrd.path == str(tmp_path / "a")
    assert ledger.not_released == ({"folder": str(tmp_path / "a"), "why": NOT_RELEASED},)
    grid = expand_phi({**GRID, "strategy": "pbdrd", "p_m": 0.8})
    sweep.run_sweep(
        PAASOTask(), grid, tmp_path / "b", progress=False, ledger=ledger, release_path="fig.csv"
    )
    pbdrd = ledger.releases[-1]
    assert pbdrd.path == "fig.csv" and pbdrd.variant["pram_epsilon_per_vote"] > 0
    # two configurations: two sets of swarms, composed apart (parallel composition)
    both = ledger.composed()
    assert sorted(both) == sorted(f"client:{r.data}" for r in (bdrd, pbdrd))
    assert both[f"client:{bdrd.data}"].epsilon == pytest.approx(bdrd.epsilon)


def test_a_sweeps_releases_state_the_secret_and_their_runs_keys(tmp_path):
    """Each configuration's release states what drew its runs: the generator, the sweep's
    secret's source and the joint fingerprint of its runs' keys, which are the saved
    secret's key with each run id's two words folded in (recomputed here with
    ``jax.random.fold_in``); a resumed sweep states the same; a supplied secret is stated
    as supplied, with its condition; and the ledger refuses a second release of one
    configuration's keys."""
    import jax

    grid = expand_phi({**GRID, "strategy": ["pso", "bdrd"], "k_alpha": [4, 5]})
    ledger = Ledger(tmp_path / "ledger", "sweep", delta=1e-3)
    rows = sweep.run_sweep(PAASOTask(), grid, tmp_path / "a", progress=False, ledger=ledger)
    root = Secret.load(tmp_path / "a" / sweep.SWEEP_SECRET).key()
    by_config = {}
    for r in ledger.releases:
        assert r.secret == "entropy" and r.randomness["generator"] == GENERATOR
        assert r.randomness["condition"] is None and not r.randomness["common_random_numbers"]
        mine = (rows.strategy == r.algorithm[6:]) & (rows.k_alpha == r.variant["k_alpha"])
        ids = rows.run_id[mine]
        keys = []
        for run_id in ids:  # low word, then high word
            key = jax.random.fold_in(root, np.uint32(int(run_id, 16) & 0xFFFFFFFF))
            keys.append(jax.random.fold_in(key, np.uint32(int(run_id, 16) >> 32)))
        assert len(keys) == 3
        want = joint_fingerprint(reversed(fingerprints(jax.numpy.stack(keys))))
        assert r.fingerprint == want
        by_config[(r.algorithm, r.variant["k_alpha"])] = r.fingerprint
    assert len(by_config) == len(set(by_config.values())) == 3  # PSO has no k_alpha
    again = Ledger(tmp_path / "again", "sweep", delta=1e-3)
    sweep.run_sweep(PAASOTask(), grid, tmp_path / "a", progress=False, ledger=again)
    assert {(r.algorithm, r.variant["k_alpha"]): r.fingerprint for r in again.releases} == by_config
    with pytest.raises(ValueError, match="drew the same noise"):
        again.add(next(r for r in again.releases if r.private))
    supplied = Secret.from_bytes(b"sixteen or more bytes of a test secret")
    other = Ledger(tmp_path / "other", "sweep", delta=1e-3)
    sweep.run_sweep(
        PAASOTask(), grid, tmp_path / "b", progress=False, ledger=other, secret=supplied
    )
    assert {r.secret for r in other.releases} == {"supplied"}
    assert {r.randomness["condition"] for r in other.releases} == {SUPPLIED_CONDITION}
    assert not set(by_config.values()) & {r.fingerprint for r in other.releases}


def test_run_sweep_refuses_a_ledger_it_cannot_fill_before_any_work(tmp_path):
    grid = expand_phi({**GRID, "strategy": "pso"})
    without_delta = Ledger(tmp_path / "ledger", "sweep")

    class NoReleases(PAASOTask):
        releases = None

    for task, ledger, match in (
        (PAASOTask(), without_delta, "Ledger\\(\\.\\.\\., delta=\\.\\.\\.\\)"),
        (PAASOTask(), "ledger.json", "must be a swarmjax.privacy.ledger.Ledger"),
        (NoReleases(), Ledger(tmp_path / "l", "s", delta=1e-3), "has no releases"),
    ):
        with pytest.raises(ValueError, match=match):
            sweep.run_sweep(task, grid, tmp_path / "sweep", progress=False, ledger=ledger)
    assert not (tmp_path / "sweep").exists()


def test_run_release_checks_its_configuration():
    with pytest.raises(ValueError, match="strategy"):
        run_release({"strategy": "voting"}, [0], "x", delta=1e-3, accountant="pld")
    with pytest.raises(ValueError, match="seeds"):
        run_release({"strategy": "pso"}, [], "x", delta=1e-3, accountant="pld")
    config = {"strategy": "adrd", "num_agents": 5, "k_alpha": 1, "iterations": 3}
    with pytest.raises(ValueError, match="k_alpha"):
        run_release(config, [0], "x", delta=1e-3, accountant="pld")


def test_the_params_grid_states_the_keys_its_runs_drew_from():
    """Run ``i`` of the (theta, alpha) grid draws from the call's secret with
    ``PARAMS_STREAM`` and ``i`` folded in (derived here step by step), the key whose
    fingerprint its release states."""
    import jax

    secret = Secret.from_bytes(b"a test secret for the params grid")
    root = jax.random.fold_in(secret.key(), apdim.PARAMS_STREAM)
    want = fingerprints(jax.numpy.stack([jax.random.fold_in(root, i) for i in range(3)]))
    assert fingerprints(apdim.params_keys(secret, 3)) == want
    noise = [{"mode": "correct", "theta": 0.5, "alpha": a, "epsilon": 1.0, "scales": [1.0]}
             for a in (0.1, 0.2, 0.3)]  # fmt: skip
    released = apdim.params_releases("heart", noise, Path("."), delta=1e-3, accountant="pld",
                                     secret=secret)  # fmt: skip
    assert [r.fingerprint for r in released] == list(want)
