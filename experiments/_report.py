"""Shared reporting of the federated experiments (``fed_dp_pso``, ``dp_fedavg``,
``combined_learning``): mean +- std over seeds as numbers and as markdown text, tables
written as CSV + markdown, and figures of a metric per round with an error band over seeds
(mean +- sample std, ``fill_between``), sized for a two-column paper (one panel a column
wide, at most 7 inches in all), short titles with the setting in one caption line, legends
below the panels, labelled bars where a sweep has one x value, written as PNG (300 dpi)
and PDF; and the accounted epsilon against the round of every DP experiment
(:func:`plot_epsilon_rounds`).

The std is the sample std (``ddof=1``) over seeds; with one seed there is none (NaN, shown
as ``(1 seed)``), never a fake 0.

Every experiment writes its JSON through :func:`write_json` (strict JSON: a NaN or infinite
number is written as ``null`` with the reason beside it) and ends with :func:`finish`, which
prints and records its peak memory (:func:`peak_memory_gib`) and prints where its results
are.
"""

from __future__ import annotations

import json
import math
import resource
import sys
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

__all__ = [
    "add_caption",
    "band",
    "curves",
    "delta_text",
    "figure_width",
    "finish",
    "grid",
    "layout",
    "legends_outside",
    "line_colors",
    "log_x",
    "mean_std",
    "mean_std_text",
    "not_covered",
    "panels",
    "peak_memory_gib",
    "per_round",
    "plot_epsilon_rounds",
    "save",
    "short",
    "strict",
    "title",
    "write_json",
    "write_ledger",
    "write_table",
]

TITLE_WIDTH = 40  # characters per title line of one panel (about 4 inches at 10 pt)


def mean_std(values: Iterable[float], scale: float = 1.0) -> tuple[float, float]:
    """Mean and sample std (``ddof=1``; NaN for one value) of ``values`` times ``scale``."""
    v = np.asarray(list(values), np.float64) * scale
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else math.nan


def mean_std_text(mean: float, std: float, digits: int = 2) -> str:
    """``"m +- s"``; ``"m (1 seed)"`` where the std is NaN (one seed); ``"-"`` where there is
    no number."""
    if not np.isfinite(mean):
        return "-"
    if not np.isfinite(std):
        return f"{mean:.{digits}f} (1 seed)"
    return f"{mean:.{digits}f} +- {std:.{digits}f}"


def write_table(
    table: pd.DataFrame,
    path: Path,
    *,
    columns: list[str] | None = None,
    header: str = "",
    floatfmt: str = ".3f",
) -> str:
    """``table`` to ``<path>.csv`` (every column) and ``<path>.md`` (``columns``, after
    ``header``); returns the markdown."""
    path = Path(path)
    table.to_csv(path.with_suffix(".csv"), index=False)
    shown = table if columns is None else table[columns]
    md = shown.to_markdown(index=False, floatfmt=floatfmt)
    path.with_suffix(".md").write_text(f"{header}\n\n{md}\n" if header else f"{md}\n")
    return md


def title(text: str, width: int = TITLE_WIDTH) -> str:
    """``text`` wrapped to lines of at most ``width`` characters, never inside a word
    (``dp-fedavg-adaptive`` stays whole; a longer word gets a line of its own)."""
    return (
        "\n".join(textwrap.wrap(text, width, break_on_hyphens=False, break_long_words=False))
        or text
    )


# ------------------------------------------------------------------------------- figures
#
# Figures fit a two-column paper: one panel is one column wide (COLUMN_WIDTH), several
# panels span at most the page (FULL_WIDTH), MAX_COLUMNS to a row, more wrap onto further
# rows.  Titles are short; the setting goes into one small caption line above the panels
# (``save(..., caption=)``).  Every legend is moved off the data (``legends_outside``): one
# legend below the panels.  A sweep with one x value is drawn as labelled bars, never as a
# one-point line (``curves``).  Each figure is written as PNG (DPI) and as PDF beside it.

COLUMN_WIDTH = 3.4  # inches: one panel, one column of a two-column paper
FULL_WIDTH = 7.0  # inches: the widest figure (both columns)
MAX_COLUMNS = 3  # panels per row
ASPECT = 0.75  # panel height / panel width, unless a caller asks for another
MIN_PANEL_HEIGHT = 1.8  # inches
DPI = 300  # PNG resolution: a one-column figure is 1020 px wide
MIN_DPI = 200  # no PNG is written coarser
FORMATS = (".png", ".pdf")  # every figure, raster and vector
CAPTION_SIZE = 7.5  # points: the caption line (it shrinks to MIN_CAPTION_SIZE to fit)
MIN_CAPTION_SIZE = 6.0
LEGEND_ROW = 0.17  # inches a row of the legend below the panels adds to the figure
STYLE = {  # sizes for a figure printed at its own size
    "font.size": 8,
    "axes.titlesize": 8.5,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7,
    "lines.linewidth": 1.2,
    "lines.markersize": 4,
    "errorbar.capsize": 2,
}
plt.rcParams.update(STYLE)


def layout(n: int) -> tuple[int, int]:
    """``(rows, columns)`` for ``n`` panels: at most :data:`MAX_COLUMNS` a row, the rows
    filled evenly (4 panels: 2 x 2; 5: 2 x 3)."""
    rows = max(1, math.ceil(n / MAX_COLUMNS))
    return rows, max(1, math.ceil(n / rows))


def figure_width(cols: int) -> float:
    """Inches: one column (:data:`COLUMN_WIDTH`) for one panel a row, else
    :data:`COLUMN_WIDTH` per panel up to the page (:data:`FULL_WIDTH`)."""
    return COLUMN_WIDTH if cols <= 1 else min(FULL_WIDTH, COLUMN_WIDTH * cols)


def grid(rows: int, cols: int, *, width: float | None = None, height: float | None = None, **kw):
    """``(figure, axes[rows, cols])``: one panel per cell, sized for a paper
    (:func:`figure_width`; ``width`` and ``height``, inches per panel, only set the panels'
    aspect), constrained layout; ``kw`` goes to ``plt.subplots`` (e.g. ``sharey``)."""
    aspect = height / width if width and height else ASPECT
    fig_width = figure_width(cols)
    panel_height = max(MIN_PANEL_HEIGHT, fig_width / cols * aspect)
    return plt.subplots(
        rows,
        cols,
        figsize=(fig_width, panel_height * rows),
        squeeze=False,
        layout="constrained",
        **kw,
    )


def panels(n: int, **kw) -> tuple[Any, list]:
    """``(figure, [axes] * n)``: :func:`grid` of :func:`layout` ``(n)``, the unused cells
    of the last row removed."""
    fig, axes = grid(*layout(n), **kw)
    flat = list(axes.ravel())
    for ax in flat[n:]:
        fig.delaxes(ax)
    return fig, flat[:n]


def _number(value: float) -> str:
    """A value as a bar's label: 3 significant digits."""
    return f"{value:.3g}"


def band(
    ax,
    frame: pd.DataFrame,
    y: str,
    *,
    x: str = "round",
    scale: float = 1.0,
    label: str | None = None,
    **style,
) -> None:
    """``y`` against ``x``: the mean over the rows of each ``x`` (seeds) as a line, mean +-
    sample std as a band (none where there is one seed).  With one ``x`` value there is no
    line to draw: a marker (std as an error bar) with its value written beside it."""
    g = frame.groupby(x)[y]
    mean = g.mean() * scale
    std = g.std(ddof=1).fillna(0.0) * scale
    if x == "round":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if len(mean) == 1:
        style = {**style, "ls": "none", "marker": style.get("marker") or "o"}
        style.pop("linestyle", None)
        (point,) = ax.plot(mean.index, mean.values, label=label, **style)
        if g.size().max() > 1:
            ax.errorbar(mean.index, mean.values, std.values, fmt="none", capsize=2,
                        color=point.get_color())  # fmt: skip
        ax.annotate(_number(float(mean.iloc[0])), (mean.index[0], float(mean.iloc[0])),
                    xytext=(4, 3), textcoords="offset points", fontsize=6,
                    color=point.get_color())  # fmt: skip
        return
    (line,) = ax.plot(mean.index, mean.values, label=label, **style)
    if g.size().max() > 1:
        ax.fill_between(mean.index, mean - std, mean + std, color=line.get_color(), alpha=0.2, lw=0)


def curves(
    ax,
    frame: pd.DataFrame,
    y: str,
    *,
    line: str,
    x: str = "round",
    scale: float = 1.0,
    label: Callable[[Any], str] = str,
    colors: Mapping[Any, str] | None = None,
    xlabel: str | None = None,
    **style,
) -> bool:
    """One :func:`band` of ``y`` against ``x`` per value of ``line`` (legend
    ``label(value)``, colour ``colors[value]`` where given), and the x label ``xlabel``.

    A sweep with one ``x`` value (one epsilon, one round) has no curve: each value of
    ``line`` is then a bar of its mean over the rows (the sample std as an error bar where
    there are several), the mean written on it, and the x label names the one ``x`` value.
    Returns whether it drew bars."""
    values = list(dict.fromkeys(frame[line]))
    colors = colors or {}
    at = frame[x].dropna().unique()
    name = xlabel or x
    if len(at) != 1:
        for v in values:
            kw = {"color": colors[v], **style} if v in colors else dict(style)
            band(ax, frame[frame[line] == v], y, x=x, scale=scale, label=label(v), **kw)
        ax.set_xlabel(name)
        return False
    for i, v in enumerate(values):
        got = frame.loc[frame[line] == v, y].to_numpy(np.float64) * scale
        mean = float(got.mean())
        std = float(got.std(ddof=1)) if len(got) > 1 else math.nan
        color = colors.get(v, style.get("color", f"C{i % 10}"))
        ax.bar(i, mean, 0.7, color=color, alpha=0.85, label=label(v),
               yerr=std if math.isfinite(std) else None, capsize=2)  # fmt: skip
        top = mean + (std if math.isfinite(std) else 0.0)
        ax.annotate(_number(mean), (i, top), xytext=(0, 2), textcoords="offset points",
                    ha="center", va="bottom", fontsize=6)  # fmt: skip
    ax.set_xticks([])  # the legend names each bar
    ax.set_xlim(-0.6, len(values) - 0.4)
    ax.margins(y=0.15)
    ax.set_xlabel(f"{name} = {short(at[0])} (one value)")
    return True


def log_x(ax, values: Iterable[float]) -> None:
    """A log x axis labelled at ``values`` (e.g. the epsilons run) as plain numbers of 4
    significant digits (:func:`short`), no minor ticks (``2``, ``7.998``, not
    ``2 x 10^0``)."""
    from matplotlib.ticker import NullLocator

    ticks = sorted({float(v) for v in values if np.isfinite(v) and v > 0})
    ax.set_xscale("log")
    ax.set_xticks(ticks, [short(t) for t in ticks])
    ax.xaxis.set_minor_locator(NullLocator())


def _legend_entries(ax) -> tuple[list, list[str]]:
    """The handles and labels ``ax``'s legend shows: the artists themselves where the
    legend was made from them (``ax.legend()``), else the legend's own handles."""
    legend = ax.get_legend()
    shown = [t.get_text() for t in legend.get_texts()]
    handles, labels = ax.get_legend_handles_labels()
    if labels == shown:
        return handles, labels
    return list(legend.legend_handles), shown


def _style(handle: Any) -> tuple:
    """What a legend entry looks like (kind, colour, line style, marker), to tell whether
    two panels draw one label alike."""
    from matplotlib.collections import Collection
    from matplotlib.colors import to_hex
    from matplotlib.container import Container
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    if isinstance(handle, Container):
        children = handle.get_children()
        handle = children[0] if children else handle
    if isinstance(handle, Line2D):
        marker = handle.get_marker()
        return ("line", to_hex(handle.get_color()), handle.get_linestyle(), str(marker))
    if isinstance(handle, Patch):
        return ("patch", to_hex(handle.get_facecolor()))
    if isinstance(handle, Collection):
        return ("collection", tuple(to_hex(c) for c in handle.get_facecolor()))
    return ("other", id(handle))


def _legend_columns(fig, labels: list[str]) -> int:
    """How many legend entries fit side by side across ``fig``'s width."""
    size = plt.rcParams["legend.fontsize"]
    size = size if isinstance(size, int | float) else 7.0
    entry = max(len(s) for s in labels) * 0.55 * size / 72 + 0.55  # text + handle, inches
    return max(1, min(len(labels), int(fig.get_figwidth() * 0.95 // entry)))


def legends_outside(fig) -> None:
    """Move every legend of ``fig``'s axes off the data.  Where the axes draw each label
    alike (the same lines in every panel), one legend for the figure below the panels
    (the figure grows by its rows); else each axes' legend beside it, on its right."""
    axes = [ax for ax in fig.axes if ax.get_legend() is not None]
    if not axes:
        return
    entries: dict[str, Any] = {}
    found = [(ax, *_legend_entries(ax)) for ax in axes]
    alike = True
    for _, handles, labels in found:
        for handle, text in zip(handles, labels, strict=True):
            if text in entries and _style(entries[text]) != _style(handle):
                alike = False
            entries.setdefault(text, handle)
    for ax in axes:
        ax.get_legend().remove()
    if fig.get_layout_engine() is None:
        fig.set_layout_engine("constrained")
    if not alike:
        for ax, handles, labels in found:
            ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                      borderaxespad=0.0, frameon=False)  # fmt: skip
        return
    ncol = _legend_columns(fig, list(entries))
    fig.set_figheight(fig.get_figheight() + math.ceil(len(entries) / ncol) * LEGEND_ROW + 0.1)
    fig.legend(list(entries.values()), list(entries), loc="outside lower center", ncol=ncol,
               frameon=False)  # fmt: skip


def add_caption(fig, text: str) -> None:
    """``text`` as one small line above the panels (the setting of the figure), its font
    shrunk down to :data:`MIN_CAPTION_SIZE` to fit the width, wrapped only beyond that."""
    line = fig.suptitle(" ".join(text.split()), fontsize=CAPTION_SIZE, color="0.25")
    renderer = fig.canvas.get_renderer()
    room = fig.get_figwidth() * fig.dpi * 0.92  # hinting at 100 dpi draws text narrower
    size = CAPTION_SIZE
    while line.get_window_extent(renderer).width > room and size > MIN_CAPTION_SIZE:
        size -= 0.5
        line.set_fontsize(size)
    wide = line.get_window_extent(renderer).width
    if wide > room:
        chars = len(line.get_text())
        line.set_text(title(line.get_text(), max(20, int(chars * room / wide))))


def fit_titles(fig) -> None:
    """Re-wrap every axes title wider than its axes (a title cut off at the figure's edge
    says nothing): its words onto as many lines as the axes' width needs."""
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        words = " ".join(ax.title.get_text().split())
        if not words:
            continue
        room = ax.get_position().width * fig.get_figwidth() * fig.dpi * 0.95
        ax.title.set_text(words)
        wide = ax.title.get_window_extent(renderer).width
        if wide > room:
            ax.title.set_text(title(words, max(12, int(len(words) * room / wide))))


def save(
    fig,
    path: Path,
    *,
    suptitle: str | None = None,
    caption: str | None = None,
    dpi: int = DPI,
    legend: bool = True,
) -> Path:
    """Finish ``fig`` for a paper and write it: legends off the data
    (:func:`legends_outside`, unless ``legend=False``), ``caption`` (or ``suptitle``, the
    older name) as one small line on top, constrained layout; saved as PNG at ``path``
    (at least :data:`MIN_DPI`) and as PDF beside it (:data:`FORMATS`), then closed."""
    text = caption or suptitle
    if legend:
        legends_outside(fig)
    if fig.get_layout_engine() is None:
        fig.set_layout_engine("constrained")
    fit_titles(fig)
    if text:
        add_caption(fig, text)
    path = Path(path)
    for suffix in FORMATS:
        meta = {"CreationDate": None} if suffix == ".pdf" else {}
        fig.savefig(path.with_suffix(suffix), dpi=max(dpi, MIN_DPI), metadata=meta)
    plt.close(fig)
    return path.with_suffix(".png")


def per_round(
    frame: pd.DataFrame,
    y: str,
    path: Path,
    *,
    panel: str,
    line: str,
    x: str = "round",
    scale: float = 1.0,
    ylabel: str | None = None,
    xlabel: str | None = None,
    suptitle: str | None = None,
    caption: str | None = None,
    label=str,
    panel_title=str,
    axes_set: dict | None = None,
    **style,
) -> None:
    """One panel per value of ``panel`` (:func:`panels`), in each one :func:`curves` of
    ``y`` against ``x`` with a line per value of ``line`` (legend ``label(value)``, one
    colour per value across the panels; ``axes_set``: more ``Axes.set`` settings, e.g.
    ``yscale``), one legend below the panels and ``caption`` (or ``suptitle``) as a line
    above them; saved to ``path`` (:func:`save`)."""
    shown = list(dict.fromkeys(frame[panel]))
    fig, axes = panels(len(shown))
    colors = {} if "color" in style else line_colors(frame[line])
    for ax, p in zip(axes, shown, strict=True):
        sub = frame[frame[panel] == p]
        curves(ax, sub, y, line=line, x=x, scale=scale, label=label, colors=colors,
               xlabel=xlabel, **style)  # fmt: skip
        ax.set(ylabel=ylabel or y, **(axes_set or {}))
        ax.set_title(title(panel_title(p)))
        ax.legend()
    save(fig, path, caption=caption or suptitle)


def line_colors(values: Iterable[Any]) -> dict[Any, str]:
    """One colour per distinct value, in order of appearance (the same in every panel)."""
    return {v: f"C{i % 10}" for i, v in enumerate(dict.fromkeys(values))}


def plot_epsilon_rounds(
    history: pd.DataFrame,
    path: Path,
    *,
    by: str | Sequence[str],
    label: Callable[..., str] | None = None,
    panel: str | None = None,
    caption: str | None = None,
    ylabel: str = "epsilon (max over clients)",
    panel_title=str,
) -> Path | None:
    """The accounted epsilon against the round: ``history``'s ``epsilon_max`` (every
    federated run's history has it: the largest client epsilon after each round) against
    ``round``, one line per configuration (the values of the columns ``by``), the mean over
    the rows of a round (seeds); one panel per value of ``panel`` where given.

    ``label(*values)`` names a configuration in the legend, its values as text (:func:`short`;
    default ``col=value, ...``).  Configurations whose curves coincide (e.g. two clippings at
    one noise multiplier) share one line, their differing values joined by ``/``, so that no
    line hides another.  Runs without DP (an infinite epsilon) have no curve: left out, and
    the caption says so.  A log epsilon axis where the final epsilons span more than a
    decade.  Saved to ``path`` (:func:`save`: PNG and PDF); returns it, or None (nothing
    written) when no run has a finite epsilon."""
    by = [by] if isinstance(by, str) else list(by)
    eps = history["epsilon_max"].astype(np.float64)
    finite = history[np.isfinite(eps)]
    if finite.empty:
        return None
    keys = [tuple(map(short, v)) for v in finite[by].itertuples(index=False)]
    where = finite[panel].map(short) if panel is not None else pd.Series("", finite.index)
    frame = finite.assign(_key=keys, _panel=where.to_numpy())
    names: dict[tuple[str, tuple], str] = {}  # (panel, configuration) -> its line's label
    for p, sub in frame.groupby("_panel", sort=False):
        means = {
            k: g.groupby("round")["epsilon_max"].mean() for k, g in sub.groupby("_key", sort=False)
        }
        alike: list[list[tuple]] = []
        for k, curve in means.items():
            same = next((a for a in alike if _same_curve(means[a[0]], curve)), None)
            if same is None:
                alike.append([k])
            else:
                same.append(k)
        for group in alike:
            values = tuple("/".join(dict.fromkeys(v)) for v in zip(*group, strict=True))
            text = (
                label(*values)
                if label is not None
                else ", ".join(f"{c}={v}" for c, v in zip(by, values, strict=True))
            )
            names.update({(p, k): text for k in group})
    frame["_config"] = [names[(p, k)] for p, k in zip(frame["_panel"], frame["_key"], strict=True)]
    notes = [caption] if caption else []
    left_out = history.loc[~np.isfinite(eps), by].drop_duplicates()
    if len(left_out):
        notes.append(f"{len(left_out)} run(s) without DP not drawn")
    shown = list(dict.fromkeys(frame["_panel"]))
    fig, axes = panels(len(shown))
    colors = line_colors(frame["_config"])
    for ax, p in zip(axes, shown, strict=True):
        sub = frame[frame["_panel"] == p]
        curves(ax, sub, "epsilon_max", line="_config", x="round", colors=colors, marker=".")
        last = sub[sub["round"] == sub["round"].max()].groupby("_config")["epsilon_max"].mean()
        if len(last) > 1 and last.min() > 0 and last.max() > 10 * last.min():
            ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.set_title(title(panel_title(p)) if panel is not None else "Privacy loss per round")
        ax.legend()
    return save(fig, path, caption="; ".join(notes) or None)


def delta_text(delta: float) -> str:
    """``delta`` for reading, rounded up to 3 significant digits (never understated):
    ``6.96e-05`` for ``6.958942240779402e-05`` (as the ledger's short statement)."""
    from swarmjax.privacy.ledger import round_up_delta

    return round_up_delta(float(delta))


def _same_curve(a: pd.Series, b: pd.Series) -> bool:
    """Whether two epsilon curves (by round) coincide to drawing precision."""
    return a.index.equals(b.index) and bool(np.allclose(a.to_numpy(), b.to_numpy(), rtol=1e-6))


def short(value: Any) -> str:
    """A value as text for reading: floats to 4 significant digits (``8`` for ``8.0``,
    ``6.959e-05``), anything else as ``str``."""
    return f"{value:.4g}" if isinstance(value, float | np.floating) else str(value)


STATEMENTS_SHOWN = 3
"""Composed statements :func:`write_ledger` prints whole; past it, it summarises each unit."""


def write_ledger(ledger) -> Path:
    """Write the experiment's privacy ledger (:class:`swarmjax.privacy.ledger.Ledger`) and
    print where it went and, per privacy unit (and private data source), the statement a
    paper's privacy section can quote (the epsilon of publishing every DP release of the
    experiment together): the short one first (epsilon and delta rounded up for reading,
    unit, accountant), then the full one (what it covers, how it was composed, its
    caveats). Past :data:`STATEMENTS_SHOWN` statements (PAASO: one per configuration's
    swarms) it prints, per unit, their number and the largest one, and where every one
    stands in full (``privacy_ledger.md``)."""
    from swarmjax.privacy.ledger import MARKDOWN_NAME

    path = ledger.write()
    composed = list(ledger.composed().values())
    shown = composed if len(composed) <= STATEMENTS_SHOWN else []
    for comp in shown:  # the short line first, to quote; then in full
        print(f"privacy: {comp.short_statement()}")
        print(f"  in full: {comp.statement(ledger.experiment, str(path))}")
    for unit in dict.fromkeys(c.unit for c in composed) if not shown else ():
        group = [c for c in composed if c.unit == unit]
        largest = max(group, key=lambda c: (c.reason is not None, c.epsilon))
        print(
            f"privacy: {len(group)} {unit}-level statements, one per private data source; "
            f"the largest: {largest.short_statement()}"
        )
    if composed and not shown:
        print(f"  each in full: {path.parent / MARKDOWN_NAME}")
    if ledger.non_private:
        print(f"{len(ledger.non_private)} run(s) without DP are listed there as not private")
    print(f"privacy ledger: {path}")
    return path


def not_covered(
    ledger, what: str, path: Path | str, why: str, *, delta: float | None = None, **labels
) -> int:
    """List in ``ledger`` (a :class:`swarmjax.privacy.ledger.Ledger`) an output that no
    epsilon covers, an exact statistic of the private data or of a run's secret randomness
    (e.g. wall-clock time that follows the secret Poisson cohorts), as a release that is NOT
    private: ``what`` names it, ``why`` says what it reads (the variant's ``not_covered``),
    ``path`` is where it is written, ``labels`` say more.  ``delta`` is a label only
    (default: the ledger's, else its first release's).  Returns its index."""
    from swarmjax.privacy.ledger import Release

    if delta is None:
        delta = (
            ledger.delta
            if ledger.delta is not None
            else next((r.delta for r in ledger.releases), None)
        )
    if delta is None:
        raise ValueError(f"not_covered({what!r}): the ledger has no delta yet; pass delta=")
    variant = {**labels, "not_covered": why}
    release = Release(
        what, variant, None, None, None, delta, math.inf, ledger.accountant, str(path)
    )
    return ledger.add(release)


NULL_REASONS = {  # why a number is null in our JSON, by its value (a caller may say more)
    "nan": "not a number: undefined here (e.g. the std of one seed, or nothing measured)",
    "inf": "infinite (e.g. the epsilon of a run without DP)",
    "-inf": "minus infinity (undefined here)",
}
NULL_SUFFIX = "_null_reason"  # the key beside a nulled number that says why


def _non_finite(value: Any) -> str | None:
    """``"nan"``, ``"inf"`` or ``"-inf"`` for a non-finite real number, else None."""
    if isinstance(value, bool) or not isinstance(value, float | np.floating):
        return None
    v = float(value)
    return None if math.isfinite(v) else "nan" if v != v else "inf" if v > 0 else "-inf"


def _contains_non_finite(value: Any) -> str | None:
    if isinstance(value, list | tuple):
        return next((k for k in map(_contains_non_finite, value) if k), None)
    return _non_finite(value)


def strict(obj: Any, reasons: Mapping[str, str] | None = None) -> Any:
    """``obj`` (dicts, lists, numbers, numpy scalars and arrays) as strict JSON values: every
    NaN or infinity becomes ``None``, and the dict holding it gains ``"<key>_null_reason"``:
    ``reasons[key]`` when given, else what the value was (:data:`NULL_REASONS`)."""
    reasons = reasons or {}
    if isinstance(obj, np.ndarray):
        obj = obj.tolist()
    if isinstance(obj, Mapping):
        out: dict = {}
        for key, value in obj.items():
            kind = _contains_non_finite(value.tolist() if isinstance(value, np.ndarray) else value)
            out[key] = strict(value, reasons)
            if kind is not None and not isinstance(value, Mapping):
                note = NULL_REASONS[kind]
                out[f"{key}{NULL_SUFFIX}"] = reasons.get(str(key), note)
        return out
    if isinstance(obj, list | tuple):
        return [strict(v, reasons) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    return None if _non_finite(obj) else obj


def write_json(path: Path, obj: Any, reasons: Mapping[str, str] | None = None) -> Path:
    """Write ``obj`` to ``path`` as strict JSON (:func:`strict`; ``allow_nan=False``, so a
    NaN that slipped through fails here instead of in a reader); other objects as ``str``."""
    path = Path(path)
    text = json.dumps(strict(obj, reasons), indent=1, allow_nan=False, default=str)
    path.write_text(text + "\n")
    return path


def peak_memory_gib() -> float:
    """Peak resident memory of this process so far, GiB (``resource.getrusage``
    ``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**30 if sys.platform == "darwin" else 2**20)


def finish(out: Path, record: Path | None = None) -> float:
    """End of an experiment: print its peak memory (:func:`peak_memory_gib`) and record it as
    ``peak_memory_gib`` in the JSON object ``record`` (its saved results), then print where
    the results are. Returns the peak in GiB."""
    peak = peak_memory_gib()
    how = "peak resident memory of the process, resource.getrusage ru_maxrss"
    if record is not None:
        record = Path(record)
        saved = json.loads(record.read_text()) if record.exists() else {}
        if not isinstance(saved, dict):
            raise TypeError(f"{record} holds no JSON object to record the peak memory in")
        write_json(record, {**saved, "peak_memory_gib": round(peak, 3), "peak_memory": how})
    print(f"peak memory: {peak:.2f} GiB ({how})" + (f", recorded in {record}" if record else ""))
    print(f"results in {out}", flush=True)
    return peak
