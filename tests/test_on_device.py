"""benchmarks/on_device.sh (one lent accelerator session's checks inside a budget) and the
merge of the RESULTS.md sections it brings back."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import _results

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path, *args: str) -> str:
    env = {**os.environ, "OUT": str(tmp_path / "out")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # this interpreter's python
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "on_device.sh"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "RESULTS.md").read_text() == _results.RESULTS.read_text()
    return done.stdout


STEPS = ("devices", "secagg_stages", "secagg", "accelerator", "paaso_full", "scaling")


def test_a_step_named_runs_alone_and_logs_in_out(tmp_path):
    printed = _run(tmp_path, "120", "devices")
    assert "cpu" in (tmp_path / "out" / "devices.log").read_text().lower()
    assert "== devices (at most 60 s)" in printed and "exit 0" in printed
    assert not any(f"== {name}" in printed for name in STEPS[1:])


def test_a_step_that_the_budget_cannot_hold_is_skipped_in_one_line(tmp_path):
    printed = _run(tmp_path, "29")  # under 30 s left before the first step
    for name in (*STEPS, "lora_memory"):  # 29 s or, under load, a second or two fewer
        assert re.search(rf"^== {name}: skipped, 2\d s of the budget left$", printed, re.M)
    assert not list((tmp_path / "out").glob("*.log"))


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["8m"], "BUDGET_S must be whole seconds (e.g. 480); got '8m'"),
        (["60", "scalin"], "unknown step 'scalin'"),
    ],
)
def test_bad_input_is_one_line_before_any_work(tmp_path, args, named):
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "on_device.sh"), *args],
        cwd=ROOT,
        env={**os.environ, "OUT": str(tmp_path / "out")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and named in done.stderr
    assert not (tmp_path / "out").exists()


def test_merge_writes_the_sections_that_are_new_or_changed(tmp_path):
    here, there = tmp_path / "RESULTS.md", tmp_path / "copy.md"
    _results.write_section("a", "kept", here)
    _results.write_section("b", "old", here)
    there.write_text(here.read_text())
    _results.write_section("b", "new\nlines", there)
    _results.write_section("c", "from the device", there)
    assert _results.merge_sections(there, here) == ["b", "c"]
    assert _results.sections(here.read_text()) == {
        "a": "kept",
        "b": "new\nlines",
        "c": "from the device",
    }
    assert _results.merge_sections(there, here) == []  # nothing left to bring
