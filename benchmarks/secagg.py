"""Distributed DP under secure aggregation against central DP-FedAvg on the same work
(issue 47, item 4): round time, bytes per client and accuracy.

Work (``--work``): ``mnist``: MNIST train split into ``--users`` users of 50 rows (seeded
consecutive chunks), pfl's ``simple_cnn`` (1,199,882 parameters, d = 1,200,000 coordinates
under the default DCT rotation, zero-padded), local SGD at rate 0.1, fixed clip 0.4;
``shakespeare``: ``--users`` speaking roles (a seeded sample of the staged plays' roles
with at least 2 lines), 50 random 80-character windows each, ``experiments.shakespeare``'s
character LSTM (by default two layers of 256; 817,872 parameters, d = 819,200;
``--hidden`` sets the layers' widths, e.g. ``--hidden 64``: 24,528 parameters), local SGD
at the paper's rate 1.47, fixed clip 0.5 (that experiment's initial clip); accuracy on
1,000 test windows. Both: cohort ``--cohort``, one local epoch of batch 10, user-level epsilon
``--epsilon`` at delta ``1 / users``, RDP accountant for every run.
Compared, in one process on one device:

* ``dp-fedavg (secret Poisson)`` (``--central poisson``): central DP (the server trusted,
  registry ``dp-fedavg``): a secret Poisson cohort of expected size ``--cohort``, amplified
  by sampling;
* ``dp-fedavg (public cohort)`` (``--central public``): central DP on the SAME public
  participation as the distributed runs (registry ``dp-ftrl`` with
  ``factorization="prefix-sum"``: ``C = I``, independent Gaussian noise each round, DP-SGD's
  mechanism, on the same min-separation schedule: cohorts of ``--cohort``, each client at
  most ``k`` times, at least ``b = min(users // cohort, T)`` rounds apart, no
  amplification). The
  central plan with ``dp-fedavg``'s own participations cannot take this schedule
  (``UserLevelDP`` pairs a min-separation schedule with correlated noise only, and
  ``FixedCohort`` charges every client every round); the prefix-sum factorization is that
  pairing with ``C = I``, its release equal to the Gaussian mechanism's (docs/dp_ftrl.md).
  It is the like-for-like baseline: it differs from the distributed runs only in the
  discretisation (rotation, rounding to a grid, Skellam for Gaussian noise, b-bit modular
  sums) and the noise of the clients that secure aggregation lets drop;
* ``dp-fedavg-secagg`` at each of ``--bits``: client-added Skellam shares and masked b-bit
  uploads on public min-separation cohorts (no amplification).

Noise: ``noise_multiplier`` is the accounted one as the run's privacy record states it
(per round for Poisson; of the whole run for the public cohort, whose rounds' noise is
``sqrt(k)`` times it; a Gaussian of the honest Skellam noise's variance per round for the
distributed runs); ``noise_std_per_round`` puts every run on one scale: the standard
deviation of the noise one round adds to the cohort's sum per coordinate, in units of the
clip (the distributed runs: ``sqrt(2 mu m / h) / (gamma C)``, all ``m`` clients' shares
though only ``h`` honest survivors' are counted). ``participations``: ``k``, the rounds a
client takes part in on the public schedule. ``--min-survivors`` sets the distributed runs'
threshold ``t`` (default ``ceil(0.8 cohort)``; ``--cohort``: no dropout tolerated and every
share counted, Kairouz et al.'s setting); ``--seed`` the runs' seed, or several: every
run then runs once per seed, and the output adds each run's mean accuracy over the seeds
(with its standard deviation) and, against each central baseline, the difference of the
means with its 95 % interval (Welch's t). Every run draws a fresh secret, and every random
number of a run (the initial model, the local batches, the noise, a secret Poisson cohort)
descends from it: runs of one seed share only the data split and the public schedule, so
the comparison is of means, not of per-seed pairs.

Every run maps its clients and chunks its evaluation as the experiments do, by the device
(``client_map=None``, :func:`swarmjax.device.default_eval_batch`): one client at a time and
25 test rows a chunk on a CPU. Until 2026-11-29 (session 32) the benchmark vmapped the
cohort and evaluated 250 rows a chunk, which slowed the central round on a CPU more than
the distributed one and flattered their ratio (docs/secure_aggregation.md).

Examples: ``python -m benchmarks.secagg --rounds 4 --bits 16 20 --central public``;
``python -m benchmarks.secagg --work shakespeare --users 1200 --cohort 100 --hidden 64
--rounds 60 --bits 12 16 20 --central public --seed 0 1 2 3`` (a character LSTM small
enough for user-level DP to learn on the plays' 1,225 roles).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import jax
import numpy as np
import pandas as pd
from scipy import stats

from benchmarks import _cli as _bcli
from benchmarks._results import device_slug, machine, write_section
from experiments import _cli, shakespeare
from swarmjax.device import default_eval_batch
from swarmjax.fl.algorithms import registry
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data import ClientStore, partition
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import Execution, simulate
from swarmjax.models import Model, evaluate, simple_cnn
from swarmjax.privacy.distributed import DistributedDP

ROWS, CLIP = 50, 0.4

CENTRAL: dict[str, tuple[str, str, dict[str, str]]] = {
    "poisson": ("dp-fedavg (secret Poisson)", "dp-fedavg", {}),
    "public": ("dp-fedavg (public cohort)", "dp-ftrl", {"factorization": "prefix-sum"}),
}
"""``--central`` choice -> (row name, registry name, registry options)."""
DISTRIBUTED = "dp-fedavg-secagg"


@dataclass(frozen=True)
class Work:
    """What every compared run shares: the model, the clients, the test sets (the
    per-round one and the final one), the local rate and the clip."""

    name: str
    model: Model
    store: ClientStore
    round_test: tuple[np.ndarray, np.ndarray]
    final_test: tuple[np.ndarray, np.ndarray]
    learning_rate: float
    clip: float


def mnist_work(data_dir, source: str | None, users: int) -> Work:
    """``users`` MNIST users of 50 rows, ``simple_cnn``."""
    if ROWS * users > 60_000:
        raise _cli.UserError(f"--users {users} x {ROWS} rows exceed MNIST's 60,000")
    ds = _cli.load_dataset("mnist", data_dir, source)
    part = partition(ds.y_train, users, "consecutive", size=ROWS, seed=0)
    store = ClientStore.build(ds.x_train, ds.y_train, part.indices)
    test = (ds.x_test, ds.y_test)
    return Work(
        "mnist",
        simple_cnn(10, (28, 28, 1)),
        store,
        (test[0][:1000], test[1][:1000]),
        test,
        0.1,
        CLIP,
    )


def shakespeare_work(data_dir, users: int, hidden: tuple[int, ...] | None = None) -> Work:
    """``users`` speaking roles of the staged plays, ``experiments.shakespeare``'s default
    windows and LSTM (layers of ``hidden`` units; ``None``: the experiment's)."""
    prof = dataclasses.replace(shakespeare.PROFILES["default"], clients=users)
    if hidden is not None:
        prof = dataclasses.replace(prof, hidden=tuple(hidden))
    try:
        fed, pick = shakespeare.federation(prof, data_dir)
    except _cli.UserError as err:  # the experiment's --clients is this benchmark's --users
        raise _cli.UserError(str(err).replace("--clients", "--users")) from None
    store, round_test, final_test = shakespeare.clients_and_test(prof, fed, pick)
    return Work(
        "shakespeare",
        shakespeare.model(prof),
        store,
        round_test,
        final_test,
        prof.learning_rate,
        prof.initial_clip,
    )


def _build(
    name: str, work: Work, cohort: int, rounds: int, epsilon: float, options: dict, seed: int = 0
):
    users = work.store.num_clients
    spec = RunSpec(rounds, 1.0 / users, (seed,), accountant="rdp")
    run = registry.CrossDeviceRun(
        work.model,
        users,
        cohort,
        spec,
        LocalTraining(epochs=1, batch_size=10, optimizer="sgd"),
        epsilon=epsilon,
        learning_rate=work.learning_rate,
        clip=work.clip,
        eval_batch_size=default_eval_batch(),  # the device's chunks, as the experiments
        options=options,
    )
    alg, grid = registry.cross_device(name, run)
    return alg, grid, spec


def _time(name: str, work: Work, args, options: dict, seed: int):
    """One run of ``2 --rounds`` rounds: the median seconds of its rounds after the first
    (which compiles), timed between the per-round callbacks; the result; the algorithm;
    the variants (their resolved numbers)."""
    store, test = work.store, work.round_test
    alg, grid, spec = _build(name, work, args.cohort, 2 * args.rounds, args.epsilon, options, seed)
    variants = Variants.grid(alg, store, spec, **grid)
    marks = []
    res = simulate(
        alg,
        store,
        test,
        variants,
        execution=Execution(
            rounds_per_call=1,
            client_map=None,  # the device's choice, as the experiments run: one client at a
            # time on a CPU (a vmapped CNN cohort is slower there and flattered the ratio)
            progress=False,
            callbacks=(lambda *_: marks.append(time.perf_counter()),),
        ),
    )
    return float(np.median(np.diff(marks))), res, alg, variants


def noise_std_per_round(alg, variants, multiplier: float) -> float:
    """Std of the noise one round adds to the cohort's sum (per coordinate), in units of
    the clip: ``z`` for i.i.d. Gaussian noise, ``z sens`` for a whole-run multiplier on a
    min-separation schedule (``sens = sqrt(k)`` for the prefix-sum factorization), and the
    distributed plan's own :meth:`~swarmjax.privacy.distributed.DistributedDP.noise_std`."""
    hyper, plan = variants.hyper.plan, alg.plan
    if isinstance(plan, DistributedDP):
        return float(np.ravel(plan.noise_std(hyper))[0])
    strategy = hyper.strategy
    return multiplier * (1.0 if strategy is None else float(np.ravel(strategy.sensitivity)[0]))


def participations(alg) -> int | None:
    """``k``, the rounds one client takes part in on a public schedule (``None``: a
    secret Poisson cohort)."""
    return getattr(alg.plan.participation, "max_participations", None)


def against_central(rows: list[dict]) -> list[dict]:
    """Each distributed row against each central row of the same seed (rows that ran): the
    accuracy difference in points, the round time and the bytes up as ratios."""
    central = [r for r in rows if r["bits"] is None]
    return [
        {
            "seed": d["seed"],
            "bits": d["bits"],
            "against": c["algorithm"],
            "accuracy_points": 100.0 * (d["test_accuracy"] - c["test_accuracy"]),
            "s_per_round_ratio": d["s_per_round"] / c["s_per_round"],
            "bytes_up_ratio": d["bytes_up_per_client"] / c["bytes_up_per_client"],
        }
        for d in rows
        if d["bits"] is not None
        for c in central
        if c["seed"] == d["seed"]
    ]


def _groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    """The rows that ran, grouped by run (``(algorithm, bits)``), in order."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if "refused" not in r:
            groups.setdefault((r["algorithm"], r["bits"]), []).append(r)
    return groups


def over_seeds(rows: list[dict]) -> list[dict]:
    """Each run over its seeds: how many ran, the mean test accuracy and its standard
    deviation (percent; ``nan`` from one run), the median seconds a round and the bytes
    up."""
    out = []
    for (alg, bits), g in _groups(rows).items():
        acc = 100.0 * np.array([r["test_accuracy"] for r in g])
        out.append(
            {
                "algorithm": alg,
                "bits": bits,
                "runs": len(g),
                "accuracy_mean_pct": float(acc.mean()),
                "accuracy_sd_pct": float(acc.std(ddof=1)) if acc.size > 1 else float("nan"),
                "s_per_round": float(np.median([r["s_per_round"] for r in g])),
                "bytes_up_per_client": g[0]["bytes_up_per_client"],
            }
        )
    return out


def mean_difference(a, b, level: float = 0.95) -> tuple[float, float, float]:
    """``mean(a) - mean(b)`` and its ``level`` interval by Welch's t (unequal variances;
    ``nan`` bounds unless both samples have at least two values)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    diff = float(a.mean() - b.mean())
    if a.size < 2 or b.size < 2:
        return diff, float("nan"), float("nan")
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = float(np.sqrt(va + vb))
    if se == 0.0:
        return diff, diff, diff
    dof = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    half = float(stats.t.ppf(0.5 + level / 2, dof)) * se
    return diff, diff - half, diff + half


def against_central_over_seeds(rows: list[dict]) -> list[dict]:
    """Each distributed run against each central run, over their seeds: the difference of
    the mean accuracies in points and its 95 % interval (:func:`mean_difference`)."""
    groups = _groups(rows)
    central = {k: g for k, g in groups.items() if k[1] is None}
    out = []
    for (_, bits), g in groups.items():
        if bits is None:
            continue
        for (name, _), c in central.items():
            diff, low, high = mean_difference(
                [100.0 * r["test_accuracy"] for r in g], [100.0 * r["test_accuracy"] for r in c]
            )
            out.append(
                {
                    "bits": bits,
                    "against": name,
                    "runs": f"{len(g)} vs {len(c)}",
                    "mean_accuracy_points": diff,
                    "interval_95_low": low,
                    "interval_95_high": high,
                }
            )
    return out


def tables(rows: list[dict]) -> str:
    """The rows that ran as one markdown table (counts as integers, ``-`` where none
    applies), the table :func:`against_central` of them, with several seeds the tables
    :func:`over_seeds` and :func:`against_central_over_seeds`, and a line for each refused
    run."""
    ran = [r for r in rows if "refused" not in r]
    text = []
    if ran:
        text.append(_markdown(ran))
    ratios = against_central(ran)
    if ratios:
        text.append(_markdown(ratios))
    if len({r["seed"] for r in ran}) > 1:
        text.append(_markdown(over_seeds(ran)))
        means = against_central_over_seeds(ran)
        if means:
            text.append(_markdown(means))
    refused: dict[tuple, list[int]] = {}  # one line per refusal, with the seeds it met
    for r in rows:
        if "refused" in r:
            refused.setdefault((r["algorithm"], r["bits"], r["refused"]), []).append(r["seed"])
    for (alg, bits, why), seeds in refused.items():
        which = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"
        text.append(f"{alg} at {bits} bits, {which}: refused: {why}")
    return "\n\n".join(text)


def _markdown(rows: list[dict]) -> str:
    """``rows`` as a markdown table: counts with thousands separators, ``-`` for ``None``."""
    shown = [
        {
            k: "-" if v is None else f"{v:,}" if isinstance(v, int) and k != "seed" else v
            for k, v in r.items()
        }
        for r in rows
    ]
    return pd.DataFrame(shown).to_markdown(index=False, floatfmt=".4g")


def bytes_up_per_client(res, alg) -> int:
    """Bytes one client uploads in the first round, as the run's history states them:
    ``bytes_up`` over the clients the round's exchanges count (``selected_<exchange>``; an
    expected count where the cohort is a secret sample, hence the rounding)."""
    h = res.history.iloc[0]
    return round(h["bytes_up"] / sum(h[f"selected_{ex.name}"] for ex in alg.exchanges))


def _row(label: str, name: str, options: dict, work: Work, args, seed: int) -> dict:
    """One run (``name`` with ``options``) at ``seed``: its row, or the library's one-line
    refusal as ``refused`` (bits too few for the target)."""
    bits = options.get("bits")
    try:
        seconds, res, alg, variants = _time(name, work, args, options, seed)
    except ValueError as err:
        return {"algorithm": label, "bits": bits, "seed": seed, "refused": str(err)}
    params = jax.tree.map(lambda a: a[0], res.server.params)
    _, acc = evaluate(work.model.apply, params, *work.final_test, batch_size=250)
    z = float(np.ravel(res.privacy.noise_multiplier)[0])
    return {
        "algorithm": label,
        "bits": bits,
        "seed": seed,
        "s_per_round": seconds,
        "bytes_up_per_client": bytes_up_per_client(res, alg),
        "test_accuracy": float(acc),
        "epsilon": float(np.max(res.privacy.final_epsilon)),
        "participations": participations(alg),
        "noise_multiplier": z,
        "noise_std_per_round": noise_std_per_round(alg, variants, z),
    }


@_cli.entry_point
def main(argv: list[str] | None = None) -> None:
    p = _bcli.parser("secagg", __doc__, writes="secagg-<date>")
    p.add_argument(
        "--work",
        choices=("mnist", "shakespeare"),
        default="mnist",
        help="mnist: users of 50 rows, simple_cnn; shakespeare: speaking roles, the "
        "character LSTM (default mnist)",
    )
    p.add_argument(
        "--data-dir",
        help="folder holding mnist/ or shakespeare/ (default: $SWARMJAX_DATA, else "
        "~/.cache/swarmjax/data; python -m swarmjax.data fetch NAME stages it)",
    )
    p.add_argument(
        "--users",
        type=_cli.count("--users", 2),
        default=400,
        help="MNIST users of 50 rows, or Shakespeare speaking roles (400)",
    )
    p.add_argument("--cohort", type=_cli.count("--cohort"), default=20, help="clients a round (20)")
    p.add_argument(
        "--rounds", type=_cli.count("--rounds"), default=4, help="half of each run's rounds (4)"
    )
    p.add_argument(
        "--epsilon",
        type=_cli.epsilon_target("--epsilon"),
        default=8.0,
        help="user-level target (default 8)",
    )
    p.add_argument(
        "--bits",
        type=_cli.count("--bits", 8),
        nargs="+",
        default=[16, 20],
        help="bits per uploaded coordinate, 8..32, one run each (default 16 20)",
    )
    p.add_argument(
        "--central",
        choices=tuple(CENTRAL),
        nargs="+",
        default=list(CENTRAL),
        help="central DP-FedAvg baselines: poisson (a secret Poisson cohort, amplified) and "
        "public (the distributed runs' public min-separation cohorts, no amplification); "
        "default both",
    )
    p.add_argument(
        "--seed",
        type=_cli.count("--seed", 0),
        nargs="+",
        default=[0],
        help="the runs' seed, or several (each run once per seed): every run also draws a "
        "fresh secret, from which (with the seed) the initial model, the local batches, "
        "the noise and a secret Poisson cohort descend; the data split and the public "
        "schedule keep seed 0. Seeds other than 0 are written to their own section (0)",
    )
    p.add_argument(
        "--hidden",
        type=_cli.count("--hidden"),
        nargs="+",
        help="--work shakespeare: the LSTM's layer widths (default the experiment's 256 256; "
        "64: a model small enough for user-level DP to learn on the plays' roles)",
    )
    p.add_argument(
        "--min-survivors",
        type=_cli.count("--min-survivors"),
        help="the distributed runs' secure-aggregation threshold t: noise is counted from t "
        "honest survivors, every client adds a share of it (default: the plan's ceil(0.8 "
        "cohort); --cohort: no dropout tolerated, every share counted)",
    )
    args = p.parse_args(argv)
    if args.cohort > args.users:
        raise _cli.UserError(f"--cohort {args.cohort} must be <= --users {args.users}")
    if max(args.bits) > 32:
        raise _cli.UserError(f"--bits {max(args.bits)}: at most 32 (uint32 words)")
    if args.min_survivors is not None and args.min_survivors > args.cohort:
        raise _cli.UserError(
            f"--min-survivors {args.min_survivors} must be <= --cohort {args.cohort}"
        )
    if args.hidden is not None and args.work != "shakespeare":
        raise _cli.UserError(
            "--hidden sets the LSTM of --work shakespeare; --work mnist runs simple_cnn"
        )
    survivors = {} if args.min_survivors is None else {"min_survivors": args.min_survivors}
    data_dir = _cli.data_dir(args.data_dir)
    if args.work == "mnist":
        work = mnist_work(data_dir, _cli.data_source(args), args.users)
    else:
        work = shakespeare_work(data_dir, args.users, args.hidden)
    runs = [CENTRAL[c] for c in dict.fromkeys(args.central)]
    runs += [(DISTRIBUTED, DISTRIBUTED, {"bits": b, **survivors}) for b in args.bits]
    rows = []
    for seed in args.seed:
        for label, name, options in runs:
            rows.append(_row(label, name, options, work, args, seed))
            print(rows[-1])
    text = tables(rows)
    print(text)
    if args.write:
        command = (
            f"python -m benchmarks.secagg --work {args.work} --users {args.users} "
            f"--cohort {args.cohort} --rounds {args.rounds} --epsilon {args.epsilon} "
            f"--bits {' '.join(map(str, args.bits))} --central {' '.join(args.central)} "
            f"--seed {' '.join(map(str, args.seed))}"
        )
        if args.hidden is not None:
            command += f" --hidden {' '.join(map(str, args.hidden))}"
        if args.min_survivors is not None:
            command += f" --min-survivors {args.min_survivors}"
        head = f"`{command}` on {machine()}"
        name = "secagg-" + ("" if args.work == "mnist" else "shakespeare-")
        name += "" if device_slug() == "cpu-cpu" else f"{device_slug()}-"  # a GPU's own
        name += f"eps{args.epsilon:g}-"
        name += "" if args.hidden is None else f"hidden{'-'.join(map(str, args.hidden))}-"
        if args.seed != [0]:
            name += (
                ("seed" if len(args.seed) == 1 else "seeds") + "-".join(map(str, args.seed)) + "-"
            )
        name += "" if args.min_survivors is None else f"survivors{args.min_survivors}-"
        write_section(name + time.strftime("%Y%m%d"), head + "\n\n" + text)


if __name__ == "__main__":
    main()
