"""swarmjax.device: sizes and flags from the device, on made-up machines; the sweep's block
override keeps batch invariance exact for each block; experiments.paaso's --block."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from experiments import paaso as paaso_cli
from swarmjax import device, sweep
from swarmjax.paaso_sweep import PAASOTask, expand_phi
from tests.reproducible import SECRET

GIB = 2**30
H100 = 79 * GIB  # an H100's bytes_limit is about this


def test_cpu_block_is_the_cache_sized_128_whatever_the_memory():
    for memory in (GIB, 1024 * GIB):
        assert device.block_size(20_000, platform="cpu", memory_bytes=memory) == 128
    assert device.block_size(1, platform="cpu") == device.CPU_BLOCK == sweep.BLOCK


def test_accelerator_block_is_a_power_of_two_from_the_memory_budget():
    # 19,200 bytes per run (PAASO, 50 agents x 1000 iterations): a quarter of 79 GiB holds
    # ~1.1 M runs, capped at MAX_BLOCK
    assert device.block_size(19_200, platform="gpu", memory_bytes=H100) == device.MAX_BLOCK
    # 1 MiB per run in 4 GiB: a quarter holds 1024 runs exactly
    assert device.block_size(2**20, platform="gpu", memory_bytes=4 * GIB) == 1024
    # not a power of two: rounded down
    assert device.block_size(1_000_000, platform="tpu", memory_bytes=4 * GIB) == 1024
    # tiny devices or huge runs: never below the CPU's block
    assert device.block_size(GIB, platform="gpu", memory_bytes=GIB) == device.CPU_BLOCK
    assert device.block_size(10, platform="gpu", memory_bytes=H100, maximum=3000) == 2048
    assert device.block_size(2**20, platform="gpu", memory_bytes=4 * GIB, fraction=0.5) == 2048
    for bad in ({"fraction": 0.0}, {"fraction": 1.5}):
        with pytest.raises(ValueError, match="fraction"):
            device.block_size(100, platform="gpu", memory_bytes=GIB, **bad)
    with pytest.raises(ValueError, match="bytes_per_run"):
        device.block_size(0, platform="gpu", memory_bytes=GIB)


def test_chunk_budget_holds_at_least_one_call_of_the_block():
    assert device.chunk_budget_bytes(platform="cpu") == GIB
    budget = device.chunk_budget_bytes(platform="gpu", memory_bytes=H100, devices=8)
    assert budget == 8 * int(0.25 * H100)
    per_run = 2**20
    block = device.block_size(per_run, platform="gpu", memory_bytes=H100)
    assert budget // per_run >= 8 * block


def test_device_memory_from_bytes_limit_else_host_ram():
    class Fake:
        def __init__(self, stats):
            self.stats = stats

        def memory_stats(self):
            if isinstance(self.stats, Exception):
                raise self.stats
            return self.stats

    assert device.device_memory_bytes(Fake({"bytes_limit": H100, "bytes_in_use": 5})) == H100
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert device.device_memory_bytes(Fake(None)) == host
    assert device.device_memory_bytes(Fake(NotImplementedError())) == host
    if jax.default_backend() == "cpu":  # the CPU reports no stats
        assert device.device_memory_bytes() == host
    assert device.device_memory_bytes() > 0


def test_client_map_and_eval_chunk_follow_the_device():
    assert device.default_client_map("cpu") == "sequential"
    assert device.default_client_map("gpu") == device.default_client_map("tpu") == "vmap"
    assert device.default_eval_batch("cpu") == device.CPU_EVAL_BATCH == 25
    assert device.default_eval_batch("gpu") == device.default_eval_batch("tpu") == 250
    assert device.is_cpu() == (device.backend() == jax.default_backend() == "cpu")


def test_planned_backend_without_starting_one(monkeypatch):
    from jax._src import xla_bridge

    monkeypatch.setattr(xla_bridge, "backends_are_initialized", lambda: False)
    cuda = {"jax_cuda12_plugin": "gpu"}
    gpu_files = {"gpu": ("/",), "tpu": ("/nonexistent",)}
    no_files = {"gpu": ("/nonexistent",), "tpu": ("/nonexistent",)}
    plan = device.planned_backend
    assert plan({"JAX_PLATFORMS": "cpu"}, installed=cuda, device_files=gpu_files) == "cpu"
    assert plan({"JAX_PLATFORMS": "cuda,cpu"}, installed={}, device_files=no_files) == "gpu"
    assert plan({"JAX_PLATFORMS": "tpu"}, installed={}, device_files=no_files) == "tpu"
    assert plan({}, installed=cuda, device_files=gpu_files) == "gpu"
    assert plan({}, installed=cuda, device_files=no_files) == "cpu"  # plugin, no GPU
    assert plan({}, installed={}, device_files=gpu_files) == "cpu"  # GPU, no plugin
    assert plan() == jax.default_backend()  # this machine, as JAX started it


def test_cpu_flags_only_when_the_backend_is_the_cpu(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
    assert not device.configure_cpu_flags(4, 1, platform="gpu")
    assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/x"
    assert device.configure_cpu_flags(4, 1, platform="cpu")
    assert os.environ["XLA_FLAGS"] == (
        "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=4 "
        "--xla_backend_optimization_level=1"
    )
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0")
    assert device.configure_cpu_flags(1, 2, platform="cpu")  # one device: no count flag
    assert os.environ["XLA_FLAGS"] == "--xla_backend_optimization_level=0"  # kept as given
    # jax has started here: it reports the running backend and changes nothing
    assert device.configure_cpu_flags(8, 3) == (jax.default_backend() == "cpu")
    assert os.environ["XLA_FLAGS"] == "--xla_backend_optimization_level=0"


# FL's mean over agents and f5's transcendentals: where XLA's CPU code rounds differently
# at other batch widths (tests/test_sweep.py).
ROUNDING = {
    "strategy": ["fl", "pso"],
    "function": ["f4", "f5"],
    "iterations": 40,
    "num_agents": 10,
    "w": 0.4,
    "phi": 2.0,
    "w_g": 0.05,
}


@pytest.mark.parametrize("block", [16, 64])
def test_batch_invariance_is_exact_for_each_block(tmp_path, block):
    """With ``block`` runs per call, 3 seeds alone equal the same runs inside a 100-seed
    sweep cut into small chunks (other calls, other positions), bit for bit."""
    task = PAASOTask()
    grid = expand_phi({**ROUNDING, "seed": [3, 4, 50]})
    alone = sweep.run_sweep(task, grid, tmp_path / "a", progress=False, secret=SECRET, block=block)
    budget = 40 * task.bytes_per_run(ROUNDING | {"strategy": "fl", "function": "f4"})
    grid = expand_phi({**ROUNDING, "seed": list(range(100))})
    inside = sweep.run_sweep(
        task, grid, tmp_path / "b", progress=False, secret=SECRET, block=block, memory_budget=budget
    )
    assert len(alone) == 12 and len(inside) == 400 and inside.chunk.nunique() > 4
    plans = sweep.plan(task, expand_phi({**ROUNDING, "seed": [0]}), block=block)
    assert {c.block for c in plans} == {block * jax.local_device_count()}
    a, b = (sweep.load_trajectories(tmp_path / d) for d in "ab")
    inside_by_id = dict(zip(b[0].run_id, b[1], strict=True))
    for run_id, traj in zip(a[0].run_id, a[1], strict=True):
        np.testing.assert_array_equal(inside_by_id[run_id], traj)


def test_resume_under_another_block_finishes_every_run_once(tmp_path):
    task = PAASOTask()
    grid = expand_phi({**ROUNDING, "strategy": "pso", "function": "f4", "seed": list(range(30))})
    budget = 10 * task.bytes_per_run(ROUNDING | {"strategy": "pso", "function": "f4"})
    first = sweep.run_sweep(
        task,
        grid,
        tmp_path,
        memory_budget=budget,
        block=16,
        max_chunks=1,
        progress=False,
        secret=SECRET,
    )
    assert len(first) == 10
    done = sweep.run_sweep(task, grid, tmp_path, block=32, progress=False, secret=SECRET)
    assert len(done) == 30 and done.run_id.is_unique


def test_block_is_validated():
    with pytest.raises(ValueError, match="block"):
        sweep.plan(PAASOTask(), expand_phi({**ROUNDING, "seed": [0]}), block=0)


@pytest.mark.parametrize("value", ["0", "x"])
def test_paaso_cli_refuses_a_bad_block_in_one_line(value, capsys, monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("work started before the arguments were checked")

    monkeypatch.setattr(paaso_cli, "_setup_devices", no_work)
    with pytest.raises(SystemExit) as exit_info:
        paaso_cli.main(["--block", value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "--block" in err and len(err.splitlines()) == 1
    assert paaso_cli.parse_args(["--block", "256"]).block == 256
    assert paaso_cli.parse_args([]).block is None
