"""Record-level DP for local training: a Poisson sampler, a DP ``grad_fn``, calibration.

These plug into :func:`swarmjax.fl.client.local.local_train` (and so into FedAvg and Fed-DP-PSO):

* :func:`poisson_sampler` — one "epoch" of ``ceil(max_n / B)`` static steps; client ``i``
  samples every real row independently with ``q_i = B / |D_i|`` and has
  ``ceil(|D_i| / B)`` active steps (the accountant counts exactly those).
* :func:`dp_grad_fn` — per-example clipping to ``C``, Gaussian noise ``sigma C``, divided by
  the expected batch size ``q_i |D_i| = B`` (:func:`swarmjax.privacy.dpsgd.dp_grad`).
* :func:`calibrate_sigmas` — per-client noise multiplier that hits the target epsilon after
  the whole run (the Poisson buffer's overflow included). The epsilon actually spent is the
  simulator's privacy record (:mod:`swarmjax.fl.runtime.result`).
"""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray, PyTree

from swarmjax._validation import check_int, check_positive, check_range
from swarmjax.fl.client.local import Batches, GradFn, Sampler
from swarmjax.models import ApplyFn, cross_entropy, loss
from swarmjax.privacy.accounting import epsilon, sigma_for_epsilon
from swarmjax.privacy.dpsgd import dp_grad
from swarmjax.privacy.sampling import poisson_capacity, poisson_sample

__all__ = [
    "DELTA",
    "calibrate_sigmas",
    "dp_grad_fn",
    "poisson_sampler",
    "sampler_capacity",
    "steps_per_round",
]

DELTA = 1e-5


def steps_per_round(sizes: ArrayLike, batch_size: int, epochs: int = 1) -> np.ndarray:
    """Active DP steps per round per client: ``E * ceil(|D_i| / B)`` (int64, ``(clients,)``)."""
    sizes = np.asarray(sizes, np.int64).reshape(-1)
    return epochs * -(-sizes // check_int("batch_size", batch_size, 1))


def sampler_capacity(sizes: ArrayLike, batch_size: int, overflow_prob: float = 1e-9) -> int:
    """Buffer size so that no client's Poisson batch overflows with prob. >= ``overflow_prob``."""
    sizes = np.asarray(sizes, np.int64).reshape(-1)
    return max(
        poisson_capacity(int(n), min(1.0, batch_size / int(n)), overflow_prob) for n in sizes
    )


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
) -> GradFn:
    """DP ``grad_fn(params, xb, yb, mask_b, key) -> (loss, grads)`` for ``local_train``.

    ``grads`` = (sum of per-example gradients clipped to ``clip_norm`` + Gaussian noise of
    std ``noise_multiplier * clip_norm``) / ``expected_batch_size``. ``loss`` is the masked
    mean cross-entropy of the batch (a diagnostic: it is not released). Arguments may be
    traced (per-client values under vmap).
    """

    def grad_fn(
        params: PyTree, xb: Array, yb: Array, mask_b: Bool[Array, " b"], key: PRNGKeyArray
    ) -> tuple[Float[Array, ""], PyTree]:
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
        )
        return loss(apply_fn, params, xb, yb, mask_b), grads

    return grad_fn


def calibrate_sigmas(
    target_epsilon: float,
    sizes: ArrayLike,
    batch_size: int,
    *,
    rounds: int,
    epochs: int = 1,
    delta: float = DELTA,
    overflow_prob: ArrayLike | None = None,
) -> np.ndarray:
    """Per-client noise multipliers for record-level DP-SGD / DP-Adam.

    Args:
        target_epsilon: the epsilon each client may spend (``inf``: zeros, no noise).
        sizes: ``(clients,)`` rows per client ``|D_i|``.
        batch_size: ``B``, the expected Poisson batch (``q_i = B / |D_i|``).
        rounds, epochs: the run's rounds and local epochs ``E`` per round.
        delta: the delta of the target.
        overflow_prob: ``(clients,)`` per-step overflow chance of each client's Poisson
            buffer (:meth:`~swarmjax.fl.client.training.LocalTraining.sampler_overflow`),
            charged to delta.

    Returns:
        ``(clients,)`` float64 ``sigma_i``: client ``i`` spends ``<= target_epsilon`` after
        ``rounds * E * ceil(|D_i| / B)`` steps (equal clients share one bisection).
    """
    check_positive("target_epsilon", target_epsilon)
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    rounds = check_int("rounds", rounds, 1)
    sizes = np.asarray(sizes, np.int64).reshape(-1)
    steps = steps_per_round(sizes, batch_size, epochs) * rounds
    over = np.zeros(len(sizes)) if overflow_prob is None else np.asarray(overflow_prob, float)
    rows = [(int(n), int(t), float(p)) for n, t, p in zip(sizes, steps, over, strict=True)]
    cache: dict[tuple[int, int, float], float] = {}  # equal clients share one bisection
    for n, t, p in rows:
        if (n, t, p) not in cache:
            q = min(1.0, batch_size / n)
            cache[n, t, p] = sigma_for_epsilon(target_epsilon, q, t, delta, overflow_prob=p)
            reached = epsilon(q, cache[n, t, p], t, delta, overflow_prob=p)
            if p > 0 and reached < 0.9 * target_epsilon:
                warnings.warn(
                    f"target_epsilon={target_epsilon} is out of reach for a client of {n} rows: "
                    f"the Poisson buffer's overflow ({p:.1e} per step, charged with its "
                    f"e^epsilon factor) caps epsilon near {reached:.2f}, so the noise is "
                    "larger than needed; size the buffer for the run with "
                    "RecordDP.for_sizes(sizes, B, steps=..., delta=..., epsilon=...)",
                    stacklevel=2,
                )
    return np.array([cache[r] for r in rows])
