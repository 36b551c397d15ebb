"""DP-FTRL beside DP-FedAvg and pfl 0.6's banded matrix-factorization DP-FTRL, on
``benchmarks.vs_pfl``'s cross-device work (issue 36, point 4).

Work: 1,200 users of 50 MNIST rows, cohorts of 50, 1 local epoch of SGD (lr 0.1, batch 10),
central SGD lr 1.0 on the mean delta, ``simple_cnn``, user-level clip 0.4 (fixed), delta
1/1200, at each ``--epsilons`` (default 2 and 8), over ``--rounds`` rounds (default 120).
Runs, each at every epsilon:

* swarmjax **DP-FedAvg**: Poisson cohorts at rate 50/1200 (amplified), PLD-calibrated,
  the buffer its plan sizes (``vs_pfl``'s DP run);
* swarmjax **DP-FTRL** for each ``--factorizations`` (default ``blt`` and ``banded``):
  the users in a fixed cycle (``schedule="cyclic"``), so each participates every
  ``b = 1200 / 50 = 24`` rounds, ``k = ceil(rounds / 24)`` times (5 at 120 rounds); no
  amplification; the strategy and its min-separation sensitivity from jax-privacy;
* pfl **banded MF** (``BandedMatrixFactorizationMechanism``, min separation 24, users in
  pfl's ``minimize_reuse`` cycle, PLD over the ``k`` participations), in pfl's own
  interpreter (``--pfl-python``).

Reported for each: test accuracy on the whole test set after the run, seconds per round
(swarmjax: a second, compiled run of the same program, over its rounds; the first run's
wall time, compilation and the strategy's optimisation included, beside it; pfl: its
median round after the first), the accounted epsilon and noise multiplier, the
participations ``k`` and the bytes of noise state the server holds between rounds (swarmjax:
the noise generator's state; pfl: its strategy matrix and the last noises it keeps).

``python -m benchmarks.vs_pfl_ftrl [--rounds 120] [--epsilons 2 8] [--write]`` prints a
table, saves ``results/vs_pfl_ftrl.json`` and, with ``--write``, its section of
benchmarks/RESULTS.md (named by the device off the CPU).
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import jax
import numpy as np

from benchmarks import _cli as _bcli
from benchmarks._results import device_slug, machine, write_section
from benchmarks.vs_pfl import (
    CLIP,
    COHORT,
    DEFAULT_PFL_PYTHON,
    ROWS,
    USERS,
    algorithm,
    dp_config,
    load_work,
    model,
    run_pfl,
)
from experiments import _cli
from experiments._report import write_json
from swarmjax.fl.algorithms import registry
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.private import Private
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import Execution, simulate
from swarmjax.models import evaluate
from swarmjax.privacy.ftrl import FACTORIZATIONS

SEPARATION = USERS // COHORT  # 24: a user's turn in the cycle comes every 24 rounds


def ftrl_algorithm(factorization: str, rounds: int, epsilon: float) -> tuple[Private, dict]:
    """``(DP-FTRL for the run, grid values)`` from the algorithm registry: the users in a
    fixed cycle, fixed clip 0.4, the rest as ``vs_pfl``'s DP-FedAvg."""
    run = registry.CrossDeviceRun(
        model(),
        USERS,
        COHORT,
        RunSpec(rounds, 1.0 / USERS, (0,), accountant="pld"),
        LocalTraining(epochs=1, batch_size=10, optimizer="sgd"),
        epsilon=epsilon,
        learning_rate=0.1,
        server_lr=1.0,
        clip=CLIP,
        eval_batch_size=250,
        options={"factorization": factorization, "schedule": "cyclic"},
    )
    return registry.cross_device("dp-ftrl", run)


def _bytes(tree) -> int:
    return int(sum(np.asarray(leaf).nbytes for leaf in jax.tree.leaves(tree)))


def run_ours(store, tests, rounds: int, epsilon: float, mechanism: str, block) -> dict:
    """One swarmjax run: ``mechanism`` ``"dp-fedavg"`` or a DP-FTRL factorization. Runs the
    same compiled program twice: the second run's wall time over its rounds is the seconds
    per round; the first's (the build, compilation and, for DP-FTRL, the strategy's
    optimisation by jax-privacy, cached for the second) is kept. The participations ``k``
    and the noise state are the plan's (none for DP-FedAvg's i.i.d. noise)."""
    round_test, full_test = tests
    spec = RunSpec(rounds, 1.0 / USERS, (0,), accountant="pld")
    t0 = time.perf_counter()
    if mechanism == "dp-fedavg":
        alg, grid = algorithm({**dp_config(rounds, "pld"), "epsilon": epsilon})
    else:
        alg, grid = ftrl_algorithm(mechanism, rounds, epsilon)
    setup = time.perf_counter() - t0

    def once(progress: bool):
        variants = Variants.grid(alg, store, spec, **grid)
        t, c = time.perf_counter(), time.process_time()
        execution = Execution(client_map=block, progress=progress)
        res = simulate(alg, store, round_test, variants, execution=execution)
        jax.block_until_ready(res.server.params)
        return time.perf_counter() - t, time.process_time() - c, res

    first, _, _ = once(progress=True)
    wall, cpu, res = once(progress=False)
    params = jax.tree.map(lambda a: a[0], res.server.params)
    _, acc = evaluate(model().apply, params, *full_test, batch_size=1000)
    plan = res.server.plan  # the plan's state: accounted z, noise state (BLT buffers or none)
    return {
        "system": "swarmjax",
        "mechanism": mechanism,
        "epsilon_target": epsilon,
        "rounds": rounds,
        "seconds_per_round": wall / rounds,
        "cpu_seconds_per_round": cpu / rounds,
        "first_run_s": first + setup,
        "accuracy": float(acc),
        "epsilon": float(res.privacy.final_epsilon.max()),
        "noise_multiplier": float(np.asarray(plan.noise_multiplier).reshape(-1)[0]),
        "participations": alg.plan.settings(USERS, rounds).get("max_participations"),
        "noise_state_bytes": _bytes(plan.noise),
        "load": os.getloadavg()[0],
    }


def run_theirs(python, indices, ds, rounds: int, epsilon: float, workdir: Path) -> dict:
    """pfl's banded MF at ``epsilon`` (its median round after the first)."""
    r = run_pfl(python, indices, ds, rounds, True, workdir, epsilon=epsilon, mechanism="banded_mf")
    return {
        "system": "pfl",
        "mechanism": "banded_mf",
        "epsilon_target": epsilon,
        "rounds": rounds,
        "seconds_per_round": float(np.median(r["round_times"][1:])),
        "cpu_seconds_per_round": float(np.median(r["round_cpu_times"][1:])),
        "first_run_s": r["total_s"],
        "accuracy": r["accuracy"],
        "epsilon": r["epsilon"],
        "noise_multiplier": r["noise_multiplier"],
        "participations": r.get("participations"),
        "noise_state_bytes": r.get("noise_state_bytes"),
        "torch": r.get("torch"),
        "device": r.get("device"),
        "load": r["load"],
    }


def summary_lines(results: list[dict]) -> list[str]:
    """For each epsilon: DP-FTRL's speed against DP-FedAvg's and its accuracy against
    DP-FedAvg's and pfl's banded MF (the issue's two targets), one line each."""
    lines = []
    for eps in sorted({r["epsilon_target"] for r in results}):
        at = {
            (r["mechanism"] if r["system"] == "swarmjax" else "pfl"): r
            for r in results
            if r["epsilon_target"] == eps
        }
        fedavg, pfl = at.get("dp-fedavg"), at.get("pfl")
        for name, r in at.items():
            if name in ("dp-fedavg", "pfl"):
                continue
            parts = [f"epsilon {eps:g}, DP-FTRL {name}"]
            if fedavg:
                slow = r["seconds_per_round"] / fedavg["seconds_per_round"]
                gap = 100 * (r["accuracy"] - fedavg["accuracy"])
                parts.append(f"{slow:.2f}x DP-FedAvg's seconds per round (target <= 1.1x)")
                parts.append(f"accuracy {gap:+.2f} points against DP-FedAvg")
            if pfl:
                gap = 100 * (r["accuracy"] - pfl["accuracy"])
                parts.append(f"{gap:+.2f} points against pfl's banded MF (target >= -1)")
            lines.append(", ".join(parts))
    return lines


def report(results: list[dict], argv: list[str] | None, name: str) -> str:
    """The RESULTS.md section: every run, then the targets line by line."""
    command = " ".join(["python -m benchmarks.vs_pfl_ftrl", *(argv or sys.argv[1:])])
    pfl = next((r for r in results if r["system"] == "pfl"), {})
    rows = [
        "| system | mechanism | epsilon target | rounds | k | s / round | first run s "
        "| CPU s / round | test accuracy | epsilon | noise multiplier | noise state MB | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        k = r["participations"] if r["participations"] is not None else "-"
        mb = "-" if r["noise_state_bytes"] is None else f"{r['noise_state_bytes'] / 2**20:.1f}"
        rows.append(
            f"| {r['system']} | {r['mechanism']} | {r['epsilon_target']:g} | {r['rounds']} | {k} "
            f"| {r['seconds_per_round']:.3f} | {r['first_run_s']:.1f} "
            f"| {r['cpu_seconds_per_round']:.3f} | {r['accuracy']:.2%} | {r['epsilon']:.3f} "
            f"| {r['noise_multiplier']:.4f} | {mb} | {r['load']:.1f} |"
        )
    return "\n".join(
        [
            f"## {name}",
            "",
            f"`{command}` on {machine()}; pfl 0.6 with PyTorch {pfl.get('torch', '?')} (on "
            f"{pfl.get('device', '?')}). {USERS:,} users of {ROWS} MNIST rows, cohorts of "
            f"{COHORT}, 1 local epoch of batch 10, simple_cnn, fixed clip {CLIP}, delta "
            f"1/{USERS}. DP-FTRL and pfl's banded MF: users in a fixed cycle, min separation "
            f"{SEPARATION}, k participations, no amplification; DP-FedAvg: Poisson cohorts at "
            f"rate {COHORT}/{USERS}, amplified. swarmjax's s / round: a second, compiled run "
            "over its rounds (first run s: the first run, compilation and the strategy's "
            "optimisation included); pfl's: its median round after the first.",
            "",
            *rows,
            "",
            *[f"- {line}" for line in summary_lines(results)],
        ]
    )


@_cli.entry_point
def main(argv: list[str] | None = None) -> None:
    p = _bcli.parser("vs_pfl_ftrl", __doc__.split("\n\n")[0], writes="vs_pfl_ftrl")
    p.add_argument(
        "--data-dir", help="holds mnist/ (default: $SWARMJAX_DATA, else ~/.cache/swarmjax/data)"
    )
    p.add_argument(
        "--rounds",
        type=_cli.count("--rounds", SEPARATION),
        default=120,
        help=f"rounds of every run (120: each user participates 5 times, every {SEPARATION})",
    )
    p.add_argument(
        "--epsilons",
        type=_cli.epsilon_target("--epsilons"),
        nargs="+",
        default=[2.0, 8.0],
        help="user-level epsilons (2 8)",
    )
    p.add_argument(
        "--factorizations",
        nargs="+",
        choices=FACTORIZATIONS,
        default=["blt", "banded"],
        help="swarmjax's DP-FTRL factorizations (blt banded)",
    )
    p.add_argument("--no-fedavg", action="store_true", help="skip swarmjax's DP-FedAvg runs")
    p.add_argument("--block", type=_cli.count("--block"), default=None, help="clients per block")
    p.add_argument("--round-test", type=_cli.count("--round-test"), default=100)
    p.add_argument("--pfl-python", default=DEFAULT_PFL_PYTHON, help="'' to skip pfl")
    p.add_argument(
        "--out",
        default=str(_cli.RESULTS / "vs_pfl_ftrl.json"),
        help="the runs as JSON (results/vs_pfl_ftrl.json)",
    )
    a = p.parse_args(argv)
    if a.pfl_python and not Path(a.pfl_python).exists():
        p.error(f"--pfl-python {a.pfl_python} does not exist (pass '' to skip pfl)")
    if a.write and not a.pfl_python:
        p.error("--write records swarmjax beside pfl; --pfl-python '' skips pfl")
    out = _cli.out_file(a)
    source = "--data-dir" if "data_dir" in _cli.given(a) else "the data folder"
    a.data_dir = _cli.data_dir(a.data_dir)
    _cli.load_dataset("mnist", a.data_dir, source)
    store, indices, ds = load_work(a.data_dir)
    tests = ((ds.x_test[: a.round_test], ds.y_test[: a.round_test]), (ds.x_test, ds.y_test))
    k = math.ceil(a.rounds / SEPARATION)
    print(f"{a.rounds} rounds: each user participates k={k} times, every {SEPARATION} rounds")
    mechanisms = ([] if a.no_fedavg else ["dp-fedavg"]) + list(a.factorizations)
    results: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for eps in a.epsilons:
            theirs = partial(run_theirs, a.pfl_python, indices, ds, a.rounds, eps, Path(tmp))
            runs = [theirs] if a.pfl_python else []
            runs += [partial(run_ours, store, tests, a.rounds, eps, m, a.block) for m in mechanisms]
            for run in runs:
                results.append(run())
                print(_line(results[-1]), flush=True)
                write_json(out, {"runs": results})  # after every run: a cut run keeps its rows
    for line in summary_lines(results):
        print(line)
    print(f"wrote {out}")
    if a.write:
        name = "vs_pfl_ftrl" + ("" if jax.default_backend() == "cpu" else f"-{device_slug()}")
        write_section(name, report(results, argv, name))
        print(f"wrote the {name} section of benchmarks/RESULTS.md")


def _line(r: dict) -> str:
    return (
        f"{r['system']:8s} {r['mechanism']:10s} eps={r['epsilon_target']:<4g} "
        f"{r['seconds_per_round']:.3f} s/round (first run {r['first_run_s']:.1f} s) "
        f"acc={r['accuracy']:.4f} epsilon={r['epsilon']:.3f} z={r['noise_multiplier']:.4f} "
        f"k={r['participations']} state={r['noise_state_bytes']} B load={r['load']:.1f}"
    )


if __name__ == "__main__":
    main()
