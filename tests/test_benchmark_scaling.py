"""benchmarks.scaling end to end at tiny sizes: one subprocess with 2 CPU devices (so the
benchmark measures 1 and 2 devices in that process, without re-running itself), the
quick Shakespeare LSTM; it prints its layout lines, its table and its ratios, and writes
no RESULTS.md without ``--write``. Its refusals are in tests/test_bad_input.py."""

from __future__ import annotations

import os
import re

import pytest

from tests.argv import REPO, run_module


def test_scaling_runs_and_prints_its_ratios(data_dir):
    if not (data_dir / "shakespeare").is_dir():
        pytest.skip(f"no shakespeare/ in {data_dir}: the plays are not staged")
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2"
    env = {**os.environ, "XLA_FLAGS": flags.strip(), "PYTHONPATH": str(REPO)}
    results = (REPO / "benchmarks" / "RESULTS.md").read_text()
    argv = ["--quick", "--devices", "1", "2", "--per-device", "1", "--rounds", "1"]
    argv += ["--workloads", "shakespeare", "--data-dir", str(data_dir)]
    out = run_module("benchmarks.scaling", argv, env)
    assert "shakespeare weak: one device: the cohort's 1 slots on cpu:0" in out
    assert "cohort of 2 slots over 2 cpu devices (1 slots each)" in out
    rows = re.findall(r"^\| shakespeare \| (weak|strong) \| (\d) \| (\d) \| ([\d.]+) \|", out, re.M)
    assert sorted((m, d, c) for m, d, c, _ in rows) == [
        ("strong", "1", "2"),
        ("strong", "2", "2"),
        ("weak", "1", "1"),
        ("weak", "2", "2"),
    ]
    assert all(float(s) > 0 for *_, s in rows)
    assert re.search(r"strong, 2 devices, cohort 2: overhead [\d.]+x .* efficiency [\d.]+%", out)
    assert re.search(r"weak, 2 devices, cohort 1 -> 2: weak-scaling efficiency [\d.]+%", out)
    assert (REPO / "benchmarks" / "RESULTS.md").read_text() == results  # no --write
