"""A flat client store: every client's rows in one array, gathered per round for a cohort.

:class:`ClientStore` keeps the federation as the data it is: ``x (rows, ...)`` and
``y (rows,)`` hold all clients' rows back to back, no padding, and client ``i`` owns rows
``offsets[i] : offsets[i] + sizes[i]``. Its memory is the dataset's, whatever the number of
clients. A round calls :func:`gather` with its cohort's client ids: it builds a
:class:`~swarmjax.fl.data.clients.ClientData` with a leading cohort axis, each client's
rows padded and masked to a static ``max_rows``, at a cost proportional to
``cohort * max_rows`` (one ``jnp.take``), never to the federation. ``gather`` is pure and
jit-able; its shapes depend only on the cohort's length and ``max_rows``, so every round
runs the same compiled program. For the same clients it returns exactly the rows of
:func:`~swarmjax.fl.data.clients.stack_clients` (tested).

Images stored as ``k / 255`` (what :func:`~swarmjax.fl.data.load_dataset` returns) are kept
as uint8 codes, a quarter of float32's bytes, and decoded in :func:`gather` through a
256-entry table to the same float32 values bit for bit (``build(compress=True)``, the
default, checks that this is lossless and keeps float32 otherwise).

Pass the store to a jitted function as an ARGUMENT (it is a pytree), never close over it:
a closed-over array is baked into the program as a constant.

Host-side helpers: :func:`choose_max_rows` (the buffer's rows per client: the largest
client, or a cap with a clear error) and :func:`memory_estimate` (bytes of the store and of
one cohort's buffer).
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.struct
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from swarmjax._validation import check_int
from swarmjax.fl.data.clients import ClientData

__all__ = ["ClientStore", "choose_max_rows", "decode", "gather", "memory_estimate"]


@flax.struct.dataclass
class ClientStore:
    """All clients' rows, flat (a pytree; build with :meth:`build`).

    Attributes:
        x: ``(rows, *example_shape)``, clients back to back, no padding: float32, or uint8
            codes into ``x_table``.
        y: ``(rows,)`` int32 labels.
        offsets: ``(clients,)`` int32, first row of each client.
        sizes: ``(clients,)`` int32, rows of each client (all >= 1).
        max_rows: rows per client of a gathered buffer (static; :meth:`build` sets the
            largest client's size, :meth:`with_max_rows` another).
        x_table: ``(256,)`` float32 value of each uint8 code, or None (``x`` is float32).
    """

    x: Float[Array, "rows ..."]
    y: Int[Array, " rows"]
    offsets: Int[Array, " clients"]
    sizes: Int[Array, " clients"]
    max_rows: int = flax.struct.field(pytree_node=False, default=0)
    x_table: Float[Array, "256"] | None = None

    def take(self, client_ids: Int[ArrayLike, " cohort"]) -> ClientData:
        """:func:`gather` of ``client_ids`` at :attr:`max_rows` rows per client: what the
        simulator calls to hand a round its cohort's data."""
        return gather(self, client_ids, self.max_rows)

    def with_max_rows(self, cap: int, *, truncate: bool = False) -> ClientStore:
        """This store with gathered buffers of ``cap`` rows per client
        (:func:`choose_max_rows`)."""
        return self.replace(max_rows=choose_max_rows(self, cap, truncate=truncate))

    @property
    def num_clients(self) -> int:
        return int(self.sizes.shape[0])

    @property
    def num_rows(self) -> int:
        return int(self.y.shape[0])

    @property
    def example_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    @classmethod
    def build(
        cls, x: ArrayLike, y: ArrayLike, indices: Sequence[ArrayLike], *, compress: bool = True
    ) -> ClientStore:
        """Store clients ``indices`` (one index array per client, e.g. ``Partition.indices``)
        of ``x (n, ...)``, ``y (n,)``, each client's rows in the order given.

        ``compress=True`` stores ``x`` as uint8 when every value is exactly ``k / 255``
        (``k`` an integer in ``[0, 255]``; images as :func:`~swarmjax.fl.data.load_dataset`
        returns them), else float32; :func:`gather` returns the same float32 either way.
        Only the stored rows are copied (never a float32 copy of a tiled federation).

        Raises a one-line ``ValueError`` on mismatched lengths, a non-integer or non-1-D
        ``y``, non-finite ``x`` in a stored row, no clients, an empty client (named) or
        indices out of range.
        """
        x = np.asarray(x)
        y = np.asarray(y)
        if y.ndim != 1:
            raise ValueError(f"ClientStore: y must be 1-D (rows,); got shape {y.shape}")
        if x.ndim < 1 or x.shape[0] != y.shape[0]:
            raise ValueError(
                f"ClientStore: x and y must have the same number of rows; got x {x.shape}, "
                f"y {y.shape}"
            )
        if not np.issubdtype(y.dtype, np.integer):
            raise ValueError(f"ClientStore: y must hold integer labels; got dtype {y.dtype}")
        if len(indices) == 0:
            raise ValueError("ClientStore: indices must hold at least one client")
        idx = [np.asarray(i).reshape(-1) for i in indices]
        sizes = np.array([i.size for i in idx], dtype=np.int64)
        if (sizes == 0).any():
            empty = np.flatnonzero(sizes == 0)
            raise ValueError(
                f"ClientStore: client {int(empty[0])} is empty ({empty.size} empty clients in "
                "all); every client needs at least one row"
            )
        rows = np.concatenate(idx)
        if not np.issubdtype(rows.dtype, np.integer):
            raise ValueError(f"ClientStore: indices must be integers; got dtype {rows.dtype}")
        if rows.min() < 0 or rows.max() >= x.shape[0]:
            raise ValueError(f"ClientStore: indices must be in [0, {x.shape[0] - 1}]")
        if rows.size >= 2**31:
            raise ValueError(f"ClientStore: at most 2**31 - 1 rows; got {rows.size}")
        source = x.astype(np.float32, copy=False)  # the source rows, before any tiling
        finite = np.isfinite(source.reshape(len(source), -1)).all(axis=1)
        if not finite[rows].all():
            raise ValueError("ClientStore: x must be finite (no NaN or inf)")
        table = None
        if compress and (codes := _uint8_codes(source)) is not None:
            source, table = codes, jnp.asarray(_LEVELS)
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        return cls(
            x=jnp.asarray(source[rows]),
            y=jnp.asarray(y[rows].astype(np.int32)),
            offsets=jnp.asarray(offsets.astype(np.int32)),
            sizes=jnp.asarray(sizes.astype(np.int32)),
            max_rows=int(sizes.max()),
            x_table=table,
        )


_LEVELS = np.arange(256, dtype=np.float32) / np.float32(255)  # code k -> float32(k / 255)


def _uint8_codes(x: np.ndarray) -> np.ndarray | None:
    """The codes ``k`` with ``_LEVELS[k] == x`` everywhere (uint8), or None if any value is
    not one of the 256 levels."""
    codes = np.rint(x * np.float32(255))
    if not (codes.min(initial=0.0) >= 0 and codes.max(initial=0.0) <= 255):
        return None
    codes = codes.astype(np.uint8)
    return codes if np.array_equal(_LEVELS[codes], x) else None


def decode(store: ClientStore, x: Array) -> Float[Array, "..."]:
    """Stored rows ``x`` (any shape, the store's dtype) as the float32 examples they hold:
    a table lookup for uint8 codes (exact, unlike a division XLA may rewrite)."""
    if store.x_table is None:
        return x.astype(jnp.float32)
    return jnp.take(store.x_table, x.astype(jnp.int32), axis=0)


def gather(
    store: ClientStore,
    client_ids: Int[ArrayLike, " cohort"],
    max_rows: int,
    valid: Bool[ArrayLike, " cohort"] | None = None,
) -> ClientData:
    """The cohort's clients as a stacked :class:`ClientData` (pure, jit-able).

    Args:
        store: the federation.
        client_ids: ``(cohort,)`` client ids; a negative id is an unused slot.
        max_rows: static rows per client in the buffer (:func:`choose_max_rows`); a client
            with more rows keeps its first ``max_rows``.
        valid: optional ``(cohort,)`` mask; False marks an unused slot (e.g. a Poisson
            cohort's capacity buffer).

    Returns:
        ``ClientData`` with ``x (cohort, max_rows, ...)``, ``y``, ``mask (cohort, max_rows)``
        and ``sizes (cohort,)``: real rows first, padded rows ``x = 0``, ``y = 0``,
        masked; an unused slot has size 0 and every row masked. Cost: ``O(cohort *
        max_rows)`` rows read, independent of the number of clients.
    """
    max_rows = check_int("max_rows", max_rows, 1)
    ids = jnp.asarray(client_ids, jnp.int32)
    if ids.ndim != 1:
        raise ValueError(f"client_ids must be 1-D (cohort,); got shape {ids.shape}")
    used = ids >= 0
    if valid is not None:
        used = used & jnp.asarray(valid, bool)
    safe = jnp.where(used, ids, 0)
    sizes = jnp.where(used, jnp.minimum(store.sizes[safe], max_rows), 0)
    j = jnp.arange(max_rows, dtype=jnp.int32)
    mask = j[None, :] < sizes[:, None]
    rows = jnp.where(mask, store.offsets[safe][:, None] + j[None, :], 0)
    x = jnp.take(store.x, rows.reshape(-1), axis=0).reshape(*rows.shape, *store.x.shape[1:])
    x = decode(store, x)
    x = jnp.where(mask.reshape(*mask.shape, *([1] * (x.ndim - 2))), x, jnp.zeros((), x.dtype))
    y = jnp.where(mask, jnp.take(store.y, rows, axis=0), 0)
    return ClientData(x=x, y=y, mask=mask, sizes=sizes)


def choose_max_rows(store: ClientStore, cap: int | None = None, *, truncate: bool = False) -> int:
    """Rows per client in a cohort buffer: the largest client's size, or ``cap``.

    ``cap`` below the largest client raises a one-line ``ValueError`` naming the option,
    unless ``truncate=True`` (then larger clients train on their first ``cap`` rows, as
    :func:`gather` does).
    """
    largest = int(np.max(np.asarray(store.sizes)))
    if cap is None:
        return largest
    cap = check_int("max_rows", cap, 1)
    if cap < largest and not truncate:
        client = int(np.argmax(np.asarray(store.sizes)))
        raise ValueError(
            f"max_rows={cap} is below the largest client ({largest} rows, client {client}); "
            "raise max_rows or pass truncate=True to keep each client's first max_rows rows"
        )
    return cap


def memory_estimate(store: ClientStore, cohort: int, max_rows: int) -> dict[str, int]:
    """Bytes of the store and of one gathered cohort buffer (``x``, ``y``, mask, sizes).

    A run holds the store once plus a few cohort buffers (the gathered data and the
    training's batches); the number of clients enters only through ``offsets``/``sizes``.
    """
    cohort = check_int("cohort", cohort, 1)
    max_rows = check_int("max_rows", max_rows, 1)
    store_bytes = sum(int(a.size) * a.dtype.itemsize for a in (store.x, store.y))
    index_bytes = sum(int(a.size) * a.dtype.itemsize for a in (store.offsets, store.sizes))
    example = int(np.prod(store.example_shape, dtype=np.int64)) * 4  # gathered as float32
    buffer = cohort * max_rows * (example + 4 + 1) + cohort * 4
    return {"store": store_bytes, "index": index_bytes, "cohort_buffer": buffer}
