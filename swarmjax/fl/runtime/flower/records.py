"""Pytrees <-> Flower records, written once for every message and every client state.

A pytree becomes one :class:`flwr.app.ArrayRecord` with one entry per leaf, named by the
leaf's path (``jax.tree_util.keystr``, e.g. ``".params['dense']['w']"``). Decoding needs a
template (the pytree itself, or its ``jax.eval_shape``): the receiver always knows the
message's structure from the algorithm, so the structure never travels and a record that
does not match it (a missing or extra field, another shape or dtype) is rejected with a
:class:`RecordError` naming the field.

Exactness: the bytes of every leaf travel unchanged (``np.save`` of the array), so a round
trip is bit for bit (NaN payloads and signed zeros included). Dtypes numpy cannot name in
``np.save`` (``bfloat16``, ``float8_*`` from ml_dtypes) travel as unsigned integers of the
same width and are viewed back through the template's dtype. Typed PRNG keys travel as
their ``key_data`` (uint32) and are re-wrapped with the template's implementation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flwr.app import Array as FlowerArray
from flwr.app import ArrayRecord
from jaxtyping import PyTree

__all__ = [
    "RecordError",
    "from_record",
    "load_tree",
    "payload_bytes",
    "save_tree",
    "to_record",
]

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


class RecordError(ValueError):
    """A record that does not match the message it should carry (the reason names the field)."""


def _is_key(x: Any) -> bool:
    return jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _native(dtype: np.dtype) -> bool:
    """True when ``np.save`` writes a dtype that ``np.load`` reads back as the same dtype."""
    return dtype.kind in "biufc" and dtype.num < np.dtype(np.void).num


def _encode(leaf: Any) -> np.ndarray:
    if _is_key(leaf):
        return np.asarray(jax.random.key_data(leaf))
    arr = np.asarray(leaf)
    if not _native(arr.dtype):
        arr = arr.view(_UINT[arr.dtype.itemsize])
    return arr


def to_record(tree: PyTree) -> ArrayRecord:
    """One Flower ``ArrayRecord`` holding every leaf of ``tree`` under its path."""
    record = ArrayRecord()
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        record[jax.tree_util.keystr(path)] = FlowerArray.from_numpy_ndarray(_encode(leaf))
    return record


def _expected(leaf: Any) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype the encoded leaf must have on the wire."""
    if _is_key(leaf):
        shape = jax.eval_shape(jax.random.key_data, leaf).shape
        return tuple(shape), np.dtype(np.uint32)
    dtype = np.dtype(leaf.dtype)
    return tuple(leaf.shape), dtype if _native(dtype) else np.dtype(_UINT[dtype.itemsize])


def _decode(name: str, entry: Any, like: Any) -> Any:
    if not isinstance(entry, FlowerArray):
        raise RecordError(f"field {name!r} is not an array")
    shape, dtype = _expected(like)
    if tuple(entry.shape) != shape or entry.dtype != str(dtype):
        raise RecordError(
            f"field {name!r} has shape {tuple(entry.shape)} and dtype {entry.dtype}; "
            f"expected {shape} and {dtype}"
        )
    try:
        arr = entry.numpy()
    except Exception as err:  # a corrupt payload: np.load's own reason
        raise RecordError(f"field {name!r} does not decode: {err}") from err
    if arr.shape != shape or arr.dtype != dtype:
        raise RecordError(f"field {name!r} decodes to {arr.shape} {arr.dtype}; expected {shape}")
    if _is_key(like):
        # a key dtype carries its implementation (also on a ShapeDtypeStruct template)
        return jax.random.wrap_key_data(arr, impl=like.dtype._impl)
    return arr.view(like.dtype)


def from_record(record: ArrayRecord, like: PyTree) -> PyTree:
    """The pytree that :func:`to_record` encoded, checked against the template ``like``
    (arrays or ``jax.ShapeDtypeStruct``): numpy leaves (typed PRNG keys as jax keys), so a
    float64 leaf stays float64 whatever ``jax_enable_x64`` says. Raises :class:`RecordError`
    on any mismatch."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(like)
    names = [jax.tree_util.keystr(p) for p, _ in flat]
    missing = [n for n in names if n not in record]
    extra = sorted(set(record.keys()) - set(names))
    if missing or extra:
        raise RecordError(f"fields missing: {missing}; unexpected fields: {extra}")
    leaves = [_decode(n, record[n], leaf) for n, (_, leaf) in zip(names, flat, strict=True)]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def payload_bytes(tree: PyTree) -> int:
    """Bytes of the array data of ``tree`` (what swarmjax's communication accounting counts;
    Flower adds a small ``np.save`` header and the field names on top)."""
    return int(sum(_encode_size(leaf) for leaf in jax.tree.leaves(tree)))


def _encode_size(leaf: Any) -> int:
    shape, dtype = _expected(leaf)
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def save_tree(path: str | Path, tree: PyTree) -> None:
    """Write ``tree`` to an ``.npz`` file, one entry per leaf under its path (as on the wire)."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    np.savez(path, **{jax.tree_util.keystr(p): _encode(leaf) for p, leaf in leaves})


def load_tree(path: str | Path, like: PyTree) -> PyTree:
    """Read a :func:`save_tree` file back, checked against the template ``like``."""
    with np.load(path, allow_pickle=False) as f:
        record = ArrayRecord({k: FlowerArray.from_numpy_ndarray(f[k]) for k in f.files})
    return from_record(record, like)
