"""Natural federated data: memory where users run it, and rounds whose cost follows the data.

Measures, each in its own subprocess (its peak RSS is its own, read with ``os.wait4``):

* ``python -m experiments.cross_device --quick`` (target: peak RSS < 1.5 GiB);
* the same experiment with 10,000 clients of 6 rows, cohort 50, 3 rounds (< 2.5 GiB);
* a power-law federation of 1,000 MNIST clients (``partition(..., "power_law")``, every
  training row) against the equal split of the same rows (1,000 clients of 60): FedAvg
  through ``simulate`` with a cohort of 50, one local epoch at batch 10, the marginal round
  ``(T(2n) - T(n)) / n`` over compiled calls, an MLP 200-200 (the experiment's
  ``simple_cnn`` takes ~10x longer a round on the 2-core CPU: ``--model cnn``); under the
  CPU default (``client_map=None``: one client at a time) and under ``client_map="vmap"``,
  and each alternative formulation of the cohort
  (a padded buffer per slot or each step reading its batch from the store,
  ``ClientStore.read``; one vmapped block or blocks sorted by size,
  ``ClientStore.vmap_block``; a per-round cap, ``LocalTraining.max_examples``). Targets:
  peak RSS < 2.5 GiB and the power-law round within 1.5x of the equal split's.

Ratios are against the equal split measured in the same run. ``--interleaved`` times the
equal split (buffer and step reads), the power law read by steps and the power law through
its padded buffer in ONE process instead, one round of each in turn, so that each ratio is
taken under the same load (no peak RSS; prints only). ``--write`` writes the
``natural_data`` section of benchmarks/RESULTS.md; without it nothing is written.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import _cli as _bcli
from benchmarks._results import machine, write_section
from experiments import _cli

GIB = 2**30


def _child(cmd: list[str]) -> tuple[int, float, float, str]:
    """Run ``cmd``; ``(exit status, peak RSS GiB, wall s, output tail)`` of that child."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        tail = out.read()[-4000:]
    return proc.returncode, usage.ru_maxrss / 2**20, wall, tail


def federation(cfg: dict, data_dir: str) -> dict:
    """One power-law or equal federation, timed in this process."""
    import numpy as np

    from swarmjax.fl.algorithms import registry
    from swarmjax.fl.client.training import LocalTraining
    from swarmjax.fl.data import load_dataset, partition
    from swarmjax.fl.data.store import ClientStore
    from swarmjax.fl.protocol import RunSpec, Variants, run_keys, server_key, variant_identities
    from swarmjax.fl.runtime import Execution, simulate
    from swarmjax.models import mlp, simple_cnn
    from swarmjax.privacy.secret import Secret

    data = load_dataset("mnist", data_dir)
    n = cfg["clients"]
    if cfg["partition"] == "power_law":
        indices = partition(data.y_train, n, "power_law", seed=0).indices
    else:  # the equal split of the same rows
        rows = len(data.y_train) // n * n
        order = np.random.default_rng(0).permutation(len(data.y_train))[:rows]
        indices = np.split(order, n)
    store = ClientStore.build(data.x_train, data.y_train, indices)
    if cfg.get("read") is not None:
        store = store.with_read(cfg["read"])
    if cfg["block"] is not None:
        store = store.with_vmap_block(cfg["block"])
    model = (
        simple_cnn(10, data.input_shape)
        if cfg["model"] == "cnn"
        else mlp((200, 200), 10, data.input_shape)
    )
    training = LocalTraining(batch_size=10, max_examples=cfg["cap"])
    chosen = registry.settings("fedavg", cohort=cfg["cohort"], learning_rate=0.1)
    base = registry.Base(model, training, RunSpec(1, 1e-5), n, eval_batch_size=250)
    alg, grid = registry.build("fedavg", base, chosen)  # the same for any number of rounds
    test = (data.x_test[:1000], data.y_test[:1000])
    cmap = None if cfg["client_map"] == "default" else cfg["client_map"]
    secret = Secret.generate()  # one for every call: the cohorts are redrawn from it below

    def run(rounds: int) -> float:
        variants = Variants.grid(alg, store, RunSpec(rounds, 1e-5), **grid)
        t0 = time.perf_counter()
        execution = Execution(client_map=cmap, rounds_per_call=1)
        simulate(alg, store, test, variants, secret=secret, execution=execution)
        return time.perf_counter() - t0

    r = cfg["rounds"]
    first = run(r)
    once = run(r)
    twice = run(2 * r)
    sizes = np.asarray(store.sizes)
    # the rows the marginal rounds r+1..2r trained on (their cohorts, redrawn from the keys)
    variants = Variants.grid(alg, store, RunSpec(2 * r, 1e-5), **grid)
    ids = variant_identities(alg, variants)
    key = run_keys(secret, list(variants.spec.seeds), ids, False)[0]
    select = alg.exchanges[0].select
    rows = [
        int(sizes[np.asarray(select(None, server_key(key, t, 0), len(sizes)))].sum())
        for t in range(r + 1, 2 * r + 1)
    ]
    return {
        **cfg,
        "seconds_per_round": (twice - once) / r,
        "first_call_seconds": first,
        "largest_client": int(sizes.max()),
        "mean_client": float(sizes.mean()),
        "rows_per_round": float(np.mean(rows)),
        "buffer_rows": int(alg.client_data(store).max_rows),
        "read": alg.client_data(store).read,
    }


def interleaved(data_dir: str, maps: list[str], rounds: int, model_name: str) -> list[str]:
    """The equal split (read through its buffer and by steps), the power law read by steps
    and the power law read through the padded buffer, all in THIS process, one round of each in turn
    (:func:`~swarmjax.fl.runtime.simulator.advance`), so that every ratio is between
    rounds timed under the same load. Returns the table's markdown lines."""
    import numpy as np

    from swarmjax.fl.algorithms import registry
    from swarmjax.fl.client.training import LocalTraining
    from swarmjax.fl.data import load_dataset, partition
    from swarmjax.fl.data.store import ClientStore
    from swarmjax.fl.protocol import RunSpec, Variants, run_keys, server_key, variant_identities
    from swarmjax.fl.runtime import Execution
    from swarmjax.fl.runtime.simulator import advance, start
    from swarmjax.models import mlp, simple_cnn
    from swarmjax.privacy.secret import Secret

    data = load_dataset("mnist", data_dir)
    order = np.random.default_rng(0).permutation(len(data.y_train))
    equal = np.split(order[: len(order) // 1000 * 1000], 1000)
    power = partition(data.y_train, 1000, "power_law", seed=0).indices
    model = (
        simple_cnn(10, data.input_shape)
        if model_name == "cnn"
        else mlp((200, 200), 10, data.input_shape)
    )
    chosen = registry.settings("fedavg", cohort=50, learning_rate=0.1)
    spec = RunSpec(rounds + 1, 1e-5)
    base = registry.Base(model, LocalTraining(batch_size=10), spec, 1000, eval_batch_size=250)
    alg, grid = registry.build("fedavg", base, chosen)
    test = (data.x_test[:1000], data.y_test[:1000])
    lines = [
        "| client map (model) | federation | read | s / round | vs equal | steps / round | "
        "s per 1,000 steps vs equal | load |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for cmap in maps:
        runs = {}
        for name, idx, read in (
            ("equal", equal, "buffer"),
            ("equal", equal, "step"),
            ("power_law", power, "step"),
            ("power_law", power, "buffer"),
        ):
            store = ClientStore.build(data.x_train, data.y_train, idx).with_read(read)
            variants = Variants.grid(alg, store, spec, **grid)
            secret = Secret.generate()  # the run's, and the cohorts redrawn from it below
            cm = None if cmap == "default" else cmap
            run = start(
                alg, store, test, variants, secret=secret, execution=Execution(client_map=cm)
            )
            run, _ = advance(run, 1)  # compiles
            ids = variant_identities(alg, variants)
            key = run_keys(secret, list(variants.spec.seeds), ids, False)
            sizes = np.asarray(store.sizes)
            select = alg.exchanges[0].select
            steps = [
                int(
                    np.ceil(
                        sizes[np.asarray(select(None, server_key(key[0], t, 0), 1000))] / 10
                    ).sum()
                )
                for t in range(2, rounds + 2)
            ]
            runs[name, read] = [run, steps, []]
        for _ in range(rounds):  # one round of each in turn
            for entry in runs.values():
                t0 = time.perf_counter()
                entry[0], _ = advance(entry[0], 1)
                entry[2].append(time.perf_counter() - t0)
        base = runs["equal", "buffer"]
        base_round = float(np.mean(base[2]))
        base_step = sum(base[2]) / sum(base[1])
        for (name, read), (_, steps, times) in runs.items():
            lines.append(
                f"| {cmap} ({model_name}) | {name} | {read} | {np.mean(times):.3f} | "
                f"{np.mean(times) / base_round:.2f}x | {np.mean(steps):.0f} | "
                f"{sum(times) / sum(steps) / base_step:.2f}x | {os.getloadavg()[0]:.1f} |"
            )
            print(lines[-1], flush=True)
    return lines


@_cli.entry_point
def main(argv: list[str] | None = None) -> None:
    p = _bcli.parser("natural_data", __doc__.split("\n\n")[0], writes="natural_data")
    p.add_argument(
        "--rounds", type=_cli.count("--rounds"), default=3, help="rounds per timed call (3)"
    )
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp", help="federations' model")
    p.add_argument(
        "--maps",
        nargs="+",
        choices=("default", "vmap"),
        default=["default", "vmap"],
        help="client maps of the federations (both)",
    )
    p.add_argument(
        "--alternatives",
        choices=("all", "reads"),
        default="all",
        help="federation alternatives: all (reads, sorted blocks, a cap of 64) or reads "
        "(buffer against step reads, no cap)",
    )
    p.add_argument(
        "--interleaved",
        action="store_true",
        help="time the equal split and the power law, by steps and by buffer, in ONE process, a "
        "round of each in turn (ratios under the same load; no peak RSS); prints, writes "
        "nothing",
    )
    skip = p.add_mutually_exclusive_group()
    skip.add_argument("--skip-experiments", action="store_true", help="federations only")
    skip.add_argument("--skip-federations", action="store_true", help="experiments only")
    p.add_argument(
        "--data-dir", help="holds mnist/ (default: $SWARMJAX_DATA, else ~/.cache/swarmjax/data)"
    )
    p.add_argument("--one", help=argparse.SUPPRESS)  # internal: one federation, as JSON
    args = p.parse_args(argv)
    data_dir = str(_cli.data_dir(args.data_dir))
    if args.one:
        print(json.dumps(federation(json.loads(args.one), data_dir)))
        return
    _cli.load_dataset("mnist", Path(data_dir), _cli.data_source(args))  # before any work
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if args.interleaved:
        lines = interleaved(data_dir, args.maps, args.rounds, args.model)
        print(
            "\n".join(
                [
                    f"`python -m benchmarks.natural_data --interleaved` on {machine()}, "
                    f"started {started}: one process, {args.rounds} rounds of each "
                    "configuration in turn after its compiled first round (FedAvg, cohort "
                    "50, batch 10, one epoch); 'vs equal': against the equal split's "
                    "rounds timed between them.",
                    "",
                    *lines,
                ]
            )
        )
        return
    lines: list[str] = []
    if not args.skip_experiments:
        exp = [
            ("`experiments.cross_device --quick`", ["--quick"], 1.5),
            (
                "10,000 clients of 6 rows, cohort 50, 3 rounds (FedAvg, DP-FedAvg)",
                [
                    *("--clients 10000 --rows-per-client 6 --cohort 50 --rounds 3".split()),
                    *("--algorithms fedavg dp-fedavg --test-size 1000".split()),
                ],
                2.5,
            ),
        ]
        lines += [
            "| run | peak RSS GiB | target | wall s | load |",
            "|---|---:|---:|---:|---:|",
        ]
        for name, extra, target in exp:
            with tempfile.TemporaryDirectory() as out:
                cmd = [sys.executable, "-m", "experiments.cross_device", "--out", out, "--restart"]
                rc, peak, wall, tail = _child([*cmd, "--data-dir", data_dir, *extra])
            if rc != 0:
                raise SystemExit(f"{name} failed ({rc}):\n{tail}")
            load = os.getloadavg()[0]
            mark = "met" if peak < target else "**not met**"
            lines.append(f"| {name} | {peak:.2f} | < {target} ({mark}) | {wall:.0f} | {load:.1f} |")
            print(lines[-1], flush=True)
        lines.append("")
    # (client map, model, [(partition, block, cap, read)]): alternatives of the cohort's
    # formulation (None: the store's own choice); the first row of a map is its baseline
    equal = [("equal", None, None, None), ("equal", None, None, "step")]
    plans = [
        (
            "default",
            args.model,
            [
                *equal,
                *[("power_law", None, None, r) for r in ("buffer", "step")],
                ("power_law", None, 64, None),
            ],
        ),
        (
            "vmap",
            args.model,
            [
                *equal,
                ("power_law", 5, None, "buffer"),
                *[("power_law", b, None, "step") for b in (0, 5, 10)],
                ("power_law", 0, 64, None),
            ],
        ),
    ]
    if args.alternatives != "all":  # the reads only: no cap
        plans = [(m, mo, [a for a in alt if a[2] is None]) for m, mo, alt in plans]
    rows = []
    maps = [] if args.skip_federations else args.maps
    for cmap, model, alternatives in [plan for plan in plans if plan[0] in maps]:
        for part, block, cap, read in alternatives:
            cfg = {
                "clients": 1000,
                "cohort": 50,
                "partition": part,
                "client_map": cmap,
                "model": model,
                "block": block,
                "cap": cap,
                "read": read,
                "rounds": args.rounds,
            }
            cmd = [sys.executable, "-m", "benchmarks.natural_data", "--one", json.dumps(cfg)]
            rc, peak, wall, tail = _child([*cmd, "--data-dir", data_dir])
            if rc != 0:
                raise SystemExit(f"{cfg} failed ({rc}):\n{tail}")
            row = json.loads(tail.strip().splitlines()[-1])
            row.update(peak_rss_gib=peak, load=os.getloadavg()[0])
            rows.append(row)
            print(row, flush=True)
    base = {r["client_map"]: r for r in rows if r["partition"] == "equal" and r["read"] == "buffer"}
    lines += (
        []
        if not rows
        else [
            "| client map (model) | federation | read | vmap block | cap | buffer rows | "
            "rows / round | s / round | vs equal | s per 1,000 rows vs equal | first call s | "
            "peak RSS GiB | load |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
    )
    for r in rows:
        block = "store's" if r["block"] is None else r["block"]
        block = "-" if r["client_map"] == "default" else block
        b = base[r["client_map"]]
        ratio = r["seconds_per_round"] / b["seconds_per_round"]
        per_row = ratio * b["rows_per_round"] / r["rows_per_round"]
        buffer = "-" if r["read"] == "step" else r["buffer_rows"]
        lines.append(
            f"| {r['client_map']} ({r['model']}) | {r['partition']} | {r['read']} | {block} | "
            f"{r['cap'] or '-'} | {buffer} | {r['rows_per_round']:,.0f} | "
            f"{r['seconds_per_round']:.2f} | {ratio:.2f}x | {per_row:.2f}x | "
            f"{r['first_call_seconds']:.1f} | {r['peak_rss_gib']:.2f} | "
            f"{r['load']:.1f} |"
        )
    text = "\n".join(
        [
            "## natural_data",
            "",
            f"`python -m benchmarks.natural_data` on {machine()}, started {started}: peak RSS "
            "of each run in its own process; power-law (1,000 MNIST clients, every row, "
            "`partition(..., 'power_law')`) against the equal split of the same rows, "
            f"FedAvg, cohort 50, batch 10, one epoch, marginal round over {args.rounds} "
            "rounds. 'vs equal': against the equal split's round under the same client map "
            "(buffer read), measured in this run (target 1.5x; peak RSS target 2.5 GiB); "
            "'rows / round': the rows the timed rounds' cohorts hold (a heavy-tailed "
            "cohort's vary widely round to round; 3,000 in expectation), and the ratio per "
            "1,000 of them.",
            "",
            *lines,
        ]
    )
    print(text)
    if args.write:
        write_section("natural_data", text)


if __name__ == "__main__":
    main()
