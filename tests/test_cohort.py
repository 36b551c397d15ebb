"""Cohort samplers: law of the draws, no duplicates, determinism, capacity and errors."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from swarmjax.fl.data.cohort import (
    fixed_cohort,
    poisson_cohort,
)
from swarmjax.privacy.sampling import poisson_capacity

DRAWS = 6000


def _chi2_pvalue(counts: np.ndarray) -> float:
    return float(stats.chisquare(counts).pvalue)


def test_fixed_cohort_is_uniform_over_ordered_subsets():
    n, k = 5, 2
    keys = jax.random.split(jax.random.key(1), DRAWS)
    ids = np.asarray(jax.jit(jax.vmap(lambda key: fixed_cohort(key, n, k)))(keys))
    assert (ids[:, 0] != ids[:, 1]).all() and ids.min() >= 0 and ids.max() < n
    tuples = list(itertools.permutations(range(n), k))  # 20 equally likely ordered pairs
    counts = np.array([np.sum((ids[:, 0] == a) & (ids[:, 1] == b)) for a, b in tuples])
    assert _chi2_pvalue(counts) > 1e-3


def test_fixed_cohort_large_has_no_duplicates_and_uniform_marginals():
    n, k = 200, 50
    keys = jax.random.split(jax.random.key(2), 400)
    ids = np.asarray(jax.jit(jax.vmap(lambda key: fixed_cohort(key, n, k)))(keys))
    assert all(len(set(row)) == k for row in ids)
    counts = np.bincount(ids.reshape(-1), minlength=n)  # each client in k/n of the cohorts
    assert _chi2_pvalue(counts) > 1e-3


def test_cohort_draws_are_deterministic_per_key():
    key = jax.random.key(7)
    np.testing.assert_array_equal(fixed_cohort(key, 10_000, 50), fixed_cohort(key, 10_000, 50))
    a, b = poisson_cohort(key, 10_000, 0.005, 120), poisson_cohort(key, 10_000, 0.005, 120)
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.array_equal(
        fixed_cohort(key, 10_000, 50), fixed_cohort(jax.random.key(8), 10_000, 50)
    )


def test_poisson_cohort_law_by_exact_enumeration():
    n, q, cap = 4, 0.3, 4  # capacity = n: never overflows, every subset has q^|S| (1-q)^(n-|S|)
    keys = jax.random.split(jax.random.key(3), DRAWS)
    ids, mask = jax.jit(jax.vmap(lambda key: poisson_cohort(key, n, q, cap)))(keys)
    ids, mask = np.asarray(ids), np.asarray(mask)
    assert (ids[~mask] == -1).all()
    codes = np.array([sum(1 << int(i) for i in row[m]) for row, m in zip(ids, mask, strict=True)])
    counts = np.bincount(codes, minlength=2**n)
    probs = np.array(
        [q ** bin(s).count("1") * (1 - q) ** (n - bin(s).count("1")) for s in range(2**n)]
    )
    assert float(stats.chisquare(counts, probs * DRAWS).pvalue) > 1e-3


def test_poisson_cohort_ids_sorted_distinct_and_fit():
    ids, mask = poisson_cohort(jax.random.key(4), 1000, 0.05, 90)
    real = np.asarray(ids)[np.asarray(mask)]
    assert real.size == int(mask.sum()) and (np.diff(real) > 0).all() and real.max() < 1000
    assert 20 < real.size < 90


def test_plan_sizes_the_cohort_buffer_for_the_larger_neighbour():
    from swarmjax.privacy.plan import PrivacyPlan

    n, q, rounds, delta, eps = 1200, 50 / 1200, 100, 1 / 1200, 2.0
    # sized for this run's own epsilon as the composed one (the default sizes for 64)
    plan = PrivacyPlan("client", n, q, rounds, delta).sized(eps, composed_epsilon=eps)
    cap = plan.capacity
    per_round = lambda c: stats.binom.sf(c, n + 1, q)
    assert rounds * per_round(cap) * (1 + math.exp(eps)) <= 1e-3 * delta
    assert rounds * per_round(cap - 1) * (1 + math.exp(eps)) > 1e-3 * delta
    assert plan.overflow_prob == pytest.approx(per_round(cap), rel=1e-12)
    assert cap == 97
    plan.check_capacity()
    # a short run: never below the per-round floor DP-FedAvg's resolve requires
    short = PrivacyPlan("client", n, q, 2, delta).sized(eps, composed_epsilon=eps)
    assert short.capacity == poisson_capacity(n, q, add_one=True) == cap  # > the 2-round 91
    with pytest.raises(ValueError, match=r"capacity must be >= 97 .* got 91"):
        PrivacyPlan("client", n, q, 2, delta, capacity=91).check_capacity()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: fixed_cohort(jax.random.key(0), 10, 11),
            r"cohort_size must be <= num_clients \(10\)",
        ),
        (lambda: fixed_cohort(jax.random.key(0), 10, 0), "cohort_size"),
        (lambda: poisson_cohort(jax.random.key(0), 10, 0.0, 5), r"rate must be in \(0"),
        (lambda: poisson_cohort(jax.random.key(0), 10, 1.5, 5), r"rate must be in \(0"),
    ],
)
def test_errors_name_the_option(call, message):
    with pytest.raises(ValueError, match=message) as err:
        call()
    assert "\n" not in str(err.value)


def test_fixed_cohort_under_jit_with_traced_key():
    f = jax.jit(fixed_cohort, static_argnums=(1, 2))
    ids = f(jax.random.key(5), 1_000_000, 50)
    assert ids.shape == (50,) and len(set(np.asarray(ids).tolist())) == 50
    assert jnp.all((ids >= 0) & (ids < 1_000_000))
