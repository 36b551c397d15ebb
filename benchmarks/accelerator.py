"""Measure a machine: swarmjax on whatever backend JAX runs on (CPU, GPU, TPU), with its
peers beside it where they can run there.

    python -m benchmarks.accelerator                    # this backend's default sizes
    python -m benchmarks.accelerator --quick            # smoke run, well under 2 min on a CPU
    python -m benchmarks.accelerator --sections pso,dpsgd

Sections (``--sections``, comma-separated; default: all but ``paaso`` on the CPU, all on
GPU/TPU):

* ``pso``: PSO agent-steps/s (50 agents, f4) at 10^3 .. 10^6 swarms (CPU: up to 10^5),
  numpy and evosax's vmapped PSO beside it (``benchmarks.pso_throughput.measure``);
* ``voting``: every PAASO strategy beside PSO (``benchmarks.paaso_strategies.measure``);
* ``paaso``: wall seconds of ``python -m experiments.paaso --full`` in a fresh process
  (about 4-5 minutes on the project's 2-core CPU, so only when named there);
* ``dpsgd``: the DP-SGD step of the MLP and LeNet-5 at batch 64 .. 1024, non-DP and
  Opacus (hooks, ghost clipping) beside it when torch and opacus are installed
  (``benchmarks.dpsgd_overhead.measure``);
* ``fedround``: one FedAvg round (digits, an MLP, 10 clients) through
  ``swarmjax.fl.runtime.simulate``, clients under ``vmap`` and ``lax.map``.

Prints its report; ``--write`` writes it as the section
``accelerator-<backend>-<device kind>`` (``...-quick`` for ``--quick``) of
benchmarks/RESULTS.md, one per kind of machine, so CPU and GPU figures stand side by side;
every figure names its backend and device.  Peers that are not installed are reported as
such, never an error.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks import _cli as _bcli
from experiments import _cli

SECTIONS = ("pso", "voting", "paaso", "dpsgd", "fedround")
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Sizes:
    """What each section runs: swarm counts and iterations (``pso``), runs and iterations
    (``voting``), batch sizes (``dpsgd``), clients (``fedround``), timed repeats (best of);
    ``voting_strategies``: the voting strategies timed beside PSO and FL (None: all);
    ``naive``: also time the DP step's naive ``vmap(grad)`` path."""

    swarms: tuple[int, ...]
    pso_iterations: int
    voting_runs: int
    voting_iterations: int
    batches: tuple[int, ...]
    clients: int
    repeats: int
    voting_strategies: tuple[str, ...] | None = None
    naive: bool = True


SIZES = {
    "quick": Sizes((1_000,), 100, 200, 100, (64,), 10, 2, naive=False),
    "cpu": Sizes((1_000, 10_000, 100_000), 200, 1_000, 300, (64, 256, 1024), 10, 3),
    "accelerator": Sizes(
        (1_000, 10_000, 100_000, 1_000_000), 1_000, 100_000, 1_000, (64, 256, 1024), 50, 5
    ),
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = _bcli.parser("accelerator", __doc__, writes="accelerator-<backend>-<device>")
    p.add_argument(
        "--quick", action="store_true", help="small sizes, batch 64 only, no paaso --full"
    )
    p.add_argument("--sections", type=_sections, default=None, help=",".join(SECTIONS))
    p.add_argument(
        "--cpu-devices",
        type=_cli.count("--cpu-devices"),
        default=min(os.cpu_count() or 1, 8),
        help="XLA CPU devices (default: the cores, at most 8; ignored on GPU/TPU)",
    )
    return p.parse_args(argv)


def _sections(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [s for s in names if s not in SECTIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"choose from {','.join(SECTIONS)}; got {text!r}")
    return names


def default_sections(platform: str, quick: bool) -> tuple[str, ...]:
    """Every section, less ``paaso`` on the CPU or in ``--quick`` (minutes there)."""
    skip = {"paaso"} if quick or platform == "cpu" else set()
    return tuple(s for s in SECTIONS if s not in skip)


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def pso_section(sizes: Sizes) -> dict:
    """PSO at ``sizes.swarms`` (swarmjax, numpy, evosax when installed)."""
    from benchmarks import pso_throughput
    from swarmjax import device
    from swarmjax.paaso_sweep import PAASOTask

    cpu = device.is_cpu()
    per_run = PAASOTask().bytes_per_run({"iterations": sizes.pso_iterations})
    block = pso_throughput.BLOCK if cpu else device.block_size(per_run)
    rows = pso_throughput.measure(
        sizes.swarms,
        sizes.pso_iterations,
        block=block,
        peers=("numpy", "evosax"),
        evosax_swarms=1000 if cpu else None,
        repeats=sizes.repeats,
    )
    return {"rows": rows, "block": block, "evosax": _installed("evosax"), "cpu": cpu}


def voting_section(sizes: Sizes) -> dict:
    """Every PAASO strategy beside PSO."""
    from benchmarks import paaso_strategies

    runs, rows = paaso_strategies.measure(
        sizes.voting_runs, sizes.voting_iterations, sizes.repeats, sizes.voting_strategies
    )
    return {"runs": runs, "rows": rows}


def paaso_section(out: str | os.PathLike[str] | None = None, argv: Sequence[str] = ()) -> dict:
    """Wall seconds of ``python -m experiments.paaso --full`` (``argv`` appended) in a new
    process, with its own timing record (kernels, compilations); cold: no compiled program
    is loaded from a cache (``--jax-cache ''``), as on a user's first run."""
    with tempfile.TemporaryDirectory(prefix="paaso-full-") as tmp:
        folder = Path(out or tmp)
        cmd = [sys.executable, "-m", "experiments.paaso", "--full", "--no-progress"]
        cmd += ["--jax-cache", ""]
        cmd += ["--out", str(folder), *argv]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
        timing = json.loads((folder / "timing.json").read_text())
    print(f"paaso --full: {wall:.1f} s wall (process), {timing['kernel_s']:.1f} s kernels")
    return {"wall_s": wall, "timing": timing}


def dpsgd_section(sizes: Sizes) -> dict:
    """DP-SGD steps of the MLP and LeNet-5 at ``sizes.batches`` (Opacus when installed)."""
    from benchmarks import dpsgd_overhead

    opacus = _installed("torch") and _installed("opacus")
    if not opacus:
        print("Opacus: not installed (pip install torch opacus)", flush=True)
    rows = dpsgd_overhead.measure(sizes.batches, sizes.repeats, opacus=opacus, naive=sizes.naive)
    return {"rows": rows, "opacus": opacus, "torch_device": dpsgd_overhead.torch_device()}


def fedround_section(sizes: Sizes) -> dict:
    """Seconds per FedAvg round (``sizes.clients`` IID digits clients, MLP 64-32-10, one
    epoch of batch-32 SGD each) through the simulator, best of ``sizes.repeats`` after a
    compiling call, with clients under ``vmap`` and under ``lax.map`` ("sequential")."""
    from swarmjax import device
    from swarmjax.fl.algorithms import registry
    from swarmjax.fl.client.training import LocalTraining
    from swarmjax.fl.data import iid_partition, load_dataset, stack_clients
    from swarmjax.fl.protocol import RunSpec, Variants
    from swarmjax.fl.runtime import Execution, simulate
    from swarmjax.models import mlp

    data = load_dataset("digits")
    part = iid_partition(data.y_train, sizes.clients, seed=0)
    clients = stack_clients(data.x_train, data.y_train, part.indices)
    model, training = mlp((32,), 10, data.input_shape), LocalTraining(epochs=1, batch_size=32)
    base = registry.Base(model, training, RunSpec(1, 1e-5), sizes.clients)
    alg, grid = registry.build("fedavg", base, registry.settings("fedavg", learning_rate=0.3))
    variants = Variants.grid(alg, clients, base.spec, **grid)
    test = (data.x_test, data.y_test)
    seconds = {}
    for client_map in ("vmap", "sequential"):

        def once(cm=client_map):
            return simulate(alg, clients, test, variants, execution=Execution(client_map=cm))

        once()  # compile
        best = float("inf")
        for _ in range(sizes.repeats):
            t0 = time.perf_counter()
            result = once()
            best = min(best, time.perf_counter() - t0)
        seconds[client_map] = best
        accuracy = float(result.metrics["test_accuracy"][0, -1])
        print(f"FedAvg round, clients {client_map}: {1e3 * best:.1f} ms", flush=True)
    return {
        "seconds": seconds,
        "accuracy": accuracy,
        "clients": sizes.clients,
        "default": device.default_client_map(),
    }


def run(sections: Sequence[str], sizes: Sizes, *, paaso_argv: Sequence[str] = ()) -> dict:
    """Measure ``sections`` at ``sizes``; returns ``{section: its figures}`` plus
    ``"device"`` (backend, device kind and count) and ``"seconds"`` (wall per section)."""
    import jax

    from swarmjax import device

    results: dict = {
        "device": {
            "backend": jax.default_backend(),
            "kind": jax.devices()[0].device_kind,
            "count": jax.device_count(),
            "memory_gib": device.device_memory_bytes() / 2**30,
        },
        "seconds": {},
        "load": [os.getloadavg()[0]],
    }
    print(f"backend: {jax.default_backend()} ({jax.device_count()} device(s))", flush=True)
    for name in sections:
        t0 = time.perf_counter()
        if name == "paaso":
            results[name] = paaso_section(argv=paaso_argv)
        else:
            results[name] = globals()[f"{name}_section"](sizes)
        results["seconds"][name] = time.perf_counter() - t0
    results["load"].append(os.getloadavg()[0])
    return results


def section_name(results: dict, quick: bool = False) -> str:
    """``accelerator-<backend>-<device kind>`` (kind lower-cased, non-alphanumerics as -),
    ``-quick`` appended for ``--quick`` runs."""
    dev = results["device"]
    kind = re.sub(r"[^a-z0-9]+", "-", dev["kind"].lower()).strip("-")
    return f"accelerator-{dev['backend']}-{kind}" + ("-quick" if quick else "")


def _fmt(value: float | None, scale: float = 1e6, digits: int = 1) -> str:
    return "-" if value is None else f"{value / scale:.{digits}f}"


def section_text(
    results: dict, sizes: Sizes, command: str, machine_line: str, quick: bool = False
) -> str:
    """The markdown of RESULTS.md's section for these ``results``."""
    dev = results["device"]
    where = f"{dev['backend']}, {dev['count']} x {dev['kind']}"
    out = [
        f"## {section_name(results, quick)} (`{command}`)",
        "",
        f"Machine: {machine_line}; {dev['count']} XLA device(s), {dev['memory_gib']:.1f} GiB "
        f"per device; load average before the run {results['load'][0]:.2f}, after "
        f"{results['load'][-1]:.2f} (on a shared machine absolute rates follow the load).  "
        "Every figure "
        f"below: {where}, measured in this run (best of {sizes.repeats} after compilation).",
    ]
    if "pso" in results:
        from benchmarks import pso_throughput

        r = results["pso"]
        evosax = "evosax beside it" if r["evosax"] else "evosax: not installed"
        peers = "on min(swarms, 1000)" if r["cpu"] else "on every swarm"
        out += [
            "",
            f"### PSO ({where}): agent-steps/s, 50 agents x {sizes.pso_iterations} "
            f"iterations on f4; {evosax} ({peers}), numpy on min(swarms, 1000); "
            f"'in blocks': {r['block']} swarms per device per vmapped block under lax.map",
            "",
            *pso_throughput.table(r["rows"]),
        ]
    if "voting" in results:
        from benchmarks import paaso_strategies

        r = results["voting"]
        out += [
            "",
            f"### PAASO strategies beside PSO ({where}): {r['runs']} runs x 50 agents x "
            f"{sizes.voting_iterations} iterations on f4, one jit(vmap) each",
            "",
            *paaso_strategies.table(r["rows"]),
        ]
    if "paaso" in results:
        r, t = results["paaso"], results["paaso"]["timing"]
        out += [
            "",
            f"### `python -m experiments.paaso --full` ({where}): **{r['wall_s']:.1f} s** "
            f"wall for the process; pipeline {t['wall_s']:.1f} s, kernels "
            f"{t['kernel_s']:.1f} s, {t['compilations']} compilations in "
            f"{t['compile_s']:.1f} s, {t['runs_computed']:,} runs",
        ]
    if "dpsgd" in results:
        from benchmarks import dpsgd_overhead

        r = results["dpsgd"]
        opacus = "Opacus beside it" if r["opacus"] else "Opacus: not installed (n/a)"
        out += [
            "",
            f"### DP-SGD step (JAX: {where}; PyTorch/Opacus: {r['torch_device']}): one Adam "
            "step, float32, "
            f"clip 1, noise multiplier 1; {opacus}; ratios against the same framework's "
            "non-DP step",
            "",
            dpsgd_overhead.HEADER,
            *(dpsgd_overhead._row(*row) for row in r["rows"]),
        ]
    if "fedround" in results:
        r = results["fedround"]
        s = r["seconds"]
        out += [
            "",
            f"### FedAvg round through `swarmjax.fl.runtime.simulate` ({where}): digits, "
            f"{r['clients']} IID clients, MLP 64-32-10, one epoch of batch-32 SGD per client, "
            f"test accuracy {r['accuracy']:.3f} after the round",
            "",
            "| clients mapped by | ms per round | / vmap |",
            "|---|---:|---:|",
            *(
                f"| {cm}{' (this backend default)' if cm == r['default'] else ''} "
                f"| {1e3 * s[cm]:.1f} | {s[cm] / s['vmap']:.2f} |"
                for cm in ("vmap", "sequential")
            ),
        ]
    spent = ", ".join(f"{k} {v:.0f} s" for k, v in results["seconds"].items())
    out += ["", f"Wall time per section (compilation included): {spent}."]
    return "\n".join(out)


@_cli.entry_point
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from swarmjax.device import configure_cpu_flags

    cpu = configure_cpu_flags(args.cpu_devices)
    if not cpu:
        _bcli.warn_unused(args, ["cpu_devices"], "the backend is not the CPU")
    from benchmarks._results import machine, write_section

    sections = args.sections or default_sections("cpu" if cpu else "accelerator", args.quick)
    sizes = SIZES["quick" if args.quick else "cpu" if cpu else "accelerator"]
    results = run(sections, sizes)
    command = "python -m benchmarks.accelerator" + (" --quick" if args.quick else "")
    if args.sections:
        command += f" --sections {','.join(args.sections)}"
    text = section_text(results, sizes, command, machine(), args.quick)
    print(text)
    if args.write:
        # a run of some sections only keeps its own section beside the full run's
        name = section_name(results, args.quick)
        if args.sections and set(args.sections) != set(default_sections("accelerator", False)):
            name += "-" + "-".join(args.sections)
        write_section(name, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
