"""Partitioners: disjoint and complete, Dirichlet skew vs alpha, pathological classes, errors."""

from __future__ import annotations

import numpy as np
import pytest

from swarmjax.fl.data.partition import (
    dirichlet_partition,
    flower_partition,
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
        (lambda: partition(LABELS, 5, "bogus"), "unknown scheme"),
        (lambda: partition(LABELS, 5, "dirichlet"), "alpha"),
        (lambda: pathological_partition(LABELS, 5, 3), "classes_per_client"),
        (lambda: pathological_partition(LABELS, 11), "num_clients"),
        (lambda: iid_partition(np.array([0.5, 1.0]), 1), "integers"),
    ],
)
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# Reference partitions from flwr-datasets 0.6.1 (DirichletPartitioner, and FederatedDataset's
# pipeline: rows shuffled by a Hugging Face Dataset.shuffle(seed=42), then IidPartitioner or
# DirichletPartitioner(seed=42)), recorded once with the real library: per-client sizes and
# sums of row indices. Labels: default_rng(7).integers(0, 10, 2000), and the same with
# class 3 relabelled 4 (a class absent), 5 clients.
_FLOWER_Y = np.random.default_rng(7).integers(0, 10, 2000)
_FLOWER_LABELS = {"synthetic": _FLOWER_Y, "missing3": np.where(_FLOWER_Y == 3, 4, _FLOWER_Y)}
_FLOWER = {
    # (labels, alpha, self_balancing, seed): (sizes, index sums)
    ("synthetic", 0.3, False, 42): (
        (415, 395, 310, 495, 385),
        (191687, 308830, 224928, 648600, 624955),
    ),
    ("synthetic", 1.0, False, 1): (
        (380, 293, 436, 436, 455),
        (114848, 167957, 435878, 548532, 731785),
    ),
    ("synthetic", 0.5, True, 3): (
        (278, 408, 369, 526, 419),
        (182037, 243141, 291407, 611993, 670422),
    ),
    ("missing3", 0.3, False, 42): (
        (427, 491, 162, 523, 397),
        (189904, 379488, 115510, 672935, 641163),
    ),
    ("missing3", 1.0, False, 1): (
        (384, 303, 400, 426, 487),
        (121781, 171401, 402743, 539537, 763538),
    ),
    ("missing3", 0.5, True, 3): (
        (311, 409, 409, 424, 447),
        (208007, 239066, 298770, 511228, 741929),
    ),
}
_FLOWER_PIPELINE = {
    # (labels, scheme, alpha): (sizes, index sums), seed 42
    ("synthetic", "iid", None): ((400,) * 5, (403046, 394836, 401778, 403556, 395784)),
    ("synthetic", "dirichlet", 0.3): (
        (415, 395, 310, 495, 385),
        (404098, 407380, 319761, 478333, 389428),
    ),
    ("missing3", "dirichlet", 0.3): (
        (427, 491, 162, 523, 397),
        (424690, 498083, 162334, 506097, 407796),
    ),
    ("mnist", "iid", None): ((12000,) * 5, (362461407, 358786147, 360725219, 360492756, 357504471)),
    ("mnist", "dirichlet", 0.3): (
        (12129, 12373, 8992, 15170, 11336),
        (366322565, 372920527, 268358744, 454799733, 337568431),
    ),
    ("mnist", "dirichlet", 1.0): (
        (12929, 13524, 14424, 9024, 10099),
        (390132556, 404937951, 432327325, 271837504, 300734664),
    ),
    ("fashion_mnist", "dirichlet", 0.3): (
        (12366, 12192, 9135, 15201, 11106),
        (372689422, 367135691, 274843376, 455345542, 329955969),
    ),
    ("fashion_mnist", "dirichlet", 1.0): (
        (12968, 13609, 14220, 8976, 10227),
        (392322822, 407169719, 425871566, 269487605, 305118288),
    ),
}


def _fingerprint(part):
    return tuple(int(s) for s in part.sizes), tuple(int(i.sum()) for i in part.indices)


@pytest.mark.parametrize("case", sorted(_FLOWER))
def test_dirichlet_partition_equals_flowers(case):
    name, alpha, balancing, seed = case
    part = dirichlet_partition(
        _FLOWER_LABELS[name], 5, alpha, seed=seed, self_balancing=balancing, num_classes=10
    )
    assert _fingerprint(part) == _FLOWER[case]


@pytest.mark.parametrize("case", sorted(_FLOWER_PIPELINE, key=str))
def test_flower_partition_equals_federated_dataset_pipeline(case, request):
    name, scheme, alpha = case
    if name in _FLOWER_LABELS:
        labels = _FLOWER_LABELS[name]
    else:
        from swarmjax.fl import load_dataset

        data_dir = request.getfixturevalue("data_dir")
        labels = load_dataset(name, data_dir).y_train
    kwargs = {} if alpha is None else {"alpha": alpha}
    part = flower_partition(labels, 5, scheme, seed=42, **kwargs)
    assert_disjoint_and_complete(part, labels.size)
    assert _fingerprint(part) == _FLOWER_PIPELINE[case]


def test_flower_partition_rejects_options_it_does_not_have():
    with pytest.raises(ValueError, match="scheme"):
        flower_partition(LABELS, 5, "pathological")
    with pytest.raises(ValueError, match="no options"):
        flower_partition(LABELS, 5, "iid", stratify=True)
    with pytest.raises(ValueError, match="alpha"):
        flower_partition(LABELS, 5, "dirichlet")
