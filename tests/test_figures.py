"""Figures fit for a paper (issue 50, item 6): the shared helpers of
``experiments/_report.py`` size every figure for a column or the page, write PNG (at least
200 dpi) and PDF, keep legends off the data, never draw a one-point line for a sweep with
one x value, and plot the accounted epsilon against the round; the ledger's short
statement is printed first, rounded for reading.  Small synthetic frames only: seconds."""

from __future__ import annotations

import math

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.lines import Line2D

from experiments import _report

COLUMN = (3.3, 3.5)  # inches: one panel
PAGE = 7.0  # inches: the widest figure


def _history(rounds=(1, 2, 3), seeds=(0, 1), targets=(2.0, 8.0, math.inf), parts=("iid",)):
    """A federated history: per (partition, target, seed, round) an accuracy and the
    accounted ``epsilon_max`` (growing with the round, equal over seeds; inf without DP)."""
    rows = [
        dict(
            partition=p,
            epsilon_target=e,
            seed=s,
            round=r,
            test_accuracy=0.5 + 0.1 * r + 0.01 * s + (0.0 if math.isinf(e) else e / 100),
            epsilon_max=math.inf if math.isinf(e) else e * math.sqrt(r / max(rounds)),
        )
        for p in parts
        for e in targets
        for s in seeds
        for r in rounds
    ]
    return pd.DataFrame(rows)


@pytest.fixture
def keep(monkeypatch):
    """Run the real ``_report.save`` and keep each figure it wrote (closed, still readable)."""
    kept = []
    real = _report.save

    def save(fig, path, **kw):
        kept.append(fig)
        return real(fig, path, **kw)

    monkeypatch.setattr(_report, "save", save)
    return kept


def _renderer(fig):
    """Draw ``fig`` (closed by ``save``: a fresh Agg canvas) and return its renderer."""
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    return fig.canvas.get_renderer()


# -------------------------------------------------------------------------------- sizes


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7])
def test_panels_fit_a_column_or_the_page(n):
    fig, axes = _report.panels(n)
    width, height = fig.get_size_inches()
    rows, cols = _report.layout(n)
    assert len(axes) == n == len(fig.axes) and cols <= _report.MAX_COLUMNS
    assert rows * cols >= n > (rows - 1) * cols  # no empty row
    if cols == 1:
        assert COLUMN[0] <= width <= COLUMN[1]
    else:
        assert COLUMN[1] < width <= PAGE
    assert height <= 3 * width  # no strip of panels in either direction
    assert width / cols >= 2.0  # a panel stays readable


def test_a_requested_width_sets_the_aspect_only():
    """``grid(1, 1, width=6, height=4)`` (as cross_device asks) is still one column wide."""
    fig, _ = _report.grid(1, 1, width=6, height=4)
    width, height = fig.get_size_inches()
    assert COLUMN[0] <= width <= COLUMN[1]
    assert height == pytest.approx(max(_report.MIN_PANEL_HEIGHT, width * 4 / 6))
    fig, _ = _report.grid(1, 5, width=3.2, height=3.2)  # apdim's old 16 x 3.2 in strip
    assert fig.get_figwidth() <= PAGE


def test_saved_png_has_the_pixels_of_its_size_at_paper_dpi_and_a_pdf_beside(tmp_path, keep):
    path = tmp_path / "acc.png"
    _report.per_round(
        _history(parts=("iid", "dir")), "test_accuracy", path, panel="partition",
        line="epsilon_target", caption="MNIST, 100 clients, cohort 10",
    )  # fmt: skip
    (fig,) = keep
    width, height = fig.get_size_inches()
    image = mpimg.imread(path)
    assert image.shape[:2] == (round(height * _report.DPI), round(width * _report.DPI))
    assert _report.DPI >= 200 and image.shape[1] / width >= 200
    assert image.shape[1] <= PAGE * _report.DPI
    assert path.with_suffix(".pdf").read_bytes().startswith(b"%PDF")
    low = tmp_path / "low.png"
    fig2, _ = _report.grid(1, 1)
    _report.save(fig2, low, dpi=90)  # a caller's coarse dpi is raised to the floor
    assert mpimg.imread(low).shape[1] == round(fig2.get_figwidth() * _report.MIN_DPI)


# -------------------------------------------------------------------- titles and captions


def test_caption_is_one_line_that_fits_and_titles_fit_their_axes(tmp_path, keep):
    fig, axes = _report.grid(1, 1)
    long = "Cross-device accuracy vs epsilon: mnist, 500 clients (power-law), cohort 50 " * 2
    axes[0, 0].plot([1, 2], [1, 2])
    axes[0, 0].set_title(_report.title(long, 60))  # wrapped too wide for the column
    _report.save(fig, tmp_path / "f.png", caption="mnist, 100 clients, cohort 10, 20 rounds")
    (fig,) = keep
    renderer = _renderer(fig)
    caption = fig.get_suptitle()
    assert caption and "\n" not in caption
    assert fig._suptitle.get_fontsize() <= _report.CAPTION_SIZE
    ax = fig.axes[0]
    assert ax.title.get_window_extent(renderer).width <= ax.get_window_extent(renderer).width
    assert "power-\n" not in ax.get_title() and "power-law" in ax.get_title()
    assert _report.title("use dp-fedavg-adaptive here", 12) == "use\ndp-fedavg-adaptive\nhere"


# ----------------------------------------------------------------- legends off the data


def _display_points(ax) -> np.ndarray:
    """Every data point of ``ax``'s lines, in display pixels."""
    pts = [
        ax.transData.transform(np.column_stack(line.get_data()))
        for line in ax.lines
        if line.get_transform() == ax.transData  # axhline & co. are in axes coordinates
    ]
    return np.concatenate(pts) if pts else np.empty((0, 2))


def _check_legends_clear(fig) -> None:
    renderer = _renderer(fig)
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert legends, "no legend drawn"
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent(renderer)), "legend over an axes"
            pts = _display_points(ax)
            inside = (
                (pts[:, 0] >= box.x0) & (pts[:, 0] <= box.x1)
                & (pts[:, 1] >= box.y0) & (pts[:, 1] <= box.y1)
            )  # fmt: skip
            assert not inside.any(), "a data point under the legend"


def test_one_legend_below_the_panels_covers_no_data(tmp_path, keep):
    _report.per_round(
        _history(parts=("iid", "dir", "path")), "test_accuracy", tmp_path / "f.png",
        panel="partition", line="epsilon_target", label=lambda e: f"eps={e:g}",
    )  # fmt: skip
    (fig,) = keep
    assert all(ax.get_legend() is None for ax in fig.axes)  # no legend inside a panel
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["eps=2", "eps=8", "eps=inf"]
    _check_legends_clear(fig)
    renderer = _renderer(fig)
    lowest = min(ax.get_window_extent(renderer).y0 for ax in fig.axes)
    assert legend.get_window_extent(renderer).y1 <= lowest  # below every panel


def test_a_legend_inside_an_axes_is_moved_off_it(tmp_path, keep):
    """A caller's own ``ax.legend(loc=...)`` over the curves (as Shakespeare's was) ends up
    outside; where panels draw one label differently, each legend goes beside its axes."""
    fig, axes = _report.grid(1, 2)
    x = np.linspace(0, 1, 50)
    for i, ax in enumerate(axes[0]):
        ax.plot(x, x, label="a", color=f"C{i}")  # "a" differs between the panels
        ax.plot(x, 1 - x, label="b")
        ax.legend(loc="center")  # right over the crossing curves
    _report.save(fig, tmp_path / "f.png")
    (fig,) = keep
    assert not fig.legends
    _check_legends_clear(fig)
    renderer = _renderer(fig)
    for ax in fig.axes:
        box = ax.get_legend().get_window_extent(renderer)
        assert box.x0 >= ax.get_window_extent(renderer).x1  # on the axes' right


# ------------------------------------------------------------- one x value: no lone dot


def _lone_points(ax) -> list[Line2D]:
    """Lines of ``ax`` in data coordinates that hold a single point (an error bar's caps,
    part of its container, are not a plot of their own)."""
    parts = {id(a) for c in ax.containers for a in c.get_children()}
    return [
        line
        for line in ax.lines
        if line.get_transform() == ax.transData
        and len(np.atleast_1d(line.get_xdata())) == 1
        and id(line) not in parts
    ]


def test_a_sweep_with_one_x_value_draws_labelled_bars(tmp_path, keep):
    history = _history(rounds=(5,))  # one round: accuracy against the round has one x
    _report.per_round(
        history, "test_accuracy", tmp_path / "f.png", panel="partition",
        line="epsilon_target", label=lambda e: f"eps={e:g}",
    )  # fmt: skip
    (fig,) = keep
    (ax,) = fig.axes
    assert not _lone_points(ax) and not [line for line in ax.lines if line.get_label() == "eps=2"]
    bars = [p for p in ax.patches if p.get_height() > 0]
    assert len(bars) == 3  # one bar per line value
    means = history.groupby("epsilon_target", sort=False)["test_accuracy"].mean()
    np.testing.assert_allclose(sorted(b.get_height() for b in bars), sorted(means))
    written = {t.get_text() for t in ax.texts}
    assert {f"{m:.3g}" for m in means} <= written  # each value written on its bar
    assert "round = 5" in ax.get_xlabel()
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["eps=2", "eps=8", "eps=inf"]


def test_a_single_point_of_one_band_is_a_labelled_marker():
    fig, axes = _report.grid(1, 1)
    ax = axes[0, 0]
    frame = pd.DataFrame({"round": [3, 3], "acc": [0.5, 0.7]})
    _report.band(ax, frame, "acc", label="one")
    (point,) = [line for line in ax.lines if line.get_label() == "one"]
    assert point.get_linestyle() == "None" and point.get_marker() not in ("", "None", None)
    assert [t.get_text() for t in ax.texts] == ["0.6"]
    _report.plt.close(fig)


def test_curves_with_several_x_values_draw_lines_with_bands():
    fig, axes = _report.grid(1, 1)
    ax = axes[0, 0]
    bars = _report.curves(ax, _history(), "test_accuracy", line="epsilon_target")
    assert bars is False and len(ax.lines) == 3 and len(ax.collections) == 3  # band each
    assert not ax.patches and ax.get_xlabel() == "round"
    _report.plt.close(fig)


# -------------------------------------------------------------- epsilon against rounds


def test_epsilon_rounds_draws_one_line_per_private_configuration(tmp_path, keep):
    history = _history(rounds=(1, 2, 3, 4), targets=(1.0, 8.0, math.inf))
    path = _report.plot_epsilon_rounds(
        history, tmp_path / "epsilon_rounds.png", by="epsilon_target",
        label=lambda e: f"target {e}", caption="MNIST iid",
    )  # fmt: skip
    assert path == tmp_path / "epsilon_rounds.png" and path.stat().st_size > 0
    assert path.with_suffix(".pdf").exists()
    (fig,) = keep
    (ax,) = fig.axes
    drawn = [line for line in ax.lines if not line.get_label().startswith("_")]
    assert [line.get_label() for line in drawn] == ["target 1", "target 8"]  # no-DP left out
    for line, e in zip(drawn, (1.0, 8.0), strict=True):
        np.testing.assert_array_equal(line.get_xdata(), [1, 2, 3, 4])
        np.testing.assert_allclose(line.get_ydata(), [e * math.sqrt(r / 4) for r in (1, 2, 3, 4)])
    assert ax.get_xlabel() == "round" and "epsilon" in ax.get_ylabel()
    assert "MNIST iid" in fig.get_suptitle() and "without DP" in fig.get_suptitle()
    assert COLUMN[0] <= fig.get_figwidth() <= COLUMN[1]
    _check_legends_clear(fig)


def test_epsilon_rounds_means_over_seeds_panels_and_merges_coinciding_curves(tmp_path, keep):
    """Two methods at one noise (the same curve) share a line, named ``a/b``, so that no
    line hides another; one panel per partition; final epsilons 50x apart: a log axis."""
    base = _history(targets=(0.5, 25.0), parts=("iid", "dir"))
    base.loc[base.seed == 1, "epsilon_max"] *= 1.1  # seeds differ: the line is their mean
    history = pd.concat([base.assign(method="fixed"), base.assign(method="adaptive")])
    _report.plot_epsilon_rounds(
        history, tmp_path / "e.png", by=["method", "epsilon_target"], panel="partition",
    )  # fmt: skip
    (fig,) = keep
    assert [ax.get_title() for ax in fig.axes] == ["iid", "dir"]
    for ax in fig.axes:
        labels = [line.get_label() for line in ax.lines]
        assert labels == ["method=fixed/adaptive, epsilon_target=0.5",
                          "method=fixed/adaptive, epsilon_target=25"]  # fmt: skip
        np.testing.assert_allclose(ax.lines[1].get_ydata()[-1], 25.0 * 1.05)
        assert ax.get_yscale() == "log"


def test_epsilon_rounds_without_a_private_run_writes_nothing(tmp_path):
    history = _history(targets=(math.inf,))
    assert _report.plot_epsilon_rounds(history, tmp_path / "e.png", by="epsilon_target") is None
    assert not list(tmp_path.iterdir())


def test_epsilon_rounds_with_one_round_draws_bars(tmp_path, keep):
    _report.plot_epsilon_rounds(_history(rounds=(1,)), tmp_path / "e.png", by="epsilon_target")
    (fig,) = keep
    (ax,) = fig.axes
    assert not _lone_points(ax) and len([p for p in ax.patches if p.get_height() > 0]) == 2


# ------------------------------------------------------------ statements for reading


def test_the_short_statement_is_printed_first_with_a_rounded_delta(tmp_path, capsys):
    from swarmjax.privacy import accounting
    from swarmjax.privacy.ledger import Ledger, Release

    delta = 6.958942240779402e-05
    event = accounting.poisson_gaussian_event(0.1, 1.2, 20)
    ledger = Ledger(tmp_path, "exp")
    ledger.add(
        Release(
            "dp_fedavg",
            {"epsilon_target": 2.0},
            0,
            "client",
            "client-level zero-out: a test relation",
            delta,
            1.0,
            "pld",
            "runs.csv",
            groups=((None, event, 0.0),),
        )
    )
    _report.write_ledger(ledger)
    lines = capsys.readouterr().out.splitlines()
    short = ledger.composed()["client"].short_statement()
    assert lines[0] == f"privacy: {short}" and len(lines[0]) < 90
    assert "6.96e-05" in short and "6.958942240779402e-05" not in "\n".join(lines)
    assert lines[1].startswith(f"  in full: {short}")
    assert _report.delta_text(delta) == "6.96e-05" and _report.short(8.0) == "8"


def test_many_statements_are_summarised_per_unit(tmp_path, capsys):
    """Past ``STATEMENTS_SHOWN`` composed statements (PAASO: one per configuration's
    swarms), ``write_ledger`` prints per unit their number and the largest one's short
    statement, and where each stands in full, instead of a paragraph each."""
    from swarmjax.privacy import accounting
    from swarmjax.privacy.ledger import MARKDOWN_NAME, Ledger, Release

    ledger = Ledger(tmp_path, "exp", delta=1e-5)
    shown = _report.STATEMENTS_SHOWN
    for i in range(shown + 1):
        event = accounting.poisson_gaussian_event(0.1, 1.2 - 0.1 * i, 20)
        ledger.add(
            Release(
                "dp", {"i": i}, 0, "client", "client-level zero-out: a test relation", 1e-5,
                1.0, "pld", "runs.csv", groups=((None, event, 0.0),), data=f"swarm {i}",
            )
        )  # fmt: skip
    _report.write_ledger(ledger)
    lines = capsys.readouterr().out.splitlines()
    largest = ledger.composed()[f"client:swarm {shown}"]
    assert largest.epsilon == max(c.epsilon for c in ledger.composed().values())
    assert lines[0] == (
        f"privacy: {shown + 1} client-level statements, one per private data source; "
        f"the largest: {largest.short_statement()}"
    )
    assert lines[1] == f"  each in full: {tmp_path / MARKDOWN_NAME}"
    assert not any("in full: (" in line for line in lines)
    assert (tmp_path / MARKDOWN_NAME).read_text().count("swarm ") >= shown + 1
    assert _report.short(6.958942240779402e-05) == "6.959e-05"
