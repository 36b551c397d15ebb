"""PRAM and DP random dictatorship: epsilons, output laws, and an empirical audit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from swarmjax.privacy import mechanisms as mech
from swarmjax.privacy.audit import empirical_epsilon_lower_bound


def test_pram_epsilon_matches_the_paper():
    eps = mech.randomized_response_epsilon(np.array([0.6, 0.7, 0.8, 0.9]), 8)
    np.testing.assert_allclose(eps, [2.35, 2.79, 3.33, 4.14], atol=0.006)
    assert np.isinf(mech.randomized_response_epsilon(1.0, 8))
    assert mech.randomized_response_epsilon(1 / 8, 8) == pytest.approx(0.0, abs=1e-12)


def test_pram_output_law():
    c, p, n = 5, 0.7, 200_000
    out = np.asarray(mech.randomized_response(jax.random.key(0), jnp.full(n, 2), c, p))
    counts = np.bincount(out, minlength=c)
    expected = np.full(c, (1 - p) / (c - 1) * n)
    expected[2] = p * n
    assert stats.chisquare(counts, expected).pvalue > 1e-3


def test_pram_audit_finds_no_more_loss_than_claimed():
    c, p, n = 8, 0.8, 100_000
    claimed = float(mech.randomized_response_epsilon(p, c))
    a = mech.randomized_response(jax.random.key(1), jnp.zeros(n, jnp.int32), c, p)
    b = mech.randomized_response(jax.random.key(2), jnp.ones(n, jnp.int32), c, p)
    result = empirical_epsilon_lower_bound(np.asarray(a), np.asarray(b), confidence=0.999)
    assert result.epsilon_lower <= claimed
    assert result.epsilon_lower > 0.8 * claimed  # the audit is sharp enough to matter


def test_pram_audit_flags_a_false_claim():
    c, n = 8, 100_000
    a = mech.randomized_response(jax.random.key(1), jnp.zeros(n, jnp.int32), c, 0.9)
    b = mech.randomized_response(jax.random.key(2), jnp.ones(n, jnp.int32), c, 0.9)
    claimed_for_0_6 = float(mech.randomized_response_epsilon(0.6, c))
    result = empirical_epsilon_lower_bound(np.asarray(a), np.asarray(b), confidence=0.99)
    assert result.epsilon_lower > claimed_for_0_6


def test_random_dictatorship_frequencies_follow_votes_plus_one():
    votes = jnp.array([0, 0, 0, 1, 2, 2, 5, 7, 7, 7, 7, 3])
    mask = jnp.array([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0], bool)  # the last voter abstains
    m, draws = 8, 100_000
    keys = jax.random.split(jax.random.key(3), draws)
    outcomes, pool = jax.vmap(lambda k: mech.random_dictatorship(k, votes, mask, m))(keys)
    assert int(pool[0]) == 11 + m
    counts = np.bincount(np.asarray(outcomes), minlength=m)
    probs = np.asarray(mech.random_dictatorship_probs(mech.vote_counts(votes, mask, m)))
    np.testing.assert_allclose(probs, (np.array([3, 1, 2, 0, 0, 1, 0, 4]) + 1) / 19)
    assert stats.chisquare(counts, probs * draws).pvalue > 1e-3


def test_pram_dictatorship_masking_only_the_dictator_has_the_law_of_masking_every_ballot():
    """PbDRD's shortcut (mask the drawn ballot only) against the exact law and against the
    literal protocol (mask every ballot, then the dictatorship), by chi-square."""
    votes = jnp.array([0, 0, 0, 1, 2, 2, 5, 7, 7, 7, 7, 3])
    mask = jnp.array([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0], bool)
    m, p, draws = 8, 0.6, 100_000
    probs = np.asarray(mech.random_dictatorship_pram_probs(votes, mask, m, p), np.float64)
    counts = np.array([3, 1, 2, 0, 0, 1, 0, 4])
    q = (1 - p) / (m - 1)
    np.testing.assert_allclose(probs, (1 + p * counts + q * (11 - counts)) / 19, rtol=1e-6)
    uniforms = jax.random.uniform(jax.random.key(5), (draws, 3))
    short = jax.vmap(lambda u: mech.dictatorship_pram_from_counts(u, jnp.asarray(counts), p))
    outcome, pool = short(uniforms)
    assert int(pool[0]) == 19
    keys = jax.random.split(jax.random.key(6), (draws, 2))
    literal = jax.vmap(
        lambda k: mech.random_dictatorship(
            k[0], mech.randomized_response(k[1], votes, m, p), mask, m
        )[0]
    )(keys)
    for sample in (outcome, literal):
        observed = np.bincount(np.asarray(sample), minlength=m)
        assert stats.chisquare(observed, probs / probs.sum() * draws).pvalue > 1e-3


def test_dictatorship_from_counts_matches_the_ballot_pool():
    """Every position of the sorted pool maps to its alternative: exact, no sampling."""
    counts = jnp.array([2, 0, 3, 1])
    pool = 6 + 4
    u = (jnp.arange(pool) + 0.5) / pool
    outcome, n = jax.vmap(lambda x: mech.dictatorship_from_counts(x, counts))(u)
    assert int(n[0]) == pool
    np.testing.assert_array_equal(np.bincount(np.asarray(outcome), minlength=4), [3, 1, 4, 2])


def test_random_dictatorship_epsilon_and_audit():
    n_voters, m = 6, 4
    pool = n_voters + m
    eps = float(mech.random_dictatorship_epsilon(pool))
    assert eps == pytest.approx(np.log(2 * pool / (pool + 1)))
    # neighbours: a voter for alternative 0 is added; alternative 0 had no real vote
    votes = jnp.array([1, 1, 2, 2, 3, 3, 0])
    with_voter = jnp.ones(7, bool)
    without = with_voter.at[6].set(False)
    keys = jax.random.split(jax.random.key(4), 200_000)
    draw = jax.vmap(lambda k, msk: mech.random_dictatorship(k, votes, msk, m)[0], (0, None))
    a, b = np.asarray(draw(keys, with_voter)), np.asarray(draw(keys[::-1], without))
    result = empirical_epsilon_lower_bound(a, b, confidence=0.999)
    bound_bigger_pool = float(mech.random_dictatorship_epsilon(pool + 1))
    assert result.epsilon_lower <= bound_bigger_pool
    assert result.epsilon_lower > 0.5 * bound_bigger_pool


def test_mechanism_validation_names_parameter():
    with pytest.raises(ValueError, match="keep_prob"):
        mech.randomized_response_epsilon(1.5, 8)
    with pytest.raises(ValueError, match="num_categories"):
        mech.randomized_response(jax.random.key(0), jnp.zeros(3, jnp.int32), 1, 0.5)
    with pytest.raises(ValueError, match="epsilon"):
        mech.gaussian_sigma(1.5, 1e-5)
    with pytest.raises(ValueError, match="l1_sensitivity"):
        mech.laplace_mechanism(jax.random.key(0), jnp.zeros(3), l1_sensitivity=0.0, epsilon=1.0)


def test_gaussian_mechanism_pytree_noise_std_independence_and_invariance():
    """One flat draw cut into the leaves: each coordinate N(0, (sigma C)^2), leaves not
    correlated, the same key and tree give the same noise alone or under vmap."""
    tree = {"w": jnp.zeros((60, 50)), "b": jnp.zeros(3000), "i": jnp.zeros(7, jnp.int32)}
    noisy = jax.jit(
        lambda k: mech.gaussian_mechanism(k, tree, l2_sensitivity=2.0, noise_multiplier=1.5)
    )
    out = noisy(jax.random.key(0))
    assert out["w"].shape == (60, 50) and out["i"].dtype == jnp.float32
    for leaf in (out["w"].ravel(), out["b"]):
        assert abs(float(jnp.std(leaf)) - 3.0) < 0.15
        assert abs(float(jnp.mean(leaf))) < 0.25  # 4.5 standard errors
    corr = np.corrcoef(np.asarray(out["w"]).ravel()[:3000], np.asarray(out["b"]))[0, 1]
    assert abs(corr) < 0.08
    keys = jax.random.split(jax.random.key(1), 3)
    batched = jax.vmap(noisy)(keys)
    np.testing.assert_array_equal(batched["b"][2], noisy(keys[2])["b"])
