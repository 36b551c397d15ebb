"""Long experiments resume: a rerun with the same options reuses every finished setting.

Each test runs an experiment's ``--quick`` end to end, checks what it wrote, then reruns it
with the compute function replaced by one that fails: the rerun must finish from the saved
calls with identical results, and a changed option (or ``--restart``) must compute again.
``combined_learning`` and ``apdim`` are checked so in tests/test_experiment_ledgers.py, on
the run whose ledger those tests read (one ``--quick`` run each).
"""

from __future__ import annotations

import pandas as pd
import pytest

from experiments import dp_fedavg


def _must_not_run(*args, **kwargs):
    raise RuntimeError("a finished setting ran again")


def rerun_from_saved_calls(main, argv, first, out, capsys) -> str:
    """Rerun ``main(argv)`` (its compute patched to fail by the caller): the same
    ``summary.csv`` as ``first``; returns what the rerun printed."""
    capsys.readouterr()
    main(argv)
    log = capsys.readouterr().out
    pd.testing.assert_frame_equal(pd.read_csv(out / "summary.csv"), first)
    return log


def test_dp_fedavg_quick_resumes(tmp_path, monkeypatch, capsys, data_dir) -> None:
    argv = ["--quick", "--rounds", "3", "--data-dir", str(data_dir), "--out", str(tmp_path)]
    dp_fedavg.main(argv)
    first = pd.read_csv(tmp_path / "summary.csv")
    assert list(first.method) == ["non-private", "adaptive", "fixed C=1"]
    private = first[first.method != "non-private"]
    assert (private.epsilon <= private.epsilon_target).all()
    monkeypatch.setattr(dp_fedavg, "run_one", _must_not_run)
    log = rerun_from_saved_calls(dp_fedavg.main, argv, first, tmp_path, capsys)
    assert "3 run(s) reused" in log
    with pytest.raises(RuntimeError, match="ran again"):
        dp_fedavg.main([*argv, "--epsilons", "4"])
