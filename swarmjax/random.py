"""Cheap counter-based uniform numbers for swarm coefficients.

PSO needs two uniform numbers per particle (or per coordinate) per iteration.  Drawing them
with ``jax.random`` (Threefry-2x32, 20 rounds) dominates the cost of a 2-D swarm step on a
CPU.  Here a number is a pure function of ``(seed, counter)`` through one 32-bit integer
finaliser ("lowbias32": xor-shift / multiply, twice), i.e. a counter-based generator in the
style of Random123 but with a much shorter mixing function.

Statistical quality: the finaliser has full avalanche (each input bit flips each output bit
with probability ~0.5, bias ~1.7e-4 by its author's measurement) and is a bijection on 32-bit
words, so distinct counters under one seed never collide.  ``tests/test_random.py`` checks
uniformity (Kolmogorov-Smirnov), moments, serial and cross-stream correlation.  The floats
carry 24 random bits.  It is NOT cryptographic and must never drive a privacy mechanism:
votes, PRAM and noise use ``jax.random``.

Streams: a run draws one 32-bit word from its key (``stream_seed``: one Threefry draw);
iteration ``t`` uses ``iteration_seed(seed, t)`` and ``counter`` indexes the numbers within
that iteration, so a run's numbers depend only on its own key (batch invariance).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, UInt32

__all__ = ["hash_uniform", "iteration_seed", "mix32", "stream_seed"]

_GOLDEN = 0x9E3779B9  # odd constant spacing counters across the 32-bit ring


def mix32(x: UInt32[Array, "*shape"]) -> UInt32[Array, "*shape"]:
    """The lowbias32 finaliser: a bijective avalanche mix of 32-bit words."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def stream_seed(key: PRNGKeyArray) -> UInt32[Array, ""]:
    """One 32-bit seed word from a JAX key (a single Threefry draw)."""
    return jax.random.bits(key, (), jnp.uint32)


def iteration_seed(seed: UInt32[ArrayLike, ""], iteration: ArrayLike) -> UInt32[Array, ""]:
    """The seed word of iteration ``iteration`` of a stream seeded ``seed`` (one mix)."""
    seed = jnp.asarray(seed, jnp.uint32)
    return mix32(seed ^ mix32(jnp.asarray(iteration).astype(jnp.uint32) + jnp.uint32(_GOLDEN)))


def hash_uniform(
    seed: UInt32[ArrayLike, ""], counter: UInt32[ArrayLike, "*shape"]
) -> Float[Array, "*shape"]:
    """Uniform float32 in [0, 1) for each ``counter`` under ``seed``.

    ``mix32(mix32(seed) + counter * golden)``: the seed is mixed first so that nearby seeds
    give unrelated streams; counters are spread by an odd constant before the final mix.
    """
    seed = jnp.asarray(seed, jnp.uint32)
    counter = jnp.asarray(counter, jnp.uint32)
    bits = mix32(mix32(seed) + counter * jnp.uint32(_GOLDEN))
    return (bits >> 8).astype(jnp.float32) * jnp.float32(2.0**-24)
