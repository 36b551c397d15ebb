"""Steps that read their batches straight from the flat store (``ClientStore.read="step"``):
the same algorithm as the padded buffer (same batches, steps and weights: the same
numbers, bit for bit) for plain and record-level DP local training; no round array scales
with the largest client's rows. Whole runs (FedAvg one client at a time, user-level
DP-FedAvg vmapped in sorted blocks) are compared bit for bit in tests/test_work_cap.py, on
its runs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.fl.client.local import local_train
from swarmjax.fl.client.training import LocalTraining, RecordDP
from swarmjax.fl.data import load_dataset, partition
from swarmjax.fl.data.store import STEP_READ_SPREAD, ClientStore, StoreClient
from swarmjax.models import mlp


@pytest.fixture(scope="module")
def digits():
    data = load_dataset("digits")
    part = partition(data.y_train, 40, "power_law", seed=0)
    store = ClientStore.build(data.x_train, data.y_train, part.indices)
    return data, part, store


def test_build_reads_steps_for_unequal_clients_and_a_buffer_for_equal_ones(digits):
    data, _, store = digits
    sizes = np.asarray(store.sizes)
    assert sizes.max() > STEP_READ_SPREAD * sizes.mean() and store.read == "step"
    equal = ClientStore.build(data.x_train, data.y_train, np.array_split(np.arange(400), 40))
    assert equal.read == "buffer"
    assert store.with_cap(16).read == "buffer"  # the capped buffer is what the steps use
    assert store.with_cap(int(store.max_rows)).read == "step"  # a cap above all: unchanged
    with pytest.raises(ValueError, match="unknown read") as err:
        store.with_read("rows")
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="read must be 'buffer'"):
        store.with_cap(16).with_read("step")


def test_a_store_client_reads_the_padded_buffers_rows(digits):
    _, _, store = digits
    ids = jnp.asarray([3, 0, -1, 39], jnp.int32)
    padded = store.take(ids)
    index = store.index(ids)
    np.testing.assert_array_equal(index.sizes, padded.sizes)
    idx = jnp.asarray([0, 5, int(store.max_rows) - 1, 1])  # real and padding positions
    for s in range(4):
        one = store.bind(jax.tree.map(lambda a, s=s: a[s], index))
        x, y, real = one.batch(idx)
        np.testing.assert_array_equal(x, padded.x[s][idx])
        np.testing.assert_array_equal(y, padded.y[s][idx])
        np.testing.assert_array_equal(real, padded.mask[s][idx])
        np.testing.assert_array_equal(one.mask, padded.mask[s])


def test_local_training_from_the_store_is_the_padded_training(digits):
    """ONE client, its steps jitted alone: plain SGD and record-level DP-SGD (Poisson
    batches from the same positions). Bitwise at XLA's defaults; the suite's legacy fusion
    emitters (tests/conftest.py) round these two programs 1 ulp apart (1.6e-7 relative), so
    floats are compared to 1e-6 here, the step counts exactly (whole runs in
    tests/test_work_cap.py stay bitwise)."""
    data, _, store = digits
    model = mlp((16,), 10, data.input_shape)
    params = model.init(jax.random.key(0))
    big = int(np.argmax(np.asarray(store.sizes)))
    padded = jax.tree.map(lambda a: a[0], store.take(jnp.asarray([big])))
    step = store.bind(jax.tree.map(lambda a: a[0], store.index(jnp.asarray([big]))))
    assert isinstance(step, StoreClient)
    for dp in (None, RecordDP(clip_norm=1.0)):
        training = LocalTraining(epochs=2, batch_size=32, record_dp=dp)
        train = jax.jit(
            lambda d, t=training: t.train(
                model, params, d, jax.random.key(1), jnp.float32(0.1), jnp.float32(0.5)
            )
        )
        a, b = train(padded), train(step)
        assert int(a.steps) == int(b.steps) > 2 * 2
        for u, v in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
            np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(a.loss, b.loss, rtol=1e-6)


def test_no_round_array_scales_with_the_largest_client(digits):
    """A federation whose largest client holds 30 rows and one holding every row: the
    step-reading round's temporaries differ by the positions' int32 index work only
    (``O(largest)`` per slot, no example-sized buffer); the buffer's grow by the rows."""
    data, part, _ = digits
    small = [i[:30] for i in part.indices]
    giant = [*small[:-1], np.arange(len(data.y_train))]  # one client holds every row
    model = mlp((16,), 10, data.input_shape)
    ids = jnp.arange(8, dtype=jnp.int32)
    params = model.init(jax.random.key(0))
    temps = {}
    for read in ("buffer", "step"):
        for name, indices in (("small", small), ("giant", giant)):
            store = ClientStore.build(data.x_train, data.y_train, indices).with_read(read)
            training = LocalTraining(batch_size=8)

            def round_(s, i, t=training):
                def one(d):
                    return local_train(
                        params,
                        s.bind(d) if s.read == "step" else d,
                        jax.random.key(0),
                        apply_fn=model.apply,
                        optimizer=t.optimizer_for(0.1),
                        epochs=1,
                        batch_size=8,
                    ).params

                data_ = s.index(i) if s.read == "step" else s.take(i)
                return jax.vmap(one)(data_)

            mem = jax.jit(round_).lower(store, ids).compile().memory_analysis()
            temps[read, name] = mem.temp_size_in_bytes
    rows = len(data.y_train) - 30
    example = int(np.prod(data.input_shape)) * 4
    grown_buffer = temps["buffer", "giant"] - temps["buffer", "small"]
    grown_step = temps["step", "giant"] - temps["step", "small"]
    assert grown_buffer >= 8 * rows * example  # the padded (8, largest, ...) float32 buffer
    assert grown_step < 8 * rows * 16 < grown_buffer / 4  # int32 positions and keys only
