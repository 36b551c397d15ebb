"""APDIM (docs/algorithms.md section 5): allocation rules, grouping, preprocessing, noise,
audit, errors."""

from __future__ import annotations

import warnings

import jax
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmjax.privacy import apdim
from tests.reproducible import SECRET

# ----------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------


@st.composite
def importance_and_groups(draw, max_features: int = 12):
    d = draw(st.integers(1, max_features))
    importance = draw(st.lists(st.floats(0.0, 10.0, allow_nan=False), min_size=d, max_size=d))
    labels = draw(st.lists(st.integers(0, d - 1), min_size=d, max_size=d))
    groups = [tuple(i for i in range(d) if labels[i] == g) for g in sorted(set(labels))]
    return np.array(importance), groups


def informative_table(n: int = 600, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Feature 0 decides y, feature 1 is weakly related, feature 2 is pure noise; in [0, 1]."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    x0 = np.clip(0.3 + 0.4 * y + 0.05 * rng.normal(size=n), 0, 1)
    x1 = np.clip(0.45 + 0.1 * y + 0.2 * rng.normal(size=n), 0, 1)
    x2 = rng.uniform(size=n)
    return np.stack([x0, x1, x2], axis=1), y


def _group_sums(share: np.ndarray, groups) -> np.ndarray:
    return np.array([share[list(g)].sum() for g in groups])


# ----------------------------------------------------------------------------------------
# allocation
# ----------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    data=importance_and_groups(),
    mi_weight=st.floats(0.0, 1.0),
    base_frac=st.floats(0.01, 1.0),
    allocation=st.sampled_from(apdim.ALLOCATIONS),
    epsilon=st.floats(1e-3, 10.0),
)
def test_allocation_sums_to_epsilon_and_respects_groups(
    data, mi_weight, base_frac, allocation, epsilon
):
    importance, groups = data
    d = importance.size
    base_ratio = base_frac / d
    share = apdim.budget_shares(
        importance, groups, mi_weight=mi_weight, base_ratio=base_ratio, allocation=allocation
    )
    assert share.shape == (d,)
    assert np.all(share > 0)
    np.testing.assert_allclose(share.sum(), 1.0, rtol=1e-12)
    for g in groups:  # the group rule: one epsilon for every member of a group
        np.testing.assert_allclose(share[list(g)], share[g[0]], rtol=1e-12)
    plan = apdim.APDIMPlan(share, np.ones(d), importance, tuple(groups), allocation, "record")
    np.testing.assert_allclose(plan.epsilons(epsilon).sum(), epsilon, rtol=1e-9)
    if allocation == "corrected":
        # Averaging inside a group conserves the group's budget.
        ungrouped = apdim.budget_shares(
            importance, None, mi_weight=mi_weight, base_ratio=base_ratio, allocation=allocation
        )
        np.testing.assert_allclose(
            _group_sums(share, groups), _group_sums(ungrouped, groups), rtol=1e-9
        )


@settings(max_examples=60, deadline=None)
@given(
    importance=st.lists(st.floats(0.0, 10.0), min_size=2, max_size=10),
    mi_weight=st.floats(0.05, 1.0),
)
def test_corrected_gives_more_budget_to_more_informative_features(importance, mi_weight):
    imp = np.array(importance)
    corrected = apdim.budget_shares(imp, mi_weight=mi_weight)
    paper = apdim.budget_shares(imp, mi_weight=mi_weight, allocation="paper")
    ratio = imp / imp.sum() if imp.sum() > 0 else np.full(imp.size, 1 / imp.size)
    for i in range(imp.size):
        for j in range(imp.size):
            if ratio[i] > ratio[j] + 1e-6:
                assert corrected[i] > corrected[j]
                assert paper[i] < paper[j]  # the published formula inverts the intent


def test_fit_apdim_ranks_informative_feature_first_in_corrected_mode():
    X, y = informative_table()
    plan = apdim.fit_apdim(X, y, theta=0.99)
    assert plan.groups == ((0,), (1,), (2,))
    assert plan.importance[0] > plan.importance[1] > plan.importance[2]
    assert plan.shares[0] > plan.shares[1] > plan.shares[2]
    paper = apdim.fit_apdim(X, y, theta=0.99, allocation="paper")
    assert paper.shares[0] < paper.shares[1] < paper.shares[2]


def test_paper_allocation_reproduces_the_published_formula():
    # Formulas (4)-(8) by hand: d=3, eps=1, ratio 0.05, alpha 0.8, importance (.6, .3, .1).
    # base 0.05, remaining 0.85; adaptive = 0.85 * (1 - r * 0.8) = 0.442, 0.646, 0.782;
    # final 0.492, 0.696, 0.832; group {0, 1} -> 0.594 each; rescale by 1 / 2.02.
    share = apdim.budget_shares(
        [6.0, 3.0, 1.0], [(0, 1), (2,)], mi_weight=0.8, base_ratio=0.05, allocation="paper"
    )
    np.testing.assert_allclose(share, [0.594 / 2.02, 0.594 / 2.02, 0.832 / 2.02], rtol=1e-12)
    # Without groups, and with importance that is all zero (the code's uniform branch).
    share = apdim.budget_shares([6.0, 3.0, 1.0], mi_weight=0.8, allocation="paper")
    np.testing.assert_allclose(share, np.array([0.492, 0.696, 0.832]) / 2.02, rtol=1e-12)
    zero = apdim.budget_shares([0.0, 0.0, 0.0], allocation="paper")
    np.testing.assert_allclose(zero, [1 / 3] * 3, rtol=1e-12)


def test_corrected_allocation_values():
    # base 0.05 each, remaining 0.85 split as r^0.5 / sum r^0.5 with r = (.64, .36, 0).
    share = apdim.budget_shares([0.64, 0.36, 0.0], mi_weight=0.5)
    np.testing.assert_allclose(share, [0.05 + 0.85 * 0.8 / 1.4, 0.05 + 0.85 * 0.6 / 1.4, 0.05])


# ----------------------------------------------------------------------------------------
# grouping and preprocessing
# ----------------------------------------------------------------------------------------


def test_correlation_groups_greedy_in_feature_order():
    rng = np.random.default_rng(1)
    base = rng.uniform(size=500)
    X = np.stack(
        [base, base + 0.01 * rng.normal(size=500), rng.uniform(size=500), 1 - base, np.ones(500)],
        axis=1,
    )
    assert apdim.correlation_groups(X, 0.7) == ((0, 1, 3), (2,), (4,))
    assert apdim.correlation_groups(X, 1.0) == ((0,), (1,), (2,), (3,), (4,))
    groups = apdim.correlation_groups(rng.uniform(size=(50, 6)), 0.0)
    assert sorted(i for g in groups for i in g) == list(range(6))


def test_encoder_encodes_imputes_and_normalises():
    train = pd.DataFrame(
        {
            "age": [20.0, np.nan, 40.0, 60.0],
            "city": [" b", "a", None, "b"],
            "label": ["no", "yes", "no", "yes"],
        }
    )
    train["city"] = train["city"].str.strip()
    enc = apdim.fit_encoder(train, "label", bounds={"age": (0.0, 100.0)})
    assert enc.features == ("age", "city")
    assert enc.categories["city"] == ("a", "b")
    X, y = enc.transform(train)
    np.testing.assert_allclose(X[:, 0], [0.2, 0.4, 0.4, 0.6])  # NaN -> median 40
    np.testing.assert_allclose(X[:, 1], [1.0, 0.0, 1.0, 1.0])  # None -> mode "b"
    np.testing.assert_array_equal(y, [0, 1, 0, 1])
    test = pd.DataFrame({"age": [150.0], "city": ["zzz"], "label": ["yes"]})
    X_test, _ = enc.transform(test)
    np.testing.assert_allclose(X_test, [[1.0, 1.0]])  # clipped; unseen -> mode


def test_adult_csv_is_cleaned(data_dir):
    frame = apdim.load_csv(data_dir / "tabular" / "adults.csv").head(3000)
    assert not frame["workclass"].astype(str).str.startswith(" ").any()
    assert frame["workclass"].isna().any()  # "?" became missing
    enc = apdim.fit_encoder(frame, "income")
    X, y = enc.transform(frame)
    assert X.shape == (3000, 14)
    assert np.isfinite(X).all() and X.min() >= 0.0 and X.max() <= 1.0
    assert set(np.unique(y)) == {0, 1}


# ----------------------------------------------------------------------------------------
# noise
# ----------------------------------------------------------------------------------------


def test_sweep_shapes_scales_and_batch_invariance():
    X, y = informative_table(n=4000)
    plan = apdim.fit_apdim(X, y, theta=0.99)
    out = apdim.privatize_sweep(X, plan, [0.5, 2.0], [0, 7, 9], secret=SECRET)
    assert out.shape == (2, 3, 4000, 3)
    alone = apdim.privatize_sweep(X, plan, [2.0], [7], secret=SECRET)
    np.testing.assert_allclose(alone[0, 0], out[1, 1], rtol=1e-6)
    assert not np.allclose(out[1, 0], out[1, 1])
    # without a secret every call draws a fresh one: the same (epsilon, seed) differs
    fresh = apdim.privatize_sweep(X, plan, [2.0], [7])
    assert not np.allclose(fresh[0, 0], out[1, 1])
    # Laplace(b) has mean absolute deviation b = Delta_i / (eps * share_i).
    mad = np.abs(np.asarray(out[1]) - X[None]).mean(axis=(0, 1))
    np.testing.assert_allclose(mad, plan.noise_scale(2.0), rtol=0.08)


def test_a_releases_fingerprint_names_the_key_that_drew_it():
    """``release_fingerprint(secret, seed, epsilon)`` is the fingerprint of the key that
    drew the sweep's release at (epsilon, seed): the secret's key with the seed and the
    float32 bits of epsilon folded in (derived here step by step), whose ``privatize`` is
    that release; another seed or epsilon names another key."""
    from swarmjax.privacy.secret import fingerprint

    X, y = informative_table(n=300)
    plan = apdim.fit_apdim(X, y, theta=0.99)
    swept = apdim.privatize_sweep(X, plan, [0.5, 2.0], [3, 7], secret=SECRET)
    bits = int(np.float32(2.0).view(np.uint32))
    key = jax.random.fold_in(jax.random.fold_in(SECRET.key(), 7), bits)
    assert apdim.release_fingerprint(SECRET, 7, 2.0) == fingerprint(key)
    np.testing.assert_allclose(apdim.privatize(key, X, plan, 2.0), swept[1, 1], rtol=1e-6)
    others = {apdim.release_fingerprint(SECRET, s, e) for s, e in ((3, 2.0), (7, 0.5), (3, 0.5))}
    assert len(others) == 3 and fingerprint(key) not in others


def test_privatize_matches_plan_scale_and_clips_inputs():
    plan = apdim.uniform_plan(np.zeros((5, 4)))
    np.testing.assert_allclose(plan.shares, 0.25)
    x = np.full((20000, 4), 3.0)  # outside the unit box: clipped to 1 before noise
    out = np.asarray(apdim.privatize(jax.random.key(0), x, plan, 4.0))
    np.testing.assert_allclose(np.median(out, axis=0), 1.0, atol=0.05)
    np.testing.assert_allclose(np.abs(out - 1.0).mean(axis=0), 1.0, rtol=0.05)


def test_paper_sensitivity_warns_and_is_range_over_n():
    X, y = informative_table(n=500)
    with pytest.warns(apdim.PaperSensitivityWarning, match="NOT"):
        plan = apdim.fit_apdim(X, y, sensitivity="paper", allocation="paper")
    np.testing.assert_allclose(plan.sensitivity, np.ptp(X, axis=0) / 500)
    assert apdim.record_epsilon(plan, 1.0) > 400  # about n * epsilon
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        correct = apdim.fit_apdim(X, y)
    assert apdim.record_epsilon(correct, 1.0) == pytest.approx(1.0)


# ----------------------------------------------------------------------------------------
# empirical audit of the per-record mechanism
# ----------------------------------------------------------------------------------------


def _audit_samples(plan: apdim.APDIMPlan, epsilon: float, n: int) -> tuple[np.ndarray, ...]:
    """Privacy-loss statistic of releases of the neighbouring records 0 and 1 (every feature).

    The statistic ``sum_i eps_i (|y_i| - |y_i - 1|) / Delta_i`` is the log-likelihood ratio of
    the claimed mechanism, the most powerful test between the two records.
    """
    d = plan.num_features
    weight = plan.epsilons(epsilon) / plan.sensitivity
    stats = []
    for index, value in enumerate((0.0, 1.0)):
        key = jax.random.key(100 + index)
        y = np.asarray(apdim.privatize(key, np.full((n, d), value), plan, epsilon), np.float64)
        stats.append(np.sum(weight * (np.abs(y) - np.abs(y - 1.0)), axis=1))
    return stats[0], stats[1]


@pytest.fixture(scope="module")
def audit():
    return pytest.importorskip("swarmjax.privacy.audit").empirical_epsilon_lower_bound


def test_audit_correct_mode_is_consistent_with_epsilon(audit):
    X, y = informative_table()
    plan = apdim.fit_apdim(X, y, theta=0.99)
    epsilon = 1.0
    a, b = _audit_samples(plan, epsilon, 100_000)
    result = audit(a, b, confidence=0.999)
    assert result.epsilon_lower <= epsilon
    assert result.epsilon_lower > 0.6 * epsilon  # the audit has power: it is near tight


def test_audit_flags_paper_sensitivity(audit):
    X, y = informative_table(n=1000)
    with pytest.warns(apdim.PaperSensitivityWarning):
        plan = apdim.fit_apdim(X, y, theta=0.99, allocation="paper", sensitivity="paper")
    epsilon = 1.0
    a, b = _audit_samples(plan, epsilon, 20_000)
    result = audit(a, b, confidence=0.95)
    assert result.epsilon_lower > 5 * epsilon  # far more privacy loss than claimed


# ----------------------------------------------------------------------------------------
# errors
# ----------------------------------------------------------------------------------------


def test_unencoded_text_column_raises():
    frame = pd.DataFrame({"age": [0.1, 0.5], "city": ["a", "b"]})
    with pytest.raises(ValueError, match="column 'city' is not numeric"):
        apdim.fit_apdim(frame, [0, 1])
    with pytest.raises(ValueError, match="non-numeric column"):
        apdim.correlation_groups(np.array([["a", "b"], ["c", "d"]], dtype=object))


def test_nan_after_preprocessing_raises():
    X = np.array([[0.1, np.nan], [0.5, 0.2]])
    with pytest.raises(ValueError, match=r"NaN/inf.*column 1.*impute"):
        apdim.fit_apdim(X, [0, 1])
    frame = pd.DataFrame({"a": [0.1, 0.2], "b": [np.nan, 0.3]})
    with pytest.raises(ValueError, match="column 'b'"):
        apdim.privatize_sweep(frame, apdim.uniform_plan(np.zeros((1, 2))), [1.0], [0])


@pytest.mark.parametrize("epsilon", [0.0, -1.0])
def test_nonpositive_epsilon_raises(epsilon):
    plan = apdim.uniform_plan(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="epsilon"):
        apdim.privatize(jax.random.key(0), np.zeros((2, 3)), plan, epsilon)
    with pytest.raises(ValueError, match="epsilons"):
        apdim.privatize_sweep(np.zeros((2, 3)), plan, [1.0, epsilon], [0])
    with pytest.raises(ValueError, match="epsilon"):
        plan.epsilons(epsilon)


@pytest.mark.parametrize("theta", [-0.1, 1.5])
def test_theta_outside_unit_interval_raises(theta):
    X, y = informative_table(n=50)
    with pytest.raises(ValueError, match=r"theta must be in \[0.0, 1.0\]"):
        apdim.fit_apdim(X, y, theta=theta)
    with pytest.raises(ValueError, match="theta"):
        apdim.correlation_groups(X, theta)


def test_unknown_modes_and_bad_parameters_raise():
    X, y = informative_table(n=50)
    with pytest.raises(ValueError, match="unknown allocation 'inverse'"):
        apdim.fit_apdim(X, y, allocation="inverse")
    with pytest.raises(ValueError, match="unknown sensitivity 'mean'"):
        apdim.fit_apdim(X, y, sensitivity="mean")
    with pytest.raises(ValueError, match="mi_weight"):
        apdim.budget_shares([1.0, 2.0], mi_weight=1.5)
    with pytest.raises(ValueError, match="base_ratio must be <= 1/d"):
        apdim.budget_shares(np.ones(30), base_ratio=0.05)
    with pytest.raises(ValueError, match="non-positive budgets"):
        apdim.budget_shares(np.arange(30.0), base_ratio=0.05, allocation="paper")
    with pytest.raises(ValueError, match="groups must partition"):
        apdim.budget_shares([1.0, 2.0], [(0,), (0,)])
    with pytest.raises(ValueError, match=r"normalised to \[0, 1\]"):
        apdim.fit_apdim(X * 10, y)
