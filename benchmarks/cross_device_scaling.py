"""Cross-device scaling through the simulator itself: seconds per round and peak memory as
the federation grows with a fixed cohort, and as the cohort grows.

Each configuration runs in its own process (its peak RSS is its own): FedAvg with
``cohort=`` clients per round, pfl's ``simple_cnn``, one local epoch of SGD at batch 10 on
clients of ``--rows`` MNIST rows kept in one flat ``ClientStore`` (the training rows are
tiled when ``clients x rows`` exceeds them: the cost of a round does not depend on which
rows a client holds), clients mapped as the device chooses (one at a time on a CPU) or in
blocks of ``--block`` (``simulate(client_map=k)``). The time per round is the marginal
one, ``(T(2n) - T(n)) / n`` over compiled calls of ``n = --rounds`` and ``2n`` rounds (one
compiled round per call), so a run's fixed costs cancel.

``python -m benchmarks.cross_device_scaling [--quick] [--write]`` prints its table;
``--write`` writes it as the ``cross_device_scaling`` section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import _cli as _bcli
from benchmarks._results import machine, write_section
from experiments import _cli


def one(
    clients: int, cohort: int, rows: int, rounds: int, block: int | None, data_dir: str
) -> dict:
    """Measure one configuration in this process."""
    from swarmjax.fl.algorithms import registry
    from swarmjax.fl.client.training import LocalTraining
    from swarmjax.fl.data import load_dataset
    from swarmjax.fl.data.store import ClientStore
    from swarmjax.fl.protocol import RunSpec, Variants
    from swarmjax.fl.runtime import Execution, simulate
    from swarmjax.models import simple_cnn

    data = load_dataset("mnist", data_dir)
    need = clients * rows
    order = np.random.default_rng(0).permutation(len(data.y_train))
    order = np.resize(order, need)  # tiled when the federation needs more rows than exist
    indices = np.split(order, clients)
    store = ClientStore.build(data.x_train, data.y_train, indices)
    model, training = simple_cnn(10, data.input_shape), LocalTraining(batch_size=10)
    test = (data.x_test[:1000], data.y_test[:1000])
    chosen = registry.settings("fedavg", cohort=cohort, learning_rate=0.1)
    base = registry.Base(model, training, RunSpec(1, 1e-5), clients, eval_batch_size=250)
    alg, grid = registry.build("fedavg", base, chosen)  # the same for any number of rounds

    def run(n: int) -> tuple[float, object]:
        variants = Variants.grid(alg, store, RunSpec(n, 1e-5), **grid)
        t0 = time.perf_counter()
        res = simulate(
            alg, store, test, variants, execution=Execution(client_map=block, rounds_per_call=1)
        )
        return time.perf_counter() - t0, res

    first, _ = run(rounds)  # compiles the one-round program
    once, _ = run(rounds)
    twice, res = run(2 * rounds)
    again = twice - once  # the marginal seconds of `rounds` rounds: fixed costs cancel
    return {
        "clients": clients,
        "cohort": cohort,
        "rows": rows,
        "seconds_per_round": again / rounds,
        "first_call_seconds": first,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "store_gib": (store.x.nbytes + store.y.nbytes) / 2**30,
        "accuracy": float(res.history["test_accuracy"].iloc[-1]),
    }


def memory_estimate(clients: int, cohort: int, rows: int) -> int:
    """Bytes one configuration allocates, estimated before any work: the store (uint8 codes
    of ``clients x rows`` images) and the cohort's gathered rows in float32."""
    return _cli.array_bytes((clients, rows, 784), itemsize=1) + _cli.array_bytes(
        (cohort, rows, 784)
    )


@_cli.entry_point
def main(argv: list[str] | None = None) -> None:
    p = _bcli.parser(
        "cross_device_scaling", __doc__.split("\n\n")[0], writes="cross_device_scaling"
    )
    p.add_argument("--quick", action="store_true", help="2 rounds, 100/1000 clients only")
    p.add_argument(
        "--rounds", type=_cli.count("--rounds"), default=None, help="rounds per timed call (3)"
    )
    p.add_argument("--rows", type=_cli.count("--rows"), default=50, help="rows per client (50)")
    p.add_argument(
        "--block",
        type=_cli.count("--block"),
        default=None,
        help="clients per vmapped block (device's choice)",
    )
    p.add_argument(
        "--data-dir", help="holds mnist/ (default: $SWARMJAX_DATA, else ~/.cache/swarmjax/data)"
    )
    p.add_argument("--one", help=argparse.SUPPRESS)  # internal: one configuration, as JSON
    args = p.parse_args(argv)
    data_dir = str(_cli.data_dir(args.data_dir))
    if args.one:
        cfg = json.loads(args.one)
        print(json.dumps(one(**cfg, data_dir=data_dir)))
        return
    rounds = args.rounds or (2 if args.quick else 3)
    federations = (100, 1000) if args.quick else (100, 1000, 10000)
    configs = [(n, 50) for n in federations] + [(1000, c) for c in (10, 200)]
    need = max(memory_estimate(n, c, args.rows) for n, c in configs)
    _cli.check_memory(need, "--rows", f"up to {max(federations)} clients of {args.rows} rows")
    source = _cli.data_source(args)
    _cli.load_dataset("mnist", Path(data_dir), source)  # staged and readable, before any work
    rows = []
    for clients, cohort in configs:
        cfg = {
            "clients": clients,
            "cohort": cohort,
            "rows": args.rows,
            "rounds": rounds,
            "block": args.block,
        }
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.cross_device_scaling",
                "--one",
                json.dumps(cfg),
                "--data-dir",
                data_dir,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise SystemExit(f"{cfg} failed:\n{proc.stderr[-3000:]}")
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        row["load"] = os.getloadavg()[0]
        rows.append(row)
        print(row, flush=True)
    table = [
        "| clients | cohort | s / round | first call s | peak RSS GiB | store GiB | load |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        table.append(
            f"| {r['clients']:,} | {r['cohort']} | {r['seconds_per_round']:.2f} | "
            f"{r['first_call_seconds']:.1f} | {r['peak_rss_gib']:.2f} | {r['store_gib']:.2f} | "
            f"{r['load']:.1f} |"
        )
    flat = [r["seconds_per_round"] for r in rows if r["cohort"] == 50]
    text = "\n".join(
        [
            "## cross_device_scaling",
            "",
            f"`python -m benchmarks.cross_device_scaling{' --quick' if args.quick else ''}` "
            f"on {machine()}: FedAvg through `simulate`, simple_cnn, {args.rows} rows per "
            f"client in a flat ClientStore (rows tiled past MNIST's 60,000), clients "
            f"{'as the device chooses' if args.block is None else f'in blocks of {args.block}'}"
            f", {rounds} timed rounds after a compiling call.",
            "",
            *table,
            "",
            f"Cohort 50: the slowest federation's round is {max(flat) / min(flat):.2f}x the "
            "fastest's (target: flat within 1.2x). Peak RSS includes JAX and the "
            "store (uint8 codes of MNIST's k/255 pixels, `ClientStore.build`'s default).",
        ]
    )
    print(text)
    if args.write:
        write_section("cross_device_scaling", text)


if __name__ == "__main__":
    main()
