"""A small causal transformer in Flax NNX, LoRA adapters on chosen layers, and central
pretraining on public text: the pieces of private federated fine-tuning with adapters.

* :class:`TransformerConfig` and :class:`CausalTransformer`: a decoder-only character model
  (token and learned position embeddings, ``layers`` pre-norm blocks of causal multi-head
  self-attention and a ReLU MLP, a final LayerNorm and a linear head over the vocabulary).
  Its input is a batch of windows ``(B, L)`` of float character ids (what
  :meth:`swarmjax.fl.data.shakespeare.ShakespeareFederation.windows` gives); ``__call__``
  returns the logits of the character after each window ``(B, V)`` (one prediction per
  window, the contract of every :class:`~swarmjax.models.Model`), :meth:`CausalTransformer.
  all_logits` the logits after every position ``(B, L, V)`` (central pretraining uses them).
* LoRA (Hu et al. 2021): the layers named in ``lora_layers`` (:data:`ADAPTABLE`: ``q``, ``k``,
  ``v``, ``o`` of every block's attention, ``up`` and ``down`` of its MLP, the ``head``) are
  flax's ``nnx.LoRALinear``: the layer's ``kernel`` and ``bias`` (an ``nnx.Param``, exactly
  ``nnx.Linear``'s, so a checkpoint of the plain model loads by name) plus ``lora.lora_a``
  ``(in, r)`` (he-uniform) and ``lora.lora_b`` ``(r, out)`` (zeros: the adapted model starts
  as the base), both ``nnx.LoRAParam``. Output ``x W + b + x A B``.
* :func:`lora_transformer` wraps it with :func:`swarmjax.models.from_nnx` and
  ``trainable=nnx.LoRAParam``: the model's parameter pytree is the adapters alone (what the
  engine vmaps, trains, clips, noises, averages and sends); the pretrained base is fixed
  state inside ``apply``, one constant shared by every client and run.
  :func:`full_transformer` is the same network with every parameter trained (full
  fine-tuning from the same base).
* :func:`pretrain`: centralised, non-private training of the plain model on public windows
  (Adam, next-character loss at every position); :func:`save_params` / :func:`load_params`
  keep a checkpoint as ``.npz``; :func:`check_base_params` refuses one whose names or
  shapes do not fit the configuration.

Bad settings raise one-line ``ValueError`` s naming the setting: a rank larger than an
adapted layer (``rank <= min(in, out)``), an adapted layer name that does not exist, a
checkpoint whose shapes do not match.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jaxtyping import Array, Float, Int, PyTree

from swarmjax._validation import check_int
from swarmjax.models import Model, cross_entropy, from_nnx, param_bytes, param_count

__all__ = [
    "ADAPTABLE",
    "CausalTransformer",
    "TransformerConfig",
    "adapter_layers",
    "base_like",
    "check_base_params",
    "check_lora",
    "describe",
    "full_transformer",
    "load_params",
    "lora_transformer",
    "next_token_metrics",
    "pretrain",
    "save_params",
]

ADAPTABLE: tuple[str, ...] = ("q", "k", "v", "o", "up", "down", "head")
"""Layer names LoRA can adapt: ``q k v o`` (attention projections, every block), ``up``
``down`` (the MLP, every block), ``head`` (the output layer). ``"blocks.<i>.<name>"`` adapts
one block's layer only."""


@dataclass(frozen=True)
class TransformerConfig:
    """Sizes of :class:`CausalTransformer` (the defaults fit a 2-core CPU).

    Attributes:
        vocab_size: ``V``, characters (80: LEAF's vocabulary).
        sequence_length: ``L``, characters per input window.
        d_model: width of the residual stream.
        heads: attention heads (``d_model`` must be a multiple).
        layers: transformer blocks.
        mlp: hidden width of each block's MLP.
    """

    vocab_size: int = 80
    sequence_length: int = 64
    d_model: int = 64
    heads: int = 4
    layers: int = 2
    mlp: int = 256

    def __post_init__(self) -> None:
        for name in ("vocab_size", "sequence_length", "d_model", "heads", "layers", "mlp"):
            check_int(name, getattr(self, name), 2 if name == "vocab_size" else 1)
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} must be a multiple of heads {self.heads}")

    def layer_shapes(self) -> dict[str, tuple[int, int]]:
        """``{"blocks.<i>.<name>" or "head": (in, out)}`` of every adaptable layer."""
        d, m = self.d_model, self.mlp
        per = {"q": (d, d), "k": (d, d), "v": (d, d), "o": (d, d), "up": (d, m), "down": (m, d)}
        shapes = {f"blocks.{i}.{n}": s for i in range(self.layers) for n, s in per.items()}
        return {**shapes, "head": (d, self.vocab_size)}


def adapter_layers(config: TransformerConfig, names: Sequence[str]) -> tuple[str, ...]:
    """The full names (``blocks.<i>.<name>``, ``head``) of the layers ``names`` selects: a
    name of :data:`ADAPTABLE` selects it in every block, ``blocks.<i>.<name>`` one block's.

    Raises:
        ValueError: a name that is no layer of the model (one line listing the names).
    """
    shapes = config.layer_shapes()
    chosen: list[str] = []
    for name in names:
        hits = [k for k in shapes if k == name or k.rsplit(".", 1)[-1] == name]
        if not hits or (name not in ADAPTABLE and name not in shapes):
            raise ValueError(
                f"lora layers: no layer named {name!r}; the layers are "
                f"{', '.join(ADAPTABLE)} (every block) or blocks.<0..{config.layers - 1}>.<name>"
            )
        chosen.extend(h for h in hits if h not in chosen)
    if not chosen:
        raise ValueError("lora layers: name at least one layer to adapt")
    return tuple(chosen)


def check_lora(config: TransformerConfig, rank: int, names: Sequence[str]) -> tuple[str, ...]:
    """Check a LoRA setting before any work: ``rank >= 1`` and at most ``min(in, out)`` of
    every adapted layer (a larger rank adds parameters and no expressiveness), and every
    name a layer of the model. Returns the full layer names (:func:`adapter_layers`)."""
    rank = check_int("lora rank", rank, 1)
    layers = adapter_layers(config, names)
    shapes = config.layer_shapes()
    for name in layers:
        fan_in, fan_out = shapes[name]
        if rank > min(fan_in, fan_out):
            raise ValueError(
                f"lora rank {rank} exceeds the layer {name} ({fan_in} x {fan_out}): the rank "
                f"must be <= min(in, out) = {min(fan_in, fan_out)}"
            )
    return layers


def _linear(
    name: str, fan_in: int, fan_out: int, lora: dict[str, int], rngs: nnx.Rngs
) -> nnx.Linear:
    """``nnx.LoRALinear`` of rank ``lora[name]`` when the layer is adapted, else
    ``nnx.Linear`` (the same ``kernel`` and ``bias`` either way)."""
    if name in lora:
        return nnx.LoRALinear(fan_in, fan_out, lora_rank=lora[name], rngs=rngs)
    return nnx.Linear(fan_in, fan_out, rngs=rngs)


class _Block(nnx.Module):
    """Pre-norm block: ``h + attn(norm1(h))``, then ``h + down(relu(up(norm2(h))))``."""

    def __init__(self, config: TransformerConfig, index: int, lora: dict[str, int], rngs: nnx.Rngs):
        d, m = config.d_model, config.mlp
        name = f"blocks.{index}."
        self.heads = config.heads
        self.norm1 = nnx.LayerNorm(d, rngs=rngs)
        self.q = _linear(name + "q", d, d, lora, rngs)
        self.k = _linear(name + "k", d, d, lora, rngs)
        self.v = _linear(name + "v", d, d, lora, rngs)
        self.o = _linear(name + "o", d, d, lora, rngs)
        self.norm2 = nnx.LayerNorm(d, rngs=rngs)
        self.up = _linear(name + "up", d, m, lora, rngs)
        self.down = _linear(name + "down", m, d, lora, rngs)

    def __call__(self, h: Float[Array, "B L d"]) -> Float[Array, "B L d"]:
        b, length, d = h.shape
        x = self.norm1(h)

        def split(t: Array) -> Array:  # (B, L, d) -> (B, H, L, d / H)
            return t.reshape(b, length, self.heads, d // self.heads).transpose(0, 2, 1, 3)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = jnp.einsum("bhqc,bhkc->bhqk", q, k) / math.sqrt(d // self.heads)
        causal = jnp.tril(jnp.ones((length, length), bool))
        scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
        att = jnp.einsum("bhqk,bhkc->bhqc", jax.nn.softmax(scores, axis=-1), v)
        h = h + self.o(att.transpose(0, 2, 1, 3).reshape(b, length, d))
        return h + self.down(nnx.relu(self.up(self.norm2(h))))


class CausalTransformer(nnx.Module):
    """Decoder-only character transformer (module docs), with LoRA on ``lora_layers``.

    Args:
        config: the sizes.
        lora_rank: ``r`` of every adapter (ignored without ``lora_layers``).
        lora_layers: layers to adapt (:func:`adapter_layers` names); ``()``: the plain model.
        rngs: the initialisation's random streams.
    """

    def __init__(
        self,
        config: TransformerConfig,
        *,
        lora_rank: int = 4,
        lora_layers: Sequence[str] = (),
        rngs: nnx.Rngs,
    ):
        lora = {}
        if lora_layers:
            lora = dict.fromkeys(check_lora(config, lora_rank, lora_layers), int(lora_rank))
        d = config.d_model
        self.vocab_size = config.vocab_size
        self.embed = nnx.Embed(config.vocab_size, d, rngs=rngs)
        self.position = nnx.Param(
            nnx.initializers.normal(0.02)(rngs.params(), (config.sequence_length, d))
        )
        self.blocks = nnx.List([_Block(config, i, lora, rngs) for i in range(config.layers)])
        self.norm = nnx.LayerNorm(d, rngs=rngs)
        self.head = _linear("head", d, config.vocab_size, lora, rngs)

    def all_logits(self, x: Float[Array, "B L"]) -> Float[Array, "B L V"]:
        """Logits of the character after every position of every window."""
        ids = jnp.clip(jnp.round(x).astype(jnp.int32), 0, self.vocab_size - 1)
        h = self.embed(ids) + self.position[...][: x.shape[-1]]
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))

    def __call__(self, x: Float[Array, "*B L"]) -> Float[Array, "*B V"]:
        """Logits of the character after each window (the last position's); an unbatched
        window ``(L,)`` gives ``(V,)`` (per-example gradients under ``vmap``)."""
        if x.ndim == 1:
            return self.all_logits(x[None])[0, -1]
        return self.all_logits(x)[:, -1]


def _plain(config: TransformerConfig, seed: int = 0) -> CausalTransformer:
    return CausalTransformer(config, rngs=nnx.Rngs(seed))


def base_like(config: TransformerConfig) -> PyTree:
    """Shapes and dtypes (``jax.ShapeDtypeStruct``) of the plain model's parameters: what a
    pretrained checkpoint must hold."""
    shapes = nnx.eval_shape(lambda: _plain(config))
    return nnx.to_pure_dict(nnx.state(shapes, nnx.Param))


def _flat(tree: PyTree) -> dict[str, Any]:
    """``{"a/b/c": leaf}`` of a nested dict (list indices as their number)."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {
        "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): leaf
        for path, leaf in leaves
    }


def check_base_params(config: TransformerConfig, params: PyTree) -> None:
    """Refuse (one-line ``ValueError``) base parameters that are not the plain model's:
    a missing or extra array, or one of another shape."""
    want, got = _flat(base_like(config)), _flat(params)
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    if missing or extra:
        what = f"lacks {missing[0]}" if missing else f"has {extra[0]}, which the model has not"
        raise ValueError(
            f"pretrained params do not match the model ({len(missing)} missing, {len(extra)} "
            f"extra arrays): it {what}"
        )
    for name, like in want.items():
        shape = tuple(np.shape(got[name]))
        if shape != tuple(like.shape):
            raise ValueError(
                f"pretrained params do not match the model: {name} has shape {shape}, the "
                f"model's is {tuple(like.shape)}"
            )


def _load_base(module: CausalTransformer, base: PyTree) -> CausalTransformer:
    """``module`` with its base weights (every ``nnx.Param`` but the adapters) set to
    ``base`` (a pure dict of the plain model's parameters)."""
    state = nnx.state(module, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)))
    nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, base))
    nnx.update(module, state)
    return module


@dataclass(frozen=True, eq=False)  # identity hash: it holds the base arrays
class _LoraFactory:
    """``rngs -> CausalTransformer`` with fresh adapters from ``rngs`` on the fixed base."""

    config: TransformerConfig
    base: PyTree
    rank: int
    layers: tuple[str, ...]

    def __call__(self, *, rngs: nnx.Rngs) -> CausalTransformer:
        module = CausalTransformer(
            self.config, lora_rank=self.rank, lora_layers=self.layers, rngs=rngs
        )
        return _load_base(module, self.base)


def lora_transformer(
    config: TransformerConfig,
    base: PyTree,
    rank: int = 4,
    layers: Sequence[str] = ("q", "v"),
    name: str | None = None,
) -> Model:
    """The pretrained ``base`` with LoRA adapters of ``rank`` on ``layers``, as a
    :class:`~swarmjax.models.Model` whose parameters are the adapters alone.

    Args:
        config: the model's sizes.
        base: the plain model's parameters (a pure dict, e.g. from :func:`pretrain` or
            :func:`load_params`); checked by :func:`check_base_params`.
        rank: ``r`` of every adapter, ``1 <= r <= min(in, out)`` of each adapted layer.
        layers: the layers to adapt (:func:`adapter_layers`); default the attention's query
            and value projections of every block (Hu et al. 2021's choice).
        name: label for tables.

    Returns:
        ``init(key)`` gives fresh adapters (``lora_a`` he-uniform from the key, ``lora_b``
        zeros) as ``{"blocks": {i: {"q": {"lora": {"lora_a": (in, r), "lora_b": (r, out)}}}}}``;
        ``apply(adapters, x (B, L)) -> (B, V)`` runs the base with them. The base is fixed
        state of ``apply`` (:func:`~swarmjax.models.from_nnx` with
        ``trainable=nnx.LoRAParam``): no algorithm sees, trains, clips, noises, averages or
        sends it.
    """
    layers = check_lora(config, rank, layers)
    check_base_params(config, base)
    factory = _LoraFactory(config, jax.tree.map(np.asarray, base), int(rank), layers)
    label = name or f"lora_r{rank}_" + "-".join(sorted({n.rsplit(".", 1)[-1] for n in layers}))
    shape = (config.sequence_length,)
    return from_nnx(factory, shape, config.vocab_size, label, trainable=nnx.LoRAParam)


@dataclass(frozen=True, eq=False)
class _Plain:
    """``rngs -> CausalTransformer`` (no adapters), with ``base`` loaded when given."""

    config: TransformerConfig
    base: PyTree = None

    def __call__(self, *, rngs: nnx.Rngs) -> CausalTransformer:
        module = CausalTransformer(self.config, rngs=rngs)
        return module if self.base is None else _load_base(module, self.base)


def full_transformer(
    config: TransformerConfig, base: PyTree | None = None, name: str | None = None
) -> Model:
    """The plain model with every parameter trained: from ``base`` (every run starts from
    it: full fine-tuning) or, with ``base=None``, a fresh initialisation per run key."""
    if base is not None:
        check_base_params(config, base)
        base = jax.tree.map(np.asarray, base)
    label = name or ("full" if base is not None else "transformer")
    factory = _Plain(config, base)
    shape = (config.sequence_length,)
    if base is None:
        return from_nnx(factory, shape, config.vocab_size, label)
    # every run starts from the base whatever its key: wrap an instance holding it
    return from_nnx(factory(rngs=nnx.Rngs(0)), shape, config.vocab_size, label)


def _targets(x: Float[Array, "B L"], y: Int[Array, " B"]) -> Int[Array, "B L"]:
    """The character after every position: the window shifted by one, then ``y``."""
    return jnp.concatenate([jnp.round(x[:, 1:]).astype(jnp.int32), y[:, None]], axis=1)


def pretrain(
    config: TransformerConfig,
    x: np.ndarray,
    y: np.ndarray,
    *,
    steps: int,
    batch_size: int = 32,
    learning_rate: float = 3e-3,
    seed: int = 0,
    log: Callable[[str], None] | None = print,
    log_every: int = 250,
) -> tuple[PyTree, dict[str, float]]:
    """Central, non-private training of the plain model on (public) windows.

    Adam with a linear warm-up over the first 5 % of the steps and cosine decay to 10 %
    of ``learning_rate``, gradient norm clipped at 1; each step a uniform random batch of
    ``batch_size`` windows, the loss the mean next-character cross-entropy over every
    position of the window and its target (``L`` predictions per window).

    Args:
        config: the model's sizes; ``x`` ``(n, L)`` float ids and ``y`` ``(n,)`` int ids of
            the training windows (``L = config.sequence_length``).
        steps, batch_size, learning_rate, seed: the schedule; ``seed`` draws the
            initialisation and the batches.
        log: called with a progress line every ``log_every`` steps (``None``: silent).

    Returns:
        ``(params, info)``: the plain model's parameters (a pure dict of NumPy arrays) and
        ``{"steps", "seconds", "final_loss"}`` (the mean loss of the last ``log_every``
        steps, nats per character).
    """
    steps = check_int("pretraining steps", steps, 1)
    batch_size = check_int("pretraining batch size", batch_size, 1)
    if x.ndim != 2 or x.shape[1] != config.sequence_length or len(y) != len(x):
        raise ValueError(
            f"pretraining windows must be (n, {config.sequence_length}) with n labels; got "
            f"{x.shape} and {np.shape(y)}"
        )
    module = _plain(config, seed)
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)
    warm = max(1, steps // 20)
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, learning_rate, warm, steps, learning_rate * 0.1
    )
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(schedule))
    opt_state = opt.init(params)

    def loss_fn(p: PyTree, xb: Array, yb: Array) -> Array:
        model = nnx.merge(graphdef, p, rest)
        return jnp.mean(cross_entropy(model.all_logits(xb), _targets(xb, yb)))

    @jax.jit
    def step(p: PyTree, s: PyTree, xb: Array, yb: Array) -> tuple[PyTree, PyTree, Array]:
        loss, grads = jax.value_and_grad(loss_fn)(p, xb, yb)
        updates, s = opt.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    rng = np.random.default_rng(seed)
    xs, ys = jnp.asarray(x), jnp.asarray(y)
    t0, recent = time.perf_counter(), []
    for i in range(steps):
        idx = jnp.asarray(rng.integers(0, len(y), batch_size))
        params, opt_state, loss = step(params, opt_state, xs[idx], ys[idx])
        recent.append(loss)
        if len(recent) > log_every:
            recent.pop(0)
        if log is not None and ((i + 1) % log_every == 0 or i + 1 == steps):
            mean = float(jnp.mean(jnp.stack(recent)))
            log(f"  pretraining step {i + 1}/{steps}: loss {mean:.3f} nats/char")
    final = float(jnp.mean(jnp.stack(recent)))
    pure = jax.tree.map(np.asarray, nnx.to_pure_dict(params))
    info = {"steps": steps, "seconds": time.perf_counter() - t0, "final_loss": final}
    return pure, info


def next_token_metrics(
    model: Model, params: PyTree, x: np.ndarray, y: np.ndarray, batch_size: int = 250
) -> dict[str, float]:
    """Next-character accuracy, cross-entropy (nats) and perplexity ``exp(cross-entropy)``
    of ``model`` at ``params`` on the windows ``x (n, L)``, ``y (n,)``."""
    from swarmjax.models import evaluate

    xs, ys = jnp.asarray(x), jnp.asarray(y)
    ce, acc = jax.jit(lambda p: evaluate(model.apply, p, xs, ys, batch_size))(params)
    return {"accuracy": float(acc), "loss": float(ce), "perplexity": float(np.exp(float(ce)))}


def save_params(path: str | Path, params: PyTree, **meta: Any) -> Path:
    """Write ``params`` (a nested dict of arrays) to ``path`` (``.npz``; keys ``a/b/c``)
    with ``meta`` (JSON-able) under the key ``__meta__``; written to a temporary file and
    renamed, so a reader never sees half a checkpoint."""
    import json

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {k: np.asarray(v) for k, v in _flat(params).items()}
    arrays["__meta__"] = np.asarray(json.dumps(meta, default=str))
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)
    return path


def load_params(path: str | Path) -> tuple[PyTree, dict[str, Any]]:
    """``(params, meta)`` of a :func:`save_params` file (or any ``.npz`` whose keys are
    ``/``-joined paths of a nested dict; numeric path parts become ints, as ``nnx``'s
    pure dicts index lists). Raises ``ValueError`` (one line) if it cannot be read."""
    import json

    try:
        with np.load(Path(path), allow_pickle=False) as data:
            flat = {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError) as err:
        first = (str(err).splitlines() or [type(err).__name__])[0]
        raise ValueError(f"pretrained params {str(path)!r} cannot be read ({first})") from None
    meta = json.loads(str(flat.pop("__meta__"))) if "__meta__" in flat else {}
    tree: dict = {}
    for key, value in flat.items():
        node = tree
        parts = [int(p) if p.isdigit() else p for p in key.split("/")]
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return tree, meta


def describe(config: TransformerConfig, rank: int, layers: Sequence[str]) -> dict[str, int]:
    """Parameter counts and upload bytes (float32) of the base and of the adapters."""
    base = param_count(base_like(config))
    shapes = config.layer_shapes()
    full = check_lora(config, rank, layers)
    adapters = sum(rank * (shapes[n][0] + shapes[n][1]) for n in full)
    return {
        "base_params": base,
        "adapter_params": adapters,
        "base_bytes": param_bytes(base_like(config)),
        "adapter_bytes": 4 * adapters,
    }
