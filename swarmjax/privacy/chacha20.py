"""ChaCha20 as a JAX PRNG: 256-bit typed keys for every random number a private run draws.

JAX's default generator, Threefry-2x32, keys with 64 bits: whoever can guess a run's key
regenerates its noise, and ``2^64`` Threefry evaluations are within reach of a
well-provisioned attacker (about 200 GPU-days).  Noise that must stay secret is therefore
drawn under this implementation instead: the ChaCha20 block function of RFC 8439
(Bernstein's stream cipher, the generator behind Linux's ``/dev/urandom`` and TLS), with
a 256-bit key, as a counter-based generator in the same shape as JAX's Threefry:

- ``random_bits(key, width, shape)``: the key's keystream, block ``i`` at the 64-bit block
  counter ``i`` (words 12-13) under the nonce ``(0, BITS)`` (words 14-15), 16 words a
  block, read in order (64-bit numbers take two consecutive words, low word first);
- ``fold_in(key, x)``: the first 8 words of the block at counter ``x`` under the nonce
  ``(0, FOLD)``, a pseudorandom function of ``x`` keyed by ``key``;
- ``split(key, shape)``: consecutive 8-word groups of the keystream under ``(0, SPLIT)``;
- ``seed(s)``: the first 8 words of the block at counter ``s`` (64 bits) under the all-zero
  key and ``(0, SEED)``: public, for tests and public draws only; secret keys come from
  :class:`swarmjax.privacy.secret.Secret` (operating-system entropy).

Each purpose has its own nonce, so the streams of ``random_bits``, ``split`` and ``fold_in``
of one key never overlap.  The block function is checked against RFC 8439's test vector
and against the ``cryptography`` package's ChaCha20 keystream (``tests/test_chacha20.py``).
Every operation is 32-bit add, xor and rotate, so it vectorises, jits and vmaps like
Threefry; it costs about twice Threefry's arithmetic per word.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.random import define_prng_impl
from jaxtyping import Array, PRNGKeyArray, UInt32

__all__ = ["KEY_WORDS", "block", "chacha20", "fold_rows", "key_from_bytes", "keystream"]

KEY_WORDS = 8
"""Words of a key: 8 x 32 = 256 bits."""

_SIGMA = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)  # "expand 32-byte k"
# Nonce word 15 of each purpose (ASCII tags); word 14 is 0.
_BITS, _FOLD, _SPLIT, _SEED = 0x42495453, 0x464F4C44, 0x53504C54, 0x53454544


def _rotl(x: Array, r: int) -> Array:
    """Rotate 32-bit words left by ``r``: JAX or NumPy uint32 arrays alike (the shift
    counts are Python ints, which take the words' dtype)."""
    return (x << r) | (x >> (32 - r))


def _quarter(a: Array, b: Array, c: Array, d: Array) -> tuple[Array, Array, Array, Array]:
    """The quarter-round, elementwise: on four words, or on four rows of words at once."""
    a = a + b
    d = _rotl(d ^ a, 16)
    c = c + d
    b = _rotl(b ^ c, 12)
    a = a + b
    d = _rotl(d ^ a, 8)
    c = c + d
    b = _rotl(b ^ c, 7)
    return a, b, c, d


_COLUMNS = ((0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15))
_DIAGONALS = ((0, 5, 10, 15), (1, 6, 11, 12), (2, 7, 8, 13), (3, 4, 9, 14))


def _double_round_rows(_: int, rows: tuple[Array, ...]) -> tuple[Array, ...]:
    """A column round then a diagonal round, the state held as four ``(4, n)`` rows (words
    0-3, 4-7, 8-11, 12-15): the four columns are one quarter-round of the rows, and rotating
    rows 2, 3 and 4 left by 1, 2 and 3 words lines the diagonals up as columns."""
    a, b, c, d = _quarter(*rows)
    a, b, c, d = _quarter(a, jnp.roll(b, -1, 0), jnp.roll(c, -2, 0), jnp.roll(d, -3, 0))
    return a, jnp.roll(b, 1, 0), jnp.roll(c, 2, 0), jnp.roll(d, 3, 0)


def _double_round_words(_: int, words: tuple[Array, ...]) -> tuple[Array, ...]:
    """A column round then a diagonal round, the state held as 16 ``(n,)`` words."""
    s = list(words)
    for group in (*_COLUMNS, *_DIAGONALS):
        for i, w in zip(group, _quarter(*(s[i] for i in group)), strict=True):
            s[i] = w
    return tuple(s)


_BULK_BLOCKS = 1024
"""From this many blocks, :func:`block` holds the state as 16 words, else as four rows.
Same bits either way; the choice is speed, measured (docs/testing.md, 2026-11-28, 2-core
Xeon): four rows compile to about half the code (0.43 against 0.99 CPU-seconds for a
vmapped fold_in, split, normal and permutation at the suite's flags), what most programs
with keys pay at many small call sites; 16 words run bulk keystreams 10-25 % faster at
XLA's default flags from 16,384 words on (the rows' rotations copy)."""


def block(
    key: UInt32[Array, "8"],
    counter_lo: UInt32[Array, " n"],
    counter_hi: UInt32[Array, " n"],
    nonce: tuple[int, int],
) -> UInt32[Array, "n 16"]:
    """ChaCha20 blocks (RFC 8439, 20 rounds) of one key at ``n`` counters.

    Args:
        key: ``(8,)`` uint32 key words (little-endian words of the 32-byte key).
        counter_lo, counter_hi: ``(n,)`` state words 12 and 13 (a 64-bit counter).
        nonce: state words 14 and 15.

    Returns:
        ``(n, 16)`` uint32 output words (state after the rounds plus the input state).

    The ten double rounds are a ``fori_loop`` (fully unrolled, XLA's fusion duplicates the
    deep add-xor-rotate graph and compiles for minutes), over the state as four rows below
    :data:`_BULK_BLOCKS` blocks and as 16 words from there on.
    """
    counter_lo = jnp.asarray(counter_lo, jnp.uint32)
    n = counter_lo.shape[0]
    fixed = np.asarray([*_SIGMA, *nonce], np.uint32)[:, None]  # words 0-3 and 14-15
    start = jnp.concatenate(  # (16, n)
        [
            jnp.broadcast_to(fixed[:4], (4, n)),
            jnp.broadcast_to(jnp.asarray(key, jnp.uint32)[:, None], (KEY_WORDS, n)),
            counter_lo[None],
            jnp.broadcast_to(jnp.asarray(counter_hi, jnp.uint32), (1, n)),
            jnp.broadcast_to(fixed[4:], (2, n)),
        ]
    )
    if n >= _BULK_BLOCKS:
        end = jnp.stack(jax.lax.fori_loop(0, 10, _double_round_words, tuple(start)))
    else:
        rows = jax.lax.fori_loop(0, 10, _double_round_rows, tuple(start.reshape(4, 4, n)))
        end = jnp.concatenate(rows)
    return (end + start).T


_TILE_BLOCKS = 4096
"""Blocks per step of a long keystream (:func:`keystream`): the 16 state arrays of a
tile (256 KiB) stay in cache through the 20 rounds, where one pass over a long stream
reads and writes them from memory 20 times. Same bits either way; measured 2026-11-29 on
the 2-core AMD EPYC: 4.8 M words of one key 0.081 s in one pass, 0.017 s in tiles of
4,096 blocks (0.022-0.023 s at 1,024 and 2,048); ten keys vmapped 0.60 s against 0.30 s
(0.25-0.30 s at 512-8,192)."""


def keystream(key: UInt32[Array, "8"], words: int, purpose: int = _BITS) -> UInt32[Array, " w"]:
    """The first ``words`` 32-bit words of ``key``'s keystream under ``(0, purpose)``:
    block ``i`` at the 64-bit counter ``i``, in tiles of :data:`_TILE_BLOCKS` blocks
    (``lax.map``) when the stream is longer than one tile."""
    blocks = max(1, -(-words // 16))
    tiles = -(-blocks // _TILE_BLOCKS)
    if tiles > 1 and tiles * _TILE_BLOCKS <= 2**32:  # counters fit the low word

        def tile(t: Array) -> Array:
            first = t.astype(jnp.uint32) * jnp.uint32(_TILE_BLOCKS)
            lo = first + jnp.arange(_TILE_BLOCKS, dtype=jnp.uint32)
            return block(key, lo, jnp.uint32(0), (0, purpose))

        return jax.lax.map(tile, jnp.arange(tiles, dtype=jnp.int32)).reshape(-1)[:words]
    index = np.arange(blocks, dtype=np.uint64)
    lo = jnp.asarray((index & 0xFFFFFFFF).astype(np.uint32))
    hi = jnp.asarray((index >> 32).astype(np.uint32))
    return block(key, lo, hi, (0, purpose)).reshape(-1)[:words]


def _seed(seed: Array) -> Array:
    seed = jnp.asarray(seed)
    if seed.dtype.itemsize == 8:
        lo = (seed & 0xFFFFFFFF).astype(jnp.uint32)
        hi = (seed >> 32).astype(jnp.uint32)
    else:
        lo, hi = seed.astype(jnp.uint32), jnp.uint32(0)
    zero = jnp.zeros((KEY_WORDS,), jnp.uint32)
    return block(zero, lo[None], jnp.asarray(hi)[None], (0, _SEED))[0, :KEY_WORDS]


def fold_rows(
    keys: np.ndarray[tuple[int, int], np.dtype[np.uint32]],
    words: np.ndarray[tuple[int, int], np.dtype[np.uint32]],
) -> np.ndarray[tuple[int, int], np.dtype[np.uint32]]:
    """``fold_in`` on the host, bit for bit the device's: key ``i`` (row ``i`` of ``keys``,
    ``(n, 8)`` uint32 words) with the words of row ``i`` of ``words`` (``(n, w)`` uint32)
    folded in one after another. NumPy, so deriving a handful of run keys compiles no
    program (a jitted fold compiled for 0.2-0.3 s per shape)."""
    keys = np.asarray(keys, np.uint32).T  # (8, n): word-major, as the device's state
    words = np.asarray(words, np.uint32)
    n = keys.shape[1]
    fixed = [np.full(n, w, np.uint32) for w in (*_SIGMA, 0, _FOLD)]
    zero = np.zeros(n, np.uint32)
    for column in words.T:
        start = (*fixed[:4], *keys, column, zero, *fixed[4:])
        state = start
        for i in range(10):
            state = _double_round_words(i, state)
        keys = np.stack([a + b for a, b in zip(state[:KEY_WORDS], start[:KEY_WORDS], strict=True)])
    return np.ascontiguousarray(keys.T)


def _split(key: Array, shape: tuple[int, ...]) -> Array:
    num = math.prod(shape)
    return keystream(key, num * KEY_WORDS, _SPLIT).reshape(*shape, KEY_WORDS)


def _fold_in(key: Array, data: Array) -> Array:
    data = jnp.asarray(data).astype(jnp.uint32)
    return block(key, data[None], jnp.uint32(0), (0, _FOLD))[0, :KEY_WORDS]


def _random_bits(key: Array, bit_width: int, shape: tuple[int, ...]) -> Array:
    num = math.prod(shape)
    if bit_width == 64:
        pairs = keystream(key, 2 * num).reshape(num, 2).astype(jnp.uint64)
        return (pairs[:, 0] | (pairs[:, 1] << jnp.uint64(32))).reshape(shape)
    words = keystream(key, num).reshape(shape)
    if bit_width == 32:
        return words
    dtype = {8: jnp.uint8, 16: jnp.uint16}[bit_width]
    return (words >> jnp.uint32(32 - bit_width)).astype(dtype)


# Each operation jitted (as JAX's Threefry ones are): a key operation on a concrete key runs
# one program where, evaluated op by op, every op compiled its own (session 30: 788 in the
# suite); inside a traced program the jit is inlined, the same integer ops.
chacha20 = define_prng_impl(
    key_shape=(KEY_WORDS,),
    seed=jax.jit(_seed),
    split=jax.jit(_split, static_argnums=1),
    random_bits=jax.jit(_random_bits, static_argnums=(1, 2)),
    fold_in=jax.jit(_fold_in),
    name="chacha20",
    tag="cc20",
)
"""The JAX PRNG implementation (``jax.random.key(s, impl=chacha20)``,
``jax.random.wrap_key_data(words, impl=chacha20)``)."""


def key_from_bytes(secret: bytes) -> PRNGKeyArray:
    """A typed ChaCha20 key whose 256 bits are ``secret`` (exactly 32 bytes)."""
    if not isinstance(secret, bytes) or len(secret) != 4 * KEY_WORDS:
        raise ValueError(f"a ChaCha20 key is {4 * KEY_WORDS} bytes; got {len(secret)!r}")
    words = np.frombuffer(secret, "<u4").copy()
    return jax.random.wrap_key_data(jax.device_put(words), impl=chacha20)
