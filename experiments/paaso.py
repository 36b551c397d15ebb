"""Reproduce the PAASO paper's experiments (seed 001, Figs. 2-6) as vmapped sweeps.

    python -m experiments.paaso --quick     # CI smoke run, under a minute
    python -m experiments.paaso             # a meaningful slice, minutes on a 2-core CPU
    python -m experiments.paaso --full      # the paper's whole grid (meant for a GPU)

Writes ``results/paaso/`` (or ``--out``): one resumable sweep folder per figure, a CSV of
mean/std objective per iteration for every curve (``figN.csv``), the figures
(``figN.png``), ``summary.csv``/``summary.json`` (final objective, mean +/- std over runs,
of the best configuration per strategy and function, with the epsilon spent) and prints
that table.  Rerunning with the same options resumes unfinished sweeps.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

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
    p = argparse.ArgumentParser(
        prog="python -m experiments.paaso",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--quick",
        action="store_true",
        help="tiny CI run (f4 only, 5 runs, 100 iterations, a 2x2x2 search grid)",
    )
    mode.add_argument("--full", action="store_true", help="the paper's full grid (GPU advised)")
    p.add_argument("--out", type=Path, default=Path("results/paaso"), help="output folder")
    p.add_argument("--runs", type=int, help="independent runs per configuration (paper: 20)")
    p.add_argument("--iterations", type=int, help="iterations per run (paper: up to 1000)")
    p.add_argument("--agents", type=int, default=50, help="agents for Figs. 2-4, 6 (paper: 50)")
    p.add_argument("--k-alpha", type=int, default=8, help="voting directions (paper: 8)")
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
        "--memory-gb", type=float, default=1.0, help="device memory per chunk, GiB (default 1)"
    )
    p.add_argument(
        "--cpu-devices",
        type=int,
        default=min(os.cpu_count() or 1, 8),
        help="split the CPU into this many XLA devices to use every core (default: all)",
    )
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    args = p.parse_args(argv)
    for name in ("runs", "iterations", "agents", "k_alpha", "cpu_devices"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1; got {value}")
    return args


def _setup_devices(count: int) -> None:
    """Expose ``count`` CPU devices to XLA (must run before JAX starts)."""
    flag = f"--xla_force_host_platform_device_count={count}"
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags and count > 1:
        os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _setup_devices(args.cpu_devices)
    from experiments._paaso_claims import run_claims
    from experiments._paaso_figures import run_all

    profile = "quick" if args.quick else "full" if args.full else "default"
    settings = dict(PROFILES[profile])
    settings["runs"] = args.runs or settings["runs"]
    settings["iterations"] = args.iterations or settings["iterations"]
    summary = run_all(args, profile, settings)
    claims = run_claims(args, settings)
    if args.readings_study:
        from experiments._paaso_readings import (
            run_agents_study,
            run_fl_step_study,
            run_readings,
        )

        run_readings(settings["runs"], settings["iterations"]).to_csv(
            args.out / "readings.csv", index=False
        )
        run_agents_study(2 * settings["runs"], settings["iterations"]).to_csv(
            args.out / "readings_agents.csv", index=False
        )
        run_fl_step_study(settings["runs"], settings["iterations"]).to_csv(
            args.out / "readings_fl_step.csv", index=False
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "settings.json").write_text(
        json.dumps(
            {
                "profile": profile,
                **settings,
                "agents": args.agents,
                "k_alpha": args.k_alpha,
                "fl_rule": args.fl_rule,
                "reading": args.reading,
                "fig2_w": fig2_setting(args.reading)["w"],
            },
            indent=1,
        )
    )
    print(summary.to_string(index=False))
    print()
    print(claims[["finding", "setting", "holds"]].to_string(index=False))
    print(f"\nresults in {args.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
