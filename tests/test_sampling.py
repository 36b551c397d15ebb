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


def test_sampled_rows_are_distinct_sorted_and_match_coins():
    key, valid, q = jax.random.key(5), jnp.ones(64, bool), 0.25
    idx, mask, draws = sampling.poisson_sample(key, q, valid, 48)
    chosen = np.asarray(idx)[np.asarray(mask)]
    coins = np.asarray(sampling.row_uniforms(jax.random.fold_in(key, 0), 64)) < q
    assert int(draws) == 1
    np.testing.assert_array_equal(chosen, np.flatnonzero(coins))


def test_overflow_is_resampled_never_truncated():
    key, valid, q, capacity = jax.random.key(0), jnp.ones(20, bool), 0.5, 9
    idx, mask, draws = jax.jit(sampling.poisson_sample, static_argnums=3)(key, q, valid, capacity)
    draws = int(draws)
    assert draws >= 1
    # the accepted draw is the first that fits, and it is returned whole
    for attempt in range(draws):
        coins = np.asarray(sampling.row_uniforms(jax.random.fold_in(key, attempt), 20)) < q
        if attempt < draws - 1:
            assert coins.sum() > capacity
    assert coins.sum() <= capacity
    np.testing.assert_array_equal(np.asarray(idx)[np.asarray(mask)], np.flatnonzero(coins))


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
