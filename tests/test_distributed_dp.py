"""Distributed discrete noise (issue 47): the client-side steps of
:mod:`swarmjax.privacy.discrete` and the plan of :mod:`swarmjax.privacy.distributed`."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.fft
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data import load_dataset
from swarmjax.fl.data.clients import stack_clients
from swarmjax.fl.data.partition import iid_partition
from swarmjax.fl.private import algorithm_name, private
from swarmjax.fl.protocol import Exchange, RunSpec, Variants
from swarmjax.fl.runtime import Execution, simulate, start
from swarmjax.models import mlp
from swarmjax.privacy import discrete
from swarmjax.privacy.bitpack import packed_size
from swarmjax.privacy.chacha20 import chacha20
from swarmjax.privacy.distributed import DistributedDP
from swarmjax.privacy.participation import FixedCohort, MinSeparation, Poisson
from tests.reproducible import SECRET

KEY = jax.random.key(7, impl=chacha20)
_ROUND = jax.jit(discrete.conditional_round, static_argnums=3)
_SKELLAM = jax.jit(lambda key, lam: discrete.skellam(key, lam, (2**17,)))
"""One compilation each for the tests that draw many times."""


# ------------------------------------------------------------------ rotation


def test_hadamard_is_orthogonal_and_its_own_inverse_up_to_d():
    d = 64
    eye = jnp.eye(d)
    h = jax.vmap(discrete.hadamard)(eye)
    np.testing.assert_allclose(np.asarray(h @ h.T), d * np.eye(d), atol=1e-4)
    assert set(np.unique(np.asarray(h))) == {-1.0, 1.0}


@pytest.mark.parametrize(("rotation", "d"), [("hadamard", 1024), ("dct", 1024), ("dct", 1001)])
def test_rotation_keeps_norm_and_inverts(rotation, d):
    x = jax.random.normal(jax.random.key(1), (d,))
    signs = discrete.rotation_signs(jax.random.key(2), d)
    y = discrete.rotate(x, signs, rotation)
    assert float(jnp.linalg.norm(y)) == pytest.approx(float(jnp.linalg.norm(x)), rel=1e-5)
    back = discrete.unrotate(y, signs, rotation)
    np.testing.assert_allclose(np.asarray(back), np.asarray(x), atol=1e-5)


@pytest.mark.parametrize("d", [1, 2, 7, 64, 1001])
def test_the_dct_is_orthonormal_with_the_stated_spread(d):
    """The DCT rotation's matrix ``R`` (signs all +1): ``R R^T = I`` at any length, and
    ``d max R_ki^2 <= SPREAD["dct"] = 2``, the factor wrap_bound's variance proxy uses."""
    r = np.asarray(jax.vmap(lambda e: discrete.rotate(e, jnp.ones(d), "dct"))(jnp.eye(d))).T
    np.testing.assert_allclose(r @ r.T, np.eye(d), atol=1e-5)
    assert d * np.max(r**2) <= discrete.SPREAD["dct"] * (1 + 1e-5)
    assert discrete.rotation_dim(d, "dct") == discrete.smooth_dim(d)


@pytest.mark.parametrize("d", [1, 2, 3, 7, 8, 64, 1001, 1008])
def test_the_real_fft_dct_is_scipys_orthonormal_dct_ii(d):
    """``discrete.dct`` (one real FFT, Makhoul) against scipy's float64 DCT-II, even and
    odd lengths; ``unrotate`` (jax's inverse DCT) undoes it."""
    x = np.random.default_rng(d).standard_normal(d)
    want = scipy.fft.dct(x, type=2, norm="ortho")
    got = np.asarray(discrete.dct(jnp.asarray(x, jnp.float32)), np.float64)
    np.testing.assert_allclose(got, want, atol=2e-6 * max(1.0, np.abs(want).max()))
    back = discrete.unrotate(jnp.asarray(got, jnp.float32), jnp.ones(d), "dct")
    np.testing.assert_allclose(np.asarray(back), x, atol=1e-5)


def test_the_dct_pads_to_the_next_length_of_small_prime_factors():
    """``smooth_dim``: the least ``m >= n`` with prime factors in {2, 3, 5, 7} (checked
    against a brute-force search); MNIST's 1,199,882 = 2 x 599,941 goes to 1,200,000
    (+118 coordinates, 0.01 %); zero padding keeps the norm, so the rotation of the padded
    vector keeps it too."""

    def smooth(m):
        for p in (2, 3, 5, 7):
            while m % p == 0:
                m //= p
        return m == 1

    for n in [*range(1, 300), 1001, 1210, 65537, 1_199_882]:
        m = discrete.smooth_dim(n)
        assert m >= n and smooth(m) and not any(smooth(k) for k in range(n, m))
    assert discrete.smooth_dim(1_199_882) == 1_200_000
    assert discrete.rotation_dim(1_199_882, "dct") == 1_200_000
    x = jax.random.normal(jax.random.key(4), (1001,))
    padded = jnp.pad(x, (0, discrete.rotation_dim(1001, "dct") - 1001))
    y = discrete.rotate(padded, discrete.rotation_signs(jax.random.key(5), 1008), "dct")
    assert float(jnp.linalg.norm(y)) == pytest.approx(float(jnp.linalg.norm(x)), rel=1e-5)
    with pytest.raises(ValueError, match=">= 1 coordinate"):
        discrete.smooth_dim(0)


def test_the_wrap_bound_holds_for_the_dct_rotation():
    """Over the random signs, a rotated coordinate of a fixed vector exceeds t with chance
    at most 2 exp(-t^2 / (2 spread ||x||^2 / d)) (the signal term of wrap_bound): checked on
    the worst vector for the DCT (all mass where R_ki^2 peaks) by 4,000 sign draws."""
    d = 256
    x = jnp.zeros(d).at[0].set(1.0).at[1].set(1.0)  # two spikes: ||x||^2 = 2
    keys = jax.random.split(jax.random.key(5), 4000)
    y = jax.vmap(lambda k: discrete.rotate(x, discrete.rotation_signs(k, d), "dct"))(keys)
    var = discrete.SPREAD["dct"] * 2.0 / d
    for t in (0.1, 0.15, 0.2):
        seen = float(np.mean(np.abs(np.asarray(y)) > t))
        assert seen <= 2 * math.exp(-t * t / (2 * var)) + 0.01


def test_a_bad_rotation_is_one_line():
    with pytest.raises(ValueError, match="rotation must be one of dct, hadamard"):
        DistributedDP(FixedCohort(5), rotation="dft")
    with pytest.raises(ValueError, match="rotation must be one of"):
        discrete.rotation_dim(10, "fft")
    assert DistributedDP(FixedCohort(5)).dimension(1000) == 1000
    assert DistributedDP(FixedCohort(5), rotation="hadamard").dimension(1000) == 1024


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
    z, ok = _ROUND(jax.random.key(seed, impl=chacha20), x, bound, 8)
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


@settings(max_examples=30, deadline=None)
@given(
    d=st.sampled_from([1, 7, 1024, 4096, 2**17]),
    magnitude=st.sampled_from([1, 1000, 2**20, 2**30]),
    seed=st.integers(0, 2**16),
)
def test_norm_check_certifies_its_bound(d, magnitude, seed):
    """Accepted at ``b`` only if the exact norm is within ``b sqrt(1 + sum_error(d))``;
    tried at the exact norm and one float32 step either side."""
    rng = np.random.default_rng(seed)
    z = rng.integers(-magnitude, magnitude + 1, size=d).astype(np.int64)
    exact = math.sqrt(float(np.sum(z.astype(object) ** 2)))
    limit = math.sqrt(1 + discrete.sum_error(d))
    for b in (
        np.float32(exact),
        np.nextafter(np.float32(exact), np.float32(0)),
        np.nextafter(np.float32(exact), np.float32(np.inf)),
    ):
        if bool(discrete.norm_within(jnp.asarray(z, jnp.int32), b)):
            assert exact <= float(b) * limit
    # a sensitivity a little above the norm still accepts it through its certified bound
    sens = exact * (1 + 2.0**-19) + 1e-9
    assert bool(discrete.norm_within(jnp.asarray(z, jnp.int32), discrete.certified_bound(sens, d)))


# ------------------------------------------------------------------ Skellam


@pytest.mark.parametrize("lam", [0.4, 3.0, 9.99, 10.0, 55.0, 2.5e3])
def test_skellam_matches_its_pmf(lam):
    """Chi-square of 2^17 draws against Skellam's pmf (scipy), fixed key, p > 1e-3."""
    draws = np.asarray(_SKELLAM(KEY, lam), np.int64)
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
    draws = np.asarray(_SKELLAM(KEY, lam), np.float64)
    sd = math.sqrt(2 * lam)
    assert abs(draws.mean()) < 5 * sd / math.sqrt(len(draws))
    assert draws.var() / (2 * lam) == pytest.approx(1.0, abs=0.03)
    assert stats.kstest(draws / sd, "norm").pvalue > 1e-3


_POISSON = jax.jit(lambda key, lam: discrete._poisson_deviation(key, lam, (2**17,)))


def _poisson_chi2_pvalue(draws: np.ndarray, lam: float) -> float:
    """Chi-square p-value of Poisson draws against Poisson(``lam``)'s pmf (scipy), the
    tails beyond the 1e-5 quantiles in one bin each, bins expecting > 5."""
    lo, hi = (int(v) for v in stats.poisson.ppf([1e-5, 1 - 1e-5], lam))
    obs = np.bincount(np.clip(draws, lo, hi) - lo, minlength=hi - lo + 1)
    pmf = stats.poisson.pmf(np.arange(lo, hi + 1), lam)
    pmf[0] = stats.poisson.cdf(lo, lam)
    pmf[-1] = stats.poisson.sf(hi - 1, lam)
    exp = pmf * len(draws)
    keep = exp > 5
    chi = float(np.sum((obs[keep] - exp[keep]) ** 2 / exp[keep]))
    return float(stats.chi2.sf(chi, keep.sum() - 1))


@pytest.mark.parametrize("lam", [10.0, 12.5, 40.0, 1e3, 2e5])
def test_ptrs_with_its_buffers_matches_poissons_pmf(lam):
    """2^17 Poisson draws of the PTRS path (first pass, shrinking buffers, in-place loop)
    against Poisson's pmf, fixed key, p > 1e-3; the same draws are refused against a pmf
    shifted by a tenth of a standard deviation (the test has the power to see a wrong
    sampler)."""
    draws = np.asarray(_POISSON(KEY, lam), np.int64) + math.floor(lam)
    assert _poisson_chi2_pvalue(draws, lam) > 1e-3
    assert _poisson_chi2_pvalue(draws, lam + 0.1 * math.sqrt(lam)) < 1e-6


@pytest.mark.parametrize("n", [2**16, 2**16 + 1])
def test_uniform_pairs_are_independent_24_bit_uniforms(n):
    """PTRS's ``(u, v)`` from 1.5 keystream words a proposal: each on the 24-bit grid of
    ``(0, 1]``, uniform (KS), the two and neighbouring lanes uncorrelated, and ``v``'s
    lanes built from the three words' low bytes as uniform as the others."""
    u, v = (np.asarray(a, np.float64) for a in discrete._uniform_pairs(KEY, n))
    assert u.shape == v.shape == (n,)
    half = -(-n // 2)
    for x in (u, v, v[half:]):
        assert np.all((x > 0) & (x <= 1)) and np.all(x * 2**24 == np.round(x * 2**24))
        assert stats.kstest(x, "uniform").pvalue > 1e-3
    for a, b in ((u, v), (u[:-1], u[1:]), (v[:-1], v[1:]), (u[: n // 2], u[half:])):
        assert abs(np.corrcoef(a, b)[0, 1]) < 5 / math.sqrt(len(a))


def test_the_acceptance_tests_terms_are_float64s_to_float32():
    """The Stirling table and the series of log(1 + t) - t against float64."""
    k = np.arange(1, 10, dtype=np.float64)
    exact = np.array([math.lgamma(v + 1) for v in k]) - (
        k * np.log(k) - k + 0.5 * np.log(2 * math.pi * k)
    )
    np.testing.assert_allclose(discrete._STIRLING_SMALL[1:], exact, rtol=1e-7)
    kf = jnp.arange(1.0, 40.0)
    got = np.asarray(discrete._stirling(kf, 1.0 / kf), np.float64)
    big = np.arange(1.0, 40.0)
    want = np.array([math.lgamma(v + 1) for v in big]) - (
        big * np.log(big) - big + 0.5 * np.log(2 * math.pi * big)
    )
    np.testing.assert_allclose(got, want, rtol=2e-6)
    t = np.concatenate([np.linspace(-0.9, 3.0, 2001), np.geomspace(1e-6, 0.3, 200)])
    t = np.concatenate([t, -t[t < 0.9]]).astype(np.float32)
    got = np.asarray(discrete._log1p_minus(jnp.asarray(t)), np.float64)
    want = np.log1p(t.astype(np.float64)) - t.astype(np.float64)
    assert np.all(np.abs(got - want) <= 2e-6 * np.abs(want) + 1e-7 * np.abs(t) ** 2)


def test_each_sampler_runs_for_its_own_lam_under_a_batched_lam():
    """Vmapped over lam (variants), inversion below 10 and PTRS above give each variant
    what an unbatched call gives; vmapped over keys of long vectors, one call at a time
    gives what separate calls give."""
    lams = jnp.asarray([3.0, 2.5e3, 0.0], jnp.float32)
    batched = jax.vmap(lambda lam: discrete.skellam(KEY, lam, (300,)))(lams)
    for row, lam in zip(np.asarray(batched), lams, strict=True):
        np.testing.assert_array_equal(row, np.asarray(discrete.skellam(KEY, lam, (300,))))
    keys = jax.random.split(KEY, 3)
    d = discrete._SEQUENTIAL_LANES
    mapped = jax.jit(jax.vmap(lambda k: discrete.skellam(k, 40.0, (d,))))(keys)
    for row, k in zip(np.asarray(mapped), keys, strict=True):
        np.testing.assert_array_equal(row, np.asarray(discrete.skellam(k, 40.0, (d,))))


def test_skellam_zero_and_shares_sum():
    assert not np.any(np.asarray(_SKELLAM(KEY, 0.0)))
    keys = jax.random.split(KEY, 20)
    total = sum(np.asarray(_SKELLAM(k, 2.5), np.int64) for k in keys)
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


# ------------------------------------------------------------------ the plan end to end


MODEL = mlp((16,), 10, (8, 8, 1))  # 64 * 16 + 16 + 16 * 10 + 10 = 1,210 parameters (d = 1,215)
N, PER_CLIENT, ROUNDS, DELTA = 12, 40, 3, 1e-3
TRAINING = LocalTraining(epochs=1, batch_size=10)
SPEC = RunSpec(ROUNDS, DELTA, (0,), accountant="rdp")


def _inner() -> FedAvg:
    return FedAvg(MODEL, TRAINING, server_optimizer="sgd", weighting="uniform")


@pytest.fixture(scope="module")
def digits():
    data = load_dataset("digits")
    x, y = data.x_train[: N * PER_CLIENT], data.y_train[: N * PER_CLIENT]
    clients = stack_clients(x, y, iid_partition(y, N, seed=0).indices)
    return clients, (data.x_test[:200], data.y_test[:200])


def _simulate(alg, digits, **grid):
    clients, test = digits
    variants = Variants.grid(alg, clients, SPEC, **grid)
    res = simulate(alg, clients, test, variants, secret=SECRET, execution=Execution(progress=False))
    return res, variants


PIPE = DistributedDP(FixedCohort(6), bits=32, min_survivors=5, max_colluders=1)
"""One plan for the pipeline tests (one compilation): t = 5 of 6, h = 4 honest."""


@functools.cache
def _round_fn():
    """Every client's encode (vmapped), the masks, the survivors' secure sum and the
    decode, as a round runs them, compiled once."""

    @jax.jit
    def run(stacked, hyper, key, lost):
        rounds = jnp.int32(2)
        keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(6))
        encoded = jax.vmap(lambda u, k: PIPE.encode(u, hyper, rounds, k))(stacked, keys)
        state = PIPE.init(hyper).replace(rounds=rounds)
        like = jax.tree.map(lambda a: a[0], stacked)
        ids = jnp.arange(6, dtype=jnp.int32) * 3  # any public ids
        return PIPE.release(state, encoded, ~lost, ids, key, hyper, like)[:3]

    return run


def _pipeline(updates: np.ndarray, hyper, dropped=()) -> tuple:
    """``updates``: ``(6, 40, 25)``; ``dropped``: slots whose upload is lost."""
    lost = np.zeros(6, bool)
    lost[list(dropped)] = True
    return _round_fn()({"w": jnp.asarray(updates, jnp.float32)}, hyper, KEY, jnp.asarray(lost))


def _hyper(clip: float, scale: float, mu: float):
    l1, l2 = PIPE.sensitivities(clip, scale, 1024)
    return PIPE.default_hyper(N, ROUNDS).replace(
        initial_clip=jnp.float32(clip),
        grid_scale=jnp.float32(scale),
        noise=jnp.float32(mu),
        l2_bound=jnp.float32(l2),
        l1_bound=jnp.float32(l1),
    )


@pytest.mark.parametrize("dropped", [(), (1,)])
def test_encode_mask_unmask_decode_gives_the_survivors_sum(dropped):
    """Noiseless at 32 bits and a fine grid, the decoded sum is the survivors' clipped sum
    to the grid's resolution, with a dropout within the threshold (a dropped client's
    upload never reaches the server)."""
    updates = np.random.default_rng(1).normal(size=(6, 40, 25))
    clip = 20.0
    total, survived, ok = _pipeline(updates, _hyper(clip, 2.0**14, 0.0), dropped)
    assert bool(ok) and int(survived.sum()) == 6 - len(dropped)
    expect = sum(
        u * min(1.0, clip / float(np.linalg.norm(u)))
        for i, u in enumerate(updates)
        if i not in dropped
    )
    np.testing.assert_allclose(np.asarray(total["w"]), expect, atol=8 * 2.0**-14)


def test_noise_reaches_the_decoded_sum_with_its_variance():
    """With Skellam shares, the decoded sum's error has variance ``6 shares * 2 mu / h /
    gamma^2`` per coordinate (the rotation keeps it)."""
    scale, mu = 4.0, 900.0
    total, _, ok = _pipeline(np.zeros((6, 40, 25)), _hyper(1.0, scale, mu))
    expect = 6 * 2 * mu / PIPE.honest / scale**2
    assert bool(ok) and np.asarray(total["w"]).var() / expect == pytest.approx(1.0, abs=0.15)


def test_noise_std_is_the_decoded_sums_noise_in_clip_units():
    """``DistributedDP.noise_std``: the std per coordinate of one round's decoded-sum noise
    over the clip, ``sqrt(2 mu m / h) / (gamma C)``, as measured; an unresolved plan (NaN
    grid) is one ``ValueError`` line naming it."""
    scale, mu, clip = 4.0, 900.0, 2.0
    hyper = _hyper(clip, scale, mu)
    want = np.sqrt(2 * mu * 6 / PIPE.honest) / (scale * clip)
    np.testing.assert_allclose(PIPE.noise_std(hyper), want, rtol=1e-12)
    total, _, ok = _pipeline(np.zeros((6, 40, 25)), hyper)
    measured = np.asarray(total["w"]).std() / clip
    assert bool(ok) and measured / float(PIPE.noise_std(hyper)) == pytest.approx(1.0, abs=0.08)
    stacked = jax.tree.map(lambda a: jnp.stack([a, a]), hyper)  # one value per variant
    np.testing.assert_allclose(PIPE.noise_std(stacked), [want, want], rtol=1e-12)
    assert PIPE.noise_std(_hyper(clip, scale, 0.0)) == 0.0
    with pytest.raises(ValueError, match="grid_scale"):
        PIPE.noise_std(PIPE.default_hyper(N, ROUNDS))


def test_too_few_survivors_release_nothing():
    total, survived, ok = _pipeline(np.ones((6, 40, 25)), _hyper(1.0, 100.0, 10.0), (0, 3))
    assert not bool(ok) and int(survived.sum()) == 4
    assert not np.any(np.asarray(total["w"]))


@pytest.fixture(scope="module")
def dp_run(digits):
    schedule = MinSeparation(4).for_run(N, ROUNDS)
    alg = private(_inner(), DistributedDP(schedule, bits=20, min_survivors=3, max_colluders=1))
    return (alg, *_simulate(alg, digits, initial_clip=0.5, epsilon_target=[4.0]))


def test_record_is_the_skellam_event_that_calibrated(dp_run):
    alg, res, variants = dp_run
    p = res.privacy
    assert algorithm_name(alg) == "Distributed(FedAvg)"
    assert p.unit == "client" and p.accountant == "rdp"
    eps = float(np.max(p.final_epsilon))
    assert 3.9 <= eps <= 4.0 + 1e-9  # calibrated to the target, not far below
    ((_, event, _),) = p.run_events(0)
    leaves = [event] if not hasattr(event, "event") else [event.event]
    assert all(type(e).__name__ == "SkellamDpEvent" for e in leaves)
    hyper = jax.tree.map(lambda a: np.asarray(a)[0], variants.hyper.plan)
    k = alg.plan.compositions(N, ROUNDS)
    assert alg.plan.epsilon(hyper, k, DELTA) == pytest.approx(eps, rel=1e-9)
    z = float(np.asarray(p.noise_multiplier).ravel()[0])
    assert z == pytest.approx(math.sqrt(2 * float(hyper.noise)) / float(hyper.l2_bound))
    assert "secure aggregation" in " ".join(p.covers)


def test_the_history_counts_the_packed_upload(digits):
    """The history's bytes up per client (what :func:`start` hands it) are the packed upload,
    ``ceil(d b / 8)`` (the 1,210 parameters rotated in d = 1,215 = 3^5 x 5 coordinates: at
    13 bits 15,795 bits, 1,975 bytes), where FedAvg's stay the float32 model and its
    weight."""
    clients, test = digits
    n, d = 1210, 1215
    fedavg = start(_inner(), clients, test, Variants.grid(_inner(), clients, SPEC), secret=SECRET)
    assert fedavg.sizes[0][1] == 4 * n + 4
    for bits, expect in [(8, 1215), (13, 1975), (20, 3038), (32, 4860)]:
        alg = private(_inner(), DistributedDP(FixedCohort(6), bits=bits, min_survivors=5))
        variants = Variants.grid(alg, clients, SPEC, initial_clip=0.5, grid_scale=1.0, noise=0.0)
        sizes = start(alg, clients, test, variants, secret=SECRET).sizes
        assert sizes[0][1] == packed_size(d, bits) == math.ceil(d * bits / 8) == expect
        assert sizes[0][0] == fedavg.sizes[0][0] + 4  # the model and the round index down


def test_reply_bits_pack_unsigned_leaves_only():
    """``Exchange.reply_bits`` packs the unsigned-integer leaves; floats, signed integers and
    bools keep their full width; a narrower unsigned leaf or bad bits: one line."""
    words, floats = jax.ShapeDtypeStruct((5,), jnp.uint32), jax.ShapeDtypeStruct((3,), jnp.float32)
    reply = {"w": words, "f": floats, "i": jnp.zeros((2,), jnp.int32), "b": jnp.zeros((3,), bool)}
    fns = (None,) * 4
    assert Exchange("x", *fns).reply_bytes(reply) == 20 + 12 + 8 + 3
    assert Exchange("x", *fns, reply_bits=12).reply_bytes(reply) == 8 + 12 + 8 + 3
    with pytest.raises(ValueError, match="reply_bits=12 exceeds its uint8") as err:
        Exchange("x", *fns, reply_bits=12).reply_bytes(jnp.zeros((4,), jnp.uint8))
    assert "\n" not in str(err.value)
    for bad in (0, 33, 8.0):
        with pytest.raises(ValueError, match="reply_bits"):
            Exchange("x", *fns, reply_bits=bad)


def test_a_run_releases_the_packed_bytes(dp_run):
    alg, res, _ = dp_run
    h = res.history
    per_client = h["bytes_up"] / h[f"selected_{alg.exchanges[0].name}"]
    # the 1,210 parameters rotated in d = 1,215 coordinates (DCT: zero-padded)
    assert (per_client == packed_size(1215, 20)).all() and packed_size(1215, 20) == 3038
    np.testing.assert_array_equal(h["cum_bytes_up"], np.cumsum(h["bytes_up"]))


def test_dropouts_beyond_the_threshold_refuse_the_round(digits):
    plan = DistributedDP(FixedCohort(4), bits=20, min_survivors=4, dropout=0.999)
    alg = private(_inner(), plan)
    res, _ = _simulate(alg, digits, initial_clip=0.5, epsilon_target=[8.0])
    assert list(res.history["refused_rounds"]) == [1, 2, 3]
    # the model never moved: every round refused
    acc = res.history["test_accuracy"].to_numpy()
    assert np.all(acc == acc[0])


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: DistributedDP(Poisson()), "public cohort"),
        (lambda: DistributedDP(FixedCohort(4), bits=7), "bits"),
        (lambda: DistributedDP(FixedCohort(4), bits=33), "bits"),
        (lambda: DistributedDP(FixedCohort(4), min_survivors=5), "threshold|min_survivors"),
        (lambda: DistributedDP(FixedCohort(4), min_survivors=3, max_colluders=3), "max_colluders"),
        (lambda: DistributedDP(MinSeparation(4)), "min_separation"),
        (lambda: DistributedDP(FixedCohort(4), dropout=1.0), "dropout"),
    ],
)
def test_bad_settings_are_one_line(make, match):
    with pytest.raises(ValueError, match=match) as err:
        make()
    assert "\n" not in str(err.value)


def test_bits_too_few_for_the_target_name_the_bits_that_work(digits):
    plan = DistributedDP(FixedCohort(6), bits=8)
    clients, _ = digits
    with pytest.raises(ValueError, match=r"bits=8 cannot carry .* use bits >= \d+") as err:
        Variants.grid(private(_inner(), plan), clients, SPEC, epsilon_target=[0.5])
    assert "\n" not in str(err.value)


def test_pld_accountant_is_refused_in_one_line(digits):
    clients, _ = digits
    alg = private(_inner(), DistributedDP(FixedCohort(4), bits=20))
    with pytest.raises(ValueError, match="accountant") as err:
        Variants.grid(alg, clients, RunSpec(ROUNDS, DELTA, (0,)), epsilon_target=[4.0])
    assert "\n" not in str(err.value)


def test_wrap_bound_holds_empirically():
    """Worst-case aligned updates of a cohort at a grid where the bound is about 1e-2:
    the measured per-coordinate wrap frequency stays below the bound."""
    from swarmjax.privacy.distributed import wrap_bound

    bits, m, d, lam = 10, 8, 1024, 400.0
    scaled = 2.0 ** (bits - 1) * math.sqrt(d) / m / 6.0
    bound = wrap_bound(bits, m, scaled, d, m * lam)
    assert 1e-4 < bound < 0.2
    rng = np.random.default_rng(0)
    direction = rng.standard_normal(d)
    direction *= scaled / np.linalg.norm(direction)
    trials = 40

    @jax.jit
    def totals(t):  # one trial: fresh signs, m clients' rounding and noise, their sum
        k = jax.random.fold_in(KEY, t)
        x = discrete.rotate(jnp.asarray(direction, jnp.float32), discrete.rotation_signs(k, d))

        def client(i):
            ki = jax.random.fold_in(k, 1000 + i)
            z, _ = discrete.conditional_round(ki, x, jnp.float32(1e9), 1)
            return z + discrete.skellam(ki, lam, (d,))

        return jnp.sum(jax.vmap(client)(jnp.arange(m)), axis=0)

    sums = np.stack([np.asarray(totals(t)) for t in range(trials)])
    assert np.mean(np.abs(sums) >= 2 ** (bits - 1)) <= bound


def test_ptrs_buffer_overflow_still_samples_every_coordinate(monkeypatch):
    """With buffers far too small for the first pass's rejections, further passes serve
    the coordinates beyond them: every coordinate is still a Poisson draw."""
    monkeypatch.setattr(discrete, "_BUFFER", 4096)
    lam = 400.0
    draws = np.asarray(discrete._poisson_deviation(KEY, lam, (2**14,)), np.float64) + 400
    assert abs(draws.mean() - lam) < 5 * math.sqrt(lam / len(draws))
    assert draws.var() / lam == pytest.approx(1.0, abs=0.05)
    assert stats.kstest((draws - lam) / math.sqrt(lam), "norm").pvalue > 1e-4


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--accountant", "pld"], "--accountant pld with --algorithms dp-fedavg-secagg"),
        (["--bits", "7"], "--bits: must be >= 8"),
        (["--algorithms", "dp-fedavg", "--bits", "16"], "--bits does not apply"),
        (["--min-survivors", "9"], "min_survivors"),
    ],
)
def test_cross_device_secagg_bad_input_is_one_line(tmp_path, capsys, extra, message):
    from experiments import cross_device
    from tests.argv import override

    args = [
        "--quick", "--datasets", "digits", "--clients", "40", "--rows-per-client", "20",
        "--cohort", "5", "--rounds", "2", "--algorithms", "dp-fedavg-secagg",
    ]  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        cross_device.main([*override(args, extra), "--out", str(tmp_path / "bad")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
