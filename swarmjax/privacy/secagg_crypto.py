"""Real cryptography for a secure-aggregation deployment (host side).

The simulator (:mod:`swarmjax.privacy.secagg`) derives every secret from one round key;
a deployment needs the real primitives of Bonawitz et al., "Practical Secure Aggregation
for Privacy-Preserving Machine Learning" (CCS 2017, §4, the double-masking protocol). Each
function below is one step of that protocol, built on the ``cryptography`` package (OpenSSL):

- **Round 0, AdvertiseKeys**: every client makes two X25519 key pairs (:func:`keypair`;
  RFC 7748): a *channel* pair, whose agreed keys encrypt the share bundles, and a *mask*
  pair, whose agreed keys seed the pairwise masks. They must be separate: the server
  learns a dropped client's mask private key (to remove its masks), which must not also
  open that client's share bundles.
- **Round 1, ShareKeys**: client ``u`` draws its self-mask seed ``b_u`` (:func:`fresh_seed`,
  32 bytes of OS entropy), splits ``b_u`` and its mask private key into ``t``-of-``n``
  Shamir shares (:func:`share`; the field is ``GF(p)``, ``p = 2^521 - 1``, evaluation
  points ``1..n``) and sends each other client ``v`` its two shares sealed under their
  agreed channel key (:func:`agreed_key` with purpose ``"channel"``, :func:`seal_shares`:
  ChaCha20-Poly1305, RFC 8439, with the round and both ids as associated data).
- **Round 2, MaskedInputCollection**: ``y_u = x_u + PRG(b_u) + sum_v +-PRG(s_uv)`` modulo
  ``2^b`` with ``s_uv = agreed_key(..., "mask", ...)`` and ``PRG = mask_words``: the same
  words as the simulator's ``jax.random.bits`` under a ChaCha20 key with those bytes, so
  a deployment's masks can be checked bit for bit against the simulation.
- **Round 4, Unmasking**: each survivor opens its bundles (:func:`open_shares`) and reveals,
  for every other client, the share of ``b_u`` if ``u`` survived or of ``u``'s mask private
  key if ``u`` dropped, never both; the server :func:`reconstruct` s the secrets from ``t``
  shares and removes the masks.

Key derivation: ``HKDF-SHA256`` (RFC 5869; no salt: X25519 outputs are uniform enough for
HKDF-Extract) of the X25519 shared secret to 32 bytes, with ``info`` naming the protocol
version, the purpose, the round and the two ids in increasing order (:func:`context`), so
both ends derive the same key and no key serves two rounds or two purposes.

Security (what is proven, what is assumed): Shamir's scheme is information-theoretic
(Shamir, "How to share a secret", CACM 1979): any ``t - 1`` shares are uniform whatever the
secret (``tests/test_secagg.py`` checks it exhaustively over a small field). X25519 gives
~128-bit security under the elliptic-curve Diffie-Hellman assumption on Curve25519;
ChaCha20 is assumed a PRF; ChaCha20-Poly1305 is an AEAD under that assumption (RFC 8439).

Not provided here: authentication of the public keys (a PKI or signatures over the round-0
keys; without it a malicious server can impersonate clients in the key agreement),
Bonawitz's round-3 consistency check (signatures on the survivor list against a server
that lies about dropouts), and transport. Private keys here are raw 32-byte strings (what
Shamir shares); keep them out of logs.
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jaxtyping import PRNGKeyArray

from swarmjax.privacy.secagg import fields, split_fields

try:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric.x25519 import (
        X25519PrivateKey,
        X25519PublicKey,
    )
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
except ImportError as exc:  # pragma: no cover - the package comes with flwr and the tests
    raise ImportError(
        "swarmjax.privacy.secagg_crypto needs the 'cryptography' package: pip install "
        "cryptography (it comes with swarmjax[flower])"
    ) from exc

__all__ = [
    "KEY_BYTES",
    "PRIME",
    "agree",
    "agreed_key",
    "context",
    "derive_key",
    "fresh_seed",
    "key_bytes",
    "keypair",
    "mask_words",
    "open_shares",
    "public_key",
    "reconstruct",
    "reconstruct_int",
    "seal",
    "seal_shares",
    "share",
    "share_int",
    "unseal",
]

KEY_BYTES = 32
"""Bytes of every key and seed (256 bits)."""
PRIME = 2**521 - 1
"""The Shamir field's modulus: the Mersenne prime ``M521`` (a 32-byte secret is below it)."""

_PRIME_BYTES = (PRIME.bit_length() + 7) // 8  # 66
_NONCE_BYTES = 12
_LABEL = b"swarmjax/secagg/1\0"
_PURPOSES = ("mask", "channel")
_BITS_NONCE = 0x42495453  # word 15 of jax.random.bits's ChaCha20 state (swarmjax.chacha20)


def _check_bytes(name: str, value: Any, size: int = KEY_BYTES) -> bytes:
    if not isinstance(value, bytes) or len(value) != size:
        got = f"{len(value)} bytes" if isinstance(value, bytes) else type(value).__name__
        raise ValueError(f"{name} must be {size} bytes; got {got}")
    return value


def _check_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    bad = isinstance(value, bool) or not isinstance(value, int | np.integer)
    if bad or value < low or (high is not None and value > high):
        span = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be an integer {span}; got {value!r}")
    return int(value)


# ---------------------------------------------------------------------- keys


def keypair() -> tuple[bytes, bytes]:
    """A fresh X25519 key pair ``(private, public)``, 32 raw bytes each (OS entropy)."""
    private = X25519PrivateKey.generate()
    raw = private.private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    return raw, public_key(raw)


def public_key(private: bytes) -> bytes:
    """The 32-byte X25519 public key of a raw private key."""
    key = X25519PrivateKey.from_private_bytes(_check_bytes("private", private))
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def agree(private: bytes, peer_public: bytes) -> bytes:
    """The X25519 shared secret (32 bytes) of a private key and a peer's public key:
    ``agree(a, B) == agree(b, A)``. A peer key of small order (all-zero secret) is refused
    with a ``ValueError`` (RFC 7748 §6.1)."""
    key = X25519PrivateKey.from_private_bytes(_check_bytes("private", private))
    peer = X25519PublicKey.from_public_bytes(_check_bytes("peer_public", peer_public))
    try:
        return key.exchange(peer)
    except ValueError:
        raise ValueError("peer_public is a small-order point (all-zero shared secret)") from None


def context(purpose: str, round_id: int, id_a: int, id_b: int) -> bytes:
    """HKDF ``info`` for the key of clients ``id_a`` and ``id_b`` (symmetric in them) in
    round ``round_id``, for ``purpose`` ``"mask"`` or ``"channel"``."""
    if purpose not in _PURPOSES:
        raise ValueError(f"purpose must be one of {_PURPOSES}; got {purpose!r}")
    round_id = _check_int("round_id", round_id, 0, 2**64 - 1)
    a = _check_int("id_a", id_a, 0, 2**63 - 1)
    b = _check_int("id_b", id_b, 0, 2**63 - 1)
    if a == b:
        raise ValueError(f"id_a and id_b must differ (a pair of clients); got {a} twice")
    return _LABEL + purpose.encode() + b"\0" + struct.pack("<QQQ", round_id, min(a, b), max(a, b))


def derive_key(shared: bytes, info: bytes) -> bytes:
    """HKDF-SHA256 (RFC 5869) of a shared secret to a 32-byte key for ``info``."""
    _check_bytes("shared", shared)
    if not isinstance(info, bytes) or not info:
        raise ValueError(f"info must be non-empty bytes; got {info!r}")
    kdf = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info)
    return kdf.derive(shared)


def agreed_key(
    private: bytes, peer_public: bytes, purpose: str, round_id: int, my_id: int, peer_id: int
) -> bytes:
    """The 32-byte key two clients agree for ``purpose`` in a round: X25519 then HKDF with
    :func:`context` (both ends get the same key)."""
    info = context(purpose, round_id, my_id, peer_id)
    return derive_key(agree(private, peer_public), info)


def fresh_seed() -> bytes:
    """A self-mask seed ``b_u``: 32 bytes of OS entropy."""
    return secrets.token_bytes(KEY_BYTES)


def key_bytes(key: PRNGKeyArray) -> bytes:
    """The 32 bytes of a typed ChaCha20 JAX key (inverse of
    :func:`swarmjax.privacy.chacha20.key_from_bytes`): to compare simulated seeds with a
    deployment's."""
    words = np.asarray(jax.random.key_data(key))
    if words.shape != (8,) or words.dtype != np.uint32:
        raise ValueError(f"key must be one ChaCha20 key (8 uint32 words); got {words.shape}")
    return words.astype("<u4").tobytes()


# ---------------------------------------------------------------------- the PRG


def mask_words(key: bytes, d: int, bits: int) -> np.ndarray:
    """``(d,)`` uint32: the mask a 32-byte seed expands to, modulo ``2^bits``.

    The words are ChaCha20's keystream (RFC 8439) under ``key`` with the 64-bit block
    counter in state words 12-13 from 0 and the nonce words ``(0, "BITS")`` (the words of
    ``jax.random.bits(key_from_bytes(key), (w,), uint32)`` in the simulator), read as one
    bit stream, lowest bit first: coordinate ``i``'s mask is its bits ``bits i .. bits (i
    + 1) - 1`` (:func:`~swarmjax.privacy.secagg.fields`: ``w`` words hold ``f`` masks
    exactly, ``(1, 2)`` at 16 bits, ``(5, 8)`` at 20), so ``w ceil(d / f)`` words are drawn
    and no random bit is dropped. Computed by OpenSSL (``cryptography``), no loop over
    ``d``; the split into masks is the simulator's
    (:func:`~swarmjax.privacy.secagg.split_fields`, used by its PRG
    :func:`swarmjax.privacy.secagg._prg_tile`).
    """
    _check_bytes("key", key)
    d = _check_int("d", d, 1, 2**32 - 1)
    bits = _check_int("bits", bits, 1, 32)
    w, f = fields(bits)
    nonce = struct.pack("<QII", 0, 0, _BITS_NONCE)
    encryptor = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
    stream = encryptor.update(bytes(4 * w * -(-d // f))) + encryptor.finalize()
    words = np.frombuffer(stream, "<u4").astype(np.uint32)
    return split_fields(words, bits)[:d] & np.uint32((1 << bits) - 1)


# ---------------------------------------------------------------------- Shamir


def _randbelow(rng: Any, high: int) -> int:
    return int(rng.randbelow(high))


def share_int(
    secret: int, n: int, t: int, prime: int = PRIME, rng: Any = secrets
) -> list[tuple[int, int]]:
    """Shamir's ``t``-of-``n`` shares of ``secret`` in ``GF(prime)``: ``(x, f(x))`` for
    ``x = 1..n``, ``f`` of degree ``t - 1`` with ``f(0) = secret`` and the other ``t - 1``
    coefficients uniform (``rng.randbelow``; default the ``secrets`` module).

    ``prime`` must be a prime above ``n`` (not checked for primality: use :data:`PRIME`
    unless testing)."""
    prime = _check_int("prime", prime, 3)
    n = _check_int("n", n, 1, prime - 1)
    t = _check_int("t", t, 1, n)
    secret = _check_int("secret", secret, 0, prime - 1)
    coefficients = [secret] + [_randbelow(rng, prime) for _ in range(t - 1)]
    shares = []
    for x in range(1, n + 1):
        y = 0
        for c in reversed(coefficients):  # Horner: t steps per share
            y = (y * x + c) % prime
        shares.append((x, y))
    return shares


def reconstruct_int(shares: Sequence[tuple[int, int]], prime: int = PRIME) -> int:
    """``f(0)`` of the polynomial of degree ``< len(shares)`` through ``shares`` (Lagrange
    interpolation in ``GF(prime)``): the secret when the shares are ``t`` or more correct
    shares of it; with fewer than ``t`` a value independent of the secret."""
    prime = _check_int("prime", prime, 3)
    if not shares:
        raise ValueError("shares must be a non-empty list of (x, y) pairs; got none")
    xs = [_check_int("share x", x, 1, prime - 1) for x, _ in shares]
    ys = [_check_int("share y", y, 0, prime - 1) for _, y in shares]
    if len(set(xs)) != len(xs):
        raise ValueError(f"share x values must be distinct; got {sorted(xs)}")
    total = 0
    for i, (xi, yi) in enumerate(zip(xs, ys, strict=True)):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * xj % prime
                den = den * (xj - xi) % prime
        total = (total + yi * num * pow(den, -1, prime)) % prime
    return total


def share(secret: bytes, n: int, t: int, rng: Any = secrets) -> list[tuple[int, int]]:
    """``t``-of-``n`` Shamir shares of a 32-byte secret over ``GF(2^521 - 1)``."""
    value = int.from_bytes(_check_bytes("secret", secret), "big")
    return share_int(value, n, t, PRIME, rng)


def reconstruct(shares: Sequence[tuple[int, int]]) -> bytes:
    """The 32-byte secret from ``t`` or more of its shares. Fewer than ``t`` shares (or a
    corrupted one) interpolate to a uniform field element, which exceeds ``2^256`` except
    with probability ``2^-265``: refused with a ``ValueError``."""
    value = reconstruct_int(shares, PRIME)
    if value >= 1 << (8 * KEY_BYTES):
        raise ValueError("shares do not reconstruct a 32-byte secret (fewer than t, or corrupt)")
    return value.to_bytes(KEY_BYTES, "big")


# ---------------------------------------------------------------------- sealed bundles


def seal(key: bytes, plaintext: bytes, associated: bytes) -> bytes:
    """ChaCha20-Poly1305 (RFC 8439) of ``plaintext`` under a 32-byte key, authenticating
    ``associated``: a fresh random 12-byte nonce, then the ciphertext and 16-byte tag."""
    _check_bytes("key", key)
    if not isinstance(plaintext, bytes) or not isinstance(associated, bytes):
        raise ValueError("plaintext and associated must be bytes")
    nonce = secrets.token_bytes(_NONCE_BYTES)
    return nonce + ChaCha20Poly1305(key).encrypt(nonce, plaintext, associated)


def unseal(key: bytes, sealed: bytes, associated: bytes) -> bytes:
    """The plaintext of :func:`seal`'s output; ``ValueError`` if it fails authentication
    (wrong key, tampered bytes, or other associated data)."""
    _check_bytes("key", key)
    if not isinstance(sealed, bytes) or len(sealed) < _NONCE_BYTES + 16:
        raise ValueError("sealed must be bytes from seal() (nonce, ciphertext and tag)")
    nonce, body = sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:]
    try:
        return ChaCha20Poly1305(key).decrypt(nonce, body, associated)
    except InvalidTag:
        raise ValueError("sealed bundle failed authentication (key, bytes or context)") from None


def _bundle_context(round_id: int, sender: int, receiver: int) -> bytes:
    round_id = _check_int("round_id", round_id, 0, 2**64 - 1)
    sender = _check_int("sender", sender, 0, 2**63 - 1)
    receiver = _check_int("receiver", receiver, 0, 2**63 - 1)
    return _LABEL + b"shares\0" + struct.pack("<QQQ", round_id, sender, receiver)


def seal_shares(
    key: bytes, round_id: int, sender: int, receiver: int, shares: Sequence[tuple[int, int]]
) -> bytes:
    """Seal ``shares`` (``(x, y)`` pairs of ``GF(2^521 - 1)``) from ``sender`` to
    ``receiver`` under their agreed channel key; the round and the direction are
    authenticated, so a bundle cannot be replayed to another client or round."""
    body = b"".join(
        struct.pack("<I", _check_int("share x", x, 1, 2**32 - 1))
        + _check_int("share y", y, 0, PRIME - 1).to_bytes(_PRIME_BYTES, "little")
        for x, y in shares
    )
    return seal(key, body, _bundle_context(round_id, sender, receiver))


def open_shares(
    key: bytes, round_id: int, sender: int, receiver: int, sealed: bytes
) -> list[tuple[int, int]]:
    """The shares of :func:`seal_shares` (``ValueError`` if not authentic)."""
    body = unseal(key, sealed, _bundle_context(round_id, sender, receiver))
    size = 4 + _PRIME_BYTES
    if len(body) % size:
        raise ValueError(f"a share bundle is a whole number of {size}-byte shares")
    return [
        (
            struct.unpack("<I", body[i : i + 4])[0],
            int.from_bytes(body[i + 4 : i + size], "little"),
        )
        for i in range(0, len(body), size)
    ]
