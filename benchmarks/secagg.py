"""Distributed DP under secure aggregation against central DP-FedAvg on the same work
(issue 47, item 4): round time, bytes per client and accuracy.

Work: MNIST train split into ``--users`` users of 50 rows (seeded consecutive chunks),
cohort ``--cohort``, one local epoch of batch 10, pfl's ``simple_cnn`` (d = 1,199,882
coordinates under the default DCT rotation), fixed clip 0.4, user-level epsilon
``--epsilon`` at delta ``1 / users``, RDP accountant for every run. Compared, in one
process on one device:

* ``dp-fedavg``: central DP (the server trusted; a secret Poisson cohort, amplified);
* ``dp-fedavg-secagg`` at each of ``--bits``: client-added Skellam shares and masked b-bit
  uploads on public min-separation cohorts (no amplification).

Round time is the median of a run's rounds after its first (which compiles), timed between
its per-round callbacks; the run has ``2 --rounds`` rounds. Bytes up per client: float32
words of the model for central DP, ``ceil(d b / 8)`` for a b-bit upload of the rotation's
``d`` coordinates. Accuracy: the last
round's model on the full test split. Prints one table and the ratios to central DP;
``--write`` writes it to ``benchmarks/RESULTS.md`` with the machine and the date.

Example: ``python -m benchmarks.secagg --rounds 4 --bits 16 20``.
"""

from __future__ import annotations

import math
import time

import jax
import numpy as np
import pandas as pd

from benchmarks import _cli as _bcli
from benchmarks._results import machine, write_section
from experiments import _cli
from swarmjax.fl.algorithms import registry
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data import ClientStore, partition
from swarmjax.fl.distributed import Distributed
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import simulate
from swarmjax.models import evaluate, param_count, simple_cnn

ROWS, CLIP = 50, 0.4


def _build(name: str, users: int, cohort: int, rounds: int, epsilon: float, bits: int | None):
    spec = RunSpec(rounds, 1.0 / users, (0,), accountant="rdp")
    run = registry.CrossDeviceRun(
        simple_cnn(10, (28, 28, 1)),
        users,
        cohort,
        spec,
        LocalTraining(epochs=1, batch_size=10, optimizer="sgd"),
        epsilon=epsilon,
        clip=CLIP,
        eval_batch_size=250,
        options={} if bits is None else {"bits": bits},
    )
    alg, grid = registry.cross_device(name, run)
    return alg, grid, spec


def _time(name, store, test, args, bits):
    """One run of ``2 --rounds`` rounds: the median seconds of its rounds after the first
    (which compiles), timed between the per-round callbacks; the result; the algorithm."""
    alg, grid, spec = _build(name, args.users, args.cohort, 2 * args.rounds, args.epsilon, bits)
    variants = Variants.grid(alg, store, spec, **grid)
    marks = []
    res = simulate(
        alg,
        store,
        test,
        variants,
        rounds_per_call=1,
        progress=False,
        callbacks=(lambda *_: marks.append(time.perf_counter()),),
    )
    return float(np.median(np.diff(marks))), res, alg


@_cli.entry_point
def main(argv: list[str] | None = None) -> None:
    p = _bcli.parser("secagg", __doc__, writes="secagg-<date>")
    p.add_argument(
        "--data-dir",
        help="folder holding mnist/ (default: $SWARMJAX_DATA, else ~/.cache/swarmjax/data; "
        "python -m swarmjax.data fetch mnist stages it)",
    )
    p.add_argument(
        "--users", type=_cli.count("--users", 2), default=400, help="users of 50 rows (400)"
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
    args = p.parse_args(argv)
    if args.cohort > args.users:
        raise _cli.UserError(f"--cohort {args.cohort} must be <= --users {args.users}")
    if max(args.bits) > 32:
        raise _cli.UserError(f"--bits {max(args.bits)}: at most 32 (uint32 words)")
    if ROWS * args.users > 60_000:
        raise _cli.UserError(f"--users {args.users} x {ROWS} rows exceed MNIST's 60,000")
    source = _cli.data_source(args)
    ds = _cli.load_dataset("mnist", _cli.data_dir(args.data_dir), source)
    part = partition(ds.y_train, args.users, "consecutive", size=ROWS, seed=0)
    store = ClientStore.build(ds.x_train, ds.y_train, part.indices)
    test = (ds.x_test[:1000], ds.y_test[:1000])
    rows = []
    for name, bits in [("dp-fedavg", None), *[("dp-fedavg-secagg", b) for b in args.bits]]:
        try:
            seconds, res, alg = _time(name, store, test, args, bits)
        except ValueError as err:  # bits too few for the target: the library's one line
            rows.append({"algorithm": name, "bits": bits, "refused": str(err)})
            print(f"{name} bits={bits}: refused: {err}")
            continue
        params = jax.tree.map(lambda a: a[0], res.server.params)
        model = simple_cnn(10, (28, 28, 1))
        _, acc = evaluate(model.apply, params, ds.x_test, ds.y_test, batch_size=1000)
        n = param_count(params)
        up = 4 * n
        if isinstance(alg, Distributed):
            up = math.ceil(alg.plan.dimension(n) * bits / 8)
        rows.append(
            {
                "algorithm": name,
                "bits": bits,
                "s_per_round": seconds,
                "bytes_up_per_client": up,
                "test_accuracy": float(acc),
                "epsilon": float(np.max(res.privacy.final_epsilon)),
                "noise_multiplier": float(np.ravel(res.privacy.noise_multiplier)[0]),
            }
        )
        print(rows[-1])
    table = pd.DataFrame(rows)
    base = table.iloc[0]
    for col in ("s_per_round", "bytes_up_per_client"):
        if col in table:
            table[f"{col}_vs_central"] = table[col] / base[col]
    text = table.to_markdown(index=False, floatfmt=".4g")
    print(text)
    if args.write:
        head = (
            f"`python -m benchmarks.secagg --users {args.users} --cohort {args.cohort} "
            f"--rounds {args.rounds} --epsilon {args.epsilon} --bits "
            f"{' '.join(map(str, args.bits))}` on {machine()}"
        )
        write_section("secagg-" + time.strftime("%Y%m%d"), head + "\n\n" + text)


if __name__ == "__main__":
    main()
