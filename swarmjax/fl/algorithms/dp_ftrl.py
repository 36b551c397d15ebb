"""User-level DP-FTRL with matrix-factorization noise (Kairouz et al. 2021; Choquette-Choo
et al. 2023; the buffered-Toeplitz mechanisms of Dvijotham et al. 2024): FedAvg plus a
user-level plan with a min-separation participation and correlated noise. The strategies,
their sensitivity and the streaming noise come from jax-privacy through
:mod:`swarmjax.privacy.ftrl`; ``docs/dp_ftrl.md`` has the algebra and the privacy argument.

One exchange per round ``t = 1..T`` (:func:`swarmjax.fl.private.private` around FedAvg's):

* ``select``: the public cohort of round ``t``, row ``t`` of the schedule fixed before
  training (:class:`~swarmjax.privacy.participation.MinSeparation`: ``m`` clients, each
  client at most ``k`` times at least ``b`` rounds apart; checked before any work).
* ``request``: the global model ``w_t`` and the clip norm ``C_t``.
* ``client``: local training from ``w_t``; the update clipped to ``C_t`` and, under adaptive
  clipping, the bit ``1[||Delta|| <= C_t]`` (the same client as DP-FedAvg).
* ``aggregate``: ``x_t`` = the sum of the cohort's clipped updates; the server releases
  ``x_t + C_t s (C^{-1} z)_t`` with ``z ~ N(0, I)`` (``s = sigma_Delta sens``, ``sens`` the
  factorization's ``(k, b)``-min-separation sensitivity), divides by the public cohort
  size ``m`` and takes a server-optimiser step; adaptive clipping adds the noised count
  ``sum (bit - 1/2) + N(0, sigma_b^2)`` each round and moves ``C_t`` as DP-FedAvg does.

Accounting: the sums are one Gaussian mechanism over the run (multiplier ``sigma_Delta``)
and the counts ``k`` participations of an independent Gaussian (sensitivity ``1/2``, std
``sigma_b``), so the run is ONE Gaussian mechanism of multiplier
``z = (sigma_Delta^-2 + k (2 sigma_b)^-2)^(-1/2)``, the accounted ``noise_multiplier``
(:meth:`~swarmjax.privacy.plan.PrivacyPlan.min_separation_cohorts`). Every client is
charged that whole-run event from the first round on (each prefix of the run is a
post-processing of the whole release).
"""

from __future__ import annotations

from typing import Literal

from swarmjax.fl.algorithms.client_level_dp_fedavg import clipping_of
from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.private import Private, private
from swarmjax.models import Model
from swarmjax.privacy.noise import CorrelatedNoise
from swarmjax.privacy.participation import MinSeparation
from swarmjax.privacy.user_level import UserLevelDP

__all__ = ["dp_ftrl"]


def dp_ftrl(
    model: Model,
    participation: MinSeparation,
    *,
    noise: CorrelatedNoise | None = None,
    training: LocalTraining | None = None,
    clipping: Literal["fixed", "adaptive"] = "adaptive",
    noise_cohort: int | None = None,
    server_optimizer: Literal["sgd", "adam", "yogi"] = "sgd",
    server_momentum: float = 0.0,
    eval_batch_size: int | None = None,
) -> Private:
    """User-level DP-FTRL: FedAvg (uniform weights, a server optimiser) under a
    :class:`~swarmjax.privacy.user_level.UserLevelDP` plan with a min-separation schedule and
    correlated noise.

    Args:
        model: the ``(init, apply)`` pair.
        participation: the public schedule
            (:class:`~swarmjax.privacy.participation.MinSeparation`: cohort ``m``, ``b``,
            ``k``, kind and seed); ``participation.for_run(N, T)`` makes ``b`` and ``k``
            explicit and checks the schedule before any work.
        noise: the factorization (:class:`~swarmjax.privacy.noise.CorrelatedNoise`:
            ``"blt"``, ``"banded"``, ``"prefix-sum"``; ``None``: ``CorrelatedNoise()``, BLT).
        training: local training (no record-level DP); default ``LocalTraining(batch_size=10)``.
        clipping: ``"adaptive"`` (default) or ``"fixed"``.
        noise_cohort: calibrate the noise for a deployment with cohorts of
            ``noise_cohort > m`` (pfl's ``noise_cohort_size``): the epsilon then holds only
            for that deployment; the privacy record says so.
        server_optimizer: ``"sgd"`` (default), ``"adam"`` or ``"yogi"`` on the noised mean.
        server_momentum: momentum of the server SGD.
        eval_batch_size: chunk size of the test evaluation.
    """
    inner = FedAvg(
        model,
        LocalTraining(batch_size=10) if training is None else training,
        eval_batch_size=eval_batch_size,
        server_optimizer=server_optimizer,
        server_momentum=server_momentum,
        weighting="uniform",
    )
    noise = CorrelatedNoise() if noise is None else noise
    plan = UserLevelDP(participation, clipping_of(clipping), noise, noise_cohort)
    return private(inner, plan)
