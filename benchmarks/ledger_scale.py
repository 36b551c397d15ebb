"""How the privacy ledger's cost grows with its releases: seconds per release to list, compose
and write them, at a small count (the baseline, measured in the same run) and at the count
of ``experiments.paaso --full`` (one private release per configuration, about 12,000).

The releases are PAASO's (:func:`swarmjax.paaso_sweep.run_release`): voting configurations
of the ``--full`` search grid (one data source and one key fingerprint each; ``--distinct``
numbers of agents, so that many configurations share their event, as the search's do).
The ratio is the large count's seconds per release over the baseline's: about 1 when the
cost is linear in the releases, the ratio of the counts when it is quadratic. Before
2026-11-30 the ledger composed every data source by PLD afresh (125 ms each for PAASO's
1,000-iteration event, twice per written ledger) and scanned every earlier release to
list one: 320.6 s for 1,200 releases on the 2-core CPU, about 50 minutes at 12,000
(RESULTS.md, ``ledger_scale-before-20261130``).

``python -m benchmarks.ledger_scale [--sizes 1000 12000] [--distinct 4] [--write]``
(``--write``: also the ``ledger_scale`` section of benchmarks/RESULTS.md)
"""

from __future__ import annotations

import itertools
import tempfile
import time

from benchmarks import _cli as _bcli
from experiments import _cli


def releases(count: int, distinct: int) -> list:
    """``count`` PAASO releases of distinct configurations (``distinct`` swarm sizes)."""
    from swarmjax.paaso_sweep import run_release

    grid = itertools.product(
        range(count),  # the pass over the grid: past its 12,096 configurations, another
        ("adrd", "bdrd", "pbdrd"),
        [f"f{i}" for i in range(1, 9)],
        (0.005, 0.001, 0.05, 0.1, 0.2, 0.4),
        (0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0),
        (0.005, 0.001, 0.05, 0.1, 0.2, 0.4),
        (1.0, 10.0),
    )
    out = []
    for k, (part, strategy, function, w, phi, w_g, speed) in enumerate(grid):
        if k == count:
            break
        config = {"strategy": strategy, "function": function, "w": w, "phi_p": phi}
        config |= {"w_g": w_g, "speed": speed, "num_agents": 50 + 10 * (k % distinct)}
        config |= {"k_alpha": 8, "iterations": 1000, "p_m": 0.9, "part": part}
        drawn = {"generator": "ChaCha20", "secret": "entropy", "fingerprint": f"{k:032x}"}
        run = run_release(
            config, range(20), "search.csv", delta=1e-5, accountant="pld", randomness=drawn
        )
        out.append(run)
    return out


def measure(count: int, distinct: int) -> dict[str, float]:
    """Seconds to add ``count`` releases to a fresh ledger, compose them, write them."""
    from swarmjax.privacy import ledger as ledger_module

    made = releases(count, distinct)
    ledger_module._COMPOSED.clear()  # each size composes from scratch
    ledger = ledger_module.Ledger(tempfile.mkdtemp(), "paaso", delta=1e-5)
    started = time.perf_counter()
    for r in made:
        ledger.add(r)
    listed = time.perf_counter()
    composed = ledger.composed()
    composing = time.perf_counter()
    ledger.write()
    written = time.perf_counter()
    assert len(composed) == count
    return {
        "add": listed - started,
        "compose": composing - listed,
        "write": written - composing,
    }


def main(argv: list[str] | None = None) -> None:
    p = _bcli.parser("ledger_scale", __doc__.split("\n\n")[0], writes="ledger_scale")
    p.add_argument(
        "--sizes",
        nargs=2,
        type=_cli.count("--sizes"),
        default=[1000, 12000],
        metavar=("BASE", "LARGE"),
        help="the baseline's release count and the large one (1000 12000)",
    )
    distinct = "distinct swarm sizes, so distinct events, among the releases (4)"
    p.add_argument("--distinct", type=_cli.count("--distinct"), default=4, help=distinct)
    args = p.parse_args(argv)
    base, large = args.sizes
    if large <= base:
        p.error(f"--sizes: the large count must exceed the baseline's; got {base} {large}")
    got = {n: measure(n, args.distinct) for n in (base, large)}
    head = f"ratio (1: linear, {large / base:.3g}: quadratic)"
    lines = [
        f"ledger of PAASO releases ({args.distinct} distinct events), seconds per release:",
        f"  {'step':<8} {base:>8,} {large:>8,}   {head}",
    ]
    table = [f"| step | ms per release at {base:,} | at {large:,} | ratio |"]
    table.append("|---|---:|---:|---:|")
    for step in ("add", "compose", "write"):
        small, big = got[base][step] / base, got[large][step] / large
        lines.append(f"  {step:<8} {small * 1e3:>6.3f}ms {big * 1e3:>6.3f}ms   {big / small:.2f}")
        table.append(f"| {step} | {small * 1e3:.3f} | {big * 1e3:.3f} | {big / small:.2f} |")
    total = {n: sum(got[n].values()) for n in got}
    lines.append(f"  total: {total[base]:.2f} s for {base:,}, {total[large]:.2f} s for {large:,}")
    print("\n".join(lines))
    if args.write:
        from benchmarks._results import machine, write_section

        argv_text = " ".join(["--sizes", str(base), str(large), "--distinct", str(args.distinct)])
        text = (
            f"## ledger_scale\n\n`python -m benchmarks.ledger_scale {argv_text}` on {machine()}: "
            f"a privacy ledger of PAASO releases (one per configuration, {args.distinct} "
            f"distinct events) listed, composed and written; a ratio near 1 is linear, "
            f"{large / base:.3g} quadratic. In all: {total[base]:.2f} s for {base:,} releases, "
            f"{total[large]:.2f} s for {large:,}.\n\n" + "\n".join(table)
        )
        write_section("ledger_scale", text)


if __name__ == "__main__":
    main()
