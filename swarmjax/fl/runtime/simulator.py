"""The simulator: runs any :class:`~swarmjax.fl.protocol.Algorithm` in one process.

Clients are stacked (:class:`~swarmjax.fl.data.clients.ClientData` with a client axis) and every
exchange maps the ONE-client function over them (``vmap``, or ``lax.map`` with
``Execution(client_map="sequential")``); rounds are a ``lax.scan``; runs (seeds, target
epsilons, numeric hyper-parameters: a leading axis on the keys and the hyper pytree) are a
``vmap``, sharded over the devices when there are several. One compilation per (algorithm,
shapes, rounds per call); ``Execution(rounds_per_call=...)`` splits a run into calls with
the same result. How a call runs is its :class:`~swarmjax.fl.runtime.execution.Execution`,
what it publishes its :class:`~swarmjax.fl.runtime.result.Publication`.

Only selected clients' replies reach ``aggregate`` (the mask) and only selected clients'
states change; an exchange with ``max_selected`` runs just that many client calls (the
selected ids gathered into a buffer). Bytes are counted from the message dtypes and the
number of clients a deployment would message.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
import warnings
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array, Int, PRNGKeyArray, PyTree
from tqdm.auto import tqdm

from swarmjax._validation import check_int
from swarmjax.device import default_client_map, device_memory_bytes
from swarmjax.fl.data.clients import ClientData, as_test_set
from swarmjax.fl.private import algorithm_name
from swarmjax.fl.protocol import (
    Algorithm,
    Exchange,
    Slots,
    Variants,
    add_reply,
    aggregate_key,
    client_init_key,
    client_key,
    privacy_unit,
    reply_sum_zeros,
    row_shapes,
    run_keys,
    server_init_key,
    server_key,
    slot_sum,
    steps_of,
    variant_identities,
    where_selected,
)
from swarmjax.fl.runtime.callbacks import notify
from swarmjax.fl.runtime.canary_audit import CanaryCall, CanaryRound, canary_hook
from swarmjax.fl.runtime.checkpoint import Checkpoints, checkpoint_secret, fingerprint
from swarmjax.fl.runtime.execution import ClientMap, Execution, moved_options
from swarmjax.fl.runtime.mesh import (
    CLIENTS,
    RUNS,
    CohortMemory,
    SplitData,
    check_memory,
    evaluated_once,
    mesh_for,
    on_host,
    padded_clients,
    padded_slots,
    placed,
    refill_padding,
    replicated,
    shard_cohort,
    split_clients,
    splits,
)
from swarmjax.fl.runtime.result import (
    Disclosure,
    Publication,
    PublicRounds,
    Result,
    report,
    run_labels,
    run_privacy,
)
from swarmjax.models import param_bytes
from swarmjax.privacy.canaries import (
    CanaryAudit,
    CanaryReport,
)
from swarmjax.privacy.secret import Secret, fingerprints, randomness

__all__ = [
    "CHECKPOINT_NOT_RELEASED",
    "ClientMap",
    "Execution",
    "Publication",
    "Run",
    "advance",
    "finish",
    "init_runs",
    "num_clients",
    "run_exchange",
    "run_rounds",
    "simulate",
    "splits_data",
    "start",
]

_ROWS_STREAM = 0x726F7773  # fold_in constant of a round's capped-rows draw (ClientStore.take)

CHECKPOINT_NOT_RELEASED = (
    "checkpoints: the run's carry (client states, per-client step counts) and per-round "
    "outputs with "
    "the realised cohorts, statistics of private data covered by no epsilon, and secret.key, "
    "the run's secret, from which its noise can be regenerated"
)


def num_clients(clients: PyTree) -> int:
    """Client slots of the client data: its ``num_clients`` (``ClientData``, a flat
    ``ClientStore``), else the leading axis of its leaves."""
    n = getattr(clients, "num_clients", None)
    return n if isinstance(n, int) else int(jax.tree.leaves(clients)[0].shape[0])


def _gathers(clients: PyTree) -> bool:
    """Whether the client data gathers clients (a flat store) rather than being stacked."""
    return callable(getattr(clients, "take", None))


def _reads_steps(clients: PyTree) -> bool:
    """Whether the client data is a flat store whose steps read their batches from it
    (``ClientStore.read == "step"``): slots then carry only an index, bound per client."""
    return _gathers(clients) and getattr(clients, "read", "buffer") == "step"


def _bound(clients: PyTree, data: PyTree) -> PyTree:
    """ONE client's data as its client function sees it: a step-reading store's index
    bound to the store's (shared, closed-over) arrays; any other data unchanged."""
    return clients.bind(data) if _reads_steps(clients) else data


def _one_client(clients: PyTree, i: Int[Array, ""] | int) -> PyTree:
    if _gathers(clients):
        one = take_clients(clients, jnp.asarray(i, jnp.int32)[None])
        return _bound(clients, jax.tree.map(lambda a: a[0], one))
    return jax.tree.map(lambda a: a[i], clients)


def take_clients(clients: PyTree, ids: Int[Array, " S"], key: PRNGKeyArray | None = None) -> PyTree:
    """The stacked data of clients ``ids``: ``clients.take(ids)`` where the client data
    gathers (a flat client store; ``key``: the round's draw of rows for clients above a
    per-round cap, used where the store samples), ``clients.index(ids)`` where the store's
    steps read their own batches (``read="step"``: offsets and sizes, no rows; bind each
    client with :func:`_bound`), else row ``ids`` of every leaf."""
    take = getattr(clients, "take", None)
    if not callable(take):
        return jax.tree.map(lambda a: a[ids], clients)
    if _reads_steps(clients):
        return clients.index(ids)
    return take(ids, key) if key is not None and getattr(clients, "sample", False) else take(ids)


def _map_clients(
    fn: Any, args: tuple, client_map: ClientMap, used: Array | None = None, summed: bool = False
) -> Any:
    """``fn`` over the leading (client) axis of ``args`` as ``client_map`` says.

    ``used`` (``(S,)`` bool): slots whose reply counts. Where clients run one at a time or
    in blocks, a block with no used slot is skipped (``lax.cond``) and returns zeros: a
    Poisson cohort's unused capacity, or unselected clients, cost nothing. (Under a batched
    predicate, e.g. several runs vmapped, the cond computes both branches: same numbers.)

    ``summed`` (``fn`` returns ``(state, reply)``; needs ``used``): ``(states, reply sum)``,
    the used slots' replies added in slot order (:func:`~swarmjax.fl.protocol.add_reply`,
    what :func:`~swarmjax.fl.protocol.slot_sum` of the stacked replies gives, bit for bit on
    a CPU; on an accelerator ``slot_sum`` is a product and they agree to rounding).
    One at a time or in blocks, each reply (block) is added as it comes, inside the loop:
    no ``(S, ...)`` stack of replies is ever built.
    """
    if client_map == "vmap":
        out = jax.vmap(fn)(*args)
        return (out[0], slot_sum(out[1], used)) if summed else out
    k = 1 if client_map == "sequential" else int(client_map)
    if used is None:
        return jax.lax.map(lambda a: fn(*a), args, batch_size=None if k == 1 else k)
    one = (lambda a: fn(*a)) if k == 1 else (lambda a: jax.vmap(fn)(*a))

    def nothing(a: tuple) -> Any:  # what a skipped block gives: zeros shaped like its output
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(one, a))

    if summed:
        first = row_shapes(args)
        start = reply_sum_zeros(jax.eval_shape(lambda a: fn(*a), first)[1])

        def step(total: PyTree, a_u: tuple) -> tuple[PyTree, PyTree]:
            a, u = a_u

            def run(total: PyTree) -> tuple[PyTree, PyTree]:
                state, reply = one(a)
                if k == 1:
                    return add_reply(total, reply, u), state
                return slot_sum(reply, u, start=total), state

            # a skipped block runs nothing and adds nothing
            return jax.lax.cond(jnp.any(u), run, lambda t: (t, nothing(a)[0]), total)

    else:
        start = ()

        def step(total: PyTree, a_u: tuple) -> tuple[PyTree, PyTree]:
            a, u = a_u
            return total, jax.lax.cond(jnp.any(u), one, nothing, a)

    n = int(used.shape[0])
    if k == 1:
        total, out = jax.lax.scan(step, start, (args, used))
    else:
        full = n // k * k
        blocks = jax.tree.map(lambda a: a[:full].reshape(n // k, k, *a.shape[1:]), (args, used))
        total, out = jax.lax.scan(step, start, blocks)
        out = jax.tree.map(lambda a: a.reshape(full, *a.shape[2:]), out)
        if full < n:
            total, tail = step(total, jax.tree.map(lambda a: a[full:], (args, used)))
            out = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), out, tail)
    return (out, total) if summed else out


@dataclass(frozen=True)
class RunContext:
    """What every exchange of ONE run reads while it is traced: the algorithm, the clients'
    data, the run's hyper-parameters and key, the client map and the audit's canaries
    (``None`` without an audit). Built inside the compiled call; never a jit argument."""

    alg: Algorithm
    clients: PyTree
    hyper: PyTree
    run_key: PRNGKeyArray
    client_map: ClientMap = "vmap"
    canaries: CanaryRound | None = None
    mesh: Mesh | None = None  # summed exchanges split their slots over its "clients" axis
    # the federation's clients when ``clients`` and the states are split over the mesh's
    # clients axis (padded with unused clients); None: ``num_clients(clients)``
    num: int | None = None


def _num(ctx: RunContext) -> int:
    """The federation's clients ``N`` (not counting a split federation's padding)."""
    return num_clients(ctx.clients) if ctx.num is None else ctx.num


def run_exchange(
    ctx: RunContext,
    ex: Exchange,
    index: int,
    round_index: Int[Array, ""],
    server: PyTree,
    states: PyTree,
    canaries: CanaryRound | None = None,
) -> tuple[PyTree, ...]:
    """One exchange for one run: ``(server, client states, number of clients selected)``;
    with ``canaries``, the participating canaries' replies join the real ones in
    ``aggregate`` (never in the selected count), and a fourth value is returned: how many
    taking part sat out over the ``K`` slots (``int32``)."""
    clients, hyper, run_key, client_map = ctx.clients, ctx.hyper, ctx.run_key, ctx.client_map
    n = _num(ctx)
    ids = jnp.arange(n)
    mask = ex.select(server, server_key(run_key, round_index, index), n)
    request = ex.request(server)

    kept: list[bool] = []  # set while tracing: did the client return its state untouched?

    def client_fn(inputs: tuple) -> Any:
        """``one(state, data, id)`` over ``inputs = (federation, request, hyper, run key,
        round)``: passed in whole, never closed over, so that under the mesh they enter
        ``shard_map`` as its arguments (a traced value closed over from the outer program
        keeps the outer mesh's type, which the transpose of a ``lax.scan`` in the
        client's gradient, e.g. an LSTM's, refuses)."""
        fed, req, hyp, rkey, rnd = inputs

        def one(state: PyTree, data: PyTree, cid: Int[Array, ""]) -> tuple[PyTree, PyTree]:
            key = client_key(rkey, rnd, index, cid)
            new, reply = ex.client(state, _bound(fed, data), req, key, hyp)
            pairs = zip(jax.tree.leaves(new), jax.tree.leaves(state), strict=True)
            kept.append(all(a is b for a, b in pairs))
            return new, reply

        return one

    inputs = (clients, request, hyper, run_key, round_index)
    one = client_fn(inputs)

    rows_key = jax.random.fold_in(server_key(run_key, round_index, index), _ROWS_STREAM)
    summed = ex.aggregate_sum is not None  # replies folded into their sum as they come
    if ctx.mesh is not None and summed:  # the cohort's slots split over the devices
        client = (client_fn, inputs, kept)
        new, replies, slots = _mesh_exchange(ctx, ex, client, mask, states, rows_key)
        if splits(ctx.mesh):  # the split states, updated by their owners (None: untouched)
            states = states if new is None else new
        elif not all(kept):
            states = slots.update(states, new)
    elif ex.max_selected is None or ex.max_selected >= n:
        every = take_clients(clients, ids, rows_key) if _gathers(clients) else clients
        new, replies = _map_clients(one, (states, every, ids), client_map, mask, summed)
        states = states if all(kept) else where_selected(mask, new, states)
        slots = Slots.everyone(mask)
    else:  # only the cohort's slots: a round costs the cohort, not the federation
        chosen, cmap = _cohort_slots(clients, mask, ex.max_selected, client_map)
        safe = jnp.minimum(chosen, n - 1)
        take = partial(jax.tree.map, lambda a: a[safe])
        new, replies = _map_clients(
            one,
            (take(states), take_clients(clients, safe, rows_key), safe),
            cmap,
            chosen < n,
            summed,
        )
        slots = Slots(mask=chosen < n, ids=chosen, num_clients=n)
        if not all(kept):
            states = slots.update(states, new)
    dropped = None
    if canaries is not None:
        replies, slots, dropped = canaries.join(
            (run_key, hyper), (server, request), (round_index, index), replies, slots, summed
        )
    key = aggregate_key(run_key, round_index, index)
    if summed:
        server = ex.aggregate_sum(server, replies, slots, key, hyper)
    else:
        server = ex.aggregate(server, replies, slots, key, hyper)
    if dropped is not None:
        return server, states, jnp.sum(mask).astype(jnp.int32), dropped
    return server, states, jnp.sum(mask).astype(jnp.int32)


def _cohort_slots(
    clients: PyTree, mask: Array, size: int, client_map: ClientMap
) -> tuple[Int[Array, " S"], ClientMap]:
    """The ``(S,)`` slots of a cohort of at most ``size`` clients (``mask``'s selected ids in
    order, then ``N`` for an unused slot) and the client map to run them with: a store of
    unequal clients sorts them by size and vmaps them in blocks (``clients.schedule``)."""
    n = int(mask.shape[0])
    chosen = jnp.nonzero(mask, size=size, fill_value=n)[0].astype(jnp.int32)
    if callable(getattr(clients, "schedule", None)):
        return clients.schedule(chosen, client_map)
    return chosen, client_map


def _mesh_exchange(
    ctx: RunContext,
    ex: Exchange,
    client: tuple[Any, tuple],
    mask: Array,
    states: PyTree,
    rows_key: PRNGKeyArray,
) -> tuple[PyTree, PyTree, Slots]:
    """A summed exchange's client map over ``ctx.mesh``'s ``clients`` axis
    (:func:`~swarmjax.fl.runtime.mesh.shard_cohort`): each device gathers the states and data
    of its share of the slots (``ex.max_selected`` of them, or one per client) and adds its
    used slots' replies in slot order; ``client = (client_fn, inputs)``: ``client_fn(inputs)``
    is ``one(state, data, id)``, one client, built inside each device's program from
    ``inputs`` passed to it (with the federation first: ``inputs[0] is ctx.clients``);
    ``kept``, set while tracing, whether every client returned its state untouched.
    Returns ``(new states, the replies' sum, the slots)``: the slots' new states
    ``(S, ...)``, or where the mesh splits the states (:func:`~swarmjax.fl.runtime.mesh.splits`)
    the split states with the new ones written by their owners (``None``: untouched)."""
    clients, n = ctx.clients, int(mask.shape[0])
    if ex.max_selected is None or ex.max_selected >= n:
        chosen, cmap = jnp.arange(n, dtype=jnp.int32), ctx.client_map
    else:
        chosen, cmap = _cohort_slots(clients, mask, ex.max_selected, ctx.client_map)
    used = (chosen < n) & mask[jnp.minimum(chosen, n - 1)]

    client_fn, inputs, kept = client
    safe = jnp.minimum(chosen, n - 1)
    split_data = None
    if not splits(ctx.mesh):
        owned, shared = None, (states, rows_key, inputs)
    else:  # states and data split by client id
        held_split = splits_data(clients)  # as start placed it: split by client id
        owned = (states, clients if held_split else None)
        shared = (None, rows_key, (None, *inputs[1:]) if held_split else inputs)
        if held_split and _gathers(clients):
            share = padded_slots(ctx.mesh, int(chosen.shape[0])) // int(ctx.mesh.shape[CLIENTS])
            split_data = _store_split(clients, share)

    def local(ids: Int[Array, " s"], u: Array, whole: PyTree, rows: PyTree):
        whole_states, key, passed = whole
        if rows is None:
            mine, data = jax.tree.map(lambda a: a[ids], whole_states), None
        else:
            mine, data = rows
        if _reads_steps(data):  # a split step-reading store's slots' rows, as a store
            passed, data = (data, *passed[1:]), data.index(jnp.arange(ids.shape[0]))
        if data is None:
            data = take_clients(passed[0], ids, key)
        new, total = _map_clients(client_fn(passed), (mine, data, ids), cmap, u, summed=True)
        return (None if rows is not None and all(kept) else new), total

    new, total = shard_cohort(ctx.mesh, local, safe, used, shared, owned, split_data)
    return new, total, Slots(mask=used, ids=chosen, num_clients=n)


def _store_split(store: PyTree, share: int) -> SplitData:
    """How the devices of a clients axis hold a split flat store and move its rows to the
    slots of ``share`` slots a device: a buffer per slot, or a step-reading store's rows
    back to back (:func:`~swarmjax.fl.runtime.mesh.gather_ragged`, as many as the
    ``share`` largest clients hold: :meth:`~swarmjax.fl.data.store.ClientStore.slot_rows`)."""
    spec = _store_spec(store)
    if not _reads_steps(store):
        return SplitData(spec, store.block, _store_rows, _store_arrived)
    rows = store.slot_rows(share)
    return SplitData(spec, store.block, _store_step_rows, _store_step_arrived, rows, _slot_sizes)


def _slot_sizes(store: PyTree) -> Array:
    """The rows a step-reading store's client reads: its size, capped at ``max_rows``."""
    return jnp.minimum(store.sizes, store.max_rows)


def _store_step_rows(store: PyTree, local: Array, within: Array, shared: tuple) -> PyTree:
    """:class:`~swarmjax.fl.runtime.mesh.SplitData`'s ``rows`` of a split step-reading
    store: row ``within`` of this device's block clients ``local``, as stored."""
    del shared
    block = store.local(jax.lax.axis_index(CLIENTS) * store.block)
    at = jnp.take(block.offsets, local) + within
    return jnp.take(block.x, at, axis=0, mode="clip"), jnp.take(block.y, at, mode="clip")


def _store_step_arrived(store: PyTree, got: tuple) -> PyTree:
    """:class:`~swarmjax.fl.runtime.mesh.SplitData`'s ``arrived`` of a split step-reading
    store: the message of this device's slots as a store of their own, its steps reading
    and decoding their batches from it as from the whole store."""
    (x, y), offsets, sizes = got
    return store.arrived(x, y, offsets, sizes)


def _store_rows(store: PyTree, local: Array, theirs: Array, shared: tuple) -> PyTree:
    """:class:`~swarmjax.fl.runtime.mesh.SplitData`'s ``rows`` of a split flat store: the
    buffers of this device's clients at block positions ``local`` (federation ids
    ``theirs``: a capped client's rows are drawn under its own id, with the round's key,
    as on one device), as stored (uint8 codes travel, not float32)."""
    first = jax.lax.axis_index(CLIENTS) * store.block
    return store.local(first).take(local, shared[1], draw_ids=theirs, decoded=False)


def _store_arrived(store: PyTree, rows: PyTree) -> PyTree:
    """:class:`~swarmjax.fl.runtime.mesh.SplitData`'s ``arrived``: the rows that travelled
    as stored (uint8 codes) decoded on their slots' device, as one device gathers them."""
    return store.decoded(rows)


def _store_spec(store: PyTree) -> PyTree:
    """What a ``clients`` axis splits of a split flat store (its rows and block offsets)
    and what every device holds whole (the clients' sizes, the uint8 decoding table)."""
    c, whole = PartitionSpec(CLIENTS), PartitionSpec()
    return store.replace(
        x=c, y=c, offsets=c, sizes=whole, x_table=None if store.x_table is None else whole
    )


def splits_data(data: PyTree) -> bool:
    """Whether a clients mesh axis of 2 or more devices splits the federation's data by
    client id: stacked data, or a flat store
    (:meth:`~swarmjax.fl.data.store.ClientStore.split`, either way it reads its rows)."""
    return _stacked(data) or _gathers(data)


def _exchanges(ctx: RunContext, exchanges, round_index, server, states):
    """Every exchange of a round; the audit's canaries (``ctx.canaries``) join the hook's
    exchange.  Returns the server, the states, the selected counts and the canary
    participations that sat out over the slots (``0`` without an audit)."""
    counts = []
    dropped = jnp.zeros((), jnp.int32)
    canaries = ctx.canaries
    for e, ex in enumerate(exchanges):
        with_canaries = canaries if canaries is not None and e == canaries.hook.exchange else None
        server, states, c, *extra = run_exchange(
            ctx, ex, e, round_index, server, states, with_canaries
        )
        counts.append(c)
        if extra:
            dropped = dropped + extra[0]
    stacked = jnp.stack(counts) if counts else jnp.zeros((0,), jnp.int32)
    return server, states, stacked, dropped


def _init_one(ctx: RunContext):
    alg, run_key, hyper, clients = ctx.alg, ctx.run_key, ctx.hyper, ctx.clients
    server = alg.server_init(server_init_key(run_key), hyper)
    if splits(ctx.mesh):  # each device inits the clients it holds
        states = _init_split(ctx)
    else:
        n = num_clients(clients)
        ids = jnp.arange(n)
        states = _init_states(alg, run_key, hyper, clients, ids, ctx.client_map, _gathers(clients))
    zero = jnp.zeros((), jnp.int32)
    server, states, _, _ = _exchanges(ctx, alg.setup, zero, server, states)
    return server, states, zero


def _init_states(
    alg: Algorithm,
    run_key: PRNGKeyArray,
    hyper: PyTree,
    clients: PyTree,
    ids: Int[Array, " B"],
    client_map: ClientMap,
    gather: bool,
    first: Int[Array, ""] | int = 0,
) -> PyTree:
    """``client_init`` of clients ``ids`` (``(B, ...)`` states): ``clients`` stacked over
    exactly those ids (mapped by ``client_map``), or with ``gather`` a flat store read one
    client's rows at a time (never the whole federation padded; an id past the store's
    last client reads the last client's rows), client ``i``'s at store position
    ``i - first`` (a device's block of a split store, whose first client is ``first``)."""

    def one(data: PyTree, cid: Int[Array, ""]) -> PyTree:
        return alg.client_init(client_init_key(run_key, cid), data, hyper, cid)

    if not gather:
        return _map_clients(one, (clients, ids), client_map)
    last = num_clients(clients) - 1
    return jax.lax.map(
        lambda i: one(_one_client(clients, jnp.minimum(i - first, last)), i),
        ids,
        batch_size=min(int(ids.shape[0]), 256),
    )


def _init_split(ctx: RunContext) -> PyTree:
    """The client states of a federation split over ``ctx.mesh``'s clients axis: each
    device runs ``client_init`` on its block of the padded clients (an unused client past
    ``N`` inits from the last client's data under its own id; it is never selected)."""
    mesh, clients, n = ctx.mesh, ctx.clients, _num(ctx)
    block = padded_clients(mesh, n) // int(mesh.shape[CLIENTS])
    stacked = _stacked(clients)  # as start placed it: split by client id
    split_store = not stacked and splits_data(clients)
    store_spec = _store_spec(clients) if split_store else PartitionSpec()

    def per_device(mine: PyTree, run_key: Array, hyper: PyTree, store: PyTree) -> PyTree:
        first = jax.lax.axis_index(CLIENTS) * block
        ids = first + jnp.arange(block)
        if stacked:
            return _init_states(ctx.alg, run_key, hyper, mine, ids, ctx.client_map, False)
        if not split_store:  # data neither stacked nor a store: whole on every device
            return _init_states(ctx.alg, run_key, hyper, store, ids, ctx.client_map, True)
        local = store.local(first)  # this device's block: its own clients' rows
        return _init_states(ctx.alg, run_key, hyper, local, ids, ctx.client_map, True, first)

    spec, whole = PartitionSpec(CLIENTS), PartitionSpec()
    return jax.shard_map(
        per_device,
        mesh=mesh,
        in_specs=(spec, whole, whole, store_spec),
        out_specs=spec,
        check_vma=False,
    )(clients if stacked else None, ctx.run_key, ctx.hyper, None if stacked else clients)


def _rounds_one(ctx: RunContext, carry, test, rounds: int, diagnostics: bool):
    alg = ctx.alg
    accounting = alg.accounting()
    n = _num(ctx)

    def real(per_client: PyTree) -> PyTree:  # a split federation's padding dropped
        return jax.tree.map(lambda a: a[:n], per_client) if ctx.num is not None else per_client

    def body(c, _):
        server, states, t = c
        r = t + 1
        server, states, counts, dropped = _exchanges(ctx, alg.exchanges, r, server, states)
        out = {
            "metrics": evaluated_once(ctx.mesh, alg.evaluate, server, test),
            "steps": real(jax.vmap(lambda s: steps_of(accounting, server, s))(states)),
            "selected": counts,
        }
        if ctx.canaries is not None:
            out["canaries_dropped"] = dropped
        if diagnostics:
            out["diagnostics"] = real(jax.vmap(state_scalars)(states))
        return (server, states, r), out

    return jax.lax.scan(body, carry, None, length=rounds)


@partial(jax.jit, static_argnames=("alg", "cmap", "mesh", "num"))
def init_runs(alg, keys, hypers, clients, cmap, mesh=None, num=None):
    """Jitted: init + setup of every run; ``(server, client states, rounds done)`` with a run
    axis (``keys (runs,)``, ``hypers`` with a run axis; ``cmap``: the client map; ``mesh``:
    summed setup exchanges split their cohort over its ``clients`` axis; ``num``: the
    clients ``N`` of a federation split over it, ``clients`` then padded, see
    :func:`_carry_on_mesh`)."""

    def one(k, h):
        return _init_one(RunContext(alg, clients, h, k, cmap, mesh=mesh, num=num))

    return _carry_on_mesh(mesh, _runs_map(mesh, one)(keys, hypers))


def _runs_map(mesh: Mesh | None, fn: Any) -> Any:
    """``vmap`` of ``fn`` over the runs axis, split over ``mesh``'s ``runs`` axis if it has
    one (``spmd_axis_name``)."""
    return jax.vmap(
        fn, spmd_axis_name=RUNS if mesh is not None and RUNS in mesh.axis_names else None
    )


def _on_mesh(mesh: Mesh | None, tree: PyTree) -> PyTree:
    """A compiled call's outputs, replicated over ``mesh`` (every process holds them whole,
    so a host reads them and the next call takes them as they are); unchanged without one."""
    if mesh is None:
        return tree
    return jax.lax.with_sharding_constraint(tree, NamedSharding(mesh, PartitionSpec()))


def _split_sharding(mesh: Mesh) -> NamedSharding:
    """Client states ``(runs, N', ...)`` split by client id over the ``clients`` axis (and by
    run over a ``runs`` axis)."""
    runs = RUNS if RUNS in mesh.axis_names else None
    return NamedSharding(mesh, PartitionSpec(runs, CLIENTS))


def _carry_on_mesh(mesh: Mesh | None, carry: tuple) -> tuple:
    """A compiled call's carry ``(server, client states, rounds)`` on ``mesh``: replicated
    (:func:`_on_mesh`), except the client states of a mesh that splits them
    (:func:`~swarmjax.fl.runtime.mesh.splits`), which stay padded and split by client id
    between calls, in checkpoints and until :func:`finish` brings the ``N`` real clients'
    states to the host (:func:`final_states`)."""
    if not splits(mesh):
        return _on_mesh(mesh, carry)
    server, states, done = carry
    server, done = _on_mesh(mesh, (server, done))
    return server, jax.lax.with_sharding_constraint(states, _split_sharding(mesh)), done


def final_states(run: Run) -> PyTree:
    """``run``'s client states as :func:`finish` reports them, ``(runs, N, ...)``: the
    carry's own arrays, or where the mesh splits them, host arrays of the ``N`` real
    clients assembled block by block (:func:`~swarmjax.fl.runtime.mesh.on_host`; the same
    on every ``jax.distributed`` process), never gathered onto a device."""
    if not splits(run.mesh):
        return run.carry[1]
    return on_host(run.carry[1], num_clients(run.data))


def placed_carry(run: Run, carry: tuple) -> tuple:
    """A carry restored from a checkpoint
    (:meth:`~swarmjax.fl.runtime.checkpoint.Checkpoints.restore` into ``run``'s
    fresh carry: its shapes and placement) ready for ``run``'s compiled calls: where the
    mesh splits the client states into more than ``N`` rows, the padding rows become copies
    of client ``N - 1`` again (:func:`~swarmjax.fl.runtime.mesh.refill_padding`)."""
    server, states, done = carry
    num = num_clients(run.data)
    if not splits(run.mesh) or padded_clients(run.mesh, num) == num:
        return carry
    return server, refill_padding(_split_sharding(run.mesh), states, num), done


@dataclass(frozen=True)
class Rounds:
    """The static part of a compiled call of rounds (a jit static argument: equal values
    compile once): the algorithm, how many rounds, the client map, whether to collect the
    private diagnostics, the audit (or ``None``) and its canary slots per round ``K``
    (``None``: every canary, ``M``)."""

    alg: Algorithm
    rounds: int
    client_map: ClientMap = "vmap"
    diagnostics: bool = False
    audit: CanaryAudit | None = None
    canary_slots: int | None = None
    mesh: Mesh | None = None
    num: int | None = None  # the clients N of a federation split over the mesh (else None)


@partial(jax.jit, static_argnames=("call",))
def run_rounds(call: Rounds, carry, keys, hypers, clients, test, canaries=None):
    """Jitted: ``call.rounds`` more rounds of every run from ``carry`` (:func:`init_runs`'s
    output); returns ``(carry, per-round outputs)`` (metrics, accounted steps, selected
    counts).
    With ``call.audit`` (a :class:`~swarmjax.privacy.canaries.CanaryAudit`), canaries of
    directions ``canaries`` (a :class:`~swarmjax.privacy.canaries.DiracDirections`, or a
    Haar frame: a pytree like the model with a leading ``M`` axis; shared by every run)
    join the algorithm's canary exchange (``alg.accounting().canary_hook()``) every round,
    at most ``call.canary_slots`` of them a round; the outputs then also hold ``canaries_dropped``
    (participations that sat out over the slots, per round)."""
    audit = call.audit
    round_canaries = None
    if audit is not None:
        slots = audit.canaries if call.canary_slots is None else call.canary_slots
        round_canaries = CanaryRound(canary_hook(call.alg), audit, canaries, slots)

    def one(c, k, h):
        ctx = RunContext(
            call.alg, clients, h, k, call.client_map, round_canaries, call.mesh, call.num
        )
        return _rounds_one(ctx, c, test, call.rounds, call.diagnostics)

    if keys.shape[0] == 1:  # one run: unbatched, so a cond can skip unused client blocks
        single = jax.tree.map(lambda a: a[0], (carry, keys, hypers))
        carry, outs = jax.tree.map(lambda a: a[None], one(*single))
    else:
        carry, outs = _runs_map(call.mesh, one)(carry, keys, hypers)
    return _carry_on_mesh(call.mesh, carry), _on_mesh(call.mesh, outs)


def cohort_memory(
    alg: Algorithm, data: PyTree, key: PRNGKeyArray, hyper: PyTree, runs: int
) -> CohortMemory:
    """The bytes a call's cohort holds (:class:`~swarmjax.fl.runtime.mesh.CohortMemory`),
    from shapes alone (no work): ``key`` ``(R,)`` run keys, ``hyper`` with a run axis and
    ``runs``, how many of the runs one device holds before a mesh splits them.
    A slot counts one client's gathered data, its state twice (old and new) and one
    request-sized reply (a model's worth); the federation is its data (split by client
    when stacked or a flat store) and one state per client and run; a step-reading store
    split over a mesh also holds one message of its slots' rows a run (``ragged``)."""
    row, key = row_shapes((hyper, key))
    one = row_shapes(jax.eval_shape(lambda: take_clients(data, jnp.zeros((1,), jnp.int32))))
    state = jax.eval_shape(
        lambda k, d, h: alg.client_init(k, _bound(data, d), h, jnp.zeros((), jnp.int32)),
        key,
        one,
        row,
    )
    server = jax.eval_shape(alg.server_init, key, row)
    reply = max(
        (param_bytes(jax.eval_shape(ex.request, server)) for ex in alg.exchanges), default=0
    )
    n = num_clients(data)
    split, ragged = 0, ()  # what a clients axis splits: stacked data, or a store's rows
    if splits_data(data):
        split = param_bytes(data if _stacked(data) else (data.x, data.y, data.offsets))
    if _reads_steps(data):  # bytes of the k largest clients' rows, k = 1 .. N
        row_bytes = param_bytes((data.x[:1], data.y[:1]))
        ragged = tuple(v * row_bytes for v in data.largest_totals())
    return CohortMemory(
        shared=param_bytes(data) - split,
        per_slot=param_bytes(one) + 2 * param_bytes(state) + reply,
        slots=slot_buffer(alg, n),
        runs=runs,
        split=split,
        per_client=param_bytes(state),
        clients=n,
        ragged=ragged,
    )


def _stacked(data: PyTree) -> bool:
    """Whether the federation's data is stacked (every leaf with a leading client axis),
    which a clients mesh axis splits as it is (a flat store: :func:`splits_data`)."""
    n = num_clients(data)
    return not _gathers(data) and all(
        getattr(a, "ndim", 0) >= 1 and a.shape[0] == n for a in jax.tree.leaves(data)
    )


def _message_bytes(alg: Algorithm, carry, keys, hypers, clients: PyTree) -> list[tuple[int, int]]:
    """``(request bytes, reply bytes)`` of each round exchange, from the message shapes: the
    request's dtypes and the reply's bytes on the wire (:meth:`Exchange.reply_bytes`: packed
    where the exchange declares ``reply_bits``)."""
    server, states, key, hyper = row_shapes((carry[0], carry[1], keys, hypers))
    one_state = row_shapes(states)
    one_data = jax.eval_shape(lambda c: _one_client(c, 0), clients)
    out = []
    for ex in alg.exchanges:
        req = jax.eval_shape(ex.request, server)
        _, reply = jax.eval_shape(
            lambda s, d, r, k, h, ex=ex: ex.client(s, d, r, k, h),
            one_state,
            one_data,
            req,
            key,
            hyper,
        )
        out.append((param_bytes(req), ex.reply_bytes(reply)))
    return out


def _run_devices(runs: int) -> int:
    """How many devices :func:`_sharded` spreads ``runs`` runs over (1: not spread)."""
    devices = len(jax.devices())
    return 1 if devices < 2 or runs % devices else devices


def _sharded(tree: PyTree) -> PyTree:
    devices = jax.devices()
    runs = jax.tree.leaves(tree)[0].shape[0]
    if _run_devices(runs) == 1:
        return tree
    sharding = NamedSharding(Mesh(np.asarray(devices), ("runs",)), PartitionSpec("runs"))
    return jax.device_put(tree, sharding)


@moved_options
def simulate(
    alg: Algorithm,
    clients: PyTree,
    test: tuple[Array, Array],
    variants: Variants,
    *,
    secret: Secret | None = None,
    audit: CanaryAudit | None = None,
    publication: Publication | None = None,
    execution: Execution | None = None,
) -> Result:
    """Run ``alg`` for every (variant, seed) at once and return the one :class:`Result`.

    Args:
        alg: the algorithm (hashable; a static jit argument).
        clients: stacked client data (usually :class:`~swarmjax.fl.data.clients.ClientData`
            with a leading client axis); every client holds its slice of
            ``alg.client_data(clients, test)``, which checks them (and ``test``) before
            any work.
        test: public ``(x, y)`` test set for ``alg.evaluate``.
        variants: the hyper pytree with a variant axis, its labels and the call's
            :class:`~swarmjax.fl.protocol.RunSpec` (rounds, delta, seeds,
            ``common_random_numbers``); runs are (variant, seed) pairs, variant-major.
        secret: the call's :class:`~swarmjax.privacy.secret.Secret`, the root of every
            random number of its runs (noise, cohorts, client batches). ``None``
            (default): 256 fresh bits of operating-system entropy, so two calls never share
            a draw; with ``execution.checkpoint_dir`` they are saved there (a folder never
            released) and a resumed run draws the same numbers. Pass one (reproducible
            mode, e.g. ``Secret.from_file(path)``) to replay a run: its guarantee then holds
            only while that secret is kept, and the record and ledger say so.
        audit: a :class:`~swarmjax.privacy.canaries.CanaryAudit`: ``audit.canaries``
            client-level canaries join every run by the algorithm's participation rule
            (``alg.accounting().canary_hook()``), outside its metrics and accounting;
            after the run each run's :class:`~swarmjax.privacy.canaries.CanaryReport`
            (the empirical epsilon lower bound with its confidence, beside the accounted
            epsilon) is in
            ``Result.audit``, the privacy record's ``audit`` and the ledger's releases
            (docs/audits.md). Checked before any work: a non-private run, an algorithm
            without a canary hook, a score it cannot compute or more canaries than the
            model has parameters raise one ``ValueError`` naming the option.
        publication: what the call publishes and where it is recorded
            (:class:`~swarmjax.fl.runtime.result.Publication`: the experiment's ledger, the
            path of the released outputs, the data source); ``None``: ``Publication()``,
            nothing recorded.
        execution: how the call runs, none of it changing the numbers
            (:class:`~swarmjax.fl.runtime.execution.Execution`: client map, rounds per
            compiled call, device mesh, checkpoints, progress bar, callbacks, private
            diagnostics); ``None``: ``Execution()``.

    The options these replaced (``client_map=``, ``ledger=``, ``common_random_numbers=``,
    ...) are refused with one ``TypeError`` line naming their new home.
    """
    publication = _checked(publication, Publication, "publication")
    execution = _checked(execution, Execution, "execution")
    checkpoint_dir = execution.checkpoint_dir
    if variants.spec.common_random_numbers and publication.ledger is not None and variants.size > 1:
        raise ValueError(
            "common_random_numbers: the variants would share their noise, and the ledger "
            "composes every run it is given; pass Publication(ledger=None) (publish at most one "
            "variant) or RunSpec(common_random_numbers=False)"
        )
    if secret is None and checkpoint_dir is not None:
        secret = checkpoint_secret(checkpoint_dir)
    run = start(alg, clients, test, variants, secret=secret, audit=audit, execution=execution)
    rounds = variants.spec.rounds
    per_call = rounds if execution.rounds_per_call is None else execution.rounds_per_call
    saved = (
        None
        if checkpoint_dir is None
        else Checkpoints(
            checkpoint_dir,
            fingerprint(alg, variants, run.data, run.keys),
            {
                "common_random_numbers": variants.spec.common_random_numbers,
                "diagnostics": execution.diagnostics,
            }
            | ({} if audit is None else {"audit": repr(audit)}),
        )
    )
    if saved is not None and saved.latest() is not None:
        done = saved.latest()
        like = jax.eval_shape(lambda c: _call(run, c, 1)[1], run.carry)
        carry, first = saved.restore(done, run.carry, like, clients=num_clients(run.data))
        run = dataclasses.replace(run, carry=placed_carry(run, carry), outputs=(first,), done=done)
    progress = sys.stderr.isatty() if execution.progress is None else execution.progress
    labels = pd.DataFrame(dict(run.labels))
    with tqdm(
        total=rounds, initial=run.done, disable=not progress, unit="round", desc=algorithm_name(alg)
    ) as bar:
        calls, warned = 0, False
        while run.done < rounds:
            n = min(per_call, rounds - run.done)
            started = time.perf_counter()
            run, metrics = advance(run, n)
            calls += 1
            if calls == 2 and not warned:  # the first call compiles: time the second
                warned = long_run_warning((time.perf_counter() - started) / n, rounds - run.done)
            bar.update(n)
            notify(execution.callbacks, run.done - n + 1, metrics, labels)
            if saved is not None:
                run = dataclasses.replace(run, outputs=(_joined(run.outputs),))
                saved.save(run.done, run.carry, run.outputs[0], clients=num_clients(run.data))
    if saved is not None:
        saved.close()
    result = finish(run, publication=publication)
    if publication.ledger is not None and checkpoint_dir is not None:
        publication.ledger.mark_not_released(checkpoint_dir, CHECKPOINT_NOT_RELEASED)
    return result


def _checked(value: Any, kind: type, name: str) -> Any:
    """``value``, or ``kind()`` for ``None``; anything else is one ``ValueError`` line."""
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise ValueError(f"{name} must be {kind.__name__}(...) or None; got {type(value).__name__}")
    return value


@dataclasses.dataclass(frozen=True)
class Run:
    """A simulation in progress, for a loop the user owns: :func:`start` builds it,
    :func:`advance` moves every run of it by some rounds (returning the new ``Run`` and
    those rounds' metrics), :func:`finish` turns it into the :class:`Result` with the
    privacy record of the rounds done. :func:`simulate` is exactly this loop.

    Holds every (variant, seed) run of one call: ``runs = variants.size * len(seeds)``
    along a leading axis of ``keys``, ``hyper`` and the ``carry`` (server states, client
    states and per-client step counts). ``done``: rounds advanced so far (at most
    ``variants.spec.rounds``, the rounds the runs were calibrated for); ``outputs``: the
    per-call outputs on the host (metrics ``(runs, rounds)``, accounted steps, selections).
    """

    alg: Algorithm
    clients: PyTree
    data: PyTree
    test: tuple[Array, Array]
    variants: Variants
    keys: PRNGKeyArray
    hyper: PyTree
    labels: dict[str, np.ndarray]
    client_map: ClientMap
    diagnostics: bool
    secret_source: str  # "entropy" or "supplied" (the secret itself is not kept here)
    canaries: CanaryCall | None  # the call's client-level audit (None without one)
    sizes: list[tuple[int, int]]
    carry: Any
    done: int = 0
    outputs: tuple[dict, ...] = ()
    mesh: Mesh | None = None  # the clients (and runs) mesh of the call, or None: one device
    # the federation as the compiled calls read it (on the mesh: split by client id where
    # it splits them, else replicated); None: ``data``
    federation: PyTree = None

    @property
    def runs(self) -> int:
        """Number of (variant, seed) runs."""
        return int(self.keys.shape[0])

    @property
    def server(self) -> PyTree:
        """The server states now (leading run axis)."""
        return self.carry[0]

    @property
    def metrics(self) -> dict[str, np.ndarray]:
        """Every public metric of the rounds done: ``{name: (runs, done)}``."""
        if not self.outputs:
            return {}
        return {k: np.asarray(v) for k, v in _joined(self.outputs)["metrics"].items()}


@moved_options
def start(
    alg: Algorithm,
    clients: PyTree,
    test: tuple[Array, Array],
    variants: Variants,
    *,
    secret: Secret | None = None,
    audit: CanaryAudit | None = None,
    execution: Execution | None = None,
) -> Run:
    """Check the call and initialise every run (:func:`simulate`'s arguments of the same
    names; ``secret=None`` draws a fresh one from operating-system entropy, never saved;
    of ``execution`` it uses the client map, mesh and diagnostics: the loop is the
    caller's, so rounds per call, checkpoints, progress and callbacks are too); no round
    is run. Bad input is one ``ValueError`` line here, before any work."""
    execution = _checked(execution, Execution, "execution")
    if secret is None and jax.process_count() > 1:
        raise ValueError(
            f"secret=None would draw a different secret in each of the {jax.process_count()} "
            "jax.distributed processes; pass every process the same secret= (e.g. "
            "Secret.from_file) or one Execution(checkpoint_dir=...) on a shared file system"
        )
    if secret is None:
        secret = Secret.generate()
    elif not isinstance(secret, Secret):
        raise ValueError(
            f"secret must be a swarmjax.privacy.secret.Secret or None; got {type(secret).__name__}"
        )
    test = as_test_set(test)
    data = alg.client_data(clients, test)  # checked against the algorithm first
    warn_input_mismatch(clients, test)
    client_map = execution.client_map
    if client_map is None:
        client_map = default_client_map()
    hook = None if audit is None else CanaryCall.check(alg, variants, audit)
    mesh = _check_mesh(alg, data, variants, execution.mesh, execution.clients_per_device)
    n_var = variants.size
    for name, values in variants.labels.items():
        if len(values) != n_var:
            raise ValueError(
                f"variants.labels[{name!r}] must have {n_var} values; got {len(values)}"
            )
    seed_list = list(variants.spec.seeds)
    identities = variant_identities(alg, variants)
    keys = run_keys(secret, seed_list, identities, variants.spec.common_random_numbers)
    hyper = jax.tree.map(  # on the host: an eager repeat would compile a program a leaf
        lambda a: jax.device_put(np.repeat(np.asarray(a), len(seed_list), axis=0)), variants.hyper
    )
    labels = run_labels(variants)
    first = jax.devices()[0] if mesh is None else mesh.devices.flat[0]
    limit = device_memory_bytes(first if first.process_index == jax.process_index() else None)
    held = len(keys) if mesh is not None else len(keys) // _run_devices(len(keys))
    check_memory(cohort_memory(alg, data, keys, hyper, held), mesh, limit)
    federation, num = data, None
    if mesh is None:
        keys, hyper = _sharded((keys, hyper))
    else:  # every process passes the same values; the program splits the work
        keys, hyper, test = replicated(mesh, (keys, hyper, test))
        if splits(mesh) and _stacked(data):  # each device holds its clients' block
            federation = split_clients(mesh, data)
        elif splits(mesh) and splits_data(data):  # a flat store, in blocks of clients
            store = data.split(int(mesh.shape[CLIENTS]))
            federation = placed(mesh, store, _store_spec(store))
        else:
            federation = replicated(mesh, data)
        num = _split_num(mesh, data)
    carry = init_runs(alg, keys, hyper, federation, client_map, mesh, num)
    canaries = None
    if hook is not None:
        canaries = CanaryCall.start(hook, audit, carry[0], keys, variants.spec.rounds)
    return Run(
        alg=alg,
        clients=clients,
        data=data,
        test=test,
        variants=variants,
        keys=keys,
        hyper=hyper,
        labels=labels,
        client_map=client_map,
        diagnostics=execution.diagnostics,
        secret_source=secret.source,
        canaries=canaries,
        mesh=mesh,
        sizes=_message_bytes(alg, carry, keys, hyper, data),
        carry=carry,
        federation=federation,
    )


def _split_num(mesh: Mesh | None, data: PyTree) -> int | None:
    """The clients ``N`` a compiled call passes as ``num`` where ``mesh`` splits the
    federation (:func:`~swarmjax.fl.runtime.mesh.splits`; its arrays then padded), else
    ``None``."""
    return num_clients(data) if splits(mesh) else None


def _call(run: Run, carry: Any, rounds: int) -> tuple[Any, dict]:
    canaries = run.canaries
    audit, slots = (None, None) if canaries is None else (canaries.audit, canaries.slots)
    num = _split_num(run.mesh, run.data)
    call = Rounds(run.alg, rounds, run.client_map, run.diagnostics, audit, slots, run.mesh, num)
    directions = None if canaries is None else canaries.directions
    data = run.data if run.federation is None else run.federation
    return run_rounds(call, carry, run.keys, run.hyper, data, run.test, directions)


def advance(run: Run, rounds: int = 1) -> tuple[Run, dict[str, np.ndarray]]:
    """Run every run of ``run`` for ``rounds`` more rounds in one compiled call (one
    compilation per distinct ``rounds``; the same numbers as :func:`simulate` for any split
    of the rounds). Returns the advanced ``Run`` and the public metrics of these rounds,
    ``{name: (runs, rounds)}`` (test-set metrics: a loop may stop on them early, and
    :func:`finish` then accounts only the rounds done). Refuses, before any work, to go
    past ``variants.spec.rounds``: the noise was calibrated for that many rounds."""
    left = run.variants.spec.rounds - run.done
    check_int("rounds", rounds, 1)
    if rounds > left:
        raise ValueError(
            f"rounds must be <= {left}, the rounds left of the run's spec.rounds="
            f"{run.variants.spec.rounds} (its noise is calibrated for those); got {rounds}"
        )
    carry, out = _call(run, run.carry, rounds)
    out = jax.device_get(out)
    advanced = dataclasses.replace(
        run, carry=carry, done=run.done + rounds, outputs=(*run.outputs, out)
    )
    return advanced, {k: np.asarray(v) for k, v in out["metrics"].items()}


def _joined(outputs: tuple[dict, ...]) -> dict:
    return jax.tree.map(lambda *xs: np.concatenate(xs, axis=1), *outputs)


@moved_options
def finish(run: Run, *, publication: Publication | None = None) -> Result:
    """The :class:`Result` of the rounds done (history, metrics, final states, the privacy
    record accounting those rounds, the audit's reports); with a ledger in ``publication``
    (:func:`simulate`'s argument), its runs are added as releases written at
    ``publication.path``."""
    publication = _checked(publication, Publication, "publication")
    if run.done < 1:
        raise ValueError("finish needs at least one round: call advance(run) first")
    alg, spec, runs, rounds = run.alg, run.variants.spec, run.runs, run.done
    out = _joined(run.outputs)
    data, clients = run.data, run.clients
    n_clients = num_clients(data)
    expected = _expected_selected(alg, run.hyper, n_clients, runs, rounds)
    selected = np.where(np.isnan(expected), out["selected"], expected)  # what is released
    sizes_known = isinstance(clients, ClientData) or _gathers(clients)
    record = run_privacy(
        alg,
        out["steps"],
        run.hyper,
        spec,
        n_clients,
        sizes=np.asarray(clients.sizes) if sizes_known else None,
        disclosure=Disclosure(
            randomness=randomness(run.secret_source, spec.common_random_numbers),
            key_fingerprints=fingerprints(run.keys),
            shares_randomness=spec.common_random_numbers and run.variants.size > 1,
        ),
    )
    reports: tuple[CanaryReport, ...] = ()
    if run.canaries is not None:
        dropped = np.asarray(out["canaries_dropped"]).reshape(runs, -1).sum(axis=1)
        reports = run.canaries.reports(alg, run.keys, run.carry[0], record, dropped)
        record = dataclasses.replace(record, audit=tuple(r.to_dict() for r in reports))
    diag = {}
    if run.diagnostics:
        diag = dict(out["diagnostics"])
        diag["selected"] = out["selected"]
    sizes = np.asarray(run.sizes, np.float64).reshape(-1, 2)  # (exchanges, down / up)
    rounds = PublicRounds(
        labels=run.labels,
        metrics=out["metrics"],
        selected={ex.name: selected[:, :, e] for e, ex in enumerate(alg.exchanges)},
        bytes_down=selected @ sizes[:, 0],
        bytes_up=selected @ sizes[:, 1],
    )
    result = report(
        rounds,
        record,
        server=run.carry[0],
        clients=final_states(run),
        private_diagnostics=diag,
        audit=reports,
        algorithm=algorithm_name(alg),
    )
    accounting = alg.accounting()
    if run.canaries is None and privacy_unit(accounting) is not None:
        result = accounting.audited(result)  # record-level canaries the clients carried
    publication.record(result, algorithm_name(alg))
    return result


LONG_RUN_SECONDS = 3600.0
"""A run expected to take longer than this after its second compiled call is warned about."""


def long_run_warning(seconds_per_round: float, rounds_left: int) -> bool:
    """Warn (one line, ``UserWarning``) when ``rounds_left`` rounds at ``seconds_per_round``
    (measured on a compiled call, compilation excluded) exceed :data:`LONG_RUN_SECONDS`;
    returns whether it warned."""
    left = seconds_per_round * rounds_left
    if left <= LONG_RUN_SECONDS:
        return False
    warnings.warn(
        f"about {left / 3600:.1f} hours left ({rounds_left} rounds at {seconds_per_round:.2f} s "
        "a round on this machine); Ctrl-C stops it (with Execution(checkpoint_dir=...) it "
        "resumes), or lower the rounds, clients or model",
        UserWarning,
        stacklevel=4,  # past simulate and its moved_options wrapper: the caller
    )
    return True


def state_scalars(state: PyTree) -> dict[str, Array]:
    """The private diagnostics of one client's state: every numeric scalar leaf, named by
    its path (``"loss"``, ``"swarm.iteration"``, ``"opt_state.0.count"``)."""
    leaves = jax.tree_util.tree_leaves_with_path(state)
    return {
        jax.tree_util.keystr(path, simple=True, separator="."): leaf
        for path, leaf in leaves
        if jnp.ndim(leaf) == 0 and jnp.issubdtype(leaf.dtype, jnp.number)
    }


@functools.partial(jax.jit, static_argnums=1)
def input_rows(x: Array, lead: int) -> Array:
    """At most 4,096 rows of ``x``, its first ``lead`` axes flattened into one (one program
    a shape; eager slicing would compile one a step)."""
    return x.reshape(-1, *x.shape[lead:])[:4096]


def warn_input_mismatch(clients: Any, test: tuple[Array, Array]) -> str | None:
    """Warn (one line, ``UserWarning``) when the clients' inputs and the test set's differ
    in kind: integer against floating dtype, or scales apart by more than 10x (e.g. raw
    0-255 pixels in the clients beside a test set in [0, 1], which trains silently to
    chance). Reads at most 4,096 rows of each; returns the warning's text, or ``None``."""
    x = getattr(clients, "x", None)
    if x is None or test is None:
        return None
    b = np.asarray(input_rows(test[0], 1))
    a = np.asarray(input_rows(x, 2 if x.ndim == b.ndim + 1 else 1))  # (clients, rows, ...)
    table = getattr(clients, "x_table", None)  # a store's uint8 codes and their values
    if table is not None:
        a = np.asarray(table)[a]
    if a.size == 0 or b.size == 0:
        return None
    kind_a, kind_b = np.issubdtype(a.dtype, np.floating), np.issubdtype(b.dtype, np.floating)
    scale_a = float(np.max(np.abs(a.astype(np.float64))))
    scale_b = float(np.max(np.abs(b.astype(np.float64))))
    apart = min(scale_a, scale_b) > 0 and max(scale_a, scale_b) / min(scale_a, scale_b) > 10
    if kind_a == kind_b and not apart:
        return None
    text = (
        f"client inputs ({a.dtype}, largest |x| {scale_a:.3g}) and test inputs ({b.dtype}, "
        f"largest |x| {scale_b:.3g}) differ in kind or scale: scale both the same way "
        "(e.g. pixels / 255 as float32) or the model trains on one and is scored on the other"
    )
    warnings.warn(text, UserWarning, stacklevel=4)  # past start and its wrapper
    return text


def slot_buffer(alg: Algorithm, num_clients: int) -> int:
    """The largest slot buffer of ``alg``'s round exchanges over ``num_clients`` clients:
    an exchange's ``max_selected``, or one slot per client."""
    sizes = [
        num_clients if ex.max_selected is None else min(ex.max_selected, num_clients)
        for ex in alg.exchanges
    ]
    return max(sizes, default=num_clients)


def _check_mesh(
    alg: Algorithm, data: PyTree, variants: Variants, mesh: Any, clients_per_device: Any
) -> Mesh | None:
    """The call's mesh (:func:`~swarmjax.fl.runtime.mesh.mesh_for`) once ``alg`` can run on
    it, else one ``ValueError`` line naming the option (before any work)."""
    runs = variants.size * len(variants.spec.seeds)
    chosen = mesh_for(mesh, clients_per_device, slot_buffer(alg, num_clients(data)), runs)
    if chosen is None:
        return None
    unsummed = [e for e, ex in enumerate(alg.exchanges) if ex.aggregate_sum is None]
    option = "mesh" if mesh is not None else "clients_per_device"
    if unsummed:
        raise ValueError(
            f"{option}: {algorithm_name(alg)}'s round exchange(s) {unsummed} aggregate stacked "
            "replies (no aggregate_sum); only summed exchanges split their cohort over "
            "devices: pass mesh=None and clients_per_device=None"
        )
    setup = [e for e, ex in enumerate(alg.setup) if ex.aggregate_sum is None]
    if setup and splits(chosen):
        raise ValueError(
            f"{option}: {algorithm_name(alg)}'s setup exchange(s) {setup} aggregate stacked "
            "replies, which need every client's state on one device, and a clients axis of "
            f"{chosen.shape[CLIENTS]} devices splits them: pass mesh=None and "
            "clients_per_device=None"
        )
    return chosen


def _expected_selected(
    alg: Algorithm, hyper, num_clients: int, runs: int, rounds: int
) -> np.ndarray:
    """``(runs, rounds, exchanges)``: the released number of clients of each exchange: NaN
    (use the realised count, public) unless the exchange keeps its selection secret."""
    out = np.full((runs, rounds, len(alg.exchanges)), np.nan)
    for e, ex in enumerate(alg.exchanges):
        if ex.expected_selected is not None:
            value = np.asarray(
                jax.vmap(lambda h, ex=ex: ex.expected_selected(h, num_clients))(hyper)
            )
            out[:, :, e] = value[:, None]
    return out
