"""Round time over Flower against the simulator, measured in one run.

The same task (FedAvg on scikit-learn's digits, 3 clients, ``--rounds`` rounds) runs

* in the vectorised simulator (one process, clients under ``vmap``; the time of a second,
  already compiled call divided by the rounds), and
* on a real deployment: SuperLink + 3 SuperNodes as separate processes on 127.0.0.1
  (:class:`~swarmjax.fl.runtime.flower.deployment.LocalDeployment`), the round time the ServerApp
  measured (send, the nodes' ClientApp processes, replies, aggregate, evaluate). The nodes
  compile while joining (before round 1); every round loads the executables from the
  persistent cache.

``python -m benchmarks.flower_round [--quick]`` writes the ``flower_round`` section of
RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks._results import machine, write_section
from swarmjax.fl.runtime.flower.deployment import LocalDeployment
from swarmjax.fl.runtime.flower.server import read_run
from swarmjax.fl.runtime.flower.task import load_task, simulate_task


def _simulator_round(config: dict) -> float:
    task = load_task(config)

    def once() -> None:
        simulate_task(task)

    once()  # compile
    t0 = time.perf_counter()
    once()
    return (time.perf_counter() - t0) / task.rounds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds instead of 5")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 5)
    if rounds < 2:
        parser.error(f"--rounds must be >= 2 (round 1 compiles); got {rounds}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        config = {
            "task": "swarmjax.fl.runtime.flower.tasks:digits",
            "algorithm": "fedavg",
            "rounds": rounds,
            "out-dir": str(out),
        }
        sim = _simulator_round(config)
        t0 = time.perf_counter()
        with LocalDeployment(node_config={"jax-cache-dir": str(Path(tmp) / "cache")}) as dep:
            started = time.perf_counter() - t0
            t1 = time.perf_counter()
            dep.run(config, timeout=1800)
            whole = time.perf_counter() - t1
        run = read_run(out, load_task(config))
    secs = run.operator.rounds["seconds"].to_numpy()
    later = float(np.median(secs[1:]))
    rows = [
        "| runtime | seconds per round | vs simulator |",
        "|---|---|---|",
        f"| simulator (vmap over 3 clients, compiled) | {sim:.4f} | 1x |",
        f"| Flower, round 1 | {secs[0]:.2f} | {secs[0] / sim:,.0f}x |",
        f"| Flower, later rounds (median) | {later:.2f} | {later / sim:,.0f}x |",
    ]
    bytes_per_round = int(run.history["bytes_up"].iloc[0] + run.history["bytes_down"].iloc[0])
    wire = int(run.operator.messages["wire_up"].sum() + run.operator.messages["wire_down"].sum())
    payload = int(
        run.operator.messages["bytes_up"].sum() + run.operator.messages["bytes_down"].sum()
    )
    text = "\n".join(
        [
            "## flower_round",
            "",
            f"`python -m benchmarks.flower_round{' --quick' if args.quick else ''}` on "
            f"{machine()}. FedAvg, digits, 3 SuperNodes + SuperLink as processes on "
            f"127.0.0.1, {rounds} rounds; SuperLink and nodes started in {started:.1f} s, "
            f"`flwr run` took {whole:.1f} s in all. Load average at the end "
            f"{os.getloadavg()[0]:.1f} (the machine was shared).",
            "",
            *rows,
            "",
            f"Bytes per round (arrays, = the simulator's accounting): {bytes_per_round:,}; "
            f"on the wire with np.save headers and field names: +{wire / payload - 1:.1%}. "
            "A Flower round is dominated by the one-process-per-message ClientApp of flwr "
            "1.41 (Python + JAX start-up and the task's data each message), not by the "
            "algorithm; the simulator's figure is what the same arithmetic costs.",
        ]
    )
    print(text)
    write_section("flower_round", text)


if __name__ == "__main__":
    main()
