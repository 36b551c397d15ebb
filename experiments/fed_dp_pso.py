"""Fed-DP-PSO experiment: Tables 1 and 2, accuracy per round (Fig. 2), vs FedAvg + DP (Fig. 3),
communication table. ``python -m experiments.fed_dp_pso [--quick | --full] [--datasets ...]``.

Every (dataset, partition) runs in two compiled calls: the finite epsilons x seeds, and
epsilon = inf x seeds. The profiles (``--quick``, default, ``--full``: the paper's R = 10,
E = 1, S = 5, N = 5, B = 256, MLP 784-256-256-10), the readings of the paper's open design
choices (``--reading`` and one flag per choice), Flower's partitions, Fig. 3's dataset and
what the epsilon covers are in ``docs/fed_dp_pso.md``; every table header states the plan
it ran. Results go to ``results/fed_dp_pso/`` (``cells.csv``, ``rounds.csv``,
``table_<dataset>.csv/.md``, ``fig3.csv``, ``comm.csv``: the bytes per round the simulator
counted, ``summary.json``, figures as PNG and PDF (``epsilon_rounds``: the accounted
epsilon per round), ``privacy_ledger.json/.md``: every run as a release,
see :func:`swarmjax.privacy.ledger.saved_releases`); finished calls are kept under
``calls/``, so the same command resumes (``--restart`` runs everything again).
``--audit N``: an empirical privacy audit of every DP run, ``N`` record-level gradient
canaries in every client, each run's lower bound printed beside its accounted epsilon and
written to the ledger and the cells (``epsilon_lower``; docs/audits.md); the Fig. 3
FedAvg + DP-Adam baseline is audited alike (``audit fedavg ...`` lines, ``fig3.csv``'s
``fedavg_epsilon_lower``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from experiments import _cli, _report
from experiments import _fed_dp_pso_parts as _parts
from experiments._fed_dp_pso_parts import (  # also re-exported (fed_dp_pso_study: PAPER)
    EPS_COLS,
    FIG3,
    PAPER,  # noqa: F401
    PARTITIONS,
    READING_FIELDS,
    paper_accuracy,
    record_delta,
)
from swarmjax.fl import (
    DatasetNotFoundError,
    flower_partition,
    load_dataset,
    stack_clients,
    subsample,
)
from swarmjax.fl.algorithms import registry
from swarmjax.fl.algorithms.fed_dp_pso import (
    DEFAULT_READING,
    READINGS,
    FedDPPSO,
    Reading,
    paper_model,
)
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data.transforms import SCALING_PRIVACY, scale_inputs
from swarmjax.fl.protocol import RunSpec, Variants, coverage
from swarmjax.fl.runtime import Execution, simulate
from swarmjax.models import paper_mlp
from swarmjax.privacy.canaries import CanaryAudit
from swarmjax.privacy.ledger import Ledger, Release, saved_releases

EVAL_BATCH = 2000  # particles are scored 2,000 rows at a time
NUM_CLIENTS = 5
_BUILT_IN = ("digits", "breast_cancer")  # shipped with scikit-learn: no data folder needed


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
    accountant: str = "pld"  # calibrates DP-Adam's noise and composes every record
    delta: float | None = None  # None: 0.1 / records of the clients (default_delta)
    audit: int | None = None  # record-level canaries per client (None: no audit)

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


def _parser() -> argparse.ArgumentParser:
    return _parts.parser(__doc__.split("\n\n")[0])


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
        lr=args.learning_rate,
        refine_start=args.refine_start,
        selection_metric=args.selection_metric,
        fig3=not args.no_fig3,
        reading_name=args.reading,
        reading=reading(args),
        accountant=args.accountant,
        delta=args.delta,
        audit=args.audit,
    )
    return replace(out, n_train=out.n_train or None, eval_subset=out.eval_subset or None)


def algorithm(
    prof: Profile, model, sizes: list, batch_size: int, epsilon: float | None = None
) -> tuple[FedDPPSO, dict]:
    """``(algorithm, grid values)`` of Fed-DP-PSO under ``prof`` from the registry, at
    target ``epsilon`` (``None``: the first of ``prof.epsilons``; ``inf``: plain Adam), its
    DP-Adam Poisson buffer serving every client set of ``sizes`` at every target of
    ``prof.epsilons`` (one program for all of them: the simulator's and the Flower task's
    algorithm)."""
    delta = record_delta(prof.delta, sizes[0])
    spec = RunSpec(prof.rounds, delta, accountant=prof.accountant)
    audit = None if prof.audit is None else CanaryAudit(prof.audit, score="gradient")
    base = registry.Base(
        model, LocalTraining(batch_size=batch_size), spec, len(sizes[0]), EVAL_BATCH,
        sizes=list(sizes), audit=audit,
    )  # fmt: skip
    chosen = registry.settings(
        "fed-dp-pso", reading=prof.reading, particles=prof.particles,
        target_epsilon=prof.epsilons[0] if epsilon is None else epsilon,
        buffer_epsilons=tuple(e for e in prof.epsilons if math.isfinite(e)),
        eval_subset=prof.eval_subset, refine_start=prof.refine_start,
        selection_metric=prof.selection_metric,
    )  # fmt: skip
    return registry.build("fed-dp-pso", base, chosen)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _dp_pso_call(
    name, part, group, built, clients, ds, prof: Profile, lr: float, path: str, *, secret=None
):
    """One compiled Fed-DP-PSO call (every epsilon of ``group`` x every seed; ``built``:
    ``epsilon -> (algorithm, grid values)``, :func:`algorithm` on the call's client sets):
    the per-round history and ``{"rows": one results-table row per epsilon, "releases": its
    runs as privacy-ledger releases written at path}``."""
    t0 = time.perf_counter()
    alg, grid = built(group[0])  # an infinite target: plain Adam
    delta = record_delta(prof.delta, clients.sizes)
    spec = RunSpec(prof.rounds, delta, tuple(range(prof.seeds)), accountant=prof.accountant)
    grid = {**grid, "epsilon_target": list(group), "learning_rate": lr}
    variants = Variants.grid(alg, clients, spec, **grid)
    test = (ds.x_test, ds.y_test)
    res = simulate(
        alg,
        clients,
        test,
        variants,
        secret=secret,
        execution=Execution(
            client_map=prof.client_map, rounds_per_call=1, progress=_cli.progress_bars()
        ),
    )
    took = time.perf_counter() - t0
    h = res.history.assign(dataset=name, partition=part, method="fed_dp_pso")
    rows, sizes = [], " ".join(map(str, np.asarray(clients.sizes).tolist()))
    for eps, g in h[h["round"] == prof.rounds].groupby("epsilon_target"):
        mean, std = _report.mean_std(g["test_accuracy"], 100)
        pm, ps = paper_accuracy(name, part, eps)
        eps_max, sigma_max = _parts.eps_of(res, eps)
        meets = bool(mean >= pm - ps) if pm == pm else None
        rows.append(dict(dataset=name, partition=part, epsilon=eps, acc_mean=mean, acc_std=std,
                         seeds=len(g), paper_mean=pm, paper_std=ps, meets_paper=meets,
                         epsilon_max=eps_max, epsilon_ok=bool(eps_max <= eps),
                         sigma_max=sigma_max, client_sizes=sizes, model=alg.model.name, lr=lr,
                         call_seconds=took))  # fmt: skip
        if res.audit:  # the largest lower bound over the seeds of this target
            at = np.flatnonzero(res.runs["epsilon_target"].to_numpy() == eps)
            rows[-1]["epsilon_lower"] = max(res.audit[int(i)].epsilon_lower for i in at)
    releases = saved_releases(res, algorithm="fed_dp_pso", path=path, data=ds.name)
    return h, {"rows": rows, "releases": releases}


def run_dataset(name, prof: Profile, data_dir, out, store, cells, rounds_rows, ledger: Ledger):
    """All partitions x epsilons x seeds of one dataset, every run added to ``ledger`` (reused
    calls too); returns (wall seconds, Dataset)."""
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
    smallest = int(min(s.min() for s in sizes))
    bs = min(prof.batch_size, smallest)
    if bs < prof.batch_size:  # said, not silent: the runs' batch differs from the setting
        print(
            f"{name}: batch size {bs}, not {prof.batch_size}: its smallest client holds "
            f"{smallest} rows (a batch is at most one client's rows)",
            flush=True,
        )
    sequential = prof.client_map == "sequential"
    pad_to = int(max(s.max() for s in sizes)) if sequential else None
    kept = None
    for part, p in parts.items():
        clients = stack_clients(ds.x_train, ds.y_train, p.indices, pad_to=pad_to)
        served = sizes if sequential else [p.sizes]  # sequential: one program for every part
        built = partial(algorithm, prof, model, served, bs)
        for group in groups:
            key = f"{name}_{part}_eps" + "-".join(f"{e:g}" for e in group)
            path = str(out / "rounds.csv")
            run = partial(_dp_pso_call, name, part, group, built, clients, ds, prof, lr, path)
            h, payload, reused = store.fetch_or_run(key, run, with_secret=True)
            rows = payload["rows"]
            ledger.add_saved(payload["releases"])
            rounds_rows.append(h)
            cells.extend(rows)
            pd.DataFrame(cells).to_csv(out / "cells.csv", index=False)
            pd.concat(rounds_rows).to_csv(out / "rounds.csv", index=False)
            how = "resumed from disk" if reused else f"{rows[0]['call_seconds']:.0f} s"
            print(f"{name} {part} eps={group}: {how} (load {_load()})", flush=True)
            print_audits(name, part, payload["releases"])
        if kept is None or part == "iid":
            kept = _parts.Dataset(ds, clients, model, bs, lr, part == "iid")
    return time.perf_counter() - start, kept


def print_audits(name: str, part: str, releases: list[dict]) -> None:
    """One line per audited Fed-DP-PSO run of a call (:func:`_parts.print_audits`)."""
    _parts.print_audits(f"{name} {part}", releases)


def _partition(ds, part: str, seed: int = 42):
    """The paper's partitioners: Flower's FederatedDataset pipeline with its default seed."""
    scheme, kw = ("iid", {}) if part == "iid" else ("dirichlet", {"alpha": float(part[3:])})
    return flower_partition(ds.y_train, NUM_CLIENTS, scheme, seed=seed, **kw)


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


def _coverage() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(covered, not covered)`` of Fed-DP-PSO with DP-Adam, from its message declarations
    (the registry's defaults on a nominal client: the declarations depend on neither)."""
    one = np.array([640])
    nominal = registry.Base(paper_mlp(), LocalTraining(), RunSpec(1, 1e-5), 1, sizes=one)
    return coverage(registry.build("fed-dp-pso", nominal)[0].exchanges)


def _covers() -> str:
    """What the paper-mode epsilon covers (:func:`_coverage`), as one line."""
    covered, uncovered = _coverage()
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


FLOWER_UNUSED = (
    "partitions", "seeds", "n_train", "client_map", "no_fig3", "data_dir", "restart", "audit",
)  # fmt: skip
FLOWER_WHY = (
    "--runtime flower runs the digits task's 3 clients once, seed 0, beside its simulator twin "
    "(partitions, seeds, subsets, client layout, the Fig. 3 baseline and saved calls are the "
    "simulator path's)"
)


def check(args: argparse.Namespace, prof: Profile) -> None:
    """The simulator path's settings, checked before any work: DP options only where some
    target epsilon is finite, and the memory of the particles (:func:`memory_estimate`)."""
    if not any(math.isfinite(e) for e in prof.epsilons):
        if prof.audit is not None:
            raise _cli.UserError(
                "--audit needs a private run: every --epsilons is inf (no DP, no epsilon to "
                "audit); give a finite target"
            )
        why = "every target epsilon is inf (no DP): they only label the ledger's records"
        _cli.warn_unused(args, ["delta", "accountant"], why)
    if prof.audit is not None:  # Fig. 3's own dataset too, when --full adds it
        extra = (FIG3,) if prof.fig3 and args.full and FIG3 not in prof.datasets else ()
        for name in (*prof.datasets, *extra):
            params = _model_parameters(name)
            if prof.audit > params:
                raise _cli.UserError(
                    f"--audit {prof.audit} exceeds {name}'s model's {params} parameters (one "
                    "coordinate per canary): lower --audit"
                )
    option = _cli.option_named(args, ["particles", "seeds", "epsilons"])
    what = (
        f"{NUM_CLIENTS} clients x {prof.particles} particles x {prof.seeds} seed(s) x "
        f"{len(prof.epsilons)} epsilon(s), each with its model-sized arrays"
    )
    _cli.check_memory(memory_estimate(prof), option, what)


def _model_parameters(name: str) -> int:
    """Parameters of ``name``'s paper model (shapes only, no work)."""
    import jax

    from swarmjax.models import param_count

    shape = {"pathmnist": (28, 28, 3), "digits": (8, 8, 1)}.get(name, (28, 28, 1))
    model, _ = paper_model(name, 9 if name == "pathmnist" else 10, shape)
    return param_count(jax.eval_shape(model.init, jax.random.key(0)))


def memory_estimate(prof: Profile) -> int:
    """Bytes the largest call of ``prof`` allocates, estimated before any work: per run
    (seed x epsilon) and particle of every client (all at once under ``vmap``, one client at
    a time under ``sequential``), eight model-sized arrays (position, velocity, best, the
    DP-Adam moments and update; DP-SGD's fast path never holds a batch of per-example
    gradients); plus the data."""
    import jax

    from swarmjax.models import param_count

    shapes = {"pathmnist": (28, 28, 3), "digits": (8, 8, 1)}
    worst = 0
    for name in prof.datasets:
        shape = shapes.get(name, (28, 28, 1))
        model, _ = paper_model(name, 10, shape)
        params = param_count(jax.eval_shape(model.init, jax.random.key(0)))
        clients = NUM_CLIENTS if prof.client_map == "vmap" else 1
        slots = prof.seeds * len(prof.epsilons) * clients * prof.particles
        rows = prof.n_train or 90_000
        worst = max(worst, _cli.array_bytes((slots, 8, params), (2, rows, *shape)))
    return worst


def flower_config(args: argparse.Namespace) -> dict:
    """``--runtime flower``: the run config of Fed-DP-PSO on the digits task at the smallest
    target epsilon (which must be finite), checked before any process starts. It carries the
    algorithm's settings, the reading (``reading``) and each field the flags changed
    (``reading-<field>``), so the deployment runs the algorithm the simulator path builds
    for the same flags (on the task's own 3 clients of 600 rows)."""
    if args.datasets not in (None, ["digits"]):
        raise _cli.UserError("--runtime flower runs the digits task: drop --datasets")
    if args.accountant != "pld":
        raise _cli.UserError("--runtime flower accounts with PLD only: drop --accountant")
    _cli.refuse_unused(args, FLOWER_UNUSED, FLOWER_WHY)
    prof = profile(args)
    eps = prof.epsilons[0]
    if not math.isfinite(eps):
        raise _cli.UserError("--runtime flower runs Fed-DP-PSO with DP: give a finite --epsilons")
    if len(prof.epsilons) > 1 and "epsilons" in _cli.given(args):
        raise _cli.UserError(
            f"--epsilons: --runtime flower runs one target epsilon; got {len(prof.epsilons)}"
        )
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
        **({} if prof.delta is None else {"delta": prof.delta}),
        **changed,
    }


PUBLIC_FILES = {
    "cells.csv": "one row per (dataset, partition, epsilon): test accuracy of rounds.csv's runs "
    "(listed as not private), the paper's numbers, the accounting (public settings), the "
    "clients' sizes (public under the zero-out relation, which keeps every |D_i|: "
    "docs/privacy.md) and the call's wall seconds (static shapes, full Poisson buffers)",
    "table_*.csv": "cells.csv of one dataset with the cells as text",
    "table_*.md": "cells.csv of one dataset as markdown, with the plan it ran",
    "comm.csv": "bytes per round of each method: message shapes (public settings)",
    "summary.json": "the settings, cells.csv, fig3.csv, comm.csv, wall seconds, load averages "
    "and peak memory",
    "fig2_accuracy_per_round_*.png": "figure of rounds.csv",
    "fig3_vs_fedavg_dp.png": "figure of rounds.csv and fig3.csv's runs",
    "epsilon_rounds.png": "figure of the accounted epsilon per round of rounds.csv's and "
    "fig3.csv's runs (public settings)",
}
"""Files under ``--out`` besides the ledger's release paths and not-released folders: each
holds public settings, or is computed only from the releases and public data (so it is as
private as the releases it repeats); tests/test_released_files.py checks every file."""

FLOWER_OPERATOR = (
    "operator-only outputs of the Flower deployment (realised cohorts, per-round wall "
    "seconds): statistics of the run that no epsilon covers"
)


FLOWER_JAX_CACHE = (
    "the SuperNodes' JAX compilation cache: compiled programs, which may hold constants "
    "(client data a jitted function closed over)"
)


def _flower_ledger(ledger: Ledger, config: dict, summary: dict, out: Path) -> None:
    """The Flower path's two runs (the deployment and its simulator twin) in ``ledger``.

    Both run Fed-DP-PSO as the simulator path builds it, whose model uploads are chosen by
    exact scores (``_covers``): like :func:`~swarmjax.privacy.ledger.saved_releases` for a
    record that is not end to end, they are listed as not private, with the epsilon of the
    covered DP-Adam steps and what is not covered as labels.
    """
    from swarmjax.fl.runtime.flower.server import RELEASED  # the flower extra

    covered, uncovered = _coverage()
    if not uncovered:
        raise RuntimeError("Fed-DP-PSO is end to end here: list its Flower runs with events")
    labels = {
        "target_epsilon": config["target-epsilon"],
        "reading": config["reading"],
        "epsilon_of_covered_steps": float(np.max(summary["epsilon"])),
        "covers": "; ".join(covered),
        "not_covered": "; ".join(uncovered),
    }
    record = json.loads((out / "flower" / RELEASED / "privacy.json").read_text())
    for runtime, path in (("flower", out / "flower"), ("simulator", out / "flower_summary.json")):
        ledger.add(
            Release(
                algorithm=f"fed_dp_pso ({runtime})",
                variant={"runtime": runtime, **labels},
                seed=None,
                unit=None,
                relation=None,
                delta=float(record["delta"]),
                epsilon=math.inf,
                accountant="pld",
                path=str(path),
            )
        )
    ledger.mark_not_released(out / "flower" / "operator", FLOWER_OPERATOR)
    ledger.mark_not_released(out / "jax", FLOWER_JAX_CACHE)


@_cli.entry_point
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    _cli.process_options(args)  # before anything compiles
    if args.runtime == "flower":  # needs the flower extra
        config = flower_config(args)  # checked before the extra is imported
        from experiments._flower import run_over_flower

        out = _cli.out_dir(args)
        ledger = Ledger(out, "fed_dp_pso")
        _flower_ledger(ledger, config, run_over_flower(config, out), out)
        _report.write_ledger(ledger)
        _report.finish(out, out / "flower_summary.json")
        return
    prof = profile(args)
    check(args, prof)
    out = _cli.out_dir(args)
    if any(d not in _BUILT_IN for d in prof.datasets) or args.full or args.data_dir is not None:
        args.data_dir = _cli.data_dir(args.data_dir)
    source = _cli.data_source(args)
    for name in prof.datasets:  # every dataset staged and readable before any work
        if name not in _BUILT_IN:
            _cli.load_dataset(name, args.data_dir, source)
    # every run is a release of the clients' data (docs/ledger.md); checked writable now
    ledger = Ledger(out, "fed_dp_pso", delta=prof.delta, accountant=prof.accountant)
    print(f"Privacy: {_covers()}.\n{_header(prof)}\nload at start: {_load()}", flush=True)
    store = _cli.call_store(
        out,
        prof.call_settings(),
        __name__,
        args,
        parts=[_parts],
        ledger=ledger,
    )
    stores, cells, rounds_rows, walls, kept = [store], [], [], {}, {}
    load_start = _load()
    for name in prof.datasets:
        walls[name], kept[name] = run_dataset(
            name, prof, args.data_dir, out, store, cells, rounds_rows, ledger
        )
        print(f"{name}: whole table {walls[name]:.0f} s (load {_load()})", flush=True)
    t0 = time.perf_counter()
    if prof.fig3 and FIG3 not in kept and args.full:
        iid = replace(prof, partitions=("iid",))  # own settings: partitions fix the padding
        iid_store = _cli.call_store(
            out,
            iid.call_settings(),
            __name__,
            args,
            parts=[_parts],
            ledger=ledger,
        )
        try:  # the paper's Fig. 3 dataset, IID only, when its files are found
            _, kept[FIG3] = run_dataset(
                FIG3, iid, args.data_dir, out, iid_store, cells, rounds_rows, ledger
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
        d = kept[fig3_name]
        fig3, fedavg[fig3_name], fig3_rounds = _parts.fig3(
            fig3_name, d, prof, cells, rounds, stores[-1], out, ledger
        )
    walls["fig3"] = time.perf_counter() - t0
    comm = _parts.comm_table(kept, rounds, fedavg, store, out, ledger, prof)
    seeds = f"{prof.seeds} seed{'s' if prof.seeds > 1 else ''}"
    setting = f"{NUM_CLIENTS} clients, {prof.particles} particles, {prof.rounds} rounds, {seeds}"
    _parts.figures(rounds, fig3_rounds, out, setting)
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
    nulls = {
        "acc_std": "one seed: no std",
        "paper_mean": "the paper has no number for this cell",
        "paper_std": "the paper has no number for this cell",
        "epsilon": "no DP (the inf target)",
        "epsilon_max": "no DP (the inf target)",
        "sigma_max": "no noise (the inf target)",
        "epsilon_lower": "not audited (no --audit, or the inf target: no epsilon to audit)",
    }
    _report.write_json(out / "summary.json", summary, nulls)
    print(f"wall seconds: {json.dumps({k: round(v) for k, v in walls.items()})}")
    if summary["resumed_calls"]:
        print(
            f"{len(summary['resumed_calls'])} call(s) reused from {out / 'calls'} "
            "(--restart runs them again)"
        )
    _report.write_ledger(ledger)
    _report.finish(out, out / "summary.json")


if __name__ == "__main__":
    main()
