"""Per-round work cap (``LocalTraining.max_examples``) and the size-sorted vmapped cohort
(``ClientStore.vmap_block``): the same numbers where no client exceeds the cap, buffers of
``cohort x cap`` rows whatever the largest client, one-line errors."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from swarmjax.fl.algorithms.client_level_dp_fedavg import dp_fedavg
from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.client.training import LocalTraining, RecordDP
from swarmjax.fl.data import load_dataset, partition, stack_clients
from swarmjax.fl.data.cohort import subset_rows
from swarmjax.fl.data.store import VMAP_BLOCK, ClientStore
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import Execution, simulate
from swarmjax.models import mlp
from swarmjax.privacy.participation import Poisson
from tests.reproducible import SECRET


@pytest.fixture(scope="module")
def digits():
    data = load_dataset("digits")
    part = partition(data.y_train, 40, "power_law", seed=0)
    store = ClientStore.build(data.x_train, data.y_train, part.indices)
    return data, part, store


def _run(alg, clients, test, client_map="vmap", rounds=3):
    spec = RunSpec(rounds, 1e-5, common_random_numbers=True)
    grid = Variants.grid(alg, clients, spec, learning_rate=[0.2])
    # one supplied secret and common random numbers: calls with different algorithms (caps)
    # draw the same cohorts and batches
    return simulate(
        alg,
        clients,
        test,
        grid,
        secret=SECRET,
        execution=Execution(client_map=client_map),
    )


def _leaves(res):
    return [np.asarray(a) for a in jax.tree.leaves(res.server.params)]


def test_store_of_unequal_clients_runs_vmapped_cohorts_in_sorted_blocks(digits):
    data, _, store = digits
    assert store.vmap_block == VMAP_BLOCK and store.max_rows > 4 * np.median(store.sizes)
    equal = ClientStore.build(data.x_train, data.y_train, np.array_split(np.arange(400), 40))
    assert equal.vmap_block == 0
    ids = jnp.asarray([5, 40, 3, -1, 7, 0], jnp.int32)  # 40 and -1: unused slots
    order, cmap = store.schedule(ids, "vmap")
    rows = np.asarray(store.sizes)[np.asarray(order[:4])]
    assert list(np.asarray(order[4:])) == [40, -1] and np.all(np.diff(rows) >= 0)
    assert cmap == VMAP_BLOCK
    assert store.with_vmap_block(6).schedule(ids, "vmap")[1] == "vmap"  # one block of all
    assert store.with_vmap_block(2).schedule(ids, 3)[1] == 3  # an explicit block size stays
    assert store.with_cap(16).vmap_block == 0  # capped: every client's steps are bounded
    assert store.with_cap(int(store.max_rows)).vmap_block == VMAP_BLOCK
    assert store.schedule(ids, "sequential") == (ids, "sequential")


def test_bucketed_cohort_equals_unbucketed(digits):
    """Sorted blocks change only the order of the server's sum: float tolerance (the
    clients' own numbers are the same; the slot order of the weighted average is not)."""
    data, _, store = digits
    test = (data.x_test, data.y_test)
    alg = FedAvg(mlp((16,), 10, data.input_shape), LocalTraining(batch_size=16), cohort=8)
    one_block = _run(alg, store.with_vmap_block(0), test)
    blocks = _run(alg, store.with_vmap_block(3), test)
    seq = _run(alg, store, test, "sequential")
    for a, b, c in zip(_leaves(one_block), _leaves(blocks), _leaves(seq), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)
    # the store's steps read their batches from it (read="step"): the padded buffer's
    # numbers bit for bit (tests/test_store_batches.py tests the pieces)
    assert store.read == "step"
    padded = _run(alg, store.with_read("buffer"), test, "sequential")
    for a, b in zip(_leaves(seq), _leaves(padded), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_cap_no_client_exceeds_changes_nothing_bitwise(digits):
    data, part, store = digits
    test = (data.x_test, data.y_test)
    largest = int(store.max_rows)
    model = mlp((16,), 10, data.input_shape)
    stacked = stack_clients(data.x_train, data.y_train, part.indices)
    for clients, cmap in ((store, "vmap"), (store, "sequential"), (stacked, "vmap")):
        base = _run(FedAvg(model, LocalTraining(batch_size=16), cohort=8), clients, test, cmap)
        for cap in (largest, 10 * largest):
            capped = FedAvg(model, LocalTraining(batch_size=16, max_examples=cap), cohort=8)
            res = _run(capped, clients, test, cmap)
            for a, b in zip(_leaves(base), _leaves(res), strict=True):
                np.testing.assert_array_equal(a, b)
    spec = RunSpec(3, 1e-3, common_random_numbers=True)
    for training in (
        LocalTraining(batch_size=10),
        LocalTraining(batch_size=10, max_examples=largest),
    ):
        poisson = Poisson.for_run(
            store.num_clients, 0.25, spec.rounds, spec.delta, 8.0, spec.accountant
        )
        dp = dp_fedavg(model, participation=poisson, training=training)
        grid = Variants.grid(dp, store, spec, sample_rate=0.25, epsilon_target=8.0)
        res = simulate(dp, store, test, grid, secret=SECRET, execution=Execution(client_map="vmap"))
        if training.max_examples is None:
            base = res
    for a, b in zip(_leaves(base), _leaves(res), strict=True):
        np.testing.assert_array_equal(a, b)
    # user-level DP-FedAvg, vmapped in sorted blocks, from a padded buffer: the same bits
    padded = store.with_read("buffer")
    res = simulate(dp, padded, test, grid, secret=SECRET, execution=Execution(client_map="vmap"))
    for a, b in zip(_leaves(base), _leaves(res), strict=True):
        np.testing.assert_array_equal(a, b)


def test_gathered_buffer_does_not_depend_on_the_largest_client(digits):
    data, part, _ = digits
    small = [i[:30] for i in part.indices]
    giant = [*small[:-1], np.arange(len(data.y_train))]  # one client holds every row
    cap, ids, key = 24, jnp.arange(8, dtype=jnp.int32), jax.random.key(0)
    shapes = []
    for indices in (small, giant):
        store = ClientStore.build(data.x_train, data.y_train, indices).with_cap(cap)
        out = jax.eval_shape(lambda s: s.take(ids, key), store)
        shapes.append(jax.tree.map(lambda a: a.shape, out))
        alg = FedAvg(
            mlp((16,), 10, data.input_shape), LocalTraining(batch_size=16, max_examples=cap)
        )
        assert alg.client_data(store).max_rows == cap
    assert shapes[0] == shapes[1] and shapes[0].x == (8, cap, *data.input_shape)
    # and the compiled round holds the same temporaries either way
    temps = []
    for indices in (small, giant):
        store = ClientStore.build(data.x_train, data.y_train, indices)
        alg = FedAvg(
            mlp((16,), 10, data.input_shape),
            LocalTraining(batch_size=8, max_examples=cap),
            cohort=8,
        )
        res = _run(alg, store, (data.x_test, data.y_test), rounds=1)
        assert np.isfinite(res.history["test_loss"]).all()
        take = jax.jit(lambda s, i, k: s.take(i, k))
        mem = take.lower(alg.client_data(store), ids, key).compile().memory_analysis()
        temps.append(mem.output_size_in_bytes)
    assert temps[0] == temps[1]


def test_capped_gather_draws_a_uniform_subset_of_the_clients_rows():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(60, 2)).astype(np.float32)
    y = rng.integers(0, 3, size=60)
    store = ClientStore.build(x, y, [np.arange(0, 50), np.arange(50, 55)]).with_cap(8)
    assert store.max_rows == 8 and store.sample
    counts = np.zeros(50)
    take = jax.jit(lambda k: store.take(jnp.asarray([0, 1]), k))
    for r in range(200):
        out = take(jax.random.key(r))
        assert list(np.asarray(out.sizes)) == [8, 5]
        rows = [int(np.flatnonzero((x == v).all(1))[0]) for v in np.asarray(out.x[0])]
        assert len(set(rows)) == 8 and all(i < 50 for i in rows)
        counts[rows] += 1
        np.testing.assert_array_equal(out.x[1, :5], x[50:55])  # below the cap: every row
        assert not np.asarray(out.mask[1, 5:]).any()
    assert stats.chisquare(counts).pvalue > 1e-3


def test_subset_rows_is_uniform_over_subsets():
    draw = jax.jit(jax.vmap(lambda k: subset_rows(k, 5, 2)))
    pos = np.asarray(draw(jax.random.split(jax.random.key(0), 4000)))
    assert np.all(pos[:, 0] < pos[:, 1])
    pairs = list(itertools.combinations(range(5), 2))
    counts = [np.sum((pos[:, 0] == a) & (pos[:, 1] == b)) for a, b in pairs]
    assert sum(counts) == 4000 and stats.chisquare(counts).pvalue > 1e-3
    np.testing.assert_array_equal(subset_rows(jax.random.key(1), 3, 4), np.arange(4))


def test_the_cap_bounds_local_steps_and_weights_stacked_clients():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(100, 4)).astype(np.float32)
    y = rng.integers(0, 3, size=100)
    clients = stack_clients(x, y, [np.arange(100), np.arange(7)])
    model = mlp((8,), 3, (4,))
    params = model.init(jax.random.key(0))
    training = LocalTraining(epochs=2, batch_size=10, max_examples=25)
    one = jax.tree.map(lambda a: a[0], clients)
    res = training.train(model, params, one, jax.random.key(1), jnp.float32(0.1), jnp.float32(0))
    assert int(res.steps) == 2 * math.ceil(25 / 10)
    np.testing.assert_array_equal(training.examples(clients.sizes), [25, 7])
    assert training.client_data(clients) is clients


@pytest.mark.parametrize(
    ("training", "message"),
    [
        (LocalTraining(batch_size=32, max_examples=16), r"max_examples must be >= batch_size"),
        (LocalTraining(batch_size=8, max_examples=0), r"max_examples"),
        (
            LocalTraining(batch_size=8, max_examples=64, record_dp=RecordDP()),
            r"max_examples must be None with record_dp",
        ),
    ],
)
def test_bad_caps_are_refused_in_one_line_before_any_work(digits, training, message):
    data, _, store = digits
    alg = FedAvg(mlp((16,), 10, data.input_shape), training, cohort=8)
    with pytest.raises(ValueError, match=message) as err:
        _run(alg, store, (data.x_test, data.y_test))
    assert "\n" not in str(err.value)


def test_a_capped_sorted_cohort_compiles_its_round_once(digits):
    """Every round draws other clients and other rows: one compiled round program."""
    from swarmjax.fl.runtime.simulator import run_rounds

    data, _, store = digits
    alg = FedAvg(
        mlp((16,), 10, data.input_shape),
        LocalTraining(batch_size=8, max_examples=24),
        cohort=8,
    )
    grid = Variants.grid(alg, store, RunSpec(4, 1e-5), learning_rate=[0.2])
    before = run_rounds._cache_size()
    res = simulate(
        alg, store, (data.x_test, data.y_test), grid, execution=Execution(rounds_per_call=1)
    )
    assert run_rounds._cache_size() == before + 1
    assert np.isfinite(res.history["test_loss"]).all()
