"""Seconds per message exchange over Flower: swarmjax's app against Flower's own floor
(a trivial echo app) on the same deployment, and against the simulator.

On one :class:`~swarmjax.fl.runtime.flower.deployment.LocalDeployment` (SuperLink + 3
SuperNodes as processes on 127.0.0.1):

* the floor: ``benchmarks/flower_floor_app`` (numpy only, no JAX; the ClientApp echoes an
  array of the model's size) makes the same exchanges as FedAvg, one per round;
* FedAvg on digits (``flower_app``), ``--rounds`` rounds; seconds per round as the
  ServerApp measured them (send, the nodes' ClientApps, replies, aggregate, evaluate);
* the floor again (the machine is shared: the two floor runs bracket swarmjax's).

Then, on a fresh deployment of 4 SuperNodes, Fed-DP-PSO (two exchanges a round) for 2
rounds with a fresh JAX cache: the whole ``flwr run`` (ServerApp start, the nodes'
compilation while joining, both rounds) and its seconds per exchange, beside the floor
app making two exchanges a round (and that app's whole ``flwr run``). Where Ray is
installed (``pip install -e ".[simulation]"``), both runs again on Flower's Simulation
Runtime (the ClientApps in Ray actors). The simulator's figure is a second, compiled call
divided by the rounds. The workers' own seconds per message come from their logs.

``python -m benchmarks.flower_round [--quick]`` writes the ``flower_round`` section of
RESULTS.md with ``--write`` (else it only prints).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from benchmarks import _cli as _bcli
from benchmarks._results import machine, write_section
from experiments import _cli
from swarmjax.fl.runtime.flower.deployment import LocalDeployment, run_simulation
from swarmjax.fl.runtime.flower.records import payload_bytes
from swarmjax.fl.runtime.flower.server import read_run
from swarmjax.fl.runtime.flower.task import load_task, simulate_task

FLOOR_APP = Path(__file__).resolve().parent / "flower_floor_app"
TASK = "swarmjax.fl.runtime.flower.tasks:digits"


def _simulator_round(config: dict) -> float:
    task = load_task(config)
    simulate_task(task)  # compile
    t0 = time.perf_counter()
    simulate_task(task)
    return (time.perf_counter() - t0) / task.rounds


def _model_size(config: dict) -> int:
    """float32 values in the first exchange's Request (the model FedAvg sends)."""
    task = load_task(config)
    ex = (task.algorithm.setup + task.algorithm.exchanges)[0]
    return payload_bytes(jax.eval_shape(ex.request, task.server_like)) // 4


def floor(
    dep: LocalDeployment, out: Path, rounds: int, exchanges: int, size: int
) -> tuple[np.ndarray, float]:
    """Seconds per exchange of each round of the trivial app over ``dep``'s nodes, and the
    whole ``flwr run``'s seconds."""
    config = {
        "num-clients": len(dep.nodes),
        "rounds": rounds,
        "exchanges": exchanges,
        "size": size,
        "out-dir": str(out),
    }
    t0 = time.perf_counter()
    dep.run(config, app=FLOOR_APP, timeout=1800)
    whole = time.perf_counter() - t0
    seconds = np.asarray(json.loads((out / "floor.json").read_text())["seconds"])
    return seconds / exchanges, whole


def swarmjax_run(dep: LocalDeployment, config: dict) -> tuple[np.ndarray, float]:
    """Seconds per exchange of each round of ``config`` over ``dep``, and the whole
    ``flwr run``'s seconds."""
    t0 = time.perf_counter()
    dep.run(config, timeout=1800)
    whole = time.perf_counter() - t0
    task = load_task(config)
    run = read_run(config["out-dir"], task)
    per_round = len(task.algorithm.exchanges)
    return run.operator.rounds["seconds"].to_numpy() / per_round, whole


def simulation_run(config: dict, nodes: int) -> tuple[np.ndarray, float]:
    """Seconds of each round of ``config`` on Flower's Simulation Runtime (``nodes`` Ray
    actors), and the whole ``flwr run``'s seconds."""
    t0 = time.perf_counter()
    run_simulation(config, num_supernodes=nodes, timeout=1800)
    whole = time.perf_counter() - t0
    run = read_run(config["out-dir"], load_task(config))
    return run.operator.rounds["seconds"].to_numpy(), whole


def worker_seconds(dep: LocalDeployment) -> list[float]:
    """Seconds the workers spent on each exchange (their logs)."""
    out = []
    for partition in dep.partitions_seen:
        log = dep.worker_dir(partition) / "worker.log"
        text = log.read_text() if log.exists() else ""
        out += [float(s) for s in re.findall(r"^exchange: ([0-9.]+) s$", text, re.M)]
    return out


def _version(package: str) -> str:
    return importlib.metadata.version(package)


@_cli.entry_point
def main(argv: list[str] | None = None) -> None:
    parser = _bcli.parser("flower_round", __doc__.split("\n\n")[0], writes="flower_round")
    parser.add_argument("--quick", action="store_true", help="3 FedAvg rounds instead of 6")
    parser.add_argument(
        "--rounds",
        type=_cli.count("--rounds", 2),
        default=None,
        help="FedAvg rounds (>= 2: round 1 loads the executables; default 6, quick 3)",
    )
    parser.add_argument(
        "--task-poll-interval",
        type=_cli.positive_float("--task-poll-interval"),
        default=LocalDeployment.task_poll_interval,
        help="FLWR_SUPEREXEC_TASK_POLL_INTERVAL of the nodes (Flower's default: 1)",
    )
    parser.add_argument("--no-pso", action="store_true", help="skip the Fed-DP-PSO run")
    parser.add_argument(
        "--no-simulation", action="store_true", help="skip Flower's Simulation Runtime"
    )
    args = parser.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 6)
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        config = {"task": TASK, "algorithm": "fedavg", "rounds": rounds, "out-dir": str(tmp / "a")}
        sim = _simulator_round(config)
        size = _model_size(config)
        node_config = {"jax-cache-dir": str(tmp / "cache")}
        poll = args.task_poll_interval
        t0 = time.perf_counter()
        with LocalDeployment(node_config=node_config, task_poll_interval=poll) as dep:
            started = time.perf_counter() - t0
            floor_a, _ = floor(dep, tmp / "f1", rounds, 1, size)
            fedavg, fedavg_whole = swarmjax_run(dep, config)
            floor_b, _ = floor(dep, tmp / "f2", rounds, 1, size)
            work = worker_seconds(dep)
        load.append(os.getloadavg()[0])
        pso = None
        if not args.no_pso:
            pso_config = {
                "task": TASK,
                "algorithm": "fed-dp-pso",
                "num-clients": 4,
                "rounds": 2,
                "out-dir": str(tmp / "p"),
            }
            node_config = {"jax-cache-dir": str(tmp / "cache-pso")}  # cold: compiles
            with LocalDeployment((0, 1, 2, 3), node_config, task_poll_interval=poll) as dep:
                pso_floor, pso_floor_whole = floor(dep, tmp / "f3", 2, 2, size)
                pso_exchange, pso_whole = swarmjax_run(dep, pso_config)
                # again: the executables are in the nodes' cache (a later run, or a run
                # after a restart, on these machines)
                warm = {**pso_config, "out-dir": str(tmp / "p2")}
                pso_exchange_warm, pso_whole_warm = swarmjax_run(dep, warm)
                work_pso = worker_seconds(dep)
            pso = (pso_floor, pso_floor_whole, pso_exchange, pso_whole, work_pso)
            pso += (pso_exchange_warm, pso_whole_warm)
            load.append(os.getloadavg()[0])
        simulation = None
        if not args.no_simulation and importlib.util.find_spec("ray") is not None:
            sim_fedavg = simulation_run({**config, "out-dir": str(tmp / "s1")}, 3)
            sim_pso = None
            if not args.no_pso:
                sim_pso = simulation_run({**pso_config, "out-dir": str(tmp / "s2")}, 4)
            simulation = (sim_fedavg, sim_pso)

    later = float(np.median(fedavg[1:]))
    floor_all = np.concatenate([floor_a[1:], floor_b[1:]])
    floor_med = float(np.median(floor_all))
    rows = [
        "| runtime | seconds per exchange | vs Flower's floor | vs simulator |",
        "|---|---|---|---|",
        f"| simulator (vmap over 3 clients, compiled; one round) | {sim:.4f} | | 1x |",
        f"| Flower's floor: trivial echo app (median; runs before and after swarmjax's) "
        f"| {floor_med:.2f} | 1x | {floor_med / sim:,.0f}x |",
        f"| swarmjax FedAvg, round 1 | {fedavg[0]:.2f} | {fedavg[0] / floor_med:.2f}x "
        f"| {fedavg[0] / sim:,.0f}x |",
        f"| swarmjax FedAvg, later rounds (median) | {later:.2f} | {later / floor_med:.2f}x "
        f"| {later / sim:,.0f}x |",
    ]
    lines = [
        "## flower_round",
        "",
        f"`python -m benchmarks.flower_round{' --quick' if args.quick else ''}` on "
        f"{machine()}. SuperLink + 3 SuperNodes as processes on 127.0.0.1 (started in "
        f"{started:.1f} s), `FLWR_SUPEREXEC_TASK_POLL_INTERVAL={poll:g}`; FedAvg on digits, "
        f"{rounds} rounds (`flwr run` {fedavg_whole:.1f} s in all); the floor app made the "
        f"same {rounds} exchanges with a {size:,}-value float32 array, once before and once "
        f"after. Load average {', '.join(f'{x:.1f}' for x in load)} (start, after FedAvg, "
        "after Fed-DP-PSO; the 2 cores were shared).",
        "",
        *rows,
        "",
        f"Floor per exchange, each run: {np.round(floor_a, 2).tolist()} and "
        f"{np.round(floor_b, 2).tolist()}; swarmjax FedAvg: {np.round(fedavg, 2).tolist()}. "
        f"The workers spent {np.median(work):.3f} s (median; max {max(work):.3f} s) on an "
        "exchange: the rest of swarmjax's seconds is Flower's (SuperNode poll, SuperExec "
        "poll, the `flwr-clientapp` process) plus the ServerApp's aggregate and evaluate.",
    ]
    if pso is not None:
        pso_floor, pso_floor_whole, pso_exchange, pso_whole, work_pso = pso[:5]
        pso_exchange_warm, pso_whole_warm = pso[5:]
        pf, pe = float(np.median(pso_floor)), float(np.median(pso_exchange))
        pw = float(np.median(pso_exchange_warm))
        verdict = "met" if pso_whole_warm < 45 else "not met"
        vs_floor = pso_whole_warm / pso_floor_whole
        lines += [
            "",
            f"Fed-DP-PSO, 4 SuperNodes, 2 rounds (2 exchanges a round): with a fresh JAX "
            f"cache `flwr run` took {pso_whole:.1f} s in all (the CLI, the ServerApp's "
            f"start, the nodes' compilation while joining, the setup exchange, both rounds), "
            f"{pe:.2f} s per exchange (rounds: {np.round(pso_exchange, 2).tolist()}); run "
            f"again on the same nodes (executables in the cache) {pso_whole_warm:.1f} s, "
            f"{pw:.2f} s per exchange. The floor app on the same 4 nodes: {pf:.2f} s per "
            f"exchange (swarmjax {pe / pf:.2f}x and {pw / pf:.2f}x); the workers spent "
            f"{np.median(work_pso):.3f} s (median) per exchange. The floor app's whole "
            f"`flwr run` (its hello and the same 4 exchanges; no setup exchange, no JAX) took "
            f"{pso_floor_whole:.1f} s: swarmjax's warm run is {vs_floor:.2f}x "
            f"of it. Target (a run with the executables cached under 45 s): {verdict}.",
        ]
    if simulation is not None:
        (fed_rounds, fed_whole), sim_pso = simulation
        lines += [
            "",
            f"Flower's Simulation Runtime (`run_simulation`, ray {_version('ray')}; the "
            f"ClientApps in Ray actors that stay up between messages): FedAvg, 3 nodes, "
            f"{rounds} rounds, `flwr run` {fed_whole:.1f} s, seconds per round "
            f"{np.round(fed_rounds, 2).tolist()}"
            + (
                f"; Fed-DP-PSO, 4 nodes, 2 rounds, `flwr run` {sim_pso[1]:.1f} s, rounds "
                f"{np.round(sim_pso[0], 2).tolist()}."
                if sim_pso is not None
                else "."
            ),
        ]
    elif not args.no_simulation:
        lines += ["", "Flower's Simulation Runtime: skipped (Ray is not installed)."]
    text = "\n".join(lines)
    print(text)
    if args.write:
        write_section("flower_round", text)


if __name__ == "__main__":
    main()
