"""Pieces several algorithms share: the model messages, the masked weighted average, the
trainer's client state, the public test metrics and the noise calibration per target."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, PyTree

from swarmjax._validation import check_positive
from swarmjax.fl.client.record_dp import calibrate_sigmas
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.protocol import Spend, where_selected
from swarmjax.models import Model, evaluate

__all__ = [
    "Aggregator",
    "ModelReply",
    "ModelServer",
    "Trainer",
    "calibrated_noise",
    "keep_if",
    "masked",
    "public_metrics",
    "target_list",
    "weighted_average",
]

Aggregator = Callable[[PyTree, Float[Array, " clients"]], PyTree]


@flax.struct.dataclass
class ModelServer:
    """Server state of the model-averaging algorithms: the global model."""

    params: PyTree


@flax.struct.dataclass
class ModelReply:
    """A client's model and its aggregation weight ``|D_i|`` (public, as ``q_i`` assumes)."""

    params: PyTree
    weight: Float[Array, ""]


@flax.struct.dataclass
class Trainer:
    """Client state of the model-averaging algorithms: its privacy spend and, for the
    private diagnostics only, the mean loss of its last local training (nats)."""

    spend: Spend
    loss: Float[Array, ""]


def keep_if(cond: Bool[Array, ""], new: PyTree, old: PyTree) -> PyTree:
    """``new`` where ``cond`` else ``old``, leaf by leaf (e.g. keep the model when nobody
    replied)."""
    return jax.tree.map(lambda a, b: jnp.where(cond, a, b), new, old)


def masked(tree: PyTree, mask: Bool[Array, " N"]) -> PyTree:
    """Zero every unselected slot (leading client axis) with ``jnp.where``: whatever such a
    slot holds (NaN, inf) never reaches an arithmetic operation."""

    return where_selected(mask, tree, jax.tree.map(jnp.zeros_like, tree))


def weighted_average(client_params: PyTree, weights: Float[Array, " clients"]) -> PyTree:
    """FedAvg's server rule ``sum_i w_i theta_i / sum_i w_i`` leaf by leaf (client axis 0)."""
    w = weights.astype(jnp.float32) / jnp.sum(weights)
    return jax.tree.map(
        lambda leaf: jnp.tensordot(w, leaf, axes=1).astype(leaf.dtype), client_params
    )


def public_metrics(
    model: Model, params: PyTree, test: tuple[Array, Array], eval_batch_size: int | None
) -> dict[str, Array]:
    """``test_loss`` (nats) and ``test_accuracy`` of ``params`` on the public test set."""
    loss, acc = evaluate(model.apply, params, *test, eval_batch_size)
    return {"test_loss": loss, "test_accuracy": acc}


def target_list(target_epsilon: float | Sequence[float]) -> list[float]:
    """Target epsilons as a non-empty list, each ``> 0``, all finite or all ``inf``."""
    targets = (
        [float(target_epsilon)]
        if isinstance(target_epsilon, int | float | np.number)
        else [float(e) for e in target_epsilon]
    )
    if not targets:
        raise ValueError("target_epsilon must not be empty")
    for e in targets:
        check_positive("target_epsilon", e)
    if len({math.isinf(e) for e in targets}) > 1:
        raise ValueError(
            "target_epsilon must be all finite (DP) or all inf (no DP) in one call; "
            f"got {targets}: run the inf target separately"
        )
    return targets


def calibrated_noise(
    training: LocalTraining,
    sizes: ArrayLike,
    *,
    rounds: int,
    targets: Sequence[float],
    delta: float,
) -> np.ndarray:
    """``(targets, clients)`` float32 noise multipliers: client ``i`` reaches each target at
    ``delta`` after ``rounds`` rounds of ``E ceil(|D_i| / B)`` steps at ``q_i = B / |D_i|``.
    The Poisson buffer's overflow is charged to delta as the privacy record does. Rounded UP
    to float32 (the device value never has less noise than the calibrated one); zeros
    without record-level DP."""
    sizes = np.asarray(sizes)
    if training.record_dp is None:
        return np.zeros((len(targets), len(sizes)), np.float32)
    overflow = training.sampler_overflow(sizes, int(np.max(sizes)))
    rows = []
    for e in targets:
        s = calibrate_sigmas(
            e,
            sizes,
            training.batch_size,
            rounds=rounds,
            epochs=training.epochs,
            delta=delta,
            overflow_prob=overflow,
        )
        s32 = s.astype(np.float32)
        rows.append(np.where(s32 < s, np.nextafter(s32, np.float32(np.inf)), s32))
    return np.stack(rows).astype(np.float32)
