"""Stacked clients and local training: padding, masks, vmap over unequal clients, rates."""

from __future__ import annotations

import itertools
import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from swarmjax.fl.client.local import local_train, shuffled_batches
from swarmjax.fl.data.clients import client, poisson_rates, stack_clients
from swarmjax.models import loss, mlp

SIZES = (7, 12, 3)


@pytest.fixture(scope="module")
def toy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 4)).astype(np.float32)
    y = rng.integers(0, 3, size=30)
    starts = np.cumsum((0, *SIZES))
    indices = [np.arange(a, b) for a, b in itertools.pairwise(starts)]
    return x, y, indices


def test_stack_clients_pads_to_one_shape_with_masks(toy):
    x, y, indices = toy
    data = stack_clients(x, y, indices, pad_to=14)
    assert data.x.shape == (3, 14, 4) and data.y.shape == (3, 14) and data.mask.shape == (3, 14)
    np.testing.assert_array_equal(data.sizes, SIZES)
    np.testing.assert_array_equal(data.mask.sum(axis=1), SIZES)
    for i, rows in enumerate(indices):
        np.testing.assert_array_equal(data.x[i, : len(rows)], x[rows])
        np.testing.assert_array_equal(data.y[i, : len(rows)], y[rows])
        assert not data.mask[i, len(rows) :].any()
    assert stack_clients(x, y, indices).max_size == 12
    with pytest.raises(ValueError, match="pad_to"):
        stack_clients(x, y, indices, pad_to=5)
    with pytest.raises(ValueError, match="at least one example"):
        stack_clients(x, y, [np.arange(3), np.array([], dtype=int)])
    bad = x.copy()
    bad[4, 1] = np.inf
    with pytest.raises(ValueError, match="finite"):
        stack_clients(bad, y, indices)


def test_poisson_rates():
    np.testing.assert_allclose(poisson_rates([100, 250, 64], 32), [0.32, 0.128, 0.5])
    with pytest.raises(ValueError, match="batch_size"):
        poisson_rates([100, 20], 32)
    with pytest.raises(ValueError, match="batch_size"):
        poisson_rates([100], 0)


def test_shuffled_batches_cover_each_real_row_once_per_epoch():
    mask = jnp.arange(10) < 7
    batches = shuffled_batches(3)(jax.random.key(0), mask, jnp.int32(7))
    assert batches.idx.shape == (4, 3)
    np.testing.assert_array_equal(batches.active, [True, True, True, False])
    taken = np.asarray(batches.idx)[np.asarray(batches.mask)]
    np.testing.assert_array_equal(np.sort(taken), np.arange(7))


MODEL = mlp((8,), 3, (4,))


def np_params(seed: int = 0):
    """MODEL's parameters filled with numpy normals (no PRNG compile)."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(MODEL.init, jax.random.key(0))
    return jax.tree.map(lambda s: jnp.asarray(0.3 * rng.normal(size=s.shape), s.dtype), shapes)


def local_train_clients(params, clients, key, **kw):
    """``local_train`` vmapped over stacked clients, client ``i`` on ``fold_in(key, i)``
    (what the simulator does with its per-client keys)."""
    ids = jnp.arange(clients.sizes.shape[0])

    def one(d, i):
        return local_train(params, d, jax.random.fold_in(key, i), **kw)

    return jax.vmap(one)(clients, ids)


def _train(data, key, **kw):
    params = np_params()
    args = dict(apply_fn=MODEL.apply, optimizer=optax.sgd(0.5), epochs=2, batch_size=4)
    return params, jax.jit(partial(local_train, **(args | kw)))(params, data, key)


def test_padded_rows_never_touch_local_training(toy):
    x, y, indices = toy
    zeros = client(stack_clients(x, y, indices, pad_to=16), 2)
    nans = client(stack_clients(x, y, indices, pad_to=16, pad_value=np.nan), 2)
    _, a = _train(zeros, jax.random.key(3))
    _, b = _train(nans, jax.random.key(3))
    assert np.isfinite(float(b.loss))
    jax.tree.map(np.testing.assert_array_equal, a.params, b.params)
    assert int(b.steps) == 2 * math.ceil(SIZES[2] / 4)


def test_full_batch_epoch_equals_one_exact_gradient_step_per_client(toy):
    """With B >= |D_i| every client takes one step per epoch on exactly its own rows, so
    vmapped clients of different sizes match plain gradient descent on each client's data."""
    x, y, indices = toy
    data = stack_clients(x, y, indices, pad_value=np.nan)
    params = np_params()
    kw = dict(apply_fn=MODEL.apply, optimizer=optax.sgd(0.5), epochs=1, batch_size=16)
    out = jax.jit(partial(local_train_clients, **kw))(params, data, jax.random.key(1))
    np.testing.assert_array_equal(out.steps, [1, 1, 1])
    sgd_step = jax.jit(
        lambda p, xx, yy: jax.tree.map(
            lambda a, g: a - 0.5 * g, p, jax.grad(lambda q: loss(MODEL.apply, q, xx, yy))(p)
        )
    )
    for i, rows in enumerate(indices):
        expected = sgd_step(params, x[rows], y[rows])
        got = jax.tree.map(lambda leaf, i=i: leaf[i], out.params)
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, expected
        )


def test_vmapped_clients_equal_each_client_alone(toy):
    x, y, indices = toy
    data = stack_clients(x, y, indices)
    params = np_params()
    kw = dict(apply_fn=MODEL.apply, optimizer=optax.adam(0.05), epochs=2, batch_size=4)
    key = jax.random.key(5)
    together = jax.jit(partial(local_train_clients, **kw))(params, data, key)
    np.testing.assert_array_equal(together.steps, [2 * math.ceil(s / 4) for s in SIZES])
    one = jax.jit(partial(local_train, **kw))
    for i in range(3):
        alone = one(params, client(data, i), jax.random.fold_in(key, i))
        got = jax.tree.map(lambda leaf, i=i: leaf[i], together.params)
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, alone.params
        )


def test_custom_grad_fn_is_used(toy):
    x, y, indices = toy
    data = client(stack_clients(x, y, indices), 0)
    calls = []

    def zero_grad(params, xb, yb, mask_b, key):
        calls.append(xb.shape)
        return jnp.float32(0.0), jax.tree.map(jnp.zeros_like, params)

    params, out = _train(data, jax.random.key(0), grad_fn=zero_grad)
    assert calls  # traced
    jax.tree.map(np.testing.assert_array_equal, out.params, params)
