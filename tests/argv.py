"""Helpers of the command-line tests: a refusal read as one line, option overrides, and a
module run in its own process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def refused(main: Callable, argv: list[str], capsys) -> str:
    """``main(argv)`` exits 2 with one line on stderr (returned), no traceback."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def override(base: list[str], extra: list[str]) -> list[str]:
    """``base`` with each option ``extra`` gives replaced (an option given twice is refused)."""
    given = {a for a in extra if a.startswith("--")}
    out, skip = [], False
    for a in base:
        if a.startswith("--"):
            skip = a in given
        if not skip:
            out.append(a)
    return [*out, *extra]


def run_module(module: str, argv: list[str], env: dict | None = None) -> str:
    """``python -m module *argv`` in a fresh process from the repository (``env``: its
    environment, else this one's); asserts it exits 0 and returns its stdout."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout
