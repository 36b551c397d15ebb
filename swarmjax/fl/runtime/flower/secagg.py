"""Real secure aggregation across SuperNodes: the distributed-DP exchange on Flower messages.

An algorithm under a :class:`~swarmjax.privacy.distributed.DistributedDP` plan
(:class:`~swarmjax.fl.distributed.Distributed`) has one summed exchange whose replies are
``(d,)`` uint32 residues modulo ``2^b``. The simulator masks them with seeds derived from
one round key (:mod:`swarmjax.privacy.secagg`); here the clients run the double-masking
protocol of Bonawitz et al. (CCS 2017, §4) with the real primitives of
:mod:`swarmjax.privacy.secagg_crypto`, in four stages, each one Flower message
(``train.secagg``, ``meta["stage"]``) to the clients still in the round:

1. ``advertise`` (AdvertiseKeys): each selected client makes a channel and a mask X25519
   key pair (OS entropy) and replies with the two public keys (2 x 32 bytes). ``U1``: the
   clients whose keys arrived.
2. ``share`` (ShareKeys): the server sends every client of ``U1`` all public keys of
   ``U1``; each draws its self-mask seed ``b_u`` (32 bytes of OS entropy), splits ``b_u``
   and its mask private key into ``t``-of-``|U1|`` Shamir shares (evaluation point of client
   ``v``: its position in ``U1`` sorted by id, plus 1) and replies with one bundle per other
   client, the two shares sealed under their agreed channel key
   (:func:`~swarmjax.privacy.secagg_crypto.seal_shares`, :data:`BUNDLE_BYTES` bytes each).
   ``U2``: the clients whose bundles arrived.
3. ``mask`` (MaskedInputCollection): the server sends every client of ``U2`` the Request,
   the ids of ``U2`` and the bundles addressed to it; the client computes its encoded
   update exactly as the simulator's client does (same function, same key
   ``client_key(run_key, round, exchange, id)``), adds ``PRG(b_u)`` and, for every
   neighbour ``v`` of the plan's masking graph over ``U2``
   (:func:`~swarmjax.privacy.secagg.neighbours`), ``+PRG(s_uv)`` if ``u < v`` else
   ``-PRG(s_uv)``, ``s_uv`` their agreed mask key and ``PRG``
   :func:`~swarmjax.privacy.secagg_crypto.mask_words`; it uploads the ``d`` words modulo
   ``2^b`` packed ``b`` bits a word, ``ceil(d b / 8)`` uint8
   (:func:`~swarmjax.privacy.bitpack.pack_words`). ``U3``: the valid uploads (exactly that
   many uint8, the padding bits after the last word zero:
   :func:`~swarmjax.privacy.bitpack.unpack_words`; anything else is left out and treated
   as a dropout).
4. ``unmask`` (Unmasking): the server sends every client of ``U3`` the lists ``U3`` and
   ``U2 \\ U3``; each opens its bundles and reveals, for each ``v`` of ``U3``, its share of
   ``b_v``, and for each ``v`` of ``U2 \\ U3``, its share of ``v``'s mask private key, never
   both for one ``v`` (a client answers one unmasking per round and refuses lists that
   overlap or are not ``U2``). With shares from at least ``t`` clients the server
   reconstructs the seeds, removes the survivors' self masks and the pairwise masks of
   the survivors with the dropped clients, and gets the sum of ``U3``'s residues modulo
   ``2^b``, which :meth:`~swarmjax.fl.distributed.Distributed.step` decodes (the
   simulator's decode) and steps on.

A round in which any of ``|U1|, |U2|, |U3|`` or the unmasking responders falls below ``t``
is refused: nothing is unmasked or released, the model is kept and the plan counts the
round as refused (the same state change as the simulator's refused round).

Client secrets (key pairs, ``b_u``, received bundles) live only in the memory of the
process that answers the node's messages (the node's worker), one round at a time
(:class:`_ClientRound`; replaced by the next round's AdvertiseKeys, dropped after
Unmasking); they are never logged, written or sent except as the protocol says, and never
enter Flower's ``context.state`` (so never the SuperNode's memory). A worker restarted
mid-round has lost them and answers the next stage with an error: the client drops out of
that round, which the protocol tolerates. A node without a worker (node configuration
``worker = false``: each message in a fresh ClientApp process) would lose them after every
stage, so every client would drop out of every round: the ServerApp refuses such a node in
one line when it says hello (:func:`check_worker`), before any round.

Fault injection (TESTS ONLY, never a default): the run configuration key
:data:`FAULT_KEY` ``"secagg-fault-injection"`` = ``"ID:FAULT[@ROUND][,...]"`` makes client
``ID`` misbehave in every round (or in round ``ROUND`` only), ``FAULT`` one of
:data:`FAULTS`: ``drop-before-upload`` (it answers the first two stages, then fails the
third), ``drop-after-upload`` (it uploads, then fails Unmasking), and three malformed
packed uploads, each caught by one check of the server: ``garbage-length`` (one byte too
many), ``garbage-range`` (the padding bits after the last word set: content beyond the
``d`` words, the only out-of-range upload that ``b``-bit packing can carry; it needs
``d b`` not a multiple of 8), ``garbage-dtype`` (the right bytes as int8). The key
does not enter the run's Task (the run is the same; only those clients misbehave) and the
ServerApp checks it before any work (:func:`check_faults`).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flwr.app import Array as FlowerArray
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from swarmjax.fl.protocol import Slots, aggregate_key
from swarmjax.fl.runtime.flower.records import RecordError, to_record
from swarmjax.privacy import secagg_crypto as crypto
from swarmjax.privacy.bitpack import pack_words, packed_size, unpack_words
from swarmjax.privacy.secagg import neighbours

__all__ = [
    "BUNDLE_BYTES",
    "FAULTS",
    "FAULT_KEY",
    "SHARE_BYTES",
    "InjectedFault",
    "answer_stage",
    "check_deployable",
    "check_faults",
    "check_worker",
    "parse_faults",
    "secure_exchange",
    "step_function",
    "uses_secagg",
]

log = logging.getLogger("swarmjax.fl.runtime.flower")

KIND = "train.secagg"
FAULT_KEY = "secagg-fault-injection"
FAULTS = (
    "drop-before-upload",  # answers AdvertiseKeys and ShareKeys, then never uploads
    "drop-after-upload",  # uploads its masked input, then never answers Unmasking
    "garbage-length",  # uploads one byte too many
    "garbage-range",  # uploads with the padding bits after its last word set (d b % 8 != 0)
    "garbage-dtype",  # uploads its packed bytes as int8
)
"""The test-only faults of :data:`FAULT_KEY` (see the module docs)."""
SHARE_BYTES = 66
"""Bytes of one Shamir share value of ``GF(2^521 - 1)`` on the wire (little endian)."""
BUNDLE_BYTES = 12 + 2 * (4 + SHARE_BYTES) + 16
"""Bytes of one sealed share bundle: nonce, two ``(x, y)`` shares, Poly1305 tag (168)."""


class InjectedFault(RuntimeError):
    """A failure made on purpose by :data:`FAULT_KEY` (tests only)."""


def uses_secagg(algorithm: Any) -> bool:
    """Whether ``algorithm``'s exchange runs under real secure aggregation on Flower."""
    from swarmjax.fl.distributed import Distributed

    return isinstance(algorithm, Distributed)


def parse_faults(run_config: Any, num_clients: int) -> dict[tuple[int, int | None], str]:
    """``{(client id, round or None): fault}`` from the run configuration's
    :data:`FAULT_KEY`: ``"ID:FAULT"`` (every round) or ``"ID:FAULT@ROUND"`` (that round
    only), comma separated; ``""`` or absent: none. One-line ``ValueError`` naming the key
    for anything else."""
    raw = str(run_config.get(FAULT_KEY, "") or "")
    out: dict[tuple[int, int | None], str] = {}
    for item in filter(None, (p.strip() for p in raw.split(","))):
        cid, _, rest = item.partition(":")
        fault, at, when = rest.partition("@")
        ok = cid.isdigit() and int(cid) < num_clients and fault in FAULTS
        if not ok or (at and not when.isdigit()):
            raise ValueError(
                f"{FAULT_KEY} must be 'ID:FAULT[@ROUND]' items, comma separated, with ID in "
                f"[0, {num_clients}) and FAULT one of {', '.join(FAULTS)}; got {raw!r}"
            )
        out[(int(cid), int(when) if at else None)] = fault
    return out


def _fault(run_config: Any, num_clients: int, pid: int, round_id: int) -> str | None:
    """The injected fault of client ``pid`` in round ``round_id`` (tests only), if any."""
    faults = parse_faults(run_config, num_clients)
    return faults.get((pid, round_id), faults.get((pid, None)))


# ------------------------------------------------------------------------ wire helpers


def _bytes_array(rows: list[bytes], width: int) -> FlowerArray:
    arr = np.frombuffer(b"".join(rows), np.uint8).reshape(len(rows), width)
    return FlowerArray.from_numpy_ndarray(arr)


def _ids_array(ids: list[int]) -> FlowerArray:
    return FlowerArray.from_numpy_ndarray(np.asarray(ids, np.int64).reshape(-1))


def _read(record: ArrayRecord, name: str, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    """Entry ``name`` of ``record`` as a numpy array of exactly ``dtype`` and ``shape``
    (``-1``: any length); :class:`RecordError` otherwise."""
    if not isinstance(record, ArrayRecord) or name not in record:
        raise RecordError(f"field {name!r} is missing")
    entry = record[name]
    want = np.dtype(dtype)
    got = tuple(entry.shape)
    fits = len(got) == len(shape) and all(s in (-1, g) for s, g in zip(shape, got, strict=True))
    if entry.dtype != str(want) or not fits:
        raise RecordError(
            f"field {name!r} has shape {got} and dtype {entry.dtype}; expected {shape} {want}"
        )
    try:
        arr = entry.numpy()
    except Exception as err:
        raise RecordError(f"field {name!r} does not decode: {err}") from err
    if arr.dtype != want or arr.shape != got:
        raise RecordError(f"field {name!r} decodes to {arr.shape} {arr.dtype}")
    return arr


def _meta(round_index: int, index: int, stage: str) -> ConfigRecord:
    return ConfigRecord({"round": round_index, "exchange": index, "setup": False, "stage": stage})


def _graph(ids: list[int], degree: int | None) -> dict[int, list[int]]:
    """The plan's masking graph over the clients ``ids`` (sorted): each one's neighbours."""
    adj = np.asarray(neighbours(np.asarray(ids, np.int32), np.ones(len(ids), bool), degree))
    return {u: [ids[j] for j in np.flatnonzero(adj[i])] for i, u in enumerate(ids)}


def _pair_mask(
    private: bytes, peer_public: bytes, round_id: int, me: int, peer: int, d: int, bits: int
) -> np.ndarray:
    """``(d,)`` uint32 ``PRG(s_uv)`` modulo ``2^bits`` of the agreed mask key of two clients."""
    key = crypto.agreed_key(private, peer_public, "mask", round_id, me, peer)
    return crypto.mask_words(key, d, bits)


# ------------------------------------------------------------------------ client side


@dataclass(repr=False)  # never printed: it holds the client's secrets
class _ClientRound:
    """One client's protocol state for one round (in memory only)."""

    round: int
    stage: str
    channel: tuple[bytes, bytes]  # (private, public)
    mask: tuple[bytes, bytes]
    seed: bytes = b""
    u1: list[int] = field(default_factory=list)
    mask_public: dict[int, bytes] = field(default_factory=dict)
    channel_public: dict[int, bytes] = field(default_factory=dict)
    own_shares: tuple[tuple[int, int], tuple[int, int]] | None = None
    bundles: dict[int, bytes] = field(default_factory=dict)
    u2: list[int] = field(default_factory=list)


_ROUNDS: dict[tuple[int, int], _ClientRound] = {}  # (id(task), client id) -> its round


def answer_stage(
    task: Any, pid: int, stored: ArrayRecord | None, content: RecordDict, run_config: Any
) -> tuple[RecordDict, ArrayRecord | None]:
    """Client ``pid``'s answer to one stage message (module docs): the reply content and,
    after the ``mask`` stage, the client's new state (else ``None``)."""
    meta = content["meta"]
    stage, round_id = str(meta["stage"]), int(meta["round"])
    fault = _fault(run_config, task.num_clients, pid, round_id)
    plan = task.algorithm.plan
    slot = (id(task), pid)
    if stage == "advertise":
        state = _ClientRound(round_id, "advertise", crypto.keypair(), crypto.keypair())
        _ROUNDS[slot] = state  # the previous round's secrets are dropped
        keys = {"channel": [state.channel[1]], "mask": [state.mask[1]]}
        return RecordDict(
            {"keys": ArrayRecord({k: _bytes_array(v, 32) for k, v in keys.items()})}
        ), None
    state = _ROUNDS.get(slot)
    if state is None or state.round != round_id:
        raise RuntimeError(f"no secure-aggregation state for round {round_id} (lost or stale)")
    if stage == "share":
        return _share(state, pid, content["keys"], plan.threshold), None
    if stage == "mask":
        if fault == "drop-before-upload":
            _ROUNDS.pop(slot, None)
            raise InjectedFault(f"{FAULT_KEY}: client {pid} drops before uploading")
        return _masked_input(task, state, pid, stored, content, fault)
    if stage == "unmask":
        _ROUNDS.pop(slot, None)  # one unmasking per round, whatever happens next
        if fault == "drop-after-upload":
            raise InjectedFault(f"{FAULT_KEY}: client {pid} drops after uploading")
        return _unmask(state, pid, content["lists"], plan.threshold), None
    raise ValueError(f"unknown secure-aggregation stage {stage!r}")


def _check_stage(state: _ClientRound, expected: str, now: str) -> None:
    if state.stage != expected:
        raise RuntimeError(f"stage {now!r} out of order (after {state.stage!r})")
    state.stage = now


def _share(state: _ClientRound, me: int, keys: ArrayRecord, t: int) -> RecordDict:
    _check_stage(state, "advertise", "share")
    ids = [int(i) for i in _read(keys, "ids", np.int64, (-1,))]
    m = len(ids)
    channel = _read(keys, "channel", np.uint8, (m, 32))
    mask = _read(keys, "mask", np.uint8, (m, 32))
    if ids != sorted(set(ids)) or me not in ids or m < t:
        raise ValueError(f"ShareKeys: the client list must be sorted, distinct, hold me and >= {t}")
    state.u1 = ids
    state.channel_public = {v: bytes(channel[i]) for i, v in enumerate(ids)}
    state.mask_public = {v: bytes(mask[i]) for i, v in enumerate(ids)}
    if state.channel_public[me] != state.channel[1] or state.mask_public[me] != state.mask[1]:
        raise ValueError("ShareKeys: the server relayed other public keys for this client")
    if len(set(state.channel_public.values()) | set(state.mask_public.values())) != 2 * m:
        raise ValueError("ShareKeys: public keys are not all distinct")
    state.seed = crypto.fresh_seed()
    seed_shares = crypto.share(state.seed, m, t)
    key_shares = crypto.share(state.mask[0], m, t)
    rows, to = [], []
    for i, v in enumerate(ids):
        pair = (seed_shares[i], key_shares[i])
        if v == me:
            state.own_shares = pair
            continue
        key = crypto.agreed_key(
            state.channel[0], state.channel_public[v], "channel", state.round, me, v
        )
        rows.append(crypto.seal_shares(key, state.round, me, v, list(pair)))
        to.append(v)
    return RecordDict(
        {"bundles": ArrayRecord({"to": _ids_array(to), "sealed": _bytes_array(rows, BUNDLE_BYTES)})}
    )


def _masked_input(
    task: Any,
    state: _ClientRound,
    me: int,
    stored: ArrayRecord | None,
    content: RecordDict,
    fault: str | None,
) -> tuple[RecordDict, ArrayRecord]:
    from swarmjax.fl.runtime.flower.client import compute_reply

    _check_stage(state, "share", "mask")
    plan = task.algorithm.plan
    peers = content["peers"]
    u2 = [int(i) for i in _read(peers, "ids", np.int64, (-1,))]
    others = [v for v in u2 if v != me]
    sealed = _read(peers, "sealed", np.uint8, (len(others), BUNDLE_BYTES))
    if (
        u2 != sorted(set(u2))
        or me not in u2
        or not set(u2) <= set(state.u1)
        or len(u2) < plan.threshold
    ):
        raise ValueError("MaskedInputCollection: U2 must be a sorted subset of U1 with me, >= t")
    state.u2 = u2
    state.bundles = {v: bytes(sealed[i]) for i, v in enumerate(others)}
    new_state, reply = compute_reply(task, me, stored, content)
    x = np.asarray(reply, np.uint32)
    d, bits = x.shape[0], plan.bits
    y = x + crypto.mask_words(state.seed, d, bits)
    for v in _graph(u2, plan.mask_degree)[me]:
        w = _pair_mask(state.mask[0], state.mask_public[v], state.round, me, v, d, bits)
        y = y + w if me < v else y - w
    y &= np.uint32((1 << bits) - 1) if bits < 32 else np.uint32(0xFFFFFFFF)
    packed = pack_words(y, bits)
    if fault == "garbage-length":
        packed = np.append(packed, np.uint8(0))
    elif fault == "garbage-range":  # check_faults: d b % 8 != 0, so padding bits exist
        packed[-1] |= np.uint8(0xFF << (d * bits % 8) & 0xFF)
    elif fault == "garbage-dtype":
        packed = packed.view(np.int8)
    upload = ArrayRecord({"packed": FlowerArray.from_numpy_ndarray(packed)})
    return RecordDict({"reply": upload}), to_record(new_state)


def _unmask(state: _ClientRound, me: int, lists: ArrayRecord, t: int) -> RecordDict:
    _check_stage(state, "mask", "unmask")
    survivors = [int(i) for i in _read(lists, "survivors", np.int64, (-1,))]
    dropped = [int(i) for i in _read(lists, "dropped", np.int64, (-1,))]
    if sorted(survivors + dropped) != state.u2 or me not in survivors or len(survivors) < t:
        # the two lists must split U2 exactly: never both shares of one client
        raise ValueError("Unmasking: survivors and dropped must split U2, hold me and >= t")
    x_me = state.u1.index(me) + 1
    opened = {me: state.own_shares}
    for v in survivors + dropped:
        if v == me:
            continue
        key = crypto.agreed_key(
            state.channel[0], state.channel_public[v], "channel", state.round, me, v
        )
        pair = crypto.open_shares(key, state.round, v, me, state.bundles[v])
        if len(pair) != 2 or pair[0][0] != x_me or pair[1][0] != x_me:
            raise ValueError(f"Unmasking: the bundle from client {v} is malformed")
        opened[v] = (pair[0], pair[1])
    seeds = [opened[v][0][1].to_bytes(SHARE_BYTES, "little") for v in survivors]
    keys = [opened[v][1][1].to_bytes(SHARE_BYTES, "little") for v in dropped]
    return RecordDict(
        {
            "shares": ArrayRecord(
                {
                    "seed-of": _ids_array(survivors),
                    "seed": _bytes_array(seeds, SHARE_BYTES),
                    "key-of": _ids_array(dropped),
                    "key": _bytes_array(keys, SHARE_BYTES),
                }
            )
        }
    )


# ------------------------------------------------------------------------ server side


def _wire(content: RecordDict) -> int:
    """Bytes Flower counts for a message's records (arrays with their headers, configs)."""
    return int(sum(r.count_bytes() for r in content.values()))


def _payload(record: Any) -> int:
    """Array bytes of a record (what the history counts; Flower adds headers and names)."""
    if isinstance(record, ArrayRecord):
        return int(sum(len(a.numpy().tobytes()) for a in record.values()))
    return 0


def _digest(total: np.ndarray) -> str:
    """SHA-256 of the ``(d,)`` uint32 summed residues (little endian): the operator's
    fingerprint of a round's secure sum, to compare a deployment with the simulator."""
    return hashlib.sha256(np.asarray(total, "<u4").tobytes()).hexdigest()


def secure_exchange(
    co: Any,
    server: Any,
    ex: Any,
    index: int,
    round_index: int,
    selected: np.ndarray,
    request: Any,
    reply_like: Any,
) -> tuple[Any, list[dict], dict[str, Any]]:
    """One round of the exchange ``ex`` under real secure aggregation over the nodes of the
    coordinator ``co`` (:mod:`swarmjax.fl.runtime.flower.server`): the four stages, then
    the algorithm's :meth:`~swarmjax.fl.distributed.Distributed.step`.

    Returns the new server state, one operator row per message (the stage as
    ``exchange/stage``, bytes, status) and the round's operator summary (``round``; the
    client ids, space separated, that were ``selected``, ``advertised`` keys (``U1``),
    ``shared`` (``U2``), ``uploaded`` a valid masked input (``U3``) and ``unmasked``;
    ``outcome``: ``released`` or ``refused: <why>``; ``sum_sha256``: :func:`_digest` of
    the unmasked sum, ``""`` when refused)."""
    task, alg = co.task, co.task.algorithm
    plan, n = alg.plan, task.num_clients
    t, bits = plan.threshold, plan.bits
    d = int(reply_like.shape[0])
    group = f"round-{round_index}-{ex.name}"
    rows: list[dict] = []
    nodes = {int(c): co.nodes.get(int(c)) for c in np.flatnonzero(selected)}
    summary: dict[str, Any] = {"round": round_index, "selected": _ids_text(nodes)}
    summary |= {k: "" for k in ("advertised", "shared", "uploaded", "unmasked", "sum_sha256")}

    def stage(name: str, contents: dict[int, RecordDict], accept: Any) -> dict[int, Any]:
        """Send ``contents[client]``; ``{client: accept(client, reply content)}`` of the
        valid replies (``accept`` raises ``RecordError``/``ValueError`` to reject)."""
        by_node = {}
        for c, content in contents.items():
            if nodes.get(c) is not None:
                content["meta"] = _meta(round_index, index, name)
                by_node[nodes[c]] = content
        replies = (
            co._send(by_node, KIND, f"{group}-{name}", co.settings.reply_timeout) if by_node else {}
        )
        out = {}
        for c, content in contents.items():
            node = nodes.get(c)
            row = {"round": round_index, "setup": False, "exchange": f"{ex.name}/{name}"}
            row |= {"client": c, "node": node, "bytes_down": 0, "wire_down": 0}
            row |= {"bytes_up": 0, "wire_up": 0}
            if node is None:
                row["status"] = "no node holds this partition"
            else:
                row["bytes_down"] = sum(_payload(r) for r in content.values())
                row["wire_down"] = _wire(content)
                reply = replies[node]
                row["status"], value = _accepted(reply, c, accept, row)
                if value is not None:
                    out[c] = value
            if row["status"] != "ok":
                log.warning("%s-%s: client %d left out: %s", group, name, c, row["status"])
            rows.append(row)
        return out

    def refuse(why: str) -> tuple[Any, list[dict], dict[str, Any]]:
        log.warning("%s: round refused, nothing released: %s", group, why)
        summary["outcome"] = f"refused: {why}"
        zeros = jnp.zeros((d,), jnp.uint32)
        none = Slots.everyone(jnp.zeros(n, bool))
        key = aggregate_key(task.run_key, round_index, index)
        new = step_function(alg)(server, none, zeros, jnp.asarray(False), key, task.hyper)
        return new, rows, summary

    # 1. AdvertiseKeys
    def got_keys(c: int, content: RecordDict) -> tuple[bytes, bytes]:
        keys = content["keys"]
        return bytes(_read(keys, "channel", np.uint8, (1, 32))[0]), bytes(
            _read(keys, "mask", np.uint8, (1, 32))[0]
        )

    keys = stage("advertise", {c: RecordDict() for c in nodes}, got_keys)
    u1 = sorted(keys)
    summary["advertised"] = _ids_text(u1)
    if len(u1) < t:
        return refuse(f"{len(u1)} clients advertised keys, fewer than min_survivors={t}")

    # 2. ShareKeys
    record = ArrayRecord(
        {
            "ids": _ids_array(u1),
            "channel": _bytes_array([keys[c][0] for c in u1], 32),
            "mask": _bytes_array([keys[c][1] for c in u1], 32),
        }
    )

    def got_bundles(c: int, content: RecordDict) -> dict[int, bytes]:
        b = content["bundles"]
        to = [int(v) for v in _read(b, "to", np.int64, (len(u1) - 1,))]
        if to != [v for v in u1 if v != c]:
            raise RecordError("bundles must be addressed to every other client of U1, in order")
        sealed = _read(b, "sealed", np.uint8, (len(u1) - 1, BUNDLE_BYTES))
        return {v: bytes(sealed[i]) for i, v in enumerate(to)}

    bundles = stage("share", {c: RecordDict({"keys": record}) for c in u1}, got_bundles)
    u2 = sorted(bundles)
    summary["shared"] = _ids_text(u2)
    if len(u2) < t:
        return refuse(f"{len(u2)} clients shared their keys, fewer than min_survivors={t}")

    # 3. MaskedInputCollection
    request_record = to_record(request)
    size = packed_size(d, bits)

    def got_masked(c: int, content: RecordDict) -> np.ndarray:
        # exactly ceil(d b / 8) uint8 (RecordError), then zero padding bits (ValueError)
        return unpack_words(_read(content["reply"], "packed", np.uint8, (size,)), d, bits)

    def peers(c: int) -> RecordDict:
        others = [v for v in u2 if v != c]
        arrays = {
            "ids": _ids_array(u2),
            "sealed": _bytes_array([bundles[v][c] for v in others], BUNDLE_BYTES),
        }
        return RecordDict({"request": request_record, "peers": ArrayRecord(arrays)})

    masked = stage("mask", {c: peers(c) for c in u2}, got_masked)
    u3 = sorted(masked)
    summary["uploaded"] = _ids_text(u3)
    dropped = [c for c in u2 if c not in masked]
    if len(u3) < t:
        return refuse(f"{len(u3)} valid masked inputs, fewer than min_survivors={t}")

    # 4. Unmasking
    lists = ArrayRecord({"survivors": _ids_array(u3), "dropped": _ids_array(dropped)})

    def got_shares(c: int, content: RecordDict) -> tuple[list[int], list[int]]:
        s = content["shares"]
        if [int(v) for v in _read(s, "seed-of", np.int64, (len(u3),))] != u3:
            raise RecordError("seed shares must be for the survivors, in order")
        if [int(v) for v in _read(s, "key-of", np.int64, (len(dropped),))] != dropped:
            raise RecordError("key shares must be for the dropped clients, in order")
        seed = _read(s, "seed", np.uint8, (len(u3), SHARE_BYTES))
        key = _read(s, "key", np.uint8, (len(dropped), SHARE_BYTES))
        as_int = lambda rows: [int.from_bytes(bytes(r), "little") for r in rows]
        return as_int(seed), as_int(key)

    shares = stage("unmask", {c: RecordDict({"lists": lists}) for c in u3}, got_shares)
    summary["unmasked"] = _ids_text(shares)
    if len(shares) < t:
        return refuse(f"{len(shares)} clients answered Unmasking, fewer than min_survivors={t}")
    holders = sorted(shares)[:t]  # t shares reconstruct; the first t by id
    xs = {c: u1.index(c) + 1 for c in holders}
    try:
        seeds = {
            v: crypto.reconstruct([(xs[c], shares[c][0][i]) for c in holders])
            for i, v in enumerate(u3)
        }
        secret_keys = {}
        for i, v in enumerate(dropped):
            sk = crypto.reconstruct([(xs[c], shares[c][1][i]) for c in holders])
            if crypto.public_key(sk) != keys[v][1]:
                raise ValueError(
                    f"the mask key reconstructed for client {v} does not match its public key"
                )
            secret_keys[v] = sk
    except ValueError as err:
        return refuse(f"reconstruction failed: {err}")
    total = np.zeros(d, np.uint32)
    for c in u3:
        total += masked[c] - crypto.mask_words(seeds[c], d, bits)
    graph = _graph(u2, plan.mask_degree)
    for v in dropped:
        for u in graph[v]:
            if u in masked:  # u added +PRG(s_uv) if u < v, else -PRG(s_uv): take it back
                w = _pair_mask(secret_keys[v], keys[u][1], round_index, v, u, d, bits)
                total = total - w if u < v else total + w
    total &= np.uint32((1 << bits) - 1) if bits < 32 else np.uint32(0xFFFFFFFF)
    survived = np.zeros(n, bool)
    survived[u3] = True
    key = aggregate_key(task.run_key, round_index, index)
    kept = Slots.everyone(jnp.asarray(survived))
    new = step_function(alg)(server, kept, jnp.asarray(total), jnp.asarray(True), key, task.hyper)
    summary |= {"outcome": "released", "sum_sha256": _digest(total)}
    return new, rows, summary


def _ids_text(ids: Any) -> str:
    return " ".join(str(c) for c in sorted(ids))


def _accepted(reply: Message | str, c: int, accept: Any, row: dict) -> tuple[str, Any]:
    if isinstance(reply, str):
        return reply, None
    if reply.has_error():
        return f"error reply: {reply.error.reason}", None
    try:
        content = reply.content
        row["wire_up"] = _wire(content)
        row["bytes_up"] = sum(_payload(r) for r in content.values())
        return "ok", accept(c, content)
    except (RecordError, KeyError, TypeError, ValueError) as err:
        return f"rejected: {err}", None


_STEPS: dict[Any, Any] = {}


def step_function(alg: Any) -> Any:
    """``alg.step`` (:meth:`~swarmjax.fl.distributed.Distributed.step`) jitted once per
    algorithm and process."""
    if alg not in _STEPS:
        _STEPS[alg] = jax.jit(alg.step)
    return _STEPS[alg]


def check_faults(run_config: Any, task: Any) -> None:
    """:func:`parse_faults` of ``task``'s run, and a one-line ``ValueError`` when it asks
    for ``garbage-range`` where the packed upload has no padding bits to set (``d b`` a
    multiple of 8: every packed upload of the right length and dtype is then ``d`` valid
    words)."""
    faults = parse_faults(run_config, task.num_clients)
    if "garbage-range" in faults.values() and uses_secagg(task.algorithm):
        d, bits = task.algorithm.dimension(task.hyper.inner), task.algorithm.plan.bits
        if d * bits % 8 == 0:
            raise ValueError(
                f"{FAULT_KEY}: garbage-range sets the packed upload's padding bits, and "
                f"d * bits = {d} * {bits} is a multiple of 8 (no padding): use other bits"
            )


def check_worker(alg: Any, hello: Any, node: int) -> None:
    """One-line ``ValueError`` when a node whose ``hello`` reply says it answers without
    its worker (node configuration ``worker = false``) joins a secure-aggregation run:
    each stage would run in a fresh ClientApp process that has lost the client's secrets
    of the stages before it, so the client would drop out of every round. The ServerApp
    calls it on every hello: before round 1, and for a node that joins later (which then
    stops the run in the same line: the deployment is misconfigured)."""
    if uses_secagg(alg) and not hello.get("worker", True):
        raise ValueError(
            f"node {node} has worker = false in its node configuration; secure aggregation "
            "keeps each client's round secrets in its node's worker between stages, so every "
            "node needs worker = true (the default)"
        )


def check_deployable(alg: Any) -> None:
    """One-line ``ValueError`` before any work for a distributed plan a deployment cannot
    run: ``dropout`` is the simulator's model of dropouts (a deployment's are real)."""
    if uses_secagg(alg) and alg.plan.dropout > 0:
        raise ValueError(
            "dropout must be 0 on Flower (it simulates dropouts; a deployment's clients drop "
            f"for real); got dropout={alg.plan.dropout}"
        )
