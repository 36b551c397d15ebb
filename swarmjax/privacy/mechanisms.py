"""Differential-privacy mechanisms with their epsilon functions.

Every mechanism draws its randomness from ``jax.random`` with the key it is given: the cheap
hash generator of :mod:`swarmjax.random` is for swarm coefficients only, never for privacy.
All samplers are pure functions of an explicit key and work under ``jit`` and ``vmap``.
The key must be secret and used for one release: a ChaCha20 key of a
:class:`~swarmjax.privacy.secret.Secret` (``Secret.generate().key()``, the release's index
folded in), as every runtime of swarmjax passes; a key derived from anything published (a
seed, ``jax.random.key(0)``) lets a reader regenerate the noise (docs/privacy.md).

Mechanisms here:

* Gaussian: ``N(0, (noise_multiplier * l2_sensitivity)^2)`` on every coordinate of a pytree.
* Laplace: ``Lap(l1_sensitivity / epsilon)`` on every coordinate; sensitivity and epsilon
  broadcast against each leaf, so a per-feature budget is a vector.
* Randomized response / PRAM over ``c`` categories: keep the true category with probability
  ``keep_prob``, otherwise report one of the other ``c - 1`` uniformly.
* DP random dictatorship (seed 001, Definition 2): one dummy voter per alternative joins the
  real voters; a voter drawn uniformly from all of them dictates the outcome.
* The two combined (PbDRD): every real ballot masked by PRAM, then a random dictatorship.
  Only the dictator's ballot reaches the outcome, so masking that ballot alone gives the
  same outcome law with O(1) instead of O(voters) randomness per round (see
  :func:`dictatorship_pram_from_counts`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray, PyTree

from swarmjax._validation import (
    check_int,
    check_nonnegative,
    check_positive,
    check_probability,
    check_range,
)

__all__ = [
    "bounded",
    "dictatorship_from_counts",
    "dictatorship_pram_from_counts",
    "gaussian_mechanism",
    "gaussian_sigma",
    "laplace_mechanism",
    "random_dictatorship",
    "random_dictatorship_epsilon",
    "random_dictatorship_from_uniform",
    "random_dictatorship_pram_probs",
    "random_dictatorship_probs",
    "randomized_response",
    "randomized_response_epsilon",
    "randomized_response_from_uniform",
    "vote_counts",
]


# ----------------------------------------------------------------------------------------
# Gaussian and Laplace
# ----------------------------------------------------------------------------------------


def bounded(value: ArrayLike, low: ArrayLike, high: ArrayLike) -> Array:
    """``value`` clipped to ``[low, high]`` by the mask rule: a non-finite value (NaN,
    ``inf``, ``-inf``) becomes ``high``, selected with ``jnp.where``.

    Every clip of a private quantity before a noised release goes through this: a plain
    ``jnp.minimum``/``jnp.clip`` lets NaN through (one record whose loss is NaN, e.g. a
    ``3e38`` feature overflowing the logits, would make the release NaN every time, which no
    noise bounds).  The replacement is a fixed value, so the sensitivity
    ``high - low`` holds whatever a record holds.
    """
    x = jnp.asarray(value)
    return jnp.where(jnp.isfinite(x), jnp.clip(x, low, high), jnp.asarray(high, x.dtype))


def gaussian_sigma(epsilon: float, delta: float, l2_sensitivity: float = 1.0) -> float:
    """Noise standard deviation of the classical Gaussian mechanism.

    ``sigma = l2_sensitivity * sqrt(2 ln(1.25 / delta)) / epsilon`` (Dwork & Roth, Thm A.1).
    The theorem holds only for ``0 < epsilon < 1``; larger budgets raise, since the bound
    would be claimed where it is not proven.  For ``epsilon >= 1`` (or for compositions)
    calibrate with :func:`swarmjax.privacy.accounting.sigma_for_epsilon` instead.
    """
    check_range("epsilon", epsilon, 0.0, 1.0, low_open=True, high_open=True)
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    check_positive("l2_sensitivity", l2_sensitivity)
    return float(l2_sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon)


def _leaf_keys(key: PRNGKeyArray, tree: PyTree) -> PyTree:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    keys = [jax.random.fold_in(key, i) for i in range(len(leaves))]
    return jax.tree_util.tree_unflatten(treedef, keys)


def gaussian_mechanism(
    key: PRNGKeyArray,
    value: PyTree,
    *,
    l2_sensitivity: ArrayLike,
    noise_multiplier: ArrayLike,
) -> PyTree:
    """Add ``N(0, (noise_multiplier * l2_sensitivity)^2)`` to every coordinate of ``value``.

    The L2 sensitivity is over the whole pytree (all leaves together).  The noise for the
    whole pytree is ONE draw of ``sum(leaf sizes)`` normals from ``key``, cut into the
    leaves in flattening order: one random-number kernel per call instead of one per leaf
    (on a CPU each kernel above ~1,000 numbers pays a fixed thread-pool cost), and the result
    depends only on ``key`` and the tree's structure, so it is batch-invariant.

    Precision: the noise is drawn and added in float32 (or the widest leaf dtype, if wider)
    and only the noised value is cast to the leaf's dtype (post-processing). A bfloat16
    or float16 draw would be a Gaussian on a few hundred values, cut off near 3 sigma
    (``delta >= 0.04`` per release whatever the accountant says).
    """
    check_positive("l2_sensitivity", l2_sensitivity)
    check_nonnegative("noise_multiplier", noise_multiplier)
    std = jnp.asarray(noise_multiplier) * jnp.asarray(l2_sensitivity)
    leaves, treedef = jax.tree_util.tree_flatten(value)
    leaves = [jnp.asarray(leaf) for leaf in leaves]
    dtypes = [_out_dtype(leaf) for leaf in leaves]
    wide = _noise_dtype(*dtypes)
    flat = jax.random.normal(key, (sum(leaf.size for leaf in leaves),), wide)
    cuts = np.cumsum([leaf.size for leaf in leaves])[:-1].tolist()
    noisy = [
        (leaf.astype(wide) + (std * piece.reshape(leaf.shape)).astype(wide)).astype(dtype)
        for leaf, piece, dtype in zip(leaves, jnp.split(flat, cuts), dtypes, strict=True)
    ]
    return jax.tree_util.tree_unflatten(treedef, noisy)


def _out_dtype(leaf: Array) -> jnp.dtype:
    """The dtype a noised leaf is returned in: its own if floating, else float32."""
    return leaf.dtype if jnp.issubdtype(leaf.dtype, jnp.floating) else jnp.dtype(jnp.float32)


def _noise_dtype(*dtypes: jnp.dtype) -> jnp.dtype:
    """The dtype DP noise is drawn and added in: float32, or wider if a leaf is wider."""
    return jnp.result_type(jnp.float32, *dtypes)


def laplace_mechanism(
    key: PRNGKeyArray,
    value: PyTree,
    *,
    l1_sensitivity: ArrayLike,
    epsilon: ArrayLike,
) -> PyTree:
    """Add ``Lap(l1_sensitivity / epsilon)`` to every coordinate of ``value``.

    ``l1_sensitivity`` and ``epsilon`` broadcast against each leaf (e.g. shape ``(d,)`` for
    a per-feature budget on an ``(n, d)`` table).  ``epsilon = inf`` adds no noise.
    The guarantee is epsilon-DP for the adjacency under which ``l1_sensitivity`` is the L1
    sensitivity; choosing it is the caller's claim.  The noise is drawn and added in
    float32 (or wider), then cast to the leaf's dtype, as :func:`gaussian_mechanism`.
    """
    check_positive("l1_sensitivity", l1_sensitivity)
    check_positive("epsilon", epsilon)
    scale = jnp.asarray(l1_sensitivity, jnp.float32) / jnp.asarray(epsilon, jnp.float32)

    def noisy(leaf: Array, k: PRNGKeyArray) -> Array:
        leaf = jnp.asarray(leaf)
        dtype = _out_dtype(leaf)
        wide = _noise_dtype(dtype)
        noise = jax.random.laplace(k, jnp.broadcast_shapes(leaf.shape, scale.shape), wide)
        return (leaf.astype(wide) + (scale * noise).astype(wide)).astype(dtype)

    return jax.tree_util.tree_map(noisy, value, _leaf_keys(key, value))


# ----------------------------------------------------------------------------------------
# Randomized response / PRAM
# ----------------------------------------------------------------------------------------


def randomized_response_epsilon(keep_prob: ArrayLike, num_categories: int) -> np.ndarray:
    """Local-DP epsilon of :func:`randomized_response`.

    The output-probability ratio between two inputs is ``p / q`` with
    ``q = (1 - p) / (c - 1)``, so ``epsilon = |ln(p (c - 1) / (1 - p))|``; it is ``inf`` at
    ``p = 1`` (no masking) and ``0`` at ``p = 1/c`` (output independent of input).
    k_alpha = 8: p = 0.6, 0.7, 0.8, 0.9 give 2.35, 2.79, 3.33, 4.14 (seed 001).
    Returns a float64 array of the broadcast shape of ``keep_prob``.
    """
    check_probability("keep_prob", keep_prob)
    c = check_int("num_categories", num_categories, minimum=2)
    p = np.asarray(keep_prob, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.abs(np.log(p * (c - 1)) - np.log1p(-p))


def randomized_response(
    key: PRNGKeyArray,
    category: Int[ArrayLike, "*batch"],
    num_categories: int,
    keep_prob: ArrayLike,
) -> Int[Array, "*batch"]:
    """Mask categories in ``[0, c)``: keep each with prob. ``keep_prob``, else a uniform other.

    Works elementwise on any shape; every element uses its own randomness from ``key``.
    """
    category = jnp.asarray(category)
    uniforms = jax.random.uniform(key, (2, *category.shape))
    return randomized_response_from_uniform(uniforms, category, num_categories, keep_prob)


def randomized_response_from_uniform(
    uniforms: Float[ArrayLike, " 2 *batch"],
    category: Int[ArrayLike, "*batch"],
    num_categories: int | Int[Array, ""],
    keep_prob: ArrayLike,
) -> Int[Array, "*batch"]:
    """:func:`randomized_response` given its randomness: ``uniforms`` ~ U[0, 1) from
    ``jax.random`` (row 0 decides keep, row 1 picks the other category).

    For callers that draw all of an iteration's privacy randomness in one call (each
    ``jax.random`` call is a loop on the CPU backend; PAASO runs this every iteration).
    ``num_categories`` may be a JAX array, traced or not (PAASO's ``k_alpha`` as data; the
    caller checks it).
    """
    given = isinstance(num_categories, jax.Array)
    c = num_categories if given else check_int("num_categories", num_categories, minimum=2)
    check_probability("keep_prob", keep_prob)
    category = jnp.asarray(category)
    u_keep, u_other = jnp.asarray(uniforms)
    keep = u_keep < keep_prob
    shift = 1 + jnp.minimum(jnp.floor(u_other * (c - 1)), c - 2).astype(jnp.int32)  # 1..c-1
    return jnp.where(keep, category, (category + shift) % c).astype(category.dtype)


# ----------------------------------------------------------------------------------------
# DP random dictatorship
# ----------------------------------------------------------------------------------------


def vote_counts(
    votes: Int[ArrayLike, " voters"], mask: Bool[ArrayLike, " voters"], num_alternatives: int
) -> Int[Array, " alternatives"]:
    """Votes per alternative, counting only voters with ``mask`` true."""
    votes = jnp.asarray(votes)
    one_hot = jax.nn.one_hot(votes, num_alternatives, dtype=jnp.int32)
    return jnp.sum(one_hot * jnp.asarray(mask, jnp.int32)[:, None], axis=0)


def random_dictatorship_probs(
    counts: Int[ArrayLike, " alternatives"],
) -> Float[Array, " alternatives"]:
    """Outcome distribution ``(votes(a) + 1) / (|I| + m)`` with one dummy voter per alternative."""
    counts = jnp.asarray(counts, jnp.float32)
    return (counts + 1.0) / (jnp.sum(counts) + counts.shape[-1])


def random_dictatorship(
    key: PRNGKeyArray,
    votes: Int[ArrayLike, " voters"],
    mask: Bool[ArrayLike, " voters"],
    num_alternatives: int,
) -> tuple[Int[Array, ""], Int[Array, ""]]:
    """Run DP random dictatorship over the voters with ``mask`` true.

    Draws one voter uniformly from the real voters plus ``m`` dummies (one per alternative)
    and returns its choice: a uniform position in the pool of ``n = |I| + m`` ballots sorted
    by alternative, so outcome ``a`` has probability ``(votes(a) + 1) / n`` exactly as
    :func:`random_dictatorship_probs` (up to the 2^-24 resolution of the uniform).

    Returns ``(outcome, n)`` where ``n = |I| + m`` is the pool size that sets epsilon.
    """
    uniform = jax.random.uniform(key)
    return random_dictatorship_from_uniform(uniform, votes, mask, num_alternatives)


def random_dictatorship_from_uniform(
    uniform: Float[ArrayLike, ""],
    votes: Int[ArrayLike, " voters"],
    mask: Bool[ArrayLike, " voters"],
    num_alternatives: int,
) -> tuple[Int[Array, ""], Int[Array, ""]]:
    """:func:`random_dictatorship` given its randomness, one ``uniform`` ~ U[0, 1) drawn
    from ``jax.random``."""
    return dictatorship_from_counts(uniform, vote_counts(votes, mask, num_alternatives))


def _draw_ballot(
    uniform: Float[ArrayLike, ""], counts: Int[Array, " m"]
) -> tuple[Int[Array, ""], Bool[Array, ""], Int[Array, ""]]:
    """A uniform ballot of the pool sorted by alternative (each block: its real ballots,
    then its dummy): ``(alternative, is the dummy, pool size)``."""
    ends = jnp.cumsum(counts + 1)
    pool = ends[-1]
    position = jnp.minimum(jnp.floor(uniform * pool).astype(jnp.int32), pool - 1)
    alternative = jnp.sum(ends <= position, dtype=jnp.int32)
    dummy = position == jnp.take(ends, alternative) - 1
    return alternative, dummy, pool


def dictatorship_from_counts(
    uniform: Float[ArrayLike, ""], counts: Int[ArrayLike, " alternatives"]
) -> tuple[Int[Array, ""], Int[Array, ""]]:
    """DP random dictatorship from the real votes per alternative ``counts`` and one
    ``uniform`` ~ U[0, 1): outcome ``a`` with probability ``(counts[a] + 1) / n``.

    Returns ``(outcome, n)``, ``n = sum(counts) + m`` the pool size.
    """
    alternative, _, pool = _draw_ballot(uniform, jnp.asarray(counts))
    return alternative, pool


def dictatorship_pram_from_counts(
    uniforms: Float[ArrayLike, " 3"], counts: Int[ArrayLike, " alternatives"], keep_prob: ArrayLike
) -> tuple[Int[Array, ""], Int[Array, ""]]:
    """Random dictatorship over PRAM-masked ballots, from the unmasked ``counts``.

    Every real voter masks its vote with :func:`randomized_response` (keep-probability
    ``keep_prob``) before the dictatorship.  Only the drawn dictator's ballot decides the
    outcome and the masks are independent, so this draws the dictator first
    (``uniforms[0]``) and masks only a real dictator's vote (``uniforms[1:]``, as
    :func:`randomized_response_from_uniform`): the outcome has exactly the law of
    :func:`random_dictatorship_pram_probs`, with O(1) instead of O(voters) randomness.  The
    local-DP guarantee of each voter's mask is a property of the protocol and holds whether
    or not the masks that never reach the outcome are simulated.

    Returns ``(outcome, n)``, ``n = sum(counts) + m`` the pool size.
    """
    check_probability("keep_prob", keep_prob)
    counts = jnp.asarray(counts)
    u = jnp.asarray(uniforms)
    alternative, dummy, pool = _draw_ballot(u[0], counts)
    masked = randomized_response_from_uniform(u[1:3], alternative, counts.shape[-1], keep_prob)
    return jnp.where(dummy, alternative, masked), pool


def random_dictatorship_epsilon(pool_size: ArrayLike) -> np.ndarray | Array:
    """Epsilon of one DP random dictatorship: ``ln(2n / (n + 1))``, ``n = |I| + m``.

    Adjacency: adding or removing one voter.  The worst case is an alternative with no real
    vote, whose probability moves between ``1/n`` and ``2/(n+1)``.  Works on numpy arrays
    (validated) and inside traced code.
    """
    if isinstance(pool_size, jax.Array):
        n = pool_size.astype(jnp.float32)
        return jnp.log(2.0 * n / (n + 1.0))
    check_range("pool_size", pool_size, 1.0)
    n = np.asarray(pool_size, dtype=np.float64)
    return np.log(2.0 * n / (n + 1.0))


def random_dictatorship_pram_probs(
    votes: Int[ArrayLike, " voters"],
    mask: Bool[ArrayLike, " voters"],
    num_alternatives: int,
    keep_prob: ArrayLike,
) -> Float[Array, " alternatives"]:
    """Outcome law of a random dictatorship over PRAM-masked ballots.

    ``P(a) = (1 + sum_i mask_i [p [v_i = a] + (1 - p) / (m - 1) [v_i != a]]) / (|I| + m)``:
    a dummy dictates its own alternative, a real voter its masked vote.
    """
    m = check_int("num_alternatives", num_alternatives, minimum=2)
    counts = vote_counts(votes, mask, m).astype(jnp.float32)
    p = jnp.asarray(keep_prob, jnp.float32)
    voters = jnp.sum(counts)
    masked = p * counts + (1.0 - p) / (m - 1) * (voters - counts)
    return (masked + 1.0) / (voters + m)
