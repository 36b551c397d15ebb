"""Fed-DP-PSO readings study: which of the authors' design choices, alone and together, close
the gaps to Tables 1-2, on VALIDATION splits only (the test set is never read).
``python -m experiments.fed_dp_pso_study [--quick] [--datasets ...] [--readings ...]``.

The training split is cut once (public randomness, ``default_rng(1)``) into a validation
split (``--val-rows``), the public rows of ``pixel_public`` scaling (``--public-rows``, held
out for every reading so all readings train on the same client rows) and the client pool,
from which ``--n-train`` rows are drawn and partitioned (Flower's partitioners, seed 42,
plus the partition readings: other partition seeds, ``self_balancing``). The global model
is scored on the validation split after every round: the table gives the final round (mean
+- std over seeds), the mean of the last three rounds, and the round-to-round variability
(mean absolute change between consecutive rounds, and the range over rounds 2..R).

Results go to ``results/fed_dp_pso_study/``: ``runs.csv`` (one row per run and seed),
``rounds.csv`` (per round), ``table.csv`` and ``table.md`` (grow as calls finish) and the
privacy ledger ``privacy_ledger.json/.md`` (every run as a release; the readings compared
per cell are recorded as selections by a public score: the validation split is held out of
the client pool, so no client's data is read; the partitions' coverage and label skew, exact
statistics of the clients' labels, as not covered); calls are saved under ``calls/`` and reused
on a rerun (``--restart`` recomputes).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from experiments import _cli, _report
from experiments._fed_dp_pso_parts import record_delta
from experiments.fed_dp_pso import PAPER, paper_accuracy
from swarmjax.fl import flower_partition, load_dataset, stack_clients
from swarmjax.fl.algorithms import registry
from swarmjax.fl.algorithms.fed_dp_pso import READINGS, Reading, paper_model
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data import Dataset
from swarmjax.fl.data.partition import label_skew
from swarmjax.fl.data.transforms import public_mask, scale_inputs
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import Execution, simulate
from swarmjax.privacy.ledger import Ledger, saved_releases

# One design choice at a time on top of "current", then all of them ("authors"), then all
# but the shared initialisation (the first check found it hurts on Dirichlet 0.3).
_CURRENT = READINGS["current"]
STUDY_READINGS: dict[str, Reading] = {
    "current": _CURRENT,
    "authors": READINGS["authors"],
    "shared_init": replace(_CURRENT, init="shared"),
    "refine_always": replace(_CURRENT, refine_update="always"),
    "persistent_adam": replace(_CURRENT, optimizer_state="persistent"),
    "tensor_r_clamp": replace(_CURRENT, tensor_coefficients=True, velocity_clamp=0.1),
    "pixel_l2": replace(_CURRENT, input_scaling="pixel_public", weight_decay="coupled"),
    "authors_indep_init": replace(READINGS["authors"], init="independent"),
}
PARTS = ("iid", "dir0.3", "dir1")
# partition readings of Dirichlet 0.3 (run for "current" and "authors" only)
PARTITION_READINGS = {
    "dir0.3_seed0": dict(alpha=0.3, seed=0),
    "dir0.3_seed1": dict(alpha=0.3, seed=1),
    "dir0.3_balanced": dict(alpha=0.3, seed=42, self_balancing=True),
}
PRESETS = {
    "quick": dict(datasets=["digits"], n_train=600, val_rows=300, public_rows=100, rounds=2,
                  seeds=1, eval_subset=None, batch_size=32, readings=["current", "authors"],
                  eps=[math.inf]),
    "default": dict(datasets=["mnist"], n_train=10_000, val_rows=5_000, public_rows=1_000,
                    rounds=5, seeds=2, eval_subset=500, batch_size=64,
                    readings=list(STUDY_READINGS), eps=[math.inf, 8.0]),
}  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    p = _cli.parser(
        "fed_dp_pso_study",
        __doc__.split("\n\n")[0],
        quick="CI: digits, current vs authors, 2 rounds",
        full="same as the default (the study is reduced by design)",
        data="mnist/, fashion_mnist/ (IDX)",
        seeds="quick 1, default 2",
        privacy="records",
    )
    p.add_argument("--datasets", nargs="+", choices=("digits", "mnist", "fashion_mnist"))
    p.add_argument("--readings", nargs="+", choices=tuple(STUDY_READINGS))
    p.add_argument("--epsilons", nargs="+", type=_cli.epsilon_target("--epsilons", allow_inf=True))
    p.add_argument("--rounds", type=_cli.count("--rounds", 2), help="R (default 5)")
    p.add_argument("--n-train", type=_cli.count("--n-train", 10), help="client rows in all")
    p.add_argument("--val-rows", type=_cli.count("--val-rows"), help="validation rows")
    p.add_argument(
        "--no-partition-readings", action="store_true", help="skip the extra Dirichlet splits"
    )
    return p


def _plan(args: argparse.Namespace) -> dict:
    plan = dict(PRESETS["quick" if args.quick else "default"])
    for k in ("datasets", "readings", "rounds", "n_train", "val_rows", "seeds"):
        if getattr(args, k, None) is not None:
            plan[k] = getattr(args, k)
    if args.epsilons is not None:
        plan["eps"] = sorted(set(args.epsilons), key=lambda e: (not math.isinf(e), e))
    plan["partition_readings"] = not args.no_partition_readings
    plan["accountant"] = args.accountant
    plan["delta"] = args.delta  # None: 0.1 / client records (default_delta)
    return plan


def splits(name: str, plan: dict, data_dir) -> tuple[Dataset, np.ndarray]:
    """The training split cut into (pool + validation as its "test" split, public mask of
    the pool); the test split is dropped here and never read again."""
    full = load_dataset(name, data_dir)
    n = len(full.y_train)
    val = np.zeros(n, bool)
    val[np.random.default_rng(1).choice(n, plan["val_rows"], replace=False)] = True
    ds = Dataset(
        name,
        full.x_train[~val],
        full.y_train[~val],
        full.x_train[val],
        full.y_train[val],
        full.num_classes,
    )
    return ds, public_mask(len(ds.y_train), plan["public_rows"], seed=0)


def _data_for(ds: Dataset, public: np.ndarray, reading: Reading, plan: dict) -> Dataset:
    """Scaled as the reading says; the public rows dropped in every case; ``n_train`` rows
    drawn with ``default_rng(0)`` (the same client rows for every reading)."""
    scaled = scale_inputs(ds, reading.input_scaling, plan["public_rows"], seed=0)
    if reading.input_scaling != "pixel_public":
        scaled = replace(scaled, x_train=scaled.x_train[~public], y_train=scaled.y_train[~public])
    rows = np.sort(
        np.random.default_rng(0).choice(len(scaled.y_train), plan["n_train"], replace=False)
    )
    return replace(scaled, x_train=scaled.x_train[rows], y_train=scaled.y_train[rows])


def _partitions(y: np.ndarray, plan: dict, extra: bool) -> dict:
    parts = {}
    for part in PARTS:
        if part == "iid":
            parts[part] = flower_partition(y, 5, "iid", seed=42)
        else:
            parts[part] = flower_partition(y, 5, "dirichlet", seed=42, alpha=float(part[3:]))
    if extra:
        for label, kw in PARTITION_READINGS.items():
            kw = dict(kw)
            parts[label] = flower_partition(y, 5, "dirichlet", seed=kw.pop("seed"), **kw)
    return parts


def class_coverage(part, y: np.ndarray, y_val: np.ndarray, threshold: float) -> float:
    """Largest share of the validation set whose class a single client holds at least
    ``threshold`` (a fraction of all client rows) examples of: the ceiling of a model that
    never mixes across clients."""
    counts = part.histogram().drop(columns="total").to_numpy()
    share = np.bincount(y_val, minlength=counts.shape[1]) / len(y_val)
    held = counts >= threshold * len(y)
    return float(np.max(held @ share))


def _variability(acc: np.ndarray) -> dict:
    """``acc (rounds,)`` of one run -> final, last-3 mean, max, round-to-round change."""
    return dict(
        final=acc[-1],
        last3=acc[-3:].mean(),
        best_round=acc.max(),
        mean_abs_change=np.abs(np.diff(acc)).mean() if len(acc) > 1 else math.nan,
        range_after_1=acc[1:].max() - acc[1:].min() if len(acc) > 1 else math.nan,
    )


def _call(alg, grid: dict, clients, ds, plan: dict, path: str, *, secret):
    """One simulator call of ``alg`` with the registry's ``grid`` values (one target) x
    every seed: (history, ``{"releases": its runs as privacy-ledger releases written at
    path}``); ``secret``: the call's (:meth:`~swarmjax.resume.CallStore.secret`)."""
    t0 = time.perf_counter()
    delta = record_delta(plan["delta"], clients.sizes)
    spec = RunSpec(plan["rounds"], delta, tuple(range(plan["seeds"])), plan["accountant"])
    variants = Variants.grid(alg, clients, spec, **grid)
    test, execution = (ds.x_test, ds.y_test), Execution(progress=_cli.progress_bars())
    res = simulate(alg, clients, test, variants, secret=secret, execution=execution)
    h = res.history.rename(columns={"test_accuracy": "val_accuracy"})
    h = h.assign(epsilon_max=res.privacy.final_epsilon.max(), seconds=time.perf_counter() - t0)
    return h, {"releases": saved_releases(res, algorithm="fed_dp_pso", path=path, data=ds.name)}


def _summarise(h: pd.DataFrame) -> list[dict]:
    rows = []
    for seed, g in h.groupby("seed"):
        acc = g.sort_values("round")["val_accuracy"].to_numpy() * 100
        rows.append(dict(seed=seed, **_variability(acc)))
    return rows


def _table(runs: pd.DataFrame, out: Path, header: str) -> None:
    keys = ["dataset", "partition", "epsilon", "reading"]
    agg = runs.groupby(keys, sort=False).agg(
        final=("final", "mean"),
        final_std=("final", "std"),
        last3=("last3", "mean"),
        best_round=("best_round", "mean"),
        change=("mean_abs_change", "mean"),
        range_after_1=("range_after_1", "mean"),
        coverage=("coverage", "first"),
        paper=("paper", "first"),
        epsilon_max=("epsilon_max", "max"),
        seeds=("seed", "count"),
    )
    agg = agg.reset_index()
    agg.to_csv(out / "table.csv", index=False)
    md = agg.to_markdown(index=False, floatfmt=".1f")
    (out / "table.md").write_text(f"{header}\n\n{md}\n")
    (out / "pivot.md").write_text(f"{header}\n\n{pivot(agg)}\n")


def pivot(agg: pd.DataFrame) -> str:
    """Markdown: one row per (dataset, partition, epsilon), one column per reading with the
    final-round accuracy ``mean +- std`` over seeds."""
    cell = agg.assign(
        text=[f"{m:.1f} +- {s:.1f}" for m, s in zip(agg.final, agg.final_std, strict=True)]
    )
    wide = cell.pivot_table(
        index=["dataset", "partition", "epsilon"], columns="reading", values="text",
        aggfunc="first", sort=False,
    )  # fmt: skip
    order = [r for r in STUDY_READINGS if r in wide.columns]
    return wide[order].reset_index().to_markdown(index=False)


def _header(plan: dict) -> str:
    return (
        f"Fed-DP-PSO readings study on VALIDATION splits (test set never read): N=5, S=5, "
        f"R={plan['rounds']}, E=1, B={plan['batch_size']}, eta=0.005, {plan['seeds']} seeds, "
        f"{plan['n_train']} client rows, {plan['val_rows']} validation rows, "
        f"{plan['eval_subset'] or 'all'} scoring rows per client, DP target epsilon as "
        f"listed (calibrated for these R rounds by the {plan['accountant'].upper()} "
        f"accountant), delta {plan['delta'] or '0.1 / client rows'}. Accuracies in % of the "
        "validation split: final round (mean, std over seeds), mean of the last 3 rounds, "
        "best round, mean |change| between rounds, range over rounds 2..R; coverage = the "
        "largest validation share one client covers with >= 0.5% of the rows per class; "
        "paper = Tables 1-2 (test set, R=10, full data: a reference, not a target here)."
    )


PARTITION_NOT_COVERED = (
    "each client's class counts, read from the client pool's labels without noise (the "
    "coverage of the validation classes and the label skew of every partition)"
)
PUBLIC_FILES = {
    "table.csv": "per (dataset, partition, epsilon, reading): runs.csv's means over seeds "
    "(validation accuracy of the runs, listed as not private; the partitions' coverage, "
    "listed as not covered) and the paper's numbers",
    "table.md": "table.csv as markdown, with the plan it ran",
    "pivot.md": "table.csv's final accuracy, one column per reading",
    "summary.json": "the settings and the table's header, the peak memory",
}
"""Files under ``--out`` besides the ledger's release paths and not-released folders: each
holds public settings, or is computed only from the releases and public data (so it is as
private as the releases it repeats); tests/test_released_files.py checks every file."""


TRAIN_ROWS = {"digits": 1_437, "mnist": 60_000, "fashion_mnist": 60_000}


def check(args: argparse.Namespace, plan: dict) -> None:
    """The plan's derived sizes and options, checked before any work: the validation rows,
    the public rows and ``n_train`` client rows must fit in each dataset's training split,
    and the DP options need a finite target epsilon."""
    for name in plan["datasets"]:
        rows = TRAIN_ROWS[name]
        need = plan["n_train"] + plan["val_rows"] + plan["public_rows"]
        if need > rows:
            n = _cli.setting(args, "n_train", plan["n_train"], "client rows")
            v = _cli.setting(args, "val_rows", plan["val_rows"], "validation rows")
            raise _cli.UserError(
                f"{n} + {v} + {plan['public_rows']} public rows = {need} exceed the {rows} "
                f"training rows of {name}: lower --n-train or --val-rows"
            )
    if not any(math.isfinite(e) for e in plan["eps"]):
        why = "every target epsilon is inf (no DP): they only label the ledger's records"
        _cli.warn_unused(args, ["delta", "accountant"], why)


@_cli.entry_point
def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    _cli.process_options(args)  # before anything compiles
    plan = _plan(args)
    check(args, plan)
    out = _cli.out_dir(args)
    if any(d != "digits" for d in plan["datasets"]) or args.data_dir is not None:
        args.data_dir = _cli.data_dir(args.data_dir)
    source = _cli.data_source(args)
    for name in plan["datasets"]:  # every dataset staged and readable before any work
        if name != "digits":
            _cli.load_dataset(name, args.data_dir, source)
    # every run is a release of the clients' data (docs/ledger.md); checked writable now
    ledger = Ledger(out, "fed_dp_pso_study", delta=plan["delta"], accountant=plan["accountant"])
    store = _cli.call_store(
        out,
        plan,
        __name__,
        args,
        ledger=ledger,
    )
    print(_header(plan), flush=True)
    runs: list[dict] = []
    rounds: list[pd.DataFrame] = []
    cells: dict[tuple, list[int]] = {}  # (dataset, partition, epsilon) -> its releases
    for eps in plan["eps"]:  # epsilon = inf first: the largest gaps are there
        for name in plan["datasets"]:
            ds, public = splits(name, plan, args.data_dir)
            for label in plan["readings"]:
                extra = plan["partition_readings"] and label in ("current", "authors")
                todo = (name, ds, public, label, eps, plan, extra, store, runs, rounds)
                _study_reading(*todo, ledger=ledger, cells=cells, out=out)
                pd.DataFrame(runs).to_csv(out / "runs.csv", index=False)
                pd.concat(rounds).to_csv(out / "rounds.csv", index=False)
                _table(pd.DataFrame(runs), out, _header(plan))
    _select_readings(ledger, cells)
    _report.not_covered(
        ledger, "partition statistics", out / "runs.csv", PARTITION_NOT_COVERED,
        columns="coverage, label_skew (runs.csv; coverage in table.csv, table.md)",
    )  # fmt: skip
    print((out / "table.md").read_text())
    _report.write_ledger(ledger)
    _report.write_json(out / "summary.json", {"plan": plan, "header": _header(plan)})
    _report.finish(out, out / "summary.json")


def _select_readings(ledger: Ledger, cells: dict[tuple, list[int]]) -> None:
    """Record the comparison the study's table exists for: per (dataset, partition,
    epsilon), the readings ranked by final validation accuracy.  The validation split is
    cut from the training split before the client pool is drawn and no client holds it, so
    the score reads released models and data outside the protected dataset: a public score
    (no charge).  Cells with one candidate select nothing and are not recorded."""
    for (name, part, eps), candidates in cells.items():
        if len(candidates) > 1:
            what = f"reading by validation accuracy: {name} {part} eps={eps:g}"
            ledger.select(what, candidates, score="public")


def _study_reading(
    name, ds, public, label, eps, plan, extra, store, runs, rounds, *, ledger, cells, out
) -> None:
    """Every partition of one (dataset, reading, epsilon): one compiled program; its runs
    go into ``ledger`` and their indices into ``cells[(dataset, partition, epsilon)]``."""
    reading = STUDY_READINGS[label]
    data = _data_for(ds, public, reading, plan)
    parts = _partitions(data.y_train, plan, extra)
    sizes = [p.sizes for p in parts.values()]
    bs = min(plan["batch_size"], int(min(s.min() for s in sizes)))
    pad_to = int(max(s.max() for s in sizes))
    model, lr = paper_model(name, data.num_classes, data.input_shape)
    delta = record_delta(plan["delta"], sizes[0])
    spec = RunSpec(plan["rounds"], delta, accountant=plan["accountant"])
    training = LocalTraining(batch_size=bs)  # DP-Adam's buffer serves every partition
    base = registry.Base(model, training, spec, len(sizes[0]), 2000, sizes=sizes)
    chosen = registry.settings(
        "fed-dp-pso", reading=reading, particles=5, target_epsilon=eps, pso_learning_rate=lr,
        eval_subset=plan["eval_subset"],
    )  # fmt: skip
    alg, grid = registry.build("fed-dp-pso", base, chosen)
    for part, p in parts.items():
        clients = stack_clients(data.x_train, data.y_train, p.indices, pad_to=pad_to)
        key = f"{name}_{label}_{part}_eps{eps:g}"
        run = partial(_call, alg, grid, clients, data, plan, str(out / "rounds.csv"))
        fetched = store.fetch_or_run(key, run, with_secret=True)
        h, reused = fetched.table, fetched.reused
        first = len(ledger.releases)
        ledger.add_saved(fetched.payload["releases"])
        cells.setdefault((name, part, eps), []).extend(range(first, len(ledger.releases)))
        paper_part = part if part in PAPER.get(name, {}) else "dir0.3"
        meta = dict(
            dataset=name,
            partition=part,
            epsilon=eps,
            reading=label,
            coverage=100 * class_coverage(p, data.y_train, data.y_test, 0.005),
            label_skew=label_skew(p),
            paper=paper_accuracy(name, paper_part, eps)[0],
            epsilon_max=float(h["epsilon_max"].iloc[0]),
        )
        runs.extend({**meta, **r} for r in _summarise(h))
        rounds.append(h.assign(**{k: meta[k] for k in ("dataset", "partition", "reading")}))
        how = "reused" if reused else f"{h['seconds'].iloc[0]:.0f} s"
        last = pd.DataFrame(_summarise(h))["final"].mean()
        print(f"{key}: final {last:.1f} % ({how}, load {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
