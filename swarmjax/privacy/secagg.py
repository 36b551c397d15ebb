"""Secure aggregation by pairwise masking, simulated for a whole cohort as one vectorised step.

The protocol is Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine
Learning" (CCS 2017, §4: the double-masking protocol, rounds 0-4), with the sparse masking
graph of Bell et al., "Secure Single-Server Aggregation with (Poly)Logarithmic Overhead"
(CCS 2020, SecAgg+). Every value is a ``uint32`` word holding a residue modulo ``2^b``
(``1 <= b <= 32``): arithmetic wraps modulo ``2^32`` and is then reduced with the mask
``2^b - 1``, which is exact because ``2^b`` divides ``2^32``.

**What a client ``i`` of the selected set ``U1`` sends** (:func:`masked_uploads`)::

    y_i = x_i + PRG(b_i) + sum_{j in N(i), id_j > id_i} PRG(s_ij)
                         - sum_{j in N(i), id_j < id_i} PRG(s_ij)        (mod 2^b)

``PRG(k)`` is the ChaCha20 keystream of the 256-bit key ``k`` (the words of
``jax.random.bits(k, (w,), uint32)`` under :mod:`swarmjax.privacy.chacha20`) read as one
bit stream, lowest bit first, coordinate ``i``'s mask its bits ``b i .. b (i + 1) - 1``
(:func:`fields`, :func:`split_fields`: ``w`` words hold ``f`` masks exactly, ``32 w = f
b``; 2 masks a word at 16 bits, 8 masks in 5 words at 20, so ``5 d / 8`` words), in the
simulator and in :func:`~swarmjax.privacy.secagg_crypto.mask_words` of a deployment alike
(docs/secure_aggregation.md says when the layout changed and which masks it changed).
``b_i`` is the client's self-mask seed and ``s_ij = s_ji`` the secret it
agreed with its neighbour ``j``. A deployment draws ``b_i`` from its own entropy and
agrees ``s_ij`` by X25519 + HKDF (:mod:`swarmjax.privacy.secagg_crypto`); **in this
simulation every seed is a function of the round's secret key** ``rnd.key``::

    s_ij = fold_in(fold_in(key, min(id_i, id_j)), max(id_i, id_j))
    b_i  = fold_in(fold_in(key, SELF_TAG), id_i)         SELF_TAG = 0xB5E1F5EE >= 2^31

(ids are non-negative ``int32``, below ``2^31``, so a pair seed's first input never equals
``SELF_TAG``). ``fold_in`` is ChaCha20 keyed by ``key`` (a pseudorandom function), so the
seeds are independent 256-bit keys to anyone without ``key``. A masked upload's words
agree bit for bit with :func:`swarmjax.privacy.secagg_crypto.mask_words` of the seeds'
bytes, so a deployment and the simulator can be checked against each other.

**What the server computes** (:func:`unmask_sum`), from the uploads of the survivors ``U2``
(the selected clients whose upload arrived) and nothing else::

    sum_{i in U2} y_i - sum_{i in U2} PRG(b_i)
        - sum_{j in U1 \\ U2} sum_{i in N(j) & U2} sign(i, j) PRG(s_ij)   (mod 2^b)

which is ``sum_{i in U2} x_i`` because the masks of pairs of survivors cancel. In a
deployment the server obtains the survivors' ``b_i`` and the dropped clients' mask private
keys (hence their ``s_ij``) by Shamir reconstruction from the survivors' shares
(:func:`swarmjax.privacy.secagg_crypto.reconstruct`), which needs ``t`` shares; here the
same seeds are recomputed from ``rnd.key`` by the same functions, which is what the
reconstruction would return. A round with fewer than ``t`` survivors releases nothing:
``ok`` is False and the sum is zeros. The simulator runs both sides at once
(:func:`secure_sum`): every masked upload is made tile by tile as above and the survivors'
tiles are added as they are made, so the ``(S, d)`` array of masked uploads is never held;
of the dropped clients' pair masks only those of real dropouts with surviving partners
are drawn (a round's ``S - t`` possible dropouts bound the work, its actual ones set it).

**Masking graph.** ``degree=None``: every pair of selected clients (Bonawitz). ``degree =
k`` (even): the Harary graph ``H(k, n)`` (Harary, "The maximum connectivity of a graph",
PNAS 48, 1962), i.e. the circulant graph in which each of the ``n`` selected clients, placed
on a ring in increasing order of id (public), is joined to the ``k/2`` nearest on each side;
``k >= n - 1`` is the complete graph. The graph depends only on the public ids and the
public selection, never on the dropouts or the secret key. ``H(k, n)`` is ``k``-connected:
removing fewer than ``k`` clients leaves it connected (Harary 1962; checked exhaustively
for rings of up to 10 clients in ``tests/test_secagg.py``).

**What the server learns, and why the degree has a floor.** Replace every PRG output of a
seed the adversary does not hold by a uniform vector (ChaCha20's PRF security). In a
released round the adversary (the server and up to ``c`` colluding clients) holds the seeds
of every edge that touches a dropped or colluding client and the survivors' self seeds; the
masks of the edges between honest survivors stay uniform. If the honest survivors induce a
connected graph, their uploads are uniform given their sum (a spanning tree's edge masks map
onto the zero-sum vectors of ``Z_{2^b}^n``), so the server learns only the sum of the honest
survivors' values, as in Bonawitz et al.'s honest-but-curious analysis (their §6). If that graph
is disconnected, each component's sum is exposed, which would break the distributed-DP
plan's count of honest noise shares. A released round has at most ``n - t <= S - t``
dropouts and at most ``c`` colluders, so ``k > S - t + c`` keeps the honest survivors of any
released round connected with certainty (``k``-connectivity), the same guarantee as the
complete graph at a fraction of its cost. Smaller ``k`` (Bell et al.'s ``O(log n)``) give
connectivity only with high probability over a random graph and dropouts independent of
it; that probability is not accounted anywhere in swarmjax, so it is refused
(:func:`min_degree` is the floor; :func:`masked_uploads` checks it).

**Threshold.** :func:`check_threshold` requires ``1 <= t <= S`` and ``2 t > S + c``.
Bonawitz et al.'s Round 4 has each honest client reveal, for every other client ``u``, the
share of either ``u``'s self seed or of ``u``'s mask private key, never both. A server that
lies about who dropped needs ``t`` shares of each; the two sets of ``t`` responders overlap
in at least ``2 t - S`` clients, who must all be corrupt, so ``2 t - S > c`` makes learning
both impossible (the counting behind the thresholds of their active-adversary analysis in
§6, stated there for ``c < n/3`` and ``t >= floor(2n/3) + 1``). In the honest-but-curious model
``t > c`` would suffice.

**Not modelled** (the simulation computes what honest clients and an honest-but-curious
server would compute): a malicious server (inconsistent views, forged dropout lists; a
deployment needs Bonawitz's consistency check with signatures and a PKI that authenticates
the clients' public keys, else the server can impersonate clients in the key agreement);
malicious clients (they may send any residues: secure aggregation does not validate
inputs); late uploads of clients counted as dropped (the self mask keeps them hidden in a
deployment); dropouts during unmasking (here every survivor answers); the Shamir sharing
itself (every client shares with all ``n`` selected clients, Bonawitz-style; Bell et al.'s
sharing with neighbours only, with its own per-neighbourhood threshold, is not modelled).

**Cost.** ``masked_uploads`` draws ``S (1 + L)`` keystreams of ``ceil(d / f)`` words
(the table below predates the packing: ``d`` words), ``L`` the
number of offsets of each pair's lower end (``floor(S/2)`` for the complete graph, ``k/2``
on the ring), each pair's mask once, added to one end and subtracted from the other;
``unmask_sum`` draws ``S + (S - t) L'`` (``L' = S - 1`` complete, ``k`` ring). Memory is
``O(S d)``: a loop over tiles of the vector (about ``2^16`` words across the rows, so
ChaCha20's state stays in cache: 3x the throughput of one long draw), inside it a
``lax.scan`` over offsets, vmapped over the slots; never an ``(S, S, d)`` array.
Measured on the project's 2-core Xeon CPU (2.8 GHz, JAX 0.10, XLA defaults; the machine
was shared, load average 5-6, so the numbers are upper bounds, best of 3-5 runs, one run at
``S = 100, d = 2^20``), seconds per round for ``masked_uploads + unmask_sum`` after
compilation, ``t = ceil(0.8 S)``, no colluders, 10 % dropouts:

    ===== ======== ========== ======================== ========================
      S      d      complete   k = min_degree(S, t)     k = 2 ceil(log2 S) (*)
    ===== ======== ========== ======================== ========================
      16   2^17       0.41       0.13   (k = 4)           0.24   (k = 8)
      16   2^20       4.2        1.3    (k = 4)           2.1    (k = 8)
      50   2^17       2.9        0.81   (k = 12)          0.81   (k = 12)
      50   2^20      26         10.7    (k = 12)         10.7    (k = 12)
     100   2^17      14.5        4.0    (k = 22)          2.6    (k = 14)
     100   2^20     121         30      (k = 22)         21      (k = 14)
    ===== ======== ========== ======================== ========================

The times follow the keystream count (about 60 M words/s): at ``S = 100`` the complete
graph draws 7180 keystreams of ``d`` words, ``k = 22`` 1740 and ``k = 14`` 1180.
(*) below the floor when ``k < S - t + 1``: timed with the check bypassed, to show what
Bell et al.'s logarithmic degree would save.

**Default degree.** ``SecAggRound.degree=None`` (the complete graph) is the structural
default; the recommended setting for a plan is :func:`min_degree` ``(S, t, c)``: the same
certain guarantee as the complete graph (any released round's honest survivors stay
connected) at 1/4 of its time at ``S = 100`` (1/3 at ``S = 16``), growing as ``O(S (S - t))``
rather than ``O(S^2)``. A logarithmic degree would save at most another 1.4x at ``S = 100``
and holds only with high probability, which nothing accounts: refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Int, PRNGKeyArray, UInt32

from swarmjax._validation import check_int
from swarmjax.privacy.chacha20 import block

__all__ = [
    "SELF_TAG",
    "SecAggRound",
    "check_threshold",
    "masked_uploads",
    "min_degree",
    "neighbours",
    "pair_key",
    "secure_sum",
    "self_key",
    "unmask_sum",
]

SELF_TAG = 0xB5E1F5EE
"""The first ``fold_in`` input of every self-mask seed (``>= 2^31``: never a client id)."""

_ID_LIMIT = 2**31


@flax.struct.dataclass
class SecAggRound:
    """One round of secure aggregation: its secrets, its cohort and its survivors.

    Attributes:
        key: typed ChaCha20 key (``jax.random.key(..., impl=chacha20)``); every pair seed
            and self seed of the round is derived from it (module docstring). Secret.
        ids: ``(S,)`` int client ids of the slots; the selected ones distinct, in
            ``[0, 2^31)``. Public.
        selected: ``(S,)`` bool, the slots that take part (``U1``). Public.
        survived: ``(S,)`` bool, the slots whose masked upload reached the server (``U2``;
            slots outside ``selected`` are ignored). Public.
        bits: ``b``, the residues live modulo ``2^b``; ``1 <= b <= 32``. Static.
        threshold: ``t``, the fewest survivors for which the server unmasks (the Shamir
            threshold); :func:`check_threshold`. Static.
        degree: ``None``: complete masking graph; else an even ``k >= min_degree(S, t, c)``,
            the degree of the Harary ring over the selected clients in order of id. Static.
        colluders: ``c``, clients assumed able to collude with the server (enters the
            threshold and degree floors); default 0. Static.
    """

    key: PRNGKeyArray
    ids: Int[Array, " S"]
    selected: Bool[Array, " S"]
    survived: Bool[Array, " S"]
    bits: int = flax.struct.field(pytree_node=False, default=32)
    threshold: int = flax.struct.field(pytree_node=False, default=1)
    degree: int | None = flax.struct.field(pytree_node=False, default=None)
    colluders: int = flax.struct.field(pytree_node=False, default=0)


# ---------------------------------------------------------------------- checks


def check_threshold(threshold: int, cohort: int, colluders: int = 0) -> int:
    """Check the Shamir threshold ``t`` for a cohort of ``S`` slots and ``c`` colluders.

    Requires ``1 <= t <= S`` (``t`` survivors must be possible) and ``2 t > S + c``: any two
    sets of ``t`` responders then share an honest client, who reveals for each client the
    share of its self seed or of its mask key, never both (Bonawitz et al. 2017, Round 4;
    module docstring). Returns ``t``.
    """
    for name, value, low in (("cohort", cohort, 1), ("colluders", colluders, 0)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}; got {value!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, int | np.integer):
        raise ValueError(f"threshold must be an integer; got {threshold!r}")
    if not 2 * threshold > cohort + colluders or threshold > cohort:
        raise ValueError(
            f"threshold must satisfy (cohort + colluders) / 2 < threshold <= cohort "
            f"(= {cohort}, colluders {colluders}); got {threshold}"
        )
    return int(threshold)


def min_degree(cohort: int, threshold: int, colluders: int = 0) -> int | None:
    """The smallest even ring degree ``k > S - t + c`` (module docstring: any released
    round's honest survivors stay connected); ``None`` when that is the complete graph
    anyway (``k >= S - 1``)."""
    check_threshold(threshold, cohort, colluders)
    k = cohort - threshold + colluders + 1
    k += k % 2
    return None if k >= cohort - 1 else k


def _check_round(rnd: SecAggRound, shape: tuple[int, ...]) -> tuple[int, int]:
    """Validate ``rnd`` against an ``(S, d)`` array shape; return ``(S, d)``."""
    if not isinstance(rnd, SecAggRound):
        raise ValueError(f"rnd must be a SecAggRound; got {type(rnd).__name__}")
    if len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
        raise ValueError(f"uploads must be (S, d) with S, d >= 1; got shape {shape}")
    s, d = shape
    if d >= 2**32:
        raise ValueError(f"d must be < 2^32 words (a 32-bit block counter); got {d}")
    key = rnd.key
    if jnp.shape(key) != () or str(getattr(key, "dtype", None)) != "key<cc20>":
        raise ValueError(
            "rnd.key must be one typed ChaCha20 key (jax.random.key(seed, impl=chacha20)); "
            f"got dtype {getattr(key, 'dtype', type(key).__name__)} shape {jnp.shape(key)}"
        )
    for name, leaf in (("ids", rnd.ids), ("selected", rnd.selected), ("survived", rnd.survived)):
        if jnp.shape(leaf) != (s,):
            raise ValueError(f"rnd.{name} must have shape ({s},); got {jnp.shape(leaf)}")
    if not jnp.issubdtype(jnp.result_type(rnd.ids), jnp.integer):
        raise ValueError(f"rnd.ids must be integers; got {jnp.result_type(rnd.ids)}")
    check_int("bits", rnd.bits, 1, 32)  # uint32 words
    check_threshold(rnd.threshold, s, rnd.colluders)
    if rnd.degree is not None:
        floor = min_degree(s, rnd.threshold, rnd.colluders) or 2
        k = rnd.degree
        if isinstance(k, bool) or not isinstance(k, int) or k < floor or k % 2:
            raise ValueError(
                f"degree must be None (complete graph) or an even integer >= {floor} "
                f"(> cohort - threshold + colluders: honest survivors stay connected); got {k!r}"
            )
    ids, selected = rnd.ids, rnd.selected
    if not isinstance(ids, jax.core.Tracer) and not isinstance(selected, jax.core.Tracer):
        chosen = np.asarray(ids)[np.asarray(selected, bool)]
        if chosen.size and (chosen.min() < 0 or chosen.max() >= _ID_LIMIT):
            raise ValueError(f"rnd.ids of selected slots must be in [0, 2^31); got {chosen}")
        if np.unique(chosen).size != chosen.size:
            raise ValueError(f"rnd.ids of selected slots must be distinct; got {chosen}")
    return s, d


# ---------------------------------------------------------------------- seeds and graph


def pair_key(key: PRNGKeyArray, id_a: Int[Array, ""], id_b: Int[Array, ""]) -> PRNGKeyArray:
    """The simulated agreed secret of clients ``id_a`` and ``id_b`` (symmetric)."""
    lo, hi = jnp.minimum(id_a, id_b), jnp.maximum(id_a, id_b)
    return jax.random.fold_in(jax.random.fold_in(key, lo), hi)


def self_key(key: PRNGKeyArray, client: Int[Array, ""]) -> PRNGKeyArray:
    """The simulated self-mask seed of client ``client``."""
    return jax.random.fold_in(jax.random.fold_in(key, np.uint32(SELF_TAG)), client)


def _ring(
    ids: Int[Array, " S"], selected: Bool[Array, " S"]
) -> tuple[Int[Array, " S"], Int[Array, " S"], Int[Array, ""]]:
    """``(order, pos, n)``: the slot at each ring position (selected slots first, in
    increasing id), each slot's position, and the number ``n`` of selected slots."""
    s = ids.shape[0]
    order = jnp.lexsort((ids, ~selected)).astype(jnp.int32)
    pos = jnp.zeros((s,), jnp.int32).at[order].set(jnp.arange(s, dtype=jnp.int32))
    return order, pos, jnp.sum(selected, dtype=jnp.int32)


def _half(degree: int | None, s: int) -> int:
    """``h``: ring neighbours on each side (``S`` stands for "all": complete graph)."""
    return s if degree is None else degree // 2


def _offsets(h: int, s: int) -> np.ndarray:
    """Signed ring offsets that reach every neighbour of a client exactly once (with
    :func:`_offset_valid`): ``1..S-1`` for the complete graph, ``+-1..+-h`` else."""
    if 2 * h >= s - 1:
        return np.arange(1, s, dtype=np.int32)
    return np.concatenate([np.arange(1, h + 1), -np.arange(1, h + 1)]).astype(np.int32)


def _offset_valid(o: Int[Array, ""], n: Int[Array, ""], h: int) -> Bool[Array, ""]:
    """Offset ``o`` of :func:`_offsets` reaches a neighbour in a ring of ``n``, not reached
    by another offset: ``|o| < n``, and a negative ``o`` only where ``n - |o| > h`` (else
    that partner is the positive offset ``n - |o| <= h``)."""
    a = jnp.abs(o)
    return (a < n) & ((o > 0) | (n - a > h))


def neighbours(
    ids: Int[Array, " S"], selected: Bool[Array, " S"], degree: int | None
) -> Bool[Array, "S S"]:
    """``(S, S)`` symmetric adjacency of the masking graph (public): entry ``(i, j)`` is
    True when selected slots ``i != j`` share a pairwise mask. ``O(S^2)`` booleans; for
    inspection and deployments (the masking itself never forms it)."""
    ids = jnp.asarray(ids)
    selected = jnp.asarray(selected, bool)
    s = ids.shape[0]
    _, pos, n = _ring(ids, selected)
    delta = jnp.mod(pos[None, :] - pos[:, None], jnp.maximum(n, 1))
    h = _half(degree, s)
    near = (delta > 0) & ((delta <= h) | (delta >= n - h))
    return near & selected[:, None] & selected[None, :]


# ---------------------------------------------------------------------- the PRG

_BITS_NONCE = 0x42495453
"""Nonce word 15 of :func:`jax.random.bits` under :mod:`~swarmjax.privacy.chacha20` ("BITS";
``tests/test_secagg.py`` checks :func:`_prg_tile` against ``jax.random.bits``)."""
_TILE_BLOCKS = 4096
"""ChaCha20 blocks per PRG call (``2^16`` words): the 16 state arrays then stay in cache.
``jax.random.bits`` of one key on this CPU: 58 M words/s at ``2^16`` words, 21 M at
``2^20``, 15 M at ``2^22`` (each of the 80 quarter-round steps is a pass over memory)."""


def _mod_mask(bits: int) -> UInt32[Array, ""]:
    return jnp.uint32((1 << bits) - 1)


def fields(bits: int) -> tuple[int, int]:
    """``(w, f)``: ``w`` 32-bit keystream words hold ``f`` masks of ``bits`` bits exactly
    (``32 w = f bits``, ``g = gcd(32, bits)``, ``w = bits / g``, ``f = 32 / g``): the words
    read as one bit stream, lowest bit first, mask ``i`` its bits ``bits i .. bits (i + 1)
    - 1`` (:func:`split_fields`). ``(1, 2)`` at 16 bits, ``(5, 8)`` at 20, ``(1, 1)`` at 32;
    no keystream bit is dropped."""
    g = math.gcd(32, check_int("bits", bits, 1))
    return bits // g, 32 // g


def split_fields(words: Any, bits: int) -> Any:
    """``(..., n w)`` uint32 keystream words (numpy or JAX) to the ``(..., n f)`` masks they
    hold (:func:`fields`), each in the low ``bits`` bits of a uint32 (higher bits left for
    the caller to reduce away): the one definition the simulator (:func:`_prg_tile`) and a
    deployment (:func:`~swarmjax.privacy.secagg_crypto.mask_words`) share."""
    w, f = fields(bits)
    if f == 1:
        return words
    xp = np if isinstance(words, np.ndarray) else jnp
    group = words.reshape(*words.shape[:-1], -1, w)
    out = []
    for j in range(f):
        i, shift = divmod(bits * j, 32)
        v = group[..., i] >> np.uint32(shift)
        if shift + bits > 32:  # the field runs on into the next word
            v = v | (group[..., i + 1] << np.uint32(32 - shift))
        out.append(v)
    return xp.stack(out, axis=-1).reshape(*words.shape[:-1], -1)


def _tiles(rows: int, d: int, bits: int = 32) -> tuple[int, int]:
    """``(per, chunks)``: ChaCha20 blocks of each key per tile (a multiple of the ``w`` of
    :func:`fields`, so no group of words straddles two tiles), and tiles covering ``d``
    coordinates of ``bits`` bits."""
    w, f = fields(bits)
    blocks = -(-(w * -(-d // f)) // 16)
    per = max(w, min(blocks, _TILE_BLOCKS // rows) // w * w)
    return per, -(-blocks // per)


def _tile_width(per: int, bits: int) -> int:
    """Coordinates one tile of ``per`` blocks (``16 per`` words) holds."""
    w, f = fields(bits)
    return 16 * per // w * f


def _prg_tile(
    words: UInt32[Array, "R 8"], first: Int[Array, ""], per: int, bits: int = 32
) -> UInt32[Array, "R w"]:
    """One tile of the PRG of ``R`` keys (key data): keystream words ``16 first .. 16
    (first + per)`` (those ``jax.random.bits(key, (d,), uint32)`` reads; ``16 first`` and
    ``16 per`` multiples of the ``w`` of :func:`fields`), split into their masks of ``bits``
    bits (:func:`split_fields`): ``(R, _tile_width(per, bits))`` uint32 (the caller reduces
    modulo ``2^bits``; at 32 bits the words themselves)."""
    counters = first.astype(jnp.uint32) + jnp.arange(per, dtype=jnp.uint32)
    out = jax.vmap(lambda k: block(k, counters, jnp.uint32(0), (0, _BITS_NONCE)))(words)
    return split_fields(out.reshape(words.shape[0], 16 * per), bits)


# ---------------------------------------------------------------------- the protocol


def _level1(key: PRNGKeyArray, ids: Int[Array, " S"]) -> PRNGKeyArray:
    """``(S + 1,)`` keys: ``fold_in(key, SELF_TAG)`` then ``fold_in(key, id)`` per slot,
    the first step of every seed (one ChaCha20 loop for all of them)."""
    data = jnp.concatenate([jnp.full((1,), SELF_TAG, jnp.uint32), ids.astype(jnp.uint32)])
    return jax.vmap(lambda x: jax.random.fold_in(key, x))(data)


def _seed_words(
    level1: PRNGKeyArray,
    ids: Int[Array, " R"],
    slots: Int[Array, " R"],
    partner: Int[Array, " R"],
    partner_ids: Int[Array, " R"],
    own: Bool[Array, " R"],
) -> UInt32[Array, "R 8"]:
    """Key data of ``R`` seeds: the self seed of ``ids`` where ``own``, else the pair seed
    of (``slots``, ``partner``) (:func:`self_key`, :func:`pair_key`), one ChaCha20 loop."""
    low = jnp.where(ids < partner_ids, slots, partner)
    first = jnp.where(own, 0, low + 1)
    data = jnp.where(own, ids, jnp.maximum(ids, partner_ids)).astype(jnp.uint32)
    return jax.random.key_data(jax.vmap(jax.random.fold_in)(level1[first], data))


def masked_uploads(values: UInt32[Array, "S d"], rnd: SecAggRound) -> UInt32[Array, "S d"]:
    """What each selected client sends: its value plus its self mask and its pairwise
    masks, modulo ``2^b`` (module docstring); zeros in unselected slots.

    Args:
        values: ``(S, d)`` uint32 residues modulo ``2^b`` (higher bits are reduced away).
        rnd: the round (:class:`SecAggRound`).

    Returns:
        ``(S, d)`` uint32 masked uploads, each in ``[0, 2^b)``.
    """
    values, _ = _residues("values", values, rnd)
    return _masked(values, rnd)


def secure_sum(
    values: UInt32[Array, "S d"], rnd: SecAggRound
) -> tuple[UInt32[Array, " d"], Bool[Array, ""]]:
    """One whole round, client side and server side: ``unmask_sum(masked_uploads(values,
    rnd), rnd)``, the same bits, without the ``(S, d)`` array of masked uploads. Each tile
    of every selected client's masked upload is made as :func:`masked_uploads` makes it,
    from ``values`` read in place, and the survivors' tiles are added at once, so the
    server's sum of what it received is all that stays: no ``(S, d)`` temporary (5 MB of
    XLA temporaries at 50 clients of 1.2 M coordinates, against 458 MB for the two
    steps).

    Returns:
        ``(total, ok)`` as :func:`unmask_sum`.
    """
    values, _ = _residues("values", values, rnd)
    return _unmask_received(_masked_sum(values, rnd), _alive(rnd), rnd)


def _residues(name: str, words: Any, rnd: SecAggRound) -> tuple[UInt32[Array, "S d"], int]:
    """``words`` as an array checked against ``rnd`` (:func:`_check_round`) and as uint32
    residues (one ``ValueError`` line naming ``name`` otherwise); and ``S``."""
    words = jnp.asarray(words)
    s, _ = _check_round(rnd, words.shape)
    if words.dtype != jnp.uint32:
        raise ValueError(f"{name} must be uint32 residues; got dtype {words.dtype}")
    return words, s


def _alive(rnd: SecAggRound) -> Bool[Array, " S"]:
    """``(S,)`` the slots whose upload the server reads: selected and survived."""
    return jnp.asarray(rnd.selected, bool) & jnp.asarray(rnd.survived, bool)


def _masker(
    rnd: SecAggRound, shape: tuple[int, int]
) -> tuple[Callable[[Array, Array], Array], int, int]:
    """``(masked, width, chunks)`` for uploads of ``shape`` ``(S, d)`` in round ``rnd``:
    ``masked(c, acc)`` is tile ``c`` of every slot's upload (``acc``, ``(S, width)``) with
    its masks added, modulo ``2^b``; ``chunks`` tiles of ``width`` coordinates cover ``d``."""
    s, d = shape
    key, bits, h, modmask = rnd.key, rnd.bits, _half(rnd.degree, s), _mod_mask(rnd.bits)
    ids = jnp.asarray(rnd.ids)
    selected = jnp.asarray(rnd.selected, bool)
    order, pos, n = _ring(ids, selected)
    n1 = jnp.maximum(n, 1)

    # Step 0: the self masks. Step o > 0: each pair once, from its end at ring position p
    # with partner p + o (2 o < n; at 2 o == n only from p < n / 2); the lower id adds the
    # mask, the higher id subtracts it. Seeds and signs of every step first (O(S h) keys).
    offsets = jnp.arange(0, min(h, s // 2) + 1, dtype=jnp.int32)[:, None]
    own = jnp.broadcast_to(offsets == 0, (offsets.shape[0], s))
    partner = order[jnp.mod(pos + offsets, n1)]
    once = own | (2 * offsets < n) | ((2 * offsets == n) & (2 * pos < n))
    live = selected & once
    slots = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), own.shape)
    idb = jnp.broadcast_to(ids, own.shape)
    seeds = _seed_words(
        _level1(key, ids),
        idb.ravel(),
        slots.ravel(),
        partner.ravel(),
        ids[partner].ravel(),
        own.ravel(),
    ).reshape(*own.shape, -1)
    plus = own | (idb < ids[partner])
    # slot j is the partner of the slot at ring position pos[j] - o (a bijection)
    back = order[jnp.mod(pos - offsets, n1)]
    per, chunks = _tiles(s, d, bits)

    def masked(c: Array, acc: Array) -> Array:
        def step(acc: Array, xs: tuple[Array, ...]) -> tuple[Array, None]:
            words, sign, on, other, first = xs
            w = _prg_tile(words, c * per, per, bits) & modmask
            contrib = jnp.where(on[:, None], jnp.where(sign[:, None], w, -w), jnp.uint32(0))
            return acc + contrib - jnp.where(first, jnp.uint32(0), contrib[other]), None

        acc, _ = jax.lax.scan(step, acc, (seeds, plus, live, back, own[:, 0]))
        return acc & modmask

    return masked, _tile_width(per, bits), chunks


@jax.jit
def _masked(values: UInt32[Array, "S d"], rnd: SecAggRound) -> UInt32[Array, "S d"]:
    """The selected slots' masked uploads, ``(S, d)``, zeros elsewhere."""
    s, d = values.shape
    masked, width, chunks = _masker(rnd, values.shape)
    buf = jnp.pad(values, ((0, 0), (0, chunks * width - d)))

    def stored(c: Array, buf: Array) -> Array:
        acc = jax.lax.dynamic_slice(buf, (0, c * width), (s, width))
        return jax.lax.dynamic_update_slice(buf, masked(c, acc), (0, c * width))

    buf = jax.lax.fori_loop(0, chunks, stored, buf)
    return jnp.where(jnp.asarray(rnd.selected, bool)[:, None], buf[:, :d], jnp.uint32(0))


@jax.jit
def _masked_sum(values: UInt32[Array, "S d"], rnd: SecAggRound) -> UInt32[Array, " d"]:
    """The ``(d,)`` sum modulo ``2^b`` of the survivors' (:func:`_alive`) masked uploads,
    tile by tile: the uploads are read in place (full tiles sliced, the last one padded alone),
    never copied whole."""
    s, d = values.shape
    masked, width, _ = _masker(rnd, values.shape)
    alive, modmask = _alive(rnd), _mod_mask(rnd.bits)

    def summed(c: Array, acc: Array) -> Array:
        rows = jnp.where(alive[:, None], masked(c, acc), jnp.uint32(0))
        return jnp.sum(rows, axis=0, dtype=jnp.uint32) & modmask

    def added(c: Array, out: Array) -> Array:
        part = summed(c, jax.lax.dynamic_slice(values, (0, c * width), (s, width)))
        return jax.lax.dynamic_update_slice(out, part, (c * width,))

    full, rest = divmod(d, width)
    out = jnp.zeros((d,), jnp.uint32)
    if full:  # (a tile wider than the uploads cannot be sliced from them)
        out = jax.lax.fori_loop(0, full, added, out)
    if rest:
        last = jnp.pad(values[:, full * width :], ((0, 0), (0, width - rest)))
        out = out.at[full * width :].set(summed(jnp.int32(full), last)[:rest])
    return out


def unmask_sum(
    uploads: UInt32[Array, "S d"], rnd: SecAggRound
) -> tuple[UInt32[Array, " d"], Bool[Array, ""]]:
    """The server's side: the survivors' sum modulo ``2^b`` from their masked uploads.

    Reads only the rows of ``uploads`` in ``rnd.survived & rnd.selected`` and the seeds a
    deployment's server reconstructs (the survivors' self seeds, the dropped clients' pair
    seeds; recomputed here from ``rnd.key``).

    Returns:
        ``(total, ok)``: ``total`` ``(d,)`` uint32, the survivors' values summed modulo
        ``2^b`` when ``ok``; zeros otherwise. ``ok``: at least ``threshold`` survivors.
    """
    uploads, _ = _residues("uploads", uploads, rnd)
    alive = _alive(rnd)
    received = jnp.where(alive[:, None], uploads, jnp.uint32(0))  # survivors' rows only
    return _unmask_received(jnp.sum(received, axis=0, dtype=jnp.uint32), alive, rnd)


def _unmask_received(
    received: UInt32[Array, " d"], alive: Bool[Array, " S"], rnd: SecAggRound
) -> tuple[UInt32[Array, " d"], Bool[Array, ""]]:
    """:func:`unmask_sum` from the survivors' uploads already summed (``received``)."""
    s = rnd.ids.shape[0]
    return _unmask(
        received,
        rnd.key,
        rnd.ids,
        rnd.selected,
        alive,
        _mod_mask(rnd.bits),
        jnp.int32(rnd.threshold),
        h=_half(rnd.degree, s),
        room=s - rnd.threshold,
        bits=rnd.bits,
    )


@partial(jax.jit, static_argnames=("h", "room", "bits"))
def _unmask(
    received: UInt32[Array, " d"],
    key: PRNGKeyArray,
    ids: Int[Array, " S"],
    selected: Bool[Array, " S"],
    alive: Bool[Array, " S"],
    modmask: UInt32[Array, ""],
    threshold: Int[Array, ""],
    *,
    h: int,
    room: int,
    bits: int,
) -> tuple[Array, Array]:
    (d,) = received.shape
    s = ids.shape[0]
    ids = jnp.asarray(ids)
    selected = jnp.asarray(selected, bool)
    dropped = selected & ~alive
    ok = jnp.sum(alive) >= threshold
    order, pos, n = _ring(ids, selected)
    n1 = jnp.maximum(n, 1)

    # Steps of `width` rows: first the survivors' self masks (`fill` steps over the slots),
    # then the pair masks of the at most S - t dropouts of a released round: each dropout's
    # mask with the surviving neighbour at each offset, as that survivor added it (+ from
    # the lower id). Of the `len(offsets) * width` candidate pair rows only the live ones
    # (real dropouts, surviving partners) are moved to the front and run, in as many steps
    # as they fill: the others would draw keystreams only to add nothing.
    width = max(room, 1)
    fill = -(-s // width)
    cells = jnp.arange(fill * width, dtype=jnp.int32).reshape(fill, width)
    own_rows = jnp.minimum(cells, s - 1)
    own_live = (cells < s) & alive[own_rows]
    level1 = _level1(key, ids)
    own_seeds = _seed_words(
        level1,
        ids[own_rows].ravel(),
        own_rows.ravel(),
        own_rows.ravel(),
        ids[own_rows].ravel(),
        jnp.ones(own_rows.size, bool),
    ).reshape(fill, width, -1)
    if room > 0:
        (gone,) = jnp.nonzero(dropped, size=width, fill_value=0)
        real = jnp.arange(width) < jnp.sum(dropped)
        offsets = jnp.asarray(_offsets(h, s))[:, None]
        rows = jnp.broadcast_to(gone, (offsets.shape[0], width)).ravel()
        partner = order[jnp.mod(pos[rows] + jnp.repeat(offsets[:, 0], width), n1)]
        live = (real & _offset_valid(offsets, n, h)).ravel() & alive[partner]
        (first,) = jnp.nonzero(live, size=live.size, fill_value=0)
        rows, partner = rows[first], partner[first]
        live = jnp.arange(live.size) < jnp.sum(live)
        pair_steps = -(-jnp.sum(live) // width)
        pair_seeds = _seed_words(
            level1, ids[rows], rows, partner, ids[partner], jnp.zeros_like(live)
        ).reshape(live.size // width, width, -1)
        pair_plus = (ids[partner] < ids[rows]).reshape(-1, width)
        pair_live = live.reshape(-1, width)
    per, chunks = _tiles(width, d, bits)
    span = _tile_width(per, bits)
    buf = jnp.pad(received, (0, chunks * span - d))

    def tile(c: Array, buf: Array) -> Array:
        def added(words: Array, sign: Array, on: Array) -> Array:
            w = _prg_tile(words, c * per, per, bits) & modmask
            signed = jnp.where(on[:, None], jnp.where(sign[:, None], w, -w), jnp.uint32(0))
            return jnp.sum(signed, axis=0, dtype=jnp.uint32)

        def own_step(acc: Array, xs: tuple[Array, ...]) -> tuple[Array, None]:
            words, on = xs
            return acc - added(words, jnp.ones_like(on), on), None

        acc = jax.lax.dynamic_slice(buf, (c * span,), (span,))
        acc, _ = jax.lax.scan(own_step, acc, (own_seeds, own_live))
        if room > 0:

            def pair_step(i: Array, acc: Array) -> Array:
                return acc - added(pair_seeds[i], pair_plus[i], pair_live[i])

            acc = jax.lax.fori_loop(0, pair_steps, pair_step, acc)
        return jax.lax.dynamic_update_slice(buf, acc & modmask, (c * span,))

    buf = jax.lax.fori_loop(0, chunks, tile, buf)
    return jnp.where(ok, buf[:d], jnp.uint32(0)), ok
