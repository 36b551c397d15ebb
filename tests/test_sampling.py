"""Poisson sampling with static shapes: capacity rule, padding, overflow, vmap, invariance."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from swarmjax.privacy import sampling


@pytest.mark.parametrize(("n", "q"), [(60000, 256 / 60000), (1000, 0.1), (50, 0.5)])
def test_capacity_is_smallest_with_overflow_below_1e9(n, q):
    k = sampling.poisson_capacity(n, q)
    assert stats.binom.sf(k, n, q) < 1e-9
    assert stats.binom.sf(k - 1, n, q) >= 1e-9


def test_capacity_uses_largest_client_rate():
    assert sampling.poisson_capacity(500, [0.01, 0.2]) == sampling.poisson_capacity(500, 0.2)
    assert sampling.poisson_capacity(10, 1.0) == 10


def _draw_many(q, valid, capacity, num):
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(3), i))(jnp.arange(num))
    fn = jax.jit(jax.vmap(lambda k: sampling.poisson_sample(k, q, valid, capacity)))
    return fn(keys)


def test_inclusion_rate_and_padding_never_sampled():
    valid = jnp.arange(40) < 30
    q, num = 0.3, 4000
    idx, mask, draws = _draw_many(q, valid, sampling.poisson_capacity(30, q), num)
    assert np.all(np.asarray(draws) == 1)
    counts = np.zeros(40)
    np.add.at(counts, np.asarray(idx)[np.asarray(mask)], 1)
    assert counts[30:].sum() == 0
    # per-row inclusion frequency ~ Binomial(num, q) / num
    z = (counts[:30] / num - q) / np.sqrt(q * (1 - q) / num)
    assert np.abs(z).max() < 4.5
    sizes = np.asarray(mask).sum(axis=1)
    assert abs(sizes.mean() - 30 * q) < 4 * np.sqrt(30 * q * (1 - q) / num)
    assert sizes.var() == pytest.approx(30 * q * (1 - q), rel=0.1)


def _reference_rows(key, q, valid, capacity):
    """The gap construction in float64 numpy: the valid rows included, or None on overflow."""
    e = np.asarray(sampling.slot_exponentials(key, capacity + 1), np.float64)
    ranks = np.cumsum(np.floor(e / -np.log1p(-q)) + 1) - 1
    rows = np.flatnonzero(np.asarray(valid))
    if ranks[capacity] < len(rows):
        return None
    return rows[ranks[ranks < len(rows)].astype(int)]


@jax.jit
def _gap_at(index, q, branch):
    """The sampler's gap for the bit pattern ``index = hi 2^23 + lo`` (int64 split in two)."""
    hi, lo = index
    e = sampling._exponential_from_bits(hi, lo, branch)
    return sampling.geometric_gaps(e, q)


def test_gap_law_is_exact_to_float_resolution():
    """``P(gap >= g) = (1 - q)^g`` computed exactly over all 2^47 bit patterns.

    The gap is monotone in the 46-bit index on each branch (``w = f`` or ``w = 1 - f``), so
    a bisection finds how many patterns give ``gap >= g``; their share must equal
    ``(1 - q)^g`` to float32 rounding, for rates as small as 1e-6 (every row's inclusion
    probability is then ``q``: a renewal process with Geometric(q) gaps is Bernoulli(q)).
    """
    qs = [1e-6, 1e-3, 256 / 12000, 0.3]
    cases = [(q, g) for q in qs for g in (1, 2, round(1 / q), round(5 / q))]
    q = np.array([c[0] for c in cases] * 2, np.float32)
    g = np.array([c[1] for c in cases] * 2, np.float64)
    branch = np.repeat([False, True], len(cases))
    # predicate "gap >= g": false-then-true in the index on branch w = 1 - f (E increases),
    # true-then-false on branch w = f; bisect for the switch point in [0, 2^46]
    lo, hi = np.zeros(len(q), np.int64), np.full(len(q), 2**46, np.int64)
    while np.any(hi - lo > 1):
        mid = (lo + hi) // 2
        split = (
            (mid >> 23).astype(np.uint32),
            (mid & (2**23 - 1)).astype(np.uint32),
        )
        at_least = np.asarray(_gap_at(split, q, branch)) >= g
        go_right = np.where(branch, at_least, ~at_least)
        lo, hi = np.where(go_right, mid, lo), np.where(go_right, hi, mid)
    share = np.where(branch, hi, 2**46 - hi) / 2**46
    prob = 0.5 * (share[: len(cases)] + share[len(cases) :])
    want = np.array([(1 - qq) ** gg for qq, gg in cases])
    np.testing.assert_allclose(prob, want, rtol=2e-6)


def test_sampled_rows_are_distinct_sorted_and_match_gap_construction():
    key, q = jax.random.key(5), 0.25
    valid = jnp.asarray(np.random.default_rng(0).random(64) < 0.8)  # holes, not a prefix
    idx, mask, draws = sampling.poisson_sample(key, q, valid, 48)
    chosen = np.asarray(idx)[np.asarray(mask)]
    assert int(draws) == 1
    assert np.all(np.diff(chosen) > 0) and np.asarray(valid)[chosen].all()
    np.testing.assert_array_equal(chosen, _reference_rows(jax.random.fold_in(key, 0), q, valid, 48))


def test_overflow_is_resampled_never_truncated():
    key, valid, q, capacity = jax.random.key(0), jnp.ones(20, bool), 0.5, 9
    idx, mask, draws = jax.jit(sampling.poisson_sample, static_argnums=3)(key, q, valid, capacity)
    draws = int(draws)
    # the accepted draw is the first that fits, and it is returned whole
    refs = [_reference_rows(jax.random.fold_in(key, a), q, valid, capacity) for a in range(draws)]
    assert all(r is None for r in refs[:-1]) and refs[-1] is not None
    np.testing.assert_array_equal(np.asarray(idx)[np.asarray(mask)], refs[-1])
    # some key must overflow at this capacity (E|batch| = 10 > 9): find one and check it
    overflowed = [
        int(sampling.poisson_sample(jax.random.key(k), q, valid, capacity)[2]) for k in range(10)
    ]
    assert max(overflowed) > 1


def test_rows_are_independent_and_batch_size_is_binomial():
    n, q, num = 30, 0.2, 6000
    inc = np.zeros((num, n), bool)
    idx, mask = _draw_many(q, jnp.ones(n, bool), sampling.poisson_capacity(n, q), num)[:2]
    for r in range(num):
        inc[r, np.asarray(idx[r])[np.asarray(mask[r])]] = True
    # neighbours (gap construction) and far rows are included together with prob. q^2
    for a, b in [(0, 1), (10, 11), (3, 25)]:
        joint = np.mean(inc[:, a] & inc[:, b])
        assert abs(joint - q * q) < 4.5 * np.sqrt(q * q * (1 - q * q) / num)
    sizes = inc.sum(axis=1)
    k = np.arange(n + 1)
    expected = stats.binom.pmf(k, n, q) * num
    keep = expected >= 5  # pool the sparse tails into their neighbours
    obs = np.bincount(sizes, minlength=n + 1).astype(float)
    lo, hi = np.flatnonzero(keep)[[0, -1]]
    o = np.concatenate([[obs[: lo + 1].sum()], obs[lo + 1 : hi], [obs[hi:].sum()]])
    e = np.concatenate([[expected[: lo + 1].sum()], expected[lo + 1 : hi], [expected[hi:].sum()]])
    assert stats.chisquare(o, e * o.sum() / e.sum()).pvalue > 1e-4


def test_geometric_ranks_saturate_at_limit():
    ranks_fn = jax.jit(sampling.geometric_ranks, static_argnums=(2, 3))
    ranks = ranks_fn(jax.random.key(0), 1e-6, 50, 1000)
    assert int(ranks.max()) == 1000 and np.all(np.diff(np.asarray(ranks)) >= 0)
    every = ranks_fn(jax.random.key(0), 1.0, 5, 1000)
    np.testing.assert_array_equal(every, np.arange(5))


def test_hopeless_capacity_gives_empty_batch_not_truncation():
    _, mask, draws = sampling.poisson_sample(jax.random.key(0), 1.0, jnp.ones(10, bool), 3)
    assert not np.asarray(mask).any()
    assert int(draws) == 65


def test_vmap_over_clients_with_own_rates_and_batch_invariance():
    n_max = 50
    valid = jnp.stack([jnp.arange(n_max) < n for n in (50, 20, 35)])
    q = jnp.array([0.1, 0.5, 0.3])
    root = jax.random.key(9)
    keys = jax.vmap(lambda c: jax.random.fold_in(root, c))(jnp.arange(3))
    fn = jax.jit(jax.vmap(lambda k, qi, v: sampling.poisson_sample(k, qi, v, 40)))
    idx, mask, _ = fn(keys, q, valid)
    for c in range(3):
        assert np.all(np.asarray(idx[c])[np.asarray(mask[c])] < int(valid[c].sum()))
        # the same client alone, with longer padding and another capacity
        alone_valid = jnp.arange(64) < int(valid[c].sum())
        alone = sampling.poisson_sample(keys[c], q[c], alone_valid, 45)
        np.testing.assert_array_equal(
            np.asarray(idx[c])[np.asarray(mask[c])], np.asarray(alone[0])[np.asarray(alone[1])]
        )


def test_shuffled_batches_cover_valid_rows_once():
    valid = jnp.arange(23) < 17
    idx, mask = sampling.shuffled_batches(jax.random.key(1), valid, 5)
    assert idx.shape == (5, 5)
    chosen = np.sort(np.asarray(idx)[np.asarray(mask)])
    np.testing.assert_array_equal(chosen, np.arange(17))


def test_gather():
    data = {"x": jnp.arange(10.0)[:, None], "y": jnp.arange(10)}
    out = sampling.gather(data, jnp.array([3, 1]))
    np.testing.assert_array_equal(out["y"], [3, 1])


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: sampling.poisson_capacity(100, 0.0), "q"),
        (lambda: sampling.poisson_capacity(100, 1.2), "q"),
        (lambda: sampling.poisson_capacity(0, 0.1), "num_examples"),
        (lambda: sampling.poisson_capacity(100, 0.1, overflow_prob=0.0), "overflow_prob"),
        (lambda: sampling.poisson_sample(jax.random.key(0), -0.1, jnp.ones(5, bool), 3), "q"),
        (lambda: sampling.poisson_sample(jax.random.key(0), 0.1, jnp.ones(5, bool), 0), "capacity"),
        (lambda: sampling.shuffled_batches(jax.random.key(0), jnp.ones(5, bool), 0), "batch_size"),
    ],
)
def test_invalid_input_names_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_sampler_delta_over_a_run_and_the_capacity_that_bounds_it():
    n, q, steps, delta, eps = 60000, 256 / 60000, 2350, 1e-5, 8.0
    # a per-step overflow of 1e-9 is NOT negligible over 2350 steps at epsilon 8
    per_step = sampling.overflow_probability(n, q, sampling.poisson_capacity(n, q))
    assert 0 < per_step < 1e-9 and sampling.sampler_delta(per_step, steps, eps) > delta
    from swarmjax.privacy.plan import PrivacyPlan

    cap = PrivacyPlan("record", n, q, steps, delta).sized(eps, composed_epsilon=eps).capacity
    assert sampling.sampler_delta(sampling.overflow_probability(n, q, cap), steps, eps) <= (
        1e-3 * delta
    )
    smaller = sampling.overflow_probability(n, q, cap - 1)
    assert sampling.sampler_delta(smaller, steps, eps) > 1e-3 * delta
    assert sampling.overflow_probability(10, 0.5, 10) == 0.0
    assert sampling.sampler_delta(1e-9, 1000, 0.0) == pytest.approx(2e-6)
