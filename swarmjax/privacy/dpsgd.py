"""DP-SGD / DP-Adam: per-example clipping, Gaussian noise, any optax optimiser.

One private gradient (Abadi et al. 2016), for a padded batch ``x (B, ...)``, ``y (B,)`` with
``mask (B,)`` true on real examples::

    g = (sum_i mask_i * clip(grad loss_i, C) + N(0, (sigma C)^2 I)) / expected_batch_size

where ``clip(g, C) = g * min(1, C / ||g||)`` and ``||g||`` is the L2 norm over the whole
parameter pytree.  Hostile records: an example whose gradient norm is not finite (NaN or
inf inputs, an overflowing gradient) contributes exactly zero (still norm ``<= C``) and
shows as a non-finite entry of the returned norms (:func:`dropped_examples`); norms are
computed with each row scaled by its largest entry, so finite gradients never overflow.
Divide by the *expected* batch size ``q * n`` (not the realised one): the
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
  and every such layer's input has the batch axis first, no parameter is read outside its
  own layer's call (weight tying: found in the jaxpr), and no example moves another
  example's logits or loss (batch statistics: a forward-mode probe on random inputs).
  Anything else (Haiku, plain JAX, LayerNorm, shared layers, ...) uses the generic path
  under ``method="auto"`` and raises under ``method="fast"``.

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
import numpy as np
import optax
from jax.extend.core import Var
from jaxtyping import Array, ArrayLike, Bool, Float, PRNGKeyArray, PyTree

from swarmjax._validation import check_choice, check_int, check_nonnegative, check_range
from swarmjax.privacy.mechanisms import gaussian_mechanism

__all__ = [
    "clip_and_sum",
    "clipped_grad_sum",
    "dp_grad",
    "dp_step",
    "dropped_examples",
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


def _row_norms(leaves: list[Array]) -> Float[Array, " B"]:
    """Whole-pytree L2 norm of each row (leading axis ``B``), without overflow or underflow.

    Each row is divided by its largest magnitude before squaring, so finite rows up to the
    dtype's maximum get a finite norm (or ``inf`` if the norm itself exceeds it).  A row
    holding NaN gets NaN; a row holding ``inf`` gets ``inf`` or NaN.
    """
    rows = [jnp.reshape(g, (g.shape[0], -1)) for g in leaves]
    peak = jnp.max(jnp.stack([jnp.max(jnp.abs(r), axis=1) for r in rows]), axis=0)
    scale = jnp.where((peak > 0) & jnp.isfinite(peak), peak, 1.0)
    # The barrier stops XLA from rewriting (r / s)^2 as r^2 / s^2, which overflows again.
    scaled = jax.lax.optimization_barrier([r / scale[:, None] for r in rows])
    sq = sum(jnp.sum(r * r, axis=1) for r in scaled)
    return jnp.where(jnp.isfinite(peak), peak * jnp.sqrt(sq), peak)


def _hypot_norms(norms: list[Array]) -> Float[Array, " B"]:
    """Combine per-part norms ``(B,)`` into one norm ``sqrt(sum n^2)``, overflow-free."""
    return _row_norms([n[:, None] for n in norms])


def _clip_factors(norms: Float[Array, " B"], mask: Array, clip_norm: ArrayLike) -> Array:
    """``min(1, C / norm)`` on usable rows, exactly 0 elsewhere.

    A row is usable when it is real (``mask``) and its norm is finite.  A non-finite norm
    (NaN or inf features, an overflowing gradient) has no reliable direction, so that row
    contributes nothing: zero is a valid clipped value (norm ``<= C``), so the sensitivity
    bound holds whatever the record holds.
    """
    usable = mask & jnp.isfinite(norms)
    factor = clip_norm / jnp.maximum(jnp.where(usable, norms, 1.0), clip_norm)
    return jnp.where(usable, factor, 0.0).astype(norms.dtype)


def _weighted_rows(factor: Array, g: Array) -> Array:
    """``sum_i factor_i g_i``; rows with ``factor == 0`` add exactly zero even if non-finite."""
    keep = (factor != 0).reshape(factor.shape + (1,) * (g.ndim - 1))
    return jnp.tensordot(factor, jnp.where(keep, g, jnp.zeros((), g.dtype)), axes=1)


def dropped_examples(norms: Float[ArrayLike, " B"], mask: Bool[ArrayLike, " B"]) -> Array:
    """Number of real examples whose gradient was non-finite and so contributed nothing.

    ``norms`` as returned by :func:`clipped_grad_sum`.  This count is a statistic of the
    private data, NOT covered by the DP guarantee: use it for diagnostics, never publish it
    without accounting for it separately.
    """
    return jnp.sum(jnp.asarray(mask, bool) & ~jnp.isfinite(jnp.asarray(norms)))


def clip_and_sum(
    grads: PyTree, mask: Bool[ArrayLike, " B"], clip_norm: ArrayLike
) -> tuple[PyTree, Float[Array, " B"]]:
    """Clip per-example gradients (leading axis ``B``) to ``clip_norm`` and sum masked rows.

    Returns ``(clipped_sum, norms)`` with ``norms (B,)`` the unclipped whole-pytree norms
    (NaN or ``inf`` for rows that were dropped as non-finite, see :func:`dropped_examples`).
    """
    _check_hyper(clip_norm)
    norms = _row_norms(jax.tree_util.tree_leaves(grads))
    factor = _clip_factors(norms, jnp.asarray(mask, bool), clip_norm)
    summed = jax.tree_util.tree_map(lambda g: _weighted_rows(factor, g), grads)
    return summed, norms


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
    """The linen module behind ``apply_fn`` (``module.apply`` or a ``models.from_flax`` apply)."""
    wrapped = getattr(apply_fn, "flax_module", None)
    if isinstance(wrapped, nn.Module):
        return wrapped
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


def _fast_plan(module, params, x, loss_fn=None, y=None) -> tuple[list[_Call], Any] | str:
    """Trace shapes only; return (calls, output shapes) or the reason the fast path fails."""
    if not isinstance(params, dict) and not hasattr(params, "keys"):
        return "params is not a Flax variables dict"
    if set(params.keys()) != {"params"}:
        return f"params has collections {sorted(params.keys())}; only 'params' is supported"
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
        return f"inputs have dtype {jnp.result_type(x)}; the fast path needs floating inputs"
    holder: dict[str, list[_Call]] = {}

    def trace(p, xs):
        logits, calls = _recording_apply(module, p, xs, None)
        holder["calls"] = calls
        return logits, [c.inputs for c in calls]

    try:
        jax.eval_shape(trace, _spec(params), _spec(x))
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
            _spec(_layer_params(params, c.path)),
            c.inputs,
        )
        if c.inputs.shape[:1] != x.shape[:1] or layer_out.shape[:1] != x.shape[:1]:
            return f"layer {'/'.join(c.path)} does not keep the batch axis first"
        out_shapes.append(layer_out)
    try:
        tied = _params_read_outside_layers(module, params, x, calls)
        mixing = _mixing_reason(module, params, x, out_shapes, loss_fn, y)
    except Exception as exc:  # a check that cannot run: use the generic path
        return f"the fast-path checks could not run: {type(exc).__name__}: {exc}"
    if tied:
        return (
            f"parameters {tied} are also read outside their layer's call (weight tying?); "
            "the fast path would miss that gradient term"
        )
    if mixing:
        return mixing
    return calls, out_shapes


def _spec(tree: PyTree) -> PyTree:
    return jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)), tree
    )


def _params_read_outside_layers(module, params, x, calls: list[_Call]) -> list[str]:
    """Parameter paths that reach the output other than through their own layer's call.

    The model is traced with every Dense/Conv call fed a separate copy of its parameters;
    any use left of the original ones (a tied kernel, ``layer.variables`` read elsewhere)
    is found by following data dependencies through the jaxpr.
    """

    def substituted(p_outer, p_layers, xs):
        inside: list[bool] = []  # the copy's own call must not be substituted again

        def intercept(next_fun, args, kwargs, context):
            mod = context.module
            if inside or context.method_name != "__call__" or type(mod) not in _FAST_LAYERS:
                return next_fun(*args, **kwargs)
            own = p_layers["/".join(mod.scope.path)]
            inside.append(True)
            try:
                return mod.clone(parent=None).apply({"params": own}, *args, **kwargs)
            finally:
                inside.pop()

        with nn.intercept_methods(intercept):
            return module.apply(p_outer, xs)

    p_layers = {"/".join(c.path): _spec(_layer_params(params, c.path)) for c in calls}
    closed = jax.make_jaxpr(substituted)(_spec(params), p_layers, _spec(x))
    names = ["/".join((*path, leaf)) for path, leaf in _param_paths(params)]
    reached = _inputs_reaching_outputs(closed.jaxpr, len(names))
    return [names[i] for i in sorted(reached)]


def _inputs_reaching_outputs(jaxpr, num_inputs: int) -> set[int]:
    """Which of the first ``num_inputs`` inputs of ``jaxpr`` the outputs depend on.

    Conservative: an equation's outputs depend on all of its inputs (sub-jaxprs included).
    """
    sources: dict[Any, frozenset[int]] = {
        v: frozenset({i}) for i, v in enumerate(jaxpr.invars[:num_inputs])
    }
    for eqn in jaxpr.eqns:
        found = frozenset().union(
            *(sources.get(v, frozenset()) for v in eqn.invars if isinstance(v, Var))
        )
        if found:
            for v in eqn.outvars:
                sources[v] = found
    return set().union(*(sources.get(v, frozenset()) for v in jaxpr.outvars if isinstance(v, Var)))


def _mixing_reason(module, params, x, out_shapes, loss_fn, y) -> str | None:
    """Whether one example's input (or a layer output) moves another example's output.

    Probed with data-independent random parameters and inputs of the same shapes (never
    the caller's data): a forward-mode derivative seeded on one example must be exactly
    zero on every other example's logits (and losses, given ``loss_fn`` and ``y``).
    Batch statistics (normalising over the batch, batch means) fail this.
    """
    batch = x.shape[0]
    if batch < 2:
        return None
    rng = np.random.default_rng(0)
    draw = lambda s: (0.5 * rng.standard_normal(s.shape)).astype(s.dtype)
    p_probe = jax.tree_util.tree_map(draw, _spec(params))
    y_probe = None if y is None else np.zeros(jnp.shape(y), jnp.result_type(y))
    use_loss = loss_fn is not None and y_probe is not None

    def outputs(pp, xs, perturbs):
        logits, _ = _recording_apply(module, pp, xs, perturbs)
        outs = [logits.reshape(batch, -1)]
        if use_loss:
            outs.append(jnp.reshape(loss_fn(logits, y_probe), (batch, -1)))
        return jnp.concatenate(outs, axis=1)

    @jax.jit
    def moved_elsewhere(pp, xs, tangents, row):
        zeros = [jnp.zeros(s.shape, s.dtype) for s in out_shapes]
        _, moved = jax.jvp(lambda a, b: outputs(pp, a, b), (xs, zeros), tangents)
        return jnp.any((moved != 0) & (jnp.arange(batch) != row)[:, None])

    def seeded(s, row):
        t = np.zeros(s.shape, s.dtype)
        t[row] = draw(s)[row]
        return t

    probes = {}
    for row in (0, batch - 1):  # the tangents drawn first, then the inputs, as always
        tangents = (seeded(_spec(x), row), [seeded(s, row) for s in out_shapes])
        probes[row] = (p_probe, draw(_spec(x)), tangents, np.int32(row))
    # compiled ahead of time and run on the probes: concrete even while the caller's step
    # is being traced, and one program (evaluated eagerly, each op compiled its own)
    moved = moved_elsewhere.lower(*probes[0]).compile()
    for row, args in probes.items():
        if bool(moved(*args)):
            return (
                f"example {row} changes other examples' outputs (batch statistics or "
                "other mixing across the batch); per-example clipping needs independence"
            )
    return None


def _layer_params(params: PyTree, path: tuple[str, ...]) -> PyTree:
    node = params["params"]
    for name in path:
        node = node[name]
    return node


def fast_path_supported(
    apply_fn: ApplyFn,
    params: PyTree,
    x: Array,
    loss_fn: LossFn | None = None,
    y: ArrayLike | None = None,
) -> tuple[bool, str]:
    """Whether :func:`clipped_grad_sum` can use the fast path, and why not if it cannot.

    With ``loss_fn`` and ``y`` the loss is checked for mixing examples too.
    """
    module = _flax_module(apply_fn)
    if module is None:
        return False, "apply_fn is not the apply method of a flax.linen Module"
    plan = _fast_plan(module, params, x, loss_fn, y)
    if isinstance(plan, str):
        return False, plan
    return True, "ok"


def _dense_2d(call: _Call, a: Array, delta: Array, has_bias: bool):
    """Ghost norms and the clipped-sum builder for a dense layer on ``(B, d_in)`` inputs.

    ``||grad_i|| = ||delta_i|| sqrt(||a_i||^2 + [bias])``, each norm overflow-free.
    """
    a_norm = _row_norms([a])
    d_norm = _row_norms([delta])
    norms = d_norm * (_hypot_norms([a_norm, jnp.ones_like(a_norm)]) if has_bias else a_norm)

    def clipped(factor: Array) -> dict[str, Array]:
        keep = (factor != 0)[:, None]
        a_w = jnp.where(keep, a * factor[:, None], jnp.zeros((), a.dtype))
        d_w = jnp.where(keep, delta, jnp.zeros((), delta.dtype))
        out = {"kernel": a_w.T @ d_w}
        if has_bias:
            out["bias"] = factor @ d_w
        return out

    return norms, clipped


def _per_example_layer(call: _Call, layer_params: PyTree, a: Array, delta: Array):
    """Per-example gradients of one layer's parameters from its inputs and output grads."""

    def one(ai: Array, di: Array) -> PyTree:
        fn = lambda p: call.module.apply({"params": p}, ai[None])
        _, vjp = jax.vjp(fn, layer_params)
        return vjp(di[None])[0]

    grads = jax.vmap(one)(a, delta)
    norms = _row_norms(jax.tree_util.tree_leaves(grads))

    def clipped(factor: Array) -> PyTree:
        return jax.tree_util.tree_map(lambda g: _weighted_rows(factor, g), grads)

    return norms, clipped


def _fast_clipped_sum(module, plan, loss_fn, params, x, y, mask, clip_norm):
    _, out_shapes = plan
    zeros = [jnp.zeros(s.shape, s.dtype) for s in out_shapes]

    def total_loss(perturbs):
        logits, calls = _recording_apply(module, params, x, perturbs)
        losses = jnp.where(mask, loss_fn(logits, y), 0.0)
        return jnp.sum(losses), [c.inputs for c in calls]

    deltas, inputs = jax.grad(total_loss, has_aux=True)(zeros)
    calls = plan[0]
    layer_norms = []
    builders = []
    for call, a, delta in zip(calls, inputs, deltas, strict=True):
        layer_params = _layer_params(params, call.path)
        if type(call.module) is nn.Dense and a.ndim == 2:
            norms, build = _dense_2d(call, a, delta, "bias" in layer_params)
        else:
            norms, build = _per_example_layer(call, layer_params, a, delta)
        layer_norms.append(norms)
        builders.append((call.path, build))
    norms = _hypot_norms(layer_norms)
    factor = _clip_factors(norms, mask, clip_norm)
    by_path = {path: build(factor) for path, build in builders}
    leaves = [by_path[path][name] for path, name in _param_paths(params)]
    treedef = jax.tree_util.tree_structure(params)
    return jax.tree_util.tree_unflatten(treedef, leaves), norms


# ----------------------------------------------------------------------------------------
# Public entry points
# ----------------------------------------------------------------------------------------


def _select(apply_fn, loss_fn, params, x, y, method):
    check_choice("method", method, _METHODS)
    if method == "generic":
        return None
    module = _flax_module(apply_fn)
    if module is None:
        plan = "not a flax.linen apply"
    else:
        plan = _fast_plan(module, params, x, loss_fn, y)
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
    selected = _select(apply_fn, loss_fn, params, x[:chunk], y[:chunk], method)

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
    canary_sum: PyTree | None = None,
) -> PyTree:
    """Private gradient: clipped sum + ``N(0, (noise_multiplier clip_norm)^2)``, / expected size.

    ``expected_batch_size`` is ``q * n`` (Poisson rate times real examples), ``> 0``.
    ``noise_multiplier`` (``>= 0``), ``clip_norm`` and ``expected_batch_size`` may be arrays
    or tracers (vmappable sweeps).  ``canary_sum``: the step's drawn gradient canaries (a
    pytree like ``params``, each canary of norm ``clip_norm``:
    :meth:`swarmjax.privacy.canaries.GradientCanaries.gradient_sum`), added to the clipped
    sum before the noise, as records of the batch would be; ``None``: no audit.  Other
    arguments as :func:`clipped_grad_sum`.
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
    if canary_sum is not None:
        summed = jax.tree_util.tree_map(lambda s, c: s + c.astype(s.dtype), summed, canary_sum)
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
