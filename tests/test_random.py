"""Statistical quality of the counter-based hash generator used for PSO coefficients."""

import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from swarmjax import random as hrandom

N = 200_000


def _draw(seed: int, start: int = 0, n: int = N) -> np.ndarray:
    counter = jnp.arange(start, start + n, dtype=jnp.uint32)
    return np.asarray(hrandom.hash_uniform(jnp.uint32(seed), counter), np.float64)


def test_uniform_range_and_moments():
    u = _draw(12345)
    assert u.min() >= 0.0 and u.max() < 1.0
    se = 1.0 / np.sqrt(12 * N)
    assert abs(u.mean() - 0.5) < 5 * se
    assert abs(u.var() - 1 / 12) < 5 * np.sqrt(1 / 180 / N)


def test_kolmogorov_smirnov_uniform():
    for seed in (0, 1, 2**31 - 1):
        assert stats.kstest(_draw(seed, n=50_000), "uniform").pvalue > 1e-3


def test_no_serial_correlation():
    u = _draw(7)
    lag1 = np.corrcoef(u[:-1], u[1:])[0, 1]
    assert abs(lag1) < 5 / np.sqrt(N)


def test_neighbouring_seeds_and_iterations_are_uncorrelated():
    a = _draw(int(hrandom.iteration_seed(jnp.uint32(5), 0)))
    b = _draw(int(hrandom.iteration_seed(jnp.uint32(5), 1)))
    c = _draw(int(hrandom.iteration_seed(jnp.uint32(6), 0)))
    for x, y in ((a, b), (a, c)):
        assert abs(np.corrcoef(x, y)[0, 1]) < 5 / np.sqrt(N)


def test_pairs_fill_the_unit_square():
    u = _draw(99).reshape(-1, 2)
    counts, _, _ = np.histogram2d(u[:, 0], u[:, 1], bins=10)
    chi2 = stats.chisquare(counts.ravel())
    assert chi2.pvalue > 1e-3


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_mix32_is_a_bijection_on_a_window(start):
    x = (np.arange(4096, dtype=np.uint64) + start) % 2**32
    y = np.asarray(hrandom.mix32(jnp.asarray(x.astype(np.uint32))))
    assert len(np.unique(y)) == 4096
