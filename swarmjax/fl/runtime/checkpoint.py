"""Mid-run checkpoints of a simulation (orbax): a killed run resumes from its last saved
round and ends with the numbers of an uninterrupted one.

A checkpoint folder holds one run of :func:`~swarmjax.fl.runtime.simulator.simulate`: the
carry (server and client states, rounds done) after each compiled call, saved with orbax,
and the per-round outputs so far (``outputs_<round>.npz``, written atomically). A
``fingerprint.json`` names the settings (algorithm, variants, spec, data) the folder
belongs to; resuming with other settings is an error, never a silent mix.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jaxtyping import PyTree

__all__ = ["Checkpoints", "fingerprint"]


def _describe(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _describe(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"type": type(value).__qualname__, **fields}
    if callable(value):
        return getattr(value, "__qualname__", type(value).__qualname__)
    if isinstance(value, tuple | list):
        return [_describe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _describe(v) for k, v in value.items()}
    return repr(value)


def fingerprint(alg: Any, variants: Any, data: PyTree) -> str:
    """A digest of what a run computes: the algorithm's settings (callables by name), the
    variants' hyper values, labels and spec, and the client data (shapes and bytes)."""
    h = hashlib.sha256()
    h.update(json.dumps(_describe(alg), sort_keys=True).encode())
    h.update(repr((dict(variants.labels), variants.spec)).encode())
    for leaf in jax.tree.leaves((variants.hyper, data)):
        a = np.asarray(leaf)
        h.update(repr((a.shape, a.dtype.str)).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


class Checkpoints:
    """The checkpoints of one simulation in ``folder`` (created if missing).

    Args:
        folder: where the checkpoints live (one run per folder).
        digest: :func:`fingerprint` of the run; a folder holding another run raises
            ``ValueError`` naming the folder.
    """

    def __init__(self, folder: str | os.PathLike, digest: str) -> None:
        self.folder = Path(folder).resolve()
        self.folder.mkdir(parents=True, exist_ok=True)
        stamp = self.folder / "fingerprint.json"
        if stamp.exists():
            saved = json.loads(stamp.read_text())["fingerprint"]
            if saved != digest:
                raise ValueError(
                    f"checkpoint_dir {self.folder} holds a run with other settings; give "
                    "another folder (or delete it to start over)"
                )
        else:
            stamp.write_text(json.dumps({"fingerprint": digest}))
        self._manager = ocp.CheckpointManager(
            self.folder / "carry", options=ocp.CheckpointManagerOptions(max_to_keep=2)
        )

    def latest(self) -> int | None:
        """Rounds done at the last complete checkpoint (``None``: nothing saved)."""
        steps = [s for s in self._manager.all_steps() if self._outputs(s).exists()]
        return max(steps) if steps else None

    def _outputs(self, step: int) -> Path:
        return self.folder / f"outputs_{step}.npz"

    def save(self, rounds_done: int, carry: PyTree, outputs: PyTree) -> None:
        """Save the carry and the per-round outputs after ``rounds_done`` rounds."""
        self._manager.save(rounds_done, args=ocp.args.StandardSave(carry))
        self._manager.wait_until_finished()
        leaves, _ = jax.tree.flatten(outputs)
        tmp = self.folder / f".outputs_{rounds_done}.tmp.npz"
        np.savez(tmp, *leaves)
        os.replace(tmp, self._outputs(rounds_done))

    def restore(self, rounds_done: int, carry: PyTree, outputs_like: PyTree) -> tuple:
        """``(carry, outputs)`` saved after ``rounds_done`` rounds; ``carry`` and
        ``outputs_like`` (any arrays of the right tree structure) give the structure."""
        restored = self._manager.restore(rounds_done, args=ocp.args.StandardRestore(carry))
        with np.load(self._outputs(rounds_done)) as f:
            leaves = [f[f"arr_{i}"] for i in range(len(f.files))]
        return restored, jax.tree.unflatten(jax.tree.structure(outputs_like), leaves)

    def close(self) -> None:
        self._manager.close()
