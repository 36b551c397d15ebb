"""Exact communication accounting: bytes sent up (clients -> server) and down per round.

A model costs :func:`swarmjax.models.param_bytes` bytes (sum over the parameter pytree of
size * itemsize, no framing or compression). Per round with ``N`` participating clients:

* FedAvg-style (every client uploads its model): up ``N`` models, down ``N`` models.
* PSO-style (seed 000, Fed-DP-PSO / FedPSO): up ``N`` losses (one float each) plus the one
  requested model, down ``N`` models (gbest broadcast).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from jaxtyping import PyTree

from swarmjax._validation import check_int
from swarmjax.models import param_bytes

__all__ = [
    "RoundBytes",
    "fedavg_bytes",
    "model_bytes",
    "per_round_table",
    "pso_bytes",
    "upload_saving",
]


@dataclass(frozen=True)
class RoundBytes:
    """Bytes moved in one round: ``up`` (clients to server, all clients), ``down``."""

    up: int
    down: int

    @property
    def total(self) -> int:
        return self.up + self.down

    def times(self, rounds: int) -> RoundBytes:
        """The cost of ``rounds`` identical rounds."""
        rounds = check_int("rounds", rounds, 0)
        return RoundBytes(self.up * rounds, self.down * rounds)


def model_bytes(params: PyTree) -> int:
    """Bytes of one model (its parameter pytree; arrays or ``jax.ShapeDtypeStruct``s)."""
    return param_bytes(params)


def fedavg_bytes(params: PyTree, num_clients: int) -> RoundBytes:
    """FedAvg round: ``N`` models up, ``N`` models down."""
    n = check_int("num_clients", num_clients, 1)
    m = model_bytes(params)
    return RoundBytes(up=n * m, down=n * m)


def pso_bytes(
    params: PyTree,
    num_clients: int,
    *,
    loss_dtype: np.dtype | str = "float32",
    models_up: int = 1,
) -> RoundBytes:
    """PSO-style round: ``N`` losses + ``models_up`` model(s) up, ``N`` models down."""
    n = check_int("num_clients", num_clients, 1)
    k = check_int("models_up", models_up, 0)
    m = model_bytes(params)
    return RoundBytes(up=n * np.dtype(loss_dtype).itemsize + k * m, down=n * m)


def upload_saving(method: RoundBytes, baseline: RoundBytes) -> float:
    """Fraction of upload bytes saved relative to ``baseline`` (0.8 = 80 % less)."""
    if baseline.up <= 0:
        raise ValueError("baseline.up must be > 0")
    return 1.0 - method.up / baseline.up


def per_round_table(cost: RoundBytes, rounds: int) -> dict[str, np.ndarray]:
    """Per-round and cumulative byte columns (int64) for ``rounds`` identical rounds."""
    rounds = check_int("rounds", rounds, 1)
    t = np.arange(1, rounds + 1, dtype=np.int64)
    return {
        "bytes_up": np.full(rounds, cost.up, np.int64),
        "bytes_down": np.full(rounds, cost.down, np.int64),
        "cum_bytes_up": t * cost.up,
        "cum_bytes_down": t * cost.down,
    }
