"""Sweeps and figures of ``experiments.paaso`` (imported after XLA devices are set up)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import matplotlib

matplotlib.use("Agg")
import numpy as np
import pandas as pd
from matplotlib.ticker import NullLocator

from experiments import _cli
from experiments._report import grid, panels, save, title, write_json
from experiments.paaso import FIG4, FIG5_AGENTS, PAPER_PROBS, STRATEGIES, fig2_setting
from swarmjax.objectives import get_objective
from swarmjax.paaso import READINGS
from swarmjax.paaso_sweep import PAASOTask, expand_phi
from swarmjax.sweep import load_trajectories, run_sweep

TASK = PAASOTask()
WORK = {"runs": 0, "agent_steps": 0}  # every row of every sweep of this call (resumed too)
PUBLISHED = {"search": "summary.csv"}  # where a sweep's runs are published, if not <name>.csv


def release_path(args: argparse.Namespace, name: str) -> Path:
    """The published file of sweep ``name``'s runs (the ledger's release path)."""
    return args.out / PUBLISHED.get(name, f"{name}.csv")


def _sweep(
    args: argparse.Namespace, name: str, grid: dict[str, Any]
) -> tuple[pd.DataFrame, np.ndarray]:
    out = args.sweeps / name  # resumable, per code fingerprint (experiments/paaso.py)
    supplied = getattr(args, "secret_file", None)
    run_sweep(
        TASK,
        expand_phi(grid),
        out,
        memory_budget=None if args.memory_gb is None else args.memory_gb * 2**30,
        block=args.block,
        progress=_cli.progress_bars(),
        ledger=getattr(args, "ledger", None),  # every configuration, resumed ones too
        release_path=release_path(args, name),
        # the sweep's own secret, saved in its folder (not released), unless --secret-file
        secret=None if supplied is None else supplied.derive(f"paaso/{name}"),
    )
    rows, traj = load_trajectories(out)
    WORK["runs"] += len(rows)
    WORK["agent_steps"] += int((rows["num_agents"] * rows["iterations"]).sum())
    return rows, traj


def _lead() -> bool:
    """Only process 0 of a jax.distributed job writes curves, figures and the summary."""
    return jax.process_index() == 0


def _curves(rows: pd.DataFrame, traj: np.ndarray, by: Sequence[str]) -> pd.DataFrame:
    """Mean and std over runs of the objective per iteration, one curve per ``by`` group."""
    frames = []
    for key, group in rows.groupby(list(by), sort=False):
        key = key if isinstance(key, tuple) else (key,)
        values = traj[group.index.to_numpy()]
        frame = pd.DataFrame(
            {
                "iteration": np.arange(1, values.shape[1] + 1),
                "mean": values.mean(axis=0),
                "std": values.std(axis=0),
                "runs": len(group),
            }
        )
        for col, val in zip(by, key, strict=True):
            frame.insert(0, col, val)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def _log_y(ax) -> None:
    """A log y axis without minor ticks: over many decades matplotlib builds hundreds of
    them, which took most of the figures' rendering time (docs/paaso_speed.md)."""
    ax.set_yscale("log")
    ax.yaxis.set_minor_locator(NullLocator())


def _y_scale(ax, values: np.ndarray) -> str:
    """Log y where every value is positive, symmetric log where the values span two decades
    or more around zero (f5 is negative, converged runs reach 0; from 0 up where none is
    negative), else linear; returns which."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    nonzero = np.abs(v[v != 0])
    if len(v) and (v > 0).all():
        _log_y(ax)
        return "log"
    if len(nonzero) and nonzero.max() >= 100 * nonzero.min():
        ax.set_yscale("symlog", linthresh=max(nonzero.min(), 1e-6 * nonzero.max()))
        ax.yaxis.set_minor_locator(NullLocator())
        if (v >= 0).all():  # an objective at its optimum 0: nothing below it to show
            return "symlog-nonnegative"
        return "symlog"
    return "linear"


def _plot(curves: pd.DataFrame, label: str, title: str, path: Path, ax=None) -> None:
    """Mean objective per iteration, one line per ``label`` value, with a band of one std over
    runs where the curves have it (on a log axis its lower edge stops at a tenth of the mean
    where mean - std <= 0); log or symmetric-log axes where the values span decades.  Its
    own figure (no ``ax``) is one column wide (experiments._report): the title's head
    (before ``": "``) as the title, the rest as the caption line, the legend below."""
    own = ax is None
    if own:
        fig, axes = grid(1, 1)
        ax = axes[0, 0]
    scale = _y_scale(ax, curves["mean"].to_numpy())
    banded = "std" in curves and bool((curves.get("runs", 2) > 1).all())
    for value, c in curves.groupby(label, sort=False):
        mean = c["mean"].to_numpy()
        (line,) = ax.plot(
            c["iteration"], mean, label=f"{label}={value}" if label != "strategy" else value
        )
        if banded:
            std = c["std"].to_numpy()
            low = mean - std
            if scale == "log":
                low = np.where(low > 0, low, mean / 10)
            elif scale == "symlog-nonnegative":
                low = np.maximum(low, 0.0)
            ax.fill_between(
                c["iteration"], low, mean + std, color=line.get_color(), alpha=0.15, lw=0
            )
    if scale == "symlog-nonnegative":
        ax.set_ylim(bottom=0)  # after plotting: the top stays the data's
    ax.set_xlabel("iteration")
    ax.set_ylabel("mean objective" + (" (band: +- 1 std)" if banded else ""))
    ax.grid(alpha=0.3)
    if curves[label].nunique() > 1:  # one line: the title names it
        ax.legend()
    if own:
        head, _, rest = title.partition(": ")
        ax.set_title(head)
        save(fig, path, caption=rest or None)
    else:
        ax.set_title(title_lines(title, ax))


def title_lines(text: str, ax) -> str:
    """``text`` wrapped to the width of ``ax`` (about 11 characters an inch at 9 pt), so a
    title is never cut off."""
    width = ax.get_position().width * ax.figure.get_figwidth()
    return title(text, max(30, int(width * 14)))


def _base(args: argparse.Namespace, settings: dict[str, Any]) -> dict[str, Any]:
    return {
        "function": "f4",
        "num_agents": args.agents,
        "k_alpha": args.k_alpha,
        "iterations": settings["iterations"],
        "fl_rule": args.fl_rule,
        **READINGS[args.reading],
        "seed": list(range(settings["runs"])),
    }


def _figure(args, settings, name, grid, by, title) -> None:
    rows, traj = _sweep(args, name, {**_base(args, settings), **grid})
    if not _lead():
        return
    curves = _curves(rows, traj, by)
    curves.to_csv(args.out / f"{name}.csv", index=False)
    _plot(curves, by[0], title, args.out / f"{name}.png")


def _fmt(params: dict[str, float]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


def run_all(
    args: argparse.Namespace, profile: str, settings: dict[str, Any]
) -> pd.DataFrame | None:
    """Run every sweep, write CSV/PNG per figure, return the summary table (None on the
    processes other than 0 of a jax.distributed job)."""
    args.out.mkdir(parents=True, exist_ok=True)
    # The search first: its large chunks compile each program's full block
    # (swarmjax.sweep.BLOCK), which the small figure sweeps then reuse.
    summary = _search_and_fig6(args, settings)
    runs = settings["runs"]
    fig2 = fig2_setting(args.reading)
    _figure(
        args,
        settings,
        "fig2",
        {"strategy": STRATEGIES, **fig2},
        ["strategy"],
        f"Fig. 2: f4, {args.agents} agents, k={args.k_alpha}, {_fmt(fig2)}, {runs} runs, "
        f"{args.reading} reading",
    )
    _figure(
        args,
        settings,
        "fig3",
        {"strategy": "pbdrd", **fig2, "p_m": PAPER_PROBS},
        ["p_m"],
        f"Fig. 3: PbDRD on f4 for each p_m, {_fmt({**fig2, 'p_m': 'var'})}",
    )
    _figure(
        args,
        settings,
        "fig4",
        {"strategy": STRATEGIES, **FIG4},
        ["strategy"],
        f"Fig. 4: f4, {args.agents} agents, {_fmt(FIG4)}, {runs} runs, {args.reading} reading",
    )
    _figure(
        args,
        settings,
        "fig5",
        {"strategy": "bdrd", **FIG4, "num_agents": FIG5_AGENTS},
        ["num_agents"],
        f"Fig. 5: bDRD on f4 for 50/100/200 agents, {_fmt(FIG4)}",
    )
    return summary


def _record_selections(args: argparse.Namespace, best: pd.DataFrame) -> None:
    """Record in the ledger each choice of ``summary.csv``: per (strategy, function), the
    search's configuration with the lowest mean final objective.  The score is the public
    benchmark function at the released centre (f(pG); f(g) for PSO) averaged over runs:
    post-processing of the candidates' outputs, a public score (no charge)."""
    ledger = getattr(args, "ledger", None)
    if ledger is None:
        return
    path = str(release_path(args, "search"))
    for strategy, function in best[["strategy", "function"]].itertuples(index=False):
        candidates = [
            i
            for i, r in enumerate(ledger.releases)
            if r.path == path
            and r.algorithm == f"paaso_{strategy}"
            and r.variant["function"] == function
        ]
        name = f"best configuration of {strategy} on {function} (lowest mean final objective)"
        ledger.select(name, candidates, score="public")


def _search_and_fig6(args: argparse.Namespace, settings: dict[str, Any]) -> pd.DataFrame:
    grid = {
        **_base(args, settings),
        "strategy": STRATEGIES,
        "function": settings["functions"],
        "w": settings["w"],
        "phi": settings["phi"],
        "w_g": settings["w_g"],
        "speed": settings["speed"],
        "p_c": 1.0,
        "p_m": 0.9,
    }
    rows, traj = _sweep(args, "search", grid)
    if not _lead():
        return None
    config_cols = ["strategy", "function", "w", "phi_p", "w_g", "speed"]
    stats = rows.groupby(config_cols, as_index=False).agg(
        final_mean=("final_objective", "mean"),
        final_std=("final_objective", "std"),
        runs=("seed", "count"),
        eps_drd_basic=("drd_eps_basic", "first"),
        eps_drd_advanced=("drd_eps_advanced", "first"),
        eps_pram_vote=("pram_eps_vote", "first"),
    )
    best = stats.loc[stats.groupby(["strategy", "function"])["final_mean"].idxmin()]
    _record_selections(args, best)
    best = best.assign(
        optimum=[get_objective(f).optimum_value(2) for f in best["function"]],
        strategy=pd.Categorical(best["strategy"], STRATEGIES, ordered=True),
    ).sort_values(["function", "strategy"])
    best.to_csv(args.out / "summary.csv", index=False)
    write_json(
        args.out / "summary.json",
        best.to_dict(orient="records"),
        dict.fromkeys(
            ("eps_drd_basic", "eps_drd_advanced", "eps_pram_vote"),
            "PSO and FL make no DP claim: their epsilon is infinite",
        ),
    )

    pb = best[best["strategy"] == "pbdrd"]
    chosen = rows.merge(pb[config_cols], on=config_cols)
    index = rows.reset_index().merge(pb[config_cols], on=config_cols)["index"].to_numpy()
    curves = _curves(chosen.reset_index(drop=True), traj[index], ["function"])
    curves.to_csv(args.out / "fig6.csv", index=False)
    functions = list(dict.fromkeys(curves["function"]))
    fig, axes = panels(len(functions))
    for ax, fn in zip(axes, functions, strict=True):
        c = curves[curves["function"] == fn]
        cfg = pb[pb["function"] == fn].iloc[0]
        title = f"{fn}: w={cfg.w}, phi={cfg.phi_p}, wG={cfg.w_g}, speed={cfg.speed}"
        _plot(c, "function", title, Path(), ax=ax)
    save(
        fig,
        args.out / "fig6.png",
        caption="Fig. 6: PbDRD (p_m 0.9), best configuration per function",
    )
    table = best.assign(
        final=[f"{m:.4g} +/- {s:.2g}" for m, s in zip(best.final_mean, best.final_std, strict=True)]
    )
    columns = [
        "function",
        "strategy",
        "w",
        "phi_p",
        "w_g",
        "speed",
        "final",
        "optimum",
        "eps_drd_basic",
        "eps_pram_vote",
    ]
    return table[columns]
