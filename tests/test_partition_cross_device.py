"""Partitions for many clients: shards, power-law sizes, consecutive chunks; existing
schemes unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from swarmjax.fl.data.partition import (
    SCHEMES,
    consecutive_partition,
    iid_partition,
    label_skew,
    partition,
    power_law_partition,
    power_law_sizes,
    shards_partition,
)

LABELS = np.random.default_rng(0).integers(0, 10, size=6000)


def assert_disjoint(part):
    joined = np.concatenate(part.indices)
    assert len(np.unique(joined)) == len(joined), "a row went to two clients"
    return joined


def test_new_schemes_are_dispatched():
    assert {"shards", "power_law", "consecutive"} <= set(SCHEMES)
    assert partition(LABELS, 30, "shards", shards_per_client=2).scheme == "shards(s=2)"
    assert partition(LABELS, 30, "power_law", seed=1).scheme == "power_law(a=1.5)"
    assert partition(LABELS, 30, "consecutive", size=100).scheme == "consecutive(size=100)"


def test_shards_give_few_labels_each_and_equal_sizes():
    part = shards_partition(LABELS, 100, shards_per_client=2, seed=3)
    assert_disjoint(part)
    assert (part.sizes == 2 * (6000 // 200)).all()
    labels_per_client = [np.unique(LABELS[i]).size for i in part.indices]
    assert max(labels_per_client) <= 4 and np.mean(labels_per_client) < 2.6
    assert label_skew(part) > 0.6 > label_skew(iid_partition(LABELS, 100))


def test_power_law_sizes_use_every_row_with_a_heavy_tail():
    sizes = power_law_sizes(60_000, 1000, exponent=1.5, min_size=20, seed=0)
    assert sizes.sum() == 60_000 and sizes.min() >= 20
    assert sizes.max() > 10 * np.median(sizes)  # heavy tail
    part = power_law_partition(LABELS, 200, min_size=5, seed=2)
    np.testing.assert_array_equal(np.sort(assert_disjoint(part)), np.arange(6000))
    np.testing.assert_array_equal(part.sizes, power_law_sizes(6000, 200, min_size=5, seed=2))


def test_power_law_with_dirichlet_labels_is_skewed_and_complete():
    iid = power_law_partition(LABELS, 200, min_size=5, seed=2)
    skew = power_law_partition(LABELS, 200, min_size=5, alpha=0.1, seed=2)
    np.testing.assert_array_equal(skew.sizes, iid.sizes)
    np.testing.assert_array_equal(np.sort(assert_disjoint(skew)), np.arange(6000))
    assert label_skew(skew) > label_skew(iid) + 0.3


def test_consecutive_is_a_seeded_shuffle_cut_in_chunks():
    part = consecutive_partition(LABELS, 120, size=50, seed=7)
    order = np.random.default_rng(7).permutation(6000)
    for i, rows in enumerate(part.indices):
        np.testing.assert_array_equal(rows, np.sort(order[50 * i : 50 * (i + 1)]))
    assert consecutive_partition(LABELS, 7).sizes.tolist() == [6000 // 7] * 7


def test_same_seed_same_clients():
    for scheme, kw in [("shards", {}), ("power_law", {"alpha": 0.5}), ("consecutive", {})]:
        a, b = (
            partition(LABELS, 40, scheme, seed=5, **kw),
            partition(LABELS, 40, scheme, seed=5, **kw),
        )
        assert all(np.array_equal(x, y) for x, y in zip(a.indices, b.indices, strict=True))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: shards_partition(LABELS, 4000, 2), "num_clients \\* shards_per_client"),
        (lambda: shards_partition(LABELS, 10, 0), "shards_per_client"),
        (lambda: power_law_partition(LABELS, 100, min_size=100), "min_size \\* num_clients"),
        (lambda: power_law_partition(LABELS, 100, exponent=0), "exponent"),
        (lambda: power_law_partition(LABELS, 100, alpha=-1.0), "alpha"),
        (lambda: consecutive_partition(LABELS, 100, size=61), "size \\* num_clients"),
    ],
)
def test_bad_input_is_one_line(call, match):
    with pytest.raises(ValueError, match=match) as err:
        call()
    assert "\n" not in str(err.value)
