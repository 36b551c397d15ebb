"""``experiments/_report.py``: mean +- std over seeds as numbers and text, tables as CSV +
markdown, and per-round figures with a band over seeds."""

from __future__ import annotations

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
