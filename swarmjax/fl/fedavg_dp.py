"""FedAvg + DP-SGD / DP-Adam (record-level DP per client) on the existing FedAvg runner.

Plugs :func:`swarmjax.fl.dp_local.dp_grad_fn` and :func:`~swarmjax.fl.dp_local.poisson_sampler`
into :class:`swarmjax.fl.fedavg.FedAvgConfig`; the training loop is FedAvg's. Every client
uses its own ``q_i = B / |D_i|``; one noise multiplier ``sigma = max_i sigma_i`` is shared
(the runner's grad_fn is static), so every client's epsilon is ``<= target_epsilon``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import optax
import pandas as pd
from jaxtyping import ArrayLike

from swarmjax._validation import check_choice, check_int, check_positive
from swarmjax.fl.clients import ClientData, poisson_rates
from swarmjax.fl.dp_local import (
    DELTA,
    calibrate_sigmas,
    dp_grad_fn,
    epsilon_columns,
    poisson_sampler,
    privacy_record,
    sampler_capacity,
)
from swarmjax.fl.fedavg import FedAvgConfig, run_fedavg
from swarmjax.models import Model

__all__ = ["FedAvgDPResult", "run_fedavg_dp"]


@dataclass(frozen=True)
class FedAvgDPResult:
    """FedAvg's state and history (plus ``epsilon_client_<i>``, ``epsilon_max``) and the
    privacy record (``q``, ``sigma``, ``steps_per_round``, ``delta``, ``epsilon``)."""

    state: object
    history: pd.DataFrame
    seeds: list[int]
    privacy: dict


def run_fedavg_dp(
    model: Model,
    clients: ClientData,
    test: tuple[ArrayLike, ArrayLike],
    *,
    rounds: int,
    target_epsilon: float,
    learning_rate: float = 0.005,
    optimizer: str = "adam",
    local_epochs: int = 1,
    batch_size: int = 64,
    clip_norm: float = 1.0,
    delta: float = DELTA,
    seeds: int | Sequence[int] = 0,
    progress: bool = False,
) -> FedAvgDPResult:
    """FedAvg whose local steps are DP-SGD (``optimizer="sgd"``) or DP-Adam (``"adam"``).

    ``target_epsilon = inf``: plain local training on shuffled batches (no clip, no noise).
    """
    rounds = check_int("rounds", rounds, 1)
    check_positive("target_epsilon", target_epsilon)
    check_positive("clip_norm", clip_norm)
    check_choice("optimizer", optimizer, ("adam", "sgd"))
    sizes = np.asarray(clients.sizes)
    poisson_rates(sizes, batch_size)
    opt = optax.adam if optimizer == "adam" else optax.sgd
    if math.isinf(target_epsilon):
        sigmas = np.zeros(len(sizes))
        config = FedAvgConfig(
            model=model, local_epochs=local_epochs, batch_size=batch_size, optimizer=opt
        )
    else:
        sigmas = calibrate_sigmas(
            target_epsilon, sizes, batch_size, rounds=rounds, epochs=local_epochs, delta=delta
        )
        sigmas = np.full(len(sizes), sigmas.max())
        config = FedAvgConfig(
            model=model,
            local_epochs=local_epochs,
            batch_size=batch_size,
            optimizer=opt,
            grad_fn=dp_grad_fn(
                model.apply,
                clip_norm=clip_norm,
                noise_multiplier=float(sigmas[0]),
                expected_batch_size=float(batch_size),
            ),
            sampler=poisson_sampler(batch_size, sampler_capacity(sizes, batch_size)),
        )
    res = run_fedavg(
        config,
        clients,
        test,
        rounds=rounds,
        learning_rate=learning_rate,
        seeds=seeds,
        progress=progress,
    )
    privacy = privacy_record(
        sizes,
        batch_size,
        sigmas,
        rounds=rounds,
        epochs=local_epochs,
        delta=delta,
        target_epsilon=target_epsilon,
        clip_norm=clip_norm,
    )
    history = res.history.copy()
    reps = len(res.seeds)
    for name, col in epsilon_columns(privacy["epsilon"]).items():
        history[name] = np.tile(col, reps)
    return FedAvgDPResult(state=res.state, history=history, seeds=res.seeds, privacy=privacy)
