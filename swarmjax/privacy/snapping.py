"""Snapped Gaussian and Laplace mechanisms: noised releases whose output set does not depend
on the secret (the defence against Mironov's floating-point attack).

The attack (Mironov 2012): a float32 ``x + noise`` can only take the values ``x + n`` for the
finitely many float32 noise values ``n`` the sampler produces, each rounded at ``x``'s
exponent, so the set of possible outputs, and the low bits of each output, depend on ``x``.
An observer of one exact output can then tell neighbouring secrets apart far beyond what
epsilon says.  The snapped mechanisms here release instead

    ``grid * clip(round_half_up((clamp(x) + noise) / grid), -J, J)``,   ``J = floor(bound / grid)``

with ``clamp(x)`` the secret clipped to ``[-bound, bound]`` (non-finite values become
``bound``, as :func:`swarmjax.privacy.mechanisms.bounded`) and ``grid`` a power of two.  Every
output lies in ``{grid * j : |j| <= J}`` whatever the secret, and the rounding is decided
EXACTLY for the real number ``x + noise`` (error-free transformations, no float32 addition
error), so what the output reveals is a function of ``x + noise`` alone.

Pieces:

* a high-precision sampler (:func:`standard_normal`, :func:`standard_laplace`): a uniform
  ``f`` on ``(0, 1/2)`` held at full relative precision down to ``2^-66`` (64 leading-zero
  bits pick the binade, 22 further bits the position in it: three 32-bit words per sample in
  float32), then ``|Z| = -ndtri(f)`` or ``|L| = -log(2 f)``, and a sign bit.  Tails reach
  ``9.16`` standard deviations (Gaussian) and ``44.4`` scales (Laplace); beyond that lies
  probability ``2^-64`` per sample, charged as delta.
* the grid rule (:func:`snapping_grid`): the largest power of two ``<= std / 8`` (rounding then
  adds at most ``std^2 / 768`` to the variance), and at least ``4`` float ulps of ``bound`` (so
  every cell midpoint and ``J`` are exact).
* the privacy statement (:func:`snapping_cost`, :func:`snapped_epsilon_delta`): the snapped
  mechanism with EXACT noise is post-processing of the plain Gaussian/Laplace mechanism on
  ``clamp(x)`` (clamping is 1-Lipschitz per coordinate, so the sensitivities hold).  The
  finite-precision sampler moves every cell's probability by a factor within ``1 +- r``, plus
  ``2^-63`` in total for the tails; per coordinate and release that costs
  ``log((1 + r) / (1 - r))`` of epsilon and ``2^-63`` of delta (``docs/floating_point.md``).

All functions are pure in an explicit key and work under ``jit`` and ``vmap``.  The arithmetic
is float32, or float64 when asked for (``dtype=jnp.float64``, which needs ``jax_enable_x64``):
the float64 sampler uses four words per sample and 51 position bits.  In float32 the cost is
``4.4e-4`` of epsilon per coordinate-release (Gaussian, grid ``std / 12.8``): negligible for a
few scalars, prohibitive for a 1.2 M-coordinate sum; in float64 it is ``8.2e-13``, which
certifies that sum too (``docs/floating_point.md``).

``sampling._exponential_from_bits`` (46 bits) is not reused: its tail beyond ``2^-47`` per
sample is far too heavy a delta for ``10^8`` coordinate-releases, and its float32 sum
``hi + frac`` merges neighbouring atoms unevenly, which the per-cell bound would have to track.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import ndtri
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, PyTree, UInt32
from scipy import special

from swarmjax._validation import check_choice, check_int, check_range
from swarmjax.privacy.mechanisms import _noise_dtype, _out_dtype, bounded

__all__ = [
    "GAUSSIAN_REACH",
    "LAPLACE_REACH",
    "TAIL_PROBABILITY",
    "SnappingCost",
    "laplace_from_bits",
    "normal_from_bits",
    "snapped_epsilon_delta",
    "snapped_gaussian_mechanism",
    "snapped_laplace_mechanism",
    "snapping_cost",
    "snapping_grid",
    "standard_laplace",
    "standard_normal",
    "words_per_sample",
]

Noise = Literal["gaussian", "laplace"]

# ----------------------------------------------------------------------------------------
# Constants of the sampler and of the bound
# ----------------------------------------------------------------------------------------

_BINADE_BITS = 64  # leading zeros counted over two words: binades 0..63, 64 is the tail lump
TAIL_PROBABILITY = 2.0**-_BINADE_BITS  # P(f < 2^-65): the sampler's tail, per sample
#: Largest |Z| (standard deviations) the sampler resolves: ``-ndtri(2^-65)``.
GAUSSIAN_REACH = float(-special.ndtri(2.0**-65))
#: Largest |L| (Laplace scales) the sampler resolves: ``-log(2 * 2^-65) = 64 ln 2``.
LAPLACE_REACH = 64.0 * math.log(2.0)
GRID_FRACTION = 8  # grid <= std / 8
GRID_ULPS = 4  # grid >= 4 ulps of bound: cell midpoints (j + 1/2) grid exact for |j| <= J + 1
# Budget for the error of the float special function at an atom, in units of
# ``unit * (|value| + 1)``.  Measured exhaustively over all 65 * 2^22 float32 atoms on XLA:CPU:
# ndtri 4.5 (-O0) / 3.9 (-O2), the Laplace formula 1.8; float64, on 197,600 atoms against
# mpmath: 4.2 and 1.7 (docs/floating_point.md).  The budgets leave about 1.7x room.
_FUNCTION_ERROR = {"gaussian": 8.0, "laplace": 3.0}
_LN2_HI = {4: 0.693145751953125, 8: 6.93147180369123816490e-01}  # few bits: k * hi is exact
_LN2_LO = {4: 1.428606765330187e-06, 8: 1.90821492927058770002e-10}


@dataclass(frozen=True)
class _Precision:
    """The sampler's layout for one float type: 32-bit words per sample, position bits in a
    binade, unit roundoff, significand bits."""

    dtype: jnp.dtype
    words: int
    position_bits: int
    unit: float
    significand_bits: int


_F32 = _Precision(jnp.dtype(jnp.float32), 3, 22, 2.0**-24, 24)
_F64 = _Precision(jnp.dtype(jnp.float64), 4, 51, 2.0**-53, 53)


def _precision(dtype: jnp.dtype | type | None, *, device: bool = True) -> _Precision:
    """The layout for ``dtype`` (float32 or float64); on the ``device``, float64 needs
    ``jax_enable_x64``."""
    dt = np.dtype(np.float32 if dtype is None else dtype)
    if dt == np.float32:
        return _F32
    if dt == np.float64:
        if device and not jax.config.jax_enable_x64:
            raise ValueError("dtype float64 needs jax_enable_x64 (jax.config or jax.enable_x64)")
        return _F64
    raise ValueError(f"dtype must be float32 or float64; got {dt}")


def words_per_sample(dtype: jnp.dtype | type = jnp.float32) -> int:
    """32-bit random words per sample: 3 in float32, 4 in float64."""
    return _precision(dtype, device=False).words


# ----------------------------------------------------------------------------------------
# The high-precision sampler
# ----------------------------------------------------------------------------------------


def _binade(words: UInt32[Array, " words *s"]) -> Array:
    """Leading zeros of the 64-bit word pair ``(words[0], words[1])``: ``G`` in ``[0, 64]``,
    ``P(G = g) = 2^-(g+1)`` for ``g < 64``, int32 of shape ``*s``."""
    first = jax.lax.clz(words[0]).astype(jnp.int32)
    second = jax.lax.clz(words[1]).astype(jnp.int32)
    return jnp.where(words[0] != 0, first, 32 + second)


def _position(words: UInt32[Array, " words *s"], prec: _Precision) -> Array:
    """``M = 1 + (m + 1/2) 2^-p`` in ``(1, 2)``: the midpoint of bin ``m`` of ``2^p`` equal bins
    of a binade (``p`` = 22 or 51 position bits, exact in the float type)."""
    if prec.words == 3:
        m = (words[2] >> 10).astype(prec.dtype)
    else:
        high = words[2].astype(jnp.uint64) << 19
        m = (high | (words[3] >> 13).astype(jnp.uint64)).astype(prec.dtype)
    return 1.0 + (m + 0.5) * prec.dtype.type(2.0**-prec.position_bits)


def _negative(words: UInt32[Array, " words *s"], prec: _Precision) -> Array:
    """The sign bit: bit 0 of the last word."""
    return (words[prec.words - 1] & 1) == 1


def _power_of_two(exponent: Array, prec: _Precision) -> Array:
    """``2^exponent`` built from its bit pattern (exact; ``exponent`` int32 in the normal
    range)."""
    if prec.words == 3:
        bits = (exponent + 127).astype(jnp.int32) << 23
        return jax.lax.bitcast_convert_type(bits, jnp.float32)
    bits = (exponent.astype(jnp.int64) + 1023) << 52
    return jax.lax.bitcast_convert_type(bits, jnp.float64)


def _check_words(words: ArrayLike, prec: _Precision) -> Array:
    """``words`` as a uint32 array with ``words_per_sample`` rows."""
    words = jnp.asarray(words)
    if words.dtype != jnp.uint32 or words.ndim < 1 or words.shape[0] != prec.words:
        raise ValueError(
            f"words must be uint32 of shape ({prec.words}, ...) for {prec.dtype}; "
            f"got {words.dtype} {words.shape}"
        )
    return words


@functools.partial(jax.jit, static_argnames="dtype")
def normal_from_bits(
    words: UInt32[ArrayLike, " words *s"], dtype: jnp.dtype | type = jnp.float32
) -> Float[Array, "*s"]:
    """Standard normals from raw bits: ``words_per_sample(dtype)`` uint32 words per sample.

    ``f = M 2^-(G+2)`` is the midpoint of one of ``2^p`` equal bins of binade ``G`` of
    ``(0, 1/2)`` (:func:`_binade`, :func:`_position`), i.e. a uniform on ``(0, 1/2)`` resolved to
    relative width ``2^-p`` everywhere down to ``2^-65``; ``|Z| = -ndtri(f)``, so
    ``P(|Z| >= z) = 2 Phi(-z)`` to that resolution; bit 0 of the last word is the sign.  The
    all-zero pattern gives the largest value, ``9.23`` (binade 64, the tail lump).
    """
    prec = _precision(dtype)
    words = _check_words(words, prec)
    f = _position(words, prec) * _power_of_two(-(_binade(words) + 2), prec)
    magnitude = -ndtri(f)
    return jnp.where(_negative(words, prec), -magnitude, magnitude)


@functools.partial(jax.jit, static_argnames="dtype")
def laplace_from_bits(
    words: UInt32[ArrayLike, " words *s"], dtype: jnp.dtype | type = jnp.float32
) -> Float[Array, "*s"]:
    """Standard Laplace samples (density ``exp(-|l|) / 2``) from raw bits, as
    :func:`normal_from_bits`: ``|L| = -log(2 f) = (G + 1) ln 2 - log(M)``.

    ``ln 2`` is split so that ``(G + 1) * hi`` is exact; the result's error is at most
    ``1.8`` units of roundoff times ``|L| + 1`` (measured on every float32 atom).
    """
    prec = _precision(dtype)
    words = _check_words(words, prec)
    k = (_binade(words) + 1).astype(prec.dtype)
    size = prec.dtype.itemsize
    magnitude = (k * _LN2_HI[size] - jnp.log(_position(words, prec))) + k * _LN2_LO[size]
    return jnp.where(_negative(words, prec), -magnitude, magnitude)


_CHUNK = 1 << 16  # samples per random-bits call: XLA:CPU's Threefry slows down on big calls


def _draw(key: PRNGKeyArray, shape: tuple[int, ...], prec: _Precision, from_bits) -> Array:
    """``from_bits`` applied to fresh words for ``prod(shape)`` samples.

    Up to ``2^16`` samples: one ``jax.random.bits`` call with ``key``.  More: chunks of
    ``2^16`` samples, chunk ``i`` from ``fold_in(key, i)``, in a ``lax.map`` (on a CPU one call
    for 3.6 M words took ~50 ms, 19 calls of 196,608 words with ndtri ~25 ms).  The draw is a
    fixed function of ``key`` and ``shape``.
    """
    n = math.prod(shape)
    if n <= _CHUNK:
        words = jax.random.bits(key, (prec.words, n), jnp.uint32)
        return from_bits(words, prec.dtype).reshape(shape)

    def chunk(i: Array) -> Array:
        words = jax.random.bits(jax.random.fold_in(key, i), (prec.words, _CHUNK), jnp.uint32)
        return from_bits(words, prec.dtype)

    chunks = jax.lax.map(chunk, jnp.arange(-(-n // _CHUNK), dtype=jnp.uint32))
    return chunks.reshape(-1)[:n].reshape(shape)


@functools.partial(jax.jit, static_argnames=("shape", "dtype"))
def standard_normal(
    key: PRNGKeyArray, shape: tuple[int, ...] = (), dtype: jnp.dtype | type = jnp.float32
) -> Float[Array, "*shape"]:
    """``N(0, 1)`` samples of ``shape`` with tails to ``9.16`` sigma (:func:`normal_from_bits`,
    words from :func:`_draw`)."""
    return _draw(key, tuple(shape), _precision(dtype), normal_from_bits)


@functools.partial(jax.jit, static_argnames=("shape", "dtype"))
def standard_laplace(
    key: PRNGKeyArray, shape: tuple[int, ...] = (), dtype: jnp.dtype | type = jnp.float32
) -> Float[Array, "*shape"]:
    """Standard Laplace samples of ``shape`` with tails to ``44.4`` scales
    (:func:`laplace_from_bits`, words from :func:`_draw`)."""
    return _draw(key, tuple(shape), _precision(dtype), laplace_from_bits)


# ----------------------------------------------------------------------------------------
# The grid
# ----------------------------------------------------------------------------------------


def _is_concrete(*values: object) -> bool:
    """True when no value is a JAX tracer (so it can be checked on the host)."""
    return not any(isinstance(v, jax.core.Tracer) for v in values)


def _floor_power_of_two(value: np.ndarray) -> np.ndarray:
    """The largest power of two ``<= value`` (elementwise, positive finite float64)."""
    _, exponent = np.frexp(value)  # value = mantissa 2^exponent, mantissa in [0.5, 1)
    return np.ldexp(1.0, exponent - 1)


def _min_grid(bound: np.ndarray, prec: _Precision) -> np.ndarray:
    """``GRID_ULPS`` ulps of ``bound`` in the float type: the finest grid whose cell midpoints
    up to ``bound`` are exact."""
    ulp = np.ldexp(1.0, np.frexp(bound)[1] - prec.significand_bits)
    return GRID_ULPS * ulp


def _check_magnitude(name: str, value: ArrayLike, prec: _Precision) -> np.ndarray:
    """``value`` positive, finite and far from the float type's over- and underflow."""
    limit = 2.0 ** (prec.significand_bits * 4)  # 2^96 (float32) / 2^212 (float64)
    check_range(name, value, 1.0 / limit, limit)
    return np.asarray(value, np.float64)


def snapping_grid(
    bound: ArrayLike, std: ArrayLike, dtype: jnp.dtype | type = jnp.float32
) -> float | np.ndarray:
    """The default grid: the largest power of two ``<= min(std / 8, bound)``.

    ``std`` is the noise's standard deviation (``sqrt(2) * scale`` for Laplace).  Fine
    relative to the noise: the grid is in ``(std / 16, std / 8]``, so rounding adds at most
    ``grid^2 / 12 <= std^2 / 768`` of variance.  Coarse relative to the float type: it must
    be at least ``4`` ulps of ``bound`` (between ``bound * 2^-22`` and ``bound * 2^-21`` in
    float32), so that every cell midpoint ``(j + 1/2) grid`` with ``|j| <= J + 1`` is exact;
    the rounding itself is exact whatever the grid (:func:`_snap`), so no coarser grid is
    needed.  Raises
    ``ValueError`` when no power of two fits, i.e. when ``bound / std`` exceeds about
    ``2^19`` (float32).  Elementwise for arrays.
    """
    prec = _precision(dtype, device=False)
    b = _check_magnitude("bound", bound, prec)
    s = _check_magnitude("std", std, prec)
    b, s = np.broadcast_arrays(b, s)
    grid = _floor_power_of_two(np.minimum(s / GRID_FRACTION, b))
    finest = _min_grid(b, prec)
    if np.any(grid < finest):
        i = np.argmax(grid < finest)
        raise ValueError(
            f"bound must be at most about 2^{prec.significand_bits - 5} * std: no power-of-two "
            f"grid lies between {GRID_ULPS} {prec.dtype} ulps of bound and std / "
            f"{GRID_FRACTION}; got bound={b.flat[i]!r}, std={s.flat[i]!r}"
        )
    return float(grid) if grid.ndim == 0 else grid


def _check_grid(grid: ArrayLike, bound: ArrayLike, prec: _Precision) -> None:
    """A given grid: powers of two, ``<= bound`` and ``>= 4`` ulps of ``bound``."""
    g = _check_magnitude("grid", grid, prec)
    b = np.asarray(bound, np.float64)
    if np.any(np.frexp(g)[0] != 0.5):
        raise ValueError(f"grid must be a power of two (2^k); got {grid!r}")
    g, b = np.broadcast_arrays(g, b)
    if np.any(g > b) or np.any(g < _min_grid(b, prec)):
        raise ValueError(
            f"grid must be between {GRID_ULPS} ulps of bound and bound ({prec.dtype}); "
            f"got grid={grid!r}, bound={bound!r}"
        )


def _grid_in_graph(bound: Array, std: Array, prec: _Precision) -> Array:
    """:func:`snapping_grid` for traced arguments (no error possible: a grid finer than 4 ulps
    of ``bound`` is raised to that)."""
    _, e_std = jnp.frexp(jnp.minimum(std / GRID_FRACTION, bound))
    _, e_bound = jnp.frexp(bound)
    exponent = jnp.maximum(e_std - 1, e_bound - prec.significand_bits + 2)
    return _power_of_two(exponent.astype(jnp.int32), prec)


def _resolve_grid(grid: ArrayLike | None, bound: ArrayLike, std: ArrayLike, prec: _Precision):
    """The grid to use: checked on the host when concrete, computed in the graph otherwise."""
    if grid is not None:
        if _is_concrete(grid, bound):
            _check_grid(grid, bound, prec)
        return jnp.asarray(grid, prec.dtype)
    if _is_concrete(bound, std):
        return jnp.asarray(snapping_grid(bound, std, prec.dtype), prec.dtype)
    return _grid_in_graph(jnp.asarray(bound, prec.dtype), jnp.asarray(std, prec.dtype), prec)


# ----------------------------------------------------------------------------------------
# Exact snapping
# ----------------------------------------------------------------------------------------


def _at_least(x: Array, noise: Array, c: Array) -> Array:
    """``[x + noise >= c]`` decided exactly, with additions only.

    ``c - x = d + rest`` exactly (TwoSum), so the test is ``noise - d >= rest``.  When
    ``noise`` and ``d`` are within a factor 2, ``noise - d`` is exact (Sterbenz); otherwise
    ``|noise - d| >= |d| / 2`` dwarfs ``|rest| <= ulp(d) / 2`` and rounding cannot flip the
    comparison.  If the compiler fuses ``noise = std * z`` into ``fma(std, z, -d)`` (XLA:CPU
    at -O2 does), the test is the exact one for ``std * z`` unrounded, up to a relative
    ``unit^2``: either way it is exact for some noise within one rounding of ``std * z``.
    """
    d = c - x
    virtual = d - c
    rest = (c - (d - virtual)) + (-x - virtual)
    return (noise - d) >= rest


def _snap(x: Array, noise: Array, grid: Array, bound: Array) -> Array:
    """``grid * clip(floor((x + noise) / grid + 1/2), -J, J)`` for the REAL ``x + noise``.

    ``x`` is the clamped secret, ``|x| <= bound``.  ``s = x + noise`` rounded gives the nearest
    index ``j0`` up to one; the two midpoints ``(j0 +- 1/2) grid`` (exact: ``|j0| < 2^22`` when
    it matters, by the grid rule) are compared exactly by :func:`_at_least`.  Shapes broadcast.
    """
    j0 = jnp.round((x + noise) / grid)
    up = _at_least(x, noise, (j0 + 0.5) * grid)
    down = ~_at_least(x, noise, (j0 - 0.5) * grid)
    j = j0 + up.astype(x.dtype) - down.astype(x.dtype)
    limit = jnp.floor(bound / grid)
    return jnp.clip(j, -limit, limit) * grid


# ----------------------------------------------------------------------------------------
# The mechanisms
# ----------------------------------------------------------------------------------------


def _compute_precision(dtype: jnp.dtype | type | None, *leaf_dtypes: jnp.dtype) -> _Precision:
    """``dtype`` if given, else float32 or the widest floating leaf."""
    return _precision(dtype if dtype is not None else _noise_dtype(*leaf_dtypes))


def _check_bound(bound: ArrayLike, prec: _Precision) -> None:
    if _is_concrete(bound):
        _check_magnitude("bound", bound, prec)


def snapped_gaussian_mechanism(
    key: PRNGKeyArray,
    value: PyTree,
    *,
    l2_sensitivity: ArrayLike,
    noise_multiplier: ArrayLike,
    bound: ArrayLike,
    grid: ArrayLike | None = None,
    dtype: jnp.dtype | type | None = None,
) -> PyTree:
    """The Gaussian mechanism with every coordinate clamped, noised and snapped to a grid.

    Each coordinate ``x`` becomes ``grid * j`` with
    ``j = clip(round_half_up((clamp(x) + std * Z) / grid), -J, J)``, ``J = floor(bound /
    grid)``, ``std = noise_multiplier * l2_sensitivity`` (the L2 sensitivity of the whole
    pytree), ``Z`` from :func:`standard_normal` and ``clamp`` to ``[-bound, bound]`` with
    non-finite values mapped to ``bound``.  Outputs lie in ``{grid * j : |j| <= J}`` for
    every secret.  Account it as ``gaussian_mechanism`` with the same noise multiplier, plus
    :func:`snapping_cost` per coordinate (:func:`snapped_epsilon_delta`).

    As :func:`swarmjax.privacy.mechanisms.gaussian_mechanism`: the noise is ONE draw for the
    flattened pytree, cut into the leaves in flattening order (the result depends only on
    ``key`` and the tree structure); math in ``dtype`` (default float32, or the widest leaf)
    and the snapped value is cast to the leaf's dtype at the end.

    Args:
        key: PRNG key of this release.
        value: pytree of arrays, ``(...)`` per leaf, in the units of ``bound``.
        l2_sensitivity, noise_multiplier: positive scalars (may be traced).
        bound: positive scalar; secrets and outputs are clipped to ``[-bound, bound]``.
        grid: a power of two, default :func:`snapping_grid` ``(bound, std)``.
        dtype: float32 or float64 (float64 needs ``jax_enable_x64``).
    """
    for name, v in (("l2_sensitivity", l2_sensitivity), ("noise_multiplier", noise_multiplier)):
        if _is_concrete(v):
            check_range(name, v, 0.0, math.inf, low_open=True, high_open=True)
        if np.ndim(v) != 0:
            raise ValueError(f"{name} must be a scalar; got shape {np.shape(v)}")
    leaves, treedef = jax.tree_util.tree_flatten(value)
    if not leaves:
        return value
    leaves = [jnp.asarray(leaf) for leaf in leaves]
    dtypes = [_out_dtype(leaf) for leaf in leaves]
    prec = _compute_precision(dtype, *dtypes)
    if np.ndim(bound) != 0:
        raise ValueError(f"bound must be a scalar; got shape {np.shape(bound)}")
    _check_bound(bound, prec)
    std = jnp.asarray(noise_multiplier, prec.dtype) * jnp.asarray(l2_sensitivity, prec.dtype)
    std_host = None
    if _is_concrete(noise_multiplier, l2_sensitivity):
        std_host = float(np.float64(noise_multiplier) * np.float64(l2_sensitivity))
    g = _resolve_grid(grid, bound, std if std_host is None else std_host, prec)
    b = jnp.asarray(bound, prec.dtype)
    flat = standard_normal(key, (sum(leaf.size for leaf in leaves),), prec.dtype)
    cuts = np.cumsum([leaf.size for leaf in leaves])[:-1].tolist()
    out = [
        _snap(bounded(leaf.astype(prec.dtype), -b, b), std * z.reshape(leaf.shape), g, b).astype(dt)
        for leaf, z, dt in zip(leaves, jnp.split(flat, cuts), dtypes, strict=True)
    ]
    return jax.tree_util.tree_unflatten(treedef, out)


def snapped_laplace_mechanism(
    key: PRNGKeyArray,
    value: ArrayLike,
    *,
    l1_sensitivity: ArrayLike,
    epsilon: ArrayLike,
    bound: ArrayLike,
    grid: ArrayLike | None = None,
    dtype: jnp.dtype | type | None = None,
) -> Array:
    """Mironov's snapping mechanism: ``Lap(l1_sensitivity / epsilon)`` noise, snapped.

    Each coordinate becomes ``grid * clip(round_half_up((clamp(x) + scale * L) / grid), -J,
    J)`` with ``scale = l1_sensitivity / epsilon`` and ``L`` from :func:`standard_laplace`.
    ``l1_sensitivity``, ``epsilon``, ``bound`` and ``grid`` broadcast against ``value`` (e.g.
    a per-coordinate scale); the default grid is :func:`snapping_grid` ``(bound, sqrt(2) *
    scale)`` per coordinate.  The release is ``epsilon``-DP for the adjacency under which
    ``l1_sensitivity`` holds, plus :func:`snapping_cost` per coordinate.  Returns the
    broadcast shape, in ``value``'s dtype (float32 for integer input).
    """
    value = jnp.asarray(value)
    out_dtype = _out_dtype(value)
    prec = _compute_precision(dtype, out_dtype)
    if _is_concrete(l1_sensitivity, epsilon):
        check_range("l1_sensitivity", l1_sensitivity, 0.0, math.inf, low_open=True, high_open=True)
        check_range("epsilon", epsilon, 0.0, math.inf, low_open=True, high_open=True)
    _check_bound(bound, prec)
    scale = jnp.asarray(l1_sensitivity, prec.dtype) / jnp.asarray(epsilon, prec.dtype)
    std: ArrayLike = scale * math.sqrt(2.0)
    if _is_concrete(l1_sensitivity, epsilon):
        std = math.sqrt(2.0) * np.asarray(l1_sensitivity, np.float64) / np.asarray(epsilon)
    g = _resolve_grid(grid, bound, std, prec)
    b = jnp.asarray(bound, prec.dtype)
    shape = jnp.broadcast_shapes(value.shape, scale.shape, b.shape, g.shape)
    noise = scale * standard_laplace(key, shape, prec.dtype)
    x = bounded(jnp.broadcast_to(value.astype(prec.dtype), shape), -b, b)
    return _snap(x, noise, g, b).astype(out_dtype)


# ----------------------------------------------------------------------------------------
# The privacy statement
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SnappingCost:
    """What the finite-precision sampler costs, per coordinate and per release.

    Attributes:
        ratio: ``r``: every output cell's probability is within ``(1 +- r)`` times the one of
            the snapped mechanism with exact noise, up to ``delta`` in total.
        epsilon: ``log((1 + r) / (1 - r))``, the epsilon to add per coordinate-release.
        delta: ``2^-63``, the delta to add per coordinate-release (the sampler's tails).
    """

    ratio: float
    epsilon: float
    delta: float


def _coupling_error(noise: Noise, reach: float, half_bin: float, unit: float) -> float:
    """Largest distance, in noise scales, between the computed noise and the exact one.

    Couple the exact noise ``V = Q(f)`` (``f`` uniform) with the sampler's value at the atom
    of ``f``'s bin.  For ``|V| <= reach`` the distance is at most: the bin's half width in
    ``V`` (``half_bin`` relative in ``f``, times ``sup f |Q'(f)|``: ``sqrt(pi/2)`` for the
    Gaussian by the Mills ratio, ``1`` for Laplace) plus the special function's error
    (``_FUNCTION_ERROR`` units of ``unit * (|V| + 1)``) plus rounding ``scale * value``
    (``unit * |value|``): ``(kappa + 1) unit (reach + 2) + quantisation``.
    """
    slope = math.sqrt(math.pi / 2.0) if noise == "gaussian" else 1.0
    quantisation = slope * half_bin * (1.0 + 2.0 * half_bin)
    return (_FUNCTION_ERROR[noise] + 1.0) * unit * (reach + 2.0) + quantisation


def _cell_ratio(noise: Noise, width: np.ndarray, distance: float, error: float) -> np.ndarray:
    """``r``: bound on (mass of the two ``error``-strips at a cell's edges) / (cell mass).

    Standardised units (noise scale 1): cells of ``width``, the secret at 0, cells whose near
    edge is within ``distance``.  Gaussian, density ``p``: a cell at distance ``d`` has mass
    ``>= p(d) (1 - exp(-(d + w) w)) / (d + w)`` and its strips at most ``2 e p(d) exp(d e)``;
    the cell holding 0 has mass ``>= w p(w)``, strips ``<= 2 e p(0)``.  Laplace: mass
    ``>= p(d) (1 - exp(-w))``, strips ``<= 2 e p(d) exp(e)``; the centre cell ``w p(w)``.
    """
    w, e = np.asarray(width, np.float64), float(error)
    if noise == "gaussian":
        centre = np.exp(w * w / 2.0) / w
        reach = distance + w
        side = np.exp(distance * e) * reach / -np.expm1(-reach * w)
    else:
        centre = np.exp(w) / w
        side = np.exp(e) / -np.expm1(-w)
    return 2.0 * e * np.maximum(centre, side)


def snapping_cost(
    noise: Noise,
    *,
    scale: ArrayLike,
    bound: ArrayLike,
    grid: ArrayLike | None = None,
    dtype: jnp.dtype | type = jnp.float32,
) -> SnappingCost:
    """Per coordinate and release: what the snapped mechanism costs beyond the exact one.

    ``scale`` is the noise's ``std`` (Gaussian) or Laplace scale ``b``; ``bound`` and ``grid``
    as given to the mechanism (default grid: :func:`snapping_grid`).  Arrays: the worst
    coordinate.  The bound (proof in ``docs/floating_point.md``): cell edges lie within
    ``2 bound`` of the clamped secret, so only noise up to ``v = min(reach, 2 bound / scale)``
    decides a cell; there the computed noise is within ``e`` (:func:`_coupling_error`) of the
    exact one, which moves each cell's probability by at most ``r`` of itself
    (:func:`_cell_ratio`); noise beyond the sampler's reach has probability ``2^-64`` and is
    counted twice (once per direction) as delta.
    """
    check_choice("noise", noise, ("gaussian", "laplace"))
    prec = _precision(dtype, device=False)
    s = _check_magnitude("scale", scale, prec)
    b = _check_magnitude("bound", bound, prec)
    std = s if noise == "gaussian" else math.sqrt(2.0) * s
    g = np.asarray(snapping_grid(b, std, prec.dtype) if grid is None else grid, np.float64)
    if grid is not None:
        _check_grid(grid, b, prec)
    reach = GAUSSIAN_REACH if noise == "gaussian" else LAPLACE_REACH
    v = float(np.max(np.minimum(reach, 2.0 * b / s)))
    e = _coupling_error(noise, v, 2.0 ** -(prec.position_bits + 1), prec.unit)
    r = float(np.max(_cell_ratio(noise, g / s, v + e, e)))
    if r >= 1.0:
        return SnappingCost(ratio=r, epsilon=math.inf, delta=2.0 * TAIL_PROBABILITY)
    return SnappingCost(ratio=r, epsilon=math.log1p(r) - math.log1p(-r), delta=2 * TAIL_PROBABILITY)


def snapped_epsilon_delta(
    epsilon: float, delta: float, cost: SnappingCost, count: int
) -> tuple[float, float]:
    """``(epsilon, delta)`` of the snapped mechanisms, from that of the exact ones.

    ``epsilon, delta``: the guarantee of the whole computation (any composition, any
    accountant) with exact noise; ``count``: the coordinate-releases it makes with snapped
    noise (coordinates per release times releases).  Returns ``(epsilon + count * cost.epsilon,
    (1 + r)^count delta + count cost.delta (1 + e^epsilon'))`` (delta capped at 1).
    """
    check_range("epsilon", epsilon, 0.0, math.inf)
    check_range("delta", delta, 0.0, 1.0)
    count = check_int("count", count, minimum=0)
    eps = epsilon + count * cost.epsilon
    if not math.isfinite(eps) or eps > 700.0:
        return eps, 1.0
    growth = math.exp(count * math.log1p(cost.ratio))
    return eps, min(1.0, growth * delta + count * cost.delta * (1.0 + math.exp(eps)))
