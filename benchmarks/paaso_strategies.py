"""PAASO strategies' throughput, each beside PSO in the same run.

    python -m benchmarks.paaso_strategies [--runs 1000] [--iterations 1000] [--write]

One jit(vmap) of ``paaso.run`` per strategy over ``--runs`` runs of 50 agents on f4
(w 0.7, phi 1.4, wG 0.1, p_m 0.9), sharded over every device (on the CPU,
``--cpu-devices``).  Voting strategies run twice: with ``p_c = 1`` declared
(``draw_casts=False``: what the sweep task uses for the paper's grids) and with the ``s``
casting uniforms drawn every iteration (any ``p_c``).  Timings interleave the variants
(best of ``--repeats``), so the ratios to PSO compare like with like on a shared machine;
the backend and machine load are printed and written.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from benchmarks import _cli as _bcli
from experiments import _cli


def parse_args(argv=None) -> argparse.Namespace:
    p = _bcli.parser("paaso_strategies", __doc__, writes="paaso_strategies")
    count = _cli.count
    p.add_argument("--runs", type=count("--runs"), default=1000, help="runs (swarms) per strategy")
    p.add_argument("--iterations", type=count("--iterations"), default=1000, help="iterations")
    p.add_argument("--repeats", type=count("--repeats"), default=3, help="timed calls (best)")
    p.add_argument(
        "--cpu-devices",
        type=count("--cpu-devices"),
        default=min(os.cpu_count() or 1, 8),
        help="XLA CPU devices (default: the cores, at most 8; ignored on GPU/TPU)",
    )
    args = p.parse_args(argv)
    # per run: 50 agents' state and votes, and the per-iteration trace
    need = _cli.array_bytes((args.runs, 50, 24), (args.runs, args.iterations, 2))
    option = _cli.option_named(args, ["runs", "iterations"])
    _cli.check_memory(need, option, f"{args.runs} runs x {args.iterations} iterations")
    return args


def measure(
    runs: int, iterations: int, repeats: int, voting: tuple[str, ...] | None = None
) -> tuple[int, list[dict]]:
    """Every strategy's agent-steps/s beside PSO's, interleaved, best of ``repeats``
    (``voting``: the voting strategies to time, default all of ``paaso.VOTING``).

    Returns the runs timed (``runs`` rounded up to the device count) and one dict per
    variant: ``label``, ``rate`` (agent-steps/s), ``ratio`` (PSO's time / its time) and
    ``compile_s``."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from swarmjax import paaso

    ndev = jax.device_count()
    runs = -(-runs // ndev) * ndev
    sharding = NamedSharding(Mesh(np.asarray(jax.devices()), ("runs",)), PartitionSpec("runs"))
    seeds = jax.device_put(jnp.arange(runs, dtype=jnp.uint32), sharding)
    hyper = paaso.PAASOHyper(w=0.7, phi_p=1.4, phi_g=1.4, w_g=0.1, p_c=1.0, p_m=0.9)
    variants = [("pso", {"strategy": "pso"}), ("fl", {"strategy": "fl"})]
    for s in paaso.VOTING if voting is None else voting:
        variants += [
            (s, {"strategy": s, "draw_casts": False}),
            (f"{s}, casts drawn", {"strategy": s}),
        ]
    fns = {}
    for label, kw in variants:
        cfg = paaso.PAASOConfig(function="f4", iterations=iterations, **kw)
        fn = jax.jit(
            jax.vmap(lambda k, c=cfg: paaso.run(jax.random.key(k), c, hyper)["final_objective"])
        )
        t0 = time.perf_counter()
        fn(seeds).block_until_ready()
        fns[label] = (fn, time.perf_counter() - t0)
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for label, (fn, _) in fns.items():
            t0 = time.perf_counter()
            fn(seeds).block_until_ready()
            best[label] = min(best[label], time.perf_counter() - t0)
    steps = runs * 50 * iterations
    rows = []
    for label, (_, compile_s) in fns.items():
        rate = steps / best[label]
        ratio = best["pso"] / best[label]
        print(f"{label:20s} {rate / 1e6:8.1f} M agent-steps/s  x{ratio:.2f} of PSO", flush=True)
        rows.append(dict(label=label, rate=rate, ratio=ratio, compile_s=compile_s))
    return runs, rows


def table(rows: list[dict]) -> list[str]:
    """The markdown table of :func:`measure`'s rows."""
    lines = ["| strategy | M agent-steps/s | / PSO | compile s |", "|---|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['rate'] / 1e6:.1f} | {r['ratio']:.2f} | {r['compile_s']:.1f} |"
        )
    return lines


@_cli.entry_point
def main(argv=None) -> int:
    args = parse_args(argv)
    from swarmjax.device import configure_cpu_flags

    if not configure_cpu_flags(args.cpu_devices):
        _bcli.warn_unused(args, ["cpu_devices"], "the backend is not the CPU")
    import jax

    from benchmarks._results import machine, write_section

    print(f"backend: {jax.default_backend()} ({jax.device_count()} device(s))", flush=True)
    ndev = jax.device_count()
    load_before = os.getloadavg()[0]
    runs, rows = measure(args.runs, args.iterations, args.repeats)
    text = (
        "## paaso_strategies (`python -m benchmarks.paaso_strategies"
        f" --runs {args.runs} --iterations {args.iterations}`)\n\n"
        f"Machine: {machine()}; {ndev} XLA device(s); load average before the run "
        f"{load_before:.2f}, after {os.getloadavg()[0]:.2f}.\n"
        f"{runs} runs x 50 agents x {args.iterations} iterations on f4 per strategy, one "
        f"jit(vmap) each, best of {args.repeats} interleaved calls.\n\n" + "\n".join(table(rows))
    )
    print(text)
    if args.write:
        write_section("paaso_strategies", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
