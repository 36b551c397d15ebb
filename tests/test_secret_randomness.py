"""Issue 45: the noise of a release comes from a secret nobody can regenerate.

1. The generator: ChaCha20 (RFC 8439) as a JAX PRNG, checked against the RFC's block test
   vector and against the ``cryptography`` package's keystream for every purpose (bits,
   fold_in, split); it jits and vmaps; its bytes look uniform.
2. Runs: two ``simulate`` calls with the same options and no secret release different
   models; with one supplied secret they are equal bit for bit; a checkpointed run
   interrupted after round 1 and resumed releases what an uninterrupted run under the
   folder's saved secret releases.
3. The attack of the audit: from everything a run publishes (history, seed, settings,
   privacy record and ledger with key fingerprints, the released model) and the clients'
   data, rebuild the run under every secret one can construct from public information (the
   seed as bytes, the settings' digest, the fingerprints, a public ChaCha20 root, the old
   Threefry keys); none reproduces the release, each differs from it by at least noise of
   the claimed scale, while the true secret (held by the test) reproduces it exactly.
4. ``Secret``: hidden repr, owner-only files, one-line refusals, derived children,
   fingerprints.
"""

from __future__ import annotations

import hashlib
import json
import stat
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from swarmjax.fl.algorithms.client_level_dp_fedavg import dp_fedavg
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data import load_dataset
from swarmjax.fl.data.clients import stack_clients
from swarmjax.fl.data.partition import iid_partition
from swarmjax.fl.protocol import RunSpec, Variants, describe, run_keys, variant_identities
from swarmjax.fl.runtime import Execution, simulate
from swarmjax.fl.runtime import simulator as sim
from swarmjax.fl.runtime.checkpoint import SECRET_FILE
from swarmjax.models import mlp
from swarmjax.privacy import chacha20 as cc
from swarmjax.privacy.ledger import Ledger
from swarmjax.privacy.secret import (
    GENERATOR,
    Secret,
    fingerprint,
    fingerprints,
    fold_words,
    joint_fingerprint,
    keys_for_runs,
)
from tests.reproducible import OTHER, SECRET

# ----------------------------------------------------------------- 1. the generator

# RFC 8439, section 2.3.2: key 00..1f, counter 1, nonce 00:00:00:09:00:00:00:4a:00:00:00:00
RFC_KEY = bytes(range(32))
RFC_BLOCK = bytes.fromhex(
    "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
    "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e"
)
# the nonce words 14-15 of each purpose (chacha20.py: word 14 is 0, word 15 an ASCII tag)
BITS, FOLD, SPLIT = int.from_bytes(b"STIB", "little"), 0x464F4C44, 0x53504C54


def _words(data: bytes) -> jnp.ndarray:
    return jnp.asarray(np.frombuffer(data, "<u4").copy())


def _le(words) -> bytes:
    return np.asarray(words, "<u4").tobytes()


def _reference_stream(key: bytes, counter: int, purpose: int, n_bytes: int) -> bytes:
    """The ``cryptography`` package's ChaCha20 keystream (encrypting zeros): its 16-byte
    nonce is state words 12-15, i.e. the 64-bit block counter (little-endian) and the
    nonce words ``(0, purpose)``."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    nonce = struct.pack("<QII", counter, 0, purpose)
    encryptor = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
    return encryptor.update(bytes(n_bytes)) + encryptor.finalize()


def test_the_block_function_is_rfc_8439s():
    assert BITS == 0x42495453  # "BITS", the tag chacha20.py documents
    out = cc.block(
        _words(RFC_KEY), jnp.array([1], jnp.uint32), jnp.uint32(0x09000000), (0x4A000000, 0)
    )
    assert out.shape == (1, 16) and out.dtype == jnp.uint32
    assert _le(out[0]) == RFC_BLOCK
    # the same block from the reference implementation (counter word 12, nonce words 13-15)
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    nonce = struct.pack("<IIII", 1, 0x09000000, 0x4A000000, 0)
    encryptor = Cipher(algorithms.ChaCha20(RFC_KEY, nonce), mode=None).encryptor()
    assert encryptor.update(bytes(64)) == RFC_BLOCK


def test_bits_fold_in_and_split_are_the_reference_keystreams():
    """Every purpose against the ``cryptography`` package, for the RFC key and a secret's
    key: random bits (several blocks, 32-bit words in order), fold_in (the first 8 words of
    the block at counter ``x``) and split (consecutive 8-word groups)."""
    for raw in (RFC_KEY, SECRET._bits):
        key = cc.key_from_bytes(raw)
        words = jax.random.bits(key, (70,), jnp.uint32)  # 4 blocks and a part of a fifth
        assert _le(words) == _reference_stream(raw, 0, BITS, 70 * 4)
        for x in (0, 1, 7, 2**32 - 1):
            folded = jax.random.key_data(jax.random.fold_in(key, x))
            assert _le(folded) == _reference_stream(raw, x, FOLD, 32)
        children = jax.random.key_data(jax.random.split(key, 5))
        assert children.shape == (5, 8)
        assert _le(children.reshape(-1)) == _reference_stream(raw, 0, SPLIT, 5 * 32)
        # from cc._BULK_BLOCKS blocks on, the state is held another way: the same stream
        bulk = 16 * cc._BULK_BLOCKS + 3
        assert _le(jax.random.bits(key, (bulk,), jnp.uint32)) == _reference_stream(
            raw, 0, BITS, 4 * bulk
        )
        # beyond cc._TILE_BLOCKS blocks the stream is generated tile by tile: the same stream
        tiled = 16 * (2 * cc._TILE_BLOCKS) + 5  # two tiles and a part of a third
        assert _le(jax.random.bits(key, (tiled,), jnp.uint32)) == _reference_stream(
            raw, 0, BITS, 4 * tiled
        )
        # 16-bit and 8-bit draws: the high bits of each word
        high = np.asarray(jax.random.bits(key, (9,), jnp.uint16))
        np.testing.assert_array_equal(high, np.asarray(words[:9]) >> 16)
    # a key's streams of different purposes never coincide
    key = SECRET.key()
    assert _le(jax.random.key_data(jax.random.fold_in(key, 0))) != _le(
        jax.random.key_data(jax.random.split(key, 1))[0]
    )


def test_split_fold_in_and_bits_work_under_jit_and_vmap():
    key = SECRET.key()
    eager = (
        jax.random.key_data(jax.random.split(key, 3)),
        jax.random.key_data(jax.random.fold_in(key, 11)),
        jax.random.bits(key, (40,), jnp.uint32),
        jax.random.normal(key, (5,)),
    )

    @jax.jit
    def all_three(k):
        return (
            jax.random.key_data(jax.random.split(k, 3)),
            jax.random.key_data(jax.random.fold_in(k, 11)),
            jax.random.bits(k, (40,), jnp.uint32),
            jax.random.normal(k, (5,)),
        )

    for a, b in zip(eager, all_three(key), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    keys = jax.random.split(key, 4)
    batched = jax.jit(jax.vmap(lambda k, x: jax.random.bits(jax.random.fold_in(k, x), (6,))))(
        keys, jnp.arange(4, dtype=jnp.uint32)
    )
    for i in range(4):
        one = jax.random.bits(jax.random.fold_in(keys[i], i), (6,))
        np.testing.assert_array_equal(np.asarray(batched[i]), np.asarray(one))
    assert len({tuple(np.asarray(r)) for r in batched}) == 4
    assert jax.random.key_impl(keys) == jax.random.key_impl(key)  # children stay ChaCha20


def test_the_host_fold_is_the_devices_fold_in():
    """``fold_words`` (run keys, on the host through ``chacha20.fold_rows``) gives the keys
    of ``jax.random.fold_in`` chained on the device, for words at the 32-bit edges too,
    and refuses a key of another generator."""
    rng = np.random.default_rng(7)
    words = rng.integers(0, 2**32, size=(5, 9), dtype=np.uint32)
    words[0] = 0
    words[1] = 2**32 - 1
    key = SECRET.key()

    @jax.jit
    @jax.vmap
    def chained(row):
        k = key
        for j in range(row.shape[0]):
            k = jax.random.fold_in(k, row[j])
        return jax.random.key_data(k)

    host = fold_words(key, words)
    assert jax.random.key_impl(host) == jax.random.key_impl(key)
    np.testing.assert_array_equal(np.asarray(jax.random.key_data(host)), chained(words))
    with pytest.raises(ValueError, match="folds ChaCha20 keys"):
        fold_words(jax.random.key(0), words)


def test_a_joint_fingerprint_commits_to_the_set_of_keys():
    """A release of several runs is committed to by the joint fingerprint of its runs'
    keys: the same in any order, another with any key changed, added or removed, and never
    a single key's fingerprint."""
    keys = fold_words(SECRET.key(), np.arange(8, dtype=np.uint32).reshape(4, 2))
    prints = fingerprints(keys)
    joint = joint_fingerprint(prints)
    assert len(joint) == 32 and joint == joint_fingerprint(reversed(prints))
    others = {
        joint_fingerprint(prints[:3]),
        joint_fingerprint([*prints[:3], fingerprint(OTHER.key())]),
        joint_fingerprint([*prints, fingerprint(OTHER.key())]),
        joint_fingerprint(prints[:1]),
    }
    assert len(others) == 4 and joint not in others and prints[0] not in others | {joint}


def test_the_bytes_look_uniform():
    """Chi-square of 2^20 bytes over 256 cells, and of the uniforms and normals drawn from
    them: nothing a correct generator would fail (p > 1e-4)."""
    key = jax.random.fold_in(SECRET.key(), 2026)
    raw = np.asarray(jax.random.bits(key, (2**18,), jnp.uint32)).view(np.uint8)
    counts = np.bincount(raw, minlength=256)
    assert stats.chisquare(counts).pvalue > 1e-4
    u = np.asarray(jax.random.uniform(key, (200_000,)))
    assert stats.kstest(u, "uniform").pvalue > 1e-4
    z = np.asarray(jax.random.normal(jax.random.fold_in(key, 1), (200_000,)))
    assert stats.kstest(z, "norm").pvalue > 1e-4
    bits = np.unpackbits(raw[:65536])  # every bit position equally often
    assert abs(bits.mean() - 0.5) < 4 * 0.5 / np.sqrt(bits.size)


# ------------------------------------------------------------------------- 2. runs

MODEL = mlp((8,), 10, (8, 8, 1))
ALG = dp_fedavg(MODEL, training=LocalTraining(batch_size=40), clipping="fixed")
NUM_CLIENTS, Z, CLIP = 4, 2.0, 1.0
SPEC = RunSpec(rounds=2, delta=1e-3, seeds=(7,))
# every client each round (q = 1), server step 1: the released model carries the noise
# z C / (q N) per coordinate and round, summed over rounds
HYPER = dict(sample_rate=1.0, noise_multiplier=Z, initial_clip=CLIP, learning_rate=0.1)
CLAIMED = float(np.sqrt(SPEC.rounds) * Z * CLIP / NUM_CLIENTS)
# Two independent noises differ by sqrt(2) CLAIMED per coordinate (measured 1.01-1.06x of
# it with the training's own differences). The sample std of the model's 610 coordinates
# is within ~3% of that, so 0.8x is more than 6 standard errors below it: fresh secrets
# never trip it, while a regenerated noise leaves 0 (or the snapping grid's ~3%: the
# audit's 0.011 against 0.366).
NOISE_FLOOR = 0.8 * np.sqrt(2) * CLAIMED


@pytest.fixture(scope="module")
def digits():
    data = load_dataset("digits")
    x, y = data.x_train[:160], data.y_train[:160]
    clients = stack_clients(x, y, iid_partition(y, NUM_CLIENTS, seed=0).indices)
    return clients, (data.x_test[:100], data.y_test[:100])


def _grid(clients):
    return Variants.grid(ALG, clients, SPEC, **HYPER)


def _release(clients, test, secret=None, **kw):
    """The tiny DP-FedAvg run (one compiled round per call, shared by every test); ``kw``:
    more of the call's ``Execution`` fields."""
    execution = Execution(rounds_per_call=1, **kw)
    return simulate(ALG, clients, test, _grid(clients), secret=secret, execution=execution)


def _flat(params) -> np.ndarray:
    return np.concatenate([np.asarray(a[0], np.float64).ravel() for a in jax.tree.leaves(params)])


def _same_release(a, b) -> bool:
    return all(
        np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(
            jax.tree.leaves(a.server.params), jax.tree.leaves(b.server.params), strict=True
        )
    )


@pytest.fixture(scope="module")
def fresh(digits):
    """Two calls with the same options and no secret."""
    clients, test = digits
    return _release(clients, test), _release(clients, test)


def test_two_calls_without_a_secret_release_different_models(fresh):
    a, b = fresh
    assert not _same_release(a, b)
    diff = _flat(a.server.params) - _flat(b.server.params)
    assert diff.std() > NOISE_FLOOR  # independent noise in each
    assert a.privacy.key_fingerprints != b.privacy.key_fingerprints
    for res in (a, b):
        assert res.privacy.randomness == {
            "generator": GENERATOR,
            "secret": "entropy",
            "common_random_numbers": False,
            "condition": None,
        }
        assert np.isfinite(res.privacy.final_epsilon).all()
    # the public parts are the same: seed, settings, epsilon
    np.testing.assert_array_equal(a.privacy.epsilon, b.privacy.epsilon)
    assert list(a.history["seed"]) == list(b.history["seed"]) == [7, 7]


def test_two_calls_with_one_supplied_secret_are_equal_bit_for_bit(digits):
    clients, test = digits
    a, b = (_release(clients, test, secret=SECRET) for _ in range(2))
    assert _same_release(a, b)
    assert a.history.equals(b.history)
    assert a.privacy.key_fingerprints == b.privacy.key_fingerprints
    assert a.privacy.randomness["secret"] == "supplied"
    assert "kept" in a.privacy.randomness["condition"]  # the guarantee's condition
    assert "supplied secret" in repr(a.privacy)
    other = _release(clients, test, secret=OTHER)
    assert not _same_release(a, other)


class _Interrupted(Exception):
    pass


def test_an_interrupted_run_resumes_to_the_uninterrupted_release(digits, tmp_path):
    """Checkpoints after every round; the first call stops after round 1 (a callback
    raises while round 2 is reported, before it is saved); the second call resumes from
    the folder (its saved secret included) and releases what an uninterrupted run under
    that secret releases."""
    clients, test = digits
    folder = tmp_path / "ckpt"

    def stop_in_round_two(round_, metrics, runs):
        if round_ == 2:
            raise _Interrupted

    with pytest.raises(_Interrupted):
        _release(clients, test, checkpoint_dir=folder, callbacks=[stop_in_round_two])
    assert (folder / "outputs_1.npz").exists() and not (folder / "outputs_2.npz").exists()
    key_file = folder / SECRET_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    saved = Secret.load(key_file)
    assert saved.source == "entropy"

    resumed = _release(clients, test, checkpoint_dir=folder)
    assert (folder / "outputs_2.npz").exists()
    whole = _release(clients, test, secret=saved)  # uninterrupted, the folder's secret
    assert _same_release(resumed, whole)
    assert resumed.history.equals(whole.history)
    assert resumed.privacy.key_fingerprints == whole.privacy.key_fingerprints
    np.testing.assert_array_equal(resumed.privacy.epsilon, whole.privacy.epsilon)
    assert resumed.privacy.randomness["secret"] == "entropy"
    # another checkpoint folder draws another secret: another release
    elsewhere = _release(clients, test, checkpoint_dir=tmp_path / "other")
    assert Secret.load(tmp_path / "other" / SECRET_FILE) != saved
    assert not _same_release(elsewhere, whole)


# --------------------------------------------------------------------- 3. the attack


def _threefry_run_keys(secret, seeds, identities, common_random_numbers):
    """The keys every run drew before issue 45: ``key(seed)`` (64-bit Threefry) with the
    first 4 words of the release identity folded in. Public: seed and settings only."""
    seeds = [int(s) for s in seeds]
    base = jax.vmap(jax.random.key)(
        jnp.asarray(np.tile(np.asarray(seeds, np.uint32), len(identities)))
    )
    if common_random_numbers:
        return base
    words = np.repeat(np.stack([np.frombuffer(i[:16], "<u4") for i in identities]), len(seeds), 0)

    def fold(key, w):
        for j in range(4):
            key = jax.random.fold_in(key, w[j])
        return key

    return jax.vmap(fold)(base, jnp.asarray(words))


def _public_chacha_run_keys(secret, seeds, identities, common_random_numbers):
    """The new derivation from a public root: ChaCha20's ``seed`` function of the seed (the
    all-zero key), not a secret."""
    root = jax.random.key(int(seeds[0]), impl=cc.chacha20)
    return keys_for_runs(root, seeds, identities, common_random_numbers)


def _public_secrets(alg, variants, published: dict) -> dict[str, Secret]:
    """Every secret an attacker can build from what the run published."""
    seed = int(published["seed"])
    identity = variant_identities(alg, variants)[0]
    settings = json.dumps(describe(alg), sort_keys=True).encode()
    fp = published["key_fingerprints"][0]
    threefry = np.asarray(jax.random.key_data(jax.random.key(seed)), "<u4").tobytes()
    return {
        "seed, 32 bytes little-endian": Secret.from_bytes(seed.to_bytes(32, "little")),
        "seed, 32 bytes big-endian": Secret.from_bytes(seed.to_bytes(32, "big")),
        "seed as text, padded": Secret.from_bytes(str(seed).encode().ljust(32, b"\0")),
        "seed, 16 bytes (hashed)": Secret.from_bytes(seed.to_bytes(16, "little")),
        "the release identity": Secret.from_bytes(identity),
        "sha256 of the settings and seed": Secret.from_bytes(
            hashlib.sha256(settings + str(seed).encode()).digest()
        ),
        "the published key fingerprint": Secret.from_bytes(bytes.fromhex(fp)),
        "the fingerprint as text": Secret.from_bytes(fp.encode()),
        "the Threefry key(seed), padded": Secret.from_bytes(threefry.ljust(32, b"\0")),
        "all zeros": Secret.from_bytes(bytes(32)),
    }


def test_nothing_published_regenerates_the_noise(digits, tmp_path, monkeypatch):
    clients, test = digits
    truth = Secret.generate()  # what a run draws; the test keeps it to show the attack can work
    variants = _grid(clients)
    res = _release(clients, test, secret=truth)

    # what the run publishes: the history (seed included), the released model, the privacy
    # record (key fingerprints) through the ledger; the settings are the code above
    out = tmp_path / "released"
    out.mkdir()
    res.history.to_csv(out / "history.csv", index=False)
    np.savez(out / "model.npz", *[np.asarray(a) for a in jax.tree.leaves(res.server.params)])
    ledger = Ledger(out, "attack")
    ledger.add_result(res, algorithm="dp-fedavg", path=out / "model.npz")
    ledger.write()
    published = {
        "seed": int(res.history["seed"].iloc[0]),
        "key_fingerprints": res.privacy.key_fingerprints,
    }
    assert len(published["key_fingerprints"][0]) == 32
    texts = b"".join(p.read_bytes() for p in sorted(out.iterdir()))
    assert published["key_fingerprints"][0].encode() in texts  # the ledger lists it
    key_words = np.asarray(
        jax.random.key_data(run_keys(truth, [7], variant_identities(ALG, variants), False)), "<u4"
    )
    for secret_form in (truth._bits, truth._bits.hex().encode(), key_words.tobytes()):
        assert secret_form not in texts  # neither the secret nor the run key is published

    released = _flat(res.server.params)
    assert released.size > 500

    def residual(regenerated) -> np.ndarray:
        return released - _flat(regenerated.server.params)

    # the attack can work: with the secret, the rebuilt run IS the release, bit for bit
    assert not np.any(residual(_release(clients, test, secret=truth)))

    ids = variant_identities(ALG, variants)
    for name, candidate in _public_secrets(ALG, variants, published).items():
        fp = fingerprints(run_keys(candidate, [published["seed"]], ids, False))
        assert fp != published["key_fingerprints"], name
        r = residual(_release(clients, test, secret=candidate))
        # what is left is at least the release's own noise (and the rebuilt run's): of the
        # claimed scale, never the grid-sized remainder the old keys left
        assert r.std() > NOISE_FLOOR, (name, r.std(), CLAIMED)
    for name, derivation in (
        ("the pre-issue-45 Threefry keys of the seed", _threefry_run_keys),
        ("ChaCha20 keyed by the public seed", _public_chacha_run_keys),
    ):
        monkeypatch.setattr(sim, "run_keys", derivation)
        rebuilt = _release(clients, test)
        monkeypatch.undo()
        assert rebuilt.privacy.key_fingerprints != published["key_fingerprints"], name
        r = residual(rebuilt)
        assert r.std() > NOISE_FLOOR, (name, r.std(), CLAIMED)


# ---------------------------------------------------------------------- 4. Secret


def test_a_secret_hides_its_bits_and_is_saved_owner_only(tmp_path):
    s = Secret.generate()
    assert s.source == "entropy" and not s.reproducible
    for text in (repr(s), str(s), f"{s}"):
        assert s._bits.hex() not in text and "hidden" in text
        assert s._bits.hex()[:8] not in text
    path = s.save(tmp_path / "deep" / "secret.key")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert Secret.load(path) == s and Secret.load(path).source == "entropy"
    supplied = Secret.from_file(path)  # any file given by the user: reproducible mode
    assert supplied.reproducible
    np.testing.assert_array_equal(jax.random.key_data(supplied.key()), jax.random.key_data(s.key()))
    assert Secret.from_bytes(SECRET._bits) == SECRET  # 32 bytes are used as they are
    assert Secret.generate() != Secret.generate()


def test_bad_secret_files_are_one_line_naming_them(tmp_path):
    short = tmp_path / "short.key"
    short.write_bytes(b"fifteen bytes!!")
    with pytest.raises(ValueError, match="too short") as err:
        Secret.from_file(short)
    assert "\n" not in str(err.value) and str(short) in str(err.value)
    missing = tmp_path / "nowhere" / "secret.key"
    with pytest.raises(ValueError, match="cannot be read") as err:
        Secret.from_file(missing)
    assert "\n" not in str(err.value) and str(missing) in str(err.value)
    with pytest.raises(ValueError, match="cannot be read") as err:
        Secret.from_file(tmp_path)  # a folder
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="too short"):
        Secret.from_bytes(b"0123456789")
    ok = tmp_path / "ok.key"
    ok.write_bytes(b"sixteen bytes!!!")  # 128 bits: the shortest accepted
    assert Secret.from_file(ok).reproducible
    corrupt = tmp_path / "corrupt.key"
    SECRET.save(corrupt)
    corrupt.write_text(corrupt.read_text().replace("supplied", "supplied\nzz"))
    with pytest.raises(ValueError, match="corrupt") as err:
        Secret.load(corrupt)
    assert "\n" not in str(err.value) and str(corrupt) in str(err.value)
    with pytest.raises(ValueError, match="cannot be read"):
        Secret.load(missing)
    with pytest.raises(ValueError, match="secret must be a swarmjax"):
        sim.start(ALG, None, None, None, secret=b"0" * 32)


def test_derive_and_fingerprints(digits):
    a, b = SECRET.derive("call-a"), SECRET.derive("call-b")
    assert a != b and SECRET.derive("call-a") == a and a != SECRET
    assert a.source == "supplied" and Secret.generate().derive("x").source == "entropy"
    assert OTHER.derive("call-a") != a
    with pytest.raises(ValueError, match="label"):
        SECRET.derive("")
    ids = [bytes([i]) * 32 for i in range(3)]
    fps = fingerprints(run_keys(SECRET, [0, 1], ids, False))
    assert len(fps) == 6 and len(set(fps)) == 6
    assert all(len(f) == 32 and int(f, 16) >= 0 for f in fps)
    assert fps == fingerprints(run_keys(SECRET, [0, 1], ids, False))  # a commitment
    assert not set(fps) & set(fingerprints(run_keys(OTHER, [0, 1], ids, False)))
    crn = fingerprints(run_keys(SECRET, [0, 1], ids, True))
    assert crn[:2] == crn[2:4] == crn[4:] and crn[0] != crn[1]
