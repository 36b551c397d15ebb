"""Shared reporting of the federated experiments (``fed_dp_pso``, ``dp_fedavg``,
``combined_learning``): mean +- std over seeds as numbers and as markdown text, tables
written as CSV + markdown, and figures of a metric per round with an error band over seeds
(mean +- sample std, ``fill_between``), saved as PNG with titles that fit their axes.

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
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

__all__ = [
    "band",
    "finish",
    "grid",
    "mean_std",
    "mean_std_text",
    "not_covered",
    "peak_memory_gib",
    "per_round",
    "save",
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
    """``text`` wrapped to lines of at most ``width`` characters."""
    return "\n".join(textwrap.wrap(text, width)) or text


def grid(rows: int, cols: int, *, width: float = 4.5, height: float = 3.5):
    """``(figure, axes[rows, cols])``: one panel per cell."""
    return plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)


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
    sample std as a band (none where there is one seed)."""
    g = frame.groupby(x)[y]
    mean = g.mean() * scale
    std = g.std(ddof=1).fillna(0.0) * scale
    (line,) = ax.plot(mean.index, mean.values, label=label, **style)
    if x == "round":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if g.size().max() > 1:
        ax.fill_between(mean.index, mean - std, mean + std, color=line.get_color(), alpha=0.2, lw=0)


def save(fig, path: Path, *, suptitle: str | None = None, dpi: int = 120) -> None:
    """Lay ``fig`` out, save it as PNG at ``path`` and close it."""
    if suptitle:
        fig.suptitle(title(suptitle, int(fig.get_figwidth() * 10)))
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


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
    suptitle: str | None = None,
    label=str,
    panel_title=str,
    axes_set: dict | None = None,
    **style,
) -> None:
    """One panel per value of ``panel``, in each one :func:`band` of ``y`` against ``x``
    per value of ``line`` (legend ``label(value)``; ``axes_set``: more ``Axes.set`` settings,
    e.g. ``yscale``), saved to ``path``."""
    panels = list(dict.fromkeys(frame[panel]))
    fig, axes = grid(1, len(panels), width=4)
    for ax, p in zip(axes[0], panels, strict=True):
        sub = frame[frame[panel] == p]
        for v in dict.fromkeys(sub[line]):
            band(ax, sub[sub[line] == v], y, x=x, scale=scale, label=label(v), **style)
        ax.set(xlabel=x, ylabel=ylabel or y, title=title(panel_title(p)), **(axes_set or {}))
        ax.legend(fontsize=7)
    save(fig, path, suptitle=suptitle)


def write_ledger(ledger) -> Path:
    """Write the experiment's privacy ledger (:class:`swarmjax.privacy.ledger.Ledger`) and
    print where it went and, per privacy unit, the statement a paper's privacy section can
    quote (the epsilon of publishing every DP release of the experiment together)."""
    path = ledger.write()
    for comp in ledger.composed().values():
        print(comp.statement(ledger.experiment, str(path)))
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
