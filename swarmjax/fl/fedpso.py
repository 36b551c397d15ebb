"""FedPSO (Park et al. 2021) as a configuration of Fed-DP-PSO: no new training loop.

One particle per client (``S = 1``); each round the particle moves toward its own best and
the server's best model (PSO velocity), trains ``E`` epochs of plain local SGD, and reports
its loss; the server takes the model of the client with the lowest loss (``top_k = 1``).
No clipping, no noise (epsilon = inf).
"""

from __future__ import annotations

from collections.abc import Sequence

from jaxtyping import ArrayLike

from swarmjax import swarm
from swarmjax.fl.clients import ClientData
from swarmjax.fl.fed_dp_pso import FedDPPSOConfig, FedDPPSOResult, run_fed_dp_pso
from swarmjax.models import Model

__all__ = ["fedpso_config", "run_fedpso"]


def fedpso_config(
    model: Model, *, local_epochs: int = 1, batch_size: int = 32, eval_batch_size: int | None = None
) -> FedDPPSOConfig:
    """FedPSO's static settings: ``S = 1``, SGD, best-loss server, no DP."""
    return FedDPPSOConfig(
        model=model,
        particles=1,
        local_epochs=local_epochs,
        batch_size=batch_size,
        dp=False,
        optimizer="sgd",
        weight_decay=0.0,
        top_k=1,
        eval_batch_size=eval_batch_size,
    )


def run_fedpso(
    model: Model,
    clients: ClientData,
    test: tuple[ArrayLike, ArrayLike],
    *,
    rounds: int,
    learning_rate: float = 0.05,
    local_epochs: int = 1,
    batch_size: int = 32,
    pso: swarm.PSOHyperParams | None = None,
    seeds: int | Sequence[int] = 0,
    progress: bool = False,
) -> FedDPPSOResult:
    """Run FedPSO for every seed at once (see :func:`~swarmjax.fl.fed_dp_pso.run_fed_dp_pso`)."""
    config = fedpso_config(model, local_epochs=local_epochs, batch_size=batch_size)
    return run_fed_dp_pso(
        config,
        clients,
        test,
        rounds=rounds,
        learning_rate=learning_rate,
        pso=pso,
        seeds=seeds,
        progress=progress,
    )
