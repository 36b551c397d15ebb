"""Combined learning (algorithms.md section 6): the combination against explicit numpy loops, the
FedAvg reduction, pytrees, properties, and a short end-to-end run."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmjax.fl import iid_partition, load_dataset, simulate, stack_clients
from swarmjax.fl.algorithms.combined import (
    CombinedAggregator,
    combine,
    combine_leaf,
    pairwise_sq_sum,
    relevance,
)
from swarmjax.fl.algorithms.combined_models import thesis_model
from swarmjax.fl.algorithms.common import weighted_average
from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.algorithms.local_only import LocalOnly
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.models import mlp
from tests.reproducible import SECRET


def reference_leaf(a: np.ndarray, r: np.ndarray, conv: float, scaled: bool = True) -> np.ndarray:
    """Spec section 6 written out with explicit loops in float64."""
    k = a.shape[0]
    flat = a.reshape(k, -1).astype(np.float64)
    total = 0.0
    for h in range(k):
        for g in range(h + 1, k):
            total += np.sum((flat[h] - flat[g]) ** 2)
    threshold = math.sqrt(total) / flat.shape[1]
    sc = flat * r[:, None] if scaled else flat
    out = np.empty(flat.shape[1])
    for e in range(flat.shape[1]):
        s = 0.0
        for h in range(k):
            for g in range(h + 1, k):
                s += (sc[h, e] - sc[g, e]) ** 2
        spread = math.sqrt(s)
        mix = sum(math.exp(conv * r[h]) * sc[h, e] for h in range(k))
        out[e] = mix + spread if spread <= threshold else mix
    return out.reshape(a.shape[1:])


def test_matches_hand_computed_two_clients() -> None:
    # K = 2, r = (0.75, 0.25): threshold = sqrt(0 + 4 + 0.25) / 3 = sqrt(4.25) / 3 ~ 0.687.
    # scaled: (0.75, 1.5, 2.25) and (0.25, 0.0, 0.625); spread = |diff| = (0.5, 1.5, 1.625):
    # element 0 is under the threshold (mix + spread), elements 1 and 2 are not (mix).
    a = np.array([[1.0, 2.0, 3.0], [1.0, 0.0, 2.5]], np.float32)
    r = np.array([0.75, 0.25], np.float32)
    c = 0.5
    mix = math.exp(c * 0.75) * a[0] * 0.75 + math.exp(c * 0.25) * a[1] * 0.25
    expected = mix + np.array([0.5, 0.0, 0.0])
    got = np.asarray(combine_leaf(jnp.asarray(a), jnp.asarray(r), c))
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    np.testing.assert_allclose(got, reference_leaf(a, r, c), rtol=1e-6)


@pytest.mark.parametrize("variant", ["code", "listing"])
def test_matches_reference_loops_both_branches(variant: str) -> None:
    rng = np.random.default_rng(0)
    k = 4
    a = rng.normal(size=(k, 5, 6)).astype(np.float32)
    a[:, :2] = a[0, :2] + 0.01 * rng.normal(size=(k, 2, 6))  # close clients: under threshold
    r = rng.dirichlet(np.ones(k)).astype(np.float32)
    expected = reference_leaf(a, r, 0.3, scaled=variant == "code")
    got = np.asarray(combine_leaf(jnp.asarray(a), jnp.asarray(r), 0.3, variant=variant))
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-6)
    # the data exercise both sides of the threshold
    sc = a * r[:, None, None] if variant == "code" else a
    spread = np.sqrt(np.asarray(pairwise_sq_sum(jnp.asarray(sc, jnp.float32))))
    thr = np.sqrt(np.asarray(pairwise_sq_sum(jnp.asarray(a))).sum()) / a[0].size
    assert (spread <= thr).any() and (spread > thr).any()


def test_pairwise_sum_is_stable_for_close_clients() -> None:
    # Clients at 1 + O(1e-4): K sum x^2 - (sum x)^2 loses every digit in float32.
    rng = np.random.default_rng(1)
    x = 1.0 + 1e-4 * rng.normal(size=(10, 1000))
    exact = np.array(
        [
            sum((x[h, e] - x[g, e]) ** 2 for h in range(10) for g in range(h + 1, 10))
            for e in range(5)
        ]
    )
    got = np.asarray(pairwise_sq_sum(jnp.asarray(x, jnp.float32)))[:5]
    x32 = x.astype(np.float32)
    naive = 10 * (x32**2).sum(0)[:5] - x32.sum(0)[:5] ** 2
    np.testing.assert_allclose(got, exact, rtol=1e-3)
    assert np.max(np.abs(naive - exact) / exact) > 0.1  # the identity it replaces fails here
    assert (got >= 0).all()


def test_fedavg_variant_is_the_weighted_mean() -> None:
    # With c = 0 every element whose scaled spread exceeds the threshold is sum_h r_h a_h,
    # FedAvg's rule; the FedAvg loop's aggregate is weighted_average with weights |D_h|.
    rng = np.random.default_rng(2)
    sizes = np.array([10.0, 30.0, 60.0], np.float32)
    a = rng.normal(size=(3, 50)).astype(np.float32)
    r = sizes / sizes.sum()
    mean = np.asarray(weighted_average(jnp.asarray(a), jnp.asarray(sizes)))
    np.testing.assert_allclose(mean, (r[:, None] * a).sum(0), rtol=1e-6)
    got = np.asarray(CombinedAggregator(conv=0.0)(jnp.asarray(a), jnp.asarray(sizes)))
    sc = r[:, None] * a
    spread = np.sqrt(sum((sc[h] - sc[g]) ** 2 for h in range(3) for g in range(h + 1, 3)))
    above = spread > np.sqrt(np.asarray(pairwise_sq_sum(jnp.asarray(a))).sum()) / 50
    assert above.sum() > 40
    np.testing.assert_allclose(got[above], mean[above], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got[~above], mean[~above] + spread[~above], rtol=1e-5)


def test_nested_pytree_of_different_shapes() -> None:
    rng = np.random.default_rng(3)
    k = 3
    tree = {
        "dense": {"kernel": rng.normal(size=(k, 4, 3)), "bias": rng.normal(size=(k, 3))},
        "conv": [rng.normal(size=(k, 2, 2, 1, 5)), rng.normal(size=(k,))],
    }
    tree = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)
    r = jnp.asarray([0.2, 0.3, 0.5])
    out = combine(tree, r, 0.1)
    assert jax.tree.structure(out) == jax.tree.structure(tree)
    for leaf_in, leaf_out in zip(jax.tree.leaves(tree), jax.tree.leaves(out), strict=True):
        assert leaf_out.shape == leaf_in.shape[1:]
        expected = reference_leaf(np.asarray(leaf_in), np.asarray(r), 0.1)
        np.testing.assert_allclose(np.asarray(leaf_out), expected, rtol=1e-5, atol=1e-6)


@settings(max_examples=12, deadline=None)
@given(
    k=st.integers(2, 6),
    seed=st.integers(0, 2**16),
    conv=st.floats(-1.0, 1.0),
)
def test_permuting_clients_with_relevances_changes_nothing(k: int, seed: int, conv: float) -> None:
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(k, 7)).astype(np.float32)
    r = rng.dirichlet(np.ones(k)).astype(np.float32)
    perm = rng.permutation(k)
    base = np.asarray(combine_leaf(jnp.asarray(a), jnp.asarray(r), conv))
    permuted = np.asarray(combine_leaf(jnp.asarray(a[perm]), jnp.asarray(r[perm]), conv))
    np.testing.assert_allclose(permuted, base, rtol=1e-5, atol=1e-6)


@settings(max_examples=12, deadline=None)
@given(k=st.integers(2, 8), seed=st.integers(0, 2**16), conv=st.floats(-1.0, 1.0))
def test_identical_equal_weight_clients_give_exp_c_over_k_times_the_model(
    k: int, seed: int, conv: float
) -> None:
    # a_h = a, r_h = 1/K: spread = 0 <= threshold = 0, so new = sum_h exp(c/K) a / K.
    a = np.random.default_rng(seed).normal(size=(5, 3)).astype(np.float32)
    stacked = jnp.asarray(np.broadcast_to(a, (k, 5, 3)))
    out = np.asarray(combine_leaf(stacked, jnp.full((k,), 1.0 / k), conv))
    np.testing.assert_allclose(out, math.exp(conv / k) * a, rtol=1e-5, atol=1e-6)


def test_bad_input_raises_naming_the_parameter() -> None:
    tree = {"w": jnp.ones((3, 2))}
    with pytest.raises(ValueError, match="variant"):
        combine(tree, jnp.ones(3) / 3, variant="paper")
    with pytest.raises(ValueError, match="conv"):
        CombinedAggregator(conv=float("nan"))
    with pytest.raises(ValueError, match="relevance"):
        combine(tree, jnp.asarray([0.5, 0.6, -0.1]))
    with pytest.raises(ValueError, match="leading client axis"):
        combine(tree, jnp.ones(2) / 2)


def test_relevance_normalises_sizes() -> None:
    np.testing.assert_allclose(np.asarray(relevance([1, 3])), [0.25, 0.75])


def test_thesis_model_sizes() -> None:
    from swarmjax.models import param_count

    counts = {
        ("mnist", "smlp"): 84_060,
        ("mnist", "mmlp"): 199_210,
        ("mnist", "lmlp"): 317_220,
        ("mnist", "conv"): 1_199_882,
        ("breast_cancer", "smlp"): 8_786,
        ("breast_cancer", "mmlp"): 14_866,
    }
    for (dataset, name), n in counts.items():
        model = thesis_model(dataset, name)
        assert param_count(jax.eval_shape(model.init, jax.random.key(0))) == n, name


@pytest.mark.slow
def test_short_cl_run_on_breast_cancer_learns() -> None:
    data = load_dataset("breast_cancer")
    part = iid_partition(data.y_train, 3, seed=0, stratify=True)
    clients = stack_clients(data.x_train, data.y_train, part.indices)
    test = (data.x_test, data.y_test)
    model = mlp((32,), 2, data.input_shape)  # small: the run's cost is compilation
    training = LocalTraining(epochs=2, batch_size=16)
    cl = FedAvg(model, training, combine=CombinedAggregator())
    variants = Variants.grid(cl, clients, RunSpec(3, 1e-5), learning_rate=0.5)
    # the supplied secret fixes the draws: with a fresh one, the third round's accuracy
    # varied around the bar (0.816 against 0.832 once in CI)
    result = simulate(cl, clients, test, variants, secret=SECRET)
    acc = result.history["test_accuracy"].to_numpy()
    chance = np.bincount(data.y_test).max() / data.y_test.size  # majority class, ~0.63
    assert acc[-1] > chance + 0.2, acc
    alone = LocalOnly(model, training)
    variants = Variants.grid(alone, clients, RunSpec(2, 1e-5, (0, 1)), learning_rate=0.1)
    res = simulate(alone, clients, test, variants, secret=SECRET)
    per_client = res.metrics["test_accuracy"]  # (seeds, rounds, clients)
    assert per_client.shape == (2, 2, 3)
    assert np.all((per_client >= 0) & (per_client <= 1))
    assert per_client[:, -1].mean() > chance
    assert not np.array_equal(per_client[:, :, 0], per_client[:, :, 1])  # each client alone
