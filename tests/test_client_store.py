"""Flat client store: gather equals stack_clients, unused slots are masked, errors, helpers."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.fl.data.clients import stack_clients
from swarmjax.fl.data.store import ClientStore, choose_max_rows, gather, memory_estimate

SIZES = (7, 12, 3, 1, 9)


@pytest.fixture(scope="module")
def toy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 3, 2)).astype(np.float32)
    y = rng.integers(0, 5, size=40)
    perm = rng.permutation(40)
    starts = np.cumsum((0, *SIZES))
    indices = [perm[a:b] for a, b in itertools.pairwise(starts)]
    return x, y, indices


def assert_same(a, b):
    for name in ("x", "y", "mask", "sizes"):
        np.testing.assert_array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name)))


def test_store_is_flat_and_unpadded(toy):
    x, y, indices = toy
    store = ClientStore.build(x, y, indices)
    assert store.x.shape == (sum(SIZES), 3, 2) and store.num_clients == len(SIZES)
    np.testing.assert_array_equal(store.sizes, SIZES)
    np.testing.assert_array_equal(store.offsets, np.cumsum((0, *SIZES[:-1])))
    for i, rows in enumerate(indices):
        o = int(store.offsets[i])
        np.testing.assert_array_equal(store.x[o : o + len(rows)], x[rows])


@pytest.mark.parametrize("ids", [[0, 1, 2, 3, 4], [4, 1, 1], [3]])
def test_gather_equals_stack_clients(toy, ids):
    x, y, indices = toy
    store = ClientStore.build(x, y, indices)
    max_rows = choose_max_rows(store)
    got = jax.jit(gather, static_argnums=2)(store, jnp.asarray(ids), max_rows)
    want = stack_clients(x, y, [indices[i] for i in ids], pad_to=max_rows)
    assert_same(got, want)


@pytest.mark.parametrize("cap", [None, 5])
@pytest.mark.parametrize("devices", [2, 3, 4])
def test_a_split_store_block_reads_what_the_whole_store_reads(toy, devices, cap):
    """Each device's block of ``ClientStore.split`` (its rows, block offsets and sizes, as
    a clients mesh axis places them) read through ``local``: the whole store's rows of the
    same clients, a capped client's random subset drawn under its federation id included;
    the padding clients past N read the last client's rows."""
    x, y, indices = toy
    store = ClientStore.build(x, y, indices).with_read("buffer").with_cap(cap)
    split = store.split(devices)
    n, b = store.num_clients, split.block
    rows = split.x.shape[0] // devices
    assert b == -(-n // devices) and split.offsets.shape == (b * devices,)
    np.testing.assert_array_equal(split.sizes, store.sizes)  # whole on every device
    key = jax.random.key(7)
    for k in range(devices):
        part = split.replace(
            x=split.x[k * rows : (k + 1) * rows],
            y=split.y[k * rows : (k + 1) * rows],
            offsets=split.offsets[k * b : (k + 1) * b],
        )
        ids = np.minimum(np.arange(k * b, (k + 1) * b), n - 1)
        got = part.local(k * b).take(jnp.arange(b), key, draw_ids=jnp.asarray(ids))
        assert_same(got, store.take(jnp.asarray(ids), key))


@pytest.mark.parametrize("devices", [2, 3])
def test_a_split_step_store_block_reads_its_clients_and_bounds_a_share(toy, devices):
    """A step-reading store splits as a buffer store does (each block's clients bind to
    the whole store's rows) and records the rows of its largest clients: ``slot_rows(s)``
    bounds what any ``s`` clients hold together (checked against every set of ``s``)."""
    x, y, indices = toy
    store = ClientStore.build(x, y, indices).with_read("step")
    split = store.split(devices)
    n, b = store.num_clients, split.block
    rows = split.x.shape[0] // devices
    for k in range(devices):
        part = split.replace(
            x=split.x[k * rows : (k + 1) * rows],
            y=split.y[k * rows : (k + 1) * rows],
            offsets=split.offsets[k * b : (k + 1) * b],
        ).local(k * b)
        assert part.read == "step" and not part.rows_of_largest
        for j in range(b):
            i = min(k * b + j, n - 1)
            mine = part.bind(jax.tree.map(lambda a, j=j: a[j], part.index(jnp.arange(b))))
            whole = store.bind(jax.tree.map(lambda a, i=i: a[i], store.index(jnp.arange(n))))
            idx = jnp.arange(store.max_rows)
            for a, c in zip(mine.batch(idx), whole.batch(idx), strict=True):
                np.testing.assert_array_equal(a, c)
    for s in range(1, n + 2):
        most = max(sum(c) for c in itertools.combinations(SIZES, min(s, n)))
        assert split.slot_rows(s) == most
    assert store.with_read("buffer").split(devices).rows_of_largest == ()


def test_only_a_split_store_has_blocks_and_slot_rows(toy):
    x, y, indices = toy
    store = ClientStore.build(x, y, indices).with_read("step")
    with pytest.raises(ValueError, match=r"^ClientStore.local reads one device's block"):
        store.local(0)
    with pytest.raises(ValueError, match=r"^ClientStore.slot_rows needs a step-reading") as err:
        store.slot_rows(2)
    assert "\n" not in str(err.value)


def test_unused_slots_are_all_masked(toy):
    x, y, indices = toy
    store = ClientStore.build(x, y, indices)
    got = gather(
        store, jnp.asarray([2, -1, 0, 1]), 12, valid=jnp.asarray([True, True, True, False])
    )
    np.testing.assert_array_equal(got.sizes, [3, 0, 7, 0])
    assert not bool(got.mask[1].any()) and not bool(got.mask[3].any())
    assert float(jnp.abs(got.x[1]).sum()) == 0.0 and int(got.y[3].sum()) == 0
    assert_same(
        jax.tree.map(lambda a: a[jnp.asarray([0, 2])], got),
        stack_clients(x, y, [indices[2], indices[0]], pad_to=12),
    )


def test_gather_truncates_to_max_rows(toy):
    x, y, indices = toy
    store = ClientStore.build(x, y, indices)
    got = gather(store, jnp.asarray([1]), 4)
    assert int(got.sizes[0]) == 4 and bool(got.mask.all())
    np.testing.assert_array_equal(got.x[0], x[indices[1][:4]])


def test_max_rows_and_memory(toy):
    x, y, indices = toy
    store = ClientStore.build(x, y, indices)
    assert choose_max_rows(store) == 12 and choose_max_rows(store, 20) == 20
    assert choose_max_rows(store, 5, truncate=True) == 5
    with pytest.raises(
        ValueError, match=r"max_rows=5 is below the largest client \(12 rows, client 1\)"
    ):
        choose_max_rows(store, 5)
    mem = memory_estimate(store, cohort=4, max_rows=12)
    assert mem["store"] == sum(SIZES) * (6 * 4 + 4)
    assert mem["cohort_buffer"] == 4 * 12 * (6 * 4 + 5) + 16


def _row(i: int) -> np.ndarray:
    return np.arange(40)[:, None, None] == i


def test_uint8_store_is_lossless_and_gathers_the_same_floats():
    """Images at k/255 are stored as uint8 (a quarter of the bytes) and gathered bit for
    bit as the float32 store and stack_clients give them; other values stay float32."""
    rng = np.random.default_rng(1)
    x = (rng.integers(0, 256, size=(40, 4, 4, 1)).astype(np.float32) / np.float32(255)).astype(
        np.float32
    )
    y = rng.integers(0, 3, size=40)
    indices = [np.arange(0, 7), np.arange(7, 19), np.array([25, 3, 30])]
    small = ClientStore.build(x, y, indices)
    full = ClientStore.build(x, y, indices, compress=False)
    assert small.x.dtype == jnp.uint8 and small.x_table is not None
    assert full.x.dtype == jnp.float32 and small.x.nbytes * 4 == full.x.nbytes
    ids = jnp.asarray([2, 0, 1, -1])
    want = stack_clients(x, y, [indices[i] for i in (2, 0, 1)], pad_to=12)
    got = jax.jit(gather, static_argnums=2)(small, ids, 12)
    assert_same(jax.tree.map(lambda a: a[:3], got), want)
    assert_same(got, gather(full, ids, 12))
    assert (
        memory_estimate(small, 4, 12)["cohort_buffer"]
        == memory_estimate(full, 4, 12)["cohort_buffer"]
    )
    off = x.copy()
    off[5, 0, 0, 0] += 1e-3  # one value not k/255: the whole store stays float32
    assert ClientStore.build(off, y, indices).x.dtype == jnp.float32
    assert ClientStore.build(x * 2, y, indices).x.dtype == jnp.float32  # above 255/255


def test_nan_only_in_rows_no_client_holds_is_not_stored(toy):
    x, y, indices = toy
    unused = sorted(set(range(40)) - set(np.concatenate(indices).tolist()))[0]
    store = ClientStore.build(np.where(_row(unused), np.nan, x), y, indices)
    assert bool(jnp.isfinite(store.x).all())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (lambda x, y, i: (x, y, [*i, []]), "client 5 is empty"),
        (lambda x, y, i: (x, y, []), "at least one client"),
        (lambda x, y, i: (x[:-1], y, i), "same number of rows"),
        (lambda x, y, i: (x, y.astype(np.float32), i), "integer labels"),
        (lambda x, y, i: (np.where(_row(i[0][0]), np.nan, x), y, i), "finite"),
        (lambda x, y, i: (x, y, [[0, 40]]), r"indices must be in \[0, 39\]"),
    ],
)
def test_build_errors_are_one_line(toy, args, message):
    """(A NaN in a row no client holds is not stored, so not refused: see below.)"""
    with pytest.raises(ValueError, match=message) as err:
        ClientStore.build(*args(*toy))
    assert "\n" not in str(err.value)


def test_the_simulator_runs_a_store_as_it_runs_stacked_clients():
    """A flat ClientStore in simulate(): cohort rounds gather only the cohort and give the
    numbers of the same clients stacked and padded."""
    import math

    import jax

    from swarmjax.fl.algorithms.fedavg import FedAvg
    from swarmjax.fl.client.training import LocalTraining
    from swarmjax.fl.data import load_dataset, partition, stack_clients
    from swarmjax.fl.data.store import ClientStore
    from swarmjax.fl.protocol import RunSpec, Variants
    from swarmjax.fl.runtime import Execution, simulate
    from swarmjax.models import mlp
    from tests.reproducible import SECRET

    data = load_dataset("digits")
    part = partition(data.y_train, 30, "dirichlet", alpha=1.0, seed=0)
    stacked = stack_clients(data.x_train, data.y_train, part.indices)
    store = ClientStore.build(data.x_train, data.y_train, part.indices)
    assert store.max_rows == stacked.max_size
    alg = FedAvg(mlp((16,), 10, data.input_shape), LocalTraining(batch_size=16), cohort=6)
    test = (data.x_test, data.y_test)
    runs = []
    for clients in (stacked, store):
        grid = Variants.grid(
            alg, clients, RunSpec(3, 1e-5), epsilon_target=[math.inf], learning_rate=[0.2]
        )
        # the same supplied secret in both calls: the same cohorts and batches
        sequential = Execution(client_map="sequential")
        runs.append(simulate(alg, clients, test, grid, secret=SECRET, execution=sequential))
    np.testing.assert_allclose(
        runs[0].history["test_loss"], runs[1].history["test_loss"], rtol=1e-6
    )
    for a, b in zip(jax.tree.leaves(runs[0].server), jax.tree.leaves(runs[1].server), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
