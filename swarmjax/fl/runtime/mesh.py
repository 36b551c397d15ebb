"""One run's cohort over a device mesh: the slots of a summed exchange split over a
``clients`` mesh axis (and the runs over a ``runs`` axis when the mesh has one).

On a ``clients`` axis of 2 or more devices the federation's (stacked) data and every
client's state are split by client id too (padded with unused clients, never selected):
each device holds a block of clients, receives its slots' rows from their owners
(:func:`gather_slots`, a ring of ``ppermute``s to the next device; a step-reading store's
rows back to back, as many as they are: :func:`gather_ragged`), trains those
clients, adds their replies in slot order into its partial sum, and sends the new states
back to their owners the same way (:func:`scatter_slots`); one ``psum`` over the
``clients`` axis gives every device the cohort's sum, and the server step then runs once,
on that sum. The rows move as copies, so splitting the federation changes no number.
Written with :func:`jax.shard_map` inside the one compiled program of a call
(docs/scaling.md says why not DrJAX). Per-client randomness is keyed by client id
(:func:`~swarmjax.fl.protocol.client_key`), so a client draws the same numbers on any
device; the sum is added in another order (per device, then across devices), so a
sharded run equals the unsharded one to float32 rounding, not bit for bit (one device:
bit for bit).

The same program runs on one host with several devices and over ``jax.distributed``
processes (every process calls it with the same arguments; :func:`clients_mesh` spans all
processes' devices).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array, Bool, Int, PyTree

from swarmjax.device import memory_stats

__all__ = [
    "CLIENTS",
    "RUNS",
    "CohortMemory",
    "SplitData",
    "block_rows",
    "check_every_process",
    "check_memory",
    "check_mesh_options",
    "clients_mesh",
    "describe",
    "evaluated_once",
    "gather_ragged",
    "gather_slots",
    "mesh_for",
    "on_host",
    "pad_clients",
    "padded_clients",
    "peak_memory",
    "placed",
    "refill_padding",
    "replicated",
    "scatter_slots",
    "shard_cohort",
    "split_clients",
    "splits",
    "through_key_data",
]

CLIENTS = "clients"
"""The mesh axis a run's cohort slots are split over."""
RUNS = "runs"
"""The mesh axis a call's runs (seeds, variants) are split over, when the mesh has one."""


def clients_mesh(
    devices: int | None = None, *, runs: int = 1, processes: int | None = None
) -> Mesh:
    """A mesh over the first ``devices`` of :func:`jax.devices` (every process's; default:
    all of them): axis ``("clients",)`` of size ``devices``, or ``("runs", "clients")`` of
    shape ``(runs, devices // runs)`` with ``runs > 1``. ``processes``: the
    ``jax.distributed`` process count the caller expects (``None``: whatever runs).

    Bad input is one ``ValueError`` line, before any work: more devices than present, a
    ``runs`` that does not divide ``devices``, a process count other than
    :func:`jax.process_count`.
    """
    present = jax.devices()
    if processes is not None and processes != jax.process_count():
        raise ValueError(
            f"processes={processes} but jax.distributed runs {jax.process_count()} "
            f"process(es) (jax.process_count()); start each process with "
            f"jax.distributed.initialize(num_processes={processes}, ...) or pass processes=None"
        )
    n = len(present) if devices is None else devices
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"devices must be an int >= 1 or None; got {devices!r}")
    if n > len(present):
        raise ValueError(
            f"devices={n} but {len(present)} present ({jax.default_backend()}, "
            f"{jax.process_count()} process(es)); pass devices <= {len(present)}"
        )
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1 or n % runs:
        raise ValueError(f"runs must be an int >= 1 dividing devices={n}; got {runs!r}")
    chosen = np.asarray(present[:n], dtype=object)
    if runs == 1:
        return Mesh(chosen, (CLIENTS,))
    return Mesh(chosen.reshape(runs, n // runs), (RUNS, CLIENTS))


def check_mesh_options(mesh: Any, clients_per_device: Any) -> None:
    """One ``ValueError`` line unless ``mesh`` is ``None`` or a mesh with a ``clients`` axis
    (and at most a ``runs`` axis), ``clients_per_device`` is ``None`` or an int ``>= 1``,
    and at most one of them is given; what the devices present allow is
    :func:`mesh_for`'s to check."""
    if mesh is not None and clients_per_device is not None:
        raise ValueError("pass mesh= or clients_per_device=, not both")
    k = clients_per_device
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError(f"clients_per_device must be an int >= 1; got {k!r}")
    if mesh is None:
        return
    if not isinstance(mesh, Mesh):
        raise ValueError(f"mesh must be a jax.sharding.Mesh or None; got {type(mesh).__name__}")
    names = tuple(mesh.axis_names)
    if CLIENTS not in names or not set(names) <= {CLIENTS, RUNS}:
        raise ValueError(
            f"mesh must have a {CLIENTS!r} axis and at most a {RUNS!r} axis besides; "
            f"got axes {names} (build one with swarmjax.fl.runtime.mesh.clients_mesh)"
        )


def mesh_for(
    mesh: Mesh | None, clients_per_device: int | None, slots: int, runs: int
) -> Mesh | None:
    """The mesh a call runs on: ``mesh`` checked, or one over as many devices as
    ``clients_per_device`` needs for ``slots`` slots (``None`` and ``None``: no mesh, one
    device, today's program). ``runs``: the call's runs (a ``runs`` axis must divide it).
    One ``ValueError`` line on bad input, before any work, including a mesh that leaves a
    ``jax.distributed`` process without a device (:func:`check_every_process`)."""
    check_mesh_options(mesh, clients_per_device)
    if clients_per_device is not None:
        k = clients_per_device
        need, present = math.ceil(slots / k), jax.device_count()
        if need > present:
            raise ValueError(
                f"clients_per_device={k} needs {need} devices for the cohort's {slots} slots; "
                f"{present} present: pass clients_per_device >= {math.ceil(slots / present)}"
            )
        return check_every_process(clients_mesh(need))
    if mesh is None:
        return None
    check_every_process(mesh)
    if RUNS in mesh.axis_names and runs % mesh.shape[RUNS]:
        raise ValueError(
            f"mesh's {RUNS!r} axis ({mesh.shape[RUNS]} devices) must divide the call's "
            f"{runs} runs (variants x seeds)"
        )
    return mesh


def check_every_process(mesh: Mesh) -> Mesh:
    """``mesh``, after one ``ValueError`` line if a ``jax.distributed`` process holds none
    of its devices: every process runs the call's program, and one with no device of the
    mesh would wait for the others' collectives without end."""
    held = {device.process_index for device in mesh.devices.flat}
    missing = sorted(set(range(jax.process_count())) - held)
    if missing:
        need = 1 + max(i for i, d in enumerate(jax.devices()) if d.process_index in missing)
        raise ValueError(
            f"mesh: its {mesh.devices.size} devices are all on process(es) {sorted(held)}, "
            f"none on jax.distributed process(es) {missing}, which would wait for them "
            f"without end: use a mesh with devices of every process (clients_mesh(devices) "
            f"takes the first devices of jax.devices(): devices >= {need}) or "
            f"start {len(held)} process(es)"
        )
    return mesh


def padded_slots(mesh: Mesh, slots: int) -> int:
    """The slot buffer a cohort of ``slots`` slots runs in over ``mesh``: padded with unused
    slots up to a multiple of the ``clients`` axis (an unused slot adds nothing)."""
    d = int(mesh.shape[CLIENTS])
    return -(-slots // d) * d


def describe(
    mesh: Mesh | None, slots: int, clients: int | None = None, *, data_split: bool = False
) -> str:
    """One line: how a run's cohort of ``slots`` slots is laid out over ``mesh`` and, given
    the federation's size ``clients``, how its client states (and, with ``data_split``, its
    data: stacked, or a flat store) are split by client id over the ``clients`` axis
    (:func:`splits`)."""
    if mesh is None:
        return f"one device: the cohort's {slots} slots on {jax.devices()[0].platform}:0"
    d = int(mesh.shape[CLIENTS])
    per = padded_slots(mesh, slots) // d
    pad = padded_slots(mesh, slots) - slots
    runs = f", runs over {mesh.shape[RUNS]} devices" if RUNS in mesh.axis_names else ""
    procs = len({dev.process_index for dev in mesh.devices.flat})
    split = ""
    if clients is not None and splits(mesh):
        held = padded_clients(mesh, clients)
        extra = f", {held - clients} unused" if held > clients else ""
        what = "data and states" if data_split else "states (their data whole on each)"
        split = f"; the {clients} clients' {what} split {held // d} a device{extra}"
    return (
        f"cohort of {slots} slots over {d} {mesh.devices.flat[0].platform} devices "
        f"({per} slots each{f', {pad} padding' if pad else ''}){runs}{split}; "
        f"{mesh.devices.size} devices on {procs} process(es)"
    )


def replicated(mesh: Mesh, tree: PyTree) -> PyTree:
    """``tree`` placed whole on every device of ``mesh``. Over ``jax.distributed`` every
    process passes the same values and each places them on its own devices of the mesh
    (PRNG key arrays through their key data)."""
    sharding = NamedSharding(mesh, PartitionSpec())
    if sharding.is_fully_addressable:
        return jax.device_put(tree, sharding)

    def place(x: Any) -> Array:
        host = np.asarray(x)
        return jax.make_array_from_process_local_data(sharding, host, host.shape)

    return jax.tree.map(lambda x: through_key_data(place, x), tree)


def through_key_data(fn: Callable[[Any], Any], x: Any) -> Any:
    """``fn(x)``; for a PRNG key array ``x``, ``fn`` of its key data (``uint32``, one more
    trailing axis) wrapped back as keys of ``x``'s implementation: for functions that move
    or reshape arrays by their client or run axes, which key arrays do not take directly."""
    if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):
        data = fn(jax.random.key_data(x))
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    return fn(x)


def splits(mesh: Mesh | None) -> bool:
    """Whether a run on ``mesh`` splits the federation's (stacked) data and the clients'
    states by client id over the ``clients`` axis: a clients axis of 2 or more devices
    (one device, or no mesh: everything whole, today's program)."""
    return mesh is not None and int(mesh.shape[CLIENTS]) > 1


def padded_clients(mesh: Mesh | None, clients: int) -> int:
    """How many clients a split federation holds: ``clients`` padded with unused clients
    (never selected) up to a multiple of the ``clients`` axis; ``clients`` when not split."""
    if not splits(mesh):
        return clients
    d = int(mesh.shape[CLIENTS])
    return -(-clients // d) * d


def pad_clients(tree: PyTree, padded: int) -> PyTree:
    """``tree`` (leading client axis on every leaf; numpy leaves stay numpy, on the host)
    padded to ``padded`` clients with copies of its last client (real values: an unused
    client's init and training see no zeros)."""

    def one(a: Any) -> Any:
        extra = padded - a.shape[0]
        if extra <= 0:
            return a
        xp = np if isinstance(a, np.ndarray) else jnp
        return xp.concatenate([a, xp.broadcast_to(a[-1:], (extra, *a.shape[1:]))])

    return jax.tree.map(one, tree)


def split_clients(mesh: Mesh, tree: PyTree) -> PyTree:
    """Host values ``tree`` (leading client axis ``N``) placed split by client id over
    ``mesh``'s ``clients`` axis (padded to :func:`padded_clients`; whole over a ``runs``
    axis): each device holds only its block. Over ``jax.distributed`` every process passes
    the same values and places its own devices' blocks (:func:`placed`)."""

    def padded(x: Any) -> np.ndarray:
        host = np.asarray(x)
        return pad_clients(host, padded_clients(mesh, host.shape[0]))

    hosts = jax.tree.map(padded, tree)
    return placed(mesh, hosts, jax.tree.map(lambda _: PartitionSpec(CLIENTS), hosts))


def placed(mesh: Mesh, tree: PyTree, spec: PyTree) -> PyTree:
    """Host values ``tree`` placed on ``mesh`` as the ``PartitionSpec`` pytree ``spec``
    says (e.g. a split store's blocks over the ``clients`` axis, its sizes whole). Over
    ``jax.distributed`` every process passes the same values and places its own devices'
    parts."""

    def place(x: Any, where: PartitionSpec) -> Array:
        host = np.asarray(x)
        sharding = NamedSharding(mesh, where)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree.map(place, tree, spec)


@partial(jax.jit, static_argnames=("sharding", "num"))
def refill_padding(sharding: NamedSharding, states: PyTree, num: int) -> PyTree:
    """``states`` (leaves ``(runs, N', ...)``, split by ``sharding``: client ids over its
    mesh's ``clients`` axis) with the padding clients ``num .. N'-1`` made copies of client
    ``num - 1``, as :func:`pad_clients` pads. A checkpoint restored onto another device
    count holds other padding (zeros past the rows it saved); refilled, the run's client
    maps read no zeros. Each device rewrites its own block; the one row copied reaches
    every device by an ``all_gather`` of one row each (one client's state per device)."""

    def block_refilled(block: Array) -> Array:  # (runs, B, ...): clients me*B .. me*B+B-1
        b = int(block.shape[1])
        owner, at = divmod(num - 1, b)
        last = jax.lax.all_gather(block[:, at : at + 1], CLIENTS)[owner]  # (runs, 1, ...)
        ids = jax.lax.axis_index(CLIENTS) * b + jnp.arange(b)
        return jnp.where((ids < num).reshape(1, b, *[1] * (block.ndim - 2)), block, last)

    refill = jax.shard_map(
        block_refilled,
        mesh=sharding.mesh,
        in_specs=sharding.spec,
        out_specs=sharding.spec,
        check_vma=False,
    )
    return jax.tree.map(lambda a: through_key_data(refill, a), states)


def on_host(states: PyTree, num: int) -> PyTree:
    """``states`` (leaves ``(runs, N', ...)``, split over a mesh by client id) as host
    arrays of their first ``num`` clients, ``(runs, num, ...)``, assembled block by block:
    no device ever holds more of them than its own block (and, over ``jax.distributed``,
    one block of each process at a time: :func:`_assembled`; every process must call it,
    and every one gets the whole). A PRNG key leaf comes back as a key array of that host
    key data (on the default device)."""

    def one(a: Array) -> np.ndarray:
        # one process: numpy copies each device's block into place (jax.Array._value)
        whole = np.asarray(a) if jax.process_count() == 1 else _assembled(a)
        return whole[:, :num]

    return jax.tree.map(lambda a: through_key_data(one, a), states)


def _assembled(a: Array) -> np.ndarray:
    """The whole of ``a`` (split over the devices of ``jax.distributed`` processes, some
    of which may hold none of it) on every process's host: in step ``k`` every process
    hands over the ``k``-th block it owns, zeros once it has none left
    (``multihost_utils.process_allgather``, which lands the step's blocks, one per process,
    on every device before they reach the host); every process places all the blocks it
    receives. Every process must call it, in the same order."""
    from jax.experimental import multihost_utils

    where = a.sharding.devices_indices_map(a.shape)  # every device's block, all processes
    owners: dict[tuple, Any] = {}  # one device per distinct block (replicas hold copies)
    for device in sorted(where, key=lambda d: d.id):
        owners.setdefault(tuple((s.start, s.stop) for s in where[device]), device)
    processes = range(jax.process_count())
    held = [[d for d in owners.values() if d.process_index == p] for p in processes]
    mine = {shard.device: shard.data for shard in a.addressable_shards}
    block = a.sharding.shard_shape(a.shape)
    out = np.empty(a.shape, a.dtype)
    own = held[jax.process_index()]
    for k in range(max(len(devices) for devices in held)):
        piece = np.asarray(mine[own[k]]) if k < len(own) else np.zeros(block, a.dtype)
        pieces = multihost_utils.process_allgather(piece)  # (processes, *block)
        for p, devices in enumerate(held):
            if k < len(devices):
                out[where[devices[k]]] = pieces[p]
    return out


def _next(mesh: Mesh) -> list[tuple[int, int]]:
    """The ring's one step: every device of the ``clients`` axis sends to the next."""
    d = int(mesh.shape[CLIENTS])
    return [(j, (j + 1) % d) for j in range(d)]


def gather_slots(
    mesh: Mesh, pick: Callable[[Array, Array], PyTree], b: int, ids: Int[Array, " S"], s: int
) -> PyTree:
    """Inside ``shard_map``: this device's ``s`` slots' rows (slots ``me*s .. me*s+s-1``
    of ``ids``, every client id ``< N``), taken from the devices that own them. Each
    device holds a block of ``b`` clients (``me*b .. me*b+b-1``); ``pick(local, theirs)``
    gives the rows of ``(s,)`` clients, ``theirs`` their federation ids and ``local``
    their positions in this device's block (clipped into it: a slot this device does not
    own gets any rows, replaced). :func:`block_rows` picks rows of stacked blocks.

    A ring (:func:`_round_the_ring`): each device's ``s``-row message starts at home with
    the rows it owns, goes round the ``clients`` axis one device a step, each device on
    the way putting in the rows it owns, and is home again after ``d`` steps. A device
    holds one message at a time, never a cohort's worth of rows."""
    d = int(mesh.shape[CLIENTS])
    me = jax.lax.axis_index(CLIENTS)

    def fill(step: Array) -> tuple[Array, PyTree]:  # the message of device me - step
        theirs = jax.lax.dynamic_slice_in_dim(ids, (me - step) % d * s, s)
        return theirs // b == me, pick(jnp.clip(theirs - me * b, 0, b - 1), theirs)

    shapes = jax.eval_shape(pick, ids[:s], ids[:s])  # any values: every row is filled once
    return _round_the_ring(mesh, fill, shapes)


def _round_the_ring(
    mesh: Mesh, fill: Callable[[Array], tuple[Array, PyTree]], shapes: PyTree
) -> PyTree:
    """Inside ``shard_map``: the ring of :func:`gather_slots` and :func:`gather_ragged`.
    ``fill(step)`` gives, for the message of device ``me - step``, which of its rows this
    device owns (``keep``, a leading axis) and those rows (any values elsewhere); each
    device's message (a pytree like ``shapes``, zeros at first) goes round the ``clients``
    axis one device a step (``ppermute`` in a ``fori_loop``), every owner putting its rows
    in (a ``where``: copies, exact for every dtype), and is home after ``d`` steps."""

    def put(message: PyTree, step: Array) -> PyTree:
        keep, mine = fill(step)

        def one(old: Array, a: Array) -> Array:
            return jnp.where(keep.reshape((-1,) + (1,) * (a.ndim - 1)), a, old)

        return jax.tree.map(one, message, mine)

    def step(k: Array, message: PyTree) -> PyTree:
        return put(jax.lax.ppermute(message, CLIENTS, _next(mesh)), k)

    start = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)
    d = int(mesh.shape[CLIENTS])
    message = jax.lax.fori_loop(1, d, step, put(start, jnp.zeros((), jnp.int32)))
    return jax.lax.ppermute(message, CLIENTS, _next(mesh))  # home


def gather_ragged(
    mesh: Mesh,
    pick: Callable[[Array, Array], PyTree],
    b: int,
    ids: Int[Array, " S"],
    sizes: Int[Array, " S"],
    s: int,
    rows: int,
) -> tuple[PyTree, Int[Array, " s"], Int[Array, " s"]]:
    """Inside ``shard_map``: this device's ``s`` slots' rows back to back in ONE message of
    ``rows`` rows (slots ``me*s .. me*s+s-1`` of ``ids``, every id ``< N``; slot ``k``
    holds ``sizes[me*s+k]`` rows; ``rows`` at least any device's total, zero rows after
    it), taken from the devices that own them. Returns ``(message, offsets, slot sizes)``:
    slot ``k``'s rows are ``message[offsets[k] : offsets[k] + sizes[k]]``.

    ``pick(local, within)`` gives, for ``(rows,)`` positions, row ``within`` of this
    device's block client ``local`` (both clipped into range by the caller's store: a
    position this device does not own gets any row, replaced). The ring of
    :func:`gather_slots`, with the slots' rows as they are instead of one buffer of the
    largest client per slot: what a step-reading store's slots read, whose clients'
    sizes differ most."""
    d = int(mesh.shape[CLIENTS])
    me = jax.lax.axis_index(CLIENTS)
    position = jnp.arange(rows, dtype=jnp.int32)

    def layout(source: Array) -> tuple[Array, Array, Array, Array]:
        theirs = jax.lax.dynamic_slice_in_dim(ids, source * s, s)
        n = jax.lax.dynamic_slice_in_dim(sizes, source * s, s).astype(jnp.int32)
        ends = jnp.cumsum(n)
        return theirs, n, ends - n, ends

    def fill(step: Array) -> tuple[Array, PyTree]:  # the message of device me - step
        theirs, _, starts, ends = layout((me - step) % d)
        k = jnp.minimum(jnp.searchsorted(ends, position, side="right"), s - 1)
        client = theirs[k]
        keep = (position < ends[-1]) & (client // b == me)
        return keep, pick(jnp.clip(client - me * b, 0, b - 1), position - starts[k])

    message = _round_the_ring(mesh, fill, jax.eval_shape(pick, position, position))
    _, n, starts, _ = layout(me)
    return message, starts, n


def block_rows(block: PyTree) -> Callable[[Array, Array], PyTree]:
    """:func:`gather_slots`' ``pick`` for a stacked block (a leading client axis on every
    leaf): row ``local`` of each leaf."""
    return lambda local, theirs: jax.tree.map(lambda a: a[local], block)


def scatter_slots(
    mesh: Mesh, block: PyTree, new: PyTree, ids: Int[Array, " S"], used: Bool[Array, " S"]
) -> PyTree:
    """Inside ``shard_map``: ``block`` (this device's clients) with the new states of every
    device's used slots that this device owns written at their clients (``new``: this
    device's ``s`` slots' states; ``ids``/``used``: every slot's, ``(S,)``). Other clients
    keep theirs, as :meth:`~swarmjax.fl.protocol.Slots.update` does. The same ring as
    :func:`gather_slots`: each device's new states go round once, each owner writing its
    own."""
    d, b = int(mesh.shape[CLIENTS]), int(jax.tree.leaves(block)[0].shape[0])
    s = int(jax.tree.leaves(new)[0].shape[0])
    me = jax.lax.axis_index(CLIENTS)

    def write(held: PyTree, states: PyTree, step: Array) -> PyTree:  # states of me - step
        source = (me - step) % d * s
        theirs = jax.lax.dynamic_slice_in_dim(ids, source, s)
        mine = jax.lax.dynamic_slice_in_dim(used, source, s) & (theirs // b == me)
        local = jnp.where(mine, theirs - me * b, b)  # b: out of range, dropped
        return jax.tree.map(lambda a, v: a.at[local].set(v, mode="drop"), held, states)

    def step(k: Array, carry: tuple) -> tuple:
        held, states = carry
        states = jax.lax.ppermute(states, CLIENTS, _next(mesh))
        return write(held, states, k), states

    held = write(block, new, jnp.zeros((), jnp.int32))
    return jax.lax.fori_loop(1, d, step, (held, new))[0]


@dataclass(frozen=True)
class SplitData:
    """How a device of a ``clients`` axis holds the federation's data when it is not
    stacked blocks (the default of :func:`shard_cohort`): a flat store split by client id
    (:meth:`~swarmjax.fl.data.store.ClientStore.split`).

    Attributes:
        spec: the data's ``PartitionSpec`` pytree (what ``shard_map`` splits and what it
            passes whole).
        clients: the clients each device holds (``b`` of :func:`gather_slots`).
        rows: ``(data, local, theirs, shared) -> rows`` inside ``shard_map``: the rows of
            this device's clients at block positions ``local`` (federation ids ``theirs``),
            ``shared`` what :func:`shard_cohort` passes every device whole; what travels
            between devices.
        arrived: ``(data, rows) -> rows`` on the device of the rows' slots, once they are
            there (e.g. a store's uint8 codes decoded: a quarter of the bytes travel).
        ragged: ``0``: each slot's rows travel as one buffer (:func:`gather_slots`).
            Else a device's slots' rows travel back to back in one message of ``ragged``
            rows (:func:`gather_ragged`): ``rows(data, local, within, shared)`` then gives
            row ``within`` of block clients ``local``, ``sizes(data)`` the ``(N,)`` rows
            of every client, and ``arrived`` takes ``(message, offsets, slot sizes)``.
        sizes: with ``ragged``, the clients' rows (above).
    """

    spec: PyTree
    clients: int
    rows: Callable[[PyTree, Array, Array, PyTree], PyTree]
    arrived: Callable[[PyTree, PyTree], PyTree] = lambda data, rows: rows
    ragged: int = 0
    sizes: Callable[[PyTree], Array] | None = None


def shard_cohort(
    mesh: Mesh,
    local: Callable[[Int[Array, " s"], Bool[Array, " s"], PyTree, PyTree], tuple[PyTree, PyTree]],
    ids: Int[Array, " S"],
    used: Bool[Array, " S"],
    shared: PyTree,
    owned: PyTree = None,
    split_data: SplitData | None = None,
) -> tuple[PyTree, PyTree]:
    """A summed client map over the ``clients`` axis of ``mesh``, inside a traced program.

    ``local(ids, used, shared, rows)``: ONE device's share, ``(s,)`` slot ids and use bits
    -> ``(client states (s, ...), reply sum of its used slots)``. ``shared``: arrays every
    device holds whole (a flat store's data that is not split, the round's inputs).
    ``owned``: ``None``, or ``(states, data)`` split by client id over the axis
    (:func:`splits`; ``data`` stacked blocks, a store split as ``split_data`` says, or
    ``None``): each device then receives its slots' rows from their owners
    (:func:`gather_slots`, ``rows`` passed to ``local``) and, after training, its slots'
    new states go back to their owners (:func:`scatter_slots`). ``ids``/``used`` (``(S,)``,
    ids ``< N``) are padded with unused slots to a multiple of the axis (the padded slots
    repeat ``ids[0]`` and add nothing). Returns ``(states, the cohort's reply sum)``: the
    partial sums added over devices (``psum``), the same on every device; ``states`` are
    the slots' new states ``(S, ...)``, or with ``owned`` the updated split states."""
    s = int(ids.shape[0])
    pad = padded_slots(mesh, s) - s
    if pad:
        ids = jnp.concatenate([ids, jnp.broadcast_to(ids[:1], (pad,))])
        used = jnp.concatenate([used, jnp.zeros((pad,), bool)])
    share = (s + pad) // int(mesh.shape[CLIENTS])

    def per_device(i: Array, u: Array, whole: PyTree, every: tuple, split: PyTree):
        rows = None
        if split is not None:
            held, data = split
            if split_data is None:
                b, pick = int(jax.tree.leaves(split)[0].shape[0]), block_rows(split)
            else:
                b = split_data.clients

                def pick(local: Array, theirs: Array) -> PyTree:
                    mine = block_rows(held)(local, theirs)
                    return mine, split_data.rows(data, local, theirs, whole)

            if split_data is not None and split_data.ragged:
                mine = gather_slots(mesh, block_rows(held), b, every[0], share)

                def within(local: Array, at: Array) -> PyTree:
                    return split_data.rows(data, local, at, whole)

                # an unused slot (a repeated filler id) carries the fewest rows any client
                # has: a share of s slots then holds at most its s largest clients' rows
                every_size = split_data.sizes(data)
                sizes = jnp.where(every[1], every_size[every[0]], jnp.min(every_size))
                got = gather_ragged(mesh, within, b, every[0], sizes, share, split_data.ragged)
                rows = (mine, split_data.arrived(data, got))
            else:
                rows = gather_slots(mesh, pick, b, every[0], share)
                if split_data is not None:
                    rows = (rows[0], split_data.arrived(data, rows[1]))
        states, total = local(i, u, whole, rows)
        if split is not None:
            states = None if states is None else scatter_slots(mesh, split[0], states, *every)
        return states, jax.lax.psum(total, CLIENTS)

    spec, whole = PartitionSpec(CLIENTS), PartitionSpec()
    owned_spec = spec if split_data is None else (spec, split_data.spec)
    # check_vma off: the client code's loops (lax.scan, fori_loop, cond) start carries from
    # constants that become per-device values, which the varying-axis types would refuse
    states, total = jax.shard_map(
        per_device,
        mesh=mesh,
        in_specs=(spec, spec, whole, whole, owned_spec),
        out_specs=(spec, whole),
        check_vma=False,
    )(ids, used, shared, (ids, used), owned)
    if owned is None and pad:
        states = jax.tree.map(lambda a: a[:s], states)
    return states, total


def evaluated_once(
    mesh: Mesh | None, evaluate: Callable[[PyTree, PyTree], PyTree], server: PyTree, test: PyTree
) -> PyTree:
    """``evaluate(server, test)`` inside a traced program, computed by ONE device of the
    ``clients`` axis of ``mesh`` and given to every device (``psum``: the others add exact
    zeros), where a replicated evaluation would compute it on every device. The metrics
    are the unsharded run's bit for bit (the same function on the same whole test set); on
    accelerators the round takes as long, on CPU virtual devices, which share the cores,
    the other devices' copies no longer cost ``d - 1`` evaluations of core time. Without a
    ``clients`` axis of 2 or more devices: ``evaluate(server, test)``."""
    if mesh is None or CLIENTS not in mesh.axis_names or int(mesh.shape[CLIENTS]) < 2:
        return evaluate(server, test)

    def per_device(server: PyTree, test: PyTree) -> PyTree:
        shapes = jax.eval_shape(evaluate, server, test)

        def none(server: PyTree, test: PyTree) -> PyTree:
            return jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)

        first = jax.lax.axis_index(CLIENTS) == 0
        metrics = jax.lax.cond(first, evaluate, none, server, test)
        return jax.tree.map(_summed_over_clients, metrics)

    whole = PartitionSpec()
    return jax.shard_map(
        per_device, mesh=mesh, in_specs=(whole, whole), out_specs=whole, check_vma=False
    )(server, test)


def _summed_over_clients(a: Array) -> Array:
    """``psum`` of ``a`` over the ``clients`` axis (a bool as an int: one device's True)."""
    if a.dtype == jnp.bool_:
        return jax.lax.psum(a.astype(jnp.int32), CLIENTS) > 0
    return jax.lax.psum(a, CLIENTS)


@dataclass(frozen=True)
class CohortMemory:
    """What a run's cohort and federation hold on a device, in bytes, from shapes alone (a
    lower bound: the clients' training activations and the one slot message in flight of
    :func:`gather_slots` are not counted).

    Attributes:
        shared: held whole by every device (a flat store's sizes and decoding table).
        per_slot: one cohort slot of one run: its gathered data, its client state, its new
            state and its reply.
        slots: the cohort's slot buffer ``S`` (the largest of the round exchanges').
        runs: the call's runs (variants x seeds) one device holds before a mesh splits them.
        split: the federation's stacked data, split by client id over a ``clients`` axis
            of 2 or more devices (:func:`splits`), whole otherwise.
        per_client: one client's state in one run, split the same way.
        clients: the federation's clients ``N``.
        ragged: ``()``, or for a step-reading store the bytes of the ``k`` largest
            clients' rows, ``k = 1 .. N``: split over ``d >= 2`` devices, each holds one
            message of its ``ceil(S / d)`` slots' rows a run (:func:`gather_ragged`).
    """

    shared: int
    per_slot: int
    slots: int
    runs: int
    split: int = 0
    per_client: int = 0
    clients: int = 0
    ragged: tuple[int, ...] = ()

    def federation(self, mesh: Mesh | None) -> int:
        """Bytes of the federation's data and the clients' states on one device of
        ``mesh``: the shared part, and its block of the padded clients (all of them
        without a clients axis of 2 or more) for each run it holds."""
        d = int(mesh.shape[CLIENTS]) if mesh is not None else 1
        return self._federation(d, self._runs(mesh))

    def per_device(self, mesh: Mesh | None) -> int:
        """Bytes on one device of ``mesh`` (``None``: one device holds it all): the
        federation's part (:meth:`federation`) plus its share of the padded slots of its
        share of the runs."""
        d = int(mesh.shape[CLIENTS]) if mesh is not None else 1
        return self.on_devices(d, self._runs(mesh))

    def _runs(self, mesh: Mesh | None) -> int:
        if mesh is None or RUNS not in mesh.axis_names:
            return self.runs
        return self.runs // int(mesh.shape[RUNS])

    def _federation(self, d: int, runs: int) -> int:
        n = self.clients
        block = -(-n // d) if d > 1 else n
        data = self.split if n == 0 or d == 1 else -(-self.split * block // n)
        return self.shared + data + self.per_client * block * runs

    def on_devices(self, d: int, runs: int) -> int:
        """Bytes on one device of a ``clients`` axis of ``d`` devices holding ``runs`` runs."""
        share = -(-self.slots // d)
        message = self.ragged[min(share, len(self.ragged)) - 1] if d > 1 and self.ragged else 0
        return self._federation(d, runs) + (self.per_slot * share + message) * runs

    def fits_on(self, limit: int, most: int = 1 << 16) -> int | None:
        """The fewest devices of 1, 2, 4, ... on a ``clients`` axis (no ``runs`` axis) on
        which a device holds at most ``limit`` bytes; ``None`` if not even ``most``."""
        d = 1
        while d <= most:
            if self.on_devices(d, self.runs) <= limit:
                return d
            d *= 2
        return None


def check_memory(memory: CohortMemory, mesh: Mesh | None, limit: int) -> None:
    """One ``ValueError`` line when a device of ``mesh`` would hold more than ``limit``
    bytes (:meth:`CohortMemory.per_device`), saying whether the federation (its data and
    the clients' states) alone is too large there, and naming the options that spread it
    over more devices; nothing otherwise."""
    need = memory.per_device(mesh)
    if need <= limit:
        return
    devices = 1 if mesh is None else int(mesh.shape[CLIENTS])
    federation = memory.federation(mesh)
    fits = memory.fits_on(limit)
    if fits is None:
        hint = (
            "the federation's data and client states alone do not fit even split over "
            "devices: use fewer clients"
        )
    else:
        hint = (
            f"spread the cohort and the federation over {fits} or more devices "
            f"(Execution(mesh=clients_mesh({fits})) or "
            f"Execution(clients_per_device<={-(-memory.slots // fits)}))"
        )
    alone = ", which alone do not fit" if federation > limit else ""
    raise ValueError(
        f"mesh: the cohort's {memory.slots} slots on {devices} device(s) need at least "
        f"{need / 2**20:.4g} MiB per device ({federation / 2**20:.4g} MiB of the federation's "
        f"data and client states{alone}, {memory.per_slot / 2**20:.4g} MiB per slot and run), "
        f"more than the device's {limit / 2**20:.4g} MiB: {hint}"
    )


def peak_memory(mesh: Mesh | None = None) -> dict[str, Any]:
    """Peak bytes in use per addressable device of ``mesh`` (default: this process's
    devices), ``{device: bytes}``, from ``device.memory_stats()["peak_bytes_in_use"]``;
    ``None`` for a device whose runtime reports nothing (the CPU does not)."""
    devices = jax.local_devices() if mesh is None else list(mesh.local_devices)
    return {str(dev): memory_stats(dev).get("peak_bytes_in_use") for dev in devices}
