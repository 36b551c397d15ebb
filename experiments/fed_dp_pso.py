"""Fed-DP-PSO experiment: Tables 1 and 2, accuracy per round (Fig. 2), vs FedAvg + DP (Fig. 3),
communication table. ``python -m experiments.fed_dp_pso [--quick | --full] [--datasets ...]``.

Every (dataset, partition) runs in two compiled calls: the finite epsilons x seeds, and
epsilon = inf x seeds. The profiles (``--quick``, default, ``--full``: the paper's R = 10,
E = 1, S = 5, N = 5, B = 256, MLP 784-256-256-10), the readings of the paper's open design
choices (``--reading`` and one flag per choice), Flower's partitions, Fig. 3's dataset and
what the epsilon covers are in ``docs/fed_dp_pso.md``; every table header states the plan
it ran. Results go to ``results/fed_dp_pso/`` (``cells.csv``, ``rounds.csv``,
``table_<dataset>.csv/.md``, ``fig3.csv``, ``comm.csv``: the bytes per round the simulator
counted, ``summary.json``, PNG figures); finished calls are kept under ``calls/``, so the
same command resumes (``--restart`` runs everything again).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, fields, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal, NamedTuple, get_args, get_origin, get_type_hints

import numpy as np
import pandas as pd

from experiments import _cli, _report
from swarmjax.fl import (
    DATASETS,
    DatasetNotFoundError,
    flower_partition,
    load_dataset,
    stack_clients,
    subsample,
)
from swarmjax.fl.algorithms.fed_dp_pso import (
    DEFAULT_READING,
    READINGS,
    FedDPPSO,
    Reading,
    fed_dp_pso,
    paper_model,
    reading_hyper,
)
from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.client.record_dp import DELTA
from swarmjax.fl.client.training import LocalTraining, RecordDP
from swarmjax.fl.data.transforms import SCALING_PRIVACY, scale_inputs
from swarmjax.fl.protocol import RunSpec, Variants, coverage
from swarmjax.fl.runtime import simulate
from swarmjax.models import paper_mlp

PAPER = {  # spec 2.5: (mean, std) per (dataset, partition, epsilon)
    "mnist": {
        "dir0.3": [(72.31, 5.78), (74.61, 5.12), (76.24, 3.97), (88.69, 3.53)],
        "dir1": [(85.08, 1.12), (86.54, 1.62), (87.89, 1.09), (94.85, 0.91)],
        "iid": [(88.12, 0.78), (89.21, 0.33), (89.59, 0.58), (96.41, 0.23)],
    },
    "fashion_mnist": {
        "dir0.3": [(58.92, 6.60), (61.18, 7.58), (62.06, 6.73), (69.82, 7.53)],
        "dir1": [(76.12, 1.19), (76.93, 1.22), (77.20, 1.24), (81.86, 1.70)],
        "iid": [(81.34, 0.41), (81.83, 0.35), (82.06, 0.43), (85.66, 0.99)],
    },
}
EPS_COLS = (5.0, 8.0, 10.0, math.inf)
PARTITIONS = ("iid", "dir0.3", "dir1")  # Tables 1-2's column groups
FIG3 = "pathmnist"  # the paper's Fig. 3 dataset (LeNet-5); --full adds it when found
EVAL_BATCH = 2000  # particles are scored 2,000 rows at a time
NUM_CLIENTS = 5
_BUILT_IN = ("digits", "breast_cancer")  # shipped with scikit-learn: no data folder needed
READING_FIELDS = tuple(f.name for f in fields(Reading) if f.name != "about")


@dataclass(frozen=True)
class Profile:
    """What one command runs: the grid (datasets x partitions x epsilons x seeds), the
    paper's settings and the reading of its open design choices."""

    datasets: tuple[str, ...]
    partitions: tuple[str, ...]
    epsilons: tuple[float, ...]
    rounds: int
    seeds: int
    n_train: int | None  # training subset (None: all rows)
    eval_subset: int | None  # rows per client the particles are scored on (None: all)
    batch_size: int
    client_map: str
    particles: int = 5
    lr: float | None = None  # None: the paper's eta of the model
    refine_start: str = "pbest"
    selection_metric: str = "loss"
    fig3: bool = True
    reading_name: str = DEFAULT_READING
    reading: Reading = field(default_factory=lambda: READINGS[DEFAULT_READING])

    def call_settings(self) -> dict:
        """What a saved call depends on besides its key (dataset, partition, epsilons);
        ``partitions`` stays in: with sequential clients they share one padded shape."""
        out = asdict(self)
        for k in ("datasets", "epsilons", "fig3"):
            out.pop(k)
        return out


PROFILES = {
    "quick": Profile(("digits",), ("iid",), (5.0, math.inf), 2, 1, None, None, 64, "vmap"),
    "default": Profile(
        ("mnist",), ("iid", "dir1"), (5.0, math.inf), 10, 2, 10_000, 500, 64, "vmap"
    ),
    "full": Profile(
        ("mnist", "fashion_mnist"), PARTITIONS, EPS_COLS, 10, 5, None, 2_000, 256, "sequential"
    ),
}


_READING_FLOATS = {  # how each float choice is parsed
    "init_scale": _cli.positive_float("--init-scale"),
    "velocity_clamp": _cli.positive_float("--velocity-clamp", allow_inf=True),
    "decay": _cli.positive_float("--decay", allow_zero=True),
}


def _reading_flag(name: str) -> dict:
    """argparse keywords of ``--<name>``: a :class:`Reading` field (choices from its type)."""
    kind = get_type_hints(Reading)[name]
    if get_origin(kind) is Literal:
        how = {"choices": get_args(kind)}
    else:
        how = {bool: {"choices": ("no", "yes")}, int: {"type": _cli.count(f"--{name}")}}.get(
            kind, {"type": _READING_FLOATS.get(name)}
        )
    return dict(how, help=f"replace the reading's {name} (docs/fed_dp_pso.md)")


_OPTIONS = {  # the other flags: argparse keywords
    "--datasets": dict(nargs="+", choices=DATASETS, help="e.g. mnist (Table 1 only); pathmnist "
                       "(colour: LeNet-5) when its .npz is found"),
    "--epsilons": dict(nargs="+", type=_cli.positive_float("--epsilons", allow_inf=True),
                       help="target epsilons, 'inf' for no DP (--full: 5 8 10 inf; else 5 inf)"),
    "--partitions": dict(nargs="+", choices=PARTITIONS, help="column groups (quick: iid; "
                         "default: iid dir1; full: all); they share one padded shape"),
    "--rounds": dict(type=_cli.count("--rounds"), help="R (default 10; quick 2)"),
    "--particles": dict(type=_cli.count("--particles"), default=5, help="S, particles per client"),
    "--batch-size": dict(type=_cli.count("--batch-size"), help="B, expected Poisson batch (full "
                         "256, else 64)"),
    "--runtime": dict(choices=("simulator", "flower"), default="simulator", help="flower: "
                      "digits over a SuperLink + 3 SuperNodes on 127.0.0.1 beside the "
                      "simulator, with this reading and these flags"),
    "--lr": dict(type=_cli.positive_float("--lr"), help="eta of (DP-)Adam (default: 0.005 for "
                 "the MLPs, 0.001 for the CNN)"),
    "--refine-start": dict(choices=("pbest", "position"), default="pbest", help="DP-Adam "
                           "refines the best pbest (default) or best moved position"),
    "--selection-metric": dict(choices=("loss", "error"), default="loss", help="particles "
                               "scored by cross-entropy (the paper) or error rate"),
    "--client-map": dict(choices=("vmap", "sequential"), help="clients as a vmap axis or one "
                         "after another (full: sequential, else vmap)"),
    "--n-train": dict(type=_cli.count("--n-train", 0), help="train subset (0: all rows)"),
    "--eval-subset": dict(type=_cli.count("--eval-subset", 0), help="rows/client (0: all)"),
    "--no-fig3": dict(action="store_true", help="skip the FedAvg + DP baseline"),
}  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    p = _cli.parser(
        "fed_dp_pso",
        __doc__.split("\n\n")[0],
        quick="CI: digits, 2 rounds, 1 seed",
        full="Tables 1-2: full grid, 5 seeds",
        data="mnist/, fashion_mnist/ (IDX), medmnist/pathmnist.npz",
        seeds="quick 1, default 2, full 5",
    )
    for flag, kw in _OPTIONS.items():
        p.add_argument(flag, **kw)
    about = "; ".join(f"{k}: {v.about}" for k, v in READINGS.items())
    p.add_argument(
        "--reading",
        choices=tuple(READINGS),
        default=DEFAULT_READING,
        help=f"a named set of the design choices below (each flag overrides it): {about}",
    )
    for name in READING_FIELDS:
        p.add_argument(f"--{name.replace('_', '-')}", **_reading_flag(name))
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return _parser().parse_args(argv)


def reading(args: argparse.Namespace) -> Reading:
    """``--reading``'s :class:`Reading`, each design-choice flag that is given replacing
    its field."""
    given = {k: getattr(args, k) for k in READING_FIELDS if getattr(args, k) is not None}
    if "tensor_coefficients" in given:
        given["tensor_coefficients"] = given["tensor_coefficients"] == "yes"
    return replace(READINGS[args.reading], **given).check()


_PROFILE_FLAGS = {  # flag -> its value in the profile
    **dict.fromkeys(
        ("rounds", "seeds", "n_train", "eval_subset", "batch_size", "client_map"), None
    ),
    "datasets": tuple,
    "epsilons": lambda eps: tuple(sorted(set(eps))),
    "partitions": lambda parts: tuple(p for p in PARTITIONS if p in parts),  # table order
}


def profile(args: argparse.Namespace) -> Profile:
    """The profile of ``--quick``/``--full``/default with every given flag applied."""
    given = {
        k: f(getattr(args, k)) if f else getattr(args, k)
        for k, f in _PROFILE_FLAGS.items()
        if getattr(args, k) is not None
    }
    out = replace(
        PROFILES[_cli.profile_name(args)],
        **given,
        particles=args.particles,
        lr=args.lr,
        refine_start=args.refine_start,
        selection_metric=args.selection_metric,
        fig3=not args.no_fig3,
        reading_name=args.reading,
        reading=reading(args),
    )
    return replace(out, n_train=out.n_train or None, eval_subset=out.eval_subset or None)


def algorithm(prof: Profile, model, sizes: list, batch_size: int) -> FedDPPSO:
    """Fed-DP-PSO of ``prof`` with DP-Adam whose Poisson buffer serves every client set of
    ``sizes`` at every target (the simulator's and the Flower task's algorithm)."""
    dp = RecordDP.for_run(sizes, batch_size, rounds=prof.rounds, epsilons=prof.epsilons,
                          delta=DELTA)  # fmt: skip
    return fed_dp_pso(model, prof.reading, batch_size=batch_size, record_dp=dp,
                      particles=prof.particles, eval_batch_size=EVAL_BATCH,
                      eval_subset=prof.eval_subset, refine_start=prof.refine_start,
                      selection_metric=prof.selection_metric)  # fmt: skip


def without_dp(alg, eps: float):
    """``alg`` with plain local training for the ``inf`` target (no clipping, no noise)."""
    if math.isfinite(eps):
        return alg
    return replace(alg, training=replace(alg.training, record_dp=None))


def _eps_of(res, eps: float) -> tuple[float, float]:
    """(largest client epsilon at the end, largest sigma) of the runs at target ``eps``."""
    rows = res.runs["epsilon_target"].to_numpy() == eps
    return (
        float(np.max(res.privacy.final_epsilon[rows])),
        float(np.max(res.privacy.noise_multiplier[rows])),
    )


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def paper_accuracy(name: str, part: str, eps: float) -> tuple[float, float]:
    """The paper's (mean, std) accuracy in % of a table cell; NaNs where it has none."""
    table = PAPER.get(name, {}).get(part)
    return table[EPS_COLS.index(eps)] if table and eps in EPS_COLS else (math.nan, math.nan)


def _dp_pso_call(name, part, group, alg, clients, ds, prof: Profile, lr: float):
    """One compiled Fed-DP-PSO call (every epsilon of ``group`` x every seed): the per-round
    history and one results-table row per epsilon."""
    t0 = time.perf_counter()
    alg = without_dp(alg, group[0])
    spec = RunSpec(rounds=prof.rounds, delta=DELTA, seeds=tuple(range(prof.seeds)))
    hyper = reading_hyper(prof.reading)
    variants = Variants.grid(alg, clients, spec, epsilon_target=group, learning_rate=lr, **hyper)
    test = (ds.x_test, ds.y_test)
    res = simulate(
        alg, clients, test, variants, client_map=prof.client_map, rounds_per_call=1, progress=True
    )
    took = time.perf_counter() - t0
    h = res.history.assign(dataset=name, partition=part, method="fed_dp_pso")
    rows, sizes = [], " ".join(map(str, np.asarray(clients.sizes).tolist()))
    for eps, g in h[h["round"] == prof.rounds].groupby("epsilon_target"):
        mean, std = _report.mean_std(g["test_accuracy"], 100)
        pm, ps = paper_accuracy(name, part, eps)
        eps_max, sigma_max = _eps_of(res, eps)
        meets = bool(mean >= pm - ps) if pm == pm else None
        rows.append(dict(dataset=name, partition=part, epsilon=eps, acc_mean=mean, acc_std=std,
                         seeds=len(g), paper_mean=pm, paper_std=ps, meets_paper=meets,
                         epsilon_max=eps_max, epsilon_ok=bool(eps_max <= eps),
                         sigma_max=sigma_max, client_sizes=sizes, model=alg.model.name, lr=lr,
                         call_seconds=took))  # fmt: skip
    return h, rows


class _Dataset(NamedTuple):
    """What Fig. 3 and the communication table need of one dataset's run: the iid (else the
    first) partition's clients."""

    ds: Any
    clients: Any
    model: Any
    batch_size: int
    lr: float
    iid: bool


def _run_dataset(name, prof: Profile, data_dir, out, store, cells, rounds_rows):
    """All partitions x epsilons x seeds of one dataset; returns (wall seconds, _Dataset)."""
    start = time.perf_counter()
    finite = [e for e in prof.epsilons if not math.isinf(e)]
    groups = [g for g in (finite, [e for e in prof.epsilons if math.isinf(e)]) if g]
    ds = scale_inputs(
        load_dataset(name, data_dir), prof.reading.input_scaling, prof.reading.public_rows
    )
    if prof.n_train is not None and prof.n_train < len(ds.y_train):
        ds = subsample(ds, prof.n_train, seed=0)
    model, lr = paper_model(name, ds.num_classes, ds.input_shape)
    lr = lr if prof.lr is None else prof.lr
    parts = {part: _partition(ds, part) for part in prof.partitions}
    sizes = [p.sizes for p in parts.values()]
    bs = min(prof.batch_size, int(min(s.min() for s in sizes)))
    sequential = prof.client_map == "sequential"
    pad_to = int(max(s.max() for s in sizes)) if sequential else None
    shared = algorithm(prof, model, sizes, bs)  # one program for every partition
    kept = None
    for part, p in parts.items():
        clients = stack_clients(ds.x_train, ds.y_train, p.indices, pad_to=pad_to)
        alg = shared if sequential else algorithm(prof, model, [p.sizes], bs)
        for group in groups:
            key = f"{name}_{part}_eps" + "-".join(f"{e:g}" for e in group)
            run = partial(_dp_pso_call, name, part, group, alg, clients, ds, prof, lr)
            h, rows, reused = store.fetch_or_run(key, run)
            rounds_rows.append(h)
            cells.extend(rows)
            pd.DataFrame(cells).to_csv(out / "cells.csv", index=False)
            pd.concat(rounds_rows).to_csv(out / "rounds.csv", index=False)
            how = "resumed from disk" if reused else f"{rows[0]['call_seconds']:.0f} s"
            print(f"{name} {part} eps={group}: {how} (load {_load()})", flush=True)
        if kept is None or part == "iid":
            kept = _Dataset(ds, clients, model, bs, lr, part == "iid")
    return time.perf_counter() - start, kept


def _partition(ds, part: str, seed: int = 42):
    """The paper's partitioners: Flower's FederatedDataset pipeline with its default seed."""
    scheme, kw = ("iid", {}) if part == "iid" else ("dirichlet", {"alpha": float(part[3:])})
    return flower_partition(ds.y_train, NUM_CLIENTS, scheme, seed=seed, **kw)


def _fedavg(d: _Dataset, eps: float, rounds: int, seeds: int):
    """FedAvg + DP-Adam (plain Adam at ``inf``) on ``d``'s clients: (history, privacy)."""
    sizes = [np.asarray(d.clients.sizes)]
    dp = RecordDP.for_run(sizes, d.batch_size, rounds=rounds, epsilons=[eps], delta=DELTA)
    training = LocalTraining(batch_size=d.batch_size, optimizer="adam", record_dp=dp)
    alg = without_dp(FedAvg(d.model, training), eps)
    spec = RunSpec(rounds=rounds, delta=DELTA, seeds=tuple(range(seeds)))
    variants = Variants.grid(alg, d.clients, spec, epsilon_target=[eps], learning_rate=[d.lr])
    res = simulate(alg, d.clients, (d.ds.x_test, d.ds.y_test), variants, progress=True)
    return res.history, {"epsilon_max": _eps_of(res, eps)[0]}


def _fig3(name: str, d: _Dataset, prof: Profile, cells: list, store, out: Path):
    """Fed-DP-PSO against FedAvg + DP-Adam at every epsilon: (table rows, FedAvg history)."""
    rows, histories = [], []
    for eps in prof.epsilons:
        run = partial(_fedavg, d, eps, prof.rounds, prof.seeds)
        history, privacy, _ = store.fetch_or_run(f"fig3_{name}_eps{eps:g}", run)
        histories.append(history.assign(dataset=name, method="fedavg"))
        last = history[history["round"] == prof.rounds]
        b_mean, b_std = _report.mean_std(last.test_accuracy, 100)
        key = (name, "iid", eps)
        ours = next(c for c in cells if (c["dataset"], c["partition"], c["epsilon"]) == key)
        rows.append(dict(dataset=name, epsilon=eps, fed_dp_pso=ours["acc_mean"],
                         fed_dp_pso_std=ours["acc_std"], fedavg_dp=b_mean, fedavg_dp_std=b_std,
                         fedavg_epsilon_max=privacy["epsilon_max"]))  # fmt: skip
        pd.DataFrame(rows).to_csv(out / "fig3.csv", index=False)
    return rows, pd.concat(histories)


def _comm(name: str, d: _Dataset, pso: pd.DataFrame, fedavg: pd.DataFrame | None, store):
    """Bytes per round the simulator counted for Fed-DP-PSO (``pso``: its history on
    ``d``'s clients) and FedAvg (``fedavg``: Fig. 3's history on the same clients, else one
    round of FedAvg without DP)."""
    if fedavg is None:
        fedavg, _, _ = store.fetch_or_run(f"comm_{name}", partial(_fedavg, d, math.inf, 1, 1))
    row = {"dataset": name}
    for method, h in (("pso", pso), ("fedavg", fedavg)):
        for way in ("up", "down"):
            per_round = h[f"bytes_{way}"].unique()  # every round moves the same bytes
            if len(per_round) != 1:
                raise RuntimeError(f"{method} moved different bytes per round: {per_round}")
            row[f"{method}_{way}"] = int(per_round[0])
    return {**row, "upload_saving": 1.0 - row["pso_up"] / row["fedavg_up"]}


def _header(prof: Profile) -> str:
    r, p = prof.reading, prof
    return (
        f"Fed-DP-PSO, N={NUM_CLIENTS} clients, S={p.particles}, R={p.rounds}, E=1, "
        f"B={p.batch_size}, eta={p.lr or '0.005 (MLP) / 0.001 (CNN)'}, refine from "
        f"{p.refine_start}, reading {p.reading_name} ("
        + ", ".join(f"{k}={getattr(r, k)}" for k in READING_FIELDS)
        + f"; {SCALING_PRIVACY[r.input_scaling]}), particles scored by {p.selection_metric}, "
        f"clients {p.client_map}, {p.seeds} seed{'s' if p.seeds > 1 else ''} (mean +- sample "
        "std); partitions: Flower's FederatedDataset (shuffle seed 42) + IidPartitioner / "
        f"DirichletPartitioner (seed 42); train rows: {p.n_train or 'all'}; particle-loss "
        f"rows per client: {p.eval_subset or 'all'}; full test set. meets = ours >= paper "
        "mean - paper std; eps_ok = reported per-client epsilon (max over clients) <= target. "
        "Epsilon covers the DP-Adam steps only."
    )


def _covers() -> str:
    """What the paper-mode epsilon covers, from Fed-DP-PSO's message declarations."""
    covered, uncovered = coverage(FedDPPSO(paper_mlp()).exchanges)
    return "covers " + "; ".join(covered) + ". NOT covered: " + "; ".join(uncovered)


def _tables(cells: list, prof: Profile, out: Path) -> None:
    text = np.vectorize(_report.mean_std_text, otypes=[str])
    for name, sub in pd.DataFrame(cells).groupby("dataset"):
        sub = sub.assign(
            ours=text(sub.acc_mean, sub.acc_std),
            paper=text(sub.paper_mean, sub.paper_std),
            meets=sub.meets_paper.map({True: "yes", False: "NO", None: "-"}),
            eps_ok=sub.epsilon_ok.map({True: "yes", False: "NO"}),
        )
        cols = ["partition", "epsilon", "ours", "paper", "meets", "epsilon_max", "eps_ok"]
        md = _report.write_table(sub, out / f"table_{name}", columns=cols, header=_header(prof))
        print(f"\n{name}: {_header(prof)}\n{md}")


def _figures(rounds: pd.DataFrame, fig3: pd.DataFrame | None, out: Path) -> None:
    """Fig. 2 (accuracy per round, a panel per partition, a band per epsilon) of every
    dataset; Fig. 3 (a panel per epsilon: Fed-DP-PSO against FedAvg + DP-Adam)."""
    acc = dict(scale=100, ylabel="test accuracy (%)", marker="o")
    for name, sub in rounds.groupby("dataset"):
        path = out / f"fig2_accuracy_per_round_{name}.png"
        _report.per_round(sub, "test_accuracy", path, panel="partition", line="epsilon_target",
                          label=lambda e: f"eps={e:g}", panel_title=lambda p, n=name: f"{n} {p}",
                          **acc)  # fmt: skip
    if fig3 is not None:
        name = fig3.dataset.iloc[0]
        title = f"Fig. 3: {name}" + ("" if name == FIG3 else " (stand-in for PathMNIST)")
        names = {"fed_dp_pso": "Fed-DP-PSO", "fedavg": "FedAvg + DP-Adam"}
        _report.per_round(fig3, "test_accuracy", out / "fig3_vs_fedavg_dp.png", suptitle=title,
                          panel="epsilon_target", line="method", label=names.get,
                          panel_title=lambda e: f"eps={e:g}", **acc)  # fmt: skip


def flower_config(args: argparse.Namespace) -> dict:
    """``--runtime flower``: the run config of Fed-DP-PSO on the digits task at the smallest
    target epsilon (which must be finite), checked before any process starts. It carries the
    algorithm's settings, the reading (``reading``) and each field the flags changed
    (``reading-<field>``), so the deployment runs the algorithm the simulator path builds
    for the same flags (on the task's own 3 clients of 600 rows)."""
    if args.datasets not in (None, ["digits"]):
        raise _cli.UserError("--runtime flower runs the digits task: drop --datasets")
    prof = profile(args)
    eps = prof.epsilons[0]
    if not math.isfinite(eps):
        raise _cli.UserError("--runtime flower runs Fed-DP-PSO with DP: give a finite --epsilons")
    base = READINGS[prof.reading_name]
    changed = {
        f"reading-{k.replace('_', '-')}": getattr(prof.reading, k)
        for k in READING_FIELDS
        if getattr(prof.reading, k) != getattr(base, k)
    }
    return {
        "algorithm": "fed-dp-pso",
        "rounds": prof.rounds,
        "particles": prof.particles,
        "target-epsilon": eps,
        "batch-size": prof.batch_size,
        "eval-batch-size": EVAL_BATCH,
        "eval-subset": prof.eval_subset or "",
        "selection-metric": prof.selection_metric,
        "refine-start": prof.refine_start,
        "pso-learning-rate": prof.lr or paper_model("digits", 10, (8, 8, 1))[1],
        "reading": prof.reading_name,
        **changed,
    }


@_cli.entry_point
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.runtime == "flower":  # needs the flower extra
        from experiments._flower import run_over_flower

        run_over_flower(flower_config(args), _cli.out_dir(args))
        return
    prof = profile(args)
    if any(d not in _BUILT_IN for d in prof.datasets) or args.full or args.data_dir is not None:
        args.data_dir = _cli.data_dir(args.data_dir)
    out = _cli.out_dir(args)
    print(f"Privacy: {_covers()}.\n{_header(prof)}\nload at start: {_load()}", flush=True)
    store = _cli.call_store(out, prof.call_settings(), __name__, restart=args.restart)
    stores, cells, rounds_rows, walls, kept = [store], [], [], {}, {}
    load_start = _load()
    for name in prof.datasets:
        walls[name], kept[name] = _run_dataset(
            name, prof, args.data_dir, out, store, cells, rounds_rows
        )
        print(f"{name}: whole table {walls[name]:.0f} s (load {_load()})", flush=True)
    t0 = time.perf_counter()
    if prof.fig3 and FIG3 not in kept and args.full:
        iid = replace(prof, partitions=("iid",))  # own settings: partitions fix the padding
        iid_store = _cli.call_store(out, iid.call_settings(), __name__, restart=args.restart)
        try:  # the paper's Fig. 3 dataset, IID only, when its files are found
            _, kept[FIG3] = _run_dataset(
                FIG3, iid, args.data_dir, out, iid_store, cells, rounds_rows
            )
            stores.append(iid_store)
        except DatasetNotFoundError as err:
            print(f"Fig. 3 falls back to a stand-in: {err}")
    load_tables = _load()
    _tables(cells, prof, out)
    rounds = pd.concat(rounds_rows)
    fig3_name = next((n for n in (FIG3, *kept) if n in kept and kept[n].iid), None)
    fig3, fig3_rounds, fedavg = [], None, {}
    if prof.fig3 and fig3_name is not None:
        fig3, fedavg[fig3_name] = _fig3(fig3_name, kept[fig3_name], prof, cells, stores[-1], out)
        ours = rounds[(rounds.dataset == fig3_name) & (rounds.partition == "iid")]
        fig3_rounds = pd.concat([ours, fedavg[fig3_name]])
        what = "on PathMNIST" if fig3_name == FIG3 else "stand-in for PathMNIST"
        print(f"\nFig. 3 {what}: {fig3_name} ({kept[fig3_name].model.name})")
        shown = pd.DataFrame(fig3)
        shown = shown.astype(object).where(shown.notna(), None)  # no std from one seed: "-"
        print(shown.to_markdown(index=False, floatfmt=".2f", missingval="-"))
    walls["fig3"] = time.perf_counter() - t0
    comm = []
    for name, d in kept.items():
        part = "iid" if d.iid else rounds[rounds.dataset == name].partition.iloc[0]
        pso = rounds[(rounds.dataset == name) & (rounds.partition == part)]
        comm.append(_comm(name, d, pso, fedavg.get(name), store))
    pd.DataFrame(comm).to_csv(out / "comm.csv", index=False)
    print("\nCommunication per round (bytes):\n" + pd.DataFrame(comm).to_markdown(index=False))
    _figures(rounds, fig3_rounds, out)
    summary = dict(
        plan=asdict(prof),
        header=_header(prof),
        privacy_covers=_covers(),
        fig3_dataset=fig3_name if fig3 else None,
        fig3_stand_in=bool(fig3) and fig3_name != FIG3,
        models={name: d.model.name for name, d in kept.items()},
        wall_seconds=walls,
        resumed_calls=[key for st in stores for key in st.reused],
        calls_folders=[str(st.folder) for st in stores],
        load_average={"start": load_start, "after_tables": load_tables, "end": _load()},
        cpu_count=os.cpu_count(),
        cells=cells,
        fig3=fig3,
        comm=comm,
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(f"wall seconds: {json.dumps({k: round(v) for k, v in walls.items()})}")
    if summary["resumed_calls"]:
        print(
            f"{len(summary['resumed_calls'])} call(s) reused from {out / 'calls'} "
            "(--restart runs them again)"
        )


if __name__ == "__main__":
    main()
