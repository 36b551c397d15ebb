"""Mini-batch sampling with static shapes, for DP-SGD under ``jit`` and ``vmap``.

A client's dataset is a padded array of ``N`` rows plus a boolean ``valid`` mask (padding rows
are never sampled).  Samplers return ``(indices, mask)`` of a fixed length ``capacity``:
``indices`` point into the padded dataset, ``mask`` says which buffer slots hold a sampled
example; unused slots point at row 0 with ``mask`` false.

Poisson sampling (:func:`poisson_sample`) matches the accountant in
:mod:`swarmjax.privacy.accounting`: every valid row is included independently with
probability ``q``.  The buffer never truncates a batch:

* Capacity rule (:func:`poisson_capacity`): the smallest ``k`` with
  ``P(Binomial(n, q) > k) < overflow_prob`` (default ``1e-9``), from the exact binomial tail.
* Resampling (always on): if a draw still has more than ``capacity`` examples, the whole
  draw is repeated with a fresh key (``fold_in(key, attempt)``) until it fits.  Conditioning
  on "fits" moves the sampling distribution by at most ``P(overflow)`` in total variation,
  so with the default capacity the guarantee is the accountant's ``(epsilon, delta)`` with
  ``delta`` raised by at most ``1e-9``.  The number of draws is returned for inspection.

How a draw is made: a Bernoulli(``q``) coin per valid row is the same process as
geometric gaps between included rows (``P(gap >= g) = (1 - q)^g``, memoryless), so a draw
takes ``capacity + 1`` uniforms, whatever the number of rows: slot ``k`` holds the valid row
of rank ``sum_{l <= k} (gap_l + 1) - 1``, and slot ``capacity`` landing inside the data is
exactly "more than ``capacity`` rows were included" (an overflow).  The gaps are
``floor(log(1 - u) / log(1 - q))`` in float32 from uniforms on a ``2^-23`` grid, which moves
each inclusion probability by about ``1e-7`` relative, less than rounding ``q`` itself would
with one uniform coin per row.  Cost per draw: ``O(capacity)`` random numbers, against
``O(N)`` for a coin per row (a 12,000-row client at ``q = 256 / 12000`` draws 357 numbers
instead of 12,000).

Batch invariance: slot ``k``'s uniform is ``uniform(fold_in(key, k))`` and ranks count
valid rows only, so the sampled rows do not depend on the padded length ``N``, on the
capacity (unless it overflows), or on what else is in a vmapped batch.

:func:`shuffled_batches` (fixed-size batches from a random permutation, one epoch) is
offered for non-private training and baselines.  It is sampling WITHOUT replacement with
a fixed batch size, which the Poisson accountant does NOT cover; do not report the
accountant's epsilon for it.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray, PyTree
from scipy import stats

from swarmjax._validation import check_int, check_range

__all__ = [
    "gather",
    "geometric_ranks",
    "poisson_capacity",
    "poisson_sample",
    "row_uniforms",
    "shuffled_batches",
]

_MAX_DRAWS = 64


def poisson_capacity(num_examples: int, q: float, overflow_prob: float = 1e-9) -> int:
    """Smallest buffer size ``k`` with ``P(Binomial(num_examples, q) > k) < overflow_prob``.

    ``q`` may be an array (one rate per client): the largest rate sets the capacity.
    Example: 60000 rows at ``q = 256/60000`` need 357 slots for overflow below ``1e-9``.
    """
    n = check_int("num_examples", num_examples, minimum=1)
    check_range("q", q, 0.0, 1.0, low_open=True)
    check_range("overflow_prob", overflow_prob, 0.0, 1.0, low_open=True, high_open=True)
    q_max = float(np.max(np.asarray(q, dtype=np.float64)))
    if q_max >= 1.0:
        return n
    k = int(stats.binom.isf(overflow_prob, n, q_max))
    while k < n and stats.binom.sf(k, n, q_max) >= overflow_prob:
        k += 1
    while k > 0 and stats.binom.sf(k - 1, n, q_max) < overflow_prob:
        k -= 1
    return max(k, 1)


def row_uniforms(key: PRNGKeyArray, num_rows: int) -> Float[Array, " N"]:
    """One ``U[0, 1)`` per row (or slot), row ``j`` from ``fold_in(key, j)`` (independent of
    ``N``)."""
    rows = jnp.arange(num_rows, dtype=jnp.uint32)
    return jax.vmap(lambda j: jax.random.uniform(jax.random.fold_in(key, j)))(rows)


def geometric_ranks(
    key: PRNGKeyArray, q: ArrayLike, slots: int, limit: int
) -> Int[Array, " slots"]:
    """Ranks of the first ``slots`` rows a Bernoulli(``q``) process includes, capped at
    ``limit`` (every rank ``>= limit`` is returned as ``limit``).

    Rank ``k`` is ``sum_{l <= k} (gap_l + 1) - 1`` with independent geometric gaps
    ``gap_l = floor(log(1 - u_l) / log(1 - q))``, ``u_l = uniform(fold_in(key, l))``: the
    same law as one coin per row. The running sum saturates at ``limit``, so it cannot
    overflow int32.
    """
    u = row_uniforms(key, slots)
    gaps = jnp.floor(jnp.log1p(-u) / jnp.log1p(-jnp.asarray(q, u.dtype)))
    steps = jnp.minimum(gaps, float(limit)).astype(jnp.int32) + 1
    saturating_add = lambda a, b: jnp.minimum(a + b, limit + 1)
    return jax.lax.associative_scan(saturating_add, steps) - 1


def poisson_sample(
    key: PRNGKeyArray,
    q: ArrayLike,
    valid: Bool[ArrayLike, " N"],
    capacity: int,
) -> tuple[Int[Array, " capacity"], Bool[Array, " capacity"], Int[Array, ""]]:
    """Poisson-sample the valid rows into a buffer of ``capacity`` slots.

    Args:
        key: PRNG key for this (client, step).
        q: inclusion probability in ``(0, 1]``; may be traced (vmapped per client).
        valid: ``(N,)`` true for real rows, false for padding.
        capacity: static buffer size, e.g. from :func:`poisson_capacity`.

    Returns:
        ``(indices, mask, draws)``: ``indices (capacity,)`` int32 rows of the padded
        dataset, in increasing order, ``mask (capacity,)`` true for sampled slots, and
        ``draws`` the number of draws made (1 unless the buffer overflowed).  If all
        ``65`` draws overflow (a capacity far below ``q N``) the mask is all false: an
        empty step, never a truncated batch.
    """
    check_range("q", q, 0.0, 1.0, low_open=True)
    capacity = check_int("capacity", capacity, minimum=1)
    valid = jnp.asarray(valid, bool)
    if valid.ndim != 1:
        raise ValueError(f"valid must be 1-D (rows,); got shape {valid.shape}")
    return _poisson_sample(key, q, valid, capacity)


@functools.partial(jax.jit, static_argnums=3)
def _poisson_sample(key, q, valid, capacity):
    n_valid = jnp.sum(valid)
    (rows,) = jnp.nonzero(valid, size=valid.shape[0], fill_value=0)

    def ranks(attempt: Array) -> Array:
        return geometric_ranks(jax.random.fold_in(key, attempt), q, capacity + 1, valid.shape[0])

    def overflows(state: tuple[Array, Array]) -> Array:
        attempt, r = state
        return (r[capacity] < n_valid) & (attempt < _MAX_DRAWS)

    def redraw(state: tuple[Array, Array]) -> tuple[Array, Array]:
        attempt, _ = state
        return attempt + 1, ranks(attempt + 1)

    first = jnp.zeros((), jnp.int32)
    attempt, r = jax.lax.while_loop(overflows, redraw, (first, ranks(first)))
    failed = r[capacity] < n_valid
    mask = (r[:capacity] < n_valid) & ~failed
    idx = rows[jnp.minimum(r[:capacity], valid.shape[0] - 1)].astype(jnp.int32)
    return jnp.where(mask, idx, 0), mask, attempt + 1


def shuffled_batches(
    key: PRNGKeyArray, valid: Bool[ArrayLike, " N"], batch_size: int
) -> tuple[Int[Array, "num_batches batch_size"], Bool[Array, "num_batches batch_size"]]:
    """One epoch of fixed-size batches from a random permutation of the valid rows.

    NOT covered by the Poisson accountant (sampling without replacement, fixed size).
    ``num_batches = ceil(N / batch_size)``; valid rows come first in random order, so the
    trailing batches may be partly or wholly masked when the dataset is padded.
    """
    batch_size = check_int("batch_size", batch_size, minimum=1)
    return _shuffled_batches(key, jnp.asarray(valid, bool), batch_size)


@functools.partial(jax.jit, static_argnums=2)
def _shuffled_batches(key, valid, batch_size):
    n = valid.shape[0]
    num_batches = math.ceil(n / batch_size)
    u = jnp.where(valid, row_uniforms(key, n), 2.0)  # padding sorts last
    order = jnp.argsort(u).astype(jnp.int32)
    size = num_batches * batch_size
    order = jnp.pad(order, (0, size - n))
    mask = jnp.arange(size) < jnp.sum(valid)
    return order.reshape(num_batches, batch_size), mask.reshape(num_batches, batch_size)


def gather(data: PyTree, indices: Int[ArrayLike, "..."]) -> PyTree:
    """Rows ``indices`` of every leaf of ``data`` (leading axis = rows)."""
    indices = jnp.asarray(indices)
    return jax.tree_util.tree_map(lambda leaf: jnp.asarray(leaf)[indices], data)
