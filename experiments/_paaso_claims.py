"""The PAASO paper's findings checked side by side: Fig. 1, the k_alpha study, ``claims.csv``.

:func:`run_claims` runs two cheap sweeps the figure pipeline lacks, ``fig1`` (every strategy
at the Figs. 1-3 setting under both readings of its inertia, 20 runs: Fig. 1 plots two of
them) and ``kalpha`` (the voting strategies for k_alpha in {4, 8, 16, 32} at the Fig. 2 and
Fig. 4 settings), then reads those and the pipeline's ``fig3``, ``fig4``, ``fig5`` sweeps and
``summary.csv`` to write one row per finding of the paper's section 4 and conclusions:
the paper's evidence, ours (mean +/- std over runs) and whether it holds.  The decision
rules are the small functions below (``converge_iteration``, ``kruskal_p``,
``less_p``); docs/paaso.md gives the readings behind the default settings.
"""

from __future__ import annotations

import argparse
import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from experiments import _report
from experiments._paaso_figures import _base, _curves, _lead, _log_y, _sweep
from experiments.paaso import FIG2_INERTIA, FIG4, STRATEGIES, fig2_setting
from swarmjax.objectives import get_objective
from swarmjax.paaso import READINGS
from swarmjax.paaso import VOTING as _VOTING

VOTING = list(_VOTING)
K_ALPHAS = [4, 8, 16, 32]
CONVERGED = 1.0  # f4: the mean f over runs below this counts as converged
ALPHA = 0.05  # significance level of the "no effect" / "faster" tests
MIN_ITERATIONS = 500  # the convergence claims are about iteration 500 (of the paper's 1000)
MIN_RUNS = 10  # fewer runs per setting: a rank test cannot tell an effect from none


def converge_iteration(objective: np.ndarray, threshold: float = CONVERGED) -> float:
    """First iteration (1-based) at which the mean over runs of ``(runs, T)`` is below
    ``threshold``; ``inf`` if never."""
    below = np.asarray(objective).mean(axis=0) < threshold
    return float(np.argmax(below) + 1) if below.any() else math.inf


def kruskal_p(groups: Sequence[np.ndarray]) -> float:
    """Kruskal-Wallis p-value that the groups' final values share one distribution
    (1.0 when every value is equal, where the test is undefined)."""
    flat = np.concatenate([np.asarray(g, dtype=float) for g in groups])
    if np.all(flat == flat[0]):
        return 1.0
    return float(stats.kruskal(*groups).pvalue)


def less_p(a: np.ndarray, b: np.ndarray) -> float:
    """One-sided Mann-Whitney p-value that ``a`` tends to be smaller than ``b``."""
    return float(stats.mannwhitneyu(a, b, alternative="less").pvalue)


def _ms(values: np.ndarray) -> str:
    values = np.asarray(values, dtype=float)
    std = values.std(ddof=1) if len(values) > 1 else math.nan
    return f"{values.mean():.3g} ± {std:.2g}"


def _it(value: float) -> str:
    return "never" if math.isinf(value) else f"{int(value)}"


def _select(rows: pd.DataFrame, **where: Any) -> np.ndarray:
    mask = np.ones(len(rows), bool)
    for k, v in where.items():
        col = rows[k]
        mask &= np.isclose(col, v) if isinstance(v, float) else (col == v).to_numpy()
    return np.flatnonzero(mask)


# --- the two sweeps -------------------------------------------------------------------


def _fig1(args: argparse.Namespace, settings: dict[str, Any]) -> tuple[pd.DataFrame, np.ndarray]:
    fig2 = fig2_setting(args.reading)
    grid = {
        **_base(args, settings),
        **fig2,
        "strategy": STRATEGIES,
        "w": sorted(FIG2_INERTIA.values()),
    }
    rows, traj = _sweep(args, "fig1", grid)
    if not _lead():  # jax.distributed: process 0 writes
        return rows, traj
    shown = rows[rows["seed"] < 2]
    frame = pd.concat(
        [
            pd.DataFrame(
                {
                    "strategy": r.strategy,
                    "w": r.w,
                    "execution": r.seed + 1,
                    "iteration": np.arange(1, traj.shape[1] + 1),
                    "objective": traj[i],
                }
            )
            for i, r in shown.iterrows()
        ],
        ignore_index=True,
    )
    frame.to_csv(args.out / "fig1.csv", index=False)
    readings = {w: name for name, w in FIG2_INERTIA.items()}
    ws = sorted(frame["w"].unique(), key=lambda w: not np.isclose(w, fig2["w"]))
    fig, axes = _report.grid(2, len(ws), sharex=True)
    colors = _report.line_colors(frame["strategy"])
    for col, w in enumerate(ws):
        for row, execution in enumerate((1, 2)):
            ax = axes[row, col]
            part = frame[np.isclose(frame["w"], w) & (frame["execution"] == execution)]
            for strategy, c in part.groupby("strategy", sort=False):
                ax.plot(c["iteration"], np.maximum(c["objective"], 1e-12), label=strategy,
                        color=colors[strategy])  # fmt: skip
            _log_y(ax)
            name = readings.get(min(readings, key=lambda x: abs(x - w)), "")
            ax.set_title(f"run {execution}, w = {w:g} ({name})")
            ax.set_xlabel("iteration")
            ax.set_ylabel("objective" if col == 0 else "")
            ax.grid(alpha=0.3)
            ax.legend()
    _report.save(
        fig,
        args.out / "fig1.png",
        caption=f"Fig. 1: two runs on f4, {args.agents} agents, k={args.k_alpha}, phi=2, "
        f"wG={fig2['w_g']}, p_c=1, p_m=0.9, {args.reading} reading ("
        + ", ".join(f"{k} {v:g}" for k, v in READINGS[args.reading].items())
        + "); objective f(g) for PSO, f(pG) otherwise",
    )
    return rows, traj


def _settings(reading: str) -> dict[str, dict[str, float]]:
    """The two settings of the k_alpha study: Fig. 2's (under ``reading``) and Fig. 4's."""
    return {"Fig. 2": fig2_setting(reading), "Fig. 4": FIG4}


def _kalpha(args: argparse.Namespace, settings: dict[str, Any]) -> tuple[pd.DataFrame, np.ndarray]:
    studied = _settings(args.reading)
    # w and wG are array leaves: one compiled program per (strategy, k_alpha) runs both
    # settings (and the two mixed ones, dropped below).
    grid = {
        **_base(args, settings),
        "strategy": VOTING,
        "k_alpha": settings.get("k_alphas", K_ALPHAS),
        "w": sorted({s["w"] for s in studied.values()}),
        "w_g": sorted({s["w_g"] for s in studied.values()}),
        "phi": FIG4["phi"],
        "p_c": FIG4["p_c"],
        "p_m": FIG4["p_m"],
    }
    rows, traj = _sweep(args, "kalpha", grid)
    if not _lead():  # jax.distributed: process 0 writes
        return rows, traj
    rows = rows.assign(setting="")
    for name, s in studied.items():
        rows.loc[_select(rows, w=s["w"], w_g=s["w_g"]), "setting"] = name
    keep = np.flatnonzero(rows["setting"] != "")
    rows, traj = rows.iloc[keep].reset_index(drop=True), traj[keep]
    curves = _curves(rows, traj, ["setting", "strategy", "k_alpha"])
    curves.to_csv(args.out / "kalpha.csv", index=False)
    fig, axes = _report.grid(len(VOTING), 2, sharex=True)
    colors = _report.line_colors(curves["k_alpha"])
    for col, name in enumerate(studied):
        for row, strategy in enumerate(VOTING):
            ax = axes[row, col]
            part = curves[(curves["setting"] == name) & (curves["strategy"] == strategy)]
            for k, c in part.groupby("k_alpha"):
                ax.plot(c["iteration"], c["mean"], label=f"k_alpha={k}", color=colors[k])
            _log_y(ax)
            s = studied[name]
            ax.set_title(f"{strategy}, {name} (w={s['w']}, wG={s['w_g']})")
            ax.set_xlabel("iteration")
            ax.set_ylabel("mean f(pG)" if col == 0 else "")
            ax.grid(alpha=0.3)
            ax.legend()
    caption = f"k_alpha study on f4, {args.agents} agents, mean over {settings['runs']} runs"
    _report.save(fig, args.out / "kalpha.png", caption=caption)
    return rows, traj


# --- the findings ---------------------------------------------------------------------


def _ordering(rows: pd.DataFrame, traj: np.ndarray, w: float, reading: str) -> list[dict]:
    """Figs. 1-2: PSO fastest, FL next and close, voting slower but converged by 500."""
    T = traj.shape[1]
    at = min(500, T)
    obj = {s: traj[_select(rows, strategy=s, w=w)] for s in STRATEGIES}
    it = {s: converge_iteration(o) for s, o in obj.items()}
    setting = f"f4, Fig. 2 setting, w = {w:g} ({reading} reading)"
    speeds = ", ".join(f"{s} {_it(v)}" for s, v in it.items())
    finals = ", ".join(f"{s} {_ms(o[:, at - 1])}" for s, o in obj.items())
    others = [s for s in STRATEGIES if s != "pso"]
    fl_next = it["fl"] < min(it[s] for s in VOTING) and it["fl"] < math.inf
    voting = all(it["pso"] < it[s] <= at for s in VOTING)
    none = (
        None
        if any(v < math.inf for v in it.values())
        else (f"no strategy reached mean f < {CONVERGED:g} in {T} iterations")
    )
    return [
        {
            "finding": "PSO converges fastest",
            "paper": "Figs. 1-2, section 5",
            "setting": setting,
            "swarmjax": f"first iteration with mean f < {CONVERGED:g}: {speeds}",
            "holds": _yes(it["pso"] < min(it[s] for s in others), none),
        },
        {
            "finding": "FL next, close to PSO, converged by 500 iterations",
            "paper": "Fig. 1, section 4.3",
            "setting": setting,
            "swarmjax": f"f at iteration {at}: {finals}",
            "holds": _yes(fl_next and it["fl"] <= at, _short(T)),
        },
        {
            "finding": "the voting strategies slower than PSO, converged by 500 iterations",
            "paper": "Figs. 1-2",
            "setting": setting,
            "swarmjax": f"first iteration with mean f < {CONVERGED:g}: {speeds}",
            "holds": _yes(voting, _short(T)),
        },
    ]


def _yes(flag: bool, untestable: str | None = None) -> str:
    """``"yes"`` / ``"no"``; ``"n/a (<why>)"`` where the run cannot test the claim."""
    if untestable:
        return f"n/a ({untestable})"
    return "yes" if flag else "no"


def _short(iterations: int | None) -> str | None:
    """Why a convergence claim is untestable in a run of ``iterations`` (None: testable)."""
    if iterations is not None and iterations < MIN_ITERATIONS:
        return (
            f"{iterations} iterations: the claim is about convergence by iteration "
            f"{MIN_ITERATIONS}; run without --quick"
        )
    return None


def _few(rows: pd.DataFrame) -> str | None:
    """Why a rank-test claim is untestable with the runs of ``rows`` (None: testable)."""
    runs = rows["seed"].nunique() if "seed" in rows else MIN_RUNS
    if runs < MIN_RUNS:
        return f"{runs} runs per setting: too few for the test; run without --quick"
    return None


def _fig4(rows: pd.DataFrame, traj: np.ndarray) -> dict:
    final = {s: traj[_select(rows, strategy=s), -1] for s in STRATEGIES if s != "pso"}
    fl_conv = float(np.mean(final["fl"] < CONVERGED))
    worse = all(final["fl"].mean() > final[s].mean() for s in VOTING)
    return {
        "finding": "FL worse than the voting strategies, rarely converging (std <= 0.03)",
        "paper": "Fig. 4",
        "setting": "f4, w 0.005, phi 2, wG 0.01",
        "swarmjax": "final f: "
        + ", ".join(f"{s} {_ms(v)}" for s, v in final.items())
        + f"; FL runs below {CONVERGED:g}: {fl_conv:.0%}",
        "holds": _yes(worse and fl_conv <= 0.2, _short(traj.shape[1])),
    }


def _pm(rows: pd.DataFrame, traj: np.ndarray, w: float) -> dict:
    values = sorted(rows["p_m"].unique())
    finals = [traj[_select(rows, p_m=float(p)), -1] for p in values]
    early = min(100, traj.shape[1])
    firsts = [traj[_select(rows, p_m=float(p)), early - 1].mean() for p in values]
    p = kruskal_p(finals)
    return {
        "finding": "PRAM's p_m has little effect",
        "paper": "Fig. 3: final std 0.03-0.05, same trend for every p_m",
        "setting": f"PbDRD, f4, Fig. 2 setting (w = {w:g})",
        "swarmjax": "final f: "
        + ", ".join(f"p_m {v:g} {_ms(f)}" for v, f in zip(values, finals, strict=True))
        + f"; Kruskal-Wallis p = {p:.2g}; mean f at iteration {early}: "
        + "/".join(f"{m:.3g}" for m in firsts),
        "holds": _yes(p >= ALPHA, _few(rows)),
    }


def _k_alpha(rows: pd.DataFrame, traj: np.ndarray) -> dict:
    parts, tests = [], []
    for name in dict.fromkeys(rows["setting"]):
        for strategy in VOTING:
            k_alphas = sorted(rows["k_alpha"].unique())
            finals = [
                traj[_select(rows, setting=name, strategy=strategy, k_alpha=k), -1]
                for k in k_alphas
            ]
            early = min(100, traj.shape[1])
            firsts = [
                traj[_select(rows, setting=name, strategy=strategy, k_alpha=k), early - 1]
                for k in k_alphas
            ]
            p = kruskal_p(finals)
            tests.append(p)
            means = "/".join(f"{f.mean():.3g}" for f in finals)
            at_early = "/".join(f"{f.mean():.3g}" for f in firsts)
            parts.append(f"{strategy} {name} {means} (p = {p:.2g}; at {early}: {at_early})")
    return {
        "finding": "k_alpha has little effect, larger sometimes slightly worse",
        "paper": "section 4.3 (no figure), section 5",
        "setting": "voting strategies, f4, Fig. 2 and Fig. 4 settings",
        "swarmjax": f"mean f for k_alpha {'/'.join(map(str, k_alphas))}, final and early: "
        + "; ".join(parts)
        + f"; final values compared by Kruskal-Wallis at {ALPHA:g}/{len(tests)} (Bonferroni)",
        "holds": _yes(min(tests) >= ALPHA / len(tests), _few(rows)),
    }


def _agents(rows: pd.DataFrame, traj: np.ndarray) -> dict:
    sizes = sorted(rows["num_agents"].unique())
    area = {n: traj[_select(rows, num_agents=n)].mean(axis=1) for n in sizes}
    it = {n: converge_iteration(traj[_select(rows, num_agents=n)]) for n in sizes}
    ps = [less_p(area[b], area[a]) for a, b in itertools.pairwise(sizes)]
    return {
        "finding": "doubling the agents speeds convergence markedly",
        "paper": "Fig. 5",
        "setting": "bDRD, f4, w 0.005, phi 2, wG 0.01",
        "swarmjax": "mean f over the run: "
        + ", ".join(f"{n} agents {_ms(area[n])}" for n in sizes)
        + "; iterations until mean f < 1: "
        + ", ".join(f"{n} {_it(it[n])}" for n in sizes)
        + "; Mann-Whitney p per doubling "
        + ", ".join(f"{p:.2g}" for p in ps),
        "holds": _yes(max(ps) < ALPHA, _few(rows)),
    }


F5_CLAIM = "f5 unsolved by every privacy-aware strategy (best -7.9; PSO -837)"
PER_FUNCTION_CLAIM = "the best (w, phi, wG) differs per function and strategy"


def _summary_claims(summary: pd.DataFrame, iterations: int | None = None) -> list[dict]:
    """The claims read from the search table ``summary``; those its functions or its
    ``iterations`` cannot test are rows whose ``holds`` is ``n/a (<why>)``."""
    out = []
    f5 = summary[summary["function"] == "f5"]
    searched = " ".join(dict.fromkeys(summary["function"]))
    if not len(f5):
        out.append(
            {
                "finding": F5_CLAIM,
                "paper": "Fig. 6, section 4.3",
                "setting": "f5, best configuration of the search per strategy",
                "swarmjax": f"f5 not searched (functions: {searched})",
                "holds": _yes(False, "this run does not search f5; run without --quick"),
            }
        )
    if len(f5):
        opt = get_objective("f5").optimum_value(2)
        best = dict(zip(f5["strategy"], f5["final_mean"], strict=True))
        private = {s: v for s, v in best.items() if s != "pso"}
        out.append(
            {
                "finding": F5_CLAIM,
                "paper": "Fig. 6, section 4.3",
                "setting": "f5, best configuration of the search per strategy",
                "swarmjax": "best mean final f: "
                + ", ".join(f"{s} {v:.4g}" for s, v in best.items())
                + f" (optimum {opt:.4g})",
                "holds": _yes(
                    all(v - opt > 0.1 * abs(opt) for v in private.values()), _short(iterations)
                ),
            }
        )
    others = summary[summary["function"] != "f5"]
    if len(others):
        gap = others["final_mean"] - others["optimum"]
        solved = others[gap < CONVERGED].groupby("strategy")["function"].agg(list)
        private = [s for s in STRATEGIES if s != "pso"]
        total = others["function"].nunique()
        out.append(
            {
                "finding": "privacy slows convergence but does not prevent it (f5 aside)",
                "paper": "sections 4.3 and 5",
                "setting": "every function but f5, best configuration per strategy",
                "swarmjax": f"functions whose best mean final f is within {CONVERGED:g} of the "
                "optimum: "
                + "; ".join(
                    f"{s} {len(solved.get(s, []))}/{total} ({' '.join(solved.get(s, []))})"
                    for s in private
                ),
                "holds": _yes(
                    all(len(solved.get(s, [])) == total for s in private), _short(iterations)
                ),
            }
        )
    cols = ["w", "phi_p", "w_g", "speed"]
    configs = summary.assign(config=summary[cols].astype(str).agg("/".join, axis=1))
    per_strategy = configs.groupby("strategy", observed=True)["config"].nunique()
    per_function = configs.groupby("function")["config"].nunique()
    if configs["function"].nunique() == 1:
        out.append(
            {
                "finding": PER_FUNCTION_CLAIM,
                "paper": "section 5",
                "setting": "search over w, phi, wG, speed per strategy and function",
                "swarmjax": f"one function searched ({searched})",
                "holds": _yes(
                    False, "one function cannot differ from another; run without --quick"
                ),
            }
        )
    if configs["function"].nunique() > 1:
        out.append(
            {
                "finding": PER_FUNCTION_CLAIM,
                "paper": "section 5",
                "setting": "search over w, phi, wG, speed per strategy and function",
                "swarmjax": "distinct best configurations across functions: "
                + ", ".join(f"{s} {n}" for s, n in per_strategy.items())
                + f"; across strategies per function: {per_function.min()}-"
                f"{per_function.max()} of {configs['strategy'].nunique()}",
                "holds": _yes(per_strategy.min() > 1 and per_function.max() > 1),
            }
        )
    return out


def run_claims(args: argparse.Namespace, settings: dict[str, Any]) -> pd.DataFrame | None:
    """Run the ``fig1`` and ``kalpha`` sweeps, write their figures + CSVs and ``claims.csv``.

    Needs the pipeline's ``fig3``, ``fig4``, ``fig5`` sweeps and ``summary.csv`` in
    ``args.out`` (run :func:`experiments._paaso_figures.run_all` first).
    """
    fig1_rows, fig1_traj = _fig1(args, settings)
    k_rows, k_traj = _kalpha(args, settings)
    if not _lead():  # jax.distributed: every process runs its share, process 0 the rest
        return None
    claims = []
    w = fig2_setting(args.reading)["w"]
    for name, value in sorted(FIG2_INERTIA.items(), key=lambda kv: kv[1] != w):
        claims += _ordering(fig1_rows, fig1_traj, value, name)
    claims.append(_fig4(*_load(args.sweeps, "fig4")))
    claims.append(_pm(*_load(args.sweeps, "fig3"), w))
    claims.append(_k_alpha(k_rows, k_traj))
    claims.append(_agents(*_load(args.sweeps, "fig5")))
    claims += _summary_claims(pd.read_csv(args.out / "summary.csv"), settings["iterations"])
    reading = ", ".join(f"{k} {v:g}" for k, v in READINGS[args.reading].items())
    table = pd.DataFrame(claims).assign(
        reading=f"{args.reading} ({reading})",
        runs=settings["runs"],
        iterations=settings["iterations"],
    )
    table.to_csv(args.out / "claims.csv", index=False)
    (args.out / "claims.md").write_text(_markdown(table))
    return table


def _load(out: Path, name: str) -> tuple[pd.DataFrame, np.ndarray]:
    from swarmjax.sweep import load_trajectories

    return load_trajectories(out / name)


def _markdown(table: pd.DataFrame) -> str:
    cols = ["finding", "paper", "setting", "swarmjax", "holds"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in table[cols].itertuples(index=False):
        lines.append("| " + " | ".join(str(v).replace("|", "/") for v in r) + " |")
    return "\n".join(lines) + "\n"
