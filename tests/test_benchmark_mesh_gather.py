"""benchmarks.mesh_gather at tiny sizes: one subprocess with 2 CPU devices (the benchmark
sets the device count before JAX starts) checks every collective's rows against the direct
gather and prints a time for each; bad sizes are one line before JAX starts."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import mesh_gather

REPO = Path(__file__).resolve().parents[1]


def test_every_collective_is_the_direct_gather_and_is_timed():
    argv = ["--devices", "2", "--clients", "10", "--slots", "4", "--row", "3", "--repeats", "2"]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.mesh_gather", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "4 slots of 10 clients" in proc.stdout and "every method bit for bit" in proc.stdout
    timed = re.findall(r"^  (.+): [\d.]+ ms$", proc.stdout, re.M)
    assert timed == ["ring (ppermute)", "psum_scatter", "all_to_all"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--devices", "1"], "argument --devices: must be >= 2; got 1"),
        (["--slots", "5"], "--devices must divide --slots and --clients"),
        (["--clients", "8", "--slots", "12"], "--slots <= --clients"),
    ],
)
def test_bad_sizes_are_one_line_before_any_work(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        mesh_gather.main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
