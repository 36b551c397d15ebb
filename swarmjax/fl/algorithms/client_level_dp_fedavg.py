"""Client-level DP-FedAvg (McMahan et al. 2018) with fixed or adaptive clipping (Andrew et
al. 2021): FedAvg plus a user-level privacy plan. Spec section 4; the noise algebra and the
privacy argument are in ``docs/dp_fedavg.md``.

One exchange per round (:func:`swarmjax.fl.private.private` around FedAvg's):

* ``select``: secret Poisson sampling of clients at rate ``q_c`` (the plan's
  :class:`~swarmjax.privacy.participation.Poisson`); at most ``capacity`` clients (an
  overflowing draw is redrawn, never truncated).
* ``request``: the global model ``w_t`` and the clip norm ``C_t``.
* ``client``: ``E`` local epochs from ``w_t``; the update ``Delta = w - w_t`` is clipped to
  ``C_t`` (a non-finite update becomes zeros); with adaptive clipping also the bit
  ``1[||Delta|| <= C_t]``.
* ``aggregate``: ``(sum of clipped updates + N(0, (sigma_Delta C_t)^2)) / (q_c N)`` applied
  by the server's SGD (with momentum); adaptive: ``b_t = (sum (bit - 1/2) + N(0,
  sigma_b^2)) / (q_c N) + 1/2`` and ``C_{t+1} = C_t exp(-clip_lr (b_t - gamma))``.

The sum and the count are one Gaussian mechanism with multiplier
``z = (sigma_Delta^-2 + (2 sigma_b)^-2)^(-1/2)`` per round (the accounted
``noise_multiplier``); fixed clipping sends no bit and ``sigma_Delta = z``. Every client's
spend is ``rounds`` steps at ``(q_c, z)``, client-level zero-out (one client's data
replaced by a null client that is still drawn and contributes zero to the sum and the
count: :data:`~swarmjax.privacy.plan.RELATIONS`; under Poisson sampling the same numbers as
add/remove of one client with all of its data). The realised number of participants is part
of the mechanism's secret sampling and is not released: released byte counts use the
expected ``q_c N`` clients.
"""

from __future__ import annotations

import math
from typing import Literal

import pandas as pd

from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.private import Private, private
from swarmjax.models import Model
from swarmjax.privacy.clipping import AdaptiveClipping, FixedClipping
from swarmjax.privacy.noise import GaussianNoise
from swarmjax.privacy.participation import FixedCohort, Poisson
from swarmjax.privacy.user_level import UserLevelDP

__all__ = ["clipping_of", "dp_fedavg", "rounds_to_target"]


def clipping_of(clipping: Literal["fixed", "adaptive"]) -> AdaptiveClipping | FixedClipping:
    """The clipping object of a name (``"fixed"`` or ``"adaptive"``)."""
    if clipping == "adaptive":
        return AdaptiveClipping()
    if clipping == "fixed":
        return FixedClipping()
    raise ValueError(f"clipping must be one of 'fixed', 'adaptive'; got {clipping!r}")


def dp_fedavg(
    model: Model,
    *,
    participation: Poisson | FixedCohort | None = None,
    training: LocalTraining | None = None,
    clipping: Literal["fixed", "adaptive"] = "adaptive",
    server_momentum: float = 0.0,
    noise_release: Literal["snapped", "float"] = "snapped",
    eval_batch_size: int | None = None,
) -> Private:
    """User-level DP-FedAvg: FedAvg (uniform weights, server SGD) under a
    :class:`~swarmjax.privacy.user_level.UserLevelDP` plan.

    Args:
        model: the ``(init, apply)`` pair.
        participation: :class:`~swarmjax.privacy.participation.Poisson` (``None``: one
            without a buffer; size it for a run with ``Poisson.for_run``) or a
            :class:`~swarmjax.privacy.participation.FixedCohort`.
        training: local training (no record-level DP: the unit is the client); default
            ``LocalTraining(batch_size=10)``.
        clipping: ``"adaptive"`` (default) or ``"fixed"``.
        server_momentum: momentum of the server SGD (0: plain step).
        noise_release: ``"snapped"`` (default) or ``"float"``
            (:class:`~swarmjax.privacy.noise.GaussianNoise`).
        eval_batch_size: chunk size of the test evaluation.

    Hyper-parameters (``Variants.grid``): FedAvg's ``learning_rate`` and ``server_lr`` and
    the plan's ``sample_rate``, ``noise_multiplier``, ``count_noise``, ``initial_clip``,
    ``target_quantile``, ``clip_lr`` (defaults: 0.1, 1.0, 0.1, 1, NaN -> ``max(qN/20, z)``,
    0.1, 0.5, 0.2).
    """
    inner = FedAvg(
        model,
        LocalTraining(batch_size=10) if training is None else training,
        eval_batch_size=eval_batch_size,
        server_optimizer="sgd",
        server_momentum=server_momentum,
        weighting="uniform",
    )
    participation = Poisson() if participation is None else participation
    plan = UserLevelDP(participation, clipping_of(clipping), GaussianNoise(noise_release))
    return private(inner, plan)


def rounds_to_target(
    history: pd.DataFrame, target: float, column: str = "test_accuracy", *, higher: bool = True
) -> pd.Series:
    """First round (per run) at which ``column`` reaches ``target`` (``>=``; ``<=`` when
    ``higher=False``); NaN for a run that never does."""

    def first(frame: pd.DataFrame) -> float:
        hit = frame[column] >= target if higher else frame[column] <= target
        r = frame.loc[hit, "round"]
        return float(r.min()) if len(r) else math.nan

    keys = [c for c in ("noise_multiplier", "seed") if c in history.columns]
    return history.groupby(keys)[["round", column]].apply(first).rename("rounds_to_target")
