"""Shared fixtures: where the offline datasets are, and a skip when they are not; the
suite's compile settings (XLA flags, one persistent compilation cache per run) and the
order in which its modules start (longest first)."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The suite is compile-bound: its programs are small and run once or twice, and most of a
# test's time is XLA's CPU compiler. Three flags cut it without changing results beyond
# float32 rounding (tests/test_compile_level.py checks a DP run and a PAASO swarm against
# XLA's defaults; docs/testing.md has the measurements):
# * LLVM at -O0 (a vmapped threefry draw compiles in 3.4 s at the default -O2, 0.15 s at
#   -O0; -O2 fuses multiply-adds);
# * XLA's legacy elemental fusion emitters instead of the MLIR fusion emitters
#   (``--xla_cpu_use_fusion_emitters=false``): 37-40 % less compile CPU on test_fedavg,
#   test_dpsgd and test_paaso; fusions may round differently, so two formulations of one
#   computation that are bitwise equal at XLA's defaults are compared to 1e-6 here;
# * one LLVM module per program (``--xla_cpu_parallel_codegen_split_count=1``): XLA splits a
#   program's module to compile the parts on parallel threads, which buys nothing when every
#   core is busy with another worker's compilation and costs 9-15 % of the suite's CPU
#   (session 31: test_fedavg + test_dp_fedavg + test_paaso 35.8 -> 29.2-31.1 CPU-s,
#   test_fl_protocol + test_distributed_dp 74.3 -> 67.8).
# Each is added unless XLA_FLAGS already sets it; processes the tests start (SuperNodes,
# sweep workers, experiment subprocesses) inherit them. Experiments and benchmarks run at
# XLA's defaults.
SUITE_XLA_FLAGS = {
    "xla_backend_optimization_level": "0",
    "xla_cpu_use_fusion_emitters": "false",
    "xla_cpu_parallel_codegen_split_count": "1",
}
_flags = os.environ.get("XLA_FLAGS", "")
_added = [f"--{k}={v}" for k, v in SUITE_XLA_FLAGS.items() if k not in _flags]
if _added:
    os.environ["XLA_FLAGS"] = " ".join([_flags, *_added]).strip()

# JAX's persistent compilation cache, one per run of the suite: a program compiled once is
# loaded, not compiled again, by the other xdist worker, by a later module (the in-memory
# caches are cleared after each module, below) and by the processes the tests start
# (SuperNodes, sweep workers, experiment subprocesses), which inherit the variables. The
# key covers the program, XLA_FLAGS and the jaxlib version, so nothing compiled under other
# flags is reused (tests/test_compile_level.py's two levels stay apart). The folder is the
# run's own (created here by the first process, xdist's controller; its workers see the
# variable set) and removed when that process ends. Measured in docs/testing.md; a
# JAX_COMPILATION_CACHE_DIR already set is kept (set it empty to run without the cache).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache_dir = tempfile.mkdtemp(prefix="swarmjax-tests-jax-cache-")
    atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache_dir
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    if "jax" in sys.modules:  # a plugin imported JAX before this file: configure it too
        import jax

        jax.config.update("jax_compilation_cache_dir", _cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


# Seconds of the longest modules in a whole-suite run (`-n 3`, 2026-11-29, session 26: three
# workers sharing 2 cores, so each figure is about 1.5x the module alone; the Flower modules
# by wall time, their processes mostly wait; test_mesh.py with its subprocesses). xdist hands
# out whole modules (pyproject.toml: ``--dist loadscope --no-loadscope-reorder``, so that a
# module's shared fixtures and compiled programs are made once, on one worker; the Flower
# modules together, WAITING_MODULES below) in the order collected; starting the longest first
# leaves short modules for the end, when the other workers may already be idle. A stale number
# costs balance only; modules not listed keep their order.
MODULE_SECONDS = {
    "test_flower_secagg.py": 220,
    "test_experiment_ledgers.py": 154,
    "test_mesh.py": 134,
    "test_fl_protocol.py": 129,
    "test_work_cap.py": 119,
    "test_flower_deployment.py": 119,
    "test_distributed_dp.py": 104,
    "test_experiment_fed_dp_pso.py": 72,
    "test_canaries.py": 35,
    "test_experiment_cross_device_ftrl.py": 35,
    "test_summed_exchange.py": 33,
    "test_compile_level.py": 29,
    "test_lora.py": 26,
    "test_canaries_fedavg_record.py": 23,
    "test_experiment_dp_fedavg.py": 23,
    "test_fed_dp_pso.py": 23,
    "test_sweep.py": 22,
    "test_privacy_relations.py": 22,
    "test_shakespeare.py": 21,
    "test_flower_runtime.py": 19,
    "test_canaries_ftrl.py": 19,
    "test_snapping.py": 18,
    "test_audit_power.py": 18,
    "test_private_plans.py": 18,
    "test_canaries_shared_noise.py": 18,
    "test_fed_dp_pso_readings.py": 18,
    "test_benchmark_secagg.py": 18,  # session 27: 12 s alone
}


# Modules whose tests mostly wait on other processes: a Flower SuperNode that finds no message
# sleeps 3 s before it asks again (flwr/supernode/start_client_internal.py), so their wall
# time is several times their CPU. They form ONE xdist work unit (below), so one worker
# waits through them while the others keep both cores busy: the README runs three workers on
# the 2-core CI machine for that reason (docs/testing.md, session 26).
WAITING_MODULES = frozenset(
    {"test_flower_secagg.py", "test_flower_deployment.py", "test_flower_relay.py"}
)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadscope`` with :data:`WAITING_MODULES` as one work unit (one worker runs
    them one after the other); every other module is its own unit, as in loadscope."""
    if config.getoption("dist", None) != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class _Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if Path(nodeid.split("::", 1)[0]).name in WAITING_MODULES:
                return "modules-waiting-on-processes"
            return super()._split_scope(nodeid)

    return _Scheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest modules first (:data:`MODULE_SECONDS`); a stable sort, so each module's
    tests stay together and in their order."""
    items.sort(key=lambda item: -MODULE_SECONDS.get(item.path.name, 0))


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


def _process_maps_and_rss() -> tuple[int, int] | None:
    """This process's memory maps and resident bytes (Linux's ``/proc``), else ``None``."""
    try:
        with open("/proc/self/maps", "rb") as f:
            maps = sum(1 for _ in f)
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read())
    except (OSError, ValueError, IndexError):
        return None
    return maps * 65_530 // max(limit, 1), rss


# When a module ends, JAX's compiled programs are dropped only past these: memory maps (as
# if the kernel's limit were 65,530; a small program maps about 3, and one module,
# test_fl_protocol.py, added up to 20,000: the margin is for the module after the check)
# or resident memory.
CLEAR_CACHES_AT_MAPS = 20_000
CLEAR_CACHES_AT_RSS = 6 * 2**30


# what an experiment's options export to its process: ``--data-dir`` (for the processes it
# starts) and ``--no-progress`` (read by tqdm)
EXPERIMENT_ENV = ("SWARMJAX_DATA", "TQDM_DISABLE")


@pytest.fixture(autouse=True)
def _experiment_env_restored():
    """What an experiment exports (:data:`EXPERIMENT_ENV`) is restored (or removed) after
    each test, so a test's temporary folder never becomes the next test's data folder on
    the same worker, nor one test's ``--no-progress`` the next test's setting. By hand,
    not through ``monkeypatch``: an autouse fixture that requested it would put
    ``monkeypatch`` in every test's fixtures, and :func:`_free_compiled_programs` would drop
    JAX's programs after every module (it did from session 27 to 30: docs/testing.md,
    session 30)."""
    values = {name: os.environ.get(name) for name in EXPERIMENT_ENV}
    yield
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs(request: pytest.FixtureRequest):
    """After a test module, drop JAX's compiled programs when the process holds many, or when
    one of the module's tests patched something (``monkeypatch``: a program traced with a
    test's replacement, e.g. a weakened noise mechanism or a smaller buffer, must not be
    reused by another module under the same static arguments). A long-lived xdist worker
    otherwise keeps every program of its half of the suite mapped; late in the suite XLA's
    CPU compiler segfaulted twice (in whichever test compiled then), as a process nearing
    the kernel's memory-map limit (vm.max_map_count, 65,530 here) does. Until then the
    programs stay: the library's own (the run's init, ChaCha20's key operations, eager ops)
    are traced, lowered and loaded once per worker instead of once per module (10 % less
    CPU over six DP modules; docs/testing.md, session 23). Where ``/proc`` cannot be read,
    they are dropped after every module, as before."""
    yield
    held = _process_maps_and_rss()
    patched = any(
        "monkeypatch" in item.fixturenames
        for item in request.session.items
        if item.path == request.node.path
    )
    if (
        not patched
        and held is not None
        and held[0] < CLEAR_CACHES_AT_MAPS
        and held[1] < CLEAR_CACHES_AT_RSS
    ):
        return
    import gc

    import jax

    jax.clear_caches()
    gc.collect()
