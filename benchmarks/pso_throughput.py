"""PSO throughput: agent-steps/s of swarmjax vs baselines measured in the same run.

    python -m benchmarks.pso_throughput [--quick] [--write]

Swarms of 50 agents x 1000 iterations on f4 (Rosenbrock, 2-D), w 0.7, c1 = c2 = 1.4,
velocity clamp = domain width, positions clipped.  swarmjax runs every swarm as one
jit-compiled, vmapped scan (``paaso.run`` with strategy "pso"), sharded over all devices
(on the CPU ``--cpu-devices``, default: every core).  Baselines: a vectorised numpy PSO written
here (all swarms in one array, numpy's PCG64 for r1/r2), and pyswarms / evosax when
installed (``pip install -e .[bench]``; evosax's PSO runs vmapped over swarms under jit, as
its users run it).  Writes its section of benchmarks/RESULTS.md with the machine load, since
absolute rates on a shared 2-core machine mean little when other jobs run.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

from benchmarks import _cli as _bcli
from experiments import _cli


def parse_args(argv=None) -> argparse.Namespace:
    p = _bcli.parser("pso_throughput", __doc__, writes="pso_throughput")
    p.add_argument("--quick", action="store_true", help="fewer swarms and iterations")
    p.add_argument(
        "--swarms", type=_cli.count("--swarms"), nargs="+", help="swarm counts to time (>= 1)"
    )
    p.add_argument(
        "--cpu-devices",
        type=_cli.count("--cpu-devices"),
        default=min(os.cpu_count() or 1, 8),
        help="XLA CPU devices (default: the cores, at most 8; ignored on GPU/TPU)",
    )
    args = p.parse_args(argv)
    counts = args.swarms or []
    # per swarm: positions, velocities, bests (and the numpy twin's copy) of AGENTS x 2
    need = _cli.array_bytes((max(counts, default=1), AGENTS, 2 * 8))
    _cli.check_memory(need, "--swarms", f"{max(counts, default=1)} swarms of {AGENTS} agents")
    return args


AGENTS, W, C = 50, 0.7, 1.4
BLOCK = 512  # swarms per device per block in the blocked variant


def numpy_pso(swarms: int, iterations: int, seed: int = 0) -> float:
    """Vectorised numpy PSO over (swarms, agents, 2); returns the mean final best."""
    import numpy as np

    rng = np.random.default_rng(seed)
    f = lambda x: 100.0 * (x[..., 1] - x[..., 0] ** 2) ** 2 + (x[..., 0] - 1.0) ** 2
    x = rng.uniform(-2, 2, (swarms, AGENTS, 2))
    v = np.zeros_like(x)
    p, pf = x.copy(), f(x)
    idx = pf.argmin(axis=1)
    g, gf = p[np.arange(swarms), idx], pf.min(axis=1)
    for _ in range(iterations):
        r1 = rng.random((swarms, AGENTS, 1))
        r2 = rng.random((swarms, AGENTS, 1))
        v = np.clip(W * v + C * r1 * (p - x) + C * r2 * (g[:, None] - x), -4.0, 4.0)
        x = np.clip(x + v, -2.0, 2.0)
        fx = f(x)
        better = fx < pf
        p[better], pf[better] = x[better], fx[better]
        idx = pf.argmin(axis=1)
        g, gf = p[np.arange(swarms), idx], pf.min(axis=1)
    return float(gf.mean())


def pyswarms_pso(swarms: int, iterations: int) -> float | None:
    try:
        import numpy as np
        import pyswarms as ps
    except ImportError:
        return None
    f = lambda x: 100.0 * (x[:, 1] - x[:, 0] ** 2) ** 2 + (x[:, 0] - 1.0) ** 2
    best = []
    for _ in range(swarms):  # pyswarms runs one swarm at a time
        opt = ps.single.GlobalBestPSO(
            AGENTS, 2, {"c1": C, "c2": C, "w": W}, bounds=(np.full(2, -2.0), np.full(2, 2.0))
        )
        cost, _ = opt.optimize(f, iters=iterations, verbose=False)
        best.append(cost)
    return float(np.mean(best))


def evosax_pso(swarms: int, iterations: int):
    """evosax's PSO (ask/tell in a scan, vmapped over swarms), or None if not installed.

    Returns a zero-argument callable that runs the compiled sweep and blocks, so that its
    compilation can be kept out of the timing.  Same f4, w, c1, c2 and domain; evosax has
    no clamps, so positions are clipped before evaluation only.
    """
    try:
        from evosax.algorithms import PSO
    except ImportError:
        return None
    import jax
    import jax.numpy as jnp

    f = lambda x: 100.0 * (x[..., 1] - x[..., 0] ** 2) ** 2 + (x[..., 0] - 1.0) ** 2
    pso = PSO(population_size=AGENTS, solution=jnp.zeros(2))
    params = pso.default_params.replace(inertia_coeff=W, cognitive_coeff=C, social_coeff=C)

    def one(key):
        k_init, k_state, k_loop = jax.random.split(key, 3)
        x = jax.random.uniform(k_init, (AGENTS, 2), minval=-2.0, maxval=2.0)
        state = pso.init(k_state, x, f(x), params)

        def body(state, k):
            k_ask, k_tell = jax.random.split(k)
            x, state = pso.ask(k_ask, state, params)
            x = jnp.clip(x, -2.0, 2.0)
            state, _ = pso.tell(k_tell, x, f(x), state, params)
            return state, None

        state, _ = jax.lax.scan(body, state, jax.random.split(k_loop, iterations))
        return state.best_fitness

    fn = jax.jit(jax.vmap(one))
    keys = jax.random.split(jax.random.key(0), swarms)
    return lambda: fn(keys).block_until_ready()


def measure(
    counts,
    iterations: int,
    *,
    block: int = BLOCK,
    peers: tuple[str, ...] = ("numpy", "pyswarms", "evosax"),
    evosax_swarms: int | None = 1000,
    repeats: int = 3,
) -> list[dict]:
    """Agent-steps/s of swarmjax's PSO at each swarm count in ``counts`` (``iterations``
    per swarm), with the ``peers`` measured in the same run: numpy on at most 1,000
    swarms, evosax on ``min(swarms, evosax_swarms)`` (all of them when None), pyswarms on
    at most 3.
    ``block``: swarms per device per vmapped block of the 'in blocks' variant (run when a
    device holds more).  One dict per count: ``swarms``, ``plain``, ``blocks`` (None when
    not run), ``rate`` (the faster), ``numpy``, ``pyswarms``, ``evosax`` (agent-steps/s,
    None when not installed or not asked) and ``compile_s`` (the first call: compilation
    plus one run)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from swarmjax import paaso

    cfg = paaso.PAASOConfig(strategy="pso", function="f4", num_agents=AGENTS, iterations=iterations)
    hyper = paaso.PAASOHyper(w=W, phi_p=C, phi_g=C, vmax_factor=1.0)
    ndev = jax.device_count()
    sharding = NamedSharding(Mesh(np.asarray(jax.devices()), ("runs",)), PartitionSpec("runs"))

    def one(seed):
        return paaso.run(jax.random.key(seed), cfg, hyper)["final_objective"]

    fn = jax.jit(jax.vmap(one))
    # Beyond ~1,000 swarms per device the working set leaves the CPU caches; running each
    # device's swarms in vmapped blocks of `block` under lax.map keeps it cache-sized.
    blocked = jax.jit(jax.vmap(lambda s: jax.lax.map(one, s, batch_size=block)))
    has_pyswarms = "pyswarms" in peers and importlib.util.find_spec("pyswarms") is not None
    rows = []
    for n in counts:
        padded = -(-n // ndev) * ndev
        seeds = jax.device_put(jnp.arange(padded, dtype=jnp.uint32), sharding)
        t0 = time.perf_counter()
        fn(seeds).block_until_ready()
        compile_s = time.perf_counter() - t0
        best = min(_timed(lambda s=seeds: fn(s).block_until_ready()) for _ in range(repeats))
        steps = n * AGENTS * iterations
        block_rate = None
        if n > ndev * block:
            per_dev = -(-n // (ndev * block)) * block
            grid = jnp.arange(ndev * per_dev, dtype=jnp.uint32).reshape(ndev, per_dev)
            grid = jax.device_put(grid, sharding)
            blocked(grid).block_until_ready()
            t_block = min(
                _timed(lambda g=grid: blocked(g).block_until_ready()) for _ in range(repeats)
            )
            block_rate = ndev * per_dev * AGENTS * iterations / t_block
        np_rate = ps_rate = ev_rate = None
        if "numpy" in peers:
            np_swarms = min(n, 1000)
            t_np = _timed(lambda k=np_swarms: numpy_pso(k, iterations))
            np_rate = np_swarms * AGENTS * iterations / t_np
        if has_pyswarms:
            ps_swarms = min(n, 3)
            t_ps = _timed(lambda k=ps_swarms: pyswarms_pso(k, iterations))
            ps_rate = ps_swarms * AGENTS * iterations / t_ps
        ev_swarms = n if evosax_swarms is None else min(n, evosax_swarms)
        ev_run = evosax_pso(ev_swarms, iterations) if "evosax" in peers else None
        if ev_run is not None:
            ev_run()  # compile
            ev_rate = ev_swarms * AGENTS * iterations / min(_timed(ev_run) for _ in range(2))
        plain = steps / best
        rate = max(plain, block_rate or 0.0)
        row = dict(
            swarms=n,
            plain=plain,
            blocks=block_rate,
            rate=rate,
            numpy=np_rate,
            pyswarms=ps_rate,
            evosax=ev_rate,
            compile_s=compile_s,
        )
        rows.append(row)
        print(
            f"{n:>6} swarms: swarmjax {plain / 1e6:8.1f} M agent-steps/s"
            + (f", in blocks {block_rate / 1e6:.1f}" if block_rate else "")
            + f" (first call, compile + run, {compile_s:.1f} s)"
            + (f" | numpy {np_rate / 1e6:6.1f} M/s (x{rate / np_rate:.1f})" if np_rate else "")
            + (f" | pyswarms {ps_rate / 1e6:.2f} M/s" if ps_rate else "")
            + (f" | evosax {ev_rate / 1e6:.1f} M/s" if ev_rate else ""),
            flush=True,
        )
    return rows


def table(rows: list[dict]) -> list[str]:
    """The markdown table of :func:`measure`'s rows."""
    lines = [
        "| swarms | swarmjax vmap M agent-steps/s | swarmjax in blocks M/s | numpy M/s "
        "| swarmjax / numpy | pyswarms M/s | evosax M/s | swarmjax / evosax "
        "| first call s (compile + run) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        rate, np_rate, ev_rate = r["rate"], r["numpy"], r["evosax"]
        block_txt = f"{r['blocks'] / 1e6:.1f}" if r["blocks"] else "-"
        np_txt = f"{np_rate / 1e6:.1f} | {rate / np_rate:.1f}" if np_rate else "- | -"
        ps_txt = f"{r['pyswarms'] / 1e6:.2f}" if r["pyswarms"] else "not installed"
        ev_txt = f"{ev_rate / 1e6:.1f} | {rate / ev_rate:.1f}" if ev_rate else "not installed | -"
        lines.append(
            f"| {r['swarms']} | {r['plain'] / 1e6:.1f} | {block_txt} | {np_txt} "
            f"| {ps_txt} | {ev_txt} | {r['compile_s']:.1f} |"
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
    iterations = 200 if args.quick else 1000
    counts = args.swarms or ([1, 100, 1000] if args.quick else [1, 100, 1000, 10000])
    ndev = jax.device_count()
    load_before = os.getloadavg()[0]
    rows = measure(counts, iterations)
    text = (
        "## pso_throughput (`python -m benchmarks.pso_throughput"
        f"{' --quick' if args.quick else ''}`)\n\n"
        f"Machine: {machine()}; {ndev} XLA device(s); load average before the run "
        f"{load_before:.2f}, after {os.getloadavg()[0]:.2f}.\n"
        f"{AGENTS} agents x {iterations} iterations on f4, w {W}, c1 = c2 = {C}. "
        "numpy and evosax timed on min(swarms, 1000) swarms, pyswarms on min(swarms, 3); "
        "best of 3 (swarmjax) or 2 (evosax) after compilation. 'vmap': all swarms in one "
        f"jit(vmap) sharded over the devices; 'in blocks': each device's swarms in vmapped blocks "
        f"of {BLOCK} under lax.map (cache-sized), used when a device holds more than {BLOCK}; "
        "ratios use the faster of the two.\n\n" + "\n".join(table(rows))
    )
    print(text)
    if args.write:
        write_section("pso_throughput", text)
    return 0


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    sys.exit(main())
