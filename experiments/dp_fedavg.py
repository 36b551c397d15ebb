"""Client-level DP-FedAvg: fixed vs adaptive clipping at equal epsilon (seed 002; docs/algorithms.md
section 4).

    python -m experiments.dp_fedavg            # default slice: MNIST + Fashion-MNIST, IID +
                                               # Dirichlet(0.5), 1000 clients, T = 50,
                                               # epsilon 2 and 8, seeds 0-2 vmapped
    python -m experiments.dp_fedavg --quick    # CI smoke run (< 1 minute)
    python -m experiments.dp_fedavg --full     # more rounds, epsilons and seeds

For every dataset x partition x epsilon, the noise multiplier z is the smallest one whose
client-level epsilon after T rounds (Poisson client sampling at rate q_c, the PLD accountant
or ``--accountant rdp``, delta = min(1e-5, 0.1 / N), the user-level plan's default; the
paper's N^-1.1 with ``--delta``) is <= the target; fixed clipping (several C) and adaptive
clipping (target quantile 0.5, start C_0 = 0.1) run with the SAME z, hence the same epsilon
(the adaptive run folds its clipped-count query into z and pays with a larger noise on the
sum). A non-private FedAvg-style run (z = 0, no clipping) is the ceiling.

Why N = 1000 clients: the noise on the averaged update has std sigma C / (q_c N) per
coordinate while the signal is at most C, so at fixed epsilon the signal-to-noise ratio grows
linearly with the expected clients per round m = q_c N. MNIST's 60000 training images as
1000 clients of ~60 give m = 100 at q_c = 0.1; with 100 clients (m = 10) the noise is 10x
larger and the model does not learn at any epsilon below ~50.

Measures: final test accuracy, cumulative epsilon, communication volume (sum_t m_t d 32 bits
and exact bytes), rounds to a target accuracy, the loss-threshold membership-inference
advantage of the final global model (training members vs held-out test examples), and the
clip norm over rounds. Writes CSV/JSON/PNG under ``results/dp_fedavg/`` as it goes and
prints a summary table; finished runs are kept under ``calls/``, so rerunning the same
command resumes (``--restart`` runs everything again).  Options follow the shared contract
of ``experiments/_cli.py`` (``--seeds N`` runs seeds 0..N-1).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from tqdm import tqdm

from experiments import _cli, _report
from swarmjax.fl.algorithms import registry
from swarmjax.fl.algorithms.client_level_dp_fedavg import rounds_to_target
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data import subsample
from swarmjax.fl.data.clients import stack_clients
from swarmjax.fl.data.partition import dirichlet_partition, iid_partition
from swarmjax.fl.private import Private
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import simulate
from swarmjax.models import Model, cross_entropy, mlp, param_count
from swarmjax.privacy.audit import membership_inference_advantage
from swarmjax.privacy.canaries import DEFAULT_CANARIES, CanaryAudit, CanaryReport
from swarmjax.privacy.ledger import Ledger, saved_releases
from swarmjax.privacy.secret import Secret
from swarmjax.privacy.user_level import UserLevelDP


@dataclasses.dataclass(frozen=True)
class Profile:
    datasets: tuple[str, ...]
    partitions: tuple[str, ...]
    num_clients: int
    n_train: int | None  # subsample of the training set (None: all 60000)
    n_test: int | None
    sample_rate: float
    rounds: int
    epsilons: tuple[float, ...]
    fixed_clips: tuple[float, ...]
    seeds: tuple[int, ...]
    target_accuracy: float
    mia_examples: int


_DEFAULT = Profile(
    datasets=("mnist", "fashion_mnist"),
    partitions=("iid", "dirichlet"),
    num_clients=1000,
    n_train=None,
    n_test=None,
    sample_rate=0.1,
    rounds=50,
    epsilons=(2.0, 8.0),
    fixed_clips=(0.1, 1.0),
    seeds=(0, 1, 2),
    target_accuracy=0.8,
    mia_examples=5000,
)
PROFILES = {
    "quick": Profile(
        ("mnist",), ("iid",), 100, 6000, 2000, 0.2, 15, (8.0,), (1.0,), (0,), 0.5, 1000
    ),
    "default": _DEFAULT,
    "full": dataclasses.replace(
        _DEFAULT,
        rounds=300,
        epsilons=(0.5, 1.0, 2.0, 4.0, 8.0),
        fixed_clips=(0.03, 0.1, 0.3, 1.0, 10.0),
        mia_examples=10000,
    ),
}

MODEL_HIDDEN = (32,)  # 784-32-10, d = 25,450: small d keeps the noise norm sigma C sqrt(d) low
LOCAL = LocalTraining(epochs=1, batch_size=10, optimizer="sgd")
LEARNING_RATE, SERVER_LR, SERVER_MOMENTUM = 0.05, 1.0, 0.9
DIRICHLET_ALPHA = 0.5
INITIAL_CLIP, TARGET_QUANTILE, CLIP_LR = 0.1, 0.5, 0.2


def algorithm(
    model: Model, spec: RunSpec, num_clients: int, profile: Profile, method: dict
) -> tuple[Private, dict]:
    """``(algorithm, grid values)`` of one method (its ``clipping``, ``initial_clip``,
    ``noise_multiplier``, ...): DP-FedAvg from the registry on the experiment's local
    training and server momentum, its Poisson buffer sized for the run at the largest
    target (one compiled program serves every target)."""
    chosen = registry.settings(
        "dp-fedavg",
        client_rate=profile.sample_rate,
        clipping=method["clipping"],
        clip=method.get("initial_clip", INITIAL_CLIP),
        learning_rate=LEARNING_RATE,
        server_lr=SERVER_LR,
        noise_multiplier=float(method["noise_multiplier"]),
        server_momentum=SERVER_MOMENTUM,
        buffer_epsilon=max(profile.epsilons),
    )
    base = registry.Base(model, LOCAL, spec, num_clients, eval_batch_size=2500)
    alg, grid = registry.build("dp-fedavg", base, chosen)
    rest = {k: v for k, v in method.items() if k not in ("clipping", "noise_multiplier")}
    return alg, {**grid, **rest}


def make_clients(data, scheme: str, num_clients: int):
    if scheme == "iid":
        part = iid_partition(data.y_train, num_clients, seed=0)
    else:
        part = dirichlet_partition(
            data.y_train, num_clients, DIRICHLET_ALPHA, seed=0, self_balancing=True
        )
    return stack_clients(data.x_train, data.y_train, part.indices)


PRIVATE = "private"
"""Sub-folder of ``--out`` for outputs computed on training records without noise."""
MIA_NOT_RELEASED = (
    "membership-inference advantage of each run: a loss-threshold attack scored on training "
    "records, an unnoised statistic of private data that no epsilon covers; for the "
    "experimenter only, never published"
)


PUBLIC_FILES = {
    "config.json": "the settings, the calibrated noise multipliers and the buffer capacity "
    "(functions of the public settings)",
    "summary.csv": "per run: test metrics of the released models on the public test split, the "
    "accounting, expected bytes, the canary audit's lower bounds (scores of the released "
    "models on synthetic canaries) and wall seconds (vmapped runs of static shapes compute "
    "every cohort slot, so the time does not follow the secret cohorts)",
    "summary.json": "summary.csv as strict JSON, and the peak memory (static shapes)",
    "summary_table.csv": "summary.csv, the accuracy as text",
    "summary_table.md": "summary.csv, the accuracy as text",
    "accuracy_vs_epsilon.png": "figure of history.csv's final test accuracy (public test "
    "split) against summary.csv's accounted epsilon",
    "clip_norm.png": "figure of history.csv's clip norms (released: noised counts set them)",
    "epsilon_rounds.png": "figure of history.csv's accounted epsilon per round (public settings)",
}
"""Files under ``--out`` besides the ledger's release paths and not-released folders: each
holds public settings, or is computed only from the releases and public data (so it is as
private as the releases it repeats); tests/test_released_files.py checks every file."""


def mia_advantage(model, params, data, n: int, seed: int) -> float:
    """Loss-threshold attack on the final global model: n training vs n test examples.

    It reads training records, so its value is a statistic of private data that no epsilon
    covers: the experiment keeps it in ``<out>/private/`` (listed as not released)."""
    rng = np.random.default_rng(seed)
    n = min(n, data.y_train.size, data.y_test.size)
    mem = rng.choice(data.y_train.size, n, replace=False)
    non = rng.choice(data.y_test.size, n, replace=False)

    @jax.jit
    def losses(x, y):
        return cross_entropy(model.apply(params, x), y)

    member = losses(jnp.asarray(data.x_train[mem]), jnp.asarray(data.y_train[mem]))
    nonmember = losses(jnp.asarray(data.x_test[non]), jnp.asarray(data.y_test[non]))
    return membership_inference_advantage(np.asarray(member), np.asarray(nonmember))[0]


def methods(profile: Profile, z: float) -> list[tuple[str, dict]]:
    """(name, settings) of the compared methods at multiplier z: ``clipping`` (static) and
    the hyper values of :meth:`~swarmjax.fl.protocol.Variants.grid`."""
    out = [
        (
            "adaptive",
            dict(
                clipping="adaptive",
                initial_clip=INITIAL_CLIP,
                target_quantile=TARGET_QUANTILE,
                clip_lr=CLIP_LR,
                noise_multiplier=z,
            ),
        )
    ]
    out += [
        (f"fixed C={c:g}", dict(clipping="fixed", initial_clip=c, noise_multiplier=z))
        for c in profile.fixed_clips
    ]
    return out


def run_one(
    clients,
    test,
    data,
    profile,
    method: str,
    kwargs: dict,
    eps_target: float,
    spec: RunSpec,
    release_path: str = "history.csv",
    audit: CanaryAudit | None = None,
    *,
    secret: Secret | None = None,
):
    """One method at one epsilon, all seeds in one call (DP-FedAvg with the Poisson
    buffer sized for the run: :func:`algorithm`): (per-round history, ``{"row":
    summary row, "releases": its runs as privacy-ledger releases written at
    release_path, "private": statistics of training records that no epsilon covers (the
    membership-inference advantage), kept out of the released files}``). ``secret``: the
    call's secret (:meth:`~swarmjax.resume.CallStore.secret`).  ``audit``: client-level
    canaries in every private run of the call
    (docs/audits.md): each run's :class:`~swarmjax.privacy.canaries.CanaryReport` goes to
    its release's ``audit`` and the row's ``epsilon_lower`` is the largest over seeds; the
    non-private run (noise 0, no epsilon) is never audited."""
    t0 = time.perf_counter()
    model = mlp(MODEL_HIDDEN, 10, (28, 28, 1))
    alg, grid = algorithm(model, spec, profile.num_clients, profile, kwargs)
    variants = Variants.grid(alg, clients, spec, **grid)  # noise_multiplier: the one label
    private = float(kwargs["noise_multiplier"]) > 0
    res = simulate(alg, clients, test, variants, audit=audit if private else None, secret=secret)
    seconds = time.perf_counter() - t0
    releases = saved_releases(res, algorithm=method, path=release_path, data=data.name)
    h = res.history
    last = h[h["round"] == profile.rounds]
    reach = rounds_to_target(h, profile.target_accuracy)
    mias = [
        mia_advantage(
            model,
            jax.tree.map(lambda a, i=i: a[i], res.server.params),
            data,
            profile.mia_examples,
            seed,
        )
        for i, seed in enumerate(res.runs["seed"])
    ]
    plan = variants.hyper.plan  # the resolved numbers of the plan
    z, count_noise = float(plan.noise_multiplier[0]), float(plan.count_noise[0])
    row = {
        "method": method,
        "epsilon_target": eps_target,
        "epsilon": float(last["epsilon_max"].iloc[0]),
        "delta": res.privacy.delta,
        "noise_multiplier": z,
        "sum_noise": float(alg.plan.sum_noise(plan)[0]),  # the plan's noise on the sum
        "count_noise": count_noise,
        "accuracy": float(last["test_accuracy"].mean()),
        "accuracy_std": float(last["test_accuracy"].std(ddof=0)),
        "test_loss": float(last["test_loss"].mean()),
        "final_clip": float(last["clip_norm"].mean()),
        "rounds_to_target": float(reach.mean()) if reach.notna().all() else math.nan,
        "seeds_reaching_target": int(reach.notna().sum()),
        "bits_volume": float(last["cum_bytes_up"].mean()) * 8,
        "mb_up": float(last["cum_bytes_up"].mean()) / 1e6,
        "seconds": seconds,
    }
    if audit is not None:
        row["epsilon_lower"] = max((r.epsilon_lower for r in res.audit), default=math.nan)
    hidden = {
        "method": method,
        "epsilon_target": eps_target,
        "mia_advantage": float(np.mean(mias)),
        "mia_advantage_std": float(np.std(mias)),
    }
    payload = {"row": row, "releases": releases, "private": hidden}
    return h.assign(method=method, epsilon_target=eps_target), payload


def plot(
    summary: pd.DataFrame, history: pd.DataFrame, out: Path, caption: str | None = None
) -> None:
    """Column-sized figures (experiments._report): final test accuracy against the accounted
    epsilon per method (mean +- std over seeds; labelled bars where one epsilon ran), the
    non-private ceiling as a dashed line; the clip norm per round at the largest finite
    epsilon; the accounted epsilon per round of every private run; one panel per setting,
    ``caption`` (the shared settings) as the line above the panels."""
    settings = summary[["dataset", "partition"]].drop_duplicates().values.tolist()
    last = history[history["round"] == history["round"].max()]
    accounted = summary[["dataset", "partition", "method", "epsilon_target", "epsilon"]]
    last = last.merge(accounted, on=["dataset", "partition", "method", "epsilon_target"])
    fig, axes = _report.panels(len(settings))
    colors = _report.line_colors(last.loc[last.method != "non-private", "method"])
    for ax, (ds, part) in zip(axes, settings, strict=True):
        sub = last[(last.dataset == ds) & (last.partition == part)]
        private = sub[sub.method != "non-private"].sort_values("epsilon")
        bars = _report.curves(ax, private, "test_accuracy", line="method", x="epsilon",
                              colors=colors, xlabel="client-level epsilon", marker="o")  # fmt: skip
        if not bars:
            _report.log_x(ax, private.epsilon)
        top = sub[sub.method == "non-private"]
        if len(top):
            ax.axhline(top.test_accuracy.mean(), color="k", ls="--", lw=1, label="non-private")
        ax.set(ylabel="test accuracy", title=f"{ds} {part}")
        ax.legend()
    _report.save(fig, out / "accuracy_vs_epsilon.png", caption=caption)
    finite = history[np.isfinite(history.epsilon_target)]  # the non-private run has C = 1e6
    eps_show = finite.epsilon_target.max()
    shown = finite[finite.epsilon_target == eps_show]
    _report.per_round(
        shown.assign(setting=shown.dataset + " " + shown.partition),
        "clip_norm",
        out / "clip_norm.png",
        panel="setting",
        line="method",
        ylabel="clip norm C_t",
        panel_title=str,
        axes_set={"yscale": "log"},
        caption=f"target epsilon {eps_show:g}" + (f"; {caption}" if caption else ""),
    )
    _report.plot_epsilon_rounds(
        history.assign(setting=history.dataset + " " + history.partition),
        out / "epsilon_rounds.png",
        by=["method", "epsilon_target"],
        label=lambda m, e: f"{m}, target {e}",
        panel="setting",
        ylabel="client-level epsilon (accounted)",
        caption=caption,
    )


def caption(profile: Profile, delta: float, accountant: str) -> str:
    """The settings every panel shares, as the figures' caption line."""
    seeds = len(profile.seeds)
    return (
        f"{profile.num_clients} clients, q={profile.sample_rate:g}, {profile.rounds} rounds, "
        f"delta {_report.delta_text(delta)} ({accountant.upper()}), "
        + (f"{seeds} seeds (mean +- std)" if seeds > 1 else "1 seed")
    )


NULLS = {  # why a summary number is null (strict JSON)
    "epsilon_target": "the non-private run has no target (infinite epsilon)",
    "epsilon": "the non-private run has no DP (infinite epsilon)",
    "rounds_to_target": "a seed never reached target_accuracy",
    "accuracy_std": "one seed: no std",
    "epsilon_lower": "the non-private run is not audited (no epsilon to audit)",
}
TRAIN_ROWS = 60_000  # MNIST and Fashion-MNIST


SLOT_ARRAYS = 5
"""Model-sized float32 arrays one slot of a seed's Poisson buffer holds at the peak (its
model, gradient, update and clipping temporaries). Measured (2026-11-29, AMD EPYC, the
quick profile at 2 rounds, buffer 79): peak resident memory 1.58 GB at 10 seeds and 3.55 GB
at 60, 39.4 MB a seed, 4.9 arrays of the 25,450-parameter model a slot. With 4, ``--quick
--seeds 500`` passed the check and ran out of a 24 GiB machine's memory."""


def check(args: argparse.Namespace, profile: Profile, spec: RunSpec) -> Private:
    """The derived settings of ``profile`` and its memory, checked before any work: every
    client needs a row, the expected cohort ``q N`` at least one client, and the run's arrays
    (the stacked clients, per seed :data:`SLOT_ARRAYS` model-sized arrays a slot of the
    Poisson buffer) must fit.
    Returns the adaptive method's algorithm (:func:`algorithm`): its plan's Poisson
    participation has the buffer sized for the run at the largest target (one compiled
    program serves every target), and it calibrates the noise of every target."""
    clients = _cli.setting(args, "clients", profile.num_clients, "number of clients")
    rows = profile.n_train or TRAIN_ROWS
    if profile.num_clients > rows:
        raise _cli.UserError(
            f"{clients} exceeds the {rows} training rows (each client needs one): lower --clients"
        )
    if profile.sample_rate * profile.num_clients < 1:
        least = math.ceil(1 / profile.sample_rate)
        raise _cli.UserError(
            f"{clients} at the sample rate {profile.sample_rate:g} gives an expected cohort of "
            f"{profile.sample_rate * profile.num_clients:.3g} clients per round (DP-FedAvg's "
            f"noise is scaled to it): give --clients {least} or more"
        )
    params = 784 * MODEL_HIDDEN[0] + MODEL_HIDDEN[0] + MODEL_HIDDEN[0] * 10 + 10
    model = mlp(MODEL_HIDDEN, 10, (28, 28, 1))
    adaptive = {"clipping": "adaptive", "noise_multiplier": 1.0}
    reference, _ = algorithm(model, spec, profile.num_clients, profile, adaptive)
    participation = reference.plan.participation
    buffer = participation.max_selected or profile.num_clients
    need = _cli.array_bytes((2, rows, 784), (len(profile.seeds), buffer, SLOT_ARRAYS, params))
    option = _cli.option_named(args, ["clients", "seeds"])
    what = f"{profile.num_clients} clients, {len(profile.seeds)} seed(s), cohort buffer {buffer}"
    _cli.check_memory(need, option, what)
    if args.audit is not None and args.audit > params:
        raise _cli.UserError(
            f"--audit {args.audit} exceeds the model's {params} parameters (no more canary "
            "directions can be independent): lower --audit"
        )
    if args.audit is not None:  # the directions, and every canary's reply in each round
        need = _cli.array_bytes((len(profile.seeds) + 1, args.audit, params))
        _cli.check_memory(need, "--audit", f"{args.audit} canaries of {params} parameters")
    return reference


def print_audits(audits: list[tuple[str, str, str, dict | None]]) -> None:
    """One line per audited run (``(dataset, partition, method, release audit)``; ``None``
    for an unaudited one): its accounted epsilon and the canaries' empirical lower bound
    (:meth:`~swarmjax.privacy.canaries.CanaryReport.line`)."""
    shown = [(ds, part, name, a) for ds, part, name, a in audits if a is not None]
    if shown:
        print("empirical privacy audits (lower bounds, not guarantees; docs/audits.md):")
    for ds, part, name, audit in shown:
        report = CanaryReport.from_dict(audit)
        print(f"  {ds} {part} {name}: accounted epsilon {report.epsilon:.3f}; {report.line()}")


def _call_settings(meta: dict) -> dict:
    """What a saved run depends on besides its key (dataset, partition, method, epsilon)."""
    grid = ("datasets", "partitions", "epsilons")
    profile = {k: v for k, v in meta["profile"].items() if k not in grid}
    rest = {k: v for k, v in meta.items() if k not in ("profile", "noise_multipliers")}
    return {"profile": profile, **rest}


def parse_args(argv: list[str] | None = None):
    parser = _cli.parser(
        "dp_fedavg",
        __doc__.split("\n\n")[0],
        quick="CI smoke run: MNIST subset, 100 clients, 15 rounds (< 1 minute)",
        full="300 rounds, epsilons 0.5-8, fixed C 0.03-10, 3 seeds (hours)",
        data="mnist/ and fashion_mnist/ (IDX files)",
        seeds="quick 1, else 3",
        privacy="clients",
    )
    parser.add_argument("--rounds", type=_cli.count("--rounds"), help="override the rounds T")
    parser.add_argument(
        "--clients", type=_cli.count("--clients"), help="override the number of clients N"
    )
    parser.add_argument(
        "--datasets", nargs="+", choices=("mnist", "fashion_mnist"), help="restrict the datasets"
    )
    parser.add_argument(
        "--partitions",
        nargs="+",
        choices=("iid", "dirichlet"),
        help="restrict the client partitions (Dirichlet alpha 0.5)",
    )
    parser.add_argument(
        "--epsilons",
        nargs="+",
        type=_cli.epsilon_target("--epsilons"),
        help="target client-level epsilons (z found per target)",
    )
    parser.add_argument(
        "--audit",
        type=_cli.count("--audit", 2),
        nargs="?",
        const=DEFAULT_CANARIES,
        metavar="N",
        help="empirical privacy audit: N client-level canaries in every private run "
        f"(--audit alone: {DEFAULT_CANARIES}, sized to see a 4x noise error; docs/audits.md); "
        "each run's lower bound, power and verdict are printed beside its accounted epsilon "
        "and written to the privacy ledger",
    )
    return parser.parse_args(argv)


@_cli.entry_point
def main(argv: list[str] | None = None) -> pd.DataFrame:
    args = parse_args(argv)
    _cli.process_options(args)  # before anything compiles
    profile = PROFILES[_cli.profile_name(args)]
    if args.rounds:
        profile = dataclasses.replace(profile, rounds=args.rounds)
    if args.clients:
        profile = dataclasses.replace(profile, num_clients=args.clients)
    for field in ("datasets", "partitions", "epsilons"):
        if getattr(args, field):
            profile = dataclasses.replace(profile, **{field: tuple(getattr(args, field))})
    profile = dataclasses.replace(profile, seeds=tuple(_cli.seeds(args, len(profile.seeds))))
    # --delta, else the user-level plan's default for the clients
    delta = UserLevelDP.delta_for(profile.num_clients, args.delta)
    spec = RunSpec(profile.rounds, delta, profile.seeds, accountant=args.accountant)
    reference = check(args, profile, spec)
    out = _cli.out_dir(args)  # results and the privacy ledger: checked before any work
    data_dir = _cli.data_dir(args.data_dir)
    ledger = Ledger(out, "dp_fedavg", accountant=args.accountant)
    source = _cli.data_source(args)
    # every dataset before any work: a missing or incomplete one fails now
    loaded = {ds: _cli.load_dataset(ds, data_dir, source) for ds in profile.datasets}
    model = mlp(MODEL_HIDDEN, 10, (28, 28, 1))
    # the algorithm's privacy plan sized the Poisson buffer (check) and calibrates z for
    # every target, the same z for both clippings: nothing here does DP arithmetic itself
    user_level = reference.plan
    privacy_plan = user_level.privacy_plan(profile.num_clients, profile.sample_rate, spec)
    zs = {e: privacy_plan.calibrate(e).noise_multiplier for e in profile.epsilons}
    n_runs = (
        len(profile.datasets)
        * len(profile.partitions)
        * (1 + len(zs) * (1 + len(profile.fixed_clips)))
    )
    rows, histories, audits = [], [], []
    meta = {
        "profile": dataclasses.asdict(profile),
        "model": model.name,
        "params": param_count(jax.eval_shape(model.init, jax.random.key(0))),
        "local": LOCAL,
        "learning_rate": LEARNING_RATE,
        "server_lr": SERVER_LR,
        "server_momentum": SERVER_MOMENTUM,
        "dirichlet_alpha": DIRICHLET_ALPHA,
        "adaptive": {
            "initial_clip": INITIAL_CLIP,
            "target_quantile": TARGET_QUANTILE,
            "clip_lr": CLIP_LR,
        },
        "delta": delta,
        "accountant": spec.accountant,
        "capacity": user_level.participation.capacity,
        "noise_multipliers": zs,
        "epsilon_covers": privacy_plan.relation,
        "audit": None if args.audit is None else repr(CanaryAudit(args.audit)),
    }
    _report.write_json(out / "config.json", meta)
    store = _cli.call_store(
        out,
        _call_settings(meta),
        __name__,
        args,
        ledger=ledger,
    )
    ledger.mark_not_released(out / PRIVATE, MIA_NOT_RELEASED)
    private_rows = []
    bar = tqdm(total=n_runs, desc="dp_fedavg runs", unit="run", disable=not _cli.progress_bars())
    for ds in profile.datasets:
        data = subsample(loaded[ds], profile.n_train, profile.n_test, seed=0)
        test = (jnp.asarray(data.x_test), jnp.asarray(data.y_test))
        for scheme in profile.partitions:
            clients = make_clients(data, scheme, profile.num_clients)
            plan = [
                (
                    "non-private",
                    math.inf,
                    dict(clipping="fixed", initial_clip=1e6, noise_multiplier=0.0),
                )
            ]
            plan += [(name, e, kw) for e, z in zs.items() for name, kw in methods(profile, z)]
            for name, eps_target, kwargs in plan:
                bar.set_postfix_str(f"{ds} {scheme} {name} eps={eps_target:g}")
                key = re.sub(r"[^A-Za-z0-9_.=+-]", "-", f"{ds}_{scheme}_{name}_eps{eps_target:g}")
                run = partial(
                    run_one,
                    clients,
                    test,
                    data,
                    profile,
                    name,
                    kwargs,
                    eps_target,
                    spec,
                    str(out / "history.csv"),
                    None if args.audit is None else CanaryAudit(args.audit),
                )
                hist, payload, _ = store.fetch_or_run(key, run, with_secret=True)
                row = payload["row"]
                private_rows.append({"dataset": ds, "partition": scheme, **payload["private"]})
                ledger.add_saved(payload["releases"])
                audits += [(ds, scheme, name, r["audit"]) for r in payload["releases"]]
                rows.append({"dataset": ds, "partition": scheme, **row})
                histories.append(hist.assign(dataset=ds, partition=scheme))
                summary = pd.DataFrame(rows)
                summary.to_csv(out / "summary.csv", index=False)
                _report.write_json(out / "summary.json", summary.to_dict(orient="records"), NULLS)
                pd.concat(histories).to_csv(out / "history.csv", index=False)
                bar.update(1)
    bar.close()
    summary = pd.DataFrame(rows)
    plot(summary, pd.concat(histories), out, caption(profile, delta, spec.accountant))
    cols = [
        "dataset",
        "partition",
        "method",
        "epsilon",
        "accuracy",
        "accuracy_std",
        "final_clip",
        "rounds_to_target",
        "bits_volume",
    ]
    shown = summary.assign(
        accuracy=np.vectorize(partial(_report.mean_std_text, digits=4), otypes=[str])(
            summary.accuracy, summary.accuracy_std if len(profile.seeds) > 1 else np.nan
        )  # one seed: no std
    )
    _report.write_table(shown, out / "summary_table", columns=cols[:5] + cols[6:], floatfmt=".4g")
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        print(summary[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    hidden = pd.DataFrame(private_rows)
    (out / PRIVATE).mkdir(exist_ok=True)
    hidden.to_csv(out / PRIVATE / "mia_advantage.csv", index=False)
    print(
        f"membership-inference advantage (a loss-threshold attack on training records: an "
        f"unnoised statistic of private data, NOT released): {out / PRIVATE / 'mia_advantage.csv'}"
    )
    print_audits(audits)
    _report.write_ledger(ledger)
    if store.reused:
        print(f"{len(store.reused)} run(s) reused from {store.folder} (--restart runs them again)")
    _report.finish(out, out / "config.json")
    return summary


if __name__ == "__main__":
    main()
