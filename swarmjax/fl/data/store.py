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

A per-round cap on each client's work (``LocalTraining.max_examples``, applied by the
algorithms through :meth:`ClientStore.with_cap`) makes the buffer ``cohort x cap`` rows,
whatever the largest client: a client above the cap trains on a uniformly random subset of
``cap`` of its rows, drawn afresh each round (:func:`gather` with a ``key``).

Clients of different sizes under ``client_map="vmap"`` (or blocks of ``k``): a vmapped block
runs every client to its largest client's steps. When the store's clients differ in size,
:meth:`ClientStore.schedule` (called by the simulator) sorts the cohort's slots by size and
runs them in vmapped blocks of :attr:`ClientStore.vmap_block` (``lax.map`` over the blocks),
so each block runs to its own largest client (docs/cross_device.md measures the choice).

Clients of different sizes without a cap: ``read="step"`` (:attr:`ClientStore.read`, set by
:meth:`ClientStore.build` when the clients' sizes differ, :data:`STEP_READ_SPREAD`). The
round then gathers no buffer at all: :meth:`ClientStore.index` hands each cohort slot only
its client's ``(offset, size)`` (:class:`StoreIndex`), :meth:`ClientStore.bind` makes it a
:class:`StoreClient` (the store's arrays, shared, plus that offset and size) and local
training reads each step's batch straight from the flat store
(:meth:`StoreClient.batch`: ``B`` rows gathered and decoded per step). The rows read in a
round are those the steps use, ``E * sum_i ceil(n_i / B) * B`` over the cohort, never
``cohort x largest``; only the epoch's permutation of row positions (int32, 4 bytes a
position, the same draw as the padded buffer's so that the batches are identical) stays
``O(largest)`` per client. The batches, steps and weights are the padded path's, bit for bit
(tests/test_store_batches.py).

Host-side helpers: :func:`choose_max_rows` (the buffer's rows per client: the largest
client, or a cap with a clear error) and :func:`memory_estimate` (bytes of the store and of
one cohort's buffer).
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

from swarmjax._validation import check_choice, check_int
from swarmjax.fl.data.clients import ClientData
from swarmjax.fl.data.cohort import subset_rows

__all__ = [
    "READS",
    "STEP_READ_SPREAD",
    "VMAP_BLOCK",
    "ClientStore",
    "StoreClient",
    "StoreIndex",
    "choose_max_rows",
    "decode",
    "gather",
    "memory_estimate",
]


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
            largest client's size, :meth:`with_max_rows` or :meth:`with_cap` another).
        x_table: ``(256,)`` float32 value of each uint8 code, or None (``x`` is float32).
        sample: static; True when ``max_rows`` is a per-round cap below the largest client
            (:meth:`with_cap`): :meth:`take` with a key gathers a larger client's random
            subset of ``max_rows`` rows (without: its first ``max_rows``).
        vmap_block: static; clients per vmapped block when a vmapped cohort runs in blocks
            sorted by size (:meth:`schedule`); 0: the cohort as it is, one block. :meth:`build`
            sets :data:`VMAP_BLOCK` when the clients' sizes differ, else 0.
        read: static; how a round reads its cohort's rows. ``"buffer"``: :meth:`take`, a
            ``(cohort, max_rows, ...)`` buffer padded to :attr:`max_rows` and decoded once a
            round. ``"step"``: no buffer; each local step gathers its batch from the store
            (:meth:`index`, :meth:`bind`, :class:`StoreClient`), so a round's rows read
            follow the rows its steps use. The same numbers either way. :meth:`build` sets
            ``"step"`` when the largest client exceeds :data:`STEP_READ_SPREAD` times the
            mean, else ``"buffer"``; :meth:`with_cap` below the largest client sets
            ``"buffer"`` (its buffer is already ``cohort x cap``).
        block: static; 0, or the clients each device holds of a store split over the
            ``d`` devices of a clients mesh axis (:meth:`split`): ``x``, ``y`` and
            ``offsets`` then hold ``d`` blocks, one a device (block ``k``: clients
            ``k * block .. k * block + block - 1``, the last client's rows copied for the
            padding clients past ``N``; ``offsets`` counted within the block) and
            ``sizes`` stays ``(N,)``, whole. A device reads its own block through
            :meth:`local`.
        rows_of_largest: static; ``()``, or for a split step-reading store (:meth:`split`)
            the rows the ``k`` largest clients hold together (each capped at
            :attr:`max_rows`), ``k = 1 .. N``: :meth:`slot_rows` bounds a device's share
            of a cohort by it.
    """

    x: Float[Array, "rows ..."]
    y: Int[Array, " rows"]
    offsets: Int[Array, " clients"]
    sizes: Int[Array, " clients"]
    max_rows: int = flax.struct.field(pytree_node=False, default=0)
    x_table: Float[Array, "256"] | None = None
    sample: bool = flax.struct.field(pytree_node=False, default=False)
    vmap_block: int = flax.struct.field(pytree_node=False, default=0)
    read: str = flax.struct.field(pytree_node=False, default="buffer")
    block: int = flax.struct.field(pytree_node=False, default=0)
    rows_of_largest: tuple[int, ...] = flax.struct.field(pytree_node=False, default=())

    def index(
        self, client_ids: Int[ArrayLike, " cohort"], valid: Bool[ArrayLike, " cohort"] | None = None
    ) -> StoreIndex:
        """The cohort's slots as :class:`StoreIndex` (``(cohort,)`` offsets and sizes; a
        negative id or ``valid`` False: an unused slot, size 0): what a ``read="step"``
        round maps over its clients instead of a padded buffer. Sizes are capped at
        :attr:`max_rows` (a client keeps its first ``max_rows`` rows, as :func:`gather`)."""
        ids = jnp.asarray(client_ids, jnp.int32)
        used = ids >= 0
        if valid is not None:
            used = used & jnp.asarray(valid, bool)
        safe = jnp.where(used, ids, 0)
        sizes = jnp.where(used, jnp.minimum(self.sizes[safe], self.max_rows), 0)
        return StoreIndex(offset=jnp.where(used, self.offsets[safe], 0), sizes=sizes)

    def bind(self, index: StoreIndex) -> StoreClient:
        """ONE client's :class:`StoreIndex` (no slot axis) as a :class:`StoreClient` that
        reads its batches from this store (the store's arrays are shared, not copied)."""
        return StoreClient(
            x=self.x,
            y=self.y,
            x_table=self.x_table,
            offset=index.offset,
            sizes=index.sizes,
            max_rows=self.max_rows,
        )

    def with_read(self, read: str) -> ClientStore:
        """This store with rounds reading their rows as ``read`` says (:attr:`read`:
        ``"buffer"`` or ``"step"``)."""
        check_choice("read", read, READS)
        if read == "step" and self.sample:
            raise ValueError(
                "read must be 'buffer' for a store capped below its largest client "
                "(with_cap): the cap's random subset is drawn into the buffer"
            )
        return self.replace(read=read)

    def take(
        self,
        client_ids: Int[ArrayLike, " cohort"],
        key: PRNGKeyArray | None = None,
        draw_ids: Int[ArrayLike, " cohort"] | None = None,
        decoded: bool = True,
    ) -> ClientData:
        """:func:`gather` of ``client_ids`` at :attr:`max_rows` rows per client: what the
        simulator calls to hand a round its cohort's data (``key``: the round's draw of the
        capped clients' rows, used only when :attr:`sample`; ``draw_ids``: the ids that
        draw is keyed by, default ``client_ids``: a :meth:`local` block's clients draw
        under their federation ids; ``decoded=False``: ``x`` as stored, see
        :meth:`decoded`)."""
        key = key if self.sample else None
        return gather(self, client_ids, self.max_rows, key=key, draw_ids=draw_ids, decoded=decoded)

    def decoded(self, data: ClientData) -> ClientData:
        """A buffer of this store's rows gathered with ``decoded=False`` (:func:`gather`)
        as :func:`gather` returns it: float32 examples, padded rows 0."""
        return _masked(data.replace(x=decode(self, data.x)))

    def split(self, devices: int) -> ClientStore:
        """This store laid out in ``devices`` blocks of whole clients (:attr:`block`), on
        the host (numpy arrays, for a mesh to place block ``k`` on device ``k`` of its
        clients axis): ``block = ceil(N / devices)`` clients a device, padded past ``N``
        with copies of the last client (never selected; as a split stacked federation is
        padded), each block's rows back to back and zero rows after them up to the
        largest block's. A block's own clients read exactly the rows they read here.
        A step-reading store (``read="step"``) also records :attr:`rows_of_largest`: its
        slots' rows then travel back to back, as many as they hold
        (:func:`~swarmjax.fl.runtime.mesh.gather_ragged`), not in buffers of the largest
        client.

        Returns the store with ``x (devices * R, ...)`` and ``y (devices * R,)`` (``R``:
        the largest block's rows), ``offsets (devices * block,)`` int32 counted from each
        block's first row, ``sizes (N,)`` as before and :attr:`block` set."""
        devices = check_int("devices", devices, 1)
        n = self.num_clients
        block = -(-n // devices)
        ids = np.minimum(np.arange(block * devices), n - 1).reshape(devices, block)
        sizes, offsets = np.asarray(self.sizes), np.asarray(self.offsets)
        starts = np.concatenate([np.zeros((devices, 1), np.int64), np.cumsum(sizes[ids], 1)], 1)
        rows = int(starts[:, -1].max())
        x, y = np.asarray(self.x), np.asarray(self.y)
        out_x = np.zeros((devices, rows, *x.shape[1:]), x.dtype)
        out_y = np.zeros((devices, rows), y.dtype)
        for k in range(devices):  # host-side, once a run: a loop over devices, not clients
            used = int(starts[k, -1])
            first = np.repeat(offsets[ids[k]] - starts[k, :-1], sizes[ids[k]])
            source = first + np.arange(used)
            out_x[k, :used], out_y[k, :used] = x[source], y[source]
        return self.replace(
            x=out_x.reshape(devices * rows, *x.shape[1:]),
            y=out_y.reshape(-1),
            offsets=starts[:, :-1].reshape(-1).astype(np.int32),
            sizes=sizes.astype(np.int32),
            x_table=None if self.x_table is None else np.asarray(self.x_table),
            block=block,
            rows_of_largest=self.largest_totals() if self.read == "step" else (),
        )

    def largest_totals(self) -> tuple[int, ...]:
        """On the host: the rows the ``k`` largest clients hold together, ``k = 1 .. N``
        (each client's rows capped at :attr:`max_rows`, as a round reads them)."""
        rows = np.sort(np.minimum(np.asarray(self.sizes), self.max_rows))[::-1]
        return tuple(int(v) for v in np.cumsum(rows, dtype=np.int64))

    def slot_rows(self, slots: int) -> int:
        """The most rows any ``slots`` clients of a split step-reading store hold together
        (each capped at :attr:`max_rows`): the rows of one device's message of its
        ``slots`` slots. One ``ValueError`` line on a store that is not such a store."""
        if not self.rows_of_largest:
            raise ValueError(
                "ClientStore.slot_rows needs a step-reading store split over a mesh "
                "(ClientStore.split with read='step')"
            )
        slots = check_int("slots", slots, 1)
        return self.rows_of_largest[min(slots, len(self.rows_of_largest)) - 1]

    def arrived(
        self, x: Array, y: Int[Array, " rows"], offsets: Int[Array, " s"], sizes: Int[Array, " s"]
    ) -> ClientStore:
        """Rows that came to a device for its slots (``x``, ``y`` back to back; slot
        ``k``'s ``sizes[k]`` rows from ``offsets[k]``) as a step-reading store of their own
        whose client ``k`` is slot ``k``: its decoding table, rows per client and blocks
        of a vmapped cohort are this store's."""
        return self.replace(
            x=x, y=y, offsets=offsets, sizes=sizes, block=0, rows_of_largest=(), read="step"
        )

    def local(self, first: Int[ArrayLike, ""]) -> ClientStore:
        """Inside a program that sees one device's block of a :meth:`split` store (``x``,
        ``y``, ``offsets`` that block's, ``sizes`` whole): that block as a store of its
        own, whose client ``j`` is the federation's client ``first + j`` (padding clients
        past ``N`` the last client's size, as their copied rows). One ``ValueError`` line
        on a store that is not split."""
        if not self.block:
            raise ValueError(
                "ClientStore.local reads one device's block of a split store "
                "(ClientStore.split); this store is not split"
            )
        n = self.num_clients
        ids = jnp.minimum(jnp.asarray(first, jnp.int32) + jnp.arange(self.block), n - 1)
        return self.replace(sizes=self.sizes[ids], block=0, rows_of_largest=())

    def with_cap(self, max_examples: int | None) -> ClientStore:
        """This store under a per-round cap of ``max_examples`` rows per client (None: no
        cap, the store itself): buffers of ``min(max_examples, largest client)`` rows, and a
        client above the cap trains each round on a random subset of ``max_examples`` of its
        rows. A cap at or above the largest client changes nothing (the same buffers); a
        cap below it also runs a vmapped cohort as one block (:attr:`vmap_block` 0): every
        client's steps are then at most the cap's."""
        if max_examples is None:
            return self
        cap = check_int("max_examples", max_examples, 1)
        largest = int(np.max(np.asarray(self.sizes)))
        if cap >= largest:
            return self.replace(max_rows=largest, sample=False)
        # the cap bounds every client's steps: one vmapped block (measured fastest on the GPU),
        # and the cohort x cap buffer is already what the steps use
        return self.replace(max_rows=cap, sample=True, vmap_block=0, read="buffer")

    def with_vmap_block(self, block: int) -> ClientStore:
        """This store with vmapped cohorts run in size-sorted blocks of ``block`` clients
        (0: one block, every client to the largest one's steps)."""
        return self.replace(vmap_block=check_int("vmap_block", block, 0))

    def schedule(self, ids: Int[Array, " S"], client_map: str | int) -> tuple[Array, str | int]:
        """A cohort's slots ``ids`` (``>= num_clients`` or negative: unused) and the
        simulator's ``client_map`` -> the slots in the order they run and the map to run
        them with. With :attr:`vmap_block` set and clients vmapped (``"vmap"`` or blocks of
        ``k``), the slots are sorted by the rows each gathers (stable; unused slots last) and
        ``"vmap"`` becomes blocks of :attr:`vmap_block`: each block runs to its own largest
        client, and a block of unused slots is skipped. Otherwise unchanged. The slots'
        order changes only the order of the server's sums (float rounding)."""
        if not self.vmap_block or client_map == "sequential":
            return ids, client_map
        used = (ids >= 0) & (ids < self.num_clients)
        rows = jnp.minimum(self.sizes[jnp.where(used, ids, 0)], self.max_rows)
        order = jnp.argsort(jnp.where(used, rows, jnp.iinfo(jnp.int32).max), stable=True)
        block = self.vmap_block if client_map == "vmap" else client_map
        return ids[order], ("vmap" if block >= ids.shape[0] else block)

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
            source, table = codes, jax.device_put(_LEVELS)
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        return cls(
            # placed, not jnp.asarray'd: that compiles a copy program per shape
            x=jax.device_put(source[rows]),
            y=jax.device_put(y[rows].astype(np.int32)),
            offsets=jax.device_put(offsets.astype(np.int32)),
            sizes=jax.device_put(sizes.astype(np.int32)),
            max_rows=int(sizes.max()),
            x_table=table,
            vmap_block=VMAP_BLOCK if sizes.min() < sizes.max() else 0,
            read="step" if sizes.max() > STEP_READ_SPREAD * sizes.mean() else "buffer",
        )


@flax.struct.dataclass
class StoreIndex:
    """Where clients' rows lie in a :class:`ClientStore` (a pytree; a leading slot axis
    for a cohort, none for one client).

    Attributes:
        offset: ``(cohort,)`` int32, first row of each slot's client in the store.
        sizes: ``(cohort,)`` int32, rows of each slot's client (0: an unused slot).
    """

    offset: Int[Array, "..."]
    sizes: Int[Array, "..."]


@flax.struct.dataclass
class StoreClient:
    """ONE client read from the flat store step by step (:meth:`ClientStore.bind`): what
    :func:`~swarmjax.fl.client.local.local_train` takes in place of a padded
    :class:`~swarmjax.fl.data.clients.ClientData`, with no ``(max_rows, ...)`` buffer.

    Attributes:
        x, y, x_table: the store's arrays (``(rows, ...)``, ``(rows,)``, ``(256,)`` or
            None), shared by every client.
        offset: int32 scalar, the client's first row.
        sizes: int32 scalar, its rows ``|D_i|`` (0: an unused slot).
        max_rows: static; the positions a sampler draws from (``[0, max_rows)``, real
            where ``< sizes``), as the padded buffer's.
    """

    x: Array
    y: Int[Array, " rows"]
    x_table: Float[Array, "256"] | None
    offset: Int[Array, ""]
    sizes: Int[Array, ""]
    max_rows: int = flax.struct.field(pytree_node=False, default=0)

    @property
    def mask(self) -> Bool[Array, " max_rows"]:
        """``(max_rows,)`` True at the client's real positions (a prefix), as the padded
        buffer's mask: what a sampler draws its batches from."""
        return jnp.arange(self.max_rows, dtype=jnp.int32) < self.sizes

    def batch(self, idx: Int[Array, "..."]) -> tuple[Float[Array, "..."], Array, Array]:
        """Positions ``idx`` (any shape, in ``[0, max_rows)``) -> ``(x, y, real)``: the
        client's rows at those positions, gathered from the store and decoded to float32
        (``x (*idx.shape, ...)``), their labels, and True where the position is a real row;
        padding positions read ``x = 0``, ``y = 0`` (the padded buffer's values, bit for
        bit). Cost: ``idx.size`` rows read."""
        real = idx < self.sizes
        rows = jnp.where(real, self.offset + idx, 0)
        x = _decode(self.x_table, jnp.take(self.x, rows, axis=0))
        x = jnp.where(real.reshape(*real.shape, *([1] * (x.ndim - real.ndim))), x, 0.0)
        y = jnp.where(real, jnp.take(self.y, rows, axis=0), 0)
        return x.astype(jnp.float32), y, real


READS = ("buffer", "step")
"""Values of :attr:`ClientStore.read`."""

STEP_READ_SPREAD = 1.5
""":meth:`ClientStore.build` sets ``read="step"`` when the largest client holds more than
this many times the mean client's rows (the padded buffer then reads mostly padding); at
or below it, ``"buffer"``. Measured in docs/cross_device.md ("Clients of different
sizes"): on the 2-core CPU, 1,000 power-law MNIST clients, the step read's round was
1.02-1.04x the equal split's one at a time (the buffer's 3.5-4.0x); equal clients were no
slower by steps (0.61-0.80x of their buffer, same process), so the buffer is kept for them
only to leave their programs unchanged until a GPU measurement."""

VMAP_BLOCK = 5
"""Default :attr:`ClientStore.vmap_block` of a store whose clients differ in size and are not
capped: on an H100, 1,000 power-law MNIST clients, cohort 50, simple_cnn, a round in blocks
of 5 took 0.04 s against 0.07 s (10), 0.16 s (25) and 0.24 s (one block); measured in
docs/cross_device.md ("Clients of different sizes"), with the CPU's numbers. With step reads
(:attr:`ClientStore.read`, the same federation vmapped on the 2-core CPU, MLP) blocks of 5
were also the fastest: 0.88x the equal split's round, against 1.30x (10) and 4.21x (one
block)."""

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
    return _decode(store.x_table, x)


def _decode(table: Array | None, x: Array) -> Float[Array, "..."]:
    if table is None:
        return x.astype(jnp.float32)
    return jnp.take(table, x.astype(jnp.int32), axis=0)


def gather(
    store: ClientStore,
    client_ids: Int[ArrayLike, " cohort"],
    max_rows: int,
    valid: Bool[ArrayLike, " cohort"] | None = None,
    key: PRNGKeyArray | None = None,
    draw_ids: Int[ArrayLike, " cohort"] | None = None,
    decoded: bool = True,
) -> ClientData:
    """The cohort's clients as a stacked :class:`ClientData` (pure, jit-able).

    Args:
        store: the federation.
        client_ids: ``(cohort,)`` client ids; a negative id is an unused slot.
        max_rows: static rows per client in the buffer (:func:`choose_max_rows`); a client
            with more rows keeps its first ``max_rows``.
        valid: optional ``(cohort,)`` mask; False marks an unused slot (e.g. a Poisson
            cohort's capacity buffer).
        key: None: a client with more than ``max_rows`` rows keeps its first ``max_rows``.
            A key: it gets a uniformly random subset of ``max_rows`` of its rows
            (:func:`~swarmjax.fl.data.cohort.subset_rows` with ``fold_in(key, id)``);
            clients of at most ``max_rows`` rows are gathered exactly as without a key.
        draw_ids: the ids folded into ``key`` for each slot's draw; default
            ``client_ids`` (another numbering: a block of a split store, whose local ids
            are not the federation's).
        decoded: False: ``x`` as stored (a compressed store's uint8 codes, padded rows
            code 0: a quarter of float32's bytes to move, e.g. between the devices of a
            split store); :meth:`ClientStore.decoded` then gives the float32 buffer.

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
    pos = j[None, :]
    if key is not None:
        full = jnp.where(used, store.sizes[safe], 0)
        draw = jax.vmap(lambda i, n: subset_rows(jax.random.fold_in(key, i), n, max_rows))
        drawn = safe if draw_ids is None else jnp.asarray(draw_ids, jnp.int32)
        pos = draw(drawn, full)
    rows = jnp.where(mask, store.offsets[safe][:, None] + pos, 0)
    x = jnp.take(store.x, rows.reshape(-1), axis=0).reshape(*rows.shape, *store.x.shape[1:])
    y = jnp.where(mask, jnp.take(store.y, rows, axis=0), 0)
    data = ClientData(x=x, y=y, mask=mask, sizes=sizes)
    return store.decoded(data) if decoded else _masked(data)


def _masked(data: ClientData) -> ClientData:
    """``data`` with its padded rows' ``x`` zero (code 0 of a uint8 store)."""
    x, mask = data.x, data.mask
    keep = mask.reshape(*mask.shape, *([1] * (x.ndim - 2)))
    return data.replace(x=jnp.where(keep, x, jnp.zeros((), x.dtype)))


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
    A store with ``read="step"`` gathers no cohort buffer (its steps read ``B`` rows each):
    ``cohort_buffer`` is then what the padded read would have held, an upper bound.
    """
    cohort = check_int("cohort", cohort, 1)
    max_rows = check_int("max_rows", max_rows, 1)
    store_bytes = sum(int(a.size) * a.dtype.itemsize for a in (store.x, store.y))
    index_bytes = sum(int(a.size) * a.dtype.itemsize for a in (store.offsets, store.sizes))
    example = int(np.prod(store.example_shape, dtype=np.int64)) * 4  # gathered as float32
    buffer = cohort * max_rows * (example + 4 + 1) + cohort * 4
    return {"store": store_bytes, "index": index_bytes, "cohort_buffer": buffer}
