"""``experiments/_report.py``: mean +- std over seeds as numbers and text, tables as CSV +
markdown, and per-round figures with a band over seeds."""

from __future__ import annotations

import json
import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from experiments import _report


def test_mean_and_sample_std_and_their_text():
    mean, std = _report.mean_std([0.5, 0.7], scale=100)
    assert mean == pytest.approx(60.0) and std == pytest.approx(np.std([50, 70], ddof=1))
    one = _report.mean_std([0.5], scale=100)
    assert one[0] == 50.0 and math.isnan(one[1])  # one seed: no std, not a fake 0
    assert _report.mean_std_text(60.0, 14.142) == "60.00 +- 14.14"
    assert _report.mean_std_text(*one) == "50.00 (1 seed)"
    assert _report.mean_std_text(math.nan, math.nan) == "-"


def test_write_table_writes_csv_and_markdown(tmp_path):
    table = pd.DataFrame({"a": [1.0, 2.0], "b": ["x", "y"]})
    md = _report.write_table(table, tmp_path / "t", columns=["b"], header="head")
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "t.csv"), table)
    assert (tmp_path / "t.md").read_text() == f"head\n\n{md}\n" and "a" not in md


def test_per_round_draws_a_band_over_seeds_per_line(tmp_path, monkeypatch):
    rows = [
        dict(round=r, seed=s, eps=e, part=p, acc=0.1 * r + 0.01 * s + e)
        for r in (1, 2, 3)
        for s in (0, 1)
        for e in (0.0, 0.5)
        for p in ("iid", "dir1")
    ]
    saved = {}
    monkeypatch.setattr(_report, "save", lambda fig, path, **kw: saved.update(fig=fig, path=path))
    _report.per_round(pd.DataFrame(rows), "acc", tmp_path / "f.png", panel="part", line="eps")
    axes = saved["fig"].axes
    assert [ax.get_title() for ax in axes] == ["iid", "dir1"]
    for ax in axes:
        assert len(ax.lines) == 2 and len(ax.collections) == 2  # a mean line + band per eps
        np.testing.assert_allclose(ax.lines[0].get_ydata(), [0.105, 0.205, 0.305])
    plt.close(saved["fig"])
    assert "\n" in _report.title("a long title " * 5, width=20)


def test_strict_json_writes_null_with_the_reason(tmp_path):
    """No NaN/Infinity tokens: non-finite numbers are null, with ``<key>_null_reason``."""
    obj = {"eps": math.inf, "std": np.float32("nan"), "curve": [1.0, -math.inf], "ok": 2.5}
    path = _report.write_json(tmp_path / "s.json", obj, {"std": "one seed: no std"})
    text = path.read_text()
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict {c}"))
    assert data["eps"] is None and "infinite" in data["eps_null_reason"]
    assert data["std"] is None and data["std_null_reason"] == "one seed: no std"
    assert data["curve"] == [1.0, None] and "curve_null_reason" in data
    assert data["ok"] == 2.5 and "ok_null_reason" not in data


def test_finish_prints_and_records_the_peak_memory(tmp_path, capsys):
    _report.write_json(tmp_path / "summary.json", {"a": 1})
    peak = _report.finish(tmp_path, tmp_path / "summary.json")
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["a"] == 1 and peak > 0
    assert saved["peak_memory_gib"] == pytest.approx(peak, abs=1e-3)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("peak memory: ") and "ru_maxrss" in out[0]
    assert out[-1] == f"results in {tmp_path}"  # the last line says where the results are


def test_paaso_figures_use_log_axes_and_std_bands(tmp_path):
    from experiments import _paaso_figures

    curves = pd.DataFrame(
        {
            "strategy": ["pso"] * 3 + ["fl"] * 3,
            "iteration": [1, 2, 3] * 2,
            "mean": [1.0, 1e-3, 0.0, 300.0, 200.0, 100.0],
            "std": [0.5, 1e-3, 0.0, 50.0, 40.0, 30.0],
            "runs": 5,
        }
    )
    fig, ax = plt.subplots()
    _paaso_figures._plot(curves, "strategy", "a long title " * 12, tmp_path / "f.png", ax=ax)
    assert ax.get_yscale() == "symlog" and ax.get_ylim()[0] == 0  # spans decades, reaches 0
    assert len(ax.collections) == 2  # one std band per strategy
    assert "band" in ax.get_ylabel() and "\n" in ax.get_title()  # wrapped, not cut
    plt.close(fig)
