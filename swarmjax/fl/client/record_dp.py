"""Record-level DP for local training: a Poisson sampler, a DP ``grad_fn``, calibration.

These plug into :func:`swarmjax.fl.client.local.local_train` (and so into FedAvg and Fed-DP-PSO):

* :func:`poisson_sampler` — one "epoch" of ``ceil(max_n / B)`` static steps; client ``i``
  samples every real row independently with ``q_i = B / |D_i|`` and has
  ``ceil(|D_i| / B)`` active steps (the accountant counts exactly those).
* :func:`dp_grad_fn` — per-example clipping to ``C``, Gaussian noise ``sigma C``, divided by
  the expected batch size ``q_i |D_i| = B`` (:func:`swarmjax.privacy.dpsgd.dp_grad`).
* :func:`canary_observer` — with a :class:`~swarmjax.privacy.canaries.ClientCanaries`
  (``dp_grad_fn(..., canaries=...)`` draws them into every step), the optax transform that
  adds each released noised gradient to the canaries' scores (an empirical audit inside
  the client, docs/audits.md).
* :func:`record_plan` — one client's :class:`~swarmjax.privacy.plan.PrivacyPlan` (its
  Poisson rate, steps over the run, buffer and overflow charge); calibration and accounting
  go through it. The epsilon actually spent is the simulator's privacy record
  (:mod:`swarmjax.fl.runtime.result`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray, PyTree

from swarmjax._validation import check_int
from swarmjax.fl.client.local import Batches, GradFn, Sampler
from swarmjax.models import ApplyFn, cross_entropy, loss
from swarmjax.privacy.accounting import DEFAULT_ACCOUNTANT
from swarmjax.privacy.canaries import ClientCanaries
from swarmjax.privacy.dpsgd import dp_grad
from swarmjax.privacy.plan import PrivacyPlan, draw_floor
from swarmjax.privacy.sampling import poisson_sample

__all__ = [
    "canary_observer",
    "dp_grad_fn",
    "poisson_sampler",
    "record_plan",
    "sampler_capacity",
    "steps_per_round",
]


def steps_per_round(sizes: ArrayLike, batch_size: int, epochs: int = 1) -> np.ndarray:
    """Active DP steps per round per client: ``E * ceil(|D_i| / B)`` (int64, ``(clients,)``)."""
    sizes = np.asarray(sizes, np.int64).reshape(-1)
    return epochs * -(-sizes // check_int("batch_size", batch_size, 1))


def record_plan(
    size: int,
    batch_size: int,
    *,
    rounds: int,
    epochs: int = 1,
    delta: float,
    accountant: str = DEFAULT_ACCOUNTANT,
    capacity: int | None = None,
) -> PrivacyPlan:
    """The record-level :class:`~swarmjax.privacy.plan.PrivacyPlan` of a client of ``size``
    rows: Poisson rate ``q = min(1, B / size)``, ``rounds * E * ceil(size / B)`` steps, its
    batch buffer of ``capacity`` rows (``None``: the whole client, which never overflows)."""
    size = check_int("size", size, 1)
    steps = int(steps_per_round([size], batch_size, epochs)[0]) * check_int("rounds", rounds, 0)
    return PrivacyPlan(
        unit="record",
        population=size,
        rate=min(1.0, batch_size / size),
        steps=steps,
        delta=delta,
        accountant=accountant,
        capacity=capacity,
    )


def sampler_capacity(sizes: ArrayLike, batch_size: int) -> int:
    """The smallest buffer whose per-step overflow is below the plan's floor (1e-9) for every
    client of ``sizes`` (:func:`~swarmjax.privacy.plan.draw_floor`, the record-level plan's
    :meth:`~swarmjax.privacy.plan.PrivacyPlan.floor_capacity`)."""
    sizes = np.asarray(sizes, np.int64).reshape(-1)
    return max(draw_floor("record", n, min(1.0, batch_size / n)) for n in {int(n) for n in sizes})


def poisson_sampler(batch_size: int, capacity: int) -> Sampler:
    """Sampler for :func:`~swarmjax.fl.client.local.local_train`: Poisson batches, ``q = B / size``.

    Returns ``Batches`` with ``idx, mask: (steps, capacity)``, ``steps = ceil(max_n / B)``,
    step ``s`` active iff ``s < ceil(size / B)``. Row coins use ``fold_in(key, step)``.
    """
    batch_size = check_int("batch_size", batch_size, 1)
    capacity = check_int("capacity", capacity, 1)

    def sample(key: PRNGKeyArray, mask: Bool[Array, " max_n"], size: Int[Array, ""]) -> Batches:
        steps = math.ceil(mask.shape[0] / batch_size)
        q = jnp.minimum(batch_size / jnp.maximum(size, 1), 1.0)

        def one(s: Int[Array, ""]) -> tuple[Array, Array]:
            idx, m, _ = poisson_sample(jax.random.fold_in(key, s), q, mask, capacity)
            return idx, m

        idx, m = jax.vmap(one)(jnp.arange(steps))
        active = jnp.arange(steps) < -(-size // batch_size)
        return Batches(idx=idx, mask=m & active[:, None], active=active)

    return sample


def dp_grad_fn(
    apply_fn: ApplyFn,
    *,
    clip_norm: ArrayLike,
    noise_multiplier: ArrayLike,
    expected_batch_size: ArrayLike,
    canaries: ClientCanaries | None = None,
    canary_rate: ArrayLike | None = None,
) -> GradFn:
    """DP ``grad_fn(params, xb, yb, mask_b, key) -> (loss, grads)`` for ``local_train``.

    ``grads`` = (sum of per-example gradients clipped to ``clip_norm`` + Gaussian noise of
    std ``noise_multiplier * clip_norm``) / ``expected_batch_size``. ``loss`` is the masked
    mean cross-entropy of the batch (a diagnostic: it is not released). Arguments may be
    traced (per-client values under vmap).

    ``canaries``: the client's record-level canaries; each step draws the in ones at
    ``canary_rate`` (the client's Poisson rate ``q_i``) from the step's key and adds their
    gradients (``C e_j`` each) to the clipped sum before the noise, as records of the batch
    (:meth:`~swarmjax.privacy.canaries.ClientCanaries.gradient_sum`).
    """
    if canaries is not None and canary_rate is None:
        raise ValueError("dp_grad_fn: canaries need canary_rate (the client's Poisson rate)")

    def grad_fn(
        params: PyTree, xb: Array, yb: Array, mask_b: Bool[Array, " b"], key: PRNGKeyArray
    ) -> tuple[Float[Array, ""], PyTree]:
        extra = None
        if canaries is not None:
            extra, _ = canaries.gradient_sum(key, canary_rate, clip_norm, params)
        grads = dp_grad(
            key,
            params,
            xb,
            yb,
            mask_b,
            apply_fn=apply_fn,
            loss_fn=cross_entropy,
            clip_norm=clip_norm,
            noise_multiplier=noise_multiplier,
            expected_batch_size=expected_batch_size,
            canary_sum=extra,
        )
        return loss(apply_fn, params, xb, yb, mask_b), grads

    return grad_fn


def canary_observer(canaries: ClientCanaries) -> optax.GradientTransformation:
    """An optax transform whose state is ``canaries`` (starting from the given scores) and
    which adds every gradient it sees to their scores, passing the gradient on unchanged.
    Chained FIRST (before any gradient transform or optimiser), it sees exactly the
    released noised gradients: post-processing, no privacy cost."""

    def init(params: PyTree) -> ClientCanaries:
        del params
        return canaries

    def update(
        updates: PyTree, state: ClientCanaries, params: PyTree | None = None
    ) -> tuple[PyTree, ClientCanaries]:
        del params
        return updates, state.observe(updates)

    return optax.GradientTransformation(init, update)
