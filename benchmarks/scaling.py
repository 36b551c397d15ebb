"""Clients trained per second against devices: one run's cohort over a ``clients`` mesh
(issue 48, item 4; docs/scaling.md).

Two workloads, FedAvg through :func:`swarmjax.fl.runtime.start`/``advance`` as a user runs it,
clients mapped as the device chooses (one at a time on a CPU, vmapped on an accelerator):

* ``vs_pfl``: the vs_pfl work (:mod:`benchmarks.vs_pfl`): 1,200 MNIST users of 50 rows in a
  flat ClientStore, pfl's ``simple_cnn``, 1 local epoch of SGD at batch 10;
* ``shakespeare``: the character LSTM of :mod:`experiments.shakespeare` on its roles
  (``--quick``: that experiment's quick profile, 2 plays and a 16-unit LSTM; otherwise its
  default profile, the paper's 2 x 256 LSTM on 80-character windows).

For each device count ``d`` of ``--devices`` (the first must be 1: the baseline, measured in
the same invocation) it times **weak** scaling (a cohort of ``--per-device x d`` clients)
and **strong** scaling (a fixed cohort of ``--per-device x max(--devices)``). ``d = 1`` runs
without a mesh (today's program); ``d > 1`` on ``clients_mesh(d)``. Time: the median of
``--rounds`` one-round ``advance`` calls after the first (which compiles). Printed ratios:
strong, the overhead ``T_d / T_1`` at equal total work and the parallel efficiency
``T_1 / (d T_d)``; weak, the efficiency ``T_1(c) / T_d(c d)`` (1.0: flat round times).

Devices: the ones present. On a CPU with fewer present than ``max(--devices)``, the script
re-runs itself once in a subprocess with
``XLA_FLAGS=--xla_force_host_platform_device_count=max(--devices)`` (set before JAX starts
there), so every count is measured in one process. CPU virtual devices share the machine's
cores: they show the mesh's overhead, not a speed-up beyond the physical cores.

``python -m benchmarks.scaling [--quick] [--devices 1 2 4] [--write]``: ``--write`` writes
the ``scaling-<device>`` section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import _cli as _bcli
from experiments import _cli

WORKLOADS = ("vs_pfl", "shakespeare")
_CHILD = "SWARMJAX_SCALING_CHILD"  # set in the re-run: never re-run twice


@dataclasses.dataclass(frozen=True)
class Timing:
    """One measured configuration.

    Attributes:
        workload: ``"vs_pfl"`` or ``"shakespeare"``.
        mode: ``"weak"`` or ``"strong"``.
        devices: devices on the ``clients`` axis (1: no mesh).
        cohort: clients trained per round.
        seconds: median wall seconds of one compiled round.
        layout: :func:`swarmjax.fl.runtime.mesh.describe`'s line.
    """

    workload: str
    mode: str
    devices: int
    cohort: int
    seconds: float
    layout: str

    @property
    def clients_per_second(self) -> float:
        """Clients trained per second (``cohort / seconds``)."""
        return self.cohort / self.seconds


def workload(name: str, quick: bool, data_dir: Path, cohort: int):
    """``(algorithm, store, test set, grid values)`` of ``name`` with ``cohort`` clients a
    round (a fixed cohort drawn uniformly; the round's evaluation in the device's chunks,
    :func:`swarmjax.device.default_eval_batch`)."""
    from swarmjax.device import default_eval_batch
    from swarmjax.fl.algorithms import registry
    from swarmjax.fl.client.training import LocalTraining
    from swarmjax.fl.protocol import RunSpec

    if name == "vs_pfl":
        from benchmarks import vs_pfl

        store, _, ds = vs_pfl.load_work(str(data_dir))
        run = registry.CrossDeviceRun(
            vs_pfl.model(),
            vs_pfl.USERS,
            cohort,
            RunSpec(1, 1.0 / vs_pfl.USERS, (0,)),
            LocalTraining(epochs=1, batch_size=10, optimizer="sgd"),
            learning_rate=0.1,
            server_lr=1.0,
            eval_batch_size=default_eval_batch(),
        )
        alg, grid = registry.cross_device("fedavg", run)
        return alg, store, (ds.x_test[:250], ds.y_test[:250]), grid
    from experiments import shakespeare

    prof = shakespeare.PROFILES["quick" if quick else "default"]
    prof = dataclasses.replace(prof, cohort=cohort)
    fed, pick = shakespeare.federation(prof, data_dir)
    store, test, _ = shakespeare.clients_and_test(prof, fed, pick)
    _, alg, grid = shakespeare.algorithm("fedavg", prof, store)
    return alg, store, test, grid


def measure(name: str, quick: bool, data_dir: Path, cohort: int, devices: int, rounds: int):
    """One configuration: ``(median seconds per round, layout line)`` over ``rounds`` timed
    one-round calls after a compiling one."""
    from swarmjax.fl.protocol import RunSpec, Variants
    from swarmjax.fl.runtime import Execution, advance, start
    from swarmjax.fl.runtime.mesh import clients_mesh, describe
    from swarmjax.fl.runtime.simulator import slot_buffer, splits_data
    from swarmjax.privacy.secret import Secret

    alg, store, test, grid = workload(name, quick, data_dir, cohort)
    variants = Variants.grid(alg, store, RunSpec(rounds + 1, 1e-5), **grid)
    mesh = None if devices == 1 else clients_mesh(devices)
    execution = Execution(client_map=None, mesh=mesh)
    run = start(
        alg, store, test, variants, secret=Secret.from_bytes(bytes(32)), execution=execution
    )
    times = []
    for _ in range(rounds + 1):
        t0 = time.perf_counter()
        run, _ = advance(run, 1)  # returns host values: the round has finished
        times.append(time.perf_counter() - t0)
    n = store.num_clients
    line = describe(mesh, slot_buffer(alg, n), n, data_split=splits_data(store))
    return statistics.median(times[1:]), line


def ratios(timings: list[Timing]) -> list[str]:
    """One line per workload, mode and device count > 1: overhead and parallel efficiency
    against the same invocation's 1-device run."""
    lines = []
    for t in timings:
        if t.devices == 1:
            continue
        if t.mode == "strong":
            base = next(
                b for b in timings if (b.workload, b.mode, b.devices) == (t.workload, "strong", 1)
            )
            over = t.seconds / base.seconds
            lines.append(
                f"{t.workload} strong, {t.devices} devices, cohort {t.cohort}: overhead "
                f"{over:.3f}x the 1-device round at equal total work, parallel efficiency "
                f"{base.seconds / (t.devices * t.seconds):.1%}"
            )
        else:
            base = next(
                b for b in timings if (b.workload, b.mode, b.devices) == (t.workload, "weak", 1)
            )
            lines.append(
                f"{t.workload} weak, {t.devices} devices, cohort {base.cohort} -> {t.cohort}: "
                f"weak-scaling efficiency {base.seconds / t.seconds:.1%} (round time "
                f"{t.seconds / base.seconds:.3f}x the 1-device one)"
            )
    return lines


def report(timings: list[Timing], args: argparse.Namespace, machine: str) -> str:
    """The markdown section: the table, the ratios and what the device can show."""
    table = [
        "| workload | scaling | devices | cohort | s / round (median) | clients / s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for t in timings:
        table.append(
            f"| {t.workload} | {t.mode} | {t.devices} | {t.cohort} | {t.seconds:.3f} | "
            f"{t.clients_per_second:.1f} |"
        )
    argv = " ".join(sys.argv[1:]) if args.argv is None else " ".join(args.argv)
    return "\n".join(
        [
            f"## scaling ({args.slug})",
            "",
            f"`python -m benchmarks.scaling {argv}` on {machine}: FedAvg, clients mapped as "
            f"the device chooses, {args.rounds} timed rounds after a compiling one (median); "
            f"{args.per_device} clients per device.",
            "",
            *table,
            "",
            *[f"* {line}" for line in ratios(timings)],
            *([] if args.slug != "cpu-cpu" else ["", cpu_note(max(args.devices))]),
        ]
    )


def cpu_note(devices: int) -> str:
    """What CPU virtual devices can show: they share the machine's cores (and its memory),
    so ``devices`` of them run at most ``min(devices, cores)`` clients at once."""
    cores = os.cpu_count() or 1
    return (
        f"CPU virtual devices (`--xla_force_host_platform_device_count`) share this machine's "
        f"{cores} cores: {devices} of them run at most {min(devices, cores)} clients at once, "
        "and a 1-device run already uses every core for its intra-op work, so these figures "
        "show the mesh's overhead (a strong overhead near or below 1.0x), not a speed-up "
        f"beyond {cores} cores. A round includes the per-round test evaluation, a fixed "
        "cost that does not grow with the cohort (it flatters weak scaling). Load average "
        "at the end: "
        f"{os.getloadavg()[0]:.1f} (the machine is shared)."
    )


def _parser() -> argparse.ArgumentParser:
    p = _bcli.parser("scaling", __doc__.split("\n\n")[0], writes="scaling-<device>")
    p.add_argument("--quick", action="store_true", help="Shakespeare's quick profile")
    p.add_argument(
        "--devices",
        nargs="+",
        type=_cli.count("--devices"),
        default=None,
        help="device counts, the first 1 (default: 1 2)",
    )
    p.add_argument(
        "--per-device",
        type=_cli.count("--per-device"),
        default=None,
        help="clients per device in the weak runs (quick 2, default 8)",
    )
    p.add_argument(
        "--rounds", type=_cli.count("--rounds"), default=3, help="timed rounds (3), median"
    )
    p.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    p.add_argument(
        "--data-dir",
        help="holds mnist/ and shakespeare/ (default: $SWARMJAX_DATA, else ~/.cache/swarmjax/data)",
    )
    return p


def _checked(argv: list[str] | None) -> tuple[argparse.Namespace, Path]:
    """The options, checked before any work (one line each on bad input)."""
    args = _parser().parse_args(argv)
    args.argv = argv
    args.devices = args.devices or [1, 2]
    args.per_device = args.per_device or (2 if args.quick else 8)
    if args.devices[0] != 1 or sorted(set(args.devices)) != args.devices:
        raise _cli.UserError(
            f"--devices {' '.join(map(str, args.devices))}: must start at 1 (the baseline) "
            "and increase"
        )
    from benchmarks.vs_pfl import USERS

    cohort = args.per_device * max(args.devices)
    if "vs_pfl" in args.workloads and cohort > USERS:
        raise _cli.UserError(
            f"--per-device {args.per_device} x {max(args.devices)} devices = {cohort} "
            f"clients a round exceeds the vs_pfl work's {USERS} users"
        )
    data_dir = _cli.data_dir(args.data_dir)
    if "vs_pfl" in args.workloads:
        _cli.load_dataset("mnist", data_dir, _cli.data_source(args))
    if "shakespeare" in args.workloads:
        _cli.data_dir(args.data_dir, ["shakespeare"])
    return args, data_dir


@_cli.entry_point
def main(argv: list[str] | None = None) -> None:
    args, data_dir = _checked(argv)
    import jax

    present, top = jax.device_count(), max(args.devices)
    if top > present and jax.default_backend() != "cpu":
        raise _cli.UserError(
            f"--devices {top}: {present} {jax.default_backend()} device(s) present"
        )
    if top > present:  # CPU: virtual devices exist only if XLA is told before JAX starts
        if os.environ.get(_CHILD):
            raise _cli.UserError(f"--devices {top}: XLA_FLAGS gave only {present} CPU devices")
        flags = os.environ.get("XLA_FLAGS", "")
        env = os.environ | {
            _CHILD: "1",
            "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={top}".strip(),
        }
        argv = sys.argv[1:] if argv is None else argv
        code = subprocess.run(
            [sys.executable, "-m", "benchmarks.scaling", *argv], env=env, check=False
        ).returncode
        raise SystemExit(code)
    from benchmarks._results import device_slug, machine, write_section

    args.slug = device_slug()
    timings = []
    for name in args.workloads:
        for mode in ("weak", "strong"):
            for d in args.devices:
                cohort = args.per_device * (d if mode == "weak" else top)
                if mode == "strong" and d == 1 and top == 1:
                    continue  # the weak 1-device run: the same cohort
                seconds, layout = measure(name, args.quick, data_dir, cohort, d, args.rounds)
                t = Timing(name, mode, d, cohort, seconds, layout)
                timings.append(t)
                print(
                    f"{name} {mode}: {layout}; {seconds:.3f} s/round, "
                    f"{t.clients_per_second:.1f} clients/s",
                    flush=True,
                )
    text = report(timings, args, machine())
    print(text)
    if args.write:
        write_section(f"scaling-{args.slug}", text)


if __name__ == "__main__":
    main()
