"""benchmarks.mesh_gather at tiny sizes: one subprocess with 2 CPU devices (the benchmark
sets the device count before JAX starts) checks every collective's rows against the direct
gather and prints a time for each; bad sizes are one line before JAX starts."""

from __future__ import annotations

import re

import pytest

from benchmarks import mesh_gather
from tests.argv import refused, run_module


def test_every_collective_is_the_direct_gather_and_is_timed():
    argv = ["--devices", "2", "--clients", "10", "--slots", "4", "--row", "3", "--repeats", "2"]
    out = run_module("benchmarks.mesh_gather", argv)
    assert "4 slots of 10 clients" in out and "every method bit for bit" in out
    timed = re.findall(r"^  (.+): [\d.]+ ms$", out, re.M)
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
    assert message in refused(mesh_gather.main, argv, capsys)
