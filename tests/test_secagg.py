"""Secure aggregation: the vectorised simulation (swarmjax.privacy.secagg) and the host-side
cryptography of a deployment (swarmjax.privacy.secagg_crypto).

(a) the server recovers exactly the survivors' sum for every dropout pattern within the
threshold, nothing beyond it, the whole round at once (``secure_sum``) gives the same bits,
and the uploads are the protocol's formula computed on the host
from the seeds' bytes; (b) one masked upload is uniform and independent of its value
(chi-square); (c) Shamir: t shares reconstruct, t - 1 are independent of the secret;
(d) X25519 agreement, HKDF contexts, sealed share bundles; (e) one PRG in three
implementations; (f) bad input.
"""

from __future__ import annotations

import itertools
import math
import random
import struct
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from swarmjax.privacy import secagg as sa
from swarmjax.privacy import secagg_crypto as sc
from swarmjax.privacy.chacha20 import chacha20, key_from_bytes

D = 19  # two ChaCha20 blocks, the second partly used
BITS = (8, 12, 16, 20, 32)
# (slots S, threshold t, degree): complete graphs, and rings at the degree floor S - t + 1.
CONFIGS = ((4, 3, None), (12, 7, 6), (12, 9, 4))


def _key(seed: int) -> jax.Array:
    return jax.random.key(seed, impl=chacha20)


def _round(ids, selected, survived, *, bits, threshold, degree, seed=0, colluders=0):
    return sa.SecAggRound(
        key=_key(seed),
        ids=jnp.asarray(ids, jnp.int32),
        selected=jnp.asarray(selected, bool),
        survived=jnp.asarray(survived, bool),
        bits=bits,
        threshold=threshold,
        degree=degree,
        colluders=colluders,
    )


def _reference_uploads(values: np.ndarray, rnd: sa.SecAggRound) -> np.ndarray:
    """The masked uploads from the protocol's formula, on the host: each seed's bytes
    expanded by the deployment's PRG (secagg_crypto.mask_words, OpenSSL's ChaCha20)."""
    s, d = values.shape
    ids = np.asarray(rnd.ids)
    sel = np.asarray(rnd.selected)
    adj = np.asarray(sa.neighbours(rnd.ids, rnd.selected, rnd.degree))
    mod = (1 << rnd.bits) - 1
    pairs = jax.vmap(jax.vmap(sa.pair_key, (None, None, 0)), (None, 0, None))(
        rnd.key, rnd.ids, rnd.ids
    )
    selves = jax.vmap(sa.self_key, (None, 0))(rnd.key, rnd.ids)
    out = np.zeros((s, d), np.uint64)
    for i in np.flatnonzero(sel):
        acc = values[i].astype(np.uint64) + sc.mask_words(sc.key_bytes(selves[i]), d, rnd.bits)
        for j in np.flatnonzero(adj[i]):
            m = sc.mask_words(sc.key_bytes(pairs[i, j]), d, rnd.bits).astype(np.uint64)
            acc = acc + m if ids[i] < ids[j] else acc + (mod + 1) - m
        out[i] = acc & mod
    return out.astype(np.uint32)


# ---------------------------------------------------------------------- (a) exact sums


@settings(max_examples=30, deadline=None)
@given(
    config=st.sampled_from(CONFIGS),
    bits=st.sampled_from(BITS),
    seed=st.integers(0, 2**31 - 1),
    data=st.data(),
)
def test_the_server_recovers_exactly_the_survivors_sum(config, bits, seed, data):
    s, t, degree = config
    gen = np.random.default_rng(seed)
    selected = np.array(data.draw(st.lists(st.booleans(), min_size=s, max_size=s)))
    # dropouts: mostly within the threshold, sometimes beyond it
    n = int(selected.sum())
    drops = data.draw(st.integers(0, n))
    survived = selected.copy()
    survived[gen.permutation(np.flatnonzero(selected))[:drops]] = False
    ids = gen.permutation(1000)[:s]
    values = gen.integers(0, 1 << bits, (s, D), dtype=np.uint64).astype(np.uint32)
    rnd = _round(ids, selected, survived, bits=bits, threshold=t, degree=degree, seed=seed)

    uploads = sa.masked_uploads(jnp.asarray(values), rnd)
    np.testing.assert_array_equal(np.asarray(uploads), _reference_uploads(values, rnd))
    total, ok = sa.unmask_sum(uploads, rnd)
    assert bool(ok) == (survived.sum() >= t)
    want = values[survived].astype(np.uint64).sum(axis=0) % (1 << bits)
    np.testing.assert_array_equal(np.asarray(total), want if ok else 0)
    # the whole round at once (the simulator's path: no (S, d) array of masked uploads)
    fused, fused_ok = sa.secure_sum(jnp.asarray(values), rnd)
    assert bool(fused_ok) == bool(ok)
    np.testing.assert_array_equal(np.asarray(fused), np.asarray(total))
    # the server reads the survivors' rows only: anything else in the other rows is ignored
    noise = np.where(survived[:, None], 0, gen.integers(0, 2**32, (s, D), dtype=np.uint64))
    total2, _ = sa.unmask_sum(uploads + jnp.asarray(noise.astype(np.uint32)), rnd)
    np.testing.assert_array_equal(np.asarray(total2), np.asarray(total))


@pytest.mark.parametrize("bits", [8, 16, 32])
def test_a_malicious_clients_garbage_shifts_the_sum_by_what_it_chose(bits):
    """What secure aggregation does not stop (docs/secure_aggregation.md): a client that
    uploads any words it likes instead of its masked value. The server cannot tell (the
    round unmasks as usual), and the sum moves by exactly the difference between the
    garbage and the masked value, modulo 2^b: the client can poison the sum with a shift of
    its choice, and nothing else changes: the honest survivors' values (their noise shares
    included) are all still in it. Out-of-range words (above 2^b) count modulo 2^b."""
    s, t, d = 8, 6, D
    gen = np.random.default_rng(bits)
    ids, selected = gen.permutation(1000)[:s], np.ones(s, bool)
    values = gen.integers(0, 1 << bits, (s, d), dtype=np.uint64).astype(np.uint32)
    rnd = _round(ids, selected, selected, bits=bits, threshold=t, degree=None, seed=bits)
    uploads = np.asarray(sa.masked_uploads(jnp.asarray(values), rnd))
    honest, ok = sa.unmask_sum(jnp.asarray(uploads), rnd)
    garbage = gen.integers(0, 2**32, d, dtype=np.uint64).astype(np.uint32)  # any words
    forged = uploads.copy()
    forged[3] = garbage
    poisoned, still_ok = sa.unmask_sum(jnp.asarray(forged), rnd)
    assert bool(ok) and bool(still_ok)  # nothing tells the server
    m = np.uint64(1 << bits)
    shift = (garbage.astype(np.uint64) % m + m - uploads[3].astype(np.uint64) % m) % m
    want = (np.asarray(honest).astype(np.uint64) + shift) % m
    np.testing.assert_array_equal(np.asarray(poisoned).astype(np.uint64), want)
    # the other clients' values are all in the poisoned sum: removing the shift and the
    # attacker's own value leaves exactly the honest clients' sum
    others = values[np.arange(s) != 3].astype(np.uint64).sum(axis=0) % m
    np.testing.assert_array_equal((want + m - values[3].astype(np.uint64) - shift) % m, others)


@pytest.mark.parametrize(
    ("bits", "d"),
    [(20, 40), (32, 40), (32, 48), (16, 70)],  # at 4 blocks a tile: tiles of 128, 16, 16, 32
)
def test_tiles_of_the_keystream_join_up(monkeypatch, bits, d):
    """Vectors longer than one tile (full tiles and a part, or full tiles only): masks,
    unmasking and the one-pass sum agree with the host formula."""
    monkeypatch.setattr(sa, "_TILE_BLOCKS", 4)  # one block per key per tile
    gen = np.random.default_rng(5)
    values = gen.integers(0, 1 << bits, (4, d), dtype=np.uint64).astype(np.uint32)
    rnd = _round([9, 3, 7, 1], [1, 1, 1, 1], [1, 0, 1, 1], bits=bits, threshold=3, degree=None)
    uploads = sa.masked_uploads(jnp.asarray(values), rnd)
    np.testing.assert_array_equal(np.asarray(uploads), _reference_uploads(values, rnd))
    total, ok = sa.unmask_sum(uploads, rnd)
    want = values[[0, 2, 3]].astype(np.uint64).sum(axis=0) % (1 << bits)
    assert bool(ok)
    np.testing.assert_array_equal(np.asarray(total), want)
    np.testing.assert_array_equal(np.asarray(sa.secure_sum(jnp.asarray(values), rnd)[0]), want)


def test_the_ring_is_k_connected_and_complete_when_small():
    """Harary's H(k, n): every selected client has min(k, n - 1) neighbours, all within
    k/2 ring places in id order, and removing any k - 1 clients leaves it connected."""
    s = 10
    ids = np.array([50, 3, 41, 17, 8, 29, 66, 12, 90, 35])
    for n in range(1, s + 1):
        selected = np.arange(s) < n
        full = np.asarray(sa.neighbours(ids, selected, None))
        np.testing.assert_array_equal(full, np.outer(selected, selected) & ~np.eye(s, dtype=bool))
        for k in range(2, s, 2):
            adj = np.asarray(sa.neighbours(ids, selected, k))
            assert (adj == adj.T).all() and not adj.diagonal().any()
            assert (adj.sum(axis=1) == np.where(selected, min(k, n - 1), 0)).all()
            rank = np.argsort(np.argsort(np.where(selected, ids, 10**6)))
            gap = np.abs(rank[:, None] - rank[None, :])
            near = (np.minimum(gap, n - gap) <= k // 2) & (gap > 0)
            np.testing.assert_array_equal(adj, near & np.outer(selected, selected))
            for removed in itertools.combinations(range(n), min(k - 1, n - 1)):
                keep = [i for i in range(n) if i not in removed]
                assert _connected(adj[np.ix_(keep, keep)])


def _connected(adj: np.ndarray) -> bool:
    seen, frontier = {0}, [0]
    while frontier:
        i = frontier.pop()
        for j in np.flatnonzero(adj[i]):
            if j not in seen:
                seen.add(int(j))
                frontier.append(int(j))
    return len(seen) == adj.shape[0]


def test_min_degree_is_the_connectivity_floor():
    assert sa.min_degree(100, 80) == 22  # > 20 dropouts: 21, rounded up to even
    assert sa.min_degree(100, 80, colluders=5) == 26
    assert sa.min_degree(16, 13) == 4
    assert sa.min_degree(10, 6) == 6
    assert sa.min_degree(5, 3) is None  # 4 >= S - 1: the complete graph anyway
    assert sa.min_degree(4, 3) == 2


# ---------------------------------------------------------------------- (b) uniformity


def test_one_masked_upload_is_uniform_and_independent_of_its_value():
    """Client 0's words at b = 4, over 64 fixed keys per value (disjoint key sets): each
    histogram against the uniform law, and the two against each other (homogeneity).

    The keys are fixed, so the test is deterministic: alpha = 1e-3 per test is the chance
    that a correct implementation would fail at keys chosen at random (three tests: at
    most 3e-3), while a mask that leaks the value (a point mass, or any bin off by 0.01
    from 1/16 at these 24 k samples: chi2 ~ 80 against the 37.7 cut) fails by orders of
    magnitude."""
    bits, s, d = 4, 4, 384
    cuts = stats.chi2.isf(1e-3, df=15)
    counts = []
    for value, first in ((3, 0), (12, 64)):
        values = np.full((s, d), value, np.uint32)
        values[1:] = np.arange(d, dtype=np.uint32) % 16  # other clients: any values
        hist = np.zeros(16, np.int64)
        for seed in range(first, first + 64):
            rnd = sa.SecAggRound(
                key=_key(seed),
                ids=jnp.arange(s, dtype=jnp.int32),
                selected=jnp.ones(s, bool),
                survived=jnp.ones(s, bool),
                bits=bits,
                threshold=3,
            )
            row = np.asarray(sa.masked_uploads(jnp.asarray(values), rnd))[0]
            hist += np.bincount(row, minlength=16)
        assert hist.sum() == 64 * d
        chi2 = ((hist - hist.mean()) ** 2 / hist.mean()).sum()
        assert chi2 < cuts, (value, chi2)
        counts.append(hist)
    _, p, _, _ = stats.chi2_contingency(np.stack(counts))
    assert p > 1e-3


# ---------------------------------------------------------------------- (c) Shamir


class _Seeded:
    """A deterministic ``rng`` for share(): ``randbelow`` from a seeded generator."""

    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)

    def randbelow(self, high: int) -> int:
        return self.r.randrange(high)


class _Given:
    """An ``rng`` that returns the coefficients it is given, in order."""

    def __init__(self, values) -> None:
        self.it = iter(values)

    def randbelow(self, high: int) -> int:
        value = next(self.it)
        assert 0 <= value < high
        return value


@settings(max_examples=40, deadline=None)
@given(
    secret=st.binary(min_size=32, max_size=32),
    nt=st.integers(1, 8).flatmap(lambda n: st.tuples(st.just(n), st.integers(1, n))),
    seed=st.integers(0, 2**32),
    data=st.data(),
)
def test_any_t_shares_reconstruct_and_fewer_do_not(secret, nt, seed, data):
    n, t = nt
    shares = sc.share(secret, n, t, rng=_Seeded(seed))
    assert [x for x, _ in shares] == list(range(1, n + 1))
    some = data.draw(st.permutations(shares))[: data.draw(st.integers(t, n))]
    assert sc.reconstruct(some) == secret
    if t > 1:
        with pytest.raises(ValueError, match="fewer than t"):
            sc.reconstruct(some[: t - 1])


@pytest.mark.parametrize(("p", "n", "t"), [(7, 4, 3), (11, 5, 2)])
def test_t_minus_1_shares_have_one_distribution_whatever_the_secret(p, n, t):
    """Exhaustively over GF(p): for every coalition of t - 1 evaluation points, the shares'
    distribution over the random coefficients is uniform on GF(p)^(t-1), the same for every
    secret (Shamir 1979): t - 1 shares say nothing about the secret."""
    for coalition in itertools.combinations(range(n), t - 1):
        laws = set()
        for secret in range(p):
            law = Counter()
            for coefficients in itertools.product(range(p), repeat=t - 1):
                shares = sc.share_int(secret, n, t, prime=p, rng=_Given(coefficients))
                assert sc.reconstruct_int(shares[:t], prime=p) == secret
                law[tuple(shares[i][1] for i in coalition)] += 1
            assert len(law) == p ** (t - 1) and set(law.values()) == {1}
            laws.add(frozenset(law.items()))
        assert len(laws) == 1


# ---------------------------------------------------------------------- (d) keys, bundles


def test_x25519_agreement_is_symmetric_and_hkdf_keys_differ_by_context():
    a_private, a_public = sc.keypair()
    b_private, b_public = sc.keypair()
    assert sc.public_key(a_private) == a_public and a_public != b_public
    assert sc.agree(a_private, b_public) == sc.agree(b_private, a_public)
    ab = sc.agreed_key(a_private, b_public, "mask", 7, 3, 11)
    assert ab == sc.agreed_key(b_private, a_public, "mask", 7, 11, 3)
    others = {
        sc.agreed_key(a_private, b_public, "channel", 7, 3, 11),
        sc.agreed_key(a_private, b_public, "mask", 8, 3, 11),
        sc.agreed_key(a_private, b_public, "mask", 7, 3, 12),
        ab,
    }
    assert len(others) == 4 and all(len(k) == 32 for k in others)
    # RFC 7748 §6.1: a small-order peer key gives the all-zero secret: refused
    with pytest.raises(ValueError, match="small-order"):
        sc.agree(a_private, bytes(32))


def test_share_bundles_are_sealed_per_round_and_direction():
    key = sc.fresh_seed()
    shares = sc.share(sc.fresh_seed(), 5, 3) + sc.share(sc.fresh_seed(), 5, 3)
    sealed = sc.seal_shares(key, 4, 1, 2, shares[:2])
    assert sc.open_shares(key, 4, 1, 2, sealed) == shares[:2]
    for args in ((key, 4, 2, 1), (key, 5, 1, 2), (sc.fresh_seed(), 4, 1, 2)):
        with pytest.raises(ValueError, match="authentication"):
            sc.open_shares(*args, sealed)
    tampered = sealed[:20] + bytes([sealed[20] ^ 1]) + sealed[21:]
    with pytest.raises(ValueError, match="authentication"):
        sc.open_shares(key, 4, 1, 2, tampered)
    assert sc.seal_shares(key, 4, 1, 2, shares[:2]) != sealed  # a fresh nonce each time


def test_a_deployment_round_trip_with_real_keys():
    """Bonawitz's rounds with the real primitives: X25519 mask keys, self seeds shared by
    Shamir, the masked uploads by mask_words; one client drops and the server removes its
    masks from the mask private key reconstructed from t survivors' shares."""
    ids, bits, d, t = [4, 9, 13], 16, 37, 2
    gen = np.random.default_rng(1)
    values = gen.integers(0, 1 << bits, (3, d), dtype=np.uint64)
    keys = {i: sc.keypair() for i in ids}
    seeds = {i: sc.fresh_seed() for i in ids}
    mod = (1 << bits) - 1

    def pair_mask(private: bytes, me: int, other: int) -> np.ndarray:
        key = sc.agreed_key(private, keys[other][1], "mask", 0, me, other)
        m = sc.mask_words(key, d, bits).astype(np.uint64)
        return m if me < other else (mod + 1) - m

    uploads = {}
    for row, i in enumerate(ids):
        acc = values[row] + sc.mask_words(seeds[i], d, bits)
        for j in ids:
            if j != i:
                acc = acc + pair_mask(keys[i][0], i, j)
        uploads[i] = acc & mod
    dropped, alive = 13, [4, 9]
    mask_shares = sc.share(keys[dropped][0], 3, t)
    seed_shares = {i: sc.share(seeds[i], 3, t) for i in alive}
    recovered = sc.reconstruct([mask_shares[0], mask_shares[1]])
    total = sum(uploads[i] for i in alive)
    for i in alive:
        total = total - sc.mask_words(sc.reconstruct(seed_shares[i][1:]), d, bits)
        total = total - ((mod + 1) - pair_mask(recovered, dropped, i))  # what i added
    np.testing.assert_array_equal(total & mod, (values[0] + values[1]) & mod)


# ---------------------------------------------------------------------- (e) one PRG


def test_mask_words_is_the_simulators_prg_and_the_reference_keystream():
    cases = ((0, 37, 32), (1, 37, 8), (2, 300, 20), (4, 301, 16), (5, 40, 10), (6, 45, 13))
    for seed, d, bits in (*cases, (7, 1001, 20), (8, 99, 24), (9, 77, 12)):
        key = jax.random.fold_in(_key(seed), 77)
        raw = sc.key_bytes(key)
        assert sc.key_bytes(key_from_bytes(raw)) == raw
        w, f = sa.fields(bits)  # w words hold f masks: one bit stream, lowest bit first
        assert 32 * w == f * bits and math.gcd(w, f) == 1
        words = np.asarray(jax.random.bits(key, (w * -(-d // f),), jnp.uint32))
        stream = sum(int(x) << (32 * i) for i, x in enumerate(words))  # word 0 lowest
        sim = np.array([(stream >> (bits * i)) % (1 << bits) for i in range(d)])
        np.testing.assert_array_equal(sc.mask_words(raw, d, bits), sim)
        # the RFC 8439 layout directly: 32-bit counter word 12 = 0, then words 13-15
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

        nonce = struct.pack("<IIII", 0, 0, 0, 0x42495453)
        stream = Cipher(algorithms.ChaCha20(raw, nonce), mode=None).encryptor().update(bytes(4 * d))
        np.testing.assert_array_equal(np.frombuffer(stream, "<u4")[: len(words)], words)
    # the simulator's tiles: words 16 first .. 16 (first + per) of jax.random.bits, split
    # into fields; masked uploads then equal the deployment's (tests (a) and (d))
    keys = jax.random.split(_key(3), 5)
    tile = sa._prg_tile(jax.random.key_data(keys), jnp.int32(3), 2)
    full = jax.vmap(lambda k: jax.random.bits(k, (80,), jnp.uint32))(keys)
    np.testing.assert_array_equal(np.asarray(tile), np.asarray(full)[:, 48:80])
    packed = np.asarray(sa._prg_tile(jax.random.key_data(keys), jnp.int32(3), 2, 16))
    halves = np.stack([np.asarray(full)[:, 48:80] & 0xFFFF, np.asarray(full)[:, 48:80] >> 16], -1)
    np.testing.assert_array_equal(packed & 0xFFFF, halves.reshape(5, 64))
    # 20 bits: 5 words hold 8 masks, across word boundaries; 10 blocks = 160 words, 256 masks
    full = np.asarray(jax.vmap(lambda k: jax.random.bits(k, (240,), jnp.uint32))(keys))
    tile = np.asarray(sa._prg_tile(jax.random.key_data(keys), jnp.int32(5), 10, 20))
    assert tile.shape == (5, 256) and sa._tile_width(10, 20) == 256
    row = sum(int(x) << (32 * i) for i, x in enumerate(full[2, 80:240]))
    want = [(row >> (20 * i)) & 0xFFFFF for i in range(256)]
    np.testing.assert_array_equal(tile[2] & 0xFFFFF, want)
    assert sa._tiles(3, 10**6, 20)[0] % 5 == 0  # tiles hold whole groups of 5 words


# ---------------------------------------------------------------------- (f) bad input


def _ok_round(**kw):
    base = dict(ids=[0, 1, 2, 3], selected=[1] * 4, survived=[1] * 4, bits=8, threshold=3)
    base.update(kw)
    ids, sel, surv = base.pop("ids"), base.pop("selected"), base.pop("survived")
    return _round(ids, sel, surv, degree=base.pop("degree", None), **base)


VALUES = jnp.zeros((4, 3), jnp.uint32)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: sa.check_threshold(0, 5), "threshold"),
        (lambda: sa.check_threshold(2, 4), "threshold"),  # no majority
        (lambda: sa.check_threshold(6, 5), "threshold"),
        (lambda: sa.check_threshold(3, 4, colluders=2), "threshold"),
        (lambda: sa.check_threshold(3, 4, colluders=-1), "colluders"),
        (lambda: sa.check_threshold(3.0, 4), "threshold"),
        (lambda: sa.min_degree(0, 1), "cohort"),
        (lambda: sa.masked_uploads(VALUES, _ok_round(bits=0)), "bits"),
        (lambda: sa.masked_uploads(VALUES, _ok_round(bits=33)), "bits"),
        (lambda: sa.masked_uploads(VALUES, _ok_round(threshold=2)), "threshold"),
        (lambda: sa.masked_uploads(VALUES.astype(jnp.int32), _ok_round()), "uint32"),
        (lambda: sa.masked_uploads(VALUES[:3], _ok_round()), "ids"),
        (lambda: sa.masked_uploads(VALUES[0], _ok_round()), r"\(S, d\)"),
        (lambda: sa.masked_uploads(VALUES, _ok_round(ids=[0, 1, 1, 3])), "distinct"),
        (lambda: sa.masked_uploads(VALUES, _ok_round(ids=[0, -1, 2, 3])), r"2\^31"),
        (lambda: sa.masked_uploads(VALUES, _ok_round(degree=3)), "degree"),
        (lambda: sa.unmask_sum(VALUES, _ok_round(degree=0)), "degree"),
        (lambda: sa.unmask_sum(VALUES, "round"), "SecAggRound"),
        (lambda: sa.unmask_sum(VALUES, _ok_round().replace(key=jax.random.key(0))), "ChaCha20"),
        (lambda: sa.secure_sum(VALUES, _ok_round(degree=0)), "degree"),
        (lambda: sa.secure_sum(VALUES.astype(jnp.int32), _ok_round()), "uint32"),
        (lambda: sc.mask_words(b"short", 4, 8), "32 bytes"),
        (lambda: sc.mask_words(bytes(32), 0, 8), "d must"),
        (lambda: sc.mask_words(bytes(32), 4, 33), "bits"),
        (lambda: sc.share(bytes(32), 3, 4), "t must"),
        (lambda: sc.share(bytes(31), 3, 2), "secret"),
        (lambda: sc.reconstruct([(1, 5), (1, 6)]), "distinct"),
        (lambda: sc.reconstruct([]), "non-empty"),
        (lambda: sc.context("mask", 0, 3, 3), "differ"),
        (lambda: sc.context("signing", 0, 3, 4), "purpose"),
        (lambda: sc.agree(bytes(31), bytes(32)), "private"),
        (lambda: sc.unseal(bytes(32), b"x", b""), "sealed"),
        (lambda: sc.key_bytes(jax.random.split(_key(0), 2)), "one ChaCha20 key"),
    ],
)
def test_bad_input_is_refused_in_one_line(call, match):
    with pytest.raises(ValueError, match=match) as info:
        call()
    assert "\n" not in str(info.value)
