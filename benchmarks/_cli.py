"""One command line for every ``benchmarks/`` script (imports no JAX: some scripts set XLA's
CPU flags before JAX starts).

* ``--write`` writes the script's section of ``benchmarks/RESULTS.md``; without it a
  benchmark only prints (a run never rewrites the recorded figures unasked).
* Bad input is refused before any work with one line naming the option, exit status 2
  (:func:`experiments._cli.entry_point`): the shared checks of ``experiments/_cli.py``
  (counts, numbers, the data folder and its datasets, the memory a run is about to
  allocate, options that do not apply) are the ones used here.
* :func:`warn_unused`: an option that the chosen run ignores (e.g. a CPU option on a GPU)
  is named in one warning line on stderr.
"""

from __future__ import annotations

import argparse

from experiments import _cli

__all__ = ["parser", "warn_unused"]


def parser(module: str, description: str, *, writes: str | None = None) -> argparse.ArgumentParser:
    """A parser named ``python -m benchmarks.<module>`` with one-line errors (exit 2) that
    records the options given (:func:`experiments._cli.given`); ``writes`` names the
    RESULTS.md section of ``--write`` (None: the script writes none)."""
    p = _cli._Parser(
        prog=f"python -m benchmarks.{module}",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if writes is not None:
        p.add_argument(
            "--write",
            action="store_true",
            help=f"write the {writes} section of benchmarks/RESULTS.md (default: print only)",
        )
    return p


warn_unused = _cli.warn_unused  # the experiments' one
