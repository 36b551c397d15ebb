"""Distributed discrete noise (issue 47): the client-side steps of
:mod:`swarmjax.privacy.discrete` and the plan of :mod:`swarmjax.privacy.distributed`."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from swarmjax.privacy import discrete
from swarmjax.privacy.chacha20 import chacha20

KEY = jax.random.key(7, impl=chacha20)


# ------------------------------------------------------------------ rotation


def test_hadamard_is_orthogonal_and_its_own_inverse_up_to_d():
    d = 64
    eye = jnp.eye(d)
    h = jax.vmap(discrete.hadamard)(eye)
    np.testing.assert_allclose(np.asarray(h @ h.T), d * np.eye(d), atol=1e-4)
    assert set(np.unique(np.asarray(h))) == {-1.0, 1.0}


def test_rotation_keeps_norm_and_inverts():
    x = jax.random.normal(jax.random.key(1), (1024,))
    signs = discrete.rotation_signs(jax.random.key(2), 1024)
    y = discrete.rotate(x, signs)
    assert float(jnp.linalg.norm(y)) == pytest.approx(float(jnp.linalg.norm(x)), rel=1e-5)
    np.testing.assert_allclose(np.asarray(discrete.unrotate(y, signs)), np.asarray(x), atol=1e-5)


def test_rotation_flattens_a_spike():
    """A one-hot vector spreads to coordinates of magnitude 1/sqrt(d)."""
    d = 4096
    x = jnp.zeros(d).at[3].set(1.0)
    y = discrete.rotate(x, discrete.rotation_signs(jax.random.key(0), d))
    np.testing.assert_allclose(np.abs(np.asarray(y)), 1 / math.sqrt(d), rtol=1e-5)


def test_padded_dim_and_bad_lengths():
    assert [discrete.padded_dim(n) for n in (1, 2, 3, 1000, 1024, 1025)] == [
        1,
        2,
        4,
        1024,
        1024,
        2048,
    ]
    with pytest.raises(ValueError, match="power-of-two"):
        discrete.hadamard(jnp.zeros(6))
    with pytest.raises(ValueError, match=">= 1 coordinate"):
        discrete.padded_dim(0)


# ------------------------------------------------------------------ rounding


@settings(max_examples=25, deadline=None)
@given(
    scale=st.sampled_from([0.0, 1e-3, 1.0, 37.0, 1e4, 3e6]),
    special=st.sampled_from([None, "nan", "inf", "huge"]),
    seed=st.integers(0, 2**16),
)
def test_conditional_rounding_never_exceeds_its_bound(scale, special, seed):
    """Whatever the input (NaN, inf, 1e30 included) the integer vector sent has
    ``||z|| <= bound``; a vector of norm c rounds within ``c + sqrt(d)``."""
    d = 256
    x = jax.random.normal(jax.random.key(seed), (d,)) * scale / math.sqrt(d)
    if special == "nan":
        x = x.at[5].set(jnp.nan)
    elif special == "inf":
        x = x.at[5].set(jnp.inf)
    elif special == "huge":
        x = x.at[5].set(1e30)
    c = float(jnp.linalg.norm(jnp.where(jnp.isfinite(x), x, 0.0)))
    bound = jnp.float32(min(c, 1e6) + math.sqrt(d) / 2 + 2.0)
    z, ok = discrete.conditional_round(jax.random.key(seed, impl=chacha20), x, bound, 8)
    norm = float(np.linalg.norm(np.asarray(z, np.float64)))
    assert norm <= float(bound)
    if special is not None:
        assert not bool(ok) and norm == 0.0


def test_rounding_is_unbiased():
    x = jnp.linspace(-3.0, 3.0, 64) + 0.3
    keys = jax.random.split(KEY, 4000)
    z, ok = jax.vmap(lambda k: discrete.conditional_round(k, x, jnp.float32(1e9), 1))(keys)
    assert bool(jnp.all(ok))
    np.testing.assert_allclose(np.asarray(z.mean(0)), np.asarray(x), atol=0.03)


def test_norm_check_is_conservative_at_the_edge():
    """A vector exactly at the bound is accepted only when the float32 sum is certain."""
    z = jnp.full((4096,), 1000, jnp.int32)
    exact = math.sqrt(4096 * 1000**2)
    assert not bool(discrete.norm_within(z, jnp.float32(exact * (1 - 1e-7))))
    assert bool(discrete.norm_within(z, jnp.float32(exact * (1 + 1e-3))))


# ------------------------------------------------------------------ Skellam


@pytest.mark.parametrize("lam", [0.4, 3.0, 9.99, 10.0, 55.0, 2.5e3])
def test_skellam_matches_its_pmf(lam):
    """Chi-square of 2^17 draws against Skellam's pmf (scipy), fixed key, p > 1e-3."""
    draws = np.asarray(jax.jit(lambda k: discrete.skellam(k, lam, (2**17,)))(KEY), np.int64)
    lo, hi = (int(v) for v in stats.skellam.ppf([1e-5, 1 - 1e-5], lam, lam))
    values = np.clip(draws, lo, hi)
    obs = np.bincount(values - lo, minlength=hi - lo + 1)
    pmf = stats.skellam.pmf(np.arange(lo, hi + 1), lam, lam)
    pmf[0] = stats.skellam.cdf(lo, lam, lam)
    pmf[-1] = stats.skellam.sf(hi - 1, lam, lam)
    exp = pmf * len(draws)
    keep = exp > 5
    chi = float(np.sum((obs[keep] - exp[keep]) ** 2 / exp[keep]))
    assert stats.chi2.sf(chi, keep.sum() - 1) > 1e-3


@pytest.mark.parametrize("lam", [3e6, 4e8])
def test_skellam_beyond_float32_integers(lam):
    """Above 2^24 only the deviation from floor(lam) is drawn: mean 0, variance 2 lam."""
    draws = np.asarray(discrete.skellam(KEY, lam, (2**16,)), np.float64)
    sd = math.sqrt(2 * lam)
    assert abs(draws.mean()) < 5 * sd / math.sqrt(len(draws))
    assert draws.var() / (2 * lam) == pytest.approx(1.0, abs=0.03)
    assert stats.kstest(draws / sd, "norm").pvalue > 1e-3


def test_skellam_zero_and_shares_sum():
    assert not np.any(np.asarray(discrete.skellam(KEY, 0.0, (100,))))
    keys = jax.random.split(KEY, 20)
    total = sum(np.asarray(discrete.skellam(k, 2.5, (2**15,)), np.int64) for k in keys)
    assert total.var() / 100.0 == pytest.approx(1.0, abs=0.05)  # Sk(50): variance 100


# ------------------------------------------------------------------ residues


@pytest.mark.parametrize("bits", [8, 12, 16, 20, 31, 32])
def test_residues_round_trip_and_sum(bits):
    rng = np.random.default_rng(bits)
    half = 2 ** (bits - 1)
    parts = rng.integers(-half // 8, half // 8, size=(8, 100), dtype=np.int64)
    words = discrete.to_residues(jnp.asarray(parts, jnp.int32), bits)
    assert int(words.max()) < 2**bits
    total = jnp.sum(words, axis=0, dtype=jnp.uint32)  # wraps modulo 2^32
    np.testing.assert_array_equal(
        np.asarray(discrete.from_residues(total, bits)), parts.sum(axis=0)
    )
