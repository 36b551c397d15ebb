"""What swarmjax needs to know about the device it runs on, in one place.

* :func:`backend`, :func:`is_cpu`: the platform JAX computes on (``"cpu"``, ``"gpu"``,
  ``"tpu"``).
* :func:`device_memory_bytes`: the memory one device may use, in bytes (the runtime's
  ``bytes_limit`` where it reports one, the host's RAM otherwise).
* :func:`block_size`: runs per device per compiled call for :func:`swarmjax.sweep.run_sweep`
  (the CPU's cache-sized :data:`CPU_BLOCK`; on accelerators as many as a share of the
  device's memory holds, a power of two up to :data:`MAX_BLOCK`), and
  :func:`chunk_budget_bytes`, the default memory of a sweep chunk.
* :func:`default_client_map`: how the federated simulator maps its clients, and
  :func:`default_eval_batch`: test rows per chunk of a CNN's round evaluation.
* :func:`planned_backend`, :func:`configure_cpu_flags`: XLA's CPU flags (device count, LLVM
  level) set only when the backend will be the CPU, before JAX starts its backends.

The functions that decide take the platform and memory as arguments (defaults: this
process's), so they are pure and testable with made-up machines.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax

__all__ = [
    "ACCELERATOR_MEMORY_FRACTION",
    "COMPILATION_CACHE",
    "CPU_BLOCK",
    "CPU_CHUNK_BYTES",
    "MAX_BLOCK",
    "backend",
    "block_size",
    "chunk_budget_bytes",
    "configure_cpu_flags",
    "default_client_map",
    "default_eval_batch",
    "device_memory_bytes",
    "is_cpu",
    "memory_stats",
    "planned_backend",
    "use_compilation_cache",
]

COMPILATION_CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "swarmjax" / "jax"
)
"""Where Flower's nodes and server keep compiled programs by default (JAX's persistent
compilation cache; the experiments keep none unless ``--jax-cache`` names a folder)."""


def use_compilation_cache(path: str | os.PathLike[str]) -> None:
    """Keep every compiled program in ``path`` (JAX's persistent compilation cache) from
    now on, however fast it compiled: a later process with the same programs, flags and
    jaxlib loads them instead of compiling. Call it before the process's first
    compilation (JAX decides then whether the process uses the cache). ``""`` leaves the
    process's JAX configuration alone (an in-process loopback node). A compiled program
    keeps the constants it was traced with, so a program that closed over a secret key
    would store it in ``path``: a new folder is created owner-only, and the library's
    programs take keys as arguments (docs/privacy.md)."""
    if not str(path):
        return
    folder = Path(path).expanduser()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # programs may hold secrets
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


CPU_BLOCK = 128
"""Runs per device per call on the CPU.  A PAASO voting program (50 agents, f4) runs as
fast at 128 runs per device as at 512 or 1,024, and 20 % slower at 64, on the project's
2-core CPU (docs/paaso_speed.md): its working set then stays in the caches."""

MAX_BLOCK = 2**14
"""Upper bound of the runs per device per call on an accelerator.  16,384 runs of 50
agents are 819,200 agent lanes per call, three times what an H100 keeps resident
(132 SMs x 2,048 threads = 270,336); more would only add padding for small sweeps (every
call of a program has the block's shape, the last one padded)."""

ACCELERATOR_MEMORY_FRACTION = 0.25
"""Share of an accelerator's memory one call's runs may take (by the task's
``bytes_per_run`` estimate, which counts state and outputs, not XLA's temporaries)."""

CPU_CHUNK_BYTES = 2**30
"""Default memory of a sweep chunk on the CPU (1 GiB of runs)."""


def backend() -> str:
    """The default backend's platform: ``"cpu"``, ``"gpu"`` or ``"tpu"`` (starts JAX)."""
    return jax.default_backend()


def is_cpu(platform: str | None = None) -> bool:
    """Whether ``platform`` (default: :func:`backend`) is the CPU."""
    return (platform or backend()) == "cpu"


def _host_memory_bytes() -> int:
    """Physical memory of the host, bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def device_memory_bytes(device: jax.Device | None = None) -> int:
    """Memory ``device`` (default: the first local device) may use, in bytes.

    ``device.memory_stats()["bytes_limit"]`` where the runtime reports it (GPU, TPU), else
    the host's physical memory (the CPU backend reports nothing).
    """
    device = device if device is not None else jax.local_devices()[0]
    limit = memory_stats(device).get("bytes_limit")
    return int(limit) if limit else _host_memory_bytes()


def memory_stats(device: jax.Device) -> dict[str, Any]:
    """``device.memory_stats()`` (bytes in use, peak, limit...), or ``{}`` where the
    runtime reports nothing (the CPU) or does not implement it."""
    try:
        stats = device.memory_stats()
    except Exception:  # some runtimes do not implement it
        stats = None
    return dict(stats or {})


def _pow2_floor(n: float) -> int:
    """The largest power of two <= ``n`` (1 for ``n < 2``)."""
    return 1 << max(0, int(n).bit_length() - 1)


def block_size(
    bytes_per_run: int,
    *,
    platform: str | None = None,
    memory_bytes: int | None = None,
    fraction: float = ACCELERATOR_MEMORY_FRACTION,
    maximum: int = MAX_BLOCK,
) -> int:
    """Runs per device per compiled call of a sweep.

    CPU: :data:`CPU_BLOCK` (128), whatever the memory.  GPU/TPU: the largest power of two
    of runs whose ``bytes_per_run`` fit in ``fraction`` of ``memory_bytes`` (default: the
    first local device's, :func:`device_memory_bytes`), clamped to
    ``[CPU_BLOCK, maximum]``.  A function of the task's per-run footprint and the device
    only, never of the sweep, so a configuration gets the same block alone or inside any
    sweep on the same device.
    """
    if bytes_per_run < 1:
        raise ValueError(f"bytes_per_run must be >= 1; got {bytes_per_run}")
    if is_cpu(platform):
        return CPU_BLOCK
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1]; got {fraction}")
    memory = memory_bytes if memory_bytes is not None else device_memory_bytes()
    fits = _pow2_floor(fraction * memory / bytes_per_run)
    return max(CPU_BLOCK, min(_pow2_floor(maximum), fits))


def chunk_budget_bytes(
    *,
    platform: str | None = None,
    memory_bytes: int | None = None,
    devices: int | None = None,
    fraction: float = ACCELERATOR_MEMORY_FRACTION,
) -> int:
    """Default bytes of runs per sweep chunk (what is written to disk at once).

    CPU: :data:`CPU_CHUNK_BYTES` (1 GiB).  GPU/TPU: ``fraction`` of one device's memory
    times the process's device count (default: ``jax.local_device_count()``), so that a
    chunk holds at least one full call of :func:`block_size` runs per device.
    """
    if is_cpu(platform):
        return CPU_CHUNK_BYTES
    memory = memory_bytes if memory_bytes is not None else device_memory_bytes()
    count = devices if devices is not None else jax.local_device_count()
    return int(fraction * memory) * count


def default_client_map(platform: str | None = None) -> str:
    """How the federated simulator should map its clients on ``platform`` (default: this
    process's backend): ``"sequential"`` (``lax.map``, one client after another) on the CPU,
    ``"vmap"`` on GPU/TPU.

    On the CPU the runs' steps already fill the cores, a vmap makes every client run the
    largest client's step count, and XLA's CPU convolutions get slower batched: the full
    Table 1's DP call of experiments.fed_dp_pso (skewed clients, MLP) took 408 s sequential
    against 852 s vmapped (docs/fed_dp_pso.md); one FedAvg round of 50 digits clients with
    a LeNet-5 (SAME padding, 8x8x1) took 0.34 s sequential, 0.41 s vmapped, and compiled in
    15 s against 29 s (2-core CPU, loaded, 2026-11-25).  Small dense models can go the
    other way (10 clients, MLP 64-32-10: 37 ms vmapped, 59 ms sequential;
    ``python -m benchmarks.accelerator --sections fedround``), so pass
    ``Execution(client_map=...)`` explicitly there.  On an accelerator a vmap turns the
    clients into one wide kernel, which is what the device needs to be busy.  Both give the
    same result.
    """
    return "sequential" if is_cpu(platform) else "vmap"


CPU_EVAL_BATCH = 25
"""Test rows per evaluation chunk on the CPU (:func:`default_eval_batch`)."""

ACCELERATOR_EVAL_BATCH = 250
"""Test rows per evaluation chunk on an accelerator (:func:`default_eval_batch`)."""


def default_eval_batch(platform: str | None = None) -> int:
    """Test rows per chunk of a round's evaluation (``eval_batch_size``) for a CNN on
    ``platform`` (default: this process's backend): :data:`CPU_EVAL_BATCH` on the CPU,
    :data:`ACCELERATOR_EVAL_BATCH` on GPU/TPU.

    On the CPU a large chunk costs time and memory, not only memory: XLA allocates each
    execution's temporaries afresh, glibc maps a block above 32 MB with ``mmap`` and unmaps
    it when freed, so every round page-faults all of them in again, and a ``simple_cnn``
    chunk of 250 test rows holds 166 MB of patch columns alone. Measured on the 2-core AMD
    EPYC (2026-11-29, docs/cross_device.md): a 16-client vs_pfl round with 250 test rows
    took 100,000 page faults and 0.44 s in chunks of 250, 9,600 and 0.36 s in chunks of 25;
    ``experiments.cross_device --quick`` peaked at 1.17-1.20 GB resident against
    1.34-1.41 GB in chunks of 125. On an accelerator the chunks run one after another, so
    fewer, larger ones keep it busy (a GPU round of the vs_pfl work takes 10 ms)."""
    return CPU_EVAL_BATCH if is_cpu(platform) else ACCELERATOR_EVAL_BATCH


_ACCELERATOR_PLUGINS = {  # module of a JAX PJRT plugin -> platform
    "jax_cuda12_plugin": "gpu",
    "jax_cuda13_plugin": "gpu",
    "jax_rocm60_plugin": "gpu",
    "jax_rocm7_plugin": "gpu",
    "libtpu": "tpu",
}
_DEVICE_FILES = {"gpu": ("/dev/nvidia0", "/dev/kfd"), "tpu": ("/dev/accel0", "/dev/vfio/0")}


def planned_backend(
    environ: Mapping[str, str] | None = None,
    *,
    installed: Mapping[str, str] | None = None,
    device_files: Mapping[str, tuple[str, ...]] | None = None,
) -> str:
    """The platform JAX will pick, found without starting any backend (XLA reads
    ``XLA_FLAGS`` once, when it starts the first one).

    In order: the running backend if JAX has already started one; the first entry of
    ``JAX_PLATFORMS`` (``environ``, default ``os.environ``, then ``jax.config``'s
    ``jax_platforms``; ``cuda``/``rocm`` mean ``"gpu"``); an installed accelerator plugin
    (``installed``: plugin module -> platform, default: those importable here or
    registered under the ``jax_plugins`` entry point) whose device file exists
    (``/dev/nvidia0``, ``/dev/kfd``, ``/dev/accel0``, ...); otherwise ``"cpu"``.
    """
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        return jax.default_backend()
    env = os.environ if environ is None else environ
    platforms = env.get("JAX_PLATFORMS", "")
    if environ is None and not platforms:  # jax.config.update("jax_platforms", ...)
        platforms = jax.config.jax_platforms or ""
    first = platforms.split(",")[0].strip().lower()
    if first:
        return {"cuda": "gpu", "rocm": "gpu"}.get(first, first)
    if installed is None:
        installed = {m: p for m, p in _ACCELERATOR_PLUGINS.items() if _importable(m)}
        for entry in importlib.metadata.entry_points(group="jax_plugins"):
            installed.setdefault(entry.name, "tpu" if "tpu" in entry.name else "gpu")
    files = _DEVICE_FILES if device_files is None else device_files
    for platform in ("gpu", "tpu"):
        if platform in installed.values() and any(Path(f).exists() for f in files[platform]):
            return platform
    return "cpu"


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def configure_cpu_flags(
    devices: int | None = None,
    optimization_level: int | None = None,
    *,
    platform: str | None = None,
) -> bool:
    """Add XLA's CPU options to ``XLA_FLAGS`` when the backend will be the CPU (``platform``,
    default :func:`planned_backend`); call it before JAX starts its backends.

    ``devices``: ``--xla_force_host_platform_device_count`` (split the CPU into that many
    XLA devices, one per core; only when > 1).  ``optimization_level``:
    ``--xla_backend_optimization_level`` (LLVM's -O level).  An option already in
    ``XLA_FLAGS`` is kept as given.  Returns whether the backend is the CPU (nothing is
    changed otherwise).  Without ``platform``, once JAX has started its backends it only
    reports (XLA would no longer read the flags).
    """
    if platform is None:
        from jax._src import xla_bridge

        if xla_bridge.backends_are_initialized():
            return is_cpu()
    if (platform or planned_backend()) != "cpu":
        return False
    flags = os.environ.get("XLA_FLAGS", "")
    if devices is not None and devices > 1 and "xla_force_host_platform_device_count" not in flags:
        flags = f"{flags} --xla_force_host_platform_device_count={devices}"
    if optimization_level is not None and "xla_backend_optimization_level" not in flags:
        flags = f"{flags} --xla_backend_optimization_level={optimization_level}"
    os.environ["XLA_FLAGS"] = flags.strip()
    return True
