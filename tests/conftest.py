"""Shared fixtures: where the offline datasets are, and a skip when they are not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The suite is compile-bound: its programs are small and run once or twice, and most of a
# test's time is XLA's CPU compiler. Two flags cut it without changing results beyond
# float32 rounding (tests/test_compile_level.py checks a DP run and a PAASO swarm against
# XLA's defaults; docs/testing.md has the measurements):
# * LLVM at -O0 (a vmapped threefry draw compiles in 3.4 s at the default -O2, 0.15 s at
#   -O0; -O2 fuses multiply-adds);
# * XLA's legacy elemental fusion emitters instead of the MLIR fusion emitters
#   (``--xla_cpu_use_fusion_emitters=false``): 37-40 % less compile CPU on test_fedavg,
#   test_dpsgd and test_paaso; fusions may round differently, so two formulations of one
#   computation that are bitwise equal at XLA's defaults are compared to 1e-6 here.
# Each is added unless XLA_FLAGS already sets it; processes the tests start (SuperNodes,
# sweep workers, experiment subprocesses) inherit them. Experiments and benchmarks run at
# XLA's defaults.
SUITE_XLA_FLAGS = {
    "xla_backend_optimization_level": "0",
    "xla_cpu_use_fusion_emitters": "false",
}
_flags = os.environ.get("XLA_FLAGS", "")
_added = [f"--{k}={v}" for k, v in SUITE_XLA_FLAGS.items() if k not in _flags]
if _added:
    os.environ["XLA_FLAGS"] = " ".join([_flags, *_added]).strip()


def shared_data_dir() -> Path | None:
    """``$SWARMJAX_DATA`` if set, else ``../shared/data`` beside the checkout, else the
    user's data cache (``python -m swarmjax.data fetch``), whichever is present first."""
    from swarmjax.data import default_data_dir

    env = os.environ.get("SWARMJAX_DATA")
    candidates = [Path(env)] if env else []
    candidates += [REPO.parent / "shared" / "data", default_data_dir()]
    for path in candidates:
        if path.is_dir():
            return path
    return None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The offline data folder; tests that need it skip with a reason when it is absent."""
    path = shared_data_dir()
    if path is None:
        pytest.skip(
            "offline datasets not found: run `python -m swarmjax.data fetch all` or set "
            "SWARMJAX_DATA"
        )
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
