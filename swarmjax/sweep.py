"""Grids of configurations run as chunked, jit-compiled, vmapped (and sharded) calls.

A *task* says which grid keys change shapes (static: one compiled program per distinct
combination, a *group*) and which are numeric (stacked as arrays and vmapped over).  A
task may let several groups share one compiled *program*: ``task.program(static)`` splits a
group's static values into the program's and unbatched data the chunk passes to it (PAASO:
the benchmark function and the voting strategy are data).  The runner expands the grid,
groups it, cuts each group into chunks sized to a memory budget, runs each chunk as calls
of one fixed-size *block* of runs per device (the last call padded; by default from the
device, :func:`swarmjax.device.block_size`: the CPU's cache-sized :data:`BLOCK` = 128, on a
GPU/TPU as many as a share of its memory holds; ``run_sweep(block=...)`` overrides),
shards each block over the process's devices when there are several, and writes each
finished chunk to disk at once (``parts/<chunk>.csv`` plus ``parts/<chunk>.npz`` with
per-run arrays, written to a temporary name and renamed).  One block size means one
compilation per program, whatever the chunk sizes.

Identity from content: every run has a ``run_id`` (a hash of its group, numeric
configuration and seed, a column of every row) and a chunk's id hashes its runs' ids.  A
sweep that is interrupted resumes from the runs already on disk, whatever chunking wrote
them: the finished ``run_id`` s are removed from the plan before the rest is chunked, so a
resume under another memory budget or device count ends with every run exactly once.

Several processes (``jax.distributed``): process ``i`` of ``N`` owns the ``i``-th of ``N``
contiguous slices of every group's runs (a function of the grid only), runs them on its
own devices and writes into the same folder; the union is the one-process sweep.

Every run's key is the sweep's secret (:class:`~swarmjax.privacy.secret.Secret`: 256 bits
of operating-system entropy, saved as ``secret.key`` in the sweep folder, which is never
released, so a resumed sweep draws the same numbers; or the caller's, reproducible mode) as
a ChaCha20 key with the run's ``run_id`` folded in: no run's draws follow from its seed or
settings, and no two runs share them.  ``common_random_numbers=True`` folds in the seed
instead, so runs with the same seed in different configurations share random streams
(paired comparisons; a ledger then states no finite joint epsilon for them).  Every run of
a program is computed in a block of the same shape, so on a given backend and block size a
run's result does not depend on what else is in its chunk, on the chunking or on the device
count (batch invariance, bit for bit: XLA rounds some reductions and transcendentals
differently at other batch widths, since it tiles and vectorises them by shape, so a fixed
block is what makes this exact; another block size or backend may differ at float
rounding).  The default block depends only on the task's per-run footprint and the device,
never on the rest of the sweep.

Privacy ledger: ``run_sweep(..., ledger=...)`` adds the sweep's runs to an experiment's
:class:`swarmjax.privacy.ledger.Ledger` through the task's optional
``releases(rows, path, *, delta, accountant, randomness)`` (PAASO: one release per
configuration, stating its runs' randomness: the secret's source and the joint fingerprint
of their keys, :func:`run_randomness`), and lists the sweep folder as not released when the
task's ``not_released`` says why its raw rows are private state.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import jax
import numpy as np
import pandas as pd
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import PRNGKeyArray
from tqdm.auto import tqdm

from swarmjax import device
from swarmjax._validation import check_int, check_positive
from swarmjax.privacy.ledger import Ledger
from swarmjax.privacy.secret import (
    Secret,
    fingerprints,
    fold_words,
    joint_fingerprint,
    randomness,
)
from swarmjax.resume import OutputConflict, write_atomic

__all__ = [
    "BLOCK",
    "STATS",
    "Chunk",
    "RunnerStats",
    "SweepTask",
    "finished_run_ids",
    "load_arrays",
    "load_results",
    "load_trajectories",
    "plan",
    "run_randomness",
    "run_sweep",
]

Outputs = dict[str, np.ndarray]


class SweepTask(Protocol):
    """What the runner needs to know about an experiment family."""

    name: str
    static_keys: tuple[str, ...]
    numeric_defaults: Mapping[str, float]

    def normalise(self, static: dict[str, Any], numeric: dict[str, float]) -> None:
        """Validate one configuration (raise ValueError) and reset irrelevant numerics."""

    def program(self, static: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """A group's ``static`` values split into its compiled program's (groups with equal
        ones share it) and the scalar data the group passes to that program."""

    def batched(self, program: Mapping[str, Any]) -> Callable[..., dict[str, jax.Array]]:
        """``fn(numeric: dict[str, (B,)], keys: (B,) typed PRNG keys, data: dict[str, ()])
        -> dict of (B, ...)`` (jit-able) for a ``program`` from :meth:`program`; run ``b``
        draws every random number from ``keys[b]``."""

    def bytes_per_run(self, static: Mapping[str, Any]) -> int:
        """Device memory one run needs, for chunk sizing."""

    def rows(
        self,
        static: Mapping[str, Any],
        numeric: Mapping[str, np.ndarray],
        seeds: np.ndarray,
        outputs: Outputs,
    ) -> pd.DataFrame:
        """One row per run from the outputs."""

    def arrays(self, outputs: Outputs) -> Outputs:
        """Per-run arrays (e.g. trajectories) to keep in the chunk's ``.npz``."""


@dataclass(frozen=True)
class Chunk:
    """A slice of one group: ``size`` real runs, run in calls of ``block`` runs (the last
    call padded)."""

    chunk_id: str
    group_id: str
    static: dict[str, Any]
    numeric: dict[str, np.ndarray]
    seeds: np.ndarray
    block: int
    run_ids: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return int(self.seeds.shape[0])


@dataclass
class _Group:
    static: dict[str, Any]
    configs: list[dict[str, float]] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)


def _as_list(name: str, value: Any) -> list[Any]:
    values = list(value) if isinstance(value, list | tuple | np.ndarray | range) else [value]
    if not values:
        raise ValueError(f"grid entry {name!r} is an empty list")
    return values


def _group_id(static: Mapping[str, Any]) -> str:
    text = json.dumps(static, sort_keys=True, default=str)
    readable = "-".join(str(v) for v in static.values()).replace("/", "_")[:60]
    return f"{readable}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def _expand(task: SweepTask, grid: Mapping[str, Any]) -> list[_Group]:
    if not grid:
        raise ValueError("grid is empty: give at least one configuration")
    seeds = _as_list("seed", grid.get("seed", [0]))
    for s in seeds:
        check_int("seed", s, minimum=0)
    known = set(task.static_keys) | set(task.numeric_defaults) | {"seed"}
    unknown = sorted(set(grid) - known)
    if unknown:
        raise ValueError(
            f"unknown grid key(s) {unknown} for task {task.name!r}; known: {sorted(known)}"
        )
    keys = [k for k in grid if k != "seed"]
    value_lists = [_as_list(k, grid[k]) for k in keys]
    groups: dict[str, _Group] = {}
    seen: set[str] = set()
    for combo in itertools.product(*value_lists):
        chosen = dict(zip(keys, combo, strict=True))
        static = {k: chosen.get(k) for k in task.static_keys if k in chosen}
        numeric = {k: float(chosen.get(k, v)) for k, v in task.numeric_defaults.items()}
        task.normalise(static, numeric)
        signature = json.dumps([static, numeric], sort_keys=True, default=str)
        if signature in seen:  # irrelevant parameters collapsed to their default
            continue
        seen.add(signature)
        gid = _group_id(static)
        group = groups.setdefault(gid, _Group(static))
        for s in seeds:
            group.configs.append(numeric)
            group.seeds.append(int(s))
    return list(groups.values())


def _run_ids(
    group_id: str, configs: Sequence[Mapping[str, float]], seeds: Sequence[int]
) -> list[str]:
    """Each run's identity: 16 hex digits of a SHA-1 of the JSON text of
    ``[group_id, numeric configuration, seed]`` (keys sorted), the configuration's text
    written once per configuration object."""
    prefixes: dict[int, str] = {}
    ids = []
    for numeric, seed in zip(configs, seeds, strict=True):
        prefix = prefixes.get(id(numeric))
        if prefix is None:
            prefix = prefixes[id(numeric)] = json.dumps([group_id, numeric], sort_keys=True)[:-1]
        ids.append(hashlib.sha1(f"{prefix}, {int(seed)}]".encode()).hexdigest()[:16])
    return ids


def plan(
    task: SweepTask,
    grid: Mapping[str, Any],
    *,
    memory_budget: float | None = None,
    num_devices: int | None = None,
    done: Set[str] = frozenset(),
    process_index: int = 0,
    process_count: int = 1,
    block: int | None = None,
) -> list[Chunk]:
    """Expand ``grid`` into the chunks still to run (validating every configuration first).

    ``grid`` maps each key to a value or a list; ``seed`` lists the run seeds.  Chunks hold
    at most ``memory_budget`` bytes of runs (by ``task.bytes_per_run``; default
    :func:`swarmjax.device.chunk_budget_bytes`), rounded to a multiple of the device count
    (default: this process's devices), and run in calls of ``block`` runs per device
    (default :func:`swarmjax.device.block_size` of the group's ``bytes_per_run``).  Runs
    whose id is in ``done`` are left out; with ``process_count > 1`` only this process's
    slice of every group is planned.
    """
    memory_budget, block = _sizes(memory_budget, block)
    check_int("process_count", process_count, minimum=1)
    check_int("process_index", process_index, minimum=0)
    if process_index >= process_count:
        raise ValueError(f"process_index must be < process_count; got {process_index}")
    return _chunks(
        task,
        _expand(task, grid),
        memory_budget,
        num_devices,
        done,
        process_index,
        process_count,
        block,
    )


def _sizes(memory_budget: float | None, block: int | None) -> tuple[float, int | None]:
    """Checked ``memory_budget`` (default: the device's) and ``block`` (None: per group)."""
    if memory_budget is None:
        memory_budget = device.chunk_budget_bytes()
    check_positive("memory_budget", memory_budget)
    if block is not None:
        check_int("block", block, minimum=1)
    return memory_budget, block


def _chunks(
    task: SweepTask,
    groups: list[_Group],
    memory_budget: float,
    num_devices: int | None,
    done: Set[str],
    process_index: int,
    process_count: int,
    block: int | None = None,
) -> list[Chunk]:
    """:func:`plan` for groups already expanded (and validated) by :func:`_expand`."""
    ndev = num_devices or jax.local_device_count()
    chunks = []
    for group in groups:
        gid = _group_id(group.static)
        total = len(group.seeds)
        per_run = max(1, int(task.bytes_per_run(group.static)))
        per_device = block if block is not None else device.block_size(per_run)
        size = max(1, min(total, int(memory_budget // per_run)))
        size = -(-size // ndev) * ndev
        lo = total * process_index // process_count
        hi = total * (process_index + 1) // process_count
        ids = _run_ids(gid, group.configs[lo:hi], group.seeds[lo:hi])
        todo = [j for j, rid in zip(range(lo, hi), ids, strict=True) if rid not in done]
        for start in range(0, len(todo), size):
            members = todo[start : start + size]
            run_ids = tuple(ids[j - lo] for j in members)
            digest = hashlib.sha1("".join(run_ids).encode()).hexdigest()[:12]
            numeric = {
                k: np.asarray([group.configs[j][k] for j in members], np.float32)
                for k in task.numeric_defaults
            }
            chunks.append(
                Chunk(
                    chunk_id=f"{gid}-{digest}",
                    group_id=gid,
                    static=group.static,
                    numeric=numeric,
                    seeds=np.asarray([group.seeds[j] for j in members], np.int64),
                    block=per_device * ndev,
                    run_ids=run_ids,
                )
            )
    return chunks


def _pad(values: np.ndarray, size: int) -> np.ndarray:
    missing = size - values.shape[0]
    if missing == 0:
        return values
    return np.concatenate([values, np.repeat(values[-1:], missing, axis=0)])


# Compiled programs, kept per task object so that later sweeps in the same process reuse
# them: {(id(task), program id, block): (task, compiled)}, the program id hashing the
# program's static values (task.program; the task is held to pin its id).
_COMPILED: dict[tuple[int, str, int], tuple[SweepTask, Callable[..., Any]]] = {}

BLOCK = device.CPU_BLOCK
"""Runs per device per call on the CPU (the default there; :data:`swarmjax.device.CPU_BLOCK`).
A PAASO voting program (50 agents, f4) runs as fast at 128 runs per device as at 512 or
1,024, and 20 % slower at 64 (docs/paaso_speed.md).  One block for every chunk of a
program: one compiled executable per program, and the same numbers for a run whatever its
chunk (see the module docstring)."""


@dataclass
class RunnerStats:
    """What :func:`run_sweep` calls in this process spent: ``compilations`` and
    ``compile_seconds`` (tracing, lowering, XLA compilation of each group function),
    ``kernel_seconds`` (running compiled chunks until their outputs are on the host) and
    ``runs`` (runs computed, padding excluded)."""

    compilations: int = 0
    compile_seconds: float = 0.0
    kernel_seconds: float = 0.0
    runs: int = 0


STATS = RunnerStats()


def _id_words(run_ids: Sequence[str]) -> np.ndarray:
    """``(n, 2)`` uint32: each hexadecimal ``run_id`` (64 bits) as its low and high word."""
    ids = np.asarray([int(r, 16) for r in run_ids], np.uint64)
    return np.stack([ids & 0xFFFFFFFF, ids >> np.uint64(32)], axis=1).astype(np.uint32)


def run_randomness(
    secret: Secret, run_ids: Sequence[str]
) -> Callable[[Sequence[str]], dict[str, Any]]:
    """What drew the runs of a sweep keyed by ``secret`` (without common random numbers),
    for the releases its runs ``run_ids`` make: a function of some of those runs' ids to
    :func:`~swarmjax.privacy.secret.randomness` of the secret's source with the
    :func:`~swarmjax.privacy.secret.joint_fingerprint` of their keys (the ledger refuses a
    second release of the same keys). The runs' keys are derived once, here, on the host."""
    keys = fold_words(secret.key(), _id_words(run_ids)) if len(run_ids) else None
    prints = dict(zip(run_ids, fingerprints(keys) if keys is not None else (), strict=True))
    drawn = randomness(secret.source, False)
    return lambda ids: drawn | {"fingerprint": joint_fingerprint(prints[i] for i in ids)}


class _Compiled:
    """Runs chunks as calls of one compiled block per program (:meth:`SweepTask.program`),
    each call sharded over this process's devices."""

    def __init__(self, task: SweepTask, root: PRNGKeyArray, common_random_numbers: bool) -> None:
        self.task = task
        self.root = root
        self.common_random_numbers = common_random_numbers
        devices = jax.local_devices()
        self.ndev = len(devices)
        self.sharding = (
            NamedSharding(Mesh(np.asarray(devices), ("runs",)), PartitionSpec("runs"))
            if len(devices) > 1
            else None
        )

    def _args(self, numeric: Outputs, keys: PRNGKeyArray, data: Any) -> tuple[Any, ...]:
        return (*jax.device_put((numeric, keys), self.sharding), data)

    def keys(self, chunk: Chunk, size: int) -> PRNGKeyArray:
        """The chunk's run keys, padded to ``size``: the root with each run's ``run_id``
        (64 bits, two words) or, under common random numbers, its seed folded in."""
        if self.common_random_numbers:
            words = _pad(chunk.seeds, size).astype(np.uint32)[:, None]
        else:
            words = _pad(_id_words(chunk.run_ids), size)
        return fold_words(self.root, words)

    def __call__(self, chunk: Chunk) -> Outputs:
        program, data = self.task.program(chunk.static)
        block = chunk.block
        key = (id(self.task), _group_id(program), block)
        calls = -(-chunk.size // block)
        numeric = {k: _pad(v, calls * block) for k, v in chunk.numeric.items()}
        keys = self.keys(chunk, calls * block)
        data = jax.device_put(data)
        args = [
            self._args({k: v[i : i + block] for k, v in numeric.items()}, keys[i : i + block], data)
            for i in range(0, calls * block, block)
        ]
        if key not in _COMPILED:
            start = time.perf_counter()
            fn = jax.jit(self.task.batched(program))
            _COMPILED[key] = (self.task, fn.lower(*args[0]).compile())
            STATS.compilations += 1
            STATS.compile_seconds += time.perf_counter() - start
        fn = _COMPILED[key][1]
        start = time.perf_counter()
        out = jax.device_get([fn(*a) for a in args])  # dispatched asynchronously
        STATS.kernel_seconds += time.perf_counter() - start
        STATS.runs += chunk.size
        return {k: np.concatenate([o[k] for o in out])[: chunk.size] for k in out[0]}


SWEEP_SECRET = "secret.key"
"""The sweep's secret inside its folder (the folder is never released)."""


def _sweep_secret(out: Path, secret: Secret | None, rank: int) -> Secret:
    """The caller's secret, else the one saved in ``out`` (a resume), else a fresh one that
    process 0 saves there (the others read it after a barrier)."""
    if secret is not None:
        if not isinstance(secret, Secret):
            raise ValueError(
                f"secret must be a swarmjax.privacy.secret.Secret or None; got "
                f"{type(secret).__name__}"
            )
        return secret
    path = out / SWEEP_SECRET
    if rank == 0 and not path.exists():
        if finished_run_ids(out):
            raise OutputConflict(
                f"out_dir {str(out)!r} holds finished runs but no {SWEEP_SECRET} (a sweep of "
                "an older version, or its secret was deleted): its runs cannot be resumed "
                "with the same noise; give another folder or delete it"
            )
        Secret.generate().save(path)
    _barrier(f"sweep-secret:{out}")
    return Secret.load(path)


def _check_randomness(out: Path, common: bool, rank: int) -> None:
    """Refuse to resume a sweep folder whose runs were drawn with the other
    ``common_random_numbers`` (their keys differ); record the choice on a first run."""
    path = out / "randomness.json"
    if path.exists():
        saved = json.loads(path.read_text()).get("common_random_numbers")
        if saved is not None and bool(saved) != common:
            raise OutputConflict(
                f"out_dir {str(out)!r} holds a sweep run with common_random_numbers={saved}; "
                f"this call has {common}: pass the same, or give another folder"
            )
    elif rank == 0:
        text = json.dumps({"common_random_numbers": common})
        write_atomic(path, lambda p: p.write_text(text))


def _barrier(name: str) -> None:
    """Wait for every process of a ``jax.distributed`` job (no-op in one process)."""
    if jax.process_count() == 1:
        return
    from jax._src import distributed  # the runtime's own barrier, no device collective

    distributed.global_state.client.wait_at_barrier(name, 3_600_000)


def finished_run_ids(out_dir: str | os.PathLike[str]) -> set[str]:
    """``run_id`` of every run written to ``out_dir/parts/`` so far."""
    done: set[str] = set()
    for path in _part_files(Path(out_dir), ".csv"):
        column = pd.read_csv(path, usecols=lambda c: c == "run_id", dtype=str)
        if "run_id" not in column:
            raise ValueError(
                f"{str(path)!r} has no run_id column (written by an older swarmjax); "
                "resume it with that version or start a new out_dir"
            )
        done.update(column["run_id"])
    return done


def _check_manifest(
    out_dir: Path, task: SweepTask, grid: Mapping[str, Any], *, write: bool = True
) -> None:
    """Refuse a folder that holds another grid's sweep; record this grid (chunking is not
    recorded: runs are identified by content, so any chunking may resume)."""
    manifest = {"task": task.name, "grid": {k: _as_list(k, v) for k, v in grid.items()}}
    text = json.dumps(manifest, sort_keys=True, default=str, indent=1)
    path = out_dir / "sweep.json"
    if path.exists() and path.read_text() != text:
        raise OutputConflict(
            f"out_dir {str(out_dir)!r} holds results of a different sweep; "
            "choose another directory, delete it, or rerun with --restart"
        )
    if write:
        write_atomic(path, lambda p: p.write_text(text))


def run_sweep(
    task: SweepTask,
    grid: Mapping[str, Any],
    out_dir: str | os.PathLike[str],
    *,
    memory_budget: float | None = None,
    max_chunks: int | None = None,
    progress: bool = True,
    block: int | None = None,
    ledger: Ledger | None = None,
    release_path: str | os.PathLike[str] | None = None,
    secret: Secret | None = None,
    common_random_numbers: bool = False,
) -> pd.DataFrame:
    """Run (or resume) a sweep, writing each chunk to ``out_dir/parts/`` as it finishes.

    ``secret``: the root of every run's random numbers (``None``: the one saved in
    ``out_dir``, else a fresh one from operating-system entropy, saved there; pass one for
    reproducible mode). ``common_random_numbers``: runs of one seed share their draws
    across configurations (see the module docstring); refused with a ``ledger`` that would
    compose two or more private configurations of the sweep.

    ``memory_budget``: bytes of runs per chunk (default
    :func:`swarmjax.device.chunk_budget_bytes`: 1 GiB on the CPU, a share of the devices'
    memory on GPU/TPU).  ``block``: runs per device per compiled call (default
    :func:`swarmjax.device.block_size`: 128 on the CPU, from the device's memory on GPU/TPU);
    a run's numbers are bit for bit the same alone or in any sweep for a given backend and
    block, and may differ at float rounding under another block.  Resuming under another
    budget, block or device count is fine: runs are identified by content.

    ``max_chunks`` stops after that many newly run chunks (a time box; rerun to continue).
    Under ``jax.distributed`` every process calls this with the same arguments and runs its
    share (see the module docstring); all return once every process is done.

    ``ledger``: an experiment's :class:`~swarmjax.privacy.ledger.Ledger` (with a ``delta``:
    every release is stated at it).  Once the sweep is done, every finished run (earlier
    calls' too) goes into it through ``task.releases(rows, path, delta=, accountant=,
    randomness=)`` (``randomness``: :func:`run_randomness` of the sweep's secret),
    written at ``release_path`` (default ``out_dir``: where the sweep's outputs are
    published), and ``out_dir`` is listed as not released with the task's
    ``not_released`` reason when it has one.  Checked before any work.
    Returns every row finished so far (this call's and earlier calls').
    """
    out = Path(out_dir)
    rank, processes = jax.process_index(), jax.process_count()
    memory_budget, block = _sizes(memory_budget, block)
    _check_ledger(task, ledger)
    if common_random_numbers and ledger is not None:
        raise ValueError(
            "common_random_numbers: runs of one seed would share their noise across "
            "configurations, which the ledger cannot compose; pass ledger=None or "
            "common_random_numbers=False"
        )
    groups = _expand(task, grid)  # validate before touching the folder
    parts = out / "parts"
    if rank == 0:
        parts.mkdir(parents=True, exist_ok=True)
        _check_manifest(out, task, grid)
    _barrier(f"sweep-start:{out}")
    if rank != 0:
        _check_manifest(out, task, grid, write=False)
    secret = _sweep_secret(out, secret, rank)
    root = secret.key()
    _check_randomness(out, bool(common_random_numbers), rank)
    done = finished_run_ids(out)
    chunks = _chunks(task, groups, memory_budget, None, done, rank, processes, block)
    todo = chunks[:max_chunks] if max_chunks is not None else chunks
    compiled = _Compiled(task, root, bool(common_random_numbers))
    bar = tqdm(
        total=sum(c.size for c in chunks),
        unit="run",
        disable=not progress,
        desc=task.name if processes == 1 else f"{task.name} [{rank}/{processes}]",
    )
    start = time.perf_counter()
    ran = 0
    for chunk in todo:
        outputs = compiled(chunk)
        rows = task.rows(chunk.static, chunk.numeric, chunk.seeds, outputs)
        rows.insert(0, "run_id", list(chunk.run_ids))
        rows.insert(0, "chunk", chunk.chunk_id)
        arrays = task.arrays(outputs)
        write_atomic(parts / f"{chunk.chunk_id}.npz", lambda p, a=arrays: _save_npz(p, a))
        write_atomic(parts / f"{chunk.chunk_id}.csv", lambda p, r=rows: r.to_csv(p, index=False))
        ran += chunk.size
        bar.update(chunk.size)
        bar.set_postfix(
            runs_per_s=f"{ran / (time.perf_counter() - start):.1f}",
            compiles=f"{STATS.compilations} ({STATS.compile_seconds:.1f} s)",
        )
    bar.close()
    _barrier(f"sweep-end:{out}")
    rows = load_results(out)
    if ledger is not None:
        path = str(out if release_path is None else release_path)
        releases = task.releases(
            rows,
            path,
            delta=ledger.delta,
            accountant=ledger.accountant,
            randomness=run_randomness(secret, rows["run_id"].tolist()),
        )
        for release in releases:
            ledger.add(release)
        why = getattr(task, "not_released", None)
        if why:
            ledger.mark_not_released(out, why)
    return rows


def _check_ledger(task: SweepTask, ledger: Ledger | None) -> None:
    """Refuse a ``ledger`` the sweep cannot fill, in one line (``None``: no ledger)."""
    if ledger is None:
        return
    if not isinstance(ledger, Ledger):
        raise ValueError(f"ledger must be a swarmjax.privacy.ledger.Ledger; got {ledger!r}")
    if not callable(getattr(task, "releases", None)):
        raise ValueError(
            f"ledger: task {task.name!r} has no releases(rows, path, *, delta, accountant, "
            "randomness) to list its runs"
        )
    if ledger.delta is None:
        raise ValueError(
            "ledger: a sweep states every release at the ledger's delta; create it with "
            "Ledger(..., delta=...)"
        )


def _save_npz(path: Path, arrays: Outputs) -> None:
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def _part_files(out_dir: Path, suffix: str) -> Iterator[Path]:
    yield from sorted((Path(out_dir) / "parts").glob(f"*{suffix}"))


def load_results(out_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """All finished rows of a sweep directory (empty frame if none); ``run_id`` and ``chunk``
    read as text (a hexadecimal id of digits alone is not a number)."""
    ids = {"run_id": str, "chunk": str}
    frames = [pd.read_csv(p, dtype=ids) for p in _part_files(Path(out_dir), ".csv")]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load_arrays(out_dir: str | os.PathLike[str], chunk_ids: Sequence[str]) -> Outputs:
    """Concatenate the per-run arrays of the given chunks, in that order."""
    parts = Path(out_dir) / "parts"
    loaded = [dict(np.load(parts / f"{cid}.npz")) for cid in chunk_ids]
    if not loaded:
        return {}
    return {k: np.concatenate([d[k] for d in loaded]) for k in loaded[0]}


def load_trajectories(
    out_dir: str | os.PathLike[str], key: str = "objective"
) -> tuple[pd.DataFrame, np.ndarray]:
    """All finished rows with the per-run array ``key`` aligned row by row."""
    rows = load_results(out_dir)
    if rows.empty:
        return rows, np.empty((0, 0))
    chunk_ids = list(dict.fromkeys(rows["chunk"]))
    rows = pd.concat([rows[rows["chunk"] == c] for c in chunk_ids], ignore_index=True)
    return rows, load_arrays(out_dir, chunk_ids)[key]
