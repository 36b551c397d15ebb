"""DP-SGD / DP-Adam: per-example clipping, Gaussian noise, any optax optimiser.

One private gradient (Abadi et al. 2016), for a padded batch ``x (B, ...)``, ``y (B,)`` with
``mask (B,)`` true on real examples::

    g = (sum_i mask_i * clip(grad loss_i, C) + N(0, (sigma C)^2 I)) / expected_batch_size

where ``clip(g, C) = g * min(1, C / ||g||)`` and ``||g||`` is the L2 norm over the whole
parameter pytree.  Divide by the *expected* batch size ``q * n`` (not the realised one): the
realised size is data-dependent, the expected one is public.

Two ways to get the clipped sum, same result (same key -> same noised gradient):

* ``"generic"``: per-example gradients by ``jax.vmap(jax.grad(loss_i))``.  Any model given as
  a pure ``apply_fn(params, x) -> logits`` (Flax, Haiku, plain JAX).  Memory and time grow
  with ``B x #params``; ``microbatch_size`` bounds the memory.
* ``"fast"`` (book-keeping / ghost clipping; Goodfellow 2015, Li et al. 2022, Bu et al.
  2023): one backward pass with respect to zero "perturbations" added to the outputs of the
  model's layers gives every layer's output gradients ``delta_i``; with the recorded inputs
  ``a_i`` these give per-example norms and the clipped sum without per-example gradients.
  For a dense layer on ``(B, d_in)`` inputs, ``||grad W_i|| = ||a_i|| ||delta_i||`` and the
  clipped sum is one weighted matmul ``a^T (f * delta)``.  Convolutions (and dense layers on
  inputs with extra axes) get per-example gradients of that layer only, by ``vmap`` of the
  layer's own VJP, which is small for LeNet-style models.

  Detection: the fast path applies when ``apply_fn`` is the ``apply`` method of a
  ``flax.linen`` Module (``module.apply``, as :func:`swarmjax.models.from_flax` builds it),
  ``params`` holds only the ``"params"`` collection, every parameter belongs to an
  ``nn.Dense`` or ``nn.Conv`` layer (exact types) that is called once per forward pass,
  and every such layer's input has the batch axis first.  Anything else (Haiku, plain JAX,
  LayerNorm, shared layers, ...) uses the generic path under ``method="auto"`` and raises
  under ``method="fast"``.  The model must treat examples independently (no batch norm).

Noise: :func:`swarmjax.privacy.mechanisms.gaussian_mechanism` (one draw for the whole pytree).
Pass a key already folded with the step, client and particle indices (:func:`noise_key`)
so noise is independent across them and batch-invariant.  ``noise_multiplier = 0`` is
allowed only explicitly; the accountant then reports ``epsilon = inf``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, ArrayLike, Bool, Float, PRNGKeyArray, PyTree

from swarmjax._validation import check_choice, check_int, check_nonnegative, check_range
from swarmjax.privacy.mechanisms import gaussian_mechanism

__all__ = [
    "clip_and_sum",
    "clipped_grad_sum",
    "dp_grad",
    "dp_step",
    "fast_path_supported",
    "noise_key",
    "per_example_grads",
]

ApplyFn = Callable[[PyTree, Array], Array]
LossFn = Callable[[Array, Array], Array]  # (logits, labels) -> per-example loss
_METHODS = ("auto", "generic", "fast")
_FAST_LAYERS = (nn.Dense, nn.Conv)


def noise_key(key: PRNGKeyArray, *indices: ArrayLike) -> PRNGKeyArray:
    """``fold_in`` each index in turn (e.g. step, client, particle): independent noise keys."""
    for index in indices:
        key = jax.random.fold_in(key, index)
    return key


def _check_hyper(clip_norm: ArrayLike, noise_multiplier: ArrayLike | None = None) -> None:
    check_range("clip_norm", clip_norm, 0.0, float("inf"), low_open=True, high_open=True)
    if noise_multiplier is not None:
        check_nonnegative("noise_multiplier", noise_multiplier)


def _zero_padding(x: Array, mask: Array) -> Array:
    # Padded rows may hold anything; zero them so that 0 * NaN cannot reach the gradient.
    m = mask.reshape(mask.shape + (1,) * (x.ndim - 1))
    return jnp.where(m, x, jnp.zeros((), x.dtype))


# ----------------------------------------------------------------------------------------
# Generic path
# ----------------------------------------------------------------------------------------


def per_example_grads(
    apply_fn: ApplyFn, loss_fn: LossFn, params: PyTree, x: Array, y: Array
) -> PyTree:
    """Per-example gradients ``(B, *leaf.shape)`` by ``vmap(grad)``.

    Each example is fed as a batch of one (``x[i][None]``), so any ``apply_fn`` that takes a
    batch works.
    """

    def one(p: PyTree, xi: Array, yi: Array) -> Array:
        return loss_fn(apply_fn(p, xi[None])[0], yi)

    return jax.vmap(jax.grad(one), in_axes=(None, 0, 0))(params, x, y)


def _clip_factors(sq_norms: Float[Array, " B"], mask: Array, clip_norm: ArrayLike) -> Array:
    norms = jnp.sqrt(sq_norms)
    factor = clip_norm / jnp.maximum(norms, clip_norm)
    return jnp.where(mask, factor, 0.0).astype(sq_norms.dtype)


def clip_and_sum(
    grads: PyTree, mask: Bool[ArrayLike, " B"], clip_norm: ArrayLike
) -> tuple[PyTree, Float[Array, " B"]]:
    """Clip per-example gradients (leading axis ``B``) to ``clip_norm`` and sum masked rows.

    Returns ``(clipped_sum, norms)`` with ``norms (B,)`` the unclipped whole-pytree norms.
    """
    _check_hyper(clip_norm)
    leaves = jax.tree_util.tree_leaves(grads)
    sq = sum(jnp.sum(jnp.reshape(g, (g.shape[0], -1)) ** 2, axis=1) for g in leaves)
    factor = _clip_factors(sq, jnp.asarray(mask, bool), clip_norm)
    summed = jax.tree_util.tree_map(lambda g: jnp.tensordot(factor, g, axes=1), grads)
    return summed, jnp.sqrt(sq)


def _generic_clipped_sum(apply_fn, loss_fn, params, x, y, mask, clip_norm):
    grads = per_example_grads(apply_fn, loss_fn, params, x, y)
    return clip_and_sum(grads, mask, clip_norm)


# ----------------------------------------------------------------------------------------
# Fast path (Flax linen Dense / Conv)
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Call:
    path: tuple[str, ...]
    module: nn.Module
    inputs: Any = None


def _flax_module(apply_fn: ApplyFn) -> nn.Module | None:
    owner = getattr(apply_fn, "__self__", None)
    if isinstance(owner, nn.Module) and getattr(apply_fn, "__func__", None) is nn.Module.apply:
        return owner
    return None


def _recording_apply(module, params, x, perturbs):
    """Apply ``module`` recording each Dense/Conv call; add ``perturbs[k]`` to call k's output."""
    calls: list[_Call] = []

    def intercept(next_fun, args, kwargs, context):
        mod = context.module
        if context.method_name != "__call__" or type(mod) not in _FAST_LAYERS:
            return next_fun(*args, **kwargs)
        out = next_fun(*args, **kwargs)
        calls.append(_Call(tuple(mod.scope.path), mod.clone(parent=None), args[0]))
        if perturbs is not None:
            out = out + perturbs[len(calls) - 1]
        return out

    with nn.intercept_methods(intercept):
        logits = module.apply(params, x)
    return logits, calls


def _param_paths(params: PyTree) -> list[tuple[tuple[str, ...], str]]:
    paths = []
    for key_path, _ in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = tuple(str(getattr(k, "key", k)) for k in key_path)
        paths.append((names[1:-1], names[-1]))
    return paths


def _fast_plan(module, params, x) -> tuple[list[_Call], Any] | str:
    """Trace shapes only; return (calls, output shapes) or the reason the fast path fails."""
    if not isinstance(params, dict) and not hasattr(params, "keys"):
        return "params is not a Flax variables dict"
    if set(params.keys()) != {"params"}:
        return f"params has collections {sorted(params.keys())}; only 'params' is supported"
    spec = lambda a: jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a))
    holder: dict[str, list[_Call]] = {}

    def trace(p, xs):
        logits, calls = _recording_apply(module, p, xs, None)
        holder["calls"] = calls
        return logits, [c.inputs for c in calls]

    try:
        jax.eval_shape(trace, jax.tree_util.tree_map(spec, params), spec(x))
    except Exception as exc:  # the model cannot be traced this way: use the generic path
        return f"tracing the model failed: {exc}"
    calls = holder["calls"]
    paths = [c.path for c in calls]
    if len(set(paths)) != len(paths):
        return "a Dense/Conv layer is called more than once per forward pass"
    covered = set(paths)
    missing = [p for p, _ in _param_paths(params) if p not in covered]
    if missing:
        return f"parameters outside Dense/Conv layers: {sorted(set(missing))}"
    out_shapes = []
    for c in calls:
        layer_out = jax.eval_shape(
            lambda p, a, c=c: c.module.apply({"params": p}, a),
            _layer_params_spec(params, c.path),
            c.inputs,
        )
        if c.inputs.shape[:1] != x.shape[:1] or layer_out.shape[:1] != x.shape[:1]:
            return f"layer {'/'.join(c.path)} does not keep the batch axis first"
        out_shapes.append(layer_out)
    return calls, out_shapes


def _layer_params(params: PyTree, path: tuple[str, ...]) -> PyTree:
    node = params["params"]
    for name in path:
        node = node[name]
    return node


def _layer_params_spec(params: PyTree, path: tuple[str, ...]) -> PyTree:
    node = _layer_params(params, path)
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), node)


def fast_path_supported(apply_fn: ApplyFn, params: PyTree, x: Array) -> tuple[bool, str]:
    """Whether :func:`clipped_grad_sum` can use the fast path, and why not if it cannot."""
    module = _flax_module(apply_fn)
    if module is None:
        return False, "apply_fn is not the apply method of a flax.linen Module"
    plan = _fast_plan(module, params, x)
    if isinstance(plan, str):
        return False, plan
    return True, "ok"


def _dense_2d(call: _Call, a: Array, delta: Array, has_bias: bool):
    """Ghost norms and the clipped-sum builder for a dense layer on ``(B, d_in)`` inputs."""
    d2 = jnp.sum(delta * delta, axis=1)
    sq = jnp.sum(a * a, axis=1) * d2 + (d2 if has_bias else 0.0)

    def clipped(factor: Array) -> dict[str, Array]:
        out = {"kernel": (a * factor[:, None]).T @ delta}
        if has_bias:
            out["bias"] = factor @ delta
        return out

    return sq, clipped


def _per_example_layer(call: _Call, layer_params: PyTree, a: Array, delta: Array):
    """Per-example gradients of one layer's parameters from its inputs and output grads."""

    def one(ai: Array, di: Array) -> PyTree:
        fn = lambda p: call.module.apply({"params": p}, ai[None])
        _, vjp = jax.vjp(fn, layer_params)
        return vjp(di[None])[0]

    grads = jax.vmap(one)(a, delta)
    leaves = jax.tree_util.tree_leaves(grads)
    sq = sum(jnp.sum(jnp.reshape(g, (g.shape[0], -1)) ** 2, axis=1) for g in leaves)

    def clipped(factor: Array) -> PyTree:
        return jax.tree_util.tree_map(lambda g: jnp.tensordot(factor, g, axes=1), grads)

    return sq, clipped


def _fast_clipped_sum(module, plan, loss_fn, params, x, y, mask, clip_norm):
    _, out_shapes = plan
    zeros = [jnp.zeros(s.shape, s.dtype) for s in out_shapes]

    def total_loss(perturbs):
        logits, calls = _recording_apply(module, params, x, perturbs)
        losses = jnp.where(mask, loss_fn(logits, y), 0.0)
        return jnp.sum(losses), [c.inputs for c in calls]

    deltas, inputs = jax.grad(total_loss, has_aux=True)(zeros)
    calls = plan[0]
    sq_total = 0.0
    builders = []
    for call, a, delta in zip(calls, inputs, deltas, strict=True):
        layer_params = _layer_params(params, call.path)
        if type(call.module) is nn.Dense and a.ndim == 2:
            sq, build = _dense_2d(call, a, delta, "bias" in layer_params)
        else:
            sq, build = _per_example_layer(call, layer_params, a, delta)
        sq_total = sq_total + sq
        builders.append((call.path, build))
    factor = _clip_factors(sq_total, mask, clip_norm)
    by_path = {path: build(factor) for path, build in builders}
    leaves = [by_path[path][name] for path, name in _param_paths(params)]
    treedef = jax.tree_util.tree_structure(params)
    return jax.tree_util.tree_unflatten(treedef, leaves), jnp.sqrt(sq_total)


# ----------------------------------------------------------------------------------------
# Public entry points
# ----------------------------------------------------------------------------------------


def _select(apply_fn, params, x, method):
    check_choice("method", method, _METHODS)
    if method == "generic":
        return None
    module = _flax_module(apply_fn)
    plan = _fast_plan(module, params, x) if module is not None else "not a flax.linen apply"
    if isinstance(plan, str):
        if method == "fast":
            raise ValueError(f"method='fast' is not supported for this model: {plan}")
        return None
    return module, plan


def clipped_grad_sum(
    params: PyTree,
    x: Float[ArrayLike, "B ..."],
    y: ArrayLike,
    mask: Bool[ArrayLike, " B"],
    *,
    apply_fn: ApplyFn,
    loss_fn: LossFn,
    clip_norm: ArrayLike,
    microbatch_size: int | None = None,
    method: str = "auto",
) -> tuple[PyTree, Float[Array, " B"]]:
    """Sum over real examples of per-example gradients clipped to ``clip_norm`` (no noise).

    Args:
        params: model parameters (pytree).
        x: ``(B, ...)`` inputs, padded; y: ``(B, ...)`` labels.
        mask: ``(B,)`` true for real examples; padded rows contribute exactly nothing.
        apply_fn: ``(params, x (b, ...)) -> logits (b, ...)``.
        loss_fn: ``(logits, labels) -> loss`` elementwise over a leading batch axis (e.g.
            :func:`swarmjax.models.cross_entropy`, optax's ``*_with_integer_labels``).
        clip_norm: ``C > 0``, L2 bound of each example's whole-pytree gradient.
        microbatch_size: process the batch in chunks of this size (must divide ``B``) to
            bound memory; ``None`` processes it at once.
        method: ``"auto"`` (fast if supported, see module docs), ``"fast"``, ``"generic"``.

    Returns:
        ``(clipped_sum, norms)``: a pytree like ``params`` and the ``(B,)`` unclipped norms.
    """
    _check_hyper(clip_norm)
    x, y = jnp.asarray(x), jnp.asarray(y)
    mask = jnp.asarray(mask, bool)
    batch = x.shape[0]
    if mask.shape != (batch,) or y.shape[:1] != (batch,):
        raise ValueError(
            f"mask must have shape ({batch},) and y a leading axis of {batch}; "
            f"got mask {mask.shape}, y {y.shape}"
        )
    chunk = batch if microbatch_size is None else check_int("microbatch_size", microbatch_size, 1)
    if batch % chunk:
        raise ValueError(f"microbatch_size must divide the batch size {batch}; got {chunk}")
    x = _zero_padding(x, mask)
    selected = _select(apply_fn, params, x[:chunk], method)

    def run(xc, yc, mc):
        if selected is None:
            return _generic_clipped_sum(apply_fn, loss_fn, params, xc, yc, mc, clip_norm)
        module, plan = selected
        return _fast_clipped_sum(module, plan, loss_fn, params, xc, yc, mc, clip_norm)

    if chunk == batch:
        return run(x, y, mask)
    split = lambda a: a.reshape((batch // chunk, chunk, *a.shape[1:]))

    def body(acc, xs):
        part, norms = run(*xs)
        return jax.tree_util.tree_map(jnp.add, acc, part), norms

    zero = jax.tree_util.tree_map(jnp.zeros_like, params)
    total, norms = jax.lax.scan(body, zero, (split(x), split(y), split(mask)))
    return total, norms.reshape(batch)


def dp_grad(
    key: PRNGKeyArray,
    params: PyTree,
    x: Float[ArrayLike, "B ..."],
    y: ArrayLike,
    mask: Bool[ArrayLike, " B"],
    *,
    apply_fn: ApplyFn,
    loss_fn: LossFn,
    clip_norm: ArrayLike,
    noise_multiplier: ArrayLike,
    expected_batch_size: ArrayLike,
    microbatch_size: int | None = None,
    method: str = "auto",
) -> PyTree:
    """Private gradient: clipped sum + ``N(0, (noise_multiplier clip_norm)^2)``, / expected size.

    ``expected_batch_size`` is ``q * n`` (Poisson rate times real examples), ``> 0``.
    ``noise_multiplier`` (``>= 0``), ``clip_norm`` and ``expected_batch_size`` may be arrays
    or tracers (vmappable sweeps).  Other arguments as :func:`clipped_grad_sum`.
    """
    _check_hyper(clip_norm, noise_multiplier)
    check_range("expected_batch_size", expected_batch_size, 0.0, float("inf"), low_open=True)
    summed, _ = clipped_grad_sum(
        params,
        x,
        y,
        mask,
        apply_fn=apply_fn,
        loss_fn=loss_fn,
        clip_norm=clip_norm,
        microbatch_size=microbatch_size,
        method=method,
    )
    noisy = gaussian_mechanism(
        key, summed, l2_sensitivity=clip_norm, noise_multiplier=noise_multiplier
    )
    return jax.tree_util.tree_map(lambda g: g / expected_batch_size, noisy)


def dp_step(
    key: PRNGKeyArray,
    params: PyTree,
    opt_state: optax.OptState,
    x: Float[ArrayLike, "B ..."],
    y: ArrayLike,
    mask: Bool[ArrayLike, " B"],
    *,
    optimizer: optax.GradientTransformation,
    apply_fn: ApplyFn,
    loss_fn: LossFn,
    clip_norm: ArrayLike,
    noise_multiplier: ArrayLike,
    expected_batch_size: ArrayLike,
    microbatch_size: int | None = None,
    method: str = "auto",
) -> tuple[PyTree, optax.OptState]:
    """One DP step: :func:`dp_grad`, then any optax ``optimizer`` (e.g. ``optax.adamw``).

    DP-SGD = ``optax.sgd``; DP-Adam with weight decay = ``optax.adamw(lr, weight_decay=wd)``
    (post-processing of the private gradient, so it costs no privacy).
    Returns ``(new_params, new_opt_state)``.
    """
    grads = dp_grad(
        key,
        params,
        x,
        y,
        mask,
        apply_fn=apply_fn,
        loss_fn=loss_fn,
        clip_norm=clip_norm,
        noise_multiplier=noise_multiplier,
        expected_batch_size=expected_batch_size,
        microbatch_size=microbatch_size,
        method=method,
    )
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state
