"""Fed-DP-PSO experiment: Tables 1 and 2, accuracy per round (Fig. 2), vs FedAvg + DP (Fig. 3),
communication table. ``python -m experiments.fed_dp_pso [--quick | --full] [--datasets ...]``.

Every (dataset, partition) runs in two compiled calls: all finite epsilons x all seeds as one
batch axis (epsilon only changes the noise multipliers), and epsilon = inf x all seeds.

``--full`` (Tables 1-2) uses the paper's hyper-parameters (R = 10 rounds, E = 1, S = 5, N = 5,
w = 0.7, c1 = c2 = 1.4, eta = 0.005, delta = 1e-5, MLP 784-256-256-10) on all 60,000 training
rows, with B = 256 (the paper does not state its batch size) and the particles' losses on a
fixed random 2,000 of each client's rows (``--eval-subset``, spec 2.2's speed option; DP-Adam
still samples all rows). ``--n-train`` takes a random training subset for a quicker, reduced
table. The test set is always complete. Particles are scored by their loss, as in the paper;
``--selection-metric error`` scores them by error rate (an option, see
``docs/fed_dp_pso.md``). All of these are printed in every table header and saved.
Partitions are Flower's (the paper used Flower's IidPartitioner and
DirichletPartitioner): ``swarmjax.fl.flower_partition`` gives the same clients as
``FederatedDataset(shuffle=True, seed=42)`` with those partitioners at their default seed 42,
the same for every run seed.

Results go to ``results/fed_dp_pso/``: ``cells.csv`` (grows as cells finish), ``rounds.csv``,
``table_<dataset>.csv/.md``, ``fig3.csv``, ``comm.csv``, ``summary.json`` (plan, wall times,
machine load) and PNG figures. Every finished call is also saved under ``calls/`` (one folder
per distinct setting): rerunning the same command resumes, reusing finished calls, so an
interrupted table loses only the call in progress (``--restart`` runs everything again).
Fig. 3 (Fed-DP-PSO against FedAvg + DP-Adam at equal epsilon, IID) runs on PathMNIST with the
LeNet-5 (eta = 0.001) when it is among ``--datasets`` or, with ``--full``, when its ``.npz`` is
found; otherwise the first dataset of the run stands in (printed and saved). The epsilon
reported covers the DP-Adam steps only, not the exact reported losses and argmin selections
(see ``docs/fed_dp_pso.md``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import jax
import numpy as np
import pandas as pd

from experiments import _cli
from swarmjax._validation import check_choice
from swarmjax.fl import (
    DATASETS,
    DatasetNotFoundError,
    comm,
    flower_partition,
    load_dataset,
    stack_clients,
    subsample,
)
from swarmjax.fl.algorithms.fed_dp_pso import FedDPPSO
from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.client.record_dp import DELTA, sampler_capacity
from swarmjax.fl.client.training import LocalTraining, RecordDP
from swarmjax.fl.data import Dataset
from swarmjax.fl.protocol import coverage
from swarmjax.fl.runtime import simulate
from swarmjax.models import Model, lenet5, mlp, paper_mlp
from swarmjax.resume import CallStore
from swarmjax.swarm import PSOHyperParams

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
EPS_COLS = [5.0, 8.0, 10.0, math.inf]
INPUT_SCALINGS = ("channel", "pixel_public", "none")
READING_KEYS = (
    "init",
    "init_scale",
    "refine_update",
    "optimizer_state",
    "tensor_coefficients",
    "velocity_clamp",
    "weight_decay",
    "decay",
    "input_scaling",
    "public_rows",
)
_CURRENT = dict(
    init="independent",
    init_scale=0.01,
    refine_update="if_better",
    optimizer_state="fresh",
    tensor_coefficients="no",
    velocity_clamp=math.inf,
    weight_decay="decoupled",
    decay=1e-4,
    input_scaling="channel",
    public_rows=1000,
)
READINGS = {  # docs/fed_dp_pso.md, "The authors' code and the readings": why each choice
    "paper": dict(
        _CURRENT,
        refine_update="always",
        weight_decay="coupled",
        about="default: Algorithm 1's text (refined model always kept) and eq. 10 (coupled "
        "L2); independent inits, fresh Adam, r1/r2 per particle, no clamp",
    ),
    "current": dict(_CURRENT, about="before issue 17: pbest kept only if better, AdamW"),
    "authors": dict(
        _CURRENT,
        init="shared",
        refine_update="always",
        optimizer_state="persistent",
        tensor_coefficients="yes",
        velocity_clamp=0.1,
        weight_decay="coupled",
        input_scaling="pixel_public",
        about="the DP notebooks' choices (shared init, refined model always kept, one Adam "
        "per client, r1/r2 per tensor, clamp 0.1, coupled L2, per-pixel scaling)",
    ),
}
DEFAULT_READING = "paper"
PARTITIONS = ("iid", "dir0.3", "dir1")  # Tables 1-2's column groups
FIG3 = "pathmnist"  # the paper's Fig. 3 dataset (LeNet-5); --full adds it when found
PRESETS = {
    "quick": dict(
        datasets=["digits"],
        parts=["iid"],
        eps=[5.0, math.inf],
        rounds=2,
        seeds=1,
        n_train=None,
        eval_subset=None,
        batch_size=64,
        client_map="vmap",
    ),
    "full": dict(
        datasets=["mnist", "fashion_mnist"],
        parts=list(PARTITIONS),
        eps=EPS_COLS,
        rounds=10,
        seeds=5,
        n_train=None,
        eval_subset=2_000,
        batch_size=256,
        client_map="sequential",
    ),
    "default": dict(
        datasets=["mnist"],
        parts=["iid", "dir1"],
        eps=[5.0, math.inf],
        rounds=10,
        seeds=2,
        n_train=10_000,
        eval_subset=500,
        batch_size=64,
        client_map="vmap",
    ),
}


def _parser() -> argparse.ArgumentParser:
    p = _cli.parser(
        "fed_dp_pso",
        __doc__.split("\n\n")[0],
        quick="CI: digits, 2 rounds, 1 seed",
        full="Tables 1-2: full grid, 5 seeds",
        data="mnist/, fashion_mnist/ (IDX), medmnist/pathmnist.npz",
        seeds="quick 1, default 2, full 5",
    )
    p.add_argument(
        "--datasets",
        nargs="+",
        choices=DATASETS,
        default=None,
        help="e.g. mnist (Table 1 only); pathmnist (colour: LeNet-5) when its .npz is found",
    )
    p.add_argument(
        "--epsilons",
        nargs="+",
        type=_epsilon,
        default=None,
        help="target epsilons, 'inf' for no DP (--full: 5 8 10 inf; otherwise 5 inf)",
    )
    p.add_argument(
        "--partitions",
        nargs="+",
        choices=PARTITIONS,
        default=None,
        help="e.g. iid for one column group of a table (quick: iid; default: iid dir1; "
        "full: iid dir0.3 dir1); the partitions run share one padded shape",
    )
    p.add_argument("--rounds", type=_cli.count("--rounds"), help="R (default 10; quick 2)")
    p.add_argument(
        "--particles", type=_cli.count("--particles"), default=5, help="S, particles per client"
    )
    p.add_argument(
        "--batch-size",
        type=_cli.count("--batch-size"),
        default=None,
        help="B, expected Poisson batch (full 256, else 64)",
    )
    p.add_argument(
        "--runtime",
        choices=("simulator", "flower"),
        default="simulator",
        help="flower: Fed-DP-PSO on digits over a SuperLink + 3 SuperNodes on 127.0.0.1, "
        "beside the simulator (experiments/_flower.py)",
    )
    p.add_argument(
        "--lr",
        type=_cli.positive_float("--lr"),
        default=None,
        help="eta of (DP-)Adam (default: the paper's, 0.005 for the MLPs, 0.001 for the CNN)",
    )
    p.add_argument(
        "--refine-start",
        choices=("pbest", "position"),
        default="pbest",
        help="DP-Adam refines the client's best pbest (default) or best moved position",
    )
    p.add_argument(
        "--selection-metric",
        choices=("loss", "error"),
        default="loss",
        help="particles scored by cross-entropy (the paper, default) or by error rate "
        "(an option: under DP-Adam the loss rises while accuracy improves)",
    )
    p.add_argument(
        "--reading",
        choices=tuple(READINGS),
        default=DEFAULT_READING,
        help="a named set of the design choices below (each flag overrides it): "
        + "; ".join(f"{k}: {v['about']}" for k, v in READINGS.items()),
    )
    p.add_argument(
        "--init",
        choices=("independent", "shared"),
        default=None,
        help="particles: independent model inits, or one shared model + --init-scale N(0,1) "
        "with gbest = that model (the authors' notebooks)",
    )
    p.add_argument(
        "--init-scale",
        type=_cli.positive_float("--init-scale"),
        default=None,
        help="std of the shared initialisation's noise (default 0.01)",
    )
    p.add_argument(
        "--refine-update",
        choices=("if_better", "always"),
        default=None,
        help="the refined model enters the client's pbest always (Algorithm 1 lines 27-32, "
        "the notebooks; reading paper) or only if its score is lower (reading current)",
    )
    p.add_argument(
        "--optimizer-state",
        choices=("fresh", "persistent"),
        default=None,
        help="(DP-)Adam state fresh every round (paper, current) or one per client across "
        "rounds (authors)",
    )
    p.add_argument(
        "--tensor-coefficients",
        choices=("no", "yes"),
        default=None,
        help="draw r1, r2 per parameter tensor (the notebooks) instead of per particle",
    )
    p.add_argument(
        "--velocity-clamp",
        type=_cli.positive_float("--velocity-clamp", allow_inf=True),
        default=None,
        help="clamp every velocity coordinate to [-v, v] (paper: inf; authors: 0.1)",
    )
    p.add_argument(
        "--weight-decay",
        choices=("decoupled", "coupled"),
        default=None,
        help="Adam + coupled L2, eq. 10 (paper, authors) or AdamW's decoupled decay (current)",
    )
    p.add_argument(
        "--decay",
        type=_nonnegative_float,
        default=None,
        help="lambda of the weight decay (default 1e-4)",
    )
    p.add_argument(
        "--input-scaling",
        choices=INPUT_SCALINGS,
        default=None,
        help="channel: train mean/std per channel (paper, current); pixel_public: per-pixel "
        "mean/std "
        "of --public-rows training rows held out from every client; none: [0, 1]",
    )
    p.add_argument(
        "--public-rows",
        type=_cli.count("--public-rows"),
        default=None,
        help="rows held out of the training split for pixel_public statistics (default 1000)",
    )
    p.add_argument(
        "--client-map",
        choices=("vmap", "sequential"),
        default=None,
        help="clients as a vmap axis or one after another (full: sequential, else vmap)",
    )
    p.add_argument("--n-train", type=_cli.count("--n-train", 0), help="train subset (0: all rows)")
    p.add_argument(
        "--eval-subset", type=_cli.count("--eval-subset", 0), help="rows/client (0: all)"
    )
    p.add_argument("--no-fig3", action="store_true", help="skip the FedAvg + DP baseline")
    return p


def _nonnegative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--decay must be a number; got {text!r}") from None
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"--decay must be finite and >= 0; got {text}")
    return value


def _epsilon(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"epsilons must be > 0 (or inf), got {text}")
    return value


def _plan(args: argparse.Namespace) -> dict:
    plan = dict(PRESETS[_cli.profile_name(args)])
    for k in ("datasets", "rounds", "seeds", "n_train", "eval_subset", "batch_size", "client_map"):
        if getattr(args, k) is not None:
            plan[k] = getattr(args, k)
    for k in ("n_train", "eval_subset"):
        plan[k] = plan[k] or None  # 0 means "all rows"
    if args.epsilons is not None:
        plan["eps"] = sorted(set(args.epsilons))
    if args.partitions is not None:
        plan["parts"] = [p for p in PARTITIONS if p in args.partitions]
    plan.update(
        particles=args.particles,
        lr=args.lr,
        refine_start=args.refine_start,
        selection_metric=args.selection_metric,
        fig3=not args.no_fig3,
        reading=args.reading,
        **reading_plan(args),
    )
    return plan


def reading_plan(args: argparse.Namespace) -> dict:
    """The design choices of ``--reading``, each replaced by its flag when given."""
    base = READINGS[args.reading]
    return {k: base[k] if getattr(args, k) is None else getattr(args, k) for k in READING_KEYS}


def _call_settings(plan: dict) -> dict:
    """What a saved call's result depends on besides its key (dataset, partition, epsilons).
    ``parts`` stays in: with sequential clients all partitions share one padded shape."""
    ignored = ("datasets", "eps", "fig3")
    return {k: v for k, v in plan.items() if k not in ignored}


PIXEL_STD_FLOOR = 0.1  # a pixel nearly constant in the public rows is divided by 0.1 at most


def public_mask(n: int, public_rows: int, seed: int = 0) -> np.ndarray:
    """``(n,)`` bool: the ``public_rows`` training rows drawn with ``default_rng(seed)``
    (public randomness) and held out of every client."""
    if not 1 <= public_rows < n:
        raise ValueError(f"public_rows must be in [1, {n - 1}]; got {public_rows}")
    public = np.zeros(n, bool)
    public[np.random.default_rng(seed).choice(n, public_rows, replace=False)] = True
    return public


def scale_inputs(ds: Dataset, how: str, public_rows: int, seed: int = 0) -> Dataset:
    """``ds`` (pixels in ``[0, 1]``) scaled as ``--input-scaling`` says.

    ``channel``: minus the mean, over the std, of every training pixel per channel (2
    numbers of the clients' pooled data, not accounted: see docs/fed_dp_pso.md);
    ``pixel_public``: per-pixel mean and std (std floored at :data:`PIXEL_STD_FLOOR`) of
    ``public_rows`` training rows drawn with ``default_rng(seed)`` and REMOVED from the
    training split, so no client holds them (public data: costs no privacy); ``none``."""
    check_choice("input_scaling", how, INPUT_SCALINGS)
    if how == "none":
        return ds
    if how == "channel":
        axes = tuple(range(ds.x_train.ndim - 1))
        mean, std = ds.x_train.mean(axis=axes), ds.x_train.std(axis=axes)
        std = np.where(std > 0, std, 1.0)
        x_train = ds.x_train
    else:
        public = public_mask(len(ds.y_train), public_rows, seed)
        mean = ds.x_train[public].mean(axis=0)
        std = np.maximum(ds.x_train[public].std(axis=0), PIXEL_STD_FLOOR)
        x_train, ds = ds.x_train[~public], replace(ds, y_train=ds.y_train[~public])
    mean, std = mean.astype(np.float32), std.astype(np.float32)
    return replace(ds, x_train=(x_train - mean) / std, x_test=(ds.x_test - mean) / std)


def _load_train(name: str, plan: dict, data_dir, seed: int = 0) -> Dataset:
    ds = scale_inputs(load_dataset(name, data_dir), plan["input_scaling"], plan["public_rows"])
    n_train = plan["n_train"]
    if n_train is not None and n_train < len(ds.y_train):
        ds = subsample(ds, n_train, seed=seed)
    return ds


def pso_config(model: Model, plan: dict, batch_size: int, capacity: int) -> FedDPPSO:
    """Fed-DP-PSO with the plan's settings and design choices (DP-Adam; the epsilon = inf
    runs drop ``record_dp``)."""
    optimizer = "adamw" if plan["weight_decay"] == "decoupled" else "adam"
    return FedDPPSO(
        model=model,
        training=LocalTraining(
            batch_size=batch_size,
            optimizer=optimizer,
            weight_decay=plan["decay"],
            record_dp=RecordDP(clip_norm=1.0, capacity=capacity),
        ),
        particles=plan["particles"],
        eval_batch_size=2000,
        eval_subset=plan["eval_subset"],
        refine_start=plan["refine_start"],
        selection_metric=plan["selection_metric"],
        init=plan["init"],
        init_scale=plan["init_scale"],
        refine_update=plan["refine_update"],
        optimizer_state=plan["optimizer_state"],
        tensor_coefficients=plan["tensor_coefficients"] == "yes",
    )


def _partition(ds, part: str, seed: int = 42):
    """The paper's partitioners: Flower's FederatedDataset pipeline with its default seed."""
    scheme, kw = ("iid", {}) if part == "iid" else ("dirichlet", {"alpha": float(part[3:])})
    return flower_partition(ds.y_train, 5, scheme, seed=seed, **kw)


def _model(name: str, ds, lr: float | None) -> tuple[Model, float]:
    """The paper's model and eta (spec 2.5): the LeNet-5 variant at 0.001 for colour images
    (PathMNIST), the MLP 784-256-256-C at 0.005 for grey-scale ones, a small MLP 64-32-C at
    0.005 for the bundled digits; ``lr`` (``--lr``), when given, replaces eta."""
    if name == "digits":
        model, eta = mlp((32,), ds.num_classes, ds.input_shape), 0.005
    elif ds.input_shape[-1] == 3:
        model, eta = lenet5(ds.num_classes, ds.input_shape), 0.001
    else:
        model, eta = paper_mlp(ds.num_classes, ds.input_shape), 0.005
    return model, eta if lr is None else lr


def run_capacity(sizes: list[np.ndarray], batch_size: int, rounds: int, eps: list[float]) -> int:
    """One Poisson buffer for every partition: its overflow over the whole run adds at most
    ``1e-3 delta`` at the largest finite target (``RecordDP.for_sizes`` with the run's
    steps). The per-step ``1e-9`` buffer is not enough: the accountant charges the overflow
    as ``P (1 + e^eps)`` out of delta, which caps the reachable epsilon (about 4-6 at
    these step counts), so targets 8 and 10 would be silently met at ~5."""
    finite = [e for e in eps if math.isfinite(e)]
    if not finite:
        return max(sampler_capacity(s, batch_size) for s in sizes)
    caps = []
    for s in sizes:
        steps = rounds * math.ceil(int(s.max()) / batch_size)
        dp = RecordDP.for_sizes(s, batch_size, steps=steps, delta=DELTA, epsilon=max(finite))
        caps.append(int(dp.capacity))
    return max(caps)


def _shared_shapes(sizes: list[np.ndarray], batch_size: int, rounds, eps) -> tuple[int, int]:
    """One padded length and one Poisson capacity for every partition of a dataset, so each
    compiled program serves all partitions (with sequential clients padding costs no DP
    steps: each client runs its own count)."""
    return int(max(s.max() for s in sizes)), run_capacity(sizes, batch_size, rounds, eps)


def _paper(name: str, part: str, eps: float) -> tuple[float, float]:
    table = PAPER.get(name, {}).get(part)
    if table is None or eps not in EPS_COLS:
        return (math.nan, math.nan)
    return table[EPS_COLS.index(eps)]


def _covers() -> str:
    """What the paper-mode epsilon covers, from Fed-DP-PSO's message declarations."""
    covered, uncovered = coverage(FedDPPSO(paper_mlp()).exchanges)
    return "covers " + "; ".join(covered) + ". NOT covered: " + "; ".join(uncovered)


def _run(alg, clients, data, ds, plan: dict, lr: float, eps: list[float], **kw):
    """One simulator call of ``alg`` for every epsilon of ``eps`` x every seed."""
    extra = {}
    if isinstance(alg, FedDPPSO):
        extra["pso"] = PSOHyperParams(velocity_clamp=plan["velocity_clamp"])
    variants = alg.variants(
        clients, rounds=plan["rounds"], learning_rate=lr, target_epsilon=eps, **extra
    )
    return simulate(
        alg,
        data,
        (ds.x_test, ds.y_test),
        variants=variants,
        seeds=list(range(plan["seeds"])),
        rounds=plan["rounds"],
        delta=DELTA,
        progress=True,
        **kw,
    )


def _without_dp(alg, eps: list[float]):
    """``alg`` with plain local training for the ``inf`` target (no clipping, no noise)."""
    if not math.isinf(eps[0]):
        return alg
    return replace(alg, training=replace(alg.training, record_dp=None))


def _eps_of(res, eps: float) -> tuple[float, float]:
    """(largest client epsilon at the end, largest sigma) of the runs at target ``eps``."""
    rows = res.runs["epsilon_target"].to_numpy() == eps
    return (
        float(np.max(res.privacy.final_epsilon[rows])),
        float(np.max(res.privacy.noise_multiplier[rows])),
    )


def _final(history: pd.DataFrame, rounds: int) -> pd.DataFrame:
    return history[history["round"] == rounds]


def _summary(acc: pd.Series) -> tuple[float, float]:
    """Mean and sample std (ddof=1; NaN for one seed) of final accuracies in percent."""
    acc = acc * 100
    return float(acc.mean()), float(acc.std(ddof=1)) if len(acc) > 1 else math.nan


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _dp_pso_call(name: str, part: str, group: list, cfg, clients, ds, plan: dict, lr: float):
    """One compiled Fed-DP-PSO call (every epsilon of ``group`` x every seed): the per-round
    history and one results-table row per epsilon."""
    t0 = time.perf_counter()
    alg = _without_dp(cfg, group)
    res = _run(
        alg,
        clients,
        alg.client_data(clients),
        ds,
        plan,
        lr,
        group,
        client_map=plan["client_map"],
        rounds_per_call=1,
    )
    took = time.perf_counter() - t0
    h = res.history.assign(dataset=name, partition=part, method="fed_dp_pso")
    rows = []
    for eps, g in _final(h, plan["rounds"]).groupby("epsilon_target"):
        mean, std = _summary(g["test_accuracy"])
        pm, ps = _paper(name, part, eps)
        eps_max, sigma_max = _eps_of(res, eps)
        rows.append(
            dict(
                dataset=name,
                partition=part,
                epsilon=eps,
                acc_mean=mean,
                acc_std=std,
                seeds=len(g),
                paper_mean=pm,
                paper_std=ps,
                meets_paper=bool(mean >= pm - ps) if pm == pm else None,
                epsilon_max=eps_max,
                epsilon_ok=bool(eps_max <= eps),
                sigma_max=sigma_max,
                client_sizes=" ".join(map(str, np.asarray(clients.sizes).tolist())),
                model=cfg.model.name,
                lr=lr,
                call_seconds=took,
            )
        )
    return h, rows


def _run_dataset(
    name: str, plan: dict, args, out: Path, store: CallStore, cells: list, rounds_rows: list
):
    """All partitions x epsilons x seeds of one dataset; returns (wall seconds, fig3 input,
    model)."""
    start = time.perf_counter()
    stand_in = None
    finite = [e for e in plan["eps"] if not math.isinf(e)]
    groups = [g for g in (finite, [e for e in plan["eps"] if math.isinf(e)]) if g]
    ds = _load_train(name, plan, args.data_dir)
    # one Model object per dataset: equal configs share compilations
    model, lr = _model(name, ds, plan["lr"])
    parts = {part: _partition(ds, part) for part in plan["parts"]}
    sizes = [p.sizes for p in parts.values()]
    bs = min(plan["batch_size"], int(min(s.min() for s in sizes)))
    sequential = plan["client_map"] == "sequential"
    shapes = _shared_shapes(sizes, bs, plan["rounds"], plan["eps"])
    pad_to, capacity = shapes if sequential else (None, None)
    for part, p in parts.items():
        clients = stack_clients(ds.x_train, ds.y_train, p.indices, pad_to=pad_to)
        cap = capacity or run_capacity([p.sizes], bs, plan["rounds"], plan["eps"])
        cfg = pso_config(model, plan, bs, cap)
        for group in groups:
            key = f"{name}_{part}_eps" + "-".join(f"{e:g}" for e in group)
            run = partial(_dp_pso_call, name, part, group, cfg, clients, ds, plan, lr)
            h, rows, reused = store.fetch_or_run(key, run)
            rounds_rows.append(h)
            cells.extend(rows)
            pd.DataFrame(cells).to_csv(out / "cells.csv", index=False)
            pd.concat(rounds_rows).to_csv(out / "rounds.csv", index=False)
            how = "resumed from disk" if reused else f"{rows[0]['call_seconds']:.0f} s"
            print(f"{name} {part} eps={group}: {how} (load {_load()})", flush=True)
        if part == "iid":
            stand_in = (ds, clients, model, bs, lr, store)
    return time.perf_counter() - start, stand_in, model


def _fig3(name: str, stand_in, plan: dict, cells: list, out: Path) -> list[dict]:
    ds, clients, model, bs, lr, store = stand_in

    def baseline(eps: float) -> tuple[pd.DataFrame, dict]:
        cap = run_capacity([np.asarray(clients.sizes)], bs, plan["rounds"], [eps])
        record_dp = RecordDP(clip_norm=1.0, capacity=cap)
        alg = _without_dp(
            FedAvg(model, LocalTraining(batch_size=bs, optimizer="adam", record_dp=record_dp)),
            [eps],
        )
        base = _run(alg, clients, clients, ds, plan, lr, [eps])
        return base.history, {"epsilon_max": _eps_of(base, eps)[0]}

    rows = []
    for eps in plan["eps"]:
        history, privacy, _ = store.fetch_or_run(f"fig3_{name}_eps{eps:g}", partial(baseline, eps))
        b_mean, b_std = _summary(_final(history, plan["rounds"])["test_accuracy"])
        ours = next(
            c for c in cells if (c["dataset"], c["partition"], c["epsilon"]) == (name, "iid", eps)
        )
        rows.append(
            dict(
                dataset=name,
                epsilon=eps,
                fed_dp_pso=ours["acc_mean"],
                fed_dp_pso_std=ours["acc_std"],
                fedavg_dp=b_mean,
                fedavg_dp_std=b_std,
                fedavg_epsilon_max=privacy["epsilon_max"],
            )
        )
        pd.DataFrame(rows).to_csv(out / "fig3.csv", index=False)
    return rows


SCALING_PRIVACY = {
    "channel": "inputs scaled by the mean/std of all training pixels (2 numbers of the "
    "clients' pooled data, NOT covered by epsilon)",
    "pixel_public": "inputs scaled by per-pixel statistics of held-out public rows (no cost)",
    "none": "inputs in [0, 1]",
}


def _reading_text(plan: dict) -> str:
    """The design choices, e.g. ``current (init=independent, ...)``, and what the input
    scaling releases."""
    choices = ", ".join(f"{k}={plan[k]}" for k in READING_KEYS)
    return f"{plan.get('reading', '?')} ({choices}; {SCALING_PRIVACY[plan['input_scaling']]})"


def _header(plan: dict) -> str:
    return (
        f"Fed-DP-PSO, N=5 clients, S={plan['particles']}, R={plan['rounds']}, E=1, "
        f"B={plan['batch_size']}, eta={plan['lr'] or '0.005 (MLP) / 0.001 (CNN)'}, "
        f"refine from {plan['refine_start']}, reading {_reading_text(plan)}, "
        f"particles scored by {plan['selection_metric']}, clients {plan['client_map']}, "
        f"{plan['seeds']} seed{'s' if plan['seeds'] > 1 else ''} (mean +- sample std); "
        "partitions: Flower's FederatedDataset "
        "(shuffle seed 42) + IidPartitioner / DirichletPartitioner (seed 42); "
        f"train rows: {plan['n_train'] or 'all'}; particle-loss rows per client: "
        f"{plan['eval_subset'] or 'all'}; full test set. meets = ours >= paper mean - paper "
        "std; eps_ok = reported per-client epsilon (max over clients) <= target. Epsilon covers "
        "the DP-Adam steps only."
    )


def _mean_std(mean: float, std: float) -> str:
    """``"m +- s"``; ``"m (1 seed)"`` where the std is NaN (one seed); ``"-"`` where there is
    no number (no paper value for digits)."""
    if not np.isfinite(mean):
        return "-"
    return f"{mean:.2f} +- {std:.2f}" if np.isfinite(std) else f"{mean:.2f} (1 seed)"


def _tables(cells: list, plan: dict, out: Path) -> None:
    table = pd.DataFrame(cells)
    for name, sub in table.groupby("dataset"):
        sub = sub.assign(
            ours=[_mean_std(m, sd) for m, sd in zip(sub.acc_mean, sub.acc_std, strict=True)],
            paper=[_mean_std(m, sd) for m, sd in zip(sub.paper_mean, sub.paper_std, strict=True)],
            meets=sub.meets_paper.map({True: "yes", False: "NO", None: "-"}),
            eps_ok=sub.epsilon_ok.map({True: "yes", False: "NO"}),
        )
        sub.to_csv(out / f"table_{name}.csv", index=False)
        cols = ["partition", "epsilon", "ours", "paper", "meets", "epsilon_max", "eps_ok"]
        md = sub[cols].to_markdown(index=False, floatfmt=".3f")
        (out / f"table_{name}.md").write_text(f"{_header(plan)}\n\n{md}\n")
        print(f"\n{name}: {_header(plan)}\n{md}")


def _comm(models: dict) -> list[dict]:
    rows = []
    for name, model in models.items():
        shape = jax.eval_shape(model.init, jax.random.key(0))
        pso, avg = comm.pso_bytes(shape, 5), comm.fedavg_bytes(shape, 5)
        rows.append(
            dict(
                dataset=name,
                pso_up=pso.up,
                pso_down=pso.down,
                fedavg_up=avg.up,
                fedavg_down=avg.down,
                upload_saving=comm.upload_saving(pso, avg),
            )
        )
    return rows


def flower_config(args: argparse.Namespace) -> dict:
    """``--runtime flower``: the run config of Fed-DP-PSO on digits at the first
    ``--epsilons`` (default 8), checked before any process starts."""
    if args.datasets not in (None, ["digits"]):
        raise _cli.UserError("--runtime flower runs the digits task: drop --datasets")
    eps = (args.epsilons or [8.0])[0]
    if not math.isfinite(eps):
        raise _cli.UserError("--runtime flower runs Fed-DP-PSO with DP: give a finite --epsilons")
    rounds = args.rounds or (2 if args.quick else 10)
    particles = 2 if args.quick else args.particles
    return {
        "algorithm": "fed-dp-pso",
        "rounds": rounds,
        "particles": particles,
        "target-epsilon": eps,
    }


_BUILT_IN = ("digits", "breast_cancer")  # shipped with scikit-learn: no data folder needed


@_cli.entry_point
def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.runtime == "flower":  # needs the flower extra
        from experiments._flower import run_over_flower

        run_over_flower(flower_config(args), _cli.out_dir(args))
        return
    plan = _plan(args)
    wants_files = any(d not in _BUILT_IN for d in plan["datasets"]) or args.full
    if wants_files or args.data_dir is not None:
        args.data_dir = _cli.data_dir(args.data_dir)
    out = _cli.out_dir(args)
    print(f"Privacy: {_covers()}.\n{_header(plan)}\nload at start: {_load()}", flush=True)
    store = _cli.call_store(out, _call_settings(plan), __name__, restart=args.restart)
    stores = [store]
    cells, rounds_rows, fig3, walls = [], [], [], {}
    load_start = _load()
    fig3_inputs, models = {}, {}
    for name in plan["datasets"]:
        walls[name], fig3_inputs[name], models[name] = _run_dataset(
            name, plan, args, out, store, cells, rounds_rows
        )
        print(f"{name}: whole table {walls[name]:.0f} s (load {_load()})", flush=True)
    t0 = time.perf_counter()
    if plan["fig3"] and FIG3 not in fig3_inputs and args.full:
        iid = {**plan, "parts": ["iid"]}  # own settings: the partitions fix the padded shape
        iid_store = _cli.call_store(out, _call_settings(iid), __name__, restart=args.restart)
        try:  # the paper's Fig. 3 dataset, IID only, when its files are found
            _, fig3_inputs[FIG3], models[FIG3] = _run_dataset(
                FIG3, iid, args, out, iid_store, cells, rounds_rows
            )
            stores.append(iid_store)
        except DatasetNotFoundError as err:
            print(f"Fig. 3 falls back to a stand-in: {err}")
    load_tables = _load()
    _tables(cells, plan, out)
    fig3_name = FIG3 if FIG3 in fig3_inputs else next(iter(fig3_inputs), None)
    if plan["fig3"] and fig3_name is not None and fig3_inputs[fig3_name] is not None:
        fig3 = _fig3(fig3_name, fig3_inputs[fig3_name], plan, cells, out)
        what = "on PathMNIST" if fig3_name == FIG3 else "stand-in for PathMNIST"
        print(f"\nFig. 3 {what}: {fig3_name} ({models[fig3_name].name})")
        shown = pd.DataFrame(fig3)
        shown = shown.astype(object).where(shown.notna(), None)  # no std from one seed: "-"
        print(shown.to_markdown(index=False, floatfmt=".2f", missingval="-"))
    walls["fig3"] = time.perf_counter() - t0
    comm_rows = _comm(models)
    pd.DataFrame(comm_rows).to_csv(out / "comm.csv", index=False)
    print("\nCommunication per round (bytes):\n" + pd.DataFrame(comm_rows).to_markdown(index=False))
    _figures(pd.concat(rounds_rows), pd.DataFrame(fig3), out)
    summary = dict(
        plan=plan,
        header=_header(plan),
        privacy_covers=_covers(),
        fig3_dataset=fig3_name if fig3 else None,
        fig3_stand_in=bool(fig3) and fig3_name != FIG3,
        models={name: model.name for name, model in models.items()},
        wall_seconds=walls,
        resumed_calls=[key for st in stores for key in st.reused],
        calls_folders=[str(st.folder) for st in stores],
        load_average={"start": load_start, "after_tables": load_tables, "end": _load()},
        cpu_count=os.cpu_count(),
        cells=cells,
        fig3=fig3,
        comm=comm_rows,
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(f"wall seconds: {json.dumps({k: round(v) for k, v in walls.items()})}")
    if summary["resumed_calls"]:
        print(
            f"{len(summary['resumed_calls'])} call(s) reused from {out / 'calls'} "
            "(--restart runs them again)"
        )


def _figures(rounds: pd.DataFrame, fig3: pd.DataFrame, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name, sub in rounds.groupby("dataset"):
        parts = sorted(sub["partition"].unique())
        fig, axes = plt.subplots(1, len(parts), figsize=(4 * len(parts), 3.5), squeeze=False)
        for ax, part in zip(axes[0], parts, strict=True):
            g = sub[sub["partition"] == part]
            for eps, ge in g.groupby("epsilon_target"):
                m = ge.groupby("round")["test_accuracy"].mean() * 100
                ax.plot(m.index, m.values, marker="o", label=f"eps={eps:g}")
            ax.set(xlabel="round", ylabel="test accuracy (%)", title=f"{name} {part}")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"fig2_accuracy_per_round_{name}.png", dpi=120)
        plt.close(fig)
    if len(fig3):
        fig, ax = plt.subplots(figsize=(5, 3.5))
        x = np.arange(len(fig3))
        ax.bar(x - 0.2, fig3.fed_dp_pso, 0.4, label="Fed-DP-PSO")
        ax.bar(x + 0.2, fig3.fedavg_dp, 0.4, label="FedAvg + DP-Adam")
        ax.set_xticks(x, [f"eps={e:g}" for e in fig3.epsilon])
        name = fig3.dataset.iloc[0]
        title = f"Fig. 3: {name}" + ("" if name == FIG3 else " (stand-in for PathMNIST)")
        ax.set(ylabel="test accuracy (%)", title=title)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "fig3_vs_fedavg_dp.png", dpi=120)
        plt.close(fig)


if __name__ == "__main__":
    main()
