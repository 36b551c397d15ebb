"""Combined learning vs FedAvg, each client alone and the centralised model (seed 004).

    python -m experiments.combined_learning           # default slice (> 1 h on 2 shared CPU cores)
    python -m experiments.combined_learning --quick   # CI smoke run (< 1 minute)
    python -m experiments.combined_learning --full    # the whole grid, full MNIST, more rounds

Default slice: every model of the thesis runs at least once, and the smlp runs every
split x K. MNIST: smlp on {uniform, arbitrary} x K in {2, 5, 10}; mmlp, lmlp, conv and
lstm on uniform K = 5 (conv and lstm on a 2,000-image subsample, 5 rounds, 1 seed: they
cost ~50x an MLP per example on this CPU). Breast cancer: smlp on uniform K in {2, 5, 10}
and arbitrary K = 2 (two classes); mmlp, lmlp and lstm on uniform K = 5. ``--full`` runs
every model on every split x K.

For every (dataset, model, split, K): clients train E local epochs per round; CL combines
them with :class:`swarmjax.fl.algorithms.combined.CombinedAggregator` (docs/algorithms.md section 6,
c = 0.01 as the authors ran), FedAvg with the weighted mean; "alone" clients never combine;
the centralised model trains on all the data (E epochs per round, so round t matches E*t
epochs). Test
accuracy per round goes to ``results/combined_learning/`` (history.csv, summary.csv/json,
one PNG per dataset and model) as each setting finishes; each finished setting is also saved
under ``calls/``, so rerunning the same command resumes where it stopped (``--restart`` runs
everything again). CIFAR-10 runs only when its files
are found (``--data-dir`` or ``$SWARMJAX_DATA``); otherwise it is reported as skipped.

Privacy: no run has DP.  ``privacy_ledger.json/.md`` lists every run (CL, FedAvg, each
client alone, the centralised model; reused settings too) as a release that is NOT private:
a paper must not state any of these numbers as private.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from experiments import _cli, _report
from swarmjax.fl import (
    DatasetNotFoundError,
    iid_partition,
    load_dataset,
    pathological_partition,
    stack_clients,
    subsample,
)
from swarmjax.fl.algorithms import registry
from swarmjax.fl.algorithms.combined_models import thesis_model
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import simulate
from swarmjax.privacy.ledger import Ledger, saved_releases
from swarmjax.privacy.plan import default_delta

SPLITS = ("uniform", "arbitrary")


OPTIMISERS: dict[str, tuple[str, float, float]] = {  # (optimiser, momentum, learning rate)
    "mnist": ("sgd", 0.9, 0.01),  # SGD with momentum 0.9 (the authors' MNIST optimiser)
    "breast_cancer": ("adam", 0.0, 0.01),
    "cifar10": ("sgd", 0.9, 0.01),
    "lstm": ("adam", 0.0, 0.005),
}


@dataclasses.dataclass(frozen=True)
class Profile:
    """What to run. ``grid_models`` (None: all) run every split x K; the other models run
    only the ``single`` (split, K) settings. ``overrides[model]`` replaces ``n_train``,
    ``n_test``, ``rounds`` or ``seeds`` for that model (the heavy conv and LSTM)."""

    datasets: dict[str, tuple[str, ...]]  # dataset -> models
    ks: tuple[int, ...]
    rounds: int
    local_epochs: dict[str, int]  # dataset -> E
    n_train: int | None
    n_test: int | None
    seeds: int
    batch_size: int = 64
    grid_models: tuple[str, ...] | None = None
    single: tuple[tuple[str, int], ...] = (("uniform", 5),)
    overrides: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)


PROFILES = {
    "quick": Profile(
        datasets={"breast_cancer": ("smlp",)},
        ks=(2,),
        rounds=3,
        local_epochs={"breast_cancer": 2},
        n_train=None,
        n_test=None,
        seeds=1,
        batch_size=32,
    ),
    "default": Profile(
        datasets={
            "mnist": ("smlp", "mmlp", "lmlp", "conv", "lstm"),
            "cifar10": ("smlp", "conv", "lstm"),
            "breast_cancer": ("smlp", "mmlp", "lmlp", "lstm"),
        },
        ks=(2, 5, 10),
        rounds=10,
        local_epochs={"mnist": 1, "cifar10": 1, "breast_cancer": 5},
        n_train=10_000,
        n_test=2_000,
        seeds=2,
        grid_models=("smlp",),
        overrides={
            "conv": {"n_train": 2_000, "n_test": 1_000, "rounds": 5, "seeds": 1},
            "lstm": {"n_train": 2_000, "n_test": 1_000, "rounds": 5, "seeds": 1},
        },
    ),
}
# The whole grid: every model on every split x K, full data, more epochs, rounds and seeds.
PROFILES["full"] = dataclasses.replace(
    PROFILES["default"],
    rounds=20,
    local_epochs={"mnist": 2, "cifar10": 2, "breast_cancer": 10},
    n_train=None,
    n_test=None,
    seeds=3,
    grid_models=None,
    overrides={},
)


def for_model(profile: Profile, model: str) -> Profile:
    """The profile with ``profile.overrides[model]`` applied."""
    return dataclasses.replace(profile, **profile.overrides.get(model, {}))


def split_indices(labels: np.ndarray, k: int, split: str, seed: int) -> tuple[np.ndarray, ...]:
    """Uniform: equal class counts per client; arbitrary: disjoint sets of classes."""
    if split == "uniform":
        return iid_partition(labels, k, seed=seed, stratify=True).indices
    return pathological_partition(labels, k, seed=seed).indices


def optimiser(
    dataset: str, model: str, epochs: int, batch_size: int
) -> tuple[LocalTraining, float]:
    """The local training of (dataset, model) and its learning rate."""
    name, momentum, lr = OPTIMISERS["lstm"] if model == "lstm" else OPTIMISERS[dataset]
    training = LocalTraining(
        epochs=epochs, batch_size=batch_size, optimizer=name, momentum=momentum
    )
    return training, lr


def _spec(clients, rounds: int, seeds: list[int]) -> RunSpec:
    """Rounds and seeds of a call; its delta is swarmjax's default for the clients' rows."""
    delta = default_delta(int(np.sum(clients.sizes)))
    return RunSpec(rounds=rounds, delta=delta, seeds=tuple(seeds))


def _simulate(
    name: str,
    model,
    training,
    clients,
    test,
    spec: RunSpec,
    lr: float,
    epsilon_target: float | None = None,
    **settings,
):
    """Registry algorithm ``name`` (its other ``settings``) at local learning rate ``lr``
    for every seed of ``spec``; the rate and a given ``epsilon_target`` are label columns
    of the history."""
    base = registry.Base(model, training, spec, clients.num_clients, eval_batch_size=1000)
    alg, grid = registry.build(name, base, registry.settings(name, learning_rate=lr, **settings))
    axes = {"learning_rate": [lr]}
    if epsilon_target is not None:
        axes["epsilon_target"] = [epsilon_target]
    return simulate(alg, clients, test, Variants.grid(alg, clients, spec, **{**grid, **axes}))


def run_setting(
    data: Any,
    dataset: str,
    model_name: str,
    split: str,
    k: int,
    profile: Profile,
    path: str = "history.csv",
) -> tuple[pd.DataFrame, dict]:
    """History rows (method, round, client, test_accuracy) of CL, FedAvg and clients alone,
    and ``{"releases": their runs as privacy-ledger releases written at path}``."""
    model = thesis_model(dataset, model_name)
    training, lr = optimiser(dataset, model_name, profile.local_epochs[dataset], profile.batch_size)
    parts = split_indices(data.y_train, k, split, seed=0)
    # Pad both splits of a K to one shape so that they share a compilation.
    pad = max(
        max(len(i) for i in split_indices(data.y_train, k, s, seed=0))
        for s in SPLITS
        if s == "uniform" or k <= data.num_classes
    )
    clients = stack_clients(data.x_train, data.y_train, parts, pad_to=pad)
    test = (data.x_test, data.y_test)
    seeds = list(range(profile.seeds))
    labels = {"dataset": dataset, "model": model_name, "split": split, "K": k}
    frames, releases = [], []
    spec = _spec(clients, profile.rounds, seeds)
    for method, name in (("CL", "combined"), ("FedAvg", "fedavg")):  # CL: conv 0.01
        res = _simulate(name, model, training, clients, test, spec, lr, epsilon_target=math.inf)
        frames.append(res.history[["seed", "round", "test_accuracy"]].assign(method=method))
        releases += saved_releases(res, algorithm=method, path=path, data=dataset, **labels)
    alone = _simulate("local-only", model, training, clients, test, spec, lr)
    releases += saved_releases(alone, algorithm="alone", path=path, data=dataset, **labels)
    acc = alone.metrics["test_accuracy"]  # (seeds, rounds, clients)
    s_idx, t_idx, c_idx = np.meshgrid(
        np.asarray(seeds), np.arange(1, profile.rounds + 1), np.arange(k), indexing="ij"
    )
    frames.append(
        pd.DataFrame(
            {
                "seed": s_idx.ravel(),
                "round": t_idx.ravel(),
                "client": c_idx.ravel(),
                "test_accuracy": acc.ravel(),
            }
        ).assign(method="alone")
    )
    history = pd.concat(frames, ignore_index=True).assign(
        dataset=dataset, model=model_name, split=split, K=k
    )
    return history, {"releases": releases}


def run_central(
    data: Any, dataset: str, model_name: str, profile: Profile, path: str = "central.csv"
) -> tuple[pd.DataFrame, dict]:
    """Centralised accuracy after E*t epochs, one row per round t, and ``{"releases": its
    runs as privacy-ledger releases written at path}``."""
    model = thesis_model(dataset, model_name)
    e = profile.local_epochs[dataset]
    training, lr = optimiser(dataset, model_name, 1, profile.batch_size)
    union = stack_clients(data.x_train, data.y_train, [np.arange(len(data.y_train))])
    spec = _spec(union, e * profile.rounds, list(range(profile.seeds)))
    test = (data.x_test, data.y_test)
    res = _simulate("local-only", model, training, union, test, spec, lr, keep_optimizer_state=True)
    res = dataclasses.replace(res, history=res.history.rename(columns={"round": "epoch"}))
    hist = res.history[res.history["epoch"] % e == 0]
    hist = hist.assign(
        round=hist["epoch"] // e, method="central", dataset=dataset, model=model_name
    )[["seed", "round", "test_accuracy", "method", "dataset", "model"]]
    releases = saved_releases(
        res, algorithm="central", path=path, data=dataset, dataset=dataset, model=model_name
    )
    return hist, {"releases": releases}


def summarise(history: pd.DataFrame, central: pd.DataFrame) -> pd.DataFrame:
    """One row per (dataset, model, split, K): final and best accuracy per method (seed mean)."""
    rows = []
    keys = ["dataset", "model", "split", "K"]
    for key, group in history.groupby(keys, sort=False):
        row = dict(zip(keys, key, strict=True))
        last = group["round"].max()
        row["rounds"] = int(last)
        row["seeds"] = int(group["seed"].nunique())
        for method in ("CL", "FedAvg"):
            curve = group[group.method == method].groupby("round")["test_accuracy"].mean()
            row[f"{method}_final"] = curve.loc[last]
            row[f"{method}_best"] = curve.max()
        alone = group[(group.method == "alone") & (group["round"] == last)]
        per_client = alone.groupby("client")["test_accuracy"].mean()
        row["alone_mean_final"] = per_client.mean()
        row["alone_best_final"] = per_client.max()
        c = central[(central.dataset == key[0]) & (central.model == key[1])]
        curve = c.groupby("round")["test_accuracy"].mean()
        row["central_after_E"] = curve.loc[1]  # the thesis's dashed line: E epochs
        row["central_final"] = curve.loc[last]
        row["CL_minus_FedAvg"] = row["CL_final"] - row["FedAvg_final"]
        rows.append(row)
    return pd.DataFrame(rows)


def plot(
    history: pd.DataFrame, central: pd.DataFrame, dataset: str, model: str, path: Path
) -> None:
    """Rows: splits; columns: K (a column-sized grid, experiments._report). CL, FedAvg and
    central (dashed) as mean +- std over seeds, each client alone (grey, mean over seeds);
    one legend below the panels, the dataset and model in the caption line."""
    sub = history[(history.dataset == dataset) & (history.model == model)]
    splits = [s for s in SPLITS if s in set(sub.split)]
    ks = sorted(set(sub.K))
    fig, axes = _report.grid(len(splits), len(ks), sharey=True)
    cen = central[(central.dataset == dataset) & (central.model == model)]
    for i, split in enumerate(splits):
        for j, k in enumerate(ks):
            ax = axes[i, j]
            g = sub[(sub.split == split) & (sub.K == k)]
            if g.empty:
                ax.set_title(f"{split}, K={k}: not run")
                ax.axis("off")
                continue
            for c, cg in g[g.method == "alone"].groupby("client"):
                curve = cg.groupby("round")["test_accuracy"].mean()
                label = "each client alone" if c == 0 else None
                ax.plot(curve.index, curve.values, color="0.7", lw=0.8, label=label)
            for method, color in (("CL", "C0"), ("FedAvg", "C1")):
                _report.band(ax, g[g.method == method], "test_accuracy", label=method,
                             color=color, marker=".")  # fmt: skip
            _report.band(ax, cen, "test_accuracy", label="centralised", color="g", ls="--")
            ax.set(ylim=(0, 1.02), title=f"{split}, K={k}", xlabel="combination round")
            ax.set_ylabel("test accuracy" if j == 0 else "")
            ax.legend()  # one legend below the panels (experiments._report.save)
    seeds = sub.seed.nunique() if "seed" in sub else 1
    _report.save(fig, path, caption=f"{dataset} {model}: CL vs FedAvg, mean over {seeds} seed(s)")


PUBLIC_FILES = {
    "summary.csv": "final and best test accuracy per (dataset, model, split, K): from "
    "history.csv and central.csv (every run listed as not private)",
    "summary.md": "summary.csv as markdown",
    "summary.json": "the settings, what was skipped, summary.csv, wall seconds and peak memory "
    "(runs that are all listed as not private)",
    "*_*.png": "figures of history.csv and central.csv, one per dataset and model",
}
"""Files under ``--out`` besides the ledger's release paths and not-released folders: each
holds public settings, or is computed only from the releases and public data (so it is as
private as the releases it repeats); tests/test_released_files.py checks every file."""


FILE_DATASETS = ("mnist", "cifar10")  # read from the data folder; breast_cancer ships with sklearn


def load(name: str, data_dir: Path | None) -> Any:
    """``name`` from ``data_dir`` (never downloaded); a file that cannot be read is a one-line
    :class:`~experiments._cli.UserError` (a dataset not staged raises
    :class:`DatasetNotFoundError`, which :func:`load_all` reports or skips)."""
    try:
        return load_dataset(name, data_dir, download=False)
    except DatasetNotFoundError:
        raise
    except _cli.UNREADABLE as err:
        where = f"dataset {name!r} under {str(data_dir)!r}"
        raise _cli.unreadable(where, err, f"<data dir>/{name}/") from None


def shrink(data: Any, name: str, profile: Profile) -> Any:
    """The profile's train/test subsample of an image dataset (tabular data stay whole)."""
    if name in ("mnist", "fashion_mnist", "cifar10") and (profile.n_train or profile.n_test):
        return subsample(data, profile.n_train, profile.n_test, seed=0)
    return data


def plan(data: Any, models: tuple[str, ...], profile: Profile) -> list[tuple[str, str, int]]:
    """(model, split, K) to run: every split x K for ``grid_models``, ``single`` for the
    others; the arbitrary split needs K <= number of classes."""
    out = []
    for m in models:
        grid = profile.grid_models is None or m in profile.grid_models
        settings = [(s, k) for s in SPLITS for k in profile.ks] if grid else profile.single
        out += [(m, s, k) for s, k in settings if s == "uniform" or k <= data.num_classes]
    return out


def _call_settings(dataset: str, model: str, profile: Profile) -> dict:
    """What a saved setting of ``(dataset, model)`` depends on besides its split and K."""
    keep = ("rounds", "n_train", "n_test", "seeds", "batch_size")
    return {
        "dataset": dataset,
        "model": model,
        "local_epochs": profile.local_epochs[dataset],
        **{k: getattr(profile, k) for k in keep},
    }


def parse_args(argv: list[str] | None = None):
    parser = _cli.parser(
        "combined_learning",
        __doc__,
        quick="CI smoke run: breast cancer smlp, K=2 (< 1 min)",
        full="every model on every split x K, full data, 20 rounds, 3 seeds (hours)",
        data="mnist/, cifar10/",
        seeds="quick 1, default 2 (conv, lstm 1), full 3; every model",
    )
    parser.add_argument(
        "--datasets",
        nargs="+",
        choices=("mnist", "breast_cancer", "cifar10"),
        help="restrict to these datasets (a requested dataset that is missing is an error)",
    )
    parser.add_argument(
        "--models",
        nargs="+",
        choices=("smlp", "mmlp", "lmlp", "conv", "lstm"),
        help="restrict to these models",
    )
    parser.add_argument(
        "--rounds",
        type=_cli.count("--rounds"),
        help="override the number of combination rounds (every model)",
    )
    return parser.parse_args(argv)


def choose_profile(args: argparse.Namespace) -> Profile:
    profile = PROFILES[_cli.profile_name(args)]
    datasets = {
        d: tuple(m for m in ms if not args.models or m in args.models)
        for d, ms in profile.datasets.items()
        if not args.datasets or d in args.datasets
    }
    changes: dict[str, Any] = {"datasets": {d: m for d, m in datasets.items() if m}}
    forced = {}
    if args.rounds is not None:
        forced["rounds"] = args.rounds
    if args.seeds is not None:
        forced["seeds"] = args.seeds
    changes.update(forced)
    changes["overrides"] = {m: {**o, **forced} for m, o in profile.overrides.items()}
    return dataclasses.replace(profile, **changes)


def load_all(args, profile: Profile) -> tuple[dict[str, Any], list[str]]:
    """Every dataset of ``profile`` loaded before any work: (datasets, skipped notes).

    A dataset named by ``--datasets`` that cannot be found is an error; one only in the
    profile's default list is skipped with a note."""
    needs_files = any(d in FILE_DATASETS for d in profile.datasets)
    data_dir = _cli.data_dir(args.data_dir) if needs_files or args.data_dir else None
    loaded, skipped = {}, []
    for dataset in profile.datasets:
        try:
            loaded[dataset] = load(dataset, data_dir)
        except DatasetNotFoundError:
            if args.datasets:
                from swarmjax.data import fetch_command

                raise _cli.UserError(
                    f"--datasets: {dataset!r} is not staged under {str(data_dir)!r}: fetch it "
                    f"with `{fetch_command(dataset, args.data_dir)}`"
                ) from None
            skipped.append(f"{dataset}: not found under {data_dir}")
            print(f"skipping {dataset}: its files are not available")
    if not loaded:
        raise _cli.UserError(f"no dataset to run: {'; '.join(skipped)}")
    return loaded, skipped


@_cli.entry_point
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    _cli.process_options(args)  # before anything compiles
    profile = choose_profile(args)
    if not profile.datasets:
        offered = PROFILES[_cli.profile_name(args)].datasets
        if args.models:  # the models given run on none of the datasets
            named = " ".join(args.datasets or offered)
            raise _cli.UserError(
                f"--models {' '.join(args.models)} run on none of the datasets {named} of this "
                "profile; see PROFILES in experiments/combined_learning.py"
            )
        raise _cli.UserError(  # only --datasets was given: none is in the profile
            f"--datasets {' '.join(args.datasets or [])}: this profile runs only "
            f"{', '.join(offered)} (--full runs every dataset)"
        )
    unused = set(args.models or ()) - {m for ms in profile.datasets.values() for m in ms}
    if unused:
        ran = ", ".join(profile.datasets)
        _cli.warn_unused(args, ["models"], f"{' '.join(sorted(unused))} run on none of {ran}")
    out = _cli.out_dir(args)
    # every run is listed (not private: no DP) beside the results; checked writable now
    ledger = Ledger(out, "combined_learning")
    loaded, skipped = load_all(args, profile)
    histories, centrals, reused = [], [], []
    timings: dict[str, float] = {}
    start = time.perf_counter()
    for dataset, full_data in loaded.items():
        models = profile.datasets[dataset]
        todo = plan(full_data, models, profile)
        skipped += [
            f"{dataset} {m} arbitrary K={k}: needs K <= {full_data.num_classes} classes"
            for m in models
            for k in profile.ks
            if k > full_data.num_classes
            and (profile.grid_models is None or m in profile.grid_models)
        ]
        for model in models:
            mprof = for_model(profile, model)
            data = shrink(full_data, dataset, mprof)
            t0 = time.perf_counter()
            store = _cli.call_store(
                out,
                _call_settings(dataset, model, mprof),
                __name__,
                args,
                ledger=ledger,
            )
            central = partial(run_central, data, dataset, model, mprof, str(out / "central.csv"))
            centrals.append(_fetch(store, "central", central, ledger))
            for m, split, k in tqdm(
                [t for t in todo if t[0] == model],
                desc=f"{dataset} {model}",
                unit="setting",
                disable=not _cli.progress_bars(),
            ):
                path = str(out / "history.csv")
                run = partial(run_setting, data, dataset, m, split, k, mprof, path)
                histories.append(_fetch(store, f"{split}_K{k}", run, ledger))
                write(
                    out, histories, centrals, profile, skipped, time.perf_counter() - start, timings
                )
            timings[f"{dataset} {model}"] = round(time.perf_counter() - t0, 1)
            reused += [f"{dataset} {model} {key}" for key in store.reused]
            plot(
                pd.concat(histories),
                pd.concat(centrals),
                dataset,
                model,
                out / f"{dataset}_{model}.png",
            )
    summary = write(
        out, histories, centrals, profile, skipped, time.perf_counter() - start, timings
    )
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(summary.round(3).to_string(index=False))
    for note in skipped:
        print("skipped:", note)
    if reused:
        print(f"reused from {out / 'calls'} (--restart runs them again): {', '.join(reused)}")
    _report.write_ledger(ledger)
    print(f"{time.perf_counter() - start:.0f} s")
    _report.finish(out, out / "summary.json")


def _fetch(store, key: str, run, ledger: Ledger) -> pd.DataFrame:
    """The table of ``store.fetch_or_run(key, run)``; the releases of its payload (computed
    now or saved by an earlier run) go into ``ledger``."""
    table, payload, _ = store.fetch_or_run(key, run)
    ledger.add_saved(payload["releases"])
    return table


def write(
    out: Path,
    histories: list[pd.DataFrame],
    centrals: list[pd.DataFrame],
    profile: Profile,
    skipped: list[str],
    seconds: float,
    timings: dict[str, float] | None = None,
) -> pd.DataFrame:
    """Write history.csv, central.csv, summary.csv/json now (called after every setting)."""
    if not histories:
        return pd.DataFrame()
    history, central = pd.concat(histories), pd.concat(centrals)
    history.to_csv(out / "history.csv", index=False)
    central.to_csv(out / "central.csv", index=False)
    summary = summarise(history, central)
    _report.write_table(summary, out / "summary")  # summary.csv and summary.md
    meta = {
        "profile": dataclasses.asdict(profile),
        "conv": 0.01,
        "skipped": skipped,
        "seconds": round(seconds, 1),
        "seconds_per_model": timings or {},
        "summary": summary.to_dict(orient="records"),
    }
    _report.write_json(out / "summary.json", meta)
    return summary


if __name__ == "__main__":
    main()
