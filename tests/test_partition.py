"""Partitioners: disjoint and complete, Dirichlet skew vs alpha, pathological classes, errors."""

from __future__ import annotations

import numpy as np
import pytest

from swarmjax.fl.partition import (
    dirichlet_partition,
    iid_partition,
    label_skew,
    partition,
    pathological_partition,
)

RNG = np.random.default_rng(0)
LABELS = RNG.integers(0, 10, size=3000)


def assert_disjoint_and_complete(part, n, expected=None):
    joined = np.concatenate(part.indices)
    assert len(np.unique(joined)) == len(joined), "a row went to two clients"
    expected = np.arange(n) if expected is None else expected
    np.testing.assert_array_equal(np.sort(joined), expected)


@pytest.mark.parametrize(
    "make",
    [
        lambda: iid_partition(LABELS, 7, seed=1),
        lambda: iid_partition(LABELS, 7, seed=1, stratify=True),
        lambda: dirichlet_partition(LABELS, 5, 0.3, seed=1),
        lambda: dirichlet_partition(LABELS, 5, 1.0, seed=1, self_balancing=True),
        lambda: pathological_partition(LABELS, 3, seed=1),
    ],
)
def test_partitions_are_disjoint_and_complete(make):
    part = make()
    assert_disjoint_and_complete(part, LABELS.size)
    hist = part.histogram()
    np.testing.assert_array_equal(hist["total"], part.sizes)
    assert hist.drop(columns="total").to_numpy().sum() == LABELS.size


def test_iid_sizes_equal_and_stratified_class_counts_equal():
    part = iid_partition(LABELS, 7, seed=0)
    assert part.sizes.max() - part.sizes.min() <= 1
    strat = iid_partition(LABELS, 7, seed=0, stratify=True)
    counts = strat.histogram().drop(columns="total").to_numpy()
    assert (counts.max(axis=0) - counts.min(axis=0) <= 1).all()


def test_same_seed_same_partition_other_seed_differs():
    a = dirichlet_partition(LABELS, 5, 0.5, seed=3)
    b = dirichlet_partition(LABELS, 5, 0.5, seed=3)
    c = dirichlet_partition(LABELS, 5, 0.5, seed=4)
    for i, j in zip(a.indices, b.indices, strict=True):
        np.testing.assert_array_equal(i, j)
    assert any(
        len(i) != len(j) or (i != j).any() for i, j in zip(a.indices, c.indices, strict=True)
    )


def test_dirichlet_skew_grows_as_alpha_shrinks():
    def skew(alpha):
        return np.mean(
            [
                label_skew(dirichlet_partition(LABELS, 5, alpha, seed=s, min_partition_size=0))
                for s in range(5)
            ]
        )

    skews = [skew(a) for a in (100.0, 1.0, 0.3, 0.05)]
    assert skews == sorted(skews), skews
    assert skews[0] < 0.1 < 0.4 < skews[-1]
    assert label_skew(iid_partition(LABELS, 5, seed=0, stratify=True)) < 0.01


def test_dirichlet_min_partition_size_is_enforced_or_fails_clearly():
    part = dirichlet_partition(LABELS, 10, 0.3, seed=0, min_partition_size=50, max_attempts=200)
    assert part.sizes.min() >= 50
    with pytest.raises(ValueError, match="attempts"):
        dirichlet_partition(LABELS, 10, 0.01, seed=0, min_partition_size=290, max_attempts=3)


def test_pathological_clients_see_only_their_own_classes():
    part = pathological_partition(LABELS, 5, 2, seed=0)
    seen = [set(np.unique(LABELS[i]).tolist()) for i in part.indices]
    assert all(len(s) == 2 for s in seen)
    assert set().union(*seen) == set(range(10))
    assert sum(len(s) for s in seen) == 10  # disjoint class sets
    assert_disjoint_and_complete(part, LABELS.size)

    part = pathological_partition(LABELS, 4, 2, seed=0, shuffle_classes=False)
    kept = np.flatnonzero(LABELS < 8)  # classes 8, 9 are left unused
    assert_disjoint_and_complete(part, LABELS.size, kept)
    assert set(np.unique(LABELS[part.indices[0]]).tolist()) == {0, 1}


def test_dispatcher_and_plot(tmp_path):
    part = partition(LABELS, 4, "arbitrary", seed=0)
    assert part.scheme == "pathological"
    assert partition(LABELS, 4, "dirichlet", alpha=1.0).scheme == "dirichlet(alpha=1)"
    out = tmp_path / "hist.png"
    part.plot(out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda: iid_partition(np.arange(3) % 2, 4),
            "num_clients must be <= the number of examples",
        ),
        (lambda: dirichlet_partition(LABELS[:5], 6, 1.0, min_partition_size=0), "num_clients"),
        (lambda: dirichlet_partition(LABELS, 5, 0.0), "alpha"),
        (lambda: dirichlet_partition(LABELS, 5, -1.0), "alpha"),
        (lambda: dirichlet_partition(LABELS, 5, 1.0, min_partition_size=700), "min_partition_size"),
        (lambda: partition(LABELS, 5, "shards"), "unknown scheme"),
        (lambda: partition(LABELS, 5, "dirichlet"), "alpha"),
        (lambda: pathological_partition(LABELS, 5, 3), "classes_per_client"),
        (lambda: pathological_partition(LABELS, 11), "num_clients"),
        (lambda: iid_partition(np.array([0.5, 1.0]), 1), "integers"),
    ],
)
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()
