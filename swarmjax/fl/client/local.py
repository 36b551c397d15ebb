"""Local training of ONE client (E epochs of mini-batch steps); the runtime vmaps it over clients.

Pieces, each swappable:

* a **sampler** ``(key, mask, size) -> Batches`` draws one epoch of fixed-shape batches
  from the client's real rows (default :func:`shuffled_batches`: a fresh permutation each
  epoch, ``ceil(|D_i| / B)`` steps, the last batch partial). A DP variant passes a Poisson
  sampler with the same output.
* a **gradient function** ``grad_fn(params, xb, yb, mask_b, key) -> (loss, grads)``
  (default :func:`default_grad_fn`: value and gradient of the masked mean cross-entropy).
  DP-SGD / DP-Adam swap in per-example clipping and noise here.
* any **optax** optimiser.

Clients of different sizes run under one vmap: the sampler returns the same static number
of steps ``ceil(max_n / B)`` per epoch, of which the first ``ceil(|D_i| / B)`` are active;
the step loop runs over the active steps only (a ``fori_loop`` with a data-dependent trip
count). Under ``vmap`` over clients that loop runs to the largest client and the others keep
their state; with clients mapped one at a time (``lax.map``) each runs its own count.

A step reads its batch with :func:`read_batch`: from a padded ``ClientData``, or straight
from a flat :class:`~swarmjax.fl.data.store.ClientStore` (``read="step"``: ``B`` rows a
step, nothing padded to the largest client). Samplers draw positions in ``[0, max_n)``
from the ``mask``/``size`` either way, so the batches are the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree

from swarmjax._validation import check_int
from swarmjax.fl.data.clients import ClientData
from swarmjax.models import ApplyFn, loss

__all__ = [
    "Batches",
    "GradFn",
    "LocalResult",
    "Sampler",
    "default_grad_fn",
    "local_train",
    "read_batch",
    "shuffled_batches",
]


@flax.struct.dataclass
class Batches:
    """One epoch of batches for one client.

    Attributes:
        idx: ``(steps, b)`` row indices into the client's padded arrays.
        mask: ``(steps, b)`` True where the entry is a real example of this batch.
        active: ``(steps,)`` True where the step updates the parameters (a prefix).
    """

    idx: Int[Array, "steps b"]
    mask: Bool[Array, "steps b"]
    active: Bool[Array, " steps"]


@flax.struct.dataclass
class LocalResult:
    """Output of :func:`local_train` (with a leading client axis after vmap).

    Attributes:
        params: the trained parameters.
        opt_state: the optimiser state after the last step.
        loss: mean training loss (nats) over the steps taken.
        steps: number of parameter updates applied (for privacy accounting).
    """

    params: PyTree
    opt_state: PyTree
    loss: Float[Array, ""]
    steps: Int[Array, ""]


Sampler = Callable[[PRNGKeyArray, Bool[Array, " max_n"], Int[Array, ""]], Batches]
GradFn = Callable[
    [PyTree, Array, Array, Bool[Array, " b"], PRNGKeyArray], tuple[Float[Array, ""], PyTree]
]


def shuffled_batches(batch_size: int) -> Sampler:
    """Sampler: shuffle the real rows each epoch and cut them into batches of ``batch_size``.

    Steps per epoch are ``ceil(max_n / B)`` (static); a client with ``|D_i|`` rows has
    ``ceil(|D_i| / B)`` active steps, its last batch holding ``|D_i| mod B`` rows if not 0.
    """
    batch_size = check_int("batch_size", batch_size, 1)

    def sample(key: PRNGKeyArray, mask: Bool[Array, " max_n"], size: Int[Array, ""]) -> Batches:
        max_n = mask.shape[0]
        steps = math.ceil(max_n / batch_size)
        # Random sort keys in [0, 1) for real rows, 2 for padding: real rows come first.
        u = jnp.where(mask, jax.random.uniform(key, (max_n,)), 2.0)
        perm = jnp.argsort(u)
        pos = jnp.arange(steps * batch_size).reshape(steps, batch_size)
        idx = perm[jnp.minimum(pos, max_n - 1)]
        return Batches(
            idx=idx,
            mask=pos < size,
            active=jnp.arange(steps) * batch_size < size,
        )

    return sample


def default_grad_fn(apply_fn: ApplyFn) -> GradFn:
    """Non-private ``grad_fn``: value and gradient of the masked mean cross-entropy."""

    def grad_fn(
        params: PyTree, xb: Array, yb: Array, mask_b: Bool[Array, " b"], key: PRNGKeyArray
    ) -> tuple[Float[Array, ""], PyTree]:
        del key
        return jax.value_and_grad(lambda p: loss(apply_fn, p, xb, yb, mask_b))(params)

    return grad_fn


def read_batch(data: Any, idx: Int[Array, "..."]) -> tuple[Array, Array, Bool[Array, "..."]]:
    """One batch of ONE client's data at positions ``idx`` (``(b,)`` in ``[0, max_n)``):
    ``(x (b, ...), y (b,), real (b,))``. A padded :class:`ClientData` is indexed; a client
    read from a flat store (:class:`~swarmjax.fl.data.store.StoreClient`, anything with a
    ``batch`` method) gathers just these ``b`` rows from the store."""
    batch = getattr(data, "batch", None)
    if callable(batch):
        return batch(idx)
    return data.x[idx], data.y[idx], data.mask[idx]


def local_train(
    params: PyTree,
    data: ClientData,
    key: PRNGKeyArray,
    *,
    apply_fn: ApplyFn,
    optimizer: optax.GradientTransformation,
    epochs: int,
    batch_size: int,
    grad_fn: GradFn | None = None,
    sampler: Sampler | None = None,
    opt_state: PyTree | None = None,
) -> LocalResult:
    """Train ONE client's model from ``params`` for ``epochs`` epochs (pure, jit-able).

    Args:
        params: starting parameters.
        data: one client's padded data (``x: (max_n, ...)``, no client axis), or a
            :class:`~swarmjax.fl.data.store.StoreClient` whose steps read their batches
            from the flat store (same batches, same numbers, no padded buffer).
        key: this client's key (derive it with ``fold_in(round_key, client_index)``).
        apply_fn: ``(params, x) -> logits``.
        optimizer: any optax transformation; its state starts fresh unless ``opt_state``.
        epochs, batch_size: static ints; ``batch_size`` only feeds the default sampler.
        grad_fn: ``(params, xb, yb, mask_b, key) -> (loss, grads)``; default non-private.
        sampler: ``(key, mask, size) -> Batches``; default :func:`shuffled_batches`.
        opt_state: optimiser state to continue from (e.g. Adam moments across rounds).
    """
    epochs = check_int("epochs", epochs, 1)
    grad_fn = default_grad_fn(apply_fn) if grad_fn is None else grad_fn
    sampler = shuffled_batches(batch_size) if sampler is None else sampler
    opt_state = optimizer.init(params) if opt_state is None else opt_state

    def epoch(carry: tuple, e: Int[Array, ""]) -> tuple[tuple, None]:
        sample_key, step_key = jax.random.split(jax.random.fold_in(key, e))
        batches = sampler(sample_key, data.mask, data.sizes)

        def step(s: Int[Array, ""], c: tuple) -> tuple:
            p, st, total, count = c
            idx, mask_b = batches.idx[s], batches.mask[s]
            k = jax.random.fold_in(step_key, s)
            xb, yb, real = read_batch(data, idx)
            value, grads = grad_fn(p, xb, yb, mask_b & real, k)
            updates, st = optimizer.update(grads, st, p)
            return optax.apply_updates(p, updates), st, total + value, count + 1

        # Active steps are a prefix: loop over exactly those. With the client axis under
        # vmap the trip count is batched and the loop runs to the largest client (finished
        # clients keep their state); mapped one client at a time it is each client's own.
        return jax.lax.fori_loop(0, jnp.sum(batches.active), step, carry), None

    zero = jnp.zeros((), jnp.float32)
    start = (params, opt_state, zero, jnp.zeros((), jnp.int32))
    (params, opt_state, total, n), _ = jax.lax.scan(epoch, start, jnp.arange(epochs))
    return LocalResult(
        params=params,
        opt_state=opt_state,
        loss=total / jnp.maximum(n, 1),
        steps=n,
    )
