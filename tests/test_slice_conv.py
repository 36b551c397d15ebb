"""The slice-and-matmul convolution of cl_models matches ``nn.Conv`` (parameters and output)."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from swarmjax.models import SliceConv, max_pool_2x2


@pytest.mark.parametrize(
    ("shape", "features", "kernel", "padding"),
    [((2, 9, 8, 1), 4, (3, 3), ((0, 0), (0, 0))), ((2, 6, 7, 3), 5, (2, 2), ((1, 1), (1, 1)))],
)
def test_slice_conv_matches_nn_conv(shape, features, kernel, padding):
    x = jax.random.normal(jax.random.key(0), shape)
    ref = nn.Conv(features, kernel, padding=padding)
    ours = SliceConv(features, kernel, padding)
    p_ref = ref.init(jax.random.key(1), x)
    p_ours = ours.init(jax.random.key(1), x)
    jax.tree.map(np.testing.assert_array_equal, p_ref, p_ours)
    np.testing.assert_allclose(ours.apply(p_ref, x), ref.apply(p_ref, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(3, 8, 8, 4), (2, 7, 9, 2)])
def test_reshape_max_pool_matches_nn_max_pool_and_its_gradient(shape):
    """Same values as ``nn.max_pool`` (odd sizes drop the last row/column, as VALID does);
    without ties (random inputs) the same gradient."""
    x = jax.random.normal(jax.random.key(2), shape)
    ref = lambda x: nn.max_pool(x, (2, 2), strides=(2, 2))
    np.testing.assert_array_equal(max_pool_2x2(x), ref(x))
    w = jax.random.normal(jax.random.key(3), ref(x).shape)
    g = jax.grad(lambda x: (max_pool_2x2(x) * w).sum())(x)
    np.testing.assert_array_equal(g, jax.grad(lambda x: (ref(x) * w).sum())(x))
