"""The client side of distributed discrete noise: rotation, integer grids, Skellam noise and
residues modulo ``2^b``, as jit-able, vmappable functions of one flat vector.

The pipeline a client runs (:class:`swarmjax.privacy.distributed.DistributedDP` composes it)::

    clip -> rotate (randomized DCT, or Hadamard after padding to d = 2^p) -> scale by gamma
         -> conditional randomized rounding -> + Skellam share -> residues mod 2^b

and the server undoes the last steps on the sum (:func:`from_residues`, :func:`unrotate`).

* :func:`rotate` / :func:`unrotate`: ``x -> R D x`` and its inverse, ``D`` the diagonal of
  public random signs and ``R`` orthonormal, so a vector's L2 norm is kept and each of its
  coordinates becomes sub-Gaussian over the signs with variance proxy
  ``sum_i R_ki^2 x_i^2 <= spread ||x||^2 / d`` (Hoeffding), ``spread = d max R_ki^2``
  (:data:`SPREAD`). Two choices of ``R`` (:data:`ROTATIONS`): ``"dct"``, the orthonormal
  DCT-II (``R_ki^2 <= 2 / d``, spread 2), by a real FFT (:func:`dct`), the vector
  zero-padded to the next length of prime factors 2, 3, 5 and 7 only (:func:`smooth_dim`:
  ``d = 1,200,000`` for MNIST's 1,199,882 parameters, +0.01 %; at most +0.8 % from
  ``10^5`` to ``2 x 10^6`` coordinates), where the FFT runs fast; and ``"hadamard"``,
  ``H / sqrt(d)`` with :func:`hadamard` (``log2 d`` butterfly passes; ``d`` a power of
  two, the vector zero-padded to :func:`padded_dim`; spread 1). :func:`rotation_dim` is
  the length a rotation works on, the ``d`` of the accounting, the rounding, the noise
  and the upload. Zero padding keeps the L2 norm.
* :func:`conditional_round`: each coordinate to ``floor(x)`` or ``floor(x) + 1`` with the
  probability that keeps it unbiased, redrawn until the integer vector's L2 norm is within
  ``bound`` (Kairouz, Liu and Steinke 2021, "The Distributed Discrete Gaussian Mechanism",
  section 4.1); after ``tries`` failures the client sends the zero vector. The float32
  norm check has a proven error bound (:func:`sum_error`) and the plan checks against
  :func:`certified_bound` of the accounted sensitivity, so EVERY vector sent has norm at
  most the sensitivity the accounting uses, whatever the input.
* :func:`skellam`: ``Poisson(lam) - Poisson(lam)`` per coordinate (variance ``2 lam``), from
  uniform bits of the key's generator (ChaCha20 for secret runs; JAX's own Poisson sampler
  serves Threefry keys only). Each Poisson value is drawn as its deviation from
  ``floor(lam)``, so the two integer parts cancel and ``lam`` may exceed float32's exact
  integers (``2^24``): inversion of the cdf for ``lam < 10``, Hormann's transformed
  rejection (PTRS, 1993) above, its acceptance test written with Stirling's series in the
  deviation so nothing cancels catastrophically in float32.
* :func:`to_residues` / :func:`from_residues`: int32 values to uint32 words holding them
  modulo ``2^b`` (two's complement wraps exactly, ``2^b`` divides ``2^32``), and a sum of
  residues back to the centred integer in ``[-2^(b-1), 2^(b-1))``.

The sampler's acceptance tests are float32: its pmf equals Poisson's up to float32 rounding
of those tests (``tests/test_distributed_dp.py`` checks it against scipy's pmf); the
accounting assumes exact Skellam noise, and the privacy record says so.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, UInt32

__all__ = [
    "certified_bound",
    "conditional_round",
    "dct",
    "from_residues",
    "hadamard",
    "norm_within",
    "padded_dim",
    "rotate",
    "rotation_dim",
    "rotation_signs",
    "skellam",
    "smooth_dim",
    "sum_error",
    "to_residues",
    "unrotate",
]

_KNUTH_LIMIT = 10.0  # below: inversion of the cdf; at or above: PTRS
_MAX_ROUNDS = 64  # cap on rejection rounds of the vectorised samplers (see _poisson_*)
_BUFFER = 8  # the rejections of m PTRS proposals go to buffers of about m / _BUFFER
_LOOP_LANES = 4096  # from this many lanes down, PTRS's rejections loop in place (_fill)
_SEQUENTIAL_LANES = 1 << 16  # from this many lanes, a vmapped sampler runs one call at a time


def padded_dim(n: int) -> int:
    """The rotation's dimension for ``n`` coordinates: the next power of two (``>= 1``)."""
    if n < 1:
        raise ValueError(f"a vector to rotate needs >= 1 coordinate; got {n}")
    return 1 << (n - 1).bit_length()


_SMOOTH_PRIMES = (2, 3, 5, 7)


def smooth_dim(n: int) -> int:
    """The smallest length ``>= n`` whose prime factors are all 2, 3, 5 or 7 (``n >= 1``):
    the DCT rotation's dimension. XLA's FFT takes such lengths fast and falls back to a
    slower algorithm for a large prime factor (the 10 clients' DCT at MNIST's ``n =
    1,199,882 = 2 x 599,941`` took 2.2-2.5x the time at 1,200,000 = 2^7 3 5^5 or 1,200,500
    = 2^2 5^3 7^4; 2026-11-29, the 2-core AMD EPYC, medians of 5 and 9 under load). Such
    lengths are dense: at most 0.8 % above ``n`` for ``10^5 <= n <= 2 x 10^6``, 2 % from
    ``10^3``."""
    if n < 1:
        raise ValueError(f"a vector to rotate needs >= 1 coordinate; got {n}")
    m = n
    while True:
        r = m
        for p in _SMOOTH_PRIMES:
            while r % p == 0:
                r //= p
        if r == 1:
            return m
        m += 1


@jax.jit
def hadamard(x: Float[Array, " d"]) -> Float[Array, " d"]:
    """``H x`` for the ``d x d`` Walsh-Hadamard matrix of +-1 entries (``d`` a power of
    two): ``log2 d`` butterfly passes, ``O(d log d)``; ``H H = d I``."""
    d = x.shape[-1]
    if d & (d - 1):
        raise ValueError(f"hadamard needs a power-of-two length; got {d}")
    h = 1
    while h < d:
        pairs = x.reshape(-1, 2, h)
        x = jnp.stack([pairs[:, 0] + pairs[:, 1], pairs[:, 0] - pairs[:, 1]], axis=1)
        x = x.reshape(d)
        h *= 2
    return x


@functools.partial(jax.jit, static_argnames="d")
def rotation_signs(key: PRNGKeyArray, d: int) -> Float[Array, " d"]:
    """``(d,)`` the public +-1 diagonal ``D`` of one round's rotation."""
    return jnp.where(jax.random.bits(key, (d,), jnp.uint8) & 1, 1.0, -1.0).astype(jnp.float32)


ROTATIONS = ("dct", "hadamard")
"""The rotations :func:`rotate` offers (module docstring)."""
SPREAD = {"dct": 2.0, "hadamard": 1.0}
"""``d max_ki R_ki^2`` of each rotation: the factor over ``||x||^2 / d`` in the variance
proxy of a rotated coordinate (the DCT-II's rows k >= 1 reach ``2 / d``)."""


def rotation_dim(n: int, rotation: str = "hadamard") -> int:
    """The length ``d`` a rotation of ``n`` coordinates works on (the vector zero-padded to
    it): :func:`smooth_dim` for ``"dct"``, the next power of two for ``"hadamard"``. The one
    definition of ``d``: the accounting, the wrap bound, the rounding, the noise, the masks
    and the upload's bytes all follow it."""
    if rotation not in ROTATIONS:
        raise ValueError(f"rotation must be one of {', '.join(ROTATIONS)}; got {rotation!r}")
    if n < 1:
        raise ValueError(f"a vector to rotate needs >= 1 coordinate; got {n}")
    return smooth_dim(n) if rotation == "dct" else padded_dim(n)


@jax.jit
def dct(x: Float[Array, " d"]) -> Float[Array, " d"]:
    """The orthonormal DCT-II of ``x`` (scipy's ``dct(x, type=2, norm="ortho")``) by one
    real FFT of length ``d`` (Makhoul, "A fast cosine transform in one and two
    dimensions", 1980): ``v`` = the even-indexed entries then the odd-indexed ones
    reversed, ``W_k = exp(-i pi k / 2d) V_k`` for ``V = rfft(v)``; ``X_k = Re W_k`` for
    ``k <= d / 2`` and ``X_{d-k} = -Im W_k`` above (``V`` of a real ``v`` is conjugate
    symmetric), scaled by ``sqrt(2 / d)`` (``X_0`` by ``sqrt(1 / d)``). Half the FFT work
    of ``jax.scipy.fft.dct``'s complex FFT of ``v`` (the 10 clients' rotation at ``d =
    1,200,000``: 0.68x its time, 0.59-0.85x, medians of 7, 2026-11-29, the 2-core AMD
    EPYC under load); equal to it to float32 rounding."""
    d = x.shape[-1]
    v = jnp.concatenate([x[..., ::2], x[..., 1::2][..., ::-1]], axis=-1)
    spectrum = jnp.fft.rfft(v, axis=-1)
    h = spectrum.shape[-1]  # d // 2 + 1
    angle = jnp.arange(h, dtype=jnp.float32) * jnp.float32(-math.pi / (2 * d))
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    re = spectrum.real * cos - spectrum.imag * sin
    im = spectrum.real * sin + spectrum.imag * cos
    out = jnp.concatenate([re, -im[..., 1 : d - h + 1][..., ::-1]], axis=-1)
    scale = jnp.full((d,), math.sqrt(2.0 / d), jnp.float32).at[0].set(math.sqrt(1.0 / d))
    return out * scale


@functools.partial(jax.jit, static_argnames="rotation")
def rotate(
    x: Float[Array, " d"], signs: Float[Array, " d"], rotation: str = "hadamard"
) -> Float[Array, " d"]:
    """``R D x``: an orthonormal rotation (keeps the L2 norm, up to float32 rounding)."""
    if rotation == "dct":
        return dct(x * signs)
    return hadamard(x * signs) / jnp.sqrt(jnp.float32(x.shape[-1]))


@functools.partial(jax.jit, static_argnames="rotation")
def unrotate(
    y: Float[Array, " d"], signs: Float[Array, " d"], rotation: str = "hadamard"
) -> Float[Array, " d"]:
    """The inverse of :func:`rotate`: ``D R^T y``."""
    if rotation == "dct":
        return signs * jax.scipy.fft.idct(y, type=2, norm="ortho")
    return signs * hadamard(y) / jnp.sqrt(jnp.float32(y.shape[-1]))


def sum_error(d: int) -> float:
    """``e`` such that :func:`norm_within` ``(z, bound)`` True certifies ``||z||_2 <= bound
    sqrt(1 + e)`` for any integer ``z`` of ``d`` coordinates: squares rounded once each
    (relative ``2^-24``), summed pairwise over ``L = ceil(log2 d)`` levels (each partial sum
    of non-negative terms rounded once: the computed sum is at least ``(1 - 2^-24)^(L+1)``
    of the exact one), compared with ``bound^2`` rounded once: ``e = (1 + u) / (1 - (L + 1)
    u) - 1`` with ``u = 2^-24``. About ``1.4e-6`` at ``d = 2^21``."""
    u = 2.0**-24
    levels = max(0, (d - 1).bit_length())
    return (1.0 + u) / (1.0 - (levels + 1) * u) - 1.0


@jax.jit
def norm_within(z: Int[Array, " d"], bound: Float[Array, ""]) -> Bool[Array, ""]:
    """Whether the float32 squared norm of the integer vector ``z``, summed pairwise, is at
    most ``bound^2`` (float32): True certifies ``||z||_2 <= bound sqrt(1 + sum_error(d))``
    (:func:`sum_error`)."""
    sq = jnp.square(z.astype(jnp.float32))
    n = 1 << max(0, (sq.shape[-1] - 1).bit_length())
    sq = jnp.pad(sq, (0, n - sq.shape[-1]))
    while sq.shape[-1] > 1:  # pairwise: log2 n levels of exact-order additions
        sq = sq[0::2] + sq[1::2]
    return sq[0] <= jnp.square(jnp.float32(bound))


def certified_bound(sensitivity: Float[Array, ""], d: int) -> Float[Array, ""]:
    """The bound :func:`conditional_round` checks so that every vector it sends has
    ``||z|| <= sensitivity``: ``sensitivity / sqrt(1 + sum_error(d))``, lowered by a few
    float32 roundings more."""
    factor = (1.0 - 2.0**-21) / math.sqrt(1.0 + sum_error(d))
    return jnp.asarray(sensitivity, jnp.float32) * jnp.float32(factor)


def _one_at_a_time(fn: Any, lanes: int) -> Any:
    """``fn`` whose ``vmap`` is a ``lax.map`` (one call after another) when one call works
    on at least :data:`_SEQUENTIAL_LANES` lanes, else ``fn`` itself. The results are the
    same; a large vector already fills the machine, and vmapping the samplers' rejection
    loops, ``nonzero`` buffers and tiled keystreams over a cohort runs them on ``S`` times
    the working set (measured 2026-11-29, the 2-core AMD EPYC, a cohort of 10 at ``d =
    1,199,882``: Skellam 1.45x (1.38-1.57x) and conditional rounding 1.49x (1.23-2.21x)
    slower vmapped than one client at a time, medians of 5)."""
    return jax.custom_batching.sequential_vmap(fn) if lanes >= _SEQUENTIAL_LANES else fn


def conditional_round(
    key: PRNGKeyArray, x: Float[Array, " d"], bound: Float[Array, ""], tries: int
) -> tuple[Int[Array, " d"], Bool[Array, ""]]:
    """``(z, ok)``: ``x`` randomly rounded to integers (``floor(x) + Bernoulli(frac(x))``),
    redrawn up to ``tries`` times until :func:`norm_within` ``bound``; ``z = 0`` and ``ok``
    False when every draw failed (or ``x`` is not finite). Always ``||z|| <= bound sqrt(1 +
    sum_error(d))``: pass :func:`certified_bound` of a sensitivity to stay within it.
    Vmapped over long vectors it runs one vector at a time (:func:`_one_at_a_time`)."""
    fn = _one_at_a_time(lambda k, v, b: _conditional_round(k, v, b, tries), x.shape[-1])
    return fn(key, x, jnp.asarray(bound, jnp.float32))


def _conditional_round(
    key: PRNGKeyArray, x: Float[Array, " d"], bound: Float[Array, ""], tries: int
) -> tuple[Int[Array, " d"], Bool[Array, ""]]:
    finite = jnp.all(jnp.isfinite(x))
    x = jnp.where(finite, x, 0.0)
    low = jnp.floor(x)
    frac = x - low

    def draw(i: Int[Array, ""]) -> Int[Array, " d"]:
        u = jax.random.uniform(jax.random.fold_in(key, i), x.shape, jnp.float32)
        return (low + (u < frac)).astype(jnp.int32)

    def cond(carry: tuple) -> Bool[Array, ""]:
        i, _, ok = carry
        return (i < tries) & ~ok

    def body(carry: tuple) -> tuple:
        i = carry[0]
        new = draw(i)
        return i + 1, new, norm_within(new, bound)

    start = (jnp.int32(0), jnp.zeros(x.shape, jnp.int32), jnp.bool_(False))
    _, z, ok = jax.lax.while_loop(cond, body, start)
    ok = ok & finite
    return jnp.where(ok, z, 0), ok


def _open24(bits: UInt32[Array, "..."]) -> Float[Array, "..."]:
    """Uniform on ``(0, 1]`` in float32 from 24 random bits (the low 24 of ``bits``; never
    0, so logs are finite)."""
    low = bits & jnp.uint32(0xFFFFFF)
    return (low.astype(jnp.float32) + 1.0) * jnp.float32(2.0**-24)


def _uniform_open(key: PRNGKeyArray, shape: tuple[int, ...]) -> Float[Array, "..."]:
    """Uniform on ``(0, 1]`` in float32 (24 random bits of one word each)."""
    return _open24(jax.random.bits(key, shape, jnp.uint32) >> jnp.uint32(8))


def _uniform_pairs(key: PRNGKeyArray, n: int) -> tuple[Float[Array, " n"], Float[Array, " n"]]:
    """``(u, v)``: ``2 n`` independent uniforms on ``(0, 1]`` of 24 bits each (as
    :func:`_uniform_open`) from ``3 ceil(n / 2)`` keystream words instead of ``2 n``: words
    ``a, b, c`` give ``u`` the high 24 bits of ``a`` and of ``b``, ``v`` the high 24 bits of
    ``c`` and the three words' low bytes together (disjoint bits of uniform words: the
    four uniforms are independent)."""
    half = -(-n // 2)
    a, b, c = jax.random.bits(key, (3, half), jnp.uint32)
    eight = jnp.uint32(8)
    low = (a & 0xFF) | ((b & 0xFF) << eight) | ((c & 0xFF) << jnp.uint32(16))
    u = jnp.concatenate([_open24(a >> eight), _open24(b >> eight)])[:n]
    v = jnp.concatenate([_open24(c >> eight), _open24(low)])[:n]
    return u, v


def _poisson_small(key: PRNGKeyArray, lam: Float[Array, ""], shape: tuple[int, ...]) -> Array:
    """Poisson(``lam``) for ``lam < 10`` by inversion: one uniform ``U`` per coordinate and
    the first ``k`` whose cdf reaches it, searched in the table of the first
    :data:`_MAX_ROUNDS` probabilities (normalised; the mass beyond 64 is below ``1e-30`` at
    ``lam = 10``). One pass over the coordinates whatever ``lam`` (a loop until every
    coordinate stops would cost ~30 passes under a batched ``lam``, where ``lax.cond``
    runs both samplers)."""
    k = jnp.arange(_MAX_ROUNDS, dtype=jnp.float32)
    log_pmf = k * jnp.log(jnp.maximum(lam, 1e-30)) - lam - jax.lax.lgamma(k + 1.0)
    cdf = jnp.cumsum(jnp.exp(log_pmf - jnp.max(log_pmf)))
    cdf = cdf / cdf[-1]
    u = _uniform_open(key, shape)
    return jnp.minimum(jnp.searchsorted(cdf, u, side="left"), _MAX_ROUNDS - 1).astype(jnp.int32)


_SERIES = tuple(((-1.0) ** (n + 1)) / n for n in range(2, 13))
"""Coefficients of ``t^2 .. t^12`` in ``log(1 + t) - t``."""
_STIRLING_SMALL = np.asarray(
    [0.0]
    + [
        math.lgamma(k + 1.0) - (k * math.log(k) - k + 0.5 * math.log(2.0 * math.pi * k))
        for k in range(1, 10)
    ],
    np.float32,
)
"""Stirling's remainder ``s(k) = log(k!) - (k log k - k + log(2 pi k) / 2)`` for ``k = 1 ..
9`` (index ``k``; entry 0 unused), computed in float64 and rounded once to float32."""


def _log1p_minus(t: Array) -> Array:
    """``log(1 + t) - t`` without cancellation for small ``|t|``: its series to ``t^12``
    by Horner's rule below ``|t| = 0.25`` (truncation below ``0.25^13 / 13 < 1e-8``
    relative to the leading ``t^2 / 2``), ``log1p(t) - t`` above."""
    acc = jnp.float32(_SERIES[-1])
    for c in reversed(_SERIES[:-1]):
        acc = acc * t + jnp.float32(c)
    return jnp.where(jnp.abs(t) < 0.25, acc * t * t, jnp.log1p(t) - t)


def _stirling(kf: Array, inv: Array) -> Array:
    """Stirling's remainder ``s(k)`` at ``k = kf >= 1`` (``inv = 1 / kf``): its series
    ``1/(12k) - 1/(360k^3) + 1/(1260k^5)`` from ``k = 10`` (error below ``1/(1680 k^7) <
    1e-10``), the float64 table :data:`_STIRLING_SMALL` below."""
    sq = inv * inv
    series = inv * (1.0 / 12.0 - sq * (1.0 / 360.0 - sq * (1.0 / 1260.0)))
    table = jnp.asarray(_STIRLING_SMALL)[jnp.clip(kf, 0.0, 9.0).astype(jnp.int32)]
    return jnp.where(kf >= 10.0, series, table)


def _ptrs(lam: Float[Array, ""]) -> tuple[Array, ...]:
    """PTRS's constants for ``lam >= 10``: ``(floor(lam), frac, b, a, 1/alpha, v_r)``."""
    whole = jnp.floor(lam)
    b = 0.931 + 2.53 * jnp.sqrt(lam)
    return (
        whole,
        lam - whole,
        b,
        -0.059 + 0.02483 * b,
        1.1239 + 1.1328 / (b - 3.4),
        0.9277 - 3.6224 / (b - 2.0),
    )


def _ptrs_propose(
    key: PRNGKeyArray, consts: tuple[Array, ...], lam: Array, n: int
) -> tuple[Int[Array, " n"], Bool[Array, " n"]]:
    """``n`` independent PTRS proposals ``k - floor(lam)`` and whether each is accepted.

    Hormann's test accepts ``k >= 1`` when ``log(v / (alpha (a / us^2 + b))) <= log P(k) =
    k log(lam) - lam - log(k!)``. With ``t = (lam - k) / k`` and Stirling's remainder
    ``s(k)``, ``log P(k) = k (log(1 + t) - t) - log(2 pi k) / 2 - s(k)``, so the test is
    ``log(v sqrt(2 pi k) / (alpha (a / us^2 + b))) <= k (log(1 + t) - t) -
    s(k)`` (:func:`_log1p_minus`, :func:`_stirling`): one logarithm of a product of
    float32 factors each within a few ulps, so the left side is within about ``3e-7`` of
    the exact one, and no term of size ``log k`` is formed and cancelled. ``k = 0``: ``log
    P(0) = -lam``."""
    whole, f, b, a, inv_alpha, v_r = consts
    u, v = _uniform_pairs(key, n)  # 1.5 keystream words a proposal
    u = u - 0.5
    us = 0.5 - jnp.abs(u)
    j = jnp.floor((2.0 * a / us + b) * u + f + 0.43)  # k - floor(lam)
    k = whole + j
    quick = (us >= 0.07) & (v <= v_r)
    reject = (k < 0) | ((us < 0.013) & (v > us))
    kf = jnp.maximum(k, 1.0)
    inv = 1.0 / kf
    pos = k >= 1
    ratio = v * inv_alpha / (a / (us * us) + b)
    lhs = jnp.log(ratio * jnp.where(pos, jnp.sqrt(2.0 * math.pi * kf), 1.0))
    rhs = jnp.where(pos, kf * _log1p_minus((f - j) * inv) - _stirling(kf, inv), -lam)
    return j.astype(jnp.int32), quick | (~reject & (lhs <= rhs))


def _until_accepted(
    key: PRNGKeyArray, propose: Any, dev: Int[Array, " n"], done: Bool[Array, " n"]
) -> Int[Array, " n"]:
    """Fresh proposals for the lanes not ``done`` until every lane has accepted one (at most
    :data:`_MAX_ROUNDS` rounds; ``0.25^64`` of a lane is left with its last proposal). No
    round runs when every lane is done."""
    n = dev.shape[0]

    def cond(carry: tuple) -> Bool[Array, ""]:
        i, _, done = carry
        return (i < _MAX_ROUNDS) & ~jnp.all(done)

    def body(carry: tuple) -> tuple:
        i, dev, done = carry
        j, accept = propose(jax.random.fold_in(key, i), n)
        return i + 1, jnp.where(done, dev, j), done | accept

    return jax.lax.while_loop(cond, body, (jnp.int32(1), dev, done))[1]


def _buffer(n: int) -> int:
    """Lanes of a buffer that takes the rejections among ``n`` proposals: ``n / 8 + 6
    sqrt(n) + 16``. PTRS rejects 0.11 of them from ``lam = 10^4`` (up to 0.247 at ``lam =
    10``; measured, tests/test_distributed_dp.py), so from ``lam = 10^4`` one buffer holds
    them all but with a chance below ``1e-9``; more rejections take one more buffer pass
    each (:func:`_fill`): time only."""
    return min(n, n // _BUFFER + 6 * math.isqrt(n) + 16)


def _fill(
    key: PRNGKeyArray, propose: Any, dev: Int[Array, " m"], done: Bool[Array, " m"]
) -> Int[Array, " m"]:
    """Every lane not ``done`` replaced by the first accepted of fresh i.i.d. proposals.

    The first (up to) :func:`_buffer` open lanes are gathered (``jnp.nonzero``) into a
    buffer, which draws one proposal each and fills its own rejections the same way, an
    eighth the size each level down, until a level of at most :data:`_LOOP_LANES` lanes
    loops in place (:func:`_until_accepted`); while open lanes remain (more rejections than
    a buffer holds: PTRS below ``lam = 10^4``), another pass gathers the next ones. At
    large ``lam`` the proposals drawn add up to about ``8 / 7`` of the first level's lanes
    (the buffers a quarter the size: ``4 / 3``). Which buffer lane serves a coordinate
    depends only on the acceptance of other proposals, never on the values of the
    proposals it receives, so each coordinate still keeps the first accepted of i.i.d.
    proposals (a Poisson draw, independent of the others)."""
    m = dev.shape[0]
    cap = _buffer(m)
    if m <= _LOOP_LANES or cap >= m:
        return _until_accepted(key, propose, dev, done)

    def cond(carry: tuple) -> Bool[Array, ""]:
        i, _, done = carry
        return (i < _MAX_ROUNDS) & ~jnp.all(done)

    def one_pass(carry: tuple) -> tuple:
        i, dev, done = carry
        k = jax.random.fold_in(key, i)
        open_ids = jnp.nonzero(~done, size=cap, fill_value=m)[0]
        j, accept = propose(jax.random.fold_in(k, 0), cap)
        lanes = _fill(jax.random.fold_in(k, 1), propose, j, accept | (open_ids >= m))
        dev = dev.at[open_ids].set(lanes, mode="drop")
        return i + 1, dev, done | (jnp.cumsum(~done) <= cap)  # the lanes served

    return jax.lax.while_loop(cond, one_pass, (jnp.int32(0), dev, done))[1]


def _when(pred: Bool[Array, ""], fn: Any, otherwise: Array) -> Array:
    """``fn()`` if ``pred`` else ``otherwise``, as a ``while_loop`` of at most one trip: under
    ``vmap`` with a batched ``pred`` (runs vmapped over variants) ``fn`` still runs only if
    some lane needs it, where ``lax.cond`` would turn into a ``select`` of both branches."""

    def body(carry: tuple) -> tuple:
        return jnp.bool_(True), fn()

    return jax.lax.while_loop(lambda c: pred & ~c[0], body, (jnp.bool_(False), otherwise))[1]


def _poisson_deviation_large(
    key: PRNGKeyArray, lam: Float[Array, ""], shape: tuple[int, ...]
) -> Int[Array, "..."]:
    """``Poisson(lam) - floor(lam)`` for ``lam >= 10`` by Hormann's PTRS (transformed
    rejection with squeeze); ``lam`` is split as ``L + f`` so the integer part never enters
    float32 arithmetic. One proposal for every coordinate (about 89 % accept at large
    ``lam``, 75 % at ``lam = 10``); the rejected ones are refilled through shrinking
    buffers (:func:`_fill`)."""
    consts = _ptrs(lam)
    n = math.prod(shape)

    def propose(k: PRNGKeyArray, size: int) -> tuple[Array, Array]:
        return _ptrs_propose(k, consts, lam, size)

    first, accept = propose(jax.random.fold_in(key, 0), n)
    return _fill(jax.random.fold_in(key, 1), propose, first, accept).reshape(shape)


def _poisson_deviation(
    key: PRNGKeyArray, lam: Float[Array, ""], shape: tuple[int, ...]
) -> Int[Array, "..."]:
    """``Poisson(lam) - floor(lam)`` (int32): inversion below 10, PTRS above. Each sampler
    runs only when ``lam`` needs it (:func:`_when`), also under a batched ``lam``."""
    lam = jnp.asarray(lam, jnp.float32)
    small = jnp.minimum(lam, _KNUTH_LIMIT - 1e-3)
    large = jnp.maximum(lam, _KNUTH_LIMIT)
    zeros = jnp.zeros(shape, jnp.int32)
    low = _when(
        lam < _KNUTH_LIMIT,
        lambda: _poisson_small(key, small, shape) - jnp.floor(small).astype(jnp.int32),
        zeros,
    )
    high = _when(lam >= _KNUTH_LIMIT, lambda: _poisson_deviation_large(key, large, shape), zeros)
    return jnp.where(lam < _KNUTH_LIMIT, low, high)


def skellam(key: PRNGKeyArray, lam: Float[Array, ""], shape: tuple[int, ...]) -> Int[Array, "..."]:
    """``shape`` int32 draws of ``Sk(lam) = Poisson(lam) - Poisson(lam)`` (mean 0, variance
    ``2 lam``; ``lam = 0`` gives zeros). Sums of independent ``Sk(lam_i)`` are ``Sk(sum
    lam_i)``: a cohort's shares add to one Skellam variable. The two Poisson vectors are
    drawn as one ``(2, *shape)`` batch (one pass of proposals, one chain of buffers).
    Vmapped over long vectors it runs one vector at a time (:func:`_one_at_a_time`)."""

    def draw(key: PRNGKeyArray, lam: Float[Array, ""]) -> Int[Array, "..."]:
        dev = _poisson_deviation(key, lam, (2, *shape))
        return jnp.where(lam > 0, dev[0] - dev[1], 0)

    return _one_at_a_time(draw, math.prod(shape))(key, jnp.asarray(lam, jnp.float32))


def to_residues(z: Int[Array, "..."], bits: int) -> UInt32[Array, "..."]:
    """``z mod 2^bits`` as uint32 words (``1 <= bits <= 32``)."""
    wrapped = jax.lax.bitcast_convert_type(z.astype(jnp.int32), jnp.uint32)
    return wrapped if bits == 32 else wrapped & jnp.uint32((1 << bits) - 1)


def from_residues(total: UInt32[Array, "..."], bits: int) -> Int[Array, "..."]:
    """The centred integer in ``[-2^(bits-1), 2^(bits-1))`` congruent to ``total`` modulo
    ``2^bits`` (int32)."""
    if bits == 32:
        return jax.lax.bitcast_convert_type(total, jnp.int32)
    r = total & jnp.uint32((1 << bits) - 1)
    # r - 2^bits for the upper half, as a uint32 that wraps to the negative int32
    lifted = jnp.where(r >= jnp.uint32(1 << (bits - 1)), r + jnp.uint32(2**32 - 2**bits), r)
    return jax.lax.bitcast_convert_type(lifted, jnp.int32)
