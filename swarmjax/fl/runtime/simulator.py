"""The simulator: runs any :class:`~swarmjax.fl.protocol.Algorithm` in one process.

Clients are stacked (:class:`~swarmjax.fl.data.clients.ClientData` with a client axis) and every
exchange maps the ONE-client function over them (``vmap``, or ``lax.map`` with
``client_map="sequential"``); rounds are a ``lax.scan``; runs (seeds, target epsilons,
numeric hyper-parameters: a leading axis on the keys and the hyper pytree) are a ``vmap``,
sharded over the devices when there are several. One compilation per (algorithm, shapes,
rounds per call); ``rounds_per_call`` splits a run into calls with the same result.

Only selected clients' replies reach ``aggregate`` (the mask) and only selected clients'
states change; an exchange with ``max_selected`` runs just that many client calls (the
selected ids gathered into a buffer). Bytes are counted from the message dtypes and the
number of clients a deployment would message.
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array, Int, PRNGKeyArray, PyTree
from tqdm.auto import tqdm

from swarmjax._validation import check_choice, check_int
from swarmjax.device import default_client_map
from swarmjax.fl.data.clients import ClientData, as_test_set
from swarmjax.fl.protocol import (
    Algorithm,
    Exchange,
    Slots,
    Variants,
    aggregate_key,
    client_init_key,
    client_key,
    run_keys,
    server_init_key,
    server_key,
    variant_identities,
    where_selected,
)
from swarmjax.fl.runtime.checkpoint import Checkpoints, fingerprint
from swarmjax.fl.runtime.result import Result, privacy_record
from swarmjax.models import param_bytes
from swarmjax.privacy.ledger import Ledger

__all__ = [
    "CHECKPOINT_NOT_RELEASED",
    "ClientMap",
    "init_runs",
    "num_clients",
    "run_exchange",
    "run_rounds",
    "simulate",
]

ClientMap = Literal["vmap", "sequential"] | int  # an int: clients per vmapped block

CHECKPOINT_NOT_RELEASED = (
    "checkpoints: the run's carry (client states, per-client spend) and per-round outputs with "
    "the realised cohorts, statistics of private data covered by no epsilon"
)


def num_clients(clients: PyTree) -> int:
    """Client slots of the client data: its ``num_clients`` (``ClientData``, a flat
    ``ClientStore``), else the leading axis of its leaves."""
    n = getattr(clients, "num_clients", None)
    return n if isinstance(n, int) else int(jax.tree.leaves(clients)[0].shape[0])


def _gathers(clients: PyTree) -> bool:
    """Whether the client data gathers clients (a flat store) rather than being stacked."""
    return callable(getattr(clients, "take", None))


def _one_client(clients: PyTree, i: Int[Array, ""] | int) -> PyTree:
    if _gathers(clients):
        return jax.tree.map(lambda a: a[0], clients.take(jnp.asarray(i, jnp.int32)[None]))
    return jax.tree.map(lambda a: a[i], clients)


def take_clients(clients: PyTree, ids: Int[Array, " S"]) -> PyTree:
    """The stacked data of clients ``ids``: ``clients.take(ids)`` where the client data
    gathers (a flat client store), else row ``ids`` of every leaf."""
    take = getattr(clients, "take", None)
    return take(ids) if callable(take) else jax.tree.map(lambda a: a[ids], clients)


def _map_clients(fn: Any, args: tuple, client_map: ClientMap, used: Array | None = None) -> Any:
    """``fn`` over the leading (client) axis of ``args`` as ``client_map`` says.

    ``used`` (``(S,)`` bool): slots whose reply counts. Where clients run one at a time or
    in blocks, a block with no used slot is skipped (``lax.cond``) and returns zeros: a
    Poisson cohort's unused capacity, or unselected clients, cost nothing. (Under a batched
    predicate, e.g. several runs vmapped, the cond computes both branches: same numbers.)
    """
    if client_map == "vmap":
        return jax.vmap(fn)(*args)
    k = 1 if client_map == "sequential" else int(client_map)
    if used is None:
        return jax.lax.map(lambda a: fn(*a), args, batch_size=None if k == 1 else k)
    one = (lambda a: fn(*a)) if k == 1 else (lambda a: jax.vmap(fn)(*a))

    def block(a_u: tuple) -> Any:
        a, u = a_u
        like = jax.eval_shape(one, a)
        skip = partial(jax.tree.map, lambda s: jnp.zeros(s.shape, s.dtype), like)
        return jax.lax.cond(jnp.any(u), one, lambda _: skip(), a)

    n = int(used.shape[0])
    if k == 1:
        return jax.lax.map(block, (args, used))
    full = n // k * k
    blocks = jax.tree.map(lambda a: a[:full].reshape(n // k, k, *a.shape[1:]), (args, used))
    out = jax.tree.map(lambda a: a.reshape(full, *a.shape[2:]), jax.lax.map(block, blocks))
    if full == n:
        return out
    tail = block(jax.tree.map(lambda a: a[full:], (args, used)))
    return jax.tree.map(lambda a, b: jnp.concatenate([a, b]), out, tail)


def run_exchange(
    ex: Exchange,
    index: int,
    round_index: Int[Array, ""],
    run_key: PRNGKeyArray,
    server: PyTree,
    states: PyTree,
    clients: PyTree,
    hyper: PyTree,
    client_map: ClientMap = "vmap",
) -> tuple[PyTree, PyTree, Int[Array, ""]]:
    """One exchange for one run: ``(server, client states, number of clients selected)``."""
    n = num_clients(clients)
    ids = jnp.arange(n)
    mask = ex.select(server, server_key(run_key, round_index, index), n)
    request = ex.request(server)

    kept: list[bool] = []  # set while tracing: did the client return its state untouched?

    def one(state: PyTree, data: PyTree, cid: Int[Array, ""]) -> tuple[PyTree, PyTree]:
        key = client_key(run_key, round_index, index, cid)
        new, reply = ex.client(state, data, request, key, hyper)
        pairs = zip(jax.tree.leaves(new), jax.tree.leaves(state), strict=True)
        kept.append(all(a is b for a, b in pairs))
        return new, reply

    if ex.max_selected is None or ex.max_selected >= n:
        every = take_clients(clients, ids) if _gathers(clients) else clients
        new, replies = _map_clients(one, (states, every, ids), client_map, mask)
        states = states if all(kept) else where_selected(mask, new, states)
        slots = Slots.everyone(mask)
    else:  # only the cohort's slots: a round costs the cohort, not the federation
        chosen = jnp.nonzero(mask, size=ex.max_selected, fill_value=n)[0].astype(jnp.int32)
        safe = jnp.minimum(chosen, n - 1)
        take = partial(jax.tree.map, lambda a: a[safe])
        new, replies = _map_clients(
            one, (take(states), take_clients(clients, safe), safe), client_map, chosen < n
        )
        slots = Slots(mask=chosen < n, ids=chosen, num_clients=n)
        if not all(kept):
            states = slots.update(states, new)
    server = ex.aggregate(server, replies, slots, aggregate_key(run_key, round_index, index), hyper)
    return server, states, jnp.sum(mask).astype(jnp.int32)


def _exchanges(alg, exchanges, round_index, run_key, server, states, clients, hyper, cmap):
    counts = []
    for e, ex in enumerate(exchanges):
        server, states, c = run_exchange(
            ex, e, round_index, run_key, server, states, clients, hyper, cmap
        )
        counts.append(c)
    return server, states, jnp.stack(counts) if counts else jnp.zeros((0,), jnp.int32)


def _init_one(alg: Algorithm, run_key, hyper, clients: PyTree, cmap: ClientMap):
    server = alg.server_init(server_init_key(run_key), hyper)
    ids = jnp.arange(num_clients(clients))

    def one(data: PyTree, cid: Int[Array, ""]) -> PyTree:
        return alg.client_init(client_init_key(run_key, cid), data, hyper, cid)

    if _gathers(clients):  # one client's rows at a time: never the whole federation padded
        batch = min(int(ids.shape[0]), 256)
        states = jax.lax.map(lambda i: one(_one_client(clients, i), i), ids, batch_size=batch)
    else:
        states = _map_clients(one, (clients, ids), cmap)
    zero = jnp.zeros((), jnp.int32)
    server, states, _ = _exchanges(
        alg, alg.setup, zero, run_key, server, states, clients, hyper, cmap
    )
    return server, states, zero


def _rounds_one(alg: Algorithm, carry, run_key, hyper, clients, test, rounds, cmap, diagnostics):
    def body(c, _):
        server, states, t = c
        r = t + 1
        server, states, counts = _exchanges(
            alg, alg.exchanges, r, run_key, server, states, clients, hyper, cmap
        )
        out = {
            "metrics": alg.evaluate(server, test),
            "spend": jax.vmap(lambda s: alg.spend(server, s))(states),
            "selected": counts,
        }
        if diagnostics:
            out["diagnostics"] = jax.vmap(alg.private_diagnostics)(states)
        return (server, states, r), out

    return jax.lax.scan(body, carry, None, length=rounds)


@partial(jax.jit, static_argnames=("alg", "cmap"))
def init_runs(alg, keys, hypers, clients, cmap):
    """Jitted: init + setup of every run; ``(server, client states, rounds done)`` with a run
    axis (``keys (runs,)``, ``hypers`` with a run axis; ``cmap``: the client map)."""
    return jax.vmap(lambda k, h: _init_one(alg, k, h, clients, cmap))(keys, hypers)


@partial(jax.jit, static_argnames=("alg", "rounds", "cmap", "diagnostics"))
def run_rounds(alg, carry, keys, hypers, clients, test, rounds, cmap, diagnostics):
    """Jitted: ``rounds`` more rounds of every run from ``carry`` (:func:`init_runs`'s
    output); returns ``(carry, per-round outputs)`` (metrics, spend, selected counts)."""

    def one(c, k, h):
        return _rounds_one(alg, c, k, h, clients, test, rounds, cmap, diagnostics)

    if keys.shape[0] == 1:  # one run: unbatched, so a cond can skip unused client blocks
        single = jax.tree.map(lambda a: a[0], (carry, keys, hypers))
        return jax.tree.map(lambda a: a[None], one(*single))
    return jax.vmap(one)(carry, keys, hypers)


def _message_bytes(alg: Algorithm, carry, keys, hypers, clients: PyTree) -> list[tuple[int, int]]:
    """``(request bytes, reply bytes)`` of each round exchange, from the message dtypes."""
    first = jax.tree.map(lambda a: a[0], (carry[0], carry[1], keys, hypers))
    server, states, key, hyper = first
    one_state = jax.tree.map(lambda a: a[0], states)
    one_data = _one_client(clients, 0)
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
        out.append((param_bytes(req), param_bytes(reply)))
    return out


def _sharded(tree: PyTree) -> PyTree:
    devices = jax.devices()
    runs = jax.tree.leaves(tree)[0].shape[0]
    if len(devices) < 2 or runs % len(devices):
        return tree
    sharding = NamedSharding(Mesh(np.asarray(devices), ("runs",)), PartitionSpec("runs"))
    return jax.device_put(tree, sharding)


def simulate(
    alg: Algorithm,
    clients: PyTree,
    test: tuple[Array, Array],
    variants: Variants,
    *,
    common_random_numbers: bool = False,
    client_map: ClientMap | None = "vmap",
    rounds_per_call: int | None = None,
    progress: bool = False,
    diagnostics: bool = False,
    checkpoint_dir: str | os.PathLike | None = None,
    ledger: Ledger | None = None,
    release_path: str | os.PathLike | None = None,
) -> Result:
    """Run ``alg`` for every (variant, seed) at once and return the one :class:`Result`.

    Args:
        alg: the algorithm (hashable; a static jit argument).
        clients: stacked client data (usually :class:`~swarmjax.fl.data.clients.ClientData`
            with a leading client axis); every client holds its slice of
            ``alg.client_data(clients)``. Checked with ``alg.check`` before any work.
        test: public ``(x, y)`` test set for ``alg.evaluate``.
        variants: the hyper pytree with a variant axis, its labels and the call's
            :class:`~swarmjax.fl.protocol.RunSpec` (rounds, delta, seeds); runs are
            (variant, seed) pairs, variant-major.
        common_random_numbers: give every variant the same keys (see
            :func:`~swarmjax.fl.protocol.run_keys`).
        client_map: how clients share a vectorised block: ``"vmap"`` (all of them),
            ``"sequential"`` (one at a time, ``lax.map``: each client runs its own trip
            counts) or an int ``k`` (blocks of ``k`` clients); the same result up to float
            rounding. ``None``: :func:`swarmjax.device.default_client_map` (one at a time
            on a CPU, vmap on an accelerator: right for convolutional clients; small dense
            models are faster vmapped on a CPU too, hence the explicit default). On the
            2-core CPU a CNN cohort ran best in blocks of 2 (docs/cross_device.md).
        rounds_per_call: scan this many rounds per compiled call (same result).
        progress: show a progress bar.
        diagnostics: also collect ``alg.private_diagnostics`` and the realised selections
            (statistics of private data, NOT covered by epsilon) into
            ``Result.private_diagnostics``.
        checkpoint_dir: save the run after every compiled call (``rounds_per_call``
            rounds) into this folder with orbax and resume from its last checkpoint: a
            killed run ends with the numbers of an uninterrupted one
            (:mod:`~swarmjax.fl.runtime.checkpoint`).
        ledger: the experiment's :class:`~swarmjax.privacy.ledger.Ledger`: every run of
            this call is added to it as a release (written at ``release_path``), and
            ``checkpoint_dir`` is listed as not released.
        release_path: where the caller writes this call's released outputs (for the
            ledger; default ``"(not written)"``).
    """
    spec = variants.spec
    test = as_test_set(test)
    alg.check(clients, test)
    data = alg.client_data(clients)
    if client_map is None:
        client_map = default_client_map()
    if isinstance(client_map, bool) or not isinstance(client_map, int):
        check_choice("client_map", client_map, ("vmap", "sequential"))
    elif client_map < 1:
        raise ValueError(
            f"client_map must be 'vmap', 'sequential' or an int >= 1; got {client_map}"
        )
    n_var = variants.size
    for name, values in variants.labels.items():
        if len(values) != n_var:
            raise ValueError(
                f"variants.labels[{name!r}] must have {n_var} values; got {len(values)}"
            )
    rounds, seed_list = spec.rounds, list(spec.seeds)
    keys = run_keys(seed_list, variant_identities(alg, variants), common_random_numbers)
    hyper = jax.tree.map(
        lambda a: jnp.repeat(jnp.asarray(a), len(seed_list), axis=0), variants.hyper
    )
    labels = {k: np.repeat(np.asarray(v), len(seed_list)) for k, v in variants.labels.items()}
    labels["seed"] = np.tile(np.asarray(seed_list), n_var)
    runs = n_var * len(seed_list)
    per_call = (
        rounds if rounds_per_call is None else check_int("rounds_per_call", rounds_per_call, 1)
    )
    keys, hyper = _sharded((keys, hyper))
    carry = init_runs(alg, keys, hyper, data, client_map)
    sizes = _message_bytes(alg, carry, keys, hyper, data)
    parts, done = [], 0
    saved = (
        None
        if checkpoint_dir is None
        else Checkpoints(
            checkpoint_dir,
            fingerprint(alg, variants, data, keys),
            {
                "common_random_numbers": bool(common_random_numbers),
                "diagnostics": bool(diagnostics),
            },
        )
    )
    if saved is not None and saved.latest() is not None:
        done = saved.latest()
        like = jax.eval_shape(
            lambda c: run_rounds(alg, c, keys, hyper, data, test, 1, client_map, diagnostics)[1],
            carry,
        )
        carry, first = saved.restore(done, carry, like)
        parts.append(first)
    with tqdm(
        total=rounds, initial=done, disable=not progress, unit="round", desc=type(alg).__name__
    ) as bar:
        while done < rounds:
            n = min(per_call, rounds - done)
            carry, out = run_rounds(alg, carry, keys, hyper, data, test, n, client_map, diagnostics)
            parts.append(jax.device_get(out))
            done += n
            bar.update(n)
            if saved is not None:
                parts = [jax.tree.map(lambda *xs: np.concatenate(xs, axis=1), *parts)]
                saved.save(done, carry, parts[0])
    if saved is not None:
        saved.close()
    out = jax.tree.map(lambda *xs: np.concatenate(xs, axis=1), *parts)
    n_clients = num_clients(data)
    expected = _expected_selected(alg, hyper, n_clients, runs, rounds)
    selected = np.where(np.isnan(expected), out["selected"], expected)
    history = _history(labels, out["metrics"], selected, sizes, runs, rounds)
    stacked = isinstance(clients, ClientData)
    sizes_known = stacked or _gathers(clients)
    record = privacy_record(
        out["spend"],
        alg.setup + alg.exchanges,
        unit=alg.privacy_unit,
        delta=spec.delta,
        accountant=spec.accountant,
        shares_randomness=common_random_numbers and n_var > 1,
        floating_point=alg.floating_point(),
        overflow_prob=alg.sampling_overflow(
            out["spend"],
            n_clients,
            sizes=np.asarray(clients.sizes) if sizes_known else None,
            padded=(clients.max_size if stacked else clients.max_rows) if sizes_known else None,
        ),
    )
    history["epsilon_max"] = record.epsilon.max(axis=2).reshape(-1)
    diag = {}
    if diagnostics:
        diag = dict(out["diagnostics"])
        diag["selected"] = out["selected"]
    result = Result(
        server=carry[0],
        clients=carry[1],
        history=history,
        metrics={k: np.asarray(v) for k, v in out["metrics"].items()},
        privacy=record,
        runs=pd.DataFrame(dict(labels)),
        private_diagnostics=diag,
    )
    if ledger is not None:
        where = "(not written)" if release_path is None else str(release_path)
        ledger.add_result(result, algorithm=type(alg).__name__, path=where)
        if checkpoint_dir is not None:
            ledger.mark_not_released(checkpoint_dir, CHECKPOINT_NOT_RELEASED)
    return result


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


def _history(labels, metrics, selected, sizes, runs: int, rounds: int) -> pd.DataFrame:
    frame: dict[str, Any] = {name: np.repeat(np.asarray(v), rounds) for name, v in labels.items()}
    frame["round"] = np.tile(np.arange(1, rounds + 1), runs)
    for name, value in metrics.items():
        value = np.asarray(value)
        if value.ndim == 2:
            frame[name] = value.reshape(-1)
    down = np.asarray([s[0] for s in sizes], np.float64)
    up = np.asarray([s[1] for s in sizes], np.float64)
    bytes_down = np.asarray(selected, np.float64) @ down if len(sizes) else np.zeros((runs, rounds))
    bytes_up = np.asarray(selected, np.float64) @ up if len(sizes) else np.zeros((runs, rounds))
    exact = not np.any(np.mod(bytes_up, 1)) and not np.any(np.mod(bytes_down, 1))
    cast = (lambda a: a.astype(np.int64)) if exact else (lambda a: a)
    frame["bytes_up"] = cast(bytes_up).reshape(-1)
    frame["bytes_down"] = cast(bytes_down).reshape(-1)
    frame["cum_bytes_up"] = cast(np.cumsum(bytes_up, axis=1)).reshape(-1)
    frame["cum_bytes_down"] = cast(np.cumsum(bytes_down, axis=1)).reshape(-1)
    return pd.DataFrame(frame)
