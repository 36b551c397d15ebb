"""Keys and release identity: every random number of a run descends from its run key.

:func:`run_keys` folds each variant's :func:`release_identity` (the algorithm's class and
static settings, every hyper value of the row, its labels) and the seed into the call's
secret; :func:`server_key`, :func:`aggregate_key`, :func:`client_init_key` and
:func:`client_key` derive each purpose's key from a run key (``fold_in`` only, one domain
tag per purpose). The overview is :mod:`swarmjax.fl.protocol`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
import types
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from jaxtyping import Array, Int, PRNGKeyArray, PyTree

from swarmjax.privacy.secret import Secret

if TYPE_CHECKING:
    from swarmjax.fl.protocol.contract import Algorithm
    from swarmjax.fl.protocol.variants import Variants

__all__ = [
    "aggregate_key",
    "client_init_key",
    "client_key",
    "describe",
    "release_identity",
    "run_keys",
    "server_init_key",
    "server_key",
    "variant_identities",
]

Hyper = PyTree

# Domain tags, one per purpose, folded into the run key first: keys of different purposes
# (e.g. a select key's redraws and the aggregate's noise) are never descendants of each other.
_SERVER_INIT, _CLIENT_INIT, _SERVER, _CLIENT, _AGGREGATE = 0, 1, 2, 3, 4


def server_init_key(run_key: PRNGKeyArray) -> PRNGKeyArray:
    """Key of ``server_init``."""
    return jax.random.fold_in(run_key, _SERVER_INIT)


def client_init_key(run_key: PRNGKeyArray, client_id: Int[Array, ""] | int) -> PRNGKeyArray:
    """Key of ``client_init`` for client ``client_id``."""
    return jax.random.fold_in(jax.random.fold_in(run_key, _CLIENT_INIT), client_id)


def server_key(
    run_key: PRNGKeyArray, round_index: Int[Array, ""] | int, exchange_index: int
) -> PRNGKeyArray:
    """Key of the server's ``select`` in exchange ``exchange_index`` of round ``round_index``
    (round 0 is the setup)."""
    k = jax.random.fold_in(jax.random.fold_in(run_key, _SERVER), round_index)
    return jax.random.fold_in(k, exchange_index)


def aggregate_key(
    run_key: PRNGKeyArray, round_index: Int[Array, ""] | int, exchange_index: int
) -> PRNGKeyArray:
    """Key of the server's ``aggregate`` (e.g. its Gaussian noise) in that exchange.

    Its own domain (``_AGGREGATE``), not a child of :func:`server_key`: a Poisson ``select``
    redraws with ``fold_in(select_key, attempt)``, ``attempt = 1, 2, ...``, so a child of the
    select key would be a redraw key and the noise would correlate with the selection on
    rounds whose first draw overflows.
    """
    k = jax.random.fold_in(jax.random.fold_in(run_key, _AGGREGATE), round_index)
    return jax.random.fold_in(k, exchange_index)


def client_key(
    run_key: PRNGKeyArray,
    round_index: Int[Array, ""] | int,
    exchange_index: int,
    client_id: Int[Array, ""] | int,
) -> PRNGKeyArray:
    """Key of client ``client_id``'s ``client`` call in that exchange of that round."""
    k = jax.random.fold_in(jax.random.fold_in(run_key, _CLIENT), round_index)
    return jax.random.fold_in(jax.random.fold_in(k, exchange_index), client_id)


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_IDENTITY_VERSION = b"swarmjax.release_identity/1"
_IDENTITY_WORDS = 8  # 32-bit words of the digest folded into a run key (all 256 bits)


def describe(value: Any) -> Any:
    """A deterministic, JSON-able description of a static setting (an algorithm, its
    model, its training options, ...): the same in every process that builds the same
    objects, so a digest of it names the setting.

    Dataclasses give their type name and every field; ``functools.partial`` its function,
    arguments and keywords; plain functions their module-qualified name with the values
    they close over and their defaults; other callables their qualified name; arrays their
    shape, dtype and a sha256 of their bytes; tuples, lists, sets (sorted) and mappings
    their items; anything else its ``repr`` with memory addresses (``at 0x...``) removed,
    which differ between processes. A reference cycle (a function closing over itself) is
    ``"<cycle>"``.
    """
    return _describe(value, frozenset())


def _describe(value: Any, path: frozenset[int]) -> Any:
    """:func:`describe`; ``path``: ids of the objects being described (cycle guard)."""
    if id(value) in path:
        return "<cycle>"
    sub = functools.partial(_describe, path=path | {id(value)})
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: sub(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"type": type(value).__qualname__, **fields}
    if isinstance(value, functools.partial):
        return {
            "partial": sub(value.func),
            "args": [sub(a) for a in value.args],
            "keywords": {str(k): sub(v) for k, v in value.keywords.items()},
        }
    if isinstance(value, np.ndarray | np.generic | jax.Array):
        a = _host_array(value)
        digest = hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
        return {"array": [list(a.shape), a.dtype.name, a.dtype.str], "sha256": digest}
    if isinstance(value, types.FunctionType):
        out: dict[str, Any] = {"function": f"{value.__module__}.{value.__qualname__}"}
        cells = value.__closure__ or ()
        if cells:
            out["closure"] = [sub(_cell(c)) for c in cells]
        if value.__defaults__:
            out["defaults"] = [sub(d) for d in value.__defaults__]
        if value.__kwdefaults__:
            out["kwdefaults"] = {k: sub(v) for k, v in value.__kwdefaults__.items()}
        return out
    if callable(value):
        return getattr(value, "__qualname__", type(value).__qualname__)
    if isinstance(value, tuple | list):
        return [sub(v) for v in value]
    if isinstance(value, set | frozenset):  # iteration order varies with the hash seed
        return {"set": sorted((sub(v) for v in value), key=lambda d: json.dumps(d, sort_keys=True))}
    if isinstance(value, Mapping):
        return {str(k): sub(v) for k, v in value.items()}
    return _ADDRESS.sub("", repr(value))


def _cell(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a closure variable not bound yet
        return "<empty cell>"


def _host_array(value: Any) -> np.ndarray:
    """``value`` as a host NumPy array (typed PRNG keys as their ``uint32`` key data)."""
    if isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
        value = jax.random.key_data(value)
    return np.asarray(value)


def _plain_label(value: Any) -> Any:
    """A label value with NumPy scalars and arrays as Python numbers and lists."""
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    return value


def _static_text(alg: Algorithm) -> bytes:
    """The algorithm's class (module-qualified) and :func:`describe` of its settings."""
    cls = type(alg)
    text = json.dumps(describe(alg), sort_keys=True)
    return f"{cls.__module__}.{cls.__qualname__}\n{text}".encode()


def _identity(static: bytes, hyper_row: Hyper, labels: Mapping[str, Any]) -> bytes:
    """sha256 of the version tag, ``static`` (:func:`_static_text`), every leaf of
    ``hyper_row`` (path, shape, dtype, bytes) and the labels, each part length-prefixed."""
    h = hashlib.sha256()

    def part(data: bytes) -> None:  # length-prefixed: no two sequences of parts collide
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)

    part(_IDENTITY_VERSION)
    part(static)
    leaves = jax.tree_util.tree_flatten_with_path(hyper_row)[0]
    part(f"{type(hyper_row).__qualname__}:{len(leaves)}".encode())
    for path, leaf in leaves:
        a = _host_array(leaf)
        part(f"{jax.tree_util.keystr(path)}|{a.shape}|{a.dtype.name}|{a.dtype.str}".encode())
        part(np.ascontiguousarray(a).tobytes())
    text = {str(k): describe(_plain_label(v)) for k, v in labels.items()}
    part(json.dumps(text, sort_keys=True).encode())
    return h.digest()


def release_identity(alg: Algorithm, hyper_row: Hyper, labels: Mapping[str, Any]) -> bytes:
    """What one variant releases, as a 32-byte sha256 digest (the seed aside).

    Args:
        alg: the algorithm: its module-qualified class and every static setting
            (:func:`describe`: fields, model, training options, functions by name).
        hyper_row: ONE variant's hyper pytree (no variant axis): every leaf's path, shape,
            dtype and bytes, so two rows differing in one value (to the last bit) differ.
        labels: the variant's history labels (name -> value).

    Returns:
        ``sha256`` digest (32 bytes). Equal for equal configurations in any process that
        builds the same objects (same code and library versions, hence bit-equal resolved
        hyper values); :func:`run_keys` folds it into the seed's key. The client data and
        the :class:`RunSpec` are not part of it: a deployment's server never holds the data,
        and rounds/delta reach the numbers only through the hyper values (calibrated
        noise), which are part of it.
    """
    return _identity(_static_text(alg), hyper_row, labels)


def variant_identities(alg: Algorithm, variants: Variants) -> tuple[bytes, ...]:
    """:func:`release_identity` of every variant of ``variants`` (``V`` digests, in
    variant order): what a runtime passes to :func:`run_keys`."""
    static = _static_text(alg)
    host = jax.tree.map(_host_array, variants.hyper)
    return tuple(
        _identity(static, jax.tree.map(lambda a, v=v: a[v], host), labels)
        for v, labels in enumerate(variants.row_labels())
    )


def run_keys(
    secret: Secret,
    seeds: Sequence[int],
    identities: Sequence[bytes],
    common_random_numbers: bool,
) -> PRNGKeyArray:
    """One key per (variant, seed), variant-major: the root of every random number a run
    draws (:func:`server_key`, :func:`client_key`, ...).

    Args:
        secret: the call's :class:`~swarmjax.privacy.secret.Secret` (256 secret bits;
            :meth:`~swarmjax.privacy.secret.Secret.generate` draws them from the operating
            system). Nothing published (seed, settings, data) determines a key without it.
        seeds: the seeds (each ``>= 0``): labels of repeated runs.
        identities: one :func:`release_identity` per variant (:func:`variant_identities`),
            32 bytes each.
        common_random_numbers: give every variant of a seed the same key (shared draws).

    Returns:
        ``(variants * seeds,)`` typed ChaCha20 keys, variant-major
        (:func:`~swarmjax.privacy.secret.keys_for_runs`).

    Independent by default: run ``(v, s)`` folds identity ``v`` and seed ``s`` into the
    secret's key, so the runs of a call differ in every draw, a run's numbers do not depend
    on what else is in the call, and calls with different secrets share nothing. Two
    variants with equal identity (the same run twice) would release the same noise twice:
    ``ValueError``. ``common_random_numbers=True`` gives every variant of a seed one key:
    the variants then share every draw on purpose (paired comparisons; the ledger refuses
    to compose them).
    """
    if not isinstance(secret, Secret):
        raise TypeError(
            f"run_keys takes a swarmjax.privacy.secret.Secret first; got {type(secret).__name__}"
        )
    ids = list(identities)
    if not ids:
        raise ValueError("run_keys needs at least one identity (one per variant)")
    for ident in ids:
        if not isinstance(ident, bytes) or len(ident) < 4 * _IDENTITY_WORDS:
            raise TypeError(
                "run_keys takes release identities (bytes from release_identity or "
                f"variant_identities), not {type(ident).__name__}"
            )
    if not common_random_numbers and len(set(ids)) != len(ids):
        first = {}
        for v, ident in enumerate(ids):
            if ident in first:
                raise ValueError(
                    f"variants {first[ident]} and {v} are the same run (equal algorithm, "
                    "hyper-parameter values and labels) and would draw the same noise; drop "
                    "one, or pass common_random_numbers=True"
                )
            first[ident] = v
    seed_list = [int(s) for s in seeds]
    if not seed_list or min(seed_list) < 0:
        raise ValueError(f"seeds must be one or more integers >= 0; got {list(seeds)!r}")
    return secret.run_keys(seed_list, ids, common_random_numbers)
