"""Prototype of a cross-device FedAvg round from the library's pieces (until the simulator
takes a :class:`~swarmjax.fl.data.store.ClientStore`): draw a cohort, gather it, train each
client with :func:`swarmjax.fl.client.local.local_train`, average the deltas.

The cohort's local training is run in ``chunk``-sized blocks: ``lax.scan`` over blocks of
``chunk`` clients, ``vmap`` inside a block, the deltas summed into one carry (so a cohort
of 200 never holds 200 models). ``chunk = cohort`` is a plain ``vmap`` over the cohort,
``chunk = 1`` a sequential ``lax.map``; blocks with no client (a Poisson buffer's unused
tail) are skipped with ``lax.cond``. Used by ``python -m benchmarks.vs_pfl``.

The model is pfl-research's ``simple_cnn`` (conv 32 3x3, conv 64 3x3, max-pool 2, dense
128, dense 10: 1,199,882 parameters) with PyTorch's default initialisation, its
convolutions either XLA's (``conv="xla"``) or written as patches @ kernel matmuls
(``conv="matmul"``; the same function of the same parameters).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, PRNGKeyArray, PyTree

from swarmjax.fl.client.local import local_train
from swarmjax.fl.client.training import clip_update
from swarmjax.fl.data.cohort import fixed_cohort, poisson_cohort
from swarmjax.fl.data.store import ClientStore, gather
from swarmjax.models import Model, from_flax

__all__ = ["RoundConfig", "make_round", "simple_cnn"]


def _torch_uniform(fan_in: int):
    bound = 1.0 / math.sqrt(fan_in)  # PyTorch's default for Conv2d and Linear (and biases)
    return lambda key, shape, dtype=jnp.float32: jax.random.uniform(
        key, shape, dtype, -bound, bound
    )


def _conv_matmul(x: Array, kernel: Array) -> Array:
    """3x3 VALID convolution as one matmul: ``(B, H-2, W-2, 9 C) @ (9 C, O)``."""
    h, w = x.shape[1] - 2, x.shape[2] - 2
    patches = jnp.concatenate(
        [x[:, i : i + h, j : j + w, :] for i in range(3) for j in range(3)], axis=-1
    )
    return patches @ kernel.reshape(-1, kernel.shape[-1])


class _SimpleCNN(nn.Module):
    conv: str = "xla"

    def _conv(self, x: Array, features: int, name: str) -> Array:
        fan_in = 9 * x.shape[-1]
        kernel = self.param(f"{name}_kernel", _torch_uniform(fan_in), (3, 3, x.shape[-1], features))
        bias = self.param(f"{name}_bias", _torch_uniform(fan_in), (features,))
        if self.conv == "matmul":
            return _conv_matmul(x, kernel) + bias
        dims = ("NHWC", "HWIO", "NHWC")
        return (
            jax.lax.conv_general_dilated(x, kernel, (1, 1), "VALID", dimension_numbers=dims) + bias
        )

    def _dense(self, x: Array, features: int, name: str) -> Array:
        init = _torch_uniform(x.shape[-1])
        kernel = self.param(f"{name}_kernel", init, (x.shape[-1], features))
        return x @ kernel + self.param(f"{name}_bias", init, (features,))

    @nn.compact
    def __call__(self, x: Array) -> Array:
        x = nn.relu(self._conv(x, 32, "conv1"))
        x = nn.relu(self._conv(x, 64, "conv2"))
        b, h, w, c = x.shape
        x = x.reshape(b, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))
        x = nn.relu(self._dense(x.reshape(b, -1), 128, "dense1"))
        return self._dense(x, 10, "dense2")


def simple_cnn(conv: str = "xla") -> Model:
    """pfl-research's ``simple_cnn`` for 28x28x1 MNIST (1,199,882 parameters)."""
    return from_flax(_SimpleCNN(conv=conv), (28, 28, 1), 10, f"simple_cnn_{conv}")


@dataclass(frozen=True)
class RoundConfig:
    """One FedAvg round's static settings (hashable: a jit static argument).

    ``rate``/``capacity``/``noise``/``clip`` set: user-level DP (Poisson cohort of rate
    ``rate`` in ``capacity`` slots, deltas clipped to ``clip``, Gaussian noise ``noise *
    clip`` on the sum, divided by the expected cohort ``rate * num_clients``).
    """

    num_clients: int
    cohort: int = 50
    max_rows: int = 50
    chunk: int = 50
    local_lr: float = 0.1
    server_lr: float = 1.0
    batch_size: int = 10
    epochs: int = 1
    rate: float | None = None
    capacity: int | None = None
    noise: float = 0.0
    clip: float = 0.0

    @property
    def slots(self) -> int:
        return self.capacity if self.rate is not None else self.cohort


def _sum_deltas(model: Model, cfg: RoundConfig, params, data, key, valid) -> PyTree:
    opt = optax.sgd(cfg.local_lr)

    def delta(d, k) -> PyTree:
        new = local_train(
            params,
            d,
            k,
            apply_fn=model.apply,
            optimizer=opt,
            epochs=cfg.epochs,
            batch_size=cfg.batch_size,
        ).params
        out = jax.tree.map(jnp.subtract, new, params)
        return clip_update(out, cfg.clip)[0] if cfg.rate is not None else out

    zero = jax.tree.map(jnp.zeros_like, params)
    blocks = -(-cfg.slots // cfg.chunk)
    pad = blocks * cfg.chunk - cfg.slots

    def block(total, args):
        d, k, v = args

        def run(_):
            ds = jax.vmap(delta)(d, k)
            return jax.tree.map(lambda t, s: t + jnp.tensordot(v.astype(s.dtype), s, 1), total, ds)

        return jax.lax.cond(jnp.any(v), run, lambda _: total, None), None

    def split(a):
        a = jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1))
        return a.reshape(blocks, cfg.chunk, *a.shape[1:])

    slots = jnp.arange(blocks * cfg.chunk, dtype=jnp.uint32)  # slot i trains with fold_in(key, i)
    keys = jax.vmap(partial(jax.random.fold_in, key))(slots).reshape(blocks, cfg.chunk)
    xs = (jax.tree.map(split, data), keys, split(valid))
    total, _ = jax.lax.scan(block, zero, xs)
    return total


def make_round(model: Model, cfg: RoundConfig):
    """``round(params, store, key) -> params``, jitted (the store is an argument)."""

    @partial(jax.jit, donate_argnums=0)
    def round_fn(params: PyTree, store: ClientStore, key: PRNGKeyArray) -> PyTree:
        k_cohort, k_train, k_noise = jax.random.split(key, 3)
        if cfg.rate is None:
            ids = fixed_cohort(k_cohort, cfg.num_clients, cfg.cohort)
            valid = jnp.ones(cfg.cohort, bool)
            denominator = float(cfg.cohort)
        else:
            ids, valid = poisson_cohort(k_cohort, cfg.num_clients, cfg.rate, cfg.capacity)
            denominator = cfg.rate * cfg.num_clients
        data = gather(store, ids, cfg.max_rows, valid)
        total = _sum_deltas(model, cfg, params, data, k_train, valid)
        if cfg.rate is not None:
            leaves, tree = jax.tree.flatten(total)
            noise_keys = jax.random.split(k_noise, len(leaves))
            leaves = [
                t + cfg.noise * cfg.clip * jax.random.normal(k, t.shape, t.dtype)
                for t, k in zip(leaves, noise_keys, strict=True)
            ]
            total = jax.tree.unflatten(tree, leaves)
        return jax.tree.map(lambda p, t: p + cfg.server_lr * t / denominator, params, total)

    return round_fn
