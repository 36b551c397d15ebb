"""Particle swarm optimisation over arbitrary pytrees.

A particle is any pytree of arrays (a point in R^d, or a neural network's parameters); a
swarm stacks ``S`` particles on a leading axis of every leaf.  All functions are pure and
written for ONE swarm: lift them over runs, configurations or clients with ``jax.vmap``
and iterate with ``jax.lax.scan``.

One iteration is ``move`` (velocity and position update), evaluating the new positions
(the caller's business: a benchmark function, a client's data...), then ``observe``
(personal and global bests).  ``step`` chains the three for a loss function of one particle.

The state carries its own 32-bit ``seed`` (drawn once from the run's key by ``init``);
the coefficients of iteration ``t`` are a pure function of ``(seed, t)``, so a swarm's
trajectory does not depend on what else is in its batch and no key is threaded through
the loop.

Velocity rule (Kennedy & Eberhart with inertia)::

    v <- w v + c1 r1 (pbest - x) + c2 r2 (g - x),   x <- x + v

``g`` is the swarm's global best unless ``move`` is given another social target (a
federated server's model, for instance).  ``r1``, ``r2`` ~ U(0, 1) are drawn per particle
(the papers' choice, default) or per coordinate (``coefficients="element"``), from the
counter-based hash generator (default, see :mod:`swarmjax.random`) or from ``jax.random``.

Non-finite losses (NaN, inf) are treated as ``+inf``: such a position never becomes a
personal or global best, and the state counts them in ``nonfinite``.
"""

from __future__ import annotations

import math
from typing import Literal

import jax
import jax.numpy as jnp
from flax import struct
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray, PyTree, UInt32

from swarmjax import random as hrandom
from swarmjax._validation import check_choice, check_nonnegative, check_range

__all__ = [
    "PSOHyperParams",
    "PSOOptions",
    "SwarmState",
    "coefficients",
    "init",
    "move",
    "observe",
    "observe_global",
    "observe_personal",
    "step",
]

RNG = Literal["hash", "threefry"]
Coefficients = Literal["particle", "element"]


@struct.dataclass
class PSOHyperParams:
    """Numeric PSO hyper-parameters; every field is an array leaf, so sweeps vmap over them.

    ``velocity_clamp`` bounds each velocity coordinate to ``[-v, v]`` (``inf``: no clamp);
    ``position_low``/``position_high`` clip positions (``-inf``/``inf``: no clip).
    """

    inertia: Float[ArrayLike, ""] = 0.7
    cognitive: Float[ArrayLike, ""] = 1.4
    social: Float[ArrayLike, ""] = 1.4
    velocity_clamp: Float[ArrayLike, ""] = math.inf
    position_low: Float[ArrayLike, ""] = -math.inf
    position_high: Float[ArrayLike, ""] = math.inf

    def validate(self) -> PSOHyperParams:
        """Raise ValueError for out-of-range values (concrete values only); return self."""
        check_range("inertia", self.inertia)
        check_nonnegative("cognitive", self.cognitive)
        check_nonnegative("social", self.social)
        check_range("velocity_clamp", self.velocity_clamp, 0.0, low_open=True)
        check_range("position_low", self.position_low, -math.inf, math.inf)
        check_range("position_high", self.position_high, -math.inf, math.inf)
        low, high = jnp.asarray(self.position_low), jnp.asarray(self.position_high)
        if not isinstance(low, jax.core.Tracer) and bool(jnp.any(low >= high)):
            raise ValueError("position_low must be < position_high")
        return self


@struct.dataclass
class PSOOptions:
    """Static choices (they change the compiled program, not numbers)."""

    rng: RNG = struct.field(pytree_node=False, default="hash")
    coefficients: Coefficients = struct.field(pytree_node=False, default="particle")

    def __post_init__(self) -> None:
        check_choice("rng", self.rng, ("hash", "threefry"))
        check_choice("coefficients", self.coefficients, ("particle", "element"))


DEFAULT_OPTIONS = PSOOptions()


@struct.dataclass
class SwarmState:
    """One swarm of ``S`` particles.  Every position-like leaf has shape ``(S, *leaf)``.

    ``global_best`` has the shape of one particle; ``nonfinite`` counts non-finite losses
    observed so far.
    """

    position: PyTree
    velocity: PyTree
    best_position: PyTree
    best_loss: Float[Array, " S"]
    global_best: PyTree
    global_best_loss: Float[Array, ""]
    iteration: Int[Array, ""]
    nonfinite: Int[Array, ""]
    seed: UInt32[Array, ""]


def _finite_or_inf(loss: Float[Array, "*s"]) -> tuple[Float[Array, "*s"], Int[Array, ""]]:
    bad = ~jnp.isfinite(loss)
    return jnp.where(bad, jnp.inf, loss), jnp.sum(bad, dtype=jnp.int32)


def _take(tree: PyTree, index: Int[Array, ""]) -> PyTree:
    return jax.tree_util.tree_map(lambda leaf: leaf[index], tree)


def init(
    key: PRNGKeyArray,
    position: PyTree,
    loss: Float[ArrayLike, " S"],
    velocity: PyTree | None = None,
) -> SwarmState:
    """Start a swarm at ``position`` (leaves ``(S, ...)``) with its losses ``(S,)``.

    ``key`` seeds the swarm's coefficient stream.  Velocities default to zero; personal
    bests are the starting positions.
    """
    loss, bad = _finite_or_inf(jnp.asarray(loss, jnp.float32))
    if velocity is None:
        velocity = jax.tree_util.tree_map(jnp.zeros_like, position)
    best = jnp.argmin(loss)
    return SwarmState(
        position=position,
        velocity=velocity,
        best_position=position,
        best_loss=loss,
        global_best=_take(position, best),
        global_best_loss=loss[best],
        iteration=jnp.zeros((), jnp.int32),
        nonfinite=bad,
        seed=hrandom.stream_seed(key),
    )


def coefficients(
    seed: UInt32[ArrayLike, ""],
    iteration: Int[ArrayLike, ""],
    template: PyTree,
    options: PSOOptions = DEFAULT_OPTIONS,
) -> tuple[PyTree, PyTree]:
    """Draw ``(r1, r2)`` ~ U(0, 1) for iteration ``iteration`` of the swarm seeded ``seed``.

    ``template`` is the swarm's position pytree (leaves ``(S, ...)``).  Per-particle mode
    gives each leaf a ``(S, 1, ..., 1)`` array (the same two numbers for every coordinate of
    a particle: all leaves share them); element mode gives leaf-shaped arrays.
    """
    leaves, treedef = jax.tree_util.tree_flatten(template)
    num = leaves[0].shape[0]
    if options.coefficients == "particle":
        r1, r2 = _uniform_pair(seed, iteration, (num,), 0, options.rng)
        r1s = [r1.reshape((num,) + (1,) * (leaf.ndim - 1)) for leaf in leaves]
        r2s = [r2.reshape((num,) + (1,) * (leaf.ndim - 1)) for leaf in leaves]
        return treedef.unflatten(r1s), treedef.unflatten(r2s)
    r1s, r2s, offset = [], [], 0
    for leaf in leaves:
        r1, r2 = _uniform_pair(seed, iteration, leaf.shape, offset, options.rng)
        r1s.append(r1)
        r2s.append(r2)
        offset += 2 * math.prod(leaf.shape)
    return treedef.unflatten(r1s), treedef.unflatten(r2s)


def _uniform_pair(
    seed: UInt32[ArrayLike, ""],
    iteration: Int[ArrayLike, ""],
    shape: tuple[int, ...],
    offset: int,
    rng: RNG,
) -> tuple[Array, Array]:
    """Two uniform arrays of ``shape``: counters ``offset + [0, 2 size)`` of the iteration."""
    size = math.prod(shape)
    step_seed = hrandom.iteration_seed(seed, iteration)
    if rng == "hash":
        counter = jnp.arange(2 * size, dtype=jnp.uint32) + jnp.uint32(offset)
        u = hrandom.hash_uniform(step_seed, counter)
    else:
        key = jax.random.fold_in(jax.random.key(step_seed), offset)
        u = jax.random.uniform(key, (2 * size,))
    return u[:size].reshape(shape), u[size:].reshape(shape)


def move(
    state: SwarmState,
    hyper: PSOHyperParams,
    options: PSOOptions = DEFAULT_OPTIONS,
    social_target: PyTree | None = None,
    coeffs: tuple[PyTree, PyTree] | None = None,
) -> SwarmState:
    """Velocity and position update toward personal bests and ``social_target``.

    ``social_target`` (one particle's shape) defaults to the swarm's global best.
    ``coeffs`` are this iteration's ``(r1, r2)`` if the caller drew them already (see
    :func:`coefficients`); by default they are drawn here.
    """
    target = state.global_best if social_target is None else social_target
    if coeffs is None:
        coeffs = coefficients(state.seed, state.iteration, state.position, options)
    r1, r2 = coeffs

    def new_velocity(v, x, p, g, a, b):
        v = hyper.inertia * v + hyper.cognitive * a * (p - x) + hyper.social * b * (g[None] - x)
        return jnp.clip(v, -hyper.velocity_clamp, hyper.velocity_clamp).astype(x.dtype)

    velocity = jax.tree_util.tree_map(
        new_velocity, state.velocity, state.position, state.best_position, target, r1, r2
    )
    position = jax.tree_util.tree_map(
        lambda x, v: jnp.clip(x + v, hyper.position_low, hyper.position_high).astype(x.dtype),
        state.position,
        velocity,
    )
    return state.replace(position=position, velocity=velocity)


def observe_personal(state: SwarmState, loss: Float[Array, " S"]) -> SwarmState:
    """Record the losses of the current positions in the personal bests only.

    A non-finite loss counts as ``+inf`` and is tallied in ``nonfinite``; the iteration
    counter advances.
    """
    loss, bad = _finite_or_inf(jnp.asarray(loss, jnp.float32))
    improved = loss < state.best_loss

    def keep_better(new, old):
        mask = improved.reshape((-1,) + (1,) * (new.ndim - 1))
        return jnp.where(mask, new, old)

    return state.replace(
        best_position=jax.tree_util.tree_map(keep_better, state.position, state.best_position),
        best_loss=jnp.where(improved, loss, state.best_loss),
        iteration=state.iteration + 1,
        nonfinite=state.nonfinite + bad,
    )


def observe_global(state: SwarmState) -> SwarmState:
    """Move the global best to the best personal best if that is better."""
    leader = jnp.argmin(state.best_loss)
    leader_loss = state.best_loss[leader]
    better = leader_loss < state.global_best_loss
    global_best = jax.tree_util.tree_map(
        lambda cand, old: jnp.where(better, cand, old),
        _take(state.best_position, leader),
        state.global_best,
    )
    return state.replace(
        global_best=global_best,
        global_best_loss=jnp.minimum(leader_loss, state.global_best_loss),
    )


def observe(state: SwarmState, loss: Float[Array, " S"]) -> SwarmState:
    """Record the losses of the current positions: personal, then global bests."""
    return observe_global(observe_personal(state, loss))


def step(
    state: SwarmState,
    hyper: PSOHyperParams,
    loss_fn,
    options: PSOOptions = DEFAULT_OPTIONS,
) -> tuple[SwarmState, dict[str, Array]]:
    """One PSO iteration with ``loss_fn(particle) -> scalar`` vmapped over particles.

    Returns the new state and metrics ``{"global_best_loss", "mean_loss", "nonfinite"}``;
    ``mean_loss`` averages the finite losses of this iteration (NaN if none is finite).
    """
    state = move(state, hyper, options)
    loss = jax.vmap(loss_fn)(state.position)
    state = observe(state, loss)
    finite = jnp.isfinite(loss)
    count = jnp.sum(finite)
    mean_finite = jnp.sum(jnp.where(finite, loss, 0.0)) / jnp.maximum(count, 1)
    metrics = {
        "global_best_loss": state.global_best_loss,
        "mean_loss": jnp.where(count > 0, mean_finite, jnp.nan),
        "nonfinite": state.nonfinite,
    }
    return state, metrics
