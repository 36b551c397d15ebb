"""Models: the (init, apply) protocol, paper architectures, masked loss, sizes, checks."""

from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.models import (
    Model,
    accuracy,
    check_model,
    evaluate,
    from_haiku,
    lenet5,
    loss,
    mlp,
    paper_mlp,
    param_bytes,
    param_count,
)


def np_params(model: Model, seed: int = 0):
    """Parameters of ``model``'s structure filled with numpy normals (no PRNG compile)."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(model.init, jax.random.key(0))
    return jax.tree.map(lambda s: jnp.asarray(0.3 * rng.normal(size=s.shape), s.dtype), shapes)


def test_paper_mlp_is_a_plain_dense_stack_of_the_paper_size():
    model = paper_mlp()
    params = np_params(model)
    layers = params["params"]
    assert list(layers) == ["Dense_0", "Dense_1", "Dense_2"]
    assert [layers[k]["kernel"].shape for k in layers] == [(784, 256), (256, 256), (256, 10)]
    assert param_count(params) == 784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10
    x = jnp.ones((3, 28, 28, 1))
    apply = jax.jit(model.apply)
    logits = apply(params, x)
    assert logits.shape == (3, 10)
    # One unbatched example (as per-example gradients under vmap pass it) gives the same row.
    np.testing.assert_allclose(apply(params, x[0]), logits[0], rtol=1e-4, atol=1e-4)


def test_lenet5_variant_shapes_and_size():
    model = lenet5()
    params = jax.eval_shape(model.init, jax.random.key(1))
    conv = 5 * 5 * 3 * 6 + 6 + 5 * 5 * 6 * 16 + 16
    dense = 256 * 120 + 120 + 120 * 84 + 84 + 84 * 9 + 9  # VALID: 16 x 4 x 4 = 256 features
    assert param_count(params) == conv + dense
    x = jax.ShapeDtypeStruct((2, 28, 28, 3), jnp.float32)
    assert jax.eval_shape(model.apply, params, x).shape == (2, 9)
    same = lenet5(padding="SAME")
    same_params = jax.eval_shape(same.init, jax.random.key(0))
    assert param_count(same_params) == conv + dense + (16 * 7 * 7 - 256) * 120


def test_generic_mlp_and_byte_count_follow_dtypes():
    model = mlp((100, 50), 10, (28, 28, 1))
    assert model.name == "mlp_784-100-50-10"
    params = np_params(model)
    n = 784 * 100 + 100 + 100 * 50 + 50 + 50 * 10 + 10
    assert param_bytes(params) == 4 * n
    half = jax.tree.map(lambda a: a.astype(jnp.bfloat16), params)
    assert param_bytes(half) == 2 * n
    assert param_bytes(jax.eval_shape(model.init, jax.random.key(0))) == 4 * n


def test_masked_loss_and_gradient_ignore_padded_rows_even_nan():
    model = mlp((8,), 3, (4,))
    params = np_params(model)
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(5, 4)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 3, size=5))
    padded_x = jnp.concatenate([x, jnp.full((3, 4), jnp.nan)])
    padded_y = jnp.concatenate([y, jnp.array([2, 0, 1])])
    mask = jnp.arange(8) < 5

    def f(p, xx, yy, mm):
        return loss(model.apply, p, xx, yy, mm)

    ref_value, ref_grad = jax.jit(jax.value_and_grad(f))(params, x, y, None)
    value, grad = jax.jit(jax.value_and_grad(f))(params, padded_x, padded_y, mask)
    assert np.isfinite(float(value))
    np.testing.assert_allclose(value, ref_value, rtol=1e-6)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), grad, ref_grad
    )
    acc = jax.jit(accuracy, static_argnums=0)
    np.testing.assert_allclose(
        acc(model.apply, params, padded_x, padded_y, mask), acc(model.apply, params, x, y)
    )


def test_evaluate_in_chunks_equals_one_pass():
    model = mlp((8,), 4, (6,))
    params = np_params(model)
    x = jnp.asarray(np.random.default_rng(2).normal(size=(23, 6)), jnp.float32)
    y = jnp.arange(23) % 4
    ev = jax.jit(evaluate, static_argnums=(0, 4))
    full = ev(model.apply, params, x, y, None)
    chunked = ev(model.apply, params, x, y, 5)
    np.testing.assert_allclose(full, chunked, rtol=1e-5)


def test_haiku_model_fits_the_protocol():
    def forward(x):
        return hk.nets.MLP([16, 3])(x.reshape(x.shape[0], -1))

    model = from_haiku(hk.transform(forward), (2, 2), 3)
    params = np_params(model)
    assert model.apply(params, jnp.ones((4, 2, 2))).shape == (4, 3)
    no_rng = from_haiku(hk.without_apply_rng(hk.transform(forward)), (2, 2), 3)
    np.testing.assert_allclose(
        no_rng.apply(params, jnp.ones((4, 2, 2))), model.apply(params, jnp.ones((4, 2, 2)))
    )


def test_from_haiku_lets_errors_inside_the_model_through():
    """A TypeError raised by the user's model is not taken for a signature mismatch."""

    def broken(x):
        raise TypeError("bug inside the model")

    for transformed in (hk.transform(broken), hk.without_apply_rng(hk.transform(broken))):
        model = from_haiku(transformed, (2, 2), 3)
        with pytest.raises(TypeError, match="bug inside the model"):
            model.apply({}, jnp.ones((4, 2, 2)))
    with pytest.raises(ValueError, match="transformed"):
        from_haiku(object(), (2, 2), 3)


def test_check_model_rejects_mismatched_output_and_input():
    model = paper_mlp()
    check_model(model, 10)
    with pytest.raises(ValueError, match="classes"):
        check_model(model, 9)
    lying = mlp((8,), 5, (28, 28, 1))
    lying = type(lying)(lying.init, lying.apply, 10, lying.input_shape, "lying")
    with pytest.raises(ValueError, match=r"outputs shape \(5,\)"):
        check_model(lying, 10)
    with pytest.raises(ValueError, match="cannot take inputs"):
        check_model(lenet5(), 9, (28, 28, 1))
