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
  on "fits" moves one step's sampling distribution by at most ``p = P(overflow)`` in total
  variation, so ``T`` steps move the whole run's by at most ``T p``, and an
  ``(epsilon, delta)`` guarantee for exact Poisson sampling becomes
  ``(epsilon, delta + T p (1 + e^epsilon))`` for the sampler actually used
  (:func:`sampler_delta`).  Report that total: pass ``overflow_prob`` (from
  :func:`overflow_probability`) to :class:`swarmjax.privacy.accounting.PrivacyAccountant`,
  which then returns the epsilon whose delta includes it; a run's
  :class:`~swarmjax.privacy.plan.PrivacyPlan` sizes the buffer so that the term is at most a
  stated share of delta (:meth:`~swarmjax.privacy.plan.PrivacyPlan.sized`).  The number of
  draws is returned for inspection.

How a draw is made: a Bernoulli(``q``) coin per valid row is the same process as
geometric gaps between included rows (``P(gap >= g) = (1 - q)^g``, memoryless), so a draw
takes ``capacity + 1`` gaps, whatever the number of rows: slot ``k`` holds the valid row
of rank ``sum_{l <= k} (gap_l + 1) - 1``, and slot ``capacity`` landing inside the data is
exactly "more than ``capacity`` rows were included" (an overflow).  Each gap is
``floor(E / -log(1 - q))`` with ``E ~ Exp(1)`` (:func:`slot_exponentials`).  ``E = -log w``
is computed from a uniform ``w`` held at full float32 relative precision near 0 and near 1
(47 random bits), so ``P(gap >= g)`` is ``(1 - q)^g`` to float32 rounding (about ``1e-7``
relative, tested) and every row's inclusion probability is ``q`` to that precision, for any
``q`` (a plain float32 uniform, on a ``2^-23`` grid, would be off by ``2^-23 / q``: ``1e-4``
relative at ``q = 1e-3``).  Cost per draw: ``O(capacity)`` random numbers, against
``O(N)`` for a coin per row (a 12,000-row client at ``q = 256 / 12000`` draws 357 gaps
instead of 12,000 coins).

Batch invariance: slot ``k``'s gap comes from ``fold_in(key, k)`` and ranks count
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
    "fixed_cohort",
    "gather",
    "geometric_gaps",
    "geometric_ranks",
    "overflow_probability",
    "poisson_capacity",
    "poisson_sample",
    "row_uniforms",
    "sampler_delta",
    "shuffled_batches",
    "slot_exponentials",
]

_MAX_DRAWS = 64


def poisson_capacity(
    num_examples: int, q: float, overflow_prob: float = 1e-9, *, add_one: bool = False
) -> int:
    """Smallest buffer size ``k`` with ``P(Binomial(num_examples, q) > k) < overflow_prob``.

    ``q`` may be an array (one rate per client): the largest rate sets the capacity.
    ``add_one``: size it for ``num_examples + 1`` candidates, the larger neighbour of
    add/remove adjacency (an upper bound for zero-out: :func:`overflow_probability`).
    Example: 60000 rows at ``q = 256/60000`` need 357 slots for overflow below ``1e-9``.
    """
    n = check_int("num_examples", num_examples, minimum=1) + bool(add_one)
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


def overflow_probability(
    num_examples: int, q: float, capacity: int, *, add_one: bool = False
) -> float:
    """Exact ``P(Binomial(num_examples, q) > capacity)``: one step's chance to overflow.

    The sampler's delta must hold on BOTH neighbouring datasets.  Under add/remove adjacency
    the add-one neighbour has ``num_examples + 1`` candidates and overflows more often; the
    tail grows with the count, so the max over the two neighbours is the
    ``num_examples + 1`` value: pass ``add_one=True``.  Under zero-out (swarmjax's relation
    at both units, :data:`swarmjax.privacy.plan.RELATIONS`: a record or client replaced by
    a null one that is still a candidate of the draw) the count is the same on both sides
    and ``add_one=False`` is exact.  Client-level plans still pass ``add_one=True``: an
    upper bound that keeps every number they stated before the relation was zero-out
    (:func:`swarmjax.privacy.plan.draw_overflow`).
    """
    n = check_int("num_examples", num_examples, minimum=1) + bool(add_one)
    check_range("q", q, 0.0, 1.0, low_open=True)
    capacity = check_int("capacity", capacity, minimum=1)
    q_max = float(np.max(np.asarray(q, dtype=np.float64)))
    return float(stats.binom.sf(capacity, n, q_max)) if capacity < n else 0.0


def sampler_delta(overflow_prob: float, steps: int, epsilon: float) -> float:
    """Delta the buffer adds to an ``(epsilon, delta)`` run of ``steps`` steps.

    ``steps * overflow_prob * (1 + e^epsilon)`` (capped at 1): conditioning each step on
    "fits" moves the run's output distribution by at most ``steps * overflow_prob`` in total
    variation, and a total-variation shift ``t`` turns ``(eps, delta)`` into
    ``(eps, delta + t (1 + e^eps))`` (apply the shift on both neighbouring datasets).
    """
    check_range("overflow_prob", overflow_prob, 0.0, 1.0)
    steps = check_int("steps", steps, minimum=0)
    check_range("epsilon", epsilon, 0.0, math.inf)
    if overflow_prob == 0.0 or steps == 0:
        return 0.0
    if epsilon > 700.0:
        return 1.0
    return min(1.0, steps * overflow_prob * (1.0 + math.exp(epsilon)))


def row_uniforms(key: PRNGKeyArray, num_rows: int) -> Float[Array, " N"]:
    """One ``U[0, 1)`` per row (or slot), row ``j`` from ``fold_in(key, j)`` (independent of
    ``N``)."""
    rows = jnp.arange(num_rows, dtype=jnp.uint32)
    return jax.vmap(lambda j: jax.random.uniform(jax.random.fold_in(key, j)))(rows)


_HALF_ULP = 2.0**-23  # spacing of the 23-bit integers' fractions below
_TWO_M24 = 2.0**-24


def _exponential_from_bits(hi: Array, lo: Array, branch: Array) -> Array:
    """``E = -log w`` for ``w`` uniform on ``(0, 1)``, from two 23-bit integers and a bit.

    ``f = (hi + (lo + 1/2) 2^-23) 2^-24`` is uniform on ``(0, 1/2)`` to float32 rounding
    (46 bits, kept at full relative precision near 0 by the float format); ``w = f`` when
    ``branch`` is set, else ``w = 1 - f`` (evaluated as ``-log1p(-f)``), so both tails of
    ``E`` are resolved to float32 relative precision.
    """
    frac = (lo.astype(jnp.float32) + 0.5) * _HALF_ULP
    f = (hi.astype(jnp.float32) + frac) * _TWO_M24
    return jnp.where(branch, -jnp.log(f), -jnp.log1p(-f))


def slot_exponentials(key: PRNGKeyArray, slots: int) -> Float[Array, " slots"]:
    """One ``Exp(1)`` per slot, slot ``k`` from ``fold_in(key, k)`` (independent of ``slots``)."""

    def one(k: Array) -> Array:
        bits = jax.random.bits(jax.random.fold_in(key, k), (3,), jnp.uint32)
        return _exponential_from_bits(bits[0] >> 9, bits[1] >> 9, (bits[2] & 1) == 1)

    return jax.vmap(one)(jnp.arange(slots, dtype=jnp.uint32))


def geometric_gaps(e: Float[Array, "..."], q: ArrayLike) -> Float[Array, "..."]:
    """``floor(E / -log(1 - q))``: Geometric(``q``) failures before a success, as floats."""
    return jnp.floor(e / -jnp.log1p(-jnp.asarray(q, e.dtype)))


def geometric_ranks(
    key: PRNGKeyArray, q: ArrayLike, slots: int, limit: int
) -> Int[Array, " slots"]:
    """Ranks of the first ``slots`` rows a Bernoulli(``q``) process includes, capped at
    ``limit`` (every rank ``>= limit`` is returned as ``limit``).

    Rank ``k`` is ``sum_{l <= k} (gap_l + 1) - 1`` with independent geometric gaps
    ``gap_l = floor(E_l / -log(1 - q))``, ``E_l`` from :func:`slot_exponentials`: the same
    law as one coin per row.  The running sum saturates at ``limit``, so it cannot overflow
    int32.
    """
    gaps = geometric_gaps(slot_exponentials(key, slots), q)
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


def fixed_cohort(key: PRNGKeyArray, num_clients: int, size: int) -> Int[Array, " size"]:
    """``size`` distinct client ids in ``[0, num_clients)``, uniform without replacement.

    Floyd's algorithm (``size`` steps, each an ``O(size)`` membership test) followed by a
    uniform shuffle of the ``size`` ids. Raises ``ValueError`` if ``size > num_clients``.
    """
    num_clients = check_int("num_clients", num_clients, 1)
    size = check_int("cohort_size", size, 1)
    if size > num_clients:
        raise ValueError(
            f"cohort_size must be <= num_clients ({num_clients}); got {size}: lower "
            "cohort_size or add clients"
        )
    if num_clients >= 2**31:
        raise ValueError(f"num_clients must be < 2**31; got {num_clients}")
    return _floyd(key, num_clients, size)


def _floyd(key: PRNGKeyArray, n: int, size: int) -> Array:
    draw_key, shuffle_key = jax.random.split(key)
    return jax.random.permutation(shuffle_key, floyd_draw(draw_key, n, size))


def floyd_draw(draw_key: PRNGKeyArray, n: Int[ArrayLike, ""], size: int) -> Array:
    """Floyd's ``size`` distinct values of ``[0, n)`` (``n`` may be traced, ``>= size``)."""
    slots = jnp.arange(size, dtype=jnp.int32)

    def step(i: Array, chosen: Array) -> Array:
        j = n - size + i  # draw t uniform in [0, j]; take j instead if t is already chosen
        t = jax.random.randint(jax.random.fold_in(draw_key, i), (), 0, j + 1, jnp.int32)
        taken = jnp.any((chosen == t) & (slots < i))
        return chosen.at[i].set(jnp.where(taken, j, t))

    return jax.lax.fori_loop(0, size, step, jnp.zeros(size, jnp.int32))
