"""Models as ``(init, apply)`` pairs, the papers' Flax models, losses and size helpers.

A :class:`Model` bundles ``init(key) -> params`` and ``apply(params, x) -> logits``; every
algorithm in swarmjax takes one, so Flax linen (:func:`from_flax`), Flax NNX
(:func:`from_nnx`), Haiku (:func:`from_haiku`) and plain-JAX models all fit.
``apply`` accepts a batch ``(B, *input_shape)`` and returns logits ``(B, num_classes)``.

Shipped models (seed 000, spec section 2.5):

* :func:`mlp` / :func:`paper_mlp`: a plain stack of ``nn.Dense`` layers (``Dense_0``,
  ``Dense_1``, ...) with ReLU, flattening its input; the paper's MLP is 784-256-256-10.
* :func:`lenet5`: the LeNet-5 variant for 28x28x3 PathMNIST: conv 5x5 6 ch, max-pool 2,
  conv 5x5 16 ch, max-pool 2, flatten, 120, 84, ``num_classes``, ReLU.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree

from swarmjax._validation import check_choice, check_int

if TYPE_CHECKING:  # flax.nnx is imported only when an NNX model is wrapped (0.5 s)
    from flax import nnx

__all__ = [
    "Model",
    "SliceConv",
    "accuracy",
    "char_lstm",
    "check_model",
    "cross_entropy",
    "evaluate",
    "from_flax",
    "from_haiku",
    "from_nnx",
    "lenet5",
    "loss",
    "max_pool_2x2",
    "mlp",
    "paper_mlp",
    "param_bytes",
    "param_count",
    "simple_cnn",
    "unbatched_orthogonal",
]

InitFn = Callable[[PRNGKeyArray], PyTree]
ApplyFn = Callable[[PyTree, Array], Array]


@dataclass(frozen=True)
class Model:
    """An ``(init, apply)`` pair with the shapes it expects.

    Attributes:
        init: ``key -> params`` (a pytree of arrays).
        apply: ``(params, x) -> logits``; ``x`` is ``(B, *input_shape)``, logits ``(B, C)``.
        num_classes: ``C``, the size of the logits' last axis.
        input_shape: shape of one example, e.g. ``(28, 28, 1)`` (NHWC without N).
        name: a label for tables and figures.
    """

    init: InitFn
    apply: ApplyFn
    num_classes: int
    input_shape: tuple[int, ...]
    name: str = "model"


class _MLP(nn.Module):
    hidden: tuple[int, ...]
    num_classes: int
    input_ndim: int

    @nn.compact
    def __call__(self, x: Array) -> Array:
        # Flatten the example axes only, so one unbatched example works as well (per-example
        # gradients under vmap call apply without a batch axis).
        x = x.reshape((*x.shape[: x.ndim - self.input_ndim], -1))
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.num_classes)(x)


class _LeNet5(nn.Module):
    num_classes: int
    padding: str

    @nn.compact
    def __call__(self, x: Array) -> Array:
        unbatched = x.ndim == 3
        if unbatched:
            x = x[None]
        x = nn.relu(nn.Conv(6, (5, 5), padding=self.padding)(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = nn.relu(nn.Conv(16, (5, 5), padding=self.padding)(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(120)(x))
        x = nn.relu(nn.Dense(84)(x))
        x = nn.Dense(self.num_classes)(x)
        return x[0] if unbatched else x


class SliceConv(nn.Module):
    """``nn.Conv`` (stride 1, same parameters and initialisers) computed as one matmul over
    the ``kh * kw`` shifted slices of the (padded) input. XLA's CPU backend runs the
    gradients of ``conv_general_dilated`` about 30x slower inside a ``while`` loop (a
    ``lax.scan`` of training steps) than outside; slices, pads and dots have no such cliff."""

    features: int
    kernel_size: tuple[int, int]
    padding: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0))

    @nn.compact
    def __call__(self, x: Array) -> Array:
        kh, kw = self.kernel_size
        cin = x.shape[-1]
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (kh, kw, cin, self.features))
        bias = self.param("bias", nn.initializers.zeros_init(), (self.features,))
        x = jnp.pad(x, ((0, 0), *self.padding, (0, 0)))
        h, w = x.shape[1] - kh + 1, x.shape[2] - kw + 1
        cols = [x[:, i : i + h, j : j + w, :] for i in range(kh) for j in range(kw)]
        return jnp.concatenate(cols, axis=-1) @ kernel.reshape(kh * kw * cin, -1) + bias


def max_pool_2x2(x: Float[Array, "b h w c"]) -> Float[Array, "b h/2 w/2 c"]:
    """2x2 max-pool, stride 2, VALID, as a reshape and a max: ``nn.max_pool``'s values; its
    gradient avoids XLA's select-and-scatter (a CNN's training step 10-20 % faster on the
    CPU, measured in docs/cross_device.md); tied maxima share the gradient equally."""
    b, h, w, c = x.shape
    x = x[:, : h // 2 * 2, : w // 2 * 2]
    return x.reshape(b, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


class _SimpleCNN(nn.Module):
    """Conv 32 3x3, conv 64 3x3, max-pool 2, dense 128, dense C (ReLU): PyTorch's MNIST example
    net, pfl's ``simple_cnn`` (1,199,882 parameters on 28x28x1, 10 classes)."""

    num_classes: int

    @nn.compact
    def __call__(self, x: Array) -> Array:
        unbatched = x.ndim == 3
        x = x[None] if unbatched else x
        x = nn.relu(SliceConv(32, (3, 3), name="Conv_0")(x))
        x = nn.relu(SliceConv(64, (3, 3), name="Conv_1")(x))
        x = max_pool_2x2(x)
        x = nn.relu(nn.Dense(128)(x.reshape((x.shape[0], -1))))
        x = nn.Dense(self.num_classes)(x)
        return x[0] if unbatched else x


@dataclass(frozen=True)
class _FlaxInit:
    """``key -> params`` of a linen module; compared by value (equal modules, equal inits)."""

    module: nn.Module
    input_shape: tuple[int, ...]

    def __call__(self, key: PRNGKeyArray) -> PyTree:
        return self.module.init(key, jnp.zeros((1, *self.input_shape), jnp.float32))


@dataclass(frozen=True)
class _FlaxApply:
    """``(params, x) -> logits`` of a linen module; compared by value."""

    module: nn.Module

    def __call__(self, params: PyTree, x: Array) -> Array:
        return self.module.apply(params, x)

    @property
    def flax_module(self) -> nn.Module:
        """The wrapped module (read by the DP-SGD fast path's layer detection)."""
        return self.module


def from_flax(
    module: nn.Module, input_shape: Sequence[int], num_classes: int, name: str = "flax"
) -> Model:
    """Wrap a Flax linen module (no mutable collections) as a :class:`Model`; two wraps of
    equal modules give equal (and equally hashed) models, so they share compilations.
    A Flax NNX module is refused (``TypeError``): wrap it with :func:`from_nnx`."""
    if any(c.__module__.startswith("flax.nnx") for c in type(module).__mro__):
        raise TypeError(
            f"from_flax wraps flax.linen modules; {type(module).__name__} is a Flax NNX module: "
            "use swarmjax.models.from_nnx(module_or_factory, input_shape, num_classes)"
        )
    shape = tuple(int(s) for s in input_shape)
    return Model(
        init=_FlaxInit(module, shape),
        apply=_FlaxApply(module),
        num_classes=check_int("num_classes", num_classes, 2),
        input_shape=shape,
        name=name,
    )


def from_haiku(
    transformed: Any, input_shape: Sequence[int], num_classes: int, name: str = "haiku"
) -> Model:
    """Wrap a Haiku ``hk.transform``/``hk.without_apply_rng`` pair as a :class:`Model`.

    The module must be deterministic (no ``hk.next_rng_key`` in apply) and stateless.
    Whether ``apply`` takes an ``rng`` argument (``hk.transform``) or not
    (``hk.without_apply_rng``) is read from its signature once, here; errors raised inside
    the model reach the caller unchanged.  Haiku itself is not a dependency of swarmjax.
    """
    shape = tuple(int(s) for s in input_shape)
    dummy = jnp.zeros((1, *shape), jnp.float32)
    try:
        takes_rng = "rng" in inspect.signature(transformed.apply).parameters
    except (AttributeError, TypeError, ValueError):
        raise ValueError(
            "transformed must be a Haiku hk.transform / hk.without_apply_rng result "
            f"(with .init and .apply); got {type(transformed).__name__}"
        ) from None

    def apply(params: PyTree, x: Array) -> Array:
        if takes_rng:
            return transformed.apply(params, None, x)
        return transformed.apply(params, x)

    return Model(
        init=lambda key: transformed.init(key, dummy),
        apply=apply,
        num_classes=check_int("num_classes", num_classes, 2),
        input_shape=shape,
        name=name,
    )


@dataclass(frozen=True, eq=False)  # identity hash: a factory or a parameter snapshot
class _NnxInit:
    """``key -> params`` of a Flax NNX model: its ``nnx.Param`` state as a nested dict.

    ``factory`` (``rngs -> module``) builds a fresh module from ``nnx.Rngs(key)`` every call;
    without one, ``params`` (a wrapped instance's parameters) are returned whatever the key.
    """

    factory: Callable[..., nnx.Module] | None
    params: PyTree
    eval_mode: bool
    trainable: Any = None  # an nnx filter; None: nnx.Param

    def __call__(self, key: PRNGKeyArray) -> PyTree:
        if self.factory is None:
            return jax.tree.map(jnp.asarray, self.params)
        from flax import nnx

        module = _nnx_build(self.factory, nnx.Rngs(key), self.eval_mode)
        trainable = nnx.Param if self.trainable is None else self.trainable
        return nnx.to_pure_dict(nnx.state(module, trainable))


@dataclass(frozen=True, eq=False)  # identity hash: it holds arrays
class _NnxApply:
    """``(params, x) -> logits`` of a Flax NNX model: ``nnx.merge`` of the graph, the
    parameters and the fixed (non-``Param``) state, then one forward pass that must leave
    every variable as it was (checked while tracing)."""

    graphdef: Any
    fixed: PyTree
    name: str
    trainable: Any = None  # the nnx filter of the trained variables; None: nnx.Param

    def __call__(self, params: PyTree, x: Array) -> Array:
        from flax import nnx

        module = nnx.merge(self.graphdef, params, self.fixed)
        logits = module(x)
        trainable = nnx.Param if self.trainable is None else self.trainable
        _, trained, fixed = nnx.split(module, trainable, ...)
        before = jax.tree_util.tree_flatten_with_path({"params": params, "fixed": self.fixed})[0]
        after = jax.tree.leaves(
            {"params": nnx.to_pure_dict(trained), "fixed": nnx.to_pure_dict(fixed)}
        )
        grown = len(before) != len(after)
        pairs = zip(before, after, strict=False) if not grown else ()
        changed = [_dotted(path[1:]) for (path, a), b in pairs if a is not b]
        if grown or changed:
            what = ", ".join(changed) or "new variables (sow or lazily created state)"
            raise ValueError(
                f"from_nnx: the forward pass of {self.name} updates {what} (dropout or "
                "BatchNorm in training mode, or other state): swarmjax's apply(params, x) is "
                "stateless and serves training and evaluation alike; pass eval_mode=True "
                "(dropout off, BatchNorm on fixed running averages) or remove the layer"
            )
        return logits


def _dotted(path: tuple[Any, ...]) -> str:
    """A pytree path as ``a.b.0.c`` (dict keys and sequence indices)."""
    return ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def _nnx_build(factory: Callable[..., nnx.Module], rngs: nnx.Rngs, eval_mode: bool) -> nnx.Module:
    """``factory(rngs=rngs)``, checked to be an ``nnx.Module``; in eval mode if asked."""
    from flax import nnx

    module = factory(rngs=rngs)
    if not isinstance(module, nnx.Module):
        raise TypeError(
            f"from_nnx: the factory must return an nnx.Module; got {type(module).__name__}"
        )
    if eval_mode:
        module.eval()
    return module


def from_nnx(
    module_or_factory: nnx.Module | Callable[..., nnx.Module],
    input_shape: Sequence[int],
    num_classes: int,
    name: str | None = None,
    *,
    eval_mode: bool = False,
    trainable: Any = None,
) -> Model:
    """Wrap a Flax NNX model as a :class:`Model` (``nnx.split`` / ``nnx.merge`` under the hood).

    Args:
        module_or_factory: an ``nnx.Module`` whose ``__call__`` maps a batch
            ``(B, *input_shape)`` to logits ``(B, num_classes)``, or a factory called as
            ``factory(rngs=nnx.Rngs(key))`` that builds one (e.g. ``lambda rngs: MLP(...,
            rngs=rngs)``). A factory gives every run its own initialisation from its key; an
            instance's parameters are copied now and every run starts from them (the key
            is ignored).
        input_shape: shape of one example, e.g. ``(28, 28, 1)``.
        num_classes: ``C``, the size of the logits' last axis.
        name: a label for tables (default: the module's class name).
        eval_mode: call ``module.eval()`` first: dropout off, BatchNorm normalising with its
            running averages.
        trainable: an nnx filter naming the variables that are trained (default ``None``:
            ``nnx.Param``, every parameter). ``nnx.LoRAParam`` makes only the LoRA adapters
            (``nnx.LoRA`` / ``nnx.LoRALinear``) the parameter pytree: the base weights become
            fixed state, one constant shared by every client and run (never vmapped, clipped,
            noised, averaged or sent); :mod:`swarmjax.lora` builds such models.

    Returns:
        A :class:`Model` whose ``params`` are the module's ``trainable`` variables (default
        its ``nnx.Param`` variables) as a nested dict of arrays (``nnx.to_pure_dict``): what
        algorithms train, clip, noise, average and send. Every other variable (the frozen
        base under ``trainable=nnx.LoRAParam``, BatchNorm's running statistics, RNG state,
        constants) is fixed state taken from the wrapped module (a factory's: built with
        ``nnx.Rngs(0)``): held inside ``apply``, never trained, averaged or sent.

    Raises:
        TypeError: ``module_or_factory`` is neither an ``nnx.Module`` nor a callable.
        ValueError: the forward pass updates a variable (dropout, or BatchNorm in training
            mode, draw or write state): ``apply(params, x)`` takes no key, returns no state
            and serves training and evaluation alike, and batch statistics would mix the
            examples that DP-SGD clips one by one. Pass ``eval_mode=True`` or remove the
            layer.
    """
    from flax import nnx

    shape = tuple(int(s) for s in input_shape)
    num_classes = check_int("num_classes", num_classes, 2)
    if isinstance(module_or_factory, nnx.Module):
        factory = None
        module = nnx.clone(module_or_factory)
        if eval_mode:
            module.eval()
    elif callable(module_or_factory):
        factory = module_or_factory
        module = _nnx_build(factory, nnx.Rngs(0), eval_mode)
    else:
        raise TypeError(
            "from_nnx takes an nnx.Module or a factory rngs -> nnx.Module; got "
            f"{type(module_or_factory).__name__}"
        )
    graphdef, trained, fixed = nnx.split(module, nnx.Param if trainable is None else trainable, ...)
    params = nnx.to_pure_dict(trained)
    if trainable is not None and not jax.tree.leaves(params):
        raise ValueError(
            f"from_nnx: trainable={trainable!r} selects no variable of "
            f"{type(module).__name__}: nothing would be trained"
        )
    label = type(module).__name__ if name is None else name
    apply = _NnxApply(graphdef, nnx.to_pure_dict(fixed), label, trainable)
    jax.eval_shape(apply, params, jax.ShapeDtypeStruct((1, *shape), jnp.float32))  # the check
    return Model(
        init=_NnxInit(factory, None if factory is not None else params, bool(eval_mode), trainable),
        apply=apply,
        num_classes=num_classes,
        input_shape=shape,
        name=label,
    )


def mlp(
    hidden: Sequence[int] = (256, 256),
    num_classes: int = 10,
    input_shape: Sequence[int] = (28, 28, 1),
    name: str | None = None,
) -> Model:
    """Flax MLP ``prod(input_shape) - hidden... - num_classes`` with ReLU (logits out).

    A plain stack of ``nn.Dense`` layers named ``Dense_0 .. Dense_{len(hidden)}``.
    """
    hidden = tuple(check_int("hidden width", h, 1) for h in hidden)
    shape = tuple(int(s) for s in input_shape)
    if name is None:
        name = "mlp_" + "-".join(str(w) for w in (math.prod(shape), *hidden, num_classes))
    module = _MLP(hidden=hidden, num_classes=num_classes, input_ndim=len(shape))
    return from_flax(module, shape, num_classes, name)


def paper_mlp(num_classes: int = 10, input_shape: Sequence[int] = (28, 28, 1)) -> Model:
    """The MNIST / Fashion-MNIST MLP of seed 000: 784-256-256-10, ReLU."""
    return mlp((256, 256), num_classes, input_shape)


def lenet5(
    num_classes: int = 9, input_shape: Sequence[int] = (28, 28, 3), padding: str = "VALID"
) -> Model:
    """The LeNet-5 variant of seed 000 (PathMNIST): 28x28x3 -> ``num_classes``.

    The paper does not state the convolution padding; ``"VALID"`` (PyTorch's default,
    28 -> 24 -> 12 -> 8 -> 4, so 16*4*4 = 256 features) is the default, ``"SAME"`` the option.
    """
    check_choice("padding", padding, ("VALID", "SAME"))
    module = _LeNet5(num_classes=num_classes, padding=padding)
    return from_flax(module, input_shape, num_classes, f"lenet5_{padding.lower()}")


@cache
def simple_cnn(
    num_classes: int = 10, input_shape: Sequence[int] = (28, 28, 1), name: str | None = None
) -> Model:
    """Conv 32 3x3 - conv 64 3x3 - max-pool 2 - dense 128 - dense ``num_classes`` (ReLU, VALID):
    PyTorch's MNIST example and pfl-research's ``simple_cnn`` (1,199,882 parameters on
    MNIST). The convolutions are :class:`SliceConv` (same parameters and results as
    ``nn.Conv``, no slow path inside loops on XLA's CPU backend)."""
    shape = tuple(int(s) for s in input_shape)
    return from_flax(_SimpleCNN(num_classes), shape, num_classes, name or "simple_cnn")


def check_model(model: Model, num_classes: int, input_shape: Sequence[int] | None = None) -> None:
    """Raise ``ValueError`` unless ``model`` maps ``input_shape`` to ``num_classes`` logits.

    Uses ``jax.eval_shape`` (abstract evaluation): nothing is compiled or run.
    """
    shape = tuple(input_shape) if input_shape is not None else model.input_shape
    if model.num_classes != num_classes:
        raise ValueError(
            f"model {model.name!r} has num_classes={model.num_classes} but the data has "
            f"{num_classes} classes"
        )
    params = jax.eval_shape(lambda: model.init(jax.random.key(0)))
    x = jax.ShapeDtypeStruct((2, *shape), jnp.float32)
    try:
        out = jax.eval_shape(model.apply, params, x)
    except Exception as exc:  # shape errors surface as many exception types
        raise ValueError(
            f"model {model.name!r} cannot take inputs of shape {shape}: {exc}"
        ) from exc
    if out.shape != (2, num_classes):
        raise ValueError(
            f"model {model.name!r} outputs shape {out.shape[1:]} per example but the data has "
            f"{num_classes} classes"
        )


def cross_entropy(logits: Float[Array, "*b C"], y: Int[Array, "*b"]) -> Float[Array, "*b"]:
    """Per-example softmax cross-entropy in nats."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, y[..., None].astype(jnp.int32), axis=-1)[..., 0]


def _masked(x: Array, mask: Bool[Array, " B"] | None) -> tuple[Array, Array]:
    if mask is None:
        return x, jnp.ones(x.shape[0], jnp.float32)
    # Zero the padded rows before apply: a NaN/inf in a padded row must not reach the
    # forward pass, where 0 * NaN in the backward pass would poison the gradient.
    m = mask.reshape(mask.shape + (1,) * (x.ndim - 1))
    return jnp.where(m, x, jnp.zeros((), x.dtype)), mask.astype(jnp.float32)


def _valid_mean(values: Array, weight: Float[Array, " B"]) -> Float[Array, ""]:
    """Mean of ``values`` over rows with ``weight > 0`` (0 if there are none)."""
    total = jnp.sum(jnp.where(weight > 0, values, jnp.zeros((), values.dtype)))
    return total / jnp.maximum(jnp.sum(weight), 1.0)


def loss(
    apply_fn: ApplyFn,
    params: PyTree,
    x: Float[Array, "B ..."],
    y: Int[Array, " B"],
    mask: Bool[Array, " B"] | None = None,
) -> Float[Array, ""]:
    """Masked mean cross-entropy (nats) over the valid rows; 0 if no row is valid."""
    x, w = _masked(x, mask)
    return _valid_mean(cross_entropy(apply_fn(params, x), y), w)


def accuracy(
    apply_fn: ApplyFn,
    params: PyTree,
    x: Float[Array, "B ..."],
    y: Int[Array, " B"],
    mask: Bool[Array, " B"] | None = None,
) -> Float[Array, ""]:
    """Masked fraction of rows whose argmax logit equals the label."""
    x, w = _masked(x, mask)
    return _valid_mean(jnp.argmax(apply_fn(params, x), axis=-1) == y, w)


def evaluate(
    apply_fn: ApplyFn,
    params: PyTree,
    x: Float[Array, "n ..."],
    y: Int[Array, " n"],
    batch_size: int | None = None,
) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """Mean cross-entropy (nats) and accuracy over a whole set, in chunks of ``batch_size``.

    ``batch_size=None`` evaluates in one forward pass; otherwise the set is padded to a
    multiple of ``batch_size`` (padded rows masked out) and mapped with ``lax.map``.
    """
    n = x.shape[0]
    if batch_size is None or batch_size >= n:
        logits = apply_fn(params, x)
        return jnp.mean(cross_entropy(logits, y)), jnp.mean(jnp.argmax(logits, -1) == y)
    chunks = -(-n // batch_size)
    pad = chunks * batch_size - n
    xs = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)).reshape(chunks, batch_size, *x.shape[1:])
    ys = jnp.pad(y, (0, pad)).reshape(chunks, batch_size)
    ms = (jnp.arange(chunks * batch_size) < n).reshape(chunks, batch_size)

    def chunk(args: tuple) -> tuple[Array, Array]:
        xb, yb, mb = args
        logits = apply_fn(params, xb)
        ce = jnp.sum(jnp.where(mb, cross_entropy(logits, yb), 0.0))
        hit = jnp.sum(jnp.where(mb, jnp.argmax(logits, -1) == yb, False))
        return ce, hit

    ce, hit = jax.lax.map(chunk, (xs, ys, ms))
    return jnp.sum(ce) / n, jnp.sum(hit) / n


def param_count(params: PyTree) -> int:
    """Number of scalars in a parameter pytree (works on arrays and ShapeDtypeStructs)."""
    return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(params))


def param_bytes(params: PyTree) -> int:
    """Bytes of a pytree (a parameter pytree to send, a federation's data, a client state):
    sum of size * itemsize over its leaves, which may be arrays, ``jax.ShapeDtypeStruct``
    shapes, typed key arrays, or Python numbers (counted as the arrays they become)."""

    def one(leaf: Any) -> int:
        leaf = leaf if hasattr(leaf, "dtype") else np.asarray(leaf)
        return int(np.prod(leaf.shape)) * leaf.dtype.itemsize

    return sum(one(leaf) for leaf in jax.tree.leaves(params))


def unbatched_orthogonal(scale: float = 1.0) -> Callable[..., Array]:
    """Flax's orthogonal initializer (a QR of a normal draw), drawn one matrix at a time
    under ``vmap``: the LSTMs' recurrent-kernel init (:func:`char_lstm`, combined learning's
    LSTM).

    Why: on XLA's CPU runtime (jaxlib 0.10.2, 2 threads) two *batched* QR factorisations in
    one program deadlock on the intra-op thread pool, so a ``vmap`` of a two-layer LSTM's
    ``init`` over runs, seeds or particles hung for ever (docs/shakespeare.md).  Under
    ``vmap`` this initializer maps over the batch (:func:`jax.lax.map`), so every QR stays
    unbatched; the values are those of the unbatched draw, bit for bit.  Outside ``vmap``
    it is ``nn.initializers.orthogonal(scale)``.
    """
    base = nn.initializers.orthogonal(scale)

    def init(key: PRNGKeyArray, shape: Sequence[int], dtype: Any = jnp.float32) -> Array:
        @jax.custom_batching.custom_vmap
        def draw(k: PRNGKeyArray) -> Array:
            return base(k, shape, dtype)

        @draw.def_vmap
        def _one_at_a_time(axis_size: int, in_batched: list[bool], k: PRNGKeyArray):
            if not in_batched[0]:  # one key for the whole batch: one draw, broadcast
                return draw(k), False
            return jax.lax.map(draw, k), True

        return draw(key)

    return init


class _PeepholeLSTMCell(nn.RNNCellBase):
    """An LSTM cell with diagonal peephole connections (Gers & Schmidhuber 2000; TensorFlow
    1.x's ``LSTMCell(use_peepholes=True)``): the input and forget gates also see the
    previous cell state ``c``, the output gate the new one, each through one weight per
    unit (``3 * features`` parameters more than ``nn.OptimizedLSTMCell``, initialised to
    zero, so the cell starts as a plain LSTM). One bias per gate; input kernel
    lecun-normal, recurrent kernel ``(features, 4 features)`` orthogonal, as Flax's cells
    (:func:`unbatched_orthogonal`).
    Carry ``(c, h)``, each ``(*batch, features)``; input ``(*batch, in)``."""

    features: int

    @nn.compact
    def __call__(self, carry: tuple[Array, Array], inputs: Array) -> tuple[tuple, Array]:
        c, h = carry
        n = self.features
        gates = nn.Dense(4 * n, name="input")(inputs) + nn.Dense(
            4 * n, use_bias=False, kernel_init=unbatched_orthogonal(), name="hidden"
        )(h)
        i, g, f, o = jnp.split(gates, 4, axis=-1)
        peep = {k: self.param(k, nn.initializers.zeros_init(), (n,)) for k in ("ci", "cf", "co")}
        i = nn.sigmoid(i + peep["ci"] * c)
        f = nn.sigmoid(f + peep["cf"] * c)
        c = f * c + i * jnp.tanh(g)
        o = nn.sigmoid(o + peep["co"] * c)
        h = o * jnp.tanh(c)
        return (c, h), h

    def initialize_carry(self, rng: PRNGKeyArray, input_shape: tuple[int, ...]) -> tuple:
        shape = (*input_shape[:-1], self.features)
        return jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.float32)

    @property
    def num_feature_axes(self) -> int:
        return 1


class _CharLSTM(nn.Module):
    """Character ids ``(B, L)`` -> embedding ``(B, L, E)`` -> stacked LSTMs -> the last
    step's state ``(B, H)`` -> dense logits over the vocabulary ``(B, V)``."""

    vocab_size: int
    embed_dim: int
    hidden: tuple[int, ...]
    peepholes: bool = False

    @nn.compact
    def __call__(self, x: Array) -> Array:
        unbatched = x.ndim == 1  # one example (per-example gradients under vmap)
        x = x[None] if unbatched else x
        ids = jnp.clip(jnp.round(x).astype(jnp.int32), 0, self.vocab_size - 1)
        h = nn.Embed(self.vocab_size, self.embed_dim)(ids)
        for width in self.hidden:
            cell = (
                _PeepholeLSTMCell(width)
                if self.peepholes
                else nn.OptimizedLSTMCell(width, recurrent_kernel_init=unbatched_orthogonal())
            )
            h = nn.RNN(cell)(h)
        logits = nn.Dense(self.vocab_size)(h[:, -1])
        return logits[0] if unbatched else logits


@cache
def char_lstm(
    vocab_size: int = 80,
    embed_dim: int = 8,
    hidden: tuple[int, ...] = (256, 256),
    sequence_length: int = 80,
    name: str | None = None,
    peepholes: bool = False,
) -> Model:
    """McMahan et al. 2017's Shakespeare model: each character embedded into ``embed_dim``
    (8) dimensions, two LSTM layers of 256 units, a softmax over the characters (logits out).

    Input: ``(B, sequence_length)`` float character ids (integers stored as float32, as
    :meth:`swarmjax.fl.data.shakespeare.ShakespeareFederation.windows` gives them; a padded
    all-zero row reads id 0); output ``(B, vocab_size)`` logits of the character after the
    window (one prediction per window, LEAF's formulation; the paper's language model reads
    a line, up to 80 unrolled characters, and predicts after each). 817,872 parameters at
    the defaults (80 characters; ``nn.OptimizedLSTMCell``: one bias per gate); the paper's
    866,578 is what peephole cells over 258 byte-level symbols give (docs/shakespeare.md).

    ``peepholes=True`` (not the default: the paper names no cell) uses LSTM cells with
    diagonal peephole connections (:class:`_PeepholeLSTMCell`, TensorFlow 1.x's
    ``use_peepholes=True``, 768 more parameters per 256-unit layer):
    ``char_lstm(258, peepholes=True)`` has the paper's 866,578 parameters exactly.
    """
    hidden = tuple(check_int("hidden width", h, 1) for h in hidden)
    vocab_size = check_int("vocab_size", vocab_size, 2)
    module = _CharLSTM(vocab_size, check_int("embed_dim", embed_dim, 1), hidden, bool(peepholes))
    shape = (check_int("sequence_length", sequence_length, 1),)
    label = name or "char_lstm_" + "-".join(str(w) for w in (embed_dim, *hidden))
    label += "_peepholes" if peepholes and name is None else ""
    return from_flax(module, shape, vocab_size, label)
