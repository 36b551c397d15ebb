"""Sweep runner: batch invariance, one compilation per group, resume, validation."""

import hashlib
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pandas as pd
import pytest

from swarmjax import sweep
from swarmjax.paaso_sweep import PAASOTask, expand_phi
from tests.reproducible import SECRET


class CountingTask(PAASOTask):
    """PAASOTask that counts how often each group's function is traced."""

    def __init__(self, **kw):
        super().__init__(**kw)
        object.__setattr__(self, "traces", {})

    def batched(self, static):
        inner = super().batched(static)
        key = json.dumps(static, sort_keys=True)

        def counted(numeric, seeds, shared):
            self.traces[key] = self.traces.get(key, 0) + 1
            return inner(numeric, seeds, shared)

        return counted


SMALL = {"strategy": "pbdrd", "function": "f4", "iterations": 40, "num_agents": 20}


def test_batch_invariance_alone_vs_inside_10000_runs(tmp_path):
    alone = {**SMALL, "w": 0.4, "phi": 1.0, "w_g": 0.1, "p_m": 0.8, "seed": [7]}
    big = {
        **SMALL,
        "w": [*list(np.linspace(0.12, 0.88, 25)), 0.4],
        "phi": [0.5, 1.0, 1.5, 2.0],
        "w_g": [0.05, 0.1, 0.2, 0.4],
        "p_m": [0.6, 0.8],
        "seed": list(range(12)),
    }
    big_runs = 26 * 4 * 4 * 2 * 12
    assert big_runs >= 9984
    a = sweep.run_sweep(
        PAASOTask(), expand_phi(alone), tmp_path / "a", progress=False, secret=SECRET
    )
    b = sweep.run_sweep(
        PAASOTask(),
        expand_phi(big),
        tmp_path / "b",
        progress=False,
        secret=SECRET,
        memory_budget=2**22,
    )
    assert len(b) == big_runs
    row = b[
        (np.isclose(b.w, 0.4))
        & (b.phi_p == 1.0)
        & np.isclose(b.w_g, 0.1)
        & np.isclose(b.p_m, 0.8)
        & (b.seed == 7)
    ]
    assert len(row) == 1
    assert row.final_objective.item() == a.final_objective.item()
    traj_a = sweep.load_arrays(tmp_path / "a", [a.chunk[0]])["objective"][0]
    chunk = row.chunk.item()
    traj_chunk = sweep.load_arrays(tmp_path / "b", [chunk])["objective"]
    index = list(b.index[b.chunk == chunk]).index(row.index[0])
    np.testing.assert_array_equal(traj_chunk[index], traj_a)


def test_one_compilation_per_program_whatever_the_function_voting_strategy_or_k(tmp_path):
    task = CountingTask()
    grid = {
        **SMALL,
        "strategy": ["pso", "adrd", "pbdrd"],  # adrd and pbdrd: one program
        "function": ["f4", "f7"],  # data
        "k_alpha": [4, 8],  # data for the voting strategies (PSO ignores it)
        "w": list(np.linspace(0.1, 0.9, 25)),
        "phi": [1.0, 2.0],
        "seed": list(range(20)),
    }  # 1000 configurations per strategy, function and (voting) k_alpha
    chunks = sweep.plan(task, expand_phi(grid), memory_budget=200 * task.bytes_per_run(SMALL))
    assert len(chunks) > 4 and len({c.block for c in chunks}) == 1
    df = sweep.run_sweep(
        task,
        expand_phi(grid),
        tmp_path,
        memory_budget=200 * task.bytes_per_run(SMALL),
        progress=False,
        secret=SECRET,
    )
    assert len(df) == (1 + 2 * 2) * 2 * 25 * 2 * 20
    assert sorted(task.traces.values()) == [1, 1]
    programs = [json.loads(k) for k in task.traces]
    assert sorted(p["strategy"] for p in programs) == ["pso", "voting"]
    assert {p["function"] for p in programs} == {None}
    assert sorted(p["k_alpha"] for p in programs if p["strategy"] == "voting") == [None]


# FL (its mean over agents) and f5 (sin, sqrt) are where XLA's CPU code rounds differently
# at other batch widths: 19-20 of 20 runs differed between vmap over 20 and over 128 runs.
ROUNDING = {
    "strategy": ["fl", "pso"],
    "function": ["f4", "f5"],
    "iterations": 60,
    "num_agents": 10,
    "w": 0.4,
    "phi": 2.0,
    "w_g": 0.05,
}


def _trajectories_by_run_id(out_dir):
    rows, traj = sweep.load_trajectories(out_dir)
    return dict(zip(rows.run_id, traj, strict=True))


def test_runs_alone_equal_the_same_runs_inside_a_larger_sweep_bit_for_bit(tmp_path):
    """Every chunk runs in calls of one block (BLOCK runs per device): 5 seeds alone and
    inside a 300-seed sweep (other chunk, other positions) give the same trajectories even
    where XLA rounds differently at other batch widths, and each program compiles once."""
    task = PAASOTask()
    before = sweep.STATS.compilations
    grid = expand_phi({**ROUNDING, "seed": list(range(5))})
    sweep.run_sweep(task, grid, tmp_path / "a", progress=False, secret=SECRET)
    assert sweep.STATS.compilations == before + 2  # pso, fl: the function is data
    grid = expand_phi({**ROUNDING, "seed": list(range(300))})
    sweep.run_sweep(task, grid, tmp_path / "b", progress=False, secret=SECRET)
    assert sweep.STATS.compilations == before + 2
    alone, inside = (_trajectories_by_run_id(tmp_path / d) for d in "ab")
    assert len(alone) == 20 and len(inside) == 1200
    for run_id, traj in alone.items():
        np.testing.assert_array_equal(inside[run_id], traj)
    assert {c.block for c in sweep.plan(task, expand_phi(SMALL))} == {
        sweep.BLOCK * jax.local_device_count()
    }


def test_two_xla_devices_give_the_numbers_of_one(tmp_path):
    """A block sharded over two CPU devices computes each run as one device alone does."""
    grid = expand_phi({**ROUNDING, "seed": list(range(6))})
    sweep.run_sweep(PAASOTask(), grid, tmp_path / "one", progress=False, secret=SECRET)
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2"
    code = (
        "import jax, sys; from swarmjax import sweep; from swarmjax.paaso_sweep import PAASOTask;"
        f"assert jax.local_device_count() == 2; sweep.run_sweep(PAASOTask(), {grid!r}, "
        "sys.argv[1], progress=False)"
    )
    (tmp_path / "two").mkdir()  # the same secret: a sweep folder holding one draws with it
    SECRET.save(tmp_path / "two" / sweep.SWEEP_SECRET)
    subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "two")],
        check=True,
        env={**os.environ, "XLA_FLAGS": flags.strip()},
        timeout=300,
    )
    one, two = (_trajectories_by_run_id(tmp_path / d) for d in ("one", "two"))
    assert one.keys() == two.keys() and len(one) == 24
    for run_id, traj in one.items():
        np.testing.assert_array_equal(two[run_id], traj)


def test_run_ids_hash_the_json_of_group_configuration_and_seed():
    """The id folders on disk were written with: resumable across versions."""
    configs = [{"w": 0.5, "phi_p": 1.0}] * 2 + [{"w": 0.25, "phi_p": 2.0}]
    ids = sweep._run_ids("g-1", configs, [0, 7, 7])
    expected = [
        hashlib.sha1(json.dumps(["g-1", c, s], sort_keys=True).encode()).hexdigest()[:16]
        for c, s in zip(configs, [0, 7, 7], strict=True)
    ]
    assert ids == expected and len(set(ids)) == 3


def test_irrelevant_parameters_are_collapsed():
    grid = expand_phi(
        {**SMALL, "strategy": "pso", "p_m": [0.6, 0.7, 0.8], "w_g": [0.1, 0.2], "seed": [0, 1]}
    )
    chunks = sweep.plan(PAASOTask(), grid)
    assert sum(c.size for c in chunks) == 2  # PSO ignores p_m and w_g


def test_resume_after_interruption_loses_and_duplicates_nothing(tmp_path, monkeypatch):
    grid = expand_phi({**SMALL, "w": list(np.linspace(0.1, 0.9, 10)), "seed": list(range(10))})
    task = PAASOTask()
    budget = 10 * task.bytes_per_run(SMALL)
    partial = sweep.run_sweep(
        task, grid, tmp_path, memory_budget=budget, max_chunks=3, progress=False, secret=SECRET
    )
    assert len(partial) == 30
    first = sorted((tmp_path / "parts").glob("*.csv"))
    stamps = {p.name: p.stat().st_mtime_ns for p in first}

    calls = {"n": 0}
    original = PAASOTask.rows

    def crash_on_second(self, *args):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return original(self, *args)

    monkeypatch.setattr(PAASOTask, "rows", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(task, grid, tmp_path, memory_budget=budget, progress=False, secret=SECRET)
    monkeypatch.setattr(PAASOTask, "rows", original)
    assert len(sweep.load_results(tmp_path)) == 40
    assert not list((tmp_path / "parts").glob("*.tmp"))

    full = sweep.run_sweep(
        task, grid, tmp_path, memory_budget=budget, progress=False, secret=SECRET
    )
    assert len(full) == 100
    assert not full.duplicated(["w", "seed"]).any()
    for p in first:
        assert p.stat().st_mtime_ns == stamps[p.name]  # finished chunks were not rerun
    fresh = sweep.run_sweep(
        task, grid, tmp_path / "fresh", memory_budget=budget, progress=False, secret=SECRET
    )
    pd.testing.assert_series_equal(
        full.sort_values(["w", "seed"]).final_objective.reset_index(drop=True),
        fresh.sort_values(["w", "seed"]).final_objective.reset_index(drop=True),
    )


def test_resume_under_other_chunking_keeps_every_run_exactly_once(tmp_path):
    """Interrupted under one memory budget, resumed under two others (other chunk sizes and
    padded shapes): every (configuration, seed) once, numbers equal to a fresh sweep."""
    grid = expand_phi({**SMALL, "w": list(np.linspace(0.1, 0.9, 10)), "seed": list(range(10))})
    task = PAASOTask()
    per_run = task.bytes_per_run(SMALL)
    sweep.run_sweep(
        task, grid, tmp_path, memory_budget=7 * per_run, max_chunks=3, progress=False, secret=SECRET
    )
    assert len(sweep.load_results(tmp_path)) == 21
    sweep.run_sweep(
        task,
        grid,
        tmp_path,
        memory_budget=16 * per_run,
        max_chunks=2,
        progress=False,
        secret=SECRET,
    )
    assert len(sweep.finished_run_ids(tmp_path)) == 53
    resumed = sweep.run_sweep(
        task, grid, tmp_path, memory_budget=2**30, progress=False, secret=SECRET
    )
    assert len(resumed) == 100 and resumed.run_id.is_unique
    assert not resumed.duplicated(["w", "seed"]).any()
    fresh = sweep.run_sweep(task, grid, tmp_path / "fresh", progress=False, secret=SECRET)
    merged = resumed.merge(fresh, on="run_id", suffixes=("", "_fresh"))
    assert len(merged) == 100
    np.testing.assert_array_equal(merged.final_objective, merged.final_objective_fresh)
    rows, traj = sweep.load_trajectories(tmp_path)
    rows_f, traj_f = sweep.load_trajectories(tmp_path / "fresh")
    order = rows_f.reset_index().set_index("run_id").loc[rows.run_id, "index"].to_numpy()
    np.testing.assert_array_equal(traj, traj_f[order])


def test_a_different_grid_in_the_same_directory_is_refused(tmp_path):
    grid = {**SMALL, "strategy": "pso", "iterations": 5, "seed": [0]}
    sweep.run_sweep(PAASOTask(), grid, tmp_path, progress=False, secret=SECRET)
    with pytest.raises(ValueError, match="out_dir"):
        sweep.run_sweep(PAASOTask(), {**grid, "seed": [1]}, tmp_path, progress=False, secret=SECRET)


@pytest.mark.parametrize(
    ("grid", "name"),
    [
        ({}, "grid"),
        ({**SMALL, "w": []}, "w"),
        ({**SMALL, "strategy": "swim"}, "strategy"),
        ({**SMALL, "function": "f0"}, "function"),
        ({**SMALL, "p_m": [0.5, 1.5]}, "p_m"),
        ({**SMALL, "p_c": -0.5}, "p_c"),
        ({**SMALL, "w_g": -0.1}, "w_g"),
        ({**SMALL, "k_alpha": 1}, "k_alpha"),
        ({**SMALL, "temperature": 3}, "temperature"),
        ({**SMALL, "seed": [-1]}, "seed"),
    ],
)
def test_invalid_grids_fail_before_compiling(tmp_path, grid, name):
    task = CountingTask()
    with pytest.raises(ValueError, match=name):
        sweep.run_sweep(task, grid, tmp_path, progress=False, secret=SECRET)
    assert task.traces == {}


def test_runs_draw_from_the_sweep_secret_not_the_seed(tmp_path):
    """Two sweeps of one grid in two folders draw from two fresh secrets (different numbers
    for equal seeds); a folder's saved secret (owner-only) is reused on a resume; common
    random numbers are refused a ledger before any work, and a folder keeps its choice."""
    grid = expand_phi({**SMALL, "w": [0.3, 0.6], "seed": [0, 1]})
    a = sweep.run_sweep(PAASOTask(), grid, tmp_path / "a", progress=False)
    b = sweep.run_sweep(PAASOTask(), grid, tmp_path / "b", progress=False)
    merged = a.merge(b, on="run_id", suffixes=("_a", "_b"))
    assert len(merged) == 4
    assert not np.any(merged.final_objective_a.to_numpy() == merged.final_objective_b.to_numpy())
    path = tmp_path / "a" / sweep.SWEEP_SECRET
    saved = path.read_bytes()
    assert oct(path.stat().st_mode)[-3:] == "600"
    again = sweep.run_sweep(PAASOTask(), grid, tmp_path / "a", progress=False)  # all reused
    assert path.read_bytes() == saved
    pd.testing.assert_frame_equal(
        again.sort_values("run_id", ignore_index=True), a.sort_values("run_id", ignore_index=True)
    )
    crn = sweep.run_sweep(
        PAASOTask(), grid, tmp_path / "c", progress=False, common_random_numbers=True
    )
    assert len(crn) == 4
    from swarmjax.privacy.ledger import Ledger

    ledger = Ledger(tmp_path / "ledger", "t", delta=1e-5)
    with pytest.raises(ValueError, match="common_random_numbers"):
        sweep.run_sweep(
            PAASOTask(),
            grid,
            tmp_path / "d",
            progress=False,
            common_random_numbers=True,
            ledger=ledger,
        )
    assert not (tmp_path / "d").exists()
    with pytest.raises(ValueError, match="common_random_numbers"):
        sweep.run_sweep(PAASOTask(), grid, tmp_path / "c", progress=False)
