"""Distributed DP under secure aggregation against central DP-FedAvg on the same work
(issue 47, item 4): round time, bytes per client and accuracy.

Work (``--work``): ``mnist``: MNIST train split into ``--users`` users of 50 rows (seeded
consecutive chunks), pfl's ``simple_cnn`` (d = 1,199,882 coordinates under the default DCT
rotation), local SGD at rate 0.1, fixed clip 0.4; ``shakespeare``: ``--users`` speaking
roles (a seeded sample of the staged plays' roles with at least 2 lines), 50 random
80-character windows each, ``experiments.shakespeare``'s character LSTM (two layers of 256;
d = 818,640), local SGD at the paper's rate 1.47, fixed clip 0.5 (that experiment's initial
clip); accuracy on 1,000 test windows. Both: cohort ``--cohort``, one local epoch of batch
10, user-level epsilon ``--epsilon`` at delta ``1 / users``, RDP accountant for every run.
Compared, in one process on one device:

* ``dp-fedavg``: central DP (the server trusted; a secret Poisson cohort, amplified);
* ``dp-fedavg-secagg`` at each of ``--bits``: client-added Skellam shares and masked b-bit
  uploads on public min-separation cohorts (no amplification).

Round time is the median of a run's rounds after its first (which compiles), timed between
its per-round callbacks; the run has ``2 --rounds`` rounds. Bytes up per client: the run's
history (``bytes_up`` over the clients it counts): the model's float32 words for central
DP, ``ceil(d b / 8)`` for a b-bit upload of the rotation's ``d``
coordinates (packed, as the deployment sends it). Accuracy: the last
round's model on the full test split. Prints one table and the ratios to central DP;
``--write`` writes it to ``benchmarks/RESULTS.md`` with the machine and the date.

Example: ``python -m benchmarks.secagg --rounds 4 --bits 16 20``.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import jax
import numpy as np
import pandas as pd

from benchmarks import _cli as _bcli
from benchmarks._results import machine, write_section
from experiments import _cli, shakespeare
from swarmjax.fl.algorithms import registry
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data import ClientStore, partition
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import Execution, simulate
from swarmjax.models import Model, evaluate, simple_cnn

ROWS, CLIP = 50, 0.4


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


def shakespeare_work(data_dir, users: int) -> Work:
    """``users`` speaking roles of the staged plays, ``experiments.shakespeare``'s default
    LSTM and windows."""
    prof = dataclasses.replace(shakespeare.PROFILES["default"], clients=users)
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


def _build(name: str, work: Work, cohort: int, rounds: int, epsilon: float, bits: int | None):
    users = work.store.num_clients
    spec = RunSpec(rounds, 1.0 / users, (0,), accountant="rdp")
    run = registry.CrossDeviceRun(
        work.model,
        users,
        cohort,
        spec,
        LocalTraining(epochs=1, batch_size=10, optimizer="sgd"),
        epsilon=epsilon,
        learning_rate=work.learning_rate,
        clip=work.clip,
        eval_batch_size=250,
        options={} if bits is None else {"bits": bits},
    )
    alg, grid = registry.cross_device(name, run)
    return alg, grid, spec


def _time(name: str, work: Work, args, bits: int | None):
    """One run of ``2 --rounds`` rounds: the median seconds of its rounds after the first
    (which compiles), timed between the per-round callbacks; the result; the algorithm."""
    store, test = work.store, work.round_test
    alg, grid, spec = _build(name, work, args.cohort, 2 * args.rounds, args.epsilon, bits)
    variants = Variants.grid(alg, store, spec, **grid)
    marks = []
    res = simulate(
        alg,
        store,
        test,
        variants,
        execution=Execution(
            rounds_per_call=1,
            progress=False,
            callbacks=(lambda *_: marks.append(time.perf_counter()),),
        ),
    )
    return float(np.median(np.diff(marks))), res, alg


def bytes_up_per_client(res, alg) -> int:
    """Bytes one client uploads in the first round, as the run's history states them:
    ``bytes_up`` over the clients the round's exchanges count (``selected_<exchange>``; an
    expected count where the cohort is a secret sample, hence the rounding)."""
    h = res.history.iloc[0]
    return round(h["bytes_up"] / sum(h[f"selected_{ex.name}"] for ex in alg.exchanges))


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
    args = p.parse_args(argv)
    if args.cohort > args.users:
        raise _cli.UserError(f"--cohort {args.cohort} must be <= --users {args.users}")
    if max(args.bits) > 32:
        raise _cli.UserError(f"--bits {max(args.bits)}: at most 32 (uint32 words)")
    data_dir = _cli.data_dir(args.data_dir)
    if args.work == "mnist":
        work = mnist_work(data_dir, _cli.data_source(args), args.users)
    else:
        work = shakespeare_work(data_dir, args.users)
    rows = []
    for name, bits in [("dp-fedavg", None), *[("dp-fedavg-secagg", b) for b in args.bits]]:
        try:
            seconds, res, alg = _time(name, work, args, bits)
        except ValueError as err:  # bits too few for the target: the library's one line
            rows.append({"algorithm": name, "bits": bits, "refused": str(err)})
            print(f"{name} bits={bits}: refused: {err}")
            continue
        params = jax.tree.map(lambda a: a[0], res.server.params)
        _, acc = evaluate(work.model.apply, params, *work.final_test, batch_size=250)
        up = bytes_up_per_client(res, alg)
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
            f"`python -m benchmarks.secagg --work {args.work} --users {args.users} "
            f"--cohort {args.cohort} "
            f"--rounds {args.rounds} --epsilon {args.epsilon} --bits "
            f"{' '.join(map(str, args.bits))}` on {machine()}"
        )
        name = "secagg-" + ("" if args.work == "mnist" else "shakespeare-")
        write_section(name + time.strftime("%Y%m%d"), head + "\n\n" + text)


if __name__ == "__main__":
    main()
