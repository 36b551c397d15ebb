"""Benchmark functions: optima in several dimensions, domains, lookup errors."""

import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.objectives import OBJECTIVES, get_objective


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
@pytest.mark.parametrize("dim", [1, 2, 5, 30])
def test_value_at_optimum(name, dim):
    obj = OBJECTIVES[name]
    if name == "f4" and dim == 1:
        pytest.skip("Rosenbrock needs two coordinates")
    x = jnp.asarray(obj.optimum_point(dim), jnp.float32)
    tol = 1e-3 * max(1.0, abs(obj.optimum_value(dim)))
    assert float(obj(x)) == pytest.approx(obj.optimum_value(dim), abs=tol)
    assert obj.low < obj.optimum_point(dim)[0] < obj.high


def test_schwefel_optimum_is_per_dimension_not_the_papers_30d_value():
    f5 = get_objective("f5")
    assert f5.optimum_value(2) == pytest.approx(-837.9658, abs=1e-3)
    assert f5.optimum_value(30) == pytest.approx(-12569.5, abs=0.1)


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_optimum_is_a_minimum_on_random_points(name):
    obj = OBJECTIVES[name]
    pts = np.random.default_rng(0).uniform(obj.low, obj.high, size=(200, 2))
    values = np.array([float(obj(jnp.asarray(p, jnp.float32))) for p in pts])
    assert values.min() >= obj.optimum_value(2) - 1e-3


def test_known_values():
    assert float(get_objective("rosenbrock")(jnp.array([0.0, 0.0]))) == pytest.approx(1.0)
    assert float(get_objective("f6")(jnp.array([1.0, 0.0]))) == pytest.approx(1.0, abs=1e-5)
    assert float(get_objective("f2")(jnp.array([2.0, -3.0]))) == pytest.approx(11.0)


def test_unknown_function_names_the_parameter():
    with pytest.raises(ValueError, match="function"):
        get_objective("f9")


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_coordinate_major_batch_equals_one_point_at_a_time(name):
    obj = OBJECTIVES[name]
    pts = np.random.default_rng(1).uniform(obj.low, obj.high, size=(4, 5, 3)).astype(np.float32)
    one_by_one = np.array([[float(obj(jnp.asarray(p))) for p in row] for row in pts])
    batched = np.asarray(obj(jnp.asarray(np.moveaxis(pts, -1, 0))))
    assert batched.shape == (4, 5)
    np.testing.assert_allclose(batched, one_by_one, rtol=1e-5, atol=1e-4)
