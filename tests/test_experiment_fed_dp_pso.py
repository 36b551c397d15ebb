"""``python -m experiments.fed_dp_pso --quick`` end to end (digits, bundled: no download).

One short run (1 round, epsilon 5 only, no Fig. 3 baseline) checks that the command writes
its tables, per-round history, communication table, figures and summary, and that the table
states the plan it ran (including the option chosen for scoring particles); rerunning it
resumes from the saved call without computing anything. The checks share one test so that
the run happens once even when pytest-xdist spreads tests over workers.
"""

from __future__ import annotations

import json
from dataclasses import replace

import jax
import numpy as np
import pandas as pd
import pytest

from experiments import fed_dp_pso
from swarmjax.fl.algorithms.fed_dp_pso import paper_model, reading_hyper
from swarmjax.fl.protocol import Variants
from swarmjax.fl.runtime.flower.task import load_task
from swarmjax.models import mlp, param_bytes
from swarmjax.privacy.secret import Secret


def test_quick_run_writes_its_results_and_states_its_plan(tmp_path, monkeypatch, capsys) -> None:
    """Also ``--audit 16``: this run is the audited run of the record-level canaries inside
    Fed-DP-PSO's clients (:func:`_check_audit`; one experiment run for both, 2026-11-28)."""
    options = ["--rounds", "1", "--epsilons", "5", "--no-fig3", "--selection-metric", "error"]
    options += ["--audit", "16"]
    fed_dp_pso.main(["--quick", *options, "--out", str(tmp_path)])
    _check_audit(tmp_path, capsys.readouterr().out)
    _check_files(tmp_path)
    _check_cells(tmp_path)
    _check_plan(tmp_path)
    _check_resume(tmp_path, options, monkeypatch, capsys)


def _check_audit(out, printed: str) -> None:
    """``experiments.fed_dp_pso --audit``: the DP run's bound beside its epsilon, in the
    ledger's release and the cells; the record-level canaries of each client (moved here
    from tests/test_canaries_record_clients.py, whose drills audit the same clients)."""
    lines = [s for s in printed.splitlines() if s.startswith("  audit digits iid eps=5.0 seed=0")]
    assert len(lines) == 1 and "empirical epsilon >=" in lines[0]
    assert "record-level" in lines[0] and "canaries in" in lines[0]
    ledger = json.loads((out / "privacy_ledger.json").read_text())
    audits = [r["audit"] for r in ledger["releases"] if r["algorithm"] == "fed_dp_pso"]
    dp = [a for a in audits if a is not None]
    assert len(dp) == 1 and len(audits) == 1
    assert dp[0]["canaries"] == 16 * fed_dp_pso.NUM_CLIENTS and dp[0]["unit"] == "record"
    assert 0.0 <= dp[0]["epsilon_lower"] <= dp[0]["epsilon"] <= 5.0
    cells = json.loads((out / "summary.json").read_text())["cells"]
    finite = [c for c in cells if c["epsilon"] == 5.0]
    assert finite[0]["epsilon_lower"] == dp[0]["epsilon_lower"]


def _check_resume(out, options, monkeypatch, capsys) -> None:
    """The same command again reuses the finished call; other settings or --restart rerun."""
    first = pd.read_csv(out / "cells.csv")

    def must_not_run(*args, **kwargs):
        raise RuntimeError("Fed-DP-PSO ran again")

    monkeypatch.setattr(fed_dp_pso, "simulate", must_not_run)
    capsys.readouterr()
    fed_dp_pso.main(["--quick", *options, "--out", str(out)])
    assert "resumed from disk" in capsys.readouterr().out
    second = pd.read_csv(out / "cells.csv")
    pd.testing.assert_frame_equal(second, first)
    resumed = json.loads((out / "summary.json").read_text())["resumed_calls"]
    assert resumed == ["digits_iid_eps5", "comm_digits"]
    for changed in (["--learning-rate", "0.01"], ["--restart"]):
        with pytest.raises(RuntimeError, match="ran again"):
            fed_dp_pso.main(["--quick", *options, *changed, "--out", str(out)])


def _check_files(quick_run) -> None:
    for name in (
        "cells.csv",
        "rounds.csv",
        "table_digits.csv",
        "table_digits.md",
        "comm.csv",
        "summary.json",
        "fig2_accuracy_per_round_digits.png",
    ):
        assert (quick_run / name).stat().st_size > 0, name


def _check_cells(quick_run) -> None:
    cells = pd.read_csv(quick_run / "cells.csv")
    assert cells.epsilon.tolist() == [5.0]
    assert cells.acc_mean.between(0, 100).all()
    assert cells.acc_std.isna().all()  # one seed: no std, not a fake 0
    dp = cells[cells.epsilon == 5.0].iloc[0]
    assert dp.epsilon_max <= 5.0 and bool(dp.epsilon_ok)
    assert cells.meets_paper.isna().all()  # the paper has no digits numbers
    rounds = pd.read_csv(quick_run / "rounds.csv")
    assert set(rounds["round"]) == {1}
    assert len(rounds) == 1  # one seed, one epsilon


def _check_plan(quick_run) -> None:
    summary = json.loads((quick_run / "summary.json").read_text())
    assert summary["plan"]["selection_metric"] == "error"
    assert summary["models"] == {"digits": "mlp_64-32-10"}
    assert summary["plan"]["rounds"] == 1
    table = (quick_run / "table_digits.md").read_text()
    assert "particles scored by error" in table
    row = next(line for line in table.splitlines() if line.startswith("| iid"))
    assert "(1 seed)" in row and "+-" not in row  # one seed: no std shown
    comm = pd.read_csv(quick_run / "comm.csv").iloc[0]  # bytes the simulator counted
    model = param_bytes(jax.eval_shape(mlp((32,), 10, (8, 8, 1)).init, jax.random.key(0)))
    assert (comm.pso_up, comm.pso_down) == (5 * 4 + model, 5 * model)  # 5 scores + 1 model
    assert (comm.fedavg_up, comm.fedavg_down) == (5 * (model + 4), 5 * model)  # + weights
    assert comm.upload_saving == pytest.approx(1 - (20 + model) / (5 * (model + 4)))


@pytest.mark.parametrize(
    "bad",
    [
        ["--selection-metric", "accuracy"],
        ["--epsilons", "0"],
        ["--epsilons", "-1"],
        ["--partitions", "dir0.5"],
    ],
)
def test_bad_options_are_rejected_by_the_parser(bad, capsys) -> None:
    with pytest.raises(SystemExit):
        fed_dp_pso.main(["--quick", *bad])
    assert bad[0] in capsys.readouterr().err


def test_partitions_select_column_groups_in_table_order() -> None:
    def parts(*argv: str) -> tuple[str, ...]:
        return fed_dp_pso.profile(fed_dp_pso.parse_args(list(argv))).partitions

    assert parts("--full") == ("iid", "dir0.3", "dir1")
    assert parts("--full", "--partitions", "dir1", "iid") == ("iid", "dir1")
    assert parts("--partitions", "dir0.3") == ("dir0.3",)
    with pytest.raises(SystemExit):  # a value named twice is one line (tests/test_cli_edges.py)
        parts("--full", "--partitions", "dir1", "iid", "dir1")


@pytest.mark.parametrize(
    "flags", [["--reading", "current"], ["--reading", "paper", "--init", "shared"]]
)
def test_flower_deploys_the_algorithm_the_simulator_path_builds(flags) -> None:
    """``--runtime flower``: the run config carries the reading (``reading`` and the
    ``reading-<field>`` keys of the fields the flags changed) and the algorithm's settings,
    so the task the deployment loads runs the experiment's algorithm and hyper values (on
    the task's own clients)."""
    argv = ["--runtime", "flower", "--quick", "--epsilons", "5", *flags]
    args = fed_dp_pso.parse_args(argv)
    config = fed_dp_pso.flower_config(args)
    assert config["reading"] == args.reading
    assert ("reading-init" in config) == ("--init" in flags)
    task = load_task({"task": "swarmjax.fl.runtime.flower.tasks:digits", **config})
    prof = fed_dp_pso.profile(args)
    clients = task.stacked
    bs = min(prof.batch_size, int(clients.sizes.min()))
    model, lr = paper_model("digits", 10, clients.x.shape[2:])
    alg, _ = fed_dp_pso.algorithm(prof, model, [np.asarray(clients.sizes)], bs)
    assert task.algorithm == alg
    assert alg.init == ("shared" if "shared" in flags else "independent")
    grid = Variants.grid(
        alg, clients, task.variants.spec, epsilon_target=[5.0], learning_rate=lr,
        **reading_hyper(prof.reading),
    )  # fmt: skip
    jax.tree.map(np.testing.assert_array_equal, task.variants.hyper, grid.hyper)
    assert task.variants.labels == grid.labels


def test_pathmnist_runs_lenet5_and_fig3_uses_it(tmp_path, monkeypatch) -> None:
    """A PathMNIST-format .npz (random 28x28x3 images, 9 classes) gets the paper's LeNet-5 at
    eta = 0.001, and Fig. 3 runs on it instead of a stand-in. Epsilon = inf keeps the compile
    short; DP on a CNN is checked in test_dpsgd, the DP path of the experiment above."""
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", 200), ("val", 20), ("test", 60)):
        arrays[f"{split}_images"] = rng.integers(0, 256, (n, 28, 28, 3), dtype=np.uint8)
        arrays[f"{split}_labels"] = rng.integers(0, 9, (n, 1), dtype=np.uint8)
    np.savez(tmp_path / "pathmnist.npz", **arrays)
    monkeypatch.setenv("SWARMJAX_DATA", str(tmp_path))  # the run exports --data-dir: undone
    out = tmp_path / "out"
    options = [
        "--rounds",
        "1",
        "--epsilons",
        "inf",
        "--particles",
        "2",
        "--data-dir",
        str(tmp_path),
    ]
    fed_dp_pso.main(["--quick", "--datasets", "pathmnist", *options, "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["models"] == {"pathmnist": "lenet5_valid"}
    assert summary["fig3_dataset"] == "pathmnist" and summary["fig3_stand_in"] is False
    cells = pd.read_csv(out / "cells.csv")
    assert cells.lr.tolist() == [0.001] and cells.model.tolist() == ["lenet5_valid"]
    fig3 = pd.read_csv(out / "fig3.csv")
    assert fig3.dataset.tolist() == ["pathmnist"] and fig3.fedavg_dp.between(0, 100).all()


def test_fig3_baseline_is_audited_beside_its_epsilon(tmp_path, capsys) -> None:
    """``--audit N`` reaches the Fig. 3 baseline (FedAvg + DP-Adam, ``FedAvg(audit=...)``):
    its bound is printed beside its accounted epsilon, in ``fig3.csv`` and in its ledger
    release. Fig. 3 is called directly on 3 random clients (one 1-round FedAvg run, no
    Fed-DP-PSO run: ``cells`` stands in for its finished table)."""
    from types import SimpleNamespace

    from experiments import _fed_dp_pso_parts as parts
    from swarmjax.fl import stack_clients
    from swarmjax.privacy.ledger import Ledger

    rng = np.random.default_rng(0)
    x = rng.normal(size=(150, 8, 8, 1)).astype(np.float32)
    y = rng.integers(0, 10, 150)
    clients = stack_clients(x, y, [np.arange(i * 40, (i + 1) * 40) for i in range(3)])
    ds = SimpleNamespace(name="digits", x_test=x[120:], y_test=y[120:])
    d = parts.Dataset(ds, clients, mlp((16,), 10, (8, 8, 1)), 20, 0.005, True)
    prof = replace(fed_dp_pso.PROFILES["quick"], rounds=1, epsilons=(5.0,), seeds=1, audit=16)
    cells = [dict(dataset="digits", partition="iid", epsilon=5.0, acc_mean=50.0, acc_std=None)]
    rounds = pd.DataFrame({"dataset": [], "partition": []})
    secret = Secret.generate()
    store = SimpleNamespace(
        fetch_or_run=lambda key, run, with_secret=False: (
            *(run(secret=secret) if with_secret else run()),
            False,
        )
    )
    ledger = Ledger(tmp_path, "fed_dp_pso")
    rows, _, _ = parts.fig3("digits", d, prof, cells, rounds, store, tmp_path, ledger)
    out = capsys.readouterr().out
    lines = [s for s in out.splitlines() if s.startswith("  audit fedavg digits iid eps=5.0")]
    assert len(lines) == 1 and "empirical epsilon >=" in lines[0] and "vs accounted" in lines[0]
    (release,) = ledger.releases
    assert release.algorithm == "fedavg_dp_adam" and release.audit is not None
    audit = release.audit
    assert audit["unit"] == "record" and audit["canaries"] == 16 * 3
    assert 0.0 <= audit["epsilon_lower"] <= audit["epsilon"] <= 5.0
    assert rows[0]["fedavg_epsilon_lower"] == audit["epsilon_lower"]
    assert pd.read_csv(tmp_path / "fig3.csv").fedavg_epsilon_lower.tolist() == [
        audit["epsilon_lower"]
    ]


def test_audit_larger_than_fig3s_model_is_refused_before_any_work(tmp_path, capsys) -> None:
    """``--full`` adds PathMNIST's LeNet-5 for Fig. 3 (both methods run on it): ``--audit``
    is checked against its parameters too, before any work."""
    params = fed_dp_pso._model_parameters("pathmnist")
    assert params < fed_dp_pso._model_parameters("mnist")  # the full datasets' MLP allows it
    with pytest.raises(SystemExit) as exit_:
        fed_dp_pso.main(["--full", "--audit", str(params + 1), "--out", str(tmp_path / "o")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"exceeds pathmnist's model's {params} parameters" in err[0]
    assert not (tmp_path / "o").exists()


def test_a_batch_larger_than_a_client_is_said_not_silently_capped(
    tmp_path, monkeypatch, capsys
) -> None:
    """A batch is at most one client's rows: ``--batch-size`` above the smallest client's
    rows runs at that size, and the run says so before any training (the algorithm's
    construction replaced by one that stops, so nothing compiles)."""

    def stop(prof, model, sizes, batch_size, epsilon=None):
        raise RuntimeError(f"built with batch {batch_size}")

    monkeypatch.setattr(fed_dp_pso, "algorithm", stop)
    options = ["--quick", "--rounds", "1", "--epsilons", "5", "--no-fig3"]
    with pytest.raises(RuntimeError, match="built with batch") as err:
        fed_dp_pso.main([*options, "--batch-size", "100000", "--out", str(tmp_path)])
    used = int(str(err.value).rsplit(" ", 1)[1])
    line = f"digits: batch size {used}, not 100000: its smallest client holds {used} rows"
    assert line in capsys.readouterr().out
