"""Shared fixtures: where the offline datasets are, and a skip when they are not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The suite is compile-bound: its programs are small and run once or twice, and XLA's CPU
# backend spends most of a test's time in LLVM (a vmapped threefry draw compiles in 3.4 s at
# the default -O2, 0.15 s at -O0). LLVM's level changes the speed of the code, not its
# results beyond float32 rounding (-O2 fuses multiply-adds; test_compile_level.py checks
# a DP run and a PAASO swarm both ways), so the tests compile at -O0 unless XLA_FLAGS
# already sets a level. Processes the tests start (SuperNodes, sweep workers) inherit it.
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_backend_optimization_level" not in _flags:
    os.environ["XLA_FLAGS"] = f"{_flags} --xla_backend_optimization_level=0".strip()


def shared_data_dir() -> Path | None:
    """``$SWARMJAX_DATA`` if set, else ``../shared/data`` beside the checkout, if present."""
    env = os.environ.get("SWARMJAX_DATA")
    candidates = [Path(env)] if env else []
    candidates.append(REPO.parent / "shared" / "data")
    for path in candidates:
        if path.is_dir():
            return path
    return None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The offline data folder; tests that need it skip with a reason when it is absent."""
    path = shared_data_dir()
    if path is None:
        pytest.skip("offline datasets not found: set SWARMJAX_DATA or place ../shared/data")
    return path


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
    """After each test module, drop JAX's compiled programs. A long-lived xdist worker
    otherwise keeps every program of the ~950 tests mapped; late in the suite XLA's CPU
    compiler segfaulted twice (in whichever test compiled then), as a process nearing the
    kernel's memory-map limit (vm.max_map_count, 65,530 here) does. Programs shared within
    a module stay cached."""
    yield
    import gc

    import jax

    jax.clear_caches()
    gc.collect()
