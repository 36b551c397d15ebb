"""DP-SGD on hostile data and unfit models: the sensitivity bound holds whatever the input.

Hostile records (NaN, inf, 1e20, 1e38 features) either contribute a clipped gradient (norm at
most C) or nothing; padded rows contribute nothing whatever they hold; the fast path is never
taken for models where its sum would be wrong (tied kernels, batch statistics).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax import models
from swarmjax.privacy import dpsgd

B, D, C, CLIP = 8, 5, 3, 0.7
KW = dict(loss_fn=models.cross_entropy, clip_norm=CLIP)
HOSTILE = {1: np.nan, 2: np.inf, 3: 1e20, 4: 1e38, 5: -np.inf}


def tree_norm(tree) -> float:
    return float(np.sqrt(sum(np.sum(np.square(leaf)) for leaf in jax.tree.leaves(tree))))


def tree_sub(a, b):
    return jax.tree.map(lambda u, v: np.asarray(u, np.float64) - np.asarray(v, np.float64), a, b)


@pytest.fixture(scope="module")
def mlp():
    model = models.mlp((6, 4), C, (D,))
    return model, jax.jit(model.init)(jax.random.key(0))


def _batch():
    x = np.array(jax.random.normal(jax.random.key(1), (B, D)))
    y = np.array(jax.random.randint(jax.random.key(2), (B,), 0, C))
    return x, y


@pytest.mark.parametrize("method", ["fast", "generic"])
def test_hostile_records_contribute_at_most_clip_or_nothing(mlp, method):
    model, params = mlp
    x, y = _batch()
    bad = x.copy()
    for row, value in HOSTILE.items():
        bad[row, 0] = value
    clean_mask = ~np.isin(np.arange(B), list(HOSTILE))
    fn = jax.jit(
        lambda xs, m: dpsgd.clipped_grad_sum(
            params, xs, y, m, apply_fn=model.apply, method=method, **KW
        )
    )
    clean, _ = fn(x, clean_mask)
    # every hostile row alone: finite result, moved by at most C from the clean sum
    for row in HOSTILE:
        mask = clean_mask.copy()
        mask[row] = True
        got, norms = fn(bad, mask)
        assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(got)), row
        assert tree_norm(tree_sub(got, clean)) <= CLIP * (1 + 1e-5), row
        if not np.isfinite(norms[row]):  # dropped: contributes exactly nothing, and counted
            assert tree_norm(tree_sub(got, clean)) == 0.0
            assert int(dpsgd.dropped_examples(norms, mask)) == 1
    # NaN and inf features cannot be used: those rows are dropped; a 1e20 feature overflows
    # a naive squared norm (the fast path's did) but is clipped like any other row
    got, norms = fn(bad, np.ones(B, bool))
    assert np.isfinite(norms[3]) and norms[3] > 1e19
    assert int(dpsgd.dropped_examples(norms, np.ones(B, bool))) >= 3
    assert tree_norm(tree_sub(got, clean)) <= len(HOSTILE) * CLIP * (1 + 1e-5)
    # padded rows holding anything contribute exactly nothing
    padded, _ = fn(bad, clean_mask)
    assert tree_norm(tree_sub(padded, clean)) == 0.0


def test_norms_do_not_overflow_and_nonfinite_rows_are_dropped():
    g = np.array([[3e30, 4e30], [1e-30, 0.0], [np.nan, 1.0], [np.inf, 0.0], [3.0, 4.0]], np.float32)
    summed, norms = dpsgd.clip_and_sum({"w": g}, np.ones(5, bool), 1.0)
    norms = np.asarray(norms)
    np.testing.assert_allclose(norms[[0, 1, 4]], [5e30, 1e-30, 5.0], rtol=1e-6)
    assert not np.isfinite(norms[2:4]).any()
    # rows 0 and 4 clip to unit vectors (0.6, 0.8); row 1 passes unchanged; 2, 3 dropped
    np.testing.assert_allclose(summed["w"], [1.2 + 1e-30, 1.6], rtol=1e-6)
    assert int(dpsgd.dropped_examples(norms, np.ones(5, bool))) == 2


@pytest.mark.parametrize("method", ["fast", "generic"])
def test_noised_gradient_with_nan_record_equals_it_absent(mlp, method):
    model, params = mlp
    x, y = _batch()
    x[0] = np.nan
    kw = dict(apply_fn=model.apply, noise_multiplier=1.0, expected_batch_size=4.0, **KW)
    grad = jax.jit(lambda m: dpsgd.dp_grad(jax.random.key(9), params, x, y, m, method=method, **kw))
    with_nan = grad(np.ones(B, bool))
    without = grad(np.arange(B) > 0)
    jax.tree.map(np.testing.assert_array_equal, with_nan, without)


# ----------------------------------------------------------------------------------------
# Models the fast path must not take
# ----------------------------------------------------------------------------------------


class TiedDecoder(nn.Module):
    """The encoder's kernel is read again, transposed, outside its Dense call."""

    @nn.compact
    def __call__(self, x):
        enc = nn.Dense(D, name="enc")
        h = jnp.tanh(enc(x))
        return nn.Dense(C)(h @ enc.variables["params"]["kernel"].T)


class BatchCentredHidden(nn.Module):
    """Centres a hidden layer on its batch mean: examples influence each other."""

    @nn.compact
    def __call__(self, x):
        h = nn.Dense(4)(x)
        h = h - h.mean(axis=0)
        return nn.Dense(C)(h)


class BatchCentredInput(nn.Module):
    """Mixes examples before any layer: centres the inputs on the batch mean."""

    @nn.compact
    def __call__(self, x):
        return nn.Dense(C)(x - x.mean(axis=0))


@pytest.mark.parametrize(
    ("module", "reason"),
    [
        (TiedDecoder(), "read outside"),
        (BatchCentredHidden(), "other examples"),
        (BatchCentredInput(), "other examples"),
    ],
)
def test_unfit_models_use_the_generic_path(module, reason):
    model = models.from_flax(module, (D,), C)
    params = jax.jit(model.init)(jax.random.key(3))
    x, y = _batch()
    ok, why = dpsgd.fast_path_supported(model.apply, params, x)
    assert not ok and reason in why
    with pytest.raises(ValueError, match=reason):
        dpsgd.clipped_grad_sum(
            params, x, y, np.ones(B, bool), apply_fn=model.apply, method="fast", **KW
        )
    run = jax.jit(
        lambda p, method: dpsgd.clipped_grad_sum(
            p, x, y, np.ones(B, bool), apply_fn=model.apply, method=method, **KW
        ),
        static_argnums=1,
    )
    (auto, _), (generic, _) = run(params, "auto"), run(params, "generic")
    jax.tree.map(np.testing.assert_array_equal, auto, generic)


def test_batch_mixing_loss_is_refused_by_the_fast_path(mlp):
    model, params = mlp
    x, y = _batch()
    centred = lambda logits, labels: (
        models.cross_entropy(logits, labels) - jnp.mean(models.cross_entropy(logits, labels))
    )
    assert dpsgd.fast_path_supported(model.apply, params, x, models.cross_entropy, y)[0]
    ok, why = dpsgd.fast_path_supported(model.apply, params, x, centred, y)
    assert not ok and "other examples" in why
