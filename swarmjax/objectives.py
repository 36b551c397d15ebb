"""Benchmark objectives f1-f8 of the PAASO paper, in any dimension.

Each objective is minimised and is coordinate-major: ``x`` has shape ``(d, *batch)`` (the
coordinate axis first) and the result has shape ``batch``; one point ``(d,)`` gives a
scalar.  Evaluating a whole swarm stored as ``(d, S)`` is one fused elementwise pass, with
no small ``d``-sized axis in the minor (vectorised) position; ``jax.vmap`` works as well.
``OBJECTIVES`` names each with its search domain and known optimum in ``d`` dimensions.

f5 (Schwefel 2.26): the optimum is ``-418.9829 * d`` at ``x_i = 420.9687``.  The PAASO
paper quotes -12569.5, which is the 30-D value; in 2-D it is -837.9658.
f4 (Rosenbrock) is the chained form ``sum_i 100 (x_{i+1} - x_i^2)^2 + (x_i - 1)^2``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from swarmjax._validation import check_choice, check_int

__all__ = ["OBJECTIVES", "Objective", "get_objective"]

Vector = Float[Array, "d *batch"]
Scalar = Float[Array, "*batch"]


def sphere(x: Vector) -> Scalar:
    """f1: sum x_i^2."""
    return jnp.sum(x * x, axis=0)


def schwefel_222(x: Vector) -> Scalar:
    """f2: sum |x_i| + prod |x_i|."""
    a = jnp.abs(x)
    return jnp.sum(a, axis=0) + jnp.prod(a, axis=0)


def schwefel_12(x: Vector) -> Scalar:
    """f3: sum_i (sum_{j<=i} x_j)^2."""
    return jnp.sum(jnp.cumsum(x, axis=0) ** 2, axis=0)


def rosenbrock(x: Vector) -> Scalar:
    """f4: chained Rosenbrock, sum 100 (x_{i+1} - x_i^2)^2 + (x_i - 1)^2."""
    head, tail = x[:-1], x[1:]
    return jnp.sum(100.0 * (tail - head * head) ** 2 + (head - 1.0) ** 2, axis=0)


def schwefel_226(x: Vector) -> Scalar:
    """f5: -sum x_i sin(sqrt|x_i|)."""
    return -jnp.sum(x * jnp.sin(jnp.sqrt(jnp.abs(x))), axis=0)


def rastrigin(x: Vector) -> Scalar:
    """f6: 10 d + sum x_i^2 - 10 cos(2 pi x_i)."""
    return 10.0 * x.shape[0] + jnp.sum(x * x - 10.0 * jnp.cos(2.0 * jnp.pi * x), axis=0)


def ackley(x: Vector) -> Scalar:
    """f7: -20 exp(-0.2 sqrt(mean x^2)) - exp(mean cos 2 pi x) + 20 + e."""
    return (
        -20.0 * jnp.exp(-0.2 * jnp.sqrt(jnp.mean(x * x, axis=0)))
        - jnp.exp(jnp.mean(jnp.cos(2.0 * jnp.pi * x), axis=0))
        + 20.0
        + jnp.e
    )


def griewank(x: Vector) -> Scalar:
    """f8: 1 + sum x_i^2 / 4000 - prod cos(x_i / sqrt(i))."""
    i = jnp.arange(1, x.shape[0] + 1, dtype=x.dtype).reshape((-1,) + (1,) * (x.ndim - 1))
    return 1.0 + jnp.sum(x * x, axis=0) / 4000.0 - jnp.prod(jnp.cos(x / jnp.sqrt(i)), axis=0)


@dataclass(frozen=True)
class Objective:
    """A benchmark function with its box domain and known optimum.

    ``optimum_value(d)`` and ``optimum_point(d)`` give the global minimum in ``d`` dimensions.
    """

    name: str
    fn: Callable[[Vector], Scalar]
    low: float
    high: float
    _value: Callable[[int], float]
    _point: float

    @property
    def width(self) -> float:
        """Domain width ``high - low`` (the default velocity clamp)."""
        return self.high - self.low

    def optimum_value(self, dim: int = 2) -> float:
        """Global minimum value in ``dim`` dimensions."""
        return self._value(check_int("dim", dim, minimum=1))

    def optimum_point(self, dim: int = 2) -> np.ndarray:
        """A global minimiser in ``dim`` dimensions."""
        return np.full(check_int("dim", dim, minimum=1), self._point)

    def __call__(self, x: Vector) -> Scalar:
        return self.fn(x)


_SCHWEFEL_X = 420.968746
_SCHWEFEL_F = -418.982887  # per dimension: -x sin(sqrt(x)) at _SCHWEFEL_X

OBJECTIVES: dict[str, Objective] = {
    o.name: o
    for o in (
        Objective("f1", sphere, -100.0, 100.0, lambda d: 0.0, 0.0),
        Objective("f2", schwefel_222, -10.0, 10.0, lambda d: 0.0, 0.0),
        Objective("f3", schwefel_12, -100.0, 100.0, lambda d: 0.0, 0.0),
        Objective("f4", rosenbrock, -2.0, 2.0, lambda d: 0.0, 1.0),
        Objective("f5", schwefel_226, -500.0, 500.0, lambda d: _SCHWEFEL_F * d, _SCHWEFEL_X),
        Objective("f6", rastrigin, -5.12, 5.12, lambda d: 0.0, 0.0),
        Objective("f7", ackley, -32.768, 32.768, lambda d: 0.0, 0.0),
        Objective("f8", griewank, -600.0, 600.0, lambda d: 0.0, 0.0),
    )
}

ALIASES = {
    "sphere": "f1",
    "quadratic": "f1",
    "schwefel_2.22": "f2",
    "schwefel_1.2": "f3",
    "rosenbrock": "f4",
    "schwefel_2.26": "f5",
    "rastrigin": "f6",
    "ackley": "f7",
    "griewank": "f8",
}


def get_objective(name: str) -> Objective:
    """Look up an objective by id (``"f1"``..``"f8"``) or name (``"rosenbrock"``)."""
    key = ALIASES.get(str(name).lower(), str(name).lower())
    check_choice("function", key, OBJECTIVES)
    return OBJECTIVES[key]
