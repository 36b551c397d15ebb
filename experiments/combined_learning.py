"""Combined learning vs FedAvg, each client alone and the centralised model (seed 004).

    python -m experiments.combined_learning           # default slice (minutes on 2 CPU cores)
    python -m experiments.combined_learning --quick   # CI smoke run
    python -m experiments.combined_learning --full    # all models, full MNIST, more rounds

For every (dataset, model, split, K): clients train E local epochs per round; CL combines
them with :class:`swarmjax.fl.combined.CombinedAggregator` (spec section 6, c = 0.01 as the
authors ran), FedAvg with the weighted mean; "alone" clients never combine; the centralised
model trains on all the data (E epochs per round, so round t matches E*t epochs). Test
accuracy per round goes to ``results/combined_learning/`` (history.csv, summary.csv/json,
one PNG per dataset and model) as each setting finishes. CIFAR-10 runs only when its files
are found (``--data-dir`` or ``$SWARMJAX_DATA``); otherwise it is reported as skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import optax
import pandas as pd
from tqdm import tqdm

from swarmjax.fl import (
    CentralizedConfig,
    DatasetNotFoundError,
    FedAvgConfig,
    iid_partition,
    load_dataset,
    pathological_partition,
    run_centralized,
    run_fedavg,
    stack_clients,
    subsample,
    weighted_average,
)
from swarmjax.fl.cl_models import thesis_model
from swarmjax.fl.combined import CombinedAggregator, run_standalone

REPO = Path(__file__).resolve().parents[1]
SPLITS = ("uniform", "arbitrary")


def sgd_momentum(learning_rate: Any) -> optax.GradientTransformation:
    """SGD with momentum 0.9 (the authors' MNIST optimiser)."""
    return optax.sgd(learning_rate, momentum=0.9)


# model -> (optimiser, learning rate), after the authors' scripts (Adam for the tabular and
# recurrent models, SGD with momentum for the MNIST MLPs and convnet).
OPTIMISERS: dict[str, tuple[Callable[[Any], optax.GradientTransformation], float]] = {
    "mnist": (sgd_momentum, 0.01),
    "breast_cancer": (optax.adam, 0.01),
    "cifar10": (sgd_momentum, 0.01),
    "lstm": (optax.adam, 0.005),
}


@dataclasses.dataclass(frozen=True)
class Profile:
    datasets: dict[str, tuple[str, ...]]  # dataset -> models
    ks: tuple[int, ...]
    rounds: int
    local_epochs: dict[str, int]  # dataset -> E
    n_train: int | None
    n_test: int | None
    seeds: int
    batch_size: int = 64


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
            "mnist": ("smlp", "mmlp", "lmlp"),
            "cifar10": ("smlp",),
            "breast_cancer": ("smlp", "mmlp", "lmlp"),
        },
        ks=(2, 5, 10),
        rounds=10,
        local_epochs={"mnist": 1, "cifar10": 1, "breast_cancer": 5},
        n_train=10_000,
        n_test=2_000,
        seeds=2,
    ),
    "full": Profile(
        datasets={
            "mnist": ("smlp", "mmlp", "lmlp", "conv", "lstm"),
            "cifar10": ("smlp", "conv", "lstm"),
            "breast_cancer": ("smlp", "mmlp", "lmlp", "lstm"),
        },
        ks=(2, 5, 10),
        rounds=20,
        local_epochs={"mnist": 2, "cifar10": 2, "breast_cancer": 10},
        n_train=None,
        n_test=None,
        seeds=3,
    ),
}


def split_indices(labels: np.ndarray, k: int, split: str, seed: int) -> tuple[np.ndarray, ...]:
    """Uniform: equal class counts per client; arbitrary: disjoint sets of classes."""
    if split == "uniform":
        return iid_partition(labels, k, seed=seed, stratify=True).indices
    return pathological_partition(labels, k, seed=seed).indices


def optimiser(dataset: str, model: str) -> tuple[Callable[[Any], Any], float]:
    return OPTIMISERS["lstm"] if model == "lstm" else OPTIMISERS[dataset]


def run_setting(
    data: Any, dataset: str, model_name: str, split: str, k: int, profile: Profile
) -> pd.DataFrame:
    """History rows (method, round, client, test_accuracy) of CL, FedAvg and clients alone."""
    model = thesis_model(dataset, model_name)
    opt, lr = optimiser(dataset, model_name)
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
    base = dict(
        model=model,
        local_epochs=profile.local_epochs[dataset],
        batch_size=profile.batch_size,
        optimizer=opt,
        eval_batch_size=1000,
    )
    frames = []
    for method, aggregate in (("CL", CombinedAggregator(0.01)), ("FedAvg", weighted_average)):
        config = FedAvgConfig(**base, aggregate=aggregate)
        hist = run_fedavg(
            config, clients, test, rounds=profile.rounds, learning_rate=lr, seeds=seeds
        )
        frames.append(hist.history[["seed", "round", "test_accuracy"]].assign(method=method))
    alone = run_standalone(
        FedAvgConfig(**base), clients, test, rounds=profile.rounds, learning_rate=lr, seeds=seeds
    )
    frames.append(alone[["seed", "round", "client", "test_accuracy"]].assign(method="alone"))
    return pd.concat(frames, ignore_index=True).assign(
        dataset=dataset, model=model_name, split=split, K=k
    )


def run_central(data: Any, dataset: str, model_name: str, profile: Profile) -> pd.DataFrame:
    """Centralised accuracy after E*t epochs, one row per round t."""
    model = thesis_model(dataset, model_name)
    opt, lr = optimiser(dataset, model_name)
    e = profile.local_epochs[dataset]
    config = CentralizedConfig(
        model=model, batch_size=profile.batch_size, optimizer=opt, eval_batch_size=1000
    )
    res = run_centralized(
        config,
        data.x_train,
        data.y_train,
        (data.x_test, data.y_test),
        epochs=e * profile.rounds,
        learning_rate=lr,
        seeds=list(range(profile.seeds)),
    )
    hist = res.history[res.history["epoch"] % e == 0]
    return hist.assign(
        round=hist["epoch"] // e, method="central", dataset=dataset, model=model_name
    )[["seed", "round", "test_accuracy", "method", "dataset", "model"]]


def summarise(history: pd.DataFrame, central: pd.DataFrame) -> pd.DataFrame:
    """One row per (dataset, model, split, K): final and best accuracy per method (seed mean)."""
    rows = []
    keys = ["dataset", "model", "split", "K"]
    for key, group in history.groupby(keys, sort=False):
        row = dict(zip(keys, key, strict=True))
        last = group["round"].max()
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
    """Rows: splits; columns: K. CL, FedAvg, each client alone (grey), central (dashed)."""
    sub = history[(history.dataset == dataset) & (history.model == model)]
    splits = [s for s in SPLITS if s in set(sub.split)]
    ks = sorted(set(sub.K))
    fig, axes = plt.subplots(
        len(splits), len(ks), figsize=(4 * len(ks), 3.2 * len(splits)), squeeze=False
    )
    cen = central[(central.dataset == dataset) & (central.model == model)]
    cen_curve = cen.groupby("round")["test_accuracy"].mean()
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
                ax.plot(
                    curve.index,
                    curve.values,
                    color="0.7",
                    lw=0.8,
                    label="each client alone" if c == 0 else None,
                )
            for method, color in (("CL", "C0"), ("FedAvg", "C1")):
                curve = g[g.method == method].groupby("round")["test_accuracy"].mean()
                ax.plot(curve.index, curve.values, color=color, marker=".", label=method)
            ax.plot(cen_curve.index, cen_curve.values, "g--", label="centralised")
            ax.set_ylim(0, 1.02)
            ax.set_title(f"{split}, K={k}")
            ax.set_xlabel("combination round")
            ax.set_ylabel("test accuracy")
    axes[0, 0].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{dataset} {model}: CL vs FedAvg")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def default_data_dir(given: str | None) -> str | None:
    """``--data-dir``, else ``$SWARMJAX_DATA`` (read by the loader), else ../shared/data."""
    shared = REPO.parent / "shared" / "data"
    if given or os.environ.get("SWARMJAX_DATA") or not shared.is_dir():
        return given
    return str(shared)


def load(name: str, data_dir: str | None, profile: Profile) -> Any:
    data = load_dataset(name, default_data_dir(data_dir), download=False)
    if name in ("mnist", "fashion_mnist", "cifar10") and (profile.n_train or profile.n_test):
        data = subsample(data, profile.n_train, profile.n_test, seed=0)
    return data


def plan(data: Any, models: tuple[str, ...], profile: Profile) -> list[tuple[str, str, int]]:
    """(model, split, K) to run; the arbitrary split needs K <= number of classes."""
    return [
        (m, s, k)
        for m in models
        for s in SPLITS
        for k in profile.ks
        if s == "uniform" or k <= data.num_classes
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.combined_learning",
        description="Combined learning (seed 004) vs FedAvg, clients alone and centralised.",
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="CI smoke run (< 1 minute)")
    size.add_argument("--full", action="store_true", help="all models and data, 20 rounds")
    parser.add_argument("--data-dir", default=None, help="folder with mnist/, cifar10/ ...")
    parser.add_argument("--out", default=str(REPO / "results" / "combined_learning"))
    parser.add_argument("--datasets", nargs="+", help="restrict to these datasets")
    parser.add_argument("--models", nargs="+", help="restrict to these models")
    parser.add_argument("--rounds", type=int, help="override the number of rounds")
    parser.add_argument("--seeds", type=int, help="override the number of seeds")
    return parser.parse_args(argv)


def choose_profile(args: argparse.Namespace) -> Profile:
    profile = PROFILES["quick" if args.quick else "full" if args.full else "default"]
    datasets = {
        d: tuple(m for m in ms if not args.models or m in args.models)
        for d, ms in profile.datasets.items()
        if not args.datasets or d in args.datasets
    }
    changes: dict[str, Any] = {"datasets": {d: m for d, m in datasets.items() if m}}
    if args.rounds:
        changes["rounds"] = args.rounds
    if args.seeds:
        changes["seeds"] = args.seeds
    return dataclasses.replace(profile, **changes)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    profile = choose_profile(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    histories, centrals, skipped = [], [], []
    start = time.perf_counter()
    for dataset, models in profile.datasets.items():
        try:
            data = load(dataset, args.data_dir, profile)
        except DatasetNotFoundError as exc:
            skipped.append(f"{dataset}: not found ({str(exc).splitlines()[0]})")
            print(f"skipping {dataset}: its files are not available")
            continue
        todo = plan(data, models, profile)
        skipped += [
            f"{dataset} {m} arbitrary K={k}: needs K <= {data.num_classes} classes"
            for m in models
            for k in profile.ks
            if k > data.num_classes
        ]
        for model in models:
            centrals.append(run_central(data, dataset, model, profile))
            for m, split, k in tqdm(
                [t for t in todo if t[0] == model], desc=f"{dataset} {model}", unit="setting"
            ):
                histories.append(run_setting(data, dataset, m, split, k, profile))
                write(out, histories, centrals, profile, skipped, time.perf_counter() - start)
            plot(
                pd.concat(histories),
                pd.concat(centrals),
                dataset,
                model,
                out / f"{dataset}_{model}.png",
            )
    summary = write(out, histories, centrals, profile, skipped, time.perf_counter() - start)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(summary.round(3).to_string(index=False))
    for note in skipped:
        print("skipped:", note)
    print(f"results in {out} ({time.perf_counter() - start:.0f} s)")


def write(
    out: Path,
    histories: list[pd.DataFrame],
    centrals: list[pd.DataFrame],
    profile: Profile,
    skipped: list[str],
    seconds: float,
) -> pd.DataFrame:
    """Write history.csv, central.csv, summary.csv/json now (called after every setting)."""
    if not histories:
        return pd.DataFrame()
    history, central = pd.concat(histories), pd.concat(centrals)
    history.to_csv(out / "history.csv", index=False)
    central.to_csv(out / "central.csv", index=False)
    summary = summarise(history, central)
    summary.to_csv(out / "summary.csv", index=False)
    meta = {
        "profile": dataclasses.asdict(profile),
        "conv": 0.01,
        "skipped": skipped,
        "seconds": round(seconds, 1),
        "summary": summary.to_dict(orient="records"),
    }
    (out / "summary.json").write_text(json.dumps(meta, indent=1, default=str))
    return summary


if __name__ == "__main__":
    main()
