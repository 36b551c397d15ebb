"""Reproduce the PAASO paper's experiments (seed 001, Figs. 2-6) as vmapped sweeps.

    python -m experiments.paaso --quick     # CI smoke run, under a minute
    python -m experiments.paaso             # a meaningful slice, minutes on a 2-core CPU
    python -m experiments.paaso --full      # the paper's whole grid
    python -m experiments.paaso --coordinator HOST:PORT --num-processes N --process-id I
                                            # one of N processes (jax.distributed), e.g.
                                            # one per host; README: multi-host recipe

Writes ``results/paaso/`` (or ``--out``): one resumable sweep folder per figure (under
``calls/<code fingerprint>/``, so changed code never resumes a stale sweep), a CSV of
mean/std objective per iteration for every curve (``figN.csv``), the figures (``figN.png``
and ``.pdf``, column-sized), ``summary.csv``/``summary.json`` (final objective, mean +/-
std over runs, of the best configuration per strategy and function, with the epsilon spent)
and prints that table. Rerunning with the same options resumes unfinished sweeps
(``--restart`` recomputes them). Options follow ``experiments/_cli.py``; ``--runs`` (not
``--seeds``) counts the independent runs per configuration. Then it prints the time spent:
wall, kernels, compilations (also ``timing.json``). ``privacy_ledger.json/.md`` lists every
configuration as a release (:mod:`swarmjax.paaso_sweep`: the voting strategies are
agent-level DP, each configuration's swarms composed apart and each run drawn from its own
secret key, which its entry states; PSO and FL are not private),
records the best-configuration choices of ``summary.csv`` as selections by a public score
(the benchmark function at the released centre) and lists the sweep folders, whose raw rows
hold unnoised voter counts, as not released. Sweeps resume under any ``--memory-gb`` /
``--block`` / ``--cpu-devices`` / process count. ``--block`` and ``--memory-gb`` default to
the device's sizes (swarmjax.device); the CPU flags (``--cpu-devices``, LLVM -O1) are set
only when the backend is the CPU."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

from experiments import _cli
from swarmjax.resume import code_fingerprint

PAPER_W = [0.005, 0.001, 0.05, 0.1, 0.2, 0.4]
PAPER_PHI = [0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0]
PAPER_PROBS = [0.6, 0.7, 0.8, 0.9, 1.0]
STRATEGIES = ["pso", "fl", "adrd", "bdrd", "pbdrd"]
FUNCTIONS = [f"f{i}" for i in range(1, 9)]
FIG2 = {"w": 0.4, "phi": 2.0, "w_g": 0.005, "p_c": 1.0, "p_m": 0.9}  # paper Figs. 1-3
# The paper prints w = 4.00 for Figs. 1-3, outside its own grid (largest 0.4), where an
# inertia-weighted swarm diverges: "typo" reads it as 0.40 (default), "literal" as printed.
FIG2_INERTIA = {"typo": 0.4, "literal": 4.0}
# --reading: the inertia of Figs. 1-3 and swarmjax.paaso.READINGS (clamp, voted step).
READING_INERTIA = {"stable": "typo", "spec": "literal"}
FIG4 = {"w": 0.005, "phi": 2.0, "w_g": 0.01, "p_c": 1.0, "p_m": 0.9}  # paper Figs. 4-5
FIG5_AGENTS = [50, 100, 200]  # bDRD's swarm sizes in Fig. 5 (and the readings' agents study)

PROFILES = {
    "quick": {
        "runs": 5,
        "iterations": 100,
        "functions": ["f4"],
        "w": [0.005, 0.4],
        "phi": [1.0, 2.0],
        "w_g": [0.01, 0.1],
        "speed": [1.0],
        "k_alphas": [8, 32],  # the k_alpha study (default: 4, 8, 16, 32)
    },
    "default": {
        "runs": 20,
        "iterations": 1000,
        "functions": FUNCTIONS,
        "w": [0.005, 0.1, 0.4],
        "phi": [0.5, 1.0, 2.0],
        "w_g": [0.01, 0.1, 0.4],
        "speed": [1.0, 10.0],
    },
    "full": {
        "runs": 20,
        "iterations": 1000,
        "functions": FUNCTIONS,
        "w": PAPER_W,
        "phi": PAPER_PHI,
        "w_g": PAPER_W,
        "speed": [1.0, 10.0],
    },
}


def fig2_setting(reading: str) -> dict[str, float]:
    """The Figs. 1-3 numerics under ``reading`` (a key of READING_INERTIA)."""
    return {**FIG2, "w": FIG2_INERTIA[READING_INERTIA[reading]]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _cli.parser(
        "paaso",
        __doc__,
        quick="tiny CI run (f4 only, 5 runs, 100 iterations, a 2x2x2 search grid)",
        full="the paper's full grid (GPU advised)",
        privacy="agents (of the largest swarm)",
    )
    count = _cli.count
    p.add_argument("--runs", type=count("--runs"), help="independent runs per configuration")
    p.add_argument("--iterations", type=count("--iterations"), help="iterations per run")
    p.add_argument(
        "--agents", type=count("--agents"), default=50, help="agents for Figs. 2-4, 6 (paper: 50)"
    )
    p.add_argument(
        "--k-alpha", type=count("--k-alpha"), default=8, help="voting directions (paper: 8)"
    )
    p.add_argument(
        "--fl-rule",
        choices=["direction", "cognitive"],
        default="direction",
        help="FL second branch: p_i - pG (default) or the spec's literal p_i - x_i",
    )
    p.add_argument(
        "--reading",
        choices=list(READING_INERTIA),
        default="stable",
        help="stable (default): Figs. 1-3 at w 0.4, velocity clamp 0.1 domain widths, voted "
        "step 5 wG; spec: w 4.0 as printed, clamp 1 width, voted step wG (docs/paaso.md)",
    )
    p.add_argument(
        "--readings-study",
        action="store_true",
        help="also sweep every reading of the ambiguous parts (readings.csv, "
        "readings_agents.csv, readings_fl_step.csv; minutes)",
    )
    p.add_argument(
        "--memory-gb",
        type=_cli.positive_float("--memory-gb"),
        default=None,
        help="memory of the runs written per chunk, GiB (default: 1 on the CPU, a quarter of "
        "the devices' memory on GPU/TPU; swarmjax.device.chunk_budget_bytes)",
    )
    p.add_argument(
        "--block",
        type=count("--block"),
        default=None,
        help="runs per device per compiled call (default: 128 on the CPU, from the device's "
        "memory on GPU/TPU; swarmjax.device.block_size). Results are bit for bit the same "
        "for a given backend and block",
    )
    p.add_argument(
        "--cpu-devices",
        type=count("--cpu-devices"),
        default=min(os.cpu_count() or 1, 8),
        help="split the CPU into this many XLA devices to use every core (default: all; "
        "ignored on GPU/TPU)",
    )
    dist = p.add_argument_group("several processes (jax.distributed), all three or none")
    dist.add_argument("--coordinator", help="HOST:PORT of process 0's coordinator service")
    dist.add_argument("--num-processes", type=count("--num-processes"), help="processes")
    dist.add_argument("--process-id", type=int, help="this process's index, 0..N-1")
    args = p.parse_args(argv)
    given = [args.coordinator, args.num_processes, args.process_id]
    if any(v is not None for v in given) and not all(v is not None for v in given):
        p.error("give --coordinator, --num-processes and --process-id together")
    if args.num_processes is not None and not 0 <= args.process_id < args.num_processes:
        p.error(f"--process-id must be in [0, {args.num_processes}); got {args.process_id}")
    host, _, port = (args.coordinator or "").rpartition(":")
    if args.coordinator is not None and not (host and port.isdigit() and 0 < int(port) < 65536):
        p.error(f"--coordinator must be HOST:PORT (a port in 1..65535); got {args.coordinator!r}")
    return args


BLOCK_CPU = 128  # runs per compiled call on the CPU (swarmjax.sweep.BLOCK)
AGENT_BYTES = 200  # an agent's state and step temporaries, with a margin (memory_estimate)


def _block_runs(args: argparse.Namespace) -> int:
    """Runs a compiled call holds on each CPU device: ``--block``, else the CPU's 128."""
    return args.block or BLOCK_CPU


def memory_estimate(args: argparse.Namespace) -> int:
    """Bytes one compiled block of runs holds, estimated before JAX starts: per run the
    swarm's state and the step's temporaries (:data:`AGENT_BYTES` an agent) plus ``4
    k_alpha`` bytes of votes, and the per-iteration trace (4 numbers an iteration), for the
    largest swarm of the figures, times the runs of a block: ``--block`` (else the CPU's
    128) on each of ``--cpu-devices``. The sweep pads every call to a full block
    (:mod:`swarmjax.sweep`: a configuration gets the same block alone or in any sweep), so
    a block holds that many runs however few the configuration has. Measured with XLA's
    memory analysis of the sweep's compiled block (ChaCha20 run keys, 40 runs, 100
    iterations; 2026-11-29): 108 B an agent and run for PSO and FL, 112-118 B for the
    voting program, whatever ``k_alpha``."""
    block = _block_runs(args) * args.cpu_devices
    agents = max(args.agents, *FIG5_AGENTS)
    iterations = args.iterations or PROFILES[_cli.profile_name(args)]["iterations"]
    per_agent = AGENT_BYTES // 4 + args.k_alpha
    return _cli.array_bytes((block, agents, per_agent), (block, iterations, 4))


def check(args: argparse.Namespace) -> None:
    """Memory of the run against the machine's, before JAX starts: the estimate of
    :func:`memory_estimate` and ``--memory-gb`` (the chunk of runs held before writing)."""
    have = _cli.physical_memory()
    if args.memory_gb is not None and args.memory_gb * 2**30 > _cli.MEMORY_SHARE * have:
        raise _cli.UserError(
            f"--memory-gb {args.memory_gb:g} exceeds {_cli.MEMORY_SHARE:.0%} of this machine's "
            f"{have / 2**30:.3g} GiB; give less"
        )
    option = _cli.option_named(args, ["agents", "k_alpha", "iterations", "block", "runs"])
    what = (
        f"a block of runs of {max(args.agents, *FIG5_AGENTS)} agents, k_alpha {args.k_alpha}, "
        f"{args.iterations or 'the profile'} iterations; {_block_runs(args)} runs a block "
        f"(--block) on each of {args.cpu_devices} CPU devices"
    )
    _cli.check_memory(memory_estimate(args), option, what)


def _setup_devices(count: int) -> bool:
    """On the CPU backend only, expose ``count`` CPU devices to XLA and compile at LLVM's -O1
    unless ``XLA_FLAGS`` says otherwise (must run before JAX starts;
    :func:`swarmjax.device.configure_cpu_flags`); returns whether the backend is the CPU.

    -O1 halves the compile time of a PAASO program (8 -> 4.5 s for a voting one) at about the
    same kernel speed (0-13 % slower, within the shared machine's noise): with ~10 programs
    against ~1 min of kernels, compilation is most of the default run (docs/paaso_speed.md).
    """
    from swarmjax.device import configure_cpu_flags

    return configure_cpu_flags(count, optimization_level=1)


def _timing(wall: float) -> dict[str, float]:
    """Wall vs kernel time of this call's sweeps (swarmjax.sweep.STATS)."""
    import jax

    from experiments._paaso_figures import WORK
    from swarmjax.sweep import STATS

    return {
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
        "processes": jax.process_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "device_kind": jax.devices()[0].device_kind,
        "wall_s": wall,
        "kernel_s": STATS.kernel_seconds,
        "compile_s": STATS.compile_seconds,
        "compilations": STATS.compilations,
        "runs_computed": STATS.runs,
        "runs_total": WORK["runs"],
        "agent_steps_total": WORK["agent_steps"],
        # None when every sweep was resumed from disk (no kernel ran)
        "wall_over_kernel": wall / STATS.kernel_seconds if STATS.kernel_seconds else None,
    }


def study_releases(
    frame,
    labels: list[str],
    path,
    *,
    seeds: int,
    iterations: int,
    delta: float,
    accountant: str,
    randomness: dict | None = None,
) -> list:
    """The releases of a readings-study table (one row per configuration, ``labels`` its
    configuration columns; every configuration ran seeds ``0 .. seeds-1``), for the ledger.
    Strategy, agents and k_alpha default to the study's (``strategy`` bDRD for the agents
    study, which has no strategy column; 50 agents; k_alpha 8). ``randomness``: what drew
    the study's runs (:func:`swarmjax.privacy.secret.randomness` of its secret's source;
    ``None``: not stated), with each row's ``key_fingerprint`` (the joint fingerprint of
    its runs' keys) when the table has one."""
    from swarmjax.paaso_sweep import run_release

    out = []
    prints = frame["key_fingerprint"] if "key_fingerprint" in frame else [None] * len(frame)
    on = {"delta": delta, "accountant": accountant}
    for row, key in zip(frame[labels].to_dict(orient="records"), prints, strict=True):
        config = {"strategy": "bdrd", "num_agents": 50, "k_alpha": 8, **row}
        config["iterations"] = iterations
        config = {k: v for k, v in config.items() if v == v}  # NaN: not applicable
        drawn = None if randomness is None else randomness | ({"fingerprint": key} if key else {})
        out.append(run_release(config, range(seeds), str(path), randomness=drawn, **on))
    return out


def _readings_study(args: argparse.Namespace, settings: dict) -> None:
    """``--readings-study``: the three tables, each run added to the ledger."""
    from experiments._paaso_readings import run_agents_study, run_fl_step_study, run_readings
    from swarmjax.privacy.secret import Secret, randomness

    runs, iterations = settings["runs"], settings["iterations"]
    on = {"iterations": iterations, "delta": args.ledger.delta}
    on["accountant"] = args.ledger.accountant
    studies = [
        ("readings.csv", run_readings, runs, ["strategy", "inertia", "w", "vmax_factor",
                                              "clip_positions", "fl_rule", "speed"]),
        ("readings_agents.csv", run_agents_study, 2 * runs, ["vmax_factor", "speed",
                                                             "num_agents"]),
        ("readings_fl_step.csv", run_fl_step_study, runs, ["setting", "w", "w_g", "speed"]),
    ]  # fmt: skip
    supplied = _cli.supplied_secret(args)
    for name, study, seeds, labels in studies:
        # each study's own secret: fresh entropy, or derived from --secret-file
        secret = Secret.generate() if supplied is None else supplied.derive(f"paaso/{name}")
        on["randomness"] = randomness(secret.source, False)
        frame = study(seeds, iterations, secret=secret)
        frame.to_csv(args.out / name, index=False)
        if name == "readings_fl_step.csv":
            frame = frame.assign(strategy="fl")
            labels = ["strategy", *labels]
        for release in study_releases(frame, labels, args.out / name, seeds=seeds, **on):
            args.ledger.add(release)


@_cli.entry_point
def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    args = parse_args(argv)
    _cli.process_options(args)  # before anything compiles
    check(args)
    args.out = _cli.out_dir(args)  # before JAX starts: an unwritable --out is one line
    if _setup_devices(args.cpu_devices) is False:  # a GPU/TPU backend
        _cli.warn_unused(args, ["cpu_devices"], "the backend is not the CPU")
    import jax

    if args.coordinator is not None:
        jax.distributed.initialize(
            coordinator_address=args.coordinator,
            num_processes=args.num_processes,
            process_id=args.process_id,
        )
    from experiments import _paaso_claims, _paaso_figures, _report
    from experiments._paaso_claims import run_claims
    from experiments._paaso_figures import run_all
    from swarmjax.privacy.ledger import Ledger

    # every configuration is listed as a release of the agents' votes; checked writable now
    delta = _cli.delta(args, max(args.agents, *FIG5_AGENTS))  # 0.1 / the largest swarm
    args.ledger = Ledger(args.out, "paaso", delta=delta, accountant=args.accountant)
    module = sys.modules[__name__]
    args.sweeps = args.out / "calls" / code_fingerprint(module, _paaso_figures, _paaso_claims)
    if args.restart and jax.process_index() == 0:
        shutil.rmtree(args.sweeps, ignore_errors=True)
    profile = _cli.profile_name(args)
    settings = dict(PROFILES[profile])
    settings["runs"] = args.runs or settings["runs"]
    settings["iterations"] = args.iterations or settings["iterations"]
    summary = run_all(args, profile, settings)
    claims = run_claims(args, settings)
    timing = _timing(time.perf_counter() - start)
    ratio = timing["wall_over_kernel"]
    line = (
        f"wall {timing['wall_s']:.1f} s, kernels {timing['kernel_s']:.1f} s "
        f"(wall / kernel = {'n/a, all resumed' if ratio is None else f'{ratio:.2f}'}), "
        f"{timing['compilations']} programs compiled (or loaded from --jax-cache) in "
        f"{timing['compile_s']:.1f} s; {timing['runs_computed']} runs computed "
        f"on {timing['backend']} ({timing['devices']} device(s), {timing['processes']} "
        "process(es))"
    )
    if summary is None:  # not process 0: its share is written, process 0 reports
        print(f"process {jax.process_index()}: {line}")
        return 0
    if args.readings_study:
        _readings_study(args, settings)
    args.out.mkdir(parents=True, exist_ok=True)
    _report.write_json(args.out / "timing.json", timing)
    _report.write_json(
        args.out / "settings.json",
        {
            "profile": profile,
            **settings,
            "agents": args.agents,
            "k_alpha": args.k_alpha,
            "fl_rule": args.fl_rule,
            "reading": args.reading,
            "fig2_w": fig2_setting(args.reading)["w"],
        },
    )
    print(summary.to_string(index=False))
    print()
    print(claims[["finding", "setting", "holds"]].to_string(index=False))
    print(f"\n{line}")
    _report.write_ledger(args.ledger)
    _report.finish(args.out, args.out / "timing.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
