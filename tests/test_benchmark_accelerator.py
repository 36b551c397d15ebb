"""benchmarks.accelerator: the quick path at tiny sizes produces its figures and a RESULTS
section naming the backend and device; sections and defaults per backend."""

from __future__ import annotations

import argparse
import math

import jax
import pytest

from benchmarks import _results, accelerator, dpsgd_overhead
from swarmjax import models

TINY = accelerator.Sizes(
    swarms=(8,),
    pso_iterations=5,
    voting_runs=4,
    voting_iterations=5,
    batches=(8,),
    clients=3,
    repeats=1,
    voting_strategies=("pbdrd",),
)


def _positive(x):
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_quick_path_at_tiny_sizes_gives_numbers_and_a_results_section(tmp_path, monkeypatch):
    tiny_mlp = models.mlp((8,), 10, (4, 4, 1))  # the DP-SGD section's model, small
    monkeypatch.setattr(dpsgd_overhead, "benchmark_models", lambda: {"mlp": tiny_mlp})
    results = accelerator.run(("pso", "voting", "dpsgd", "fedround"), TINY)
    dev = results["device"]
    assert dev["backend"] == jax.default_backend() and dev["count"] == jax.device_count()
    (pso,) = results["pso"]["rows"]
    assert pso["swarms"] == 8 and _positive(pso["plain"]) and _positive(pso["numpy"])
    assert pso["evosax"] is None or _positive(pso["evosax"])
    voting = {r["label"]: r for r in results["voting"]["rows"]}
    assert set(voting) == {"pso", "fl", "pbdrd", "pbdrd, casts drawn"}
    assert voting["pso"]["ratio"] == 1.0 and all(_positive(r["rate"]) for r in voting.values())
    (row,) = results["dpsgd"]["rows"]
    assert row[:2] == ("mlp", 8) and all(_positive(t) for t in row[2].values())
    fed = results["fedround"]
    assert set(fed["seconds"]) == {"vmap", "sequential"}
    assert all(_positive(s) for s in fed["seconds"].values()) and 0 <= fed["accuracy"] <= 1
    assert fed["default"] == ("sequential" if dev["backend"] == "cpu" else "vmap")

    text = accelerator.section_text(results, TINY, "python -m benchmarks.accelerator", "m")
    name = accelerator.section_name(results)
    if dev["backend"] == "cpu":
        assert name == "accelerator-cpu-cpu"
    from benchmarks._results import device_slug  # what vs_pfl names its non-CPU sections by

    assert name == f"accelerator-{device_slug()}"
    assert accelerator.section_name(results, quick=True) == f"{name}-quick"
    assert text.startswith(f"## {name} (`python -m benchmarks.accelerator`)")
    for heading in ("### PSO (", "### PAASO strategies", "### DP-SGD", "### FedAvg round"):
        assert heading in text
    assert f"{dev['backend']}, {dev['count']} x {dev['kind']}" in text
    assert "| 8 | " in text and "| pbdrd | " in text and "| mlp | 8 | " in text
    assert f"{fed['default']} (this backend default)" in text
    path = tmp_path / "RESULTS.md"
    _results.write_section(name, text, path)
    _results.write_section(name, text, path)  # rerun: replaced, not appended
    assert path.read_text().count(f"<!-- {name}:start -->") == 1


def test_sections_and_defaults_per_backend():
    assert "paaso" not in accelerator.default_sections("cpu", quick=False)
    assert accelerator.default_sections("gpu", quick=False) == accelerator.SECTIONS
    assert "paaso" not in accelerator.default_sections("gpu", quick=True)
    assert accelerator.parse_args(["--sections", "pso,paaso"]).sections == ("pso", "paaso")
    with pytest.raises(argparse.ArgumentTypeError, match="choose from"):
        accelerator._sections("pso,gpus")
    quick = accelerator.SIZES["quick"]
    assert quick.batches == (64,) and max(quick.swarms) <= 1000
    assert accelerator.SIZES["accelerator"].swarms[-1] == 10**6
    assert accelerator.SIZES["accelerator"].batches == (64, 256, 1024)
