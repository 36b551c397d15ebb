"""Long experiments resume: a rerun with the same options reuses every finished setting.

Each test runs an experiment's ``--quick`` end to end, checks what it wrote, then reruns it
with the compute function replaced by one that fails: the rerun must finish from the saved
calls with identical results, and ``--restart`` must compute again.
"""

from __future__ import annotations

import pandas as pd
import pytest

from experiments import apdim, combined_learning, dp_fedavg


def _must_not_run(*args, **kwargs):
    raise RuntimeError("a finished setting ran again")


def _rerun(main, argv, first, out, capsys, changed: list[str]) -> str:
    """Rerun ``main(argv)`` (compute patched to fail): same summary; ``changed`` computes."""
    capsys.readouterr()
    main(argv)
    log = capsys.readouterr().out
    pd.testing.assert_frame_equal(pd.read_csv(out / "summary.csv"), first)
    with pytest.raises(RuntimeError, match="ran again"):
        main([*argv, *changed])
    return log


def test_combined_learning_quick_resumes(tmp_path, monkeypatch, capsys) -> None:
    argv = ["--quick", "--rounds", "1", "--out", str(tmp_path)]
    combined_learning.main(argv)
    first = pd.read_csv(tmp_path / "summary.csv")
    assert set(first.split) == {"uniform", "arbitrary"} and first.K.eq(2).all()  # 2 classes
    assert first[["CL_final", "FedAvg_final", "central_final"]].stack().between(0, 1).all()
    monkeypatch.setattr(combined_learning, "run_setting", _must_not_run)
    monkeypatch.setattr(combined_learning, "run_central", _must_not_run)
    log = _rerun(combined_learning.main, argv, first, tmp_path, capsys, ["--restart"])
    assert "uniform_K2" in log


def test_dp_fedavg_quick_resumes(tmp_path, monkeypatch, capsys, data_dir) -> None:
    argv = ["--quick", "--rounds", "3", "--data-dir", str(data_dir), "--out", str(tmp_path)]
    dp_fedavg.main(argv)
    first = pd.read_csv(tmp_path / "summary.csv")
    assert list(first.method) == ["non-private", "adaptive", "fixed C=1"]
    private = first[first.method != "non-private"]
    assert (private.epsilon <= private.epsilon_target).all()
    monkeypatch.setattr(dp_fedavg, "run_one", _must_not_run)
    log = _rerun(dp_fedavg.main, argv, first, tmp_path, capsys, ["--epsilons", "4"])
    assert "3 run(s) reused" in log


def test_apdim_quick_resumes(tmp_path, monkeypatch, capsys, data_dir) -> None:
    argv = ["--quick", "--datasets", "heart", "--skip-timing", "--data-dir", str(data_dir)]
    argv += ["--out", str(tmp_path)]
    apdim.main(argv)
    first = pd.read_csv(tmp_path / "summary.csv")
    assert set(first.dataset) == {"heart"} and set(first["mode"]) == {"correct", "paper"}
    assert first[["f1_apdim", "f1_uniform"]].stack().between(0, 1).all()
    monkeypatch.setattr(apdim, "run_utility", _must_not_run)
    monkeypatch.setattr(apdim, "run_params", _must_not_run)
    log = _rerun(apdim.main, argv, first, tmp_path, capsys, ["--seeds", "2"])
    assert "utility_heart" in log and "params_heart" in log
