"""Mid-run checkpoints of a simulation (orbax): a killed run resumes from its last saved
round and ends with the numbers of an uninterrupted one.

A checkpoint folder holds one run of :func:`~swarmjax.fl.runtime.simulator.simulate`: the
carry (server and client states, rounds done) after each compiled call, saved with orbax
as it lies on the devices, and the per-round outputs so far (``outputs_<round>.npz``,
written atomically). Client states split over a device mesh are saved split: orbax writes
each device's block of clients from the process that owns it, with the federation's true
client count ``N`` recorded beside them, and a resume on another device count reads into
each device only its own clients' rows (:meth:`Checkpoints.restore`); no device ever holds
every client's state for a checkpoint. A
``fingerprint.json`` names the settings (algorithm, variants, spec, data, run keys and the
named run options) the folder belongs to; resuming with other settings is an error, never a
silent mix.

A checkpoint folder is NOT a release: it holds the realised cohorts, every client's state
and per-client accounted steps, statistics of private data that no epsilon covers. Each
folder gets a :data:`NOT_RELEASED` marker file when it is created; :func:`not_released`
tells a ledger (or a publishing script) which folders must never be published.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jaxtyping import PRNGKeyArray, PyTree

from swarmjax.fl.protocol import describe
from swarmjax.fl.runtime.mesh import through_key_data
from swarmjax.privacy.secret import Secret
from swarmjax.resume import OutputConflict

__all__ = [
    "NOT_RELEASED",
    "SECRET_FILE",
    "Checkpoints",
    "checkpoint_secret",
    "fingerprint",
    "not_released",
]

NOT_RELEASED = "NOT_RELEASED.txt"
"""Name of the marker file in every checkpoint folder (see :func:`not_released`)."""

_NOT_RELEASED_TEXT = """\
NOT RELEASED - do not publish this folder or anything copied from it.

This is a swarmjax checkpoint folder (swarmjax.fl.runtime.checkpoint): it holds a
simulation's saved carry and per-round outputs, including the realised cohorts (which
clients were selected in each round), every client's state and its per-client accounted
steps. These are statistics of private data and are not covered by any epsilon the run
reports; only the run's released results (history, privacy record) may be published.
Keep it private and delete it when the run is finished.
"""


def not_released(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` is marked as not a release (a checkpoint folder): it holds the
    :data:`NOT_RELEASED` marker file."""
    return (Path(folder) / NOT_RELEASED).is_file()


def _mark_not_released(folder: Path) -> None:
    """Write the :data:`NOT_RELEASED` marker into ``folder`` unless it is there."""
    marker = folder / NOT_RELEASED
    if not marker.is_file():
        tmp = folder / f".{NOT_RELEASED}.tmp"
        tmp.write_text(_NOT_RELEASED_TEXT)
        os.replace(tmp, marker)


SECRET_FILE = "secret.key"
"""The run's secret inside its checkpoint folder (never released)."""


def _primary() -> bool:
    """Whether this process writes the folder's host-side files: the only one, or process 0
    of a ``jax.distributed`` job (every process computes the same outputs; two writers of
    one file race; orbax writes the carry itself, each process its own blocks)."""
    return jax.process_index() == 0


def _sync(name: str) -> None:
    """Over ``jax.distributed``, wait until every process reaches ``name`` (a no-op in one
    process), so that no process reads a file the primary has not finished writing. The
    name holds no path: hosts may mount the shared folder at different paths, and every
    process must pass the same name."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(f"swarmjax checkpoint: {name}")


def checkpoint_secret(folder: str | os.PathLike) -> Secret:
    """The secret of the run checkpointed in ``folder``: the one saved there (a resume draws
    the same numbers), else a fresh one from operating-system entropy, saved there (owner
    read/write only) before any round runs. The folder is marked not released. Over
    ``jax.distributed`` (the folder on a file system every process sees) process 0 draws and
    saves it, and the others read that one: every process must hold the same secret."""
    where = Path(folder).resolve()
    where.mkdir(parents=True, exist_ok=True)
    if _primary():
        _mark_not_released(where)
        secret = Secret.kept_in(where / SECRET_FILE)
    _sync("secret")
    return secret if _primary() else Secret.load(where / SECRET_FILE)


def fingerprint(alg: Any, variants: Any, data: PyTree, keys: PRNGKeyArray) -> str:
    """A digest of what a run computes (sha256 hex): the algorithm's settings
    (:func:`~swarmjax.fl.protocol.describe`), the variants' hyper values, labels and spec,
    the client data (shapes, dtypes and bytes) and the run keys (``(runs,)`` typed PRNG
    keys, their key data), which carry the seeds, each run's release identity and
    ``common_random_numbers``.

    Not covered, on purpose: ``client_map`` and ``rounds_per_call`` (and the device). They
    change how clients are batched and how rounds are split into compiled calls, not the
    keys or the mechanism, so a run resumed under another one is the same run up to float
    rounding (``client_map``) or exactly (``rounds_per_call``); refusing them would forbid
    resuming a CPU-started run on an accelerator, whose default ``client_map`` differs.
    """
    h = hashlib.sha256()
    h.update(json.dumps(describe(alg), sort_keys=True).encode())
    h.update(json.dumps(describe((dict(variants.labels), variants.spec)), sort_keys=True).encode())
    key_data = np.asarray(jax.random.key_data(keys))
    for leaf in [*jax.tree.leaves((variants.hyper, data)), key_data]:
        a = np.asarray(leaf)
        h.update(repr((a.shape, a.dtype.str)).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


class Checkpoints:
    """The checkpoints of one simulation in ``folder`` (created if missing, and marked
    :data:`NOT_RELEASED`).

    Args:
        folder: where the checkpoints live (one run per folder).
        digest: :func:`fingerprint` of the run; a folder holding another run raises
            ``ValueError`` naming the folder.
        options: run options a resume must keep, by name, JSON values (the simulator
            passes ``common_random_numbers``, which changes every key, and
            ``diagnostics``, which changes what is saved). They are saved beside the
            digest; a folder saved with another value of one raises a one-line
            ``ValueError`` naming that option.
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        digest: str,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.folder = Path(folder).resolve()
        self.folder.mkdir(parents=True, exist_ok=True)
        if _primary():
            _mark_not_released(self.folder)
        options = dict(options or {})
        stamp = self.folder / "fingerprint.json"
        _sync("open")  # a stamp being written by process 0 is not read
        if stamp.exists():
            saved = json.loads(stamp.read_text())
            saved_options = saved.get("options", {})
            for name, value in options.items():
                if name in saved_options and saved_options[name] != value:
                    raise OutputConflict(
                        f"checkpoint_dir {self.folder} holds a run with {name}="
                        f"{saved_options[name]!r}, this call has {name}={value!r}: pass "
                        f"the same {name} to resume it, or give another folder"
                    )
            if saved["fingerprint"] != digest or saved_options != options:
                raise OutputConflict(
                    f"checkpoint_dir {self.folder} holds a run with other settings; give "
                    "another folder, delete it, or rerun with --restart"
                )
        elif _primary():
            tmp = self.folder / ".fingerprint.json.tmp"
            tmp.write_text(json.dumps({"fingerprint": digest, "options": options}))
            os.replace(tmp, stamp)
        self._manager = ocp.CheckpointManager(  # the handler named: a fresh process reads
            self.folder / "carry",  # a step's shapes (item_metadata) before restoring it
            options=ocp.CheckpointManagerOptions(max_to_keep=2),
            item_handlers=ocp.StandardCheckpointHandler(),
        )

    def latest(self) -> int | None:
        """Rounds done at the last complete checkpoint (``None``: nothing saved)."""
        steps = [s for s in self._manager.all_steps() if self._outputs(s).exists()]
        return max(steps) if steps else None

    def _outputs(self, step: int) -> Path:
        return self.folder / f"outputs_{step}.npz"

    def save(
        self, rounds_done: int, carry: PyTree, outputs: PyTree, clients: int | None = None
    ) -> None:
        """Save the carry and the per-round outputs after ``rounds_done`` rounds.

        ``carry`` is saved as it lies: a leaf split over devices is written block by block
        by the processes that own the blocks (orbax), never gathered onto one device.
        ``clients``: the federation's true client count ``N`` when ``carry`` is the
        simulator's ``(server, client states, rounds done)``, whose client states' leaves
        are ``(runs, N', ...)`` with ``N' >= N`` (``N' - N`` padding clients, see
        :func:`~swarmjax.fl.runtime.mesh.padded_clients`); it is recorded with them, and
        :meth:`restore` may then change ``N'``. Over ``jax.distributed``, process 0 writes
        the outputs, and every process returns only when the checkpoint is complete, so all
        of them resume from the same round."""
        self._manager.save(rounds_done, args=ocp.args.StandardSave(_item(carry, clients)))
        self._manager.wait_until_finished()
        if _primary():
            leaves, _ = jax.tree.flatten(outputs)
            tmp = self.folder / f".outputs_{rounds_done}.tmp.npz"
            np.savez(tmp, *leaves)
            os.replace(tmp, self._outputs(rounds_done))
        _sync(f"saved at {rounds_done}")

    def restore(
        self,
        rounds_done: int,
        carry: PyTree,
        outputs_like: PyTree,
        clients: int | None = None,
    ) -> tuple:
        """``(carry, outputs)`` saved after ``rounds_done`` rounds, each leaf of the carry
        restored with the shape and placement of ``carry``'s (any arrays of the saved tree
        structure: the fresh run's carry); ``outputs_like`` gives the outputs' structure.

        Each device reads from the files only the block of each leaf that it holds. With
        ``clients`` (the ``N`` passed to :meth:`save`; see there), the client states'
        leaves may hold another number of rows ``N'' >= N`` than were saved (``N' >= N``):
        rows ``0 .. N-1`` are the saved clients, rows past the saved ``N'`` are zeros and
        the rows between ``N`` and ``N'`` the saved padding (re-pad them before use, as
        :func:`~swarmjax.fl.runtime.mesh.refill_padding` does). Any other difference from
        the saved tree (structure, a shape, another ``N``), e.g. a folder written by
        another swarmjax version, raises one ``OutputConflict`` line."""
        other = OutputConflict(
            f"checkpoint_dir {self.folder} holds a run saved with another layout of the "
            "run's state (another swarmjax version): delete it or rerun with --restart"
        )
        target = _item(carry, clients)
        try:
            if not _fits(self._manager.item_metadata(rounds_done), target, clients):
                raise other
            restored = self._manager.restore(
                rounds_done, args=ocp.args.StandardRestore(target, strict=False)
            )
        except (ValueError, KeyError, TypeError) as err:  # orbax: a tree that does not match
            raise other from err
        if int(restored[_CLIENTS]) != _recorded(clients):
            raise other
        # an empty leaf (e.g. a BLT of 0 buffers: shape (0, P)) went in as one zero
        restored = jax.tree.map(
            lambda r, c: c if _empty(c) else _placed(r, c), restored[_CARRY], carry
        )
        expected = jax.tree.leaves(outputs_like)
        with np.load(self._outputs(rounds_done)) as f:
            leaves = [f[f"arr_{i}"] for i in range(len(f.files))]
        if [(a.ndim, a.dtype) for a in leaves] != [(e.ndim, np.dtype(e.dtype)) for e in expected]:
            raise other
        return restored, jax.tree.unflatten(jax.tree.structure(outputs_like), leaves)

    def close(self) -> None:
        self._manager.close()


_CARRY, _CLIENTS = "carry", "clients"
"""The two entries of a saved step: the carry, and the client count ``N`` of its states."""
_STATES = (_CARRY, "1")
"""Where the client states lie in a saved step: ``carry[1]`` of ``(server, states, done)``."""


def _recorded(clients: int | None) -> int:
    """What a step records for ``clients`` (``-1``: a carry without client states)."""
    return -1 if clients is None else int(clients)


def _item(carry: PyTree, clients: int | None) -> dict[str, Any]:
    """What a step saves (and what restores it): the carry and its recorded client count."""
    return {_CARRY: _sized(carry), _CLIENTS: np.asarray(_recorded(clients), np.int64)}


def _stored_shape(leaf: Any) -> tuple[int, ...]:
    """The shape orbax stores for ``leaf`` (a PRNG key array: its key data's)."""
    if jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key):
        return tuple(jax.eval_shape(jax.random.key_data, leaf).shape)
    return tuple(np.shape(leaf))


def _fits(saved: Any, target: PyTree, clients: int | None) -> bool:
    """Whether a step whose orbax metadata is ``saved`` restores into ``target``: the same
    leaves with the same shapes, except that with ``clients`` (``N``) the client states'
    leaves ``(runs, N', ...)`` may differ in ``N'``, every one holding at least ``N``."""
    if saved is None:
        return False
    shapes = {path: tuple(meta.shape) for path, meta in ocp.tree.to_flat_dict(saved).items()}
    wanted = {path: _stored_shape(leaf) for path, leaf in ocp.tree.to_flat_dict(target).items()}
    if shapes.keys() != wanted.keys():
        return False
    return all(
        _resizes(shapes[path], shape, clients) if path[:2] == _STATES else shapes[path] == shape
        for path, shape in wanted.items()
    )


def _resizes(saved: tuple[int, ...], wanted: tuple[int, ...], clients: int | None) -> bool:
    """Whether a client states' leaf saved with ``saved`` shape restores as ``wanted``:
    equal, or (with ``clients``, ``N``) ``(runs, N', ...)`` differing only in ``N'``, both
    at least ``N``."""
    if saved == wanted:
        return True
    return (
        clients is not None
        and len(saved) == len(wanted) >= 2
        and saved[:1] + saved[2:] == wanted[:1] + wanted[2:]
        and min(saved[1], wanted[1]) >= clients
    )


def _placed(restored: Any, like: Any) -> Any:
    """``restored`` placed as ``like`` is: an uncommitted array (a fresh run's carry on the
    default device) stays uncommitted, a committed one gets ``like``'s sharding. The
    compiled round is keyed by its arguments' placement, so a carry restored committed
    beside a fresh uncommitted one would compile the round again in the same process."""
    if not isinstance(like, jax.Array):
        return restored
    if like.committed:
        return jax.device_put(restored, like.sharding)
    # no device named: uncommitted (a PRNG key array through its key data)
    return through_key_data(lambda a: jax.device_put(np.asarray(a)), restored)


def _empty(leaf: Any) -> bool:
    return hasattr(leaf, "shape") and 0 in tuple(leaf.shape)


def _sized(carry: PyTree) -> PyTree:
    """``carry`` with every zero-size array (orbax refuses them: "Cannot save arrays with
    zero size") stood in for by one zero of its dtype; :meth:`Checkpoints.restore` puts
    the empty leaves back from the carry it is given (they hold no values)."""
    return jax.tree.map(lambda a: np.zeros((1,), a.dtype) if _empty(a) else a, carry)
