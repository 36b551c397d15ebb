"""FedProx (Li et al. 2020): FedAvg whose clients minimise their loss plus the proximal
term ``(mu / 2) ||w - w_t||^2`` around the global model ``w_t`` they received.

The term's gradient ``mu (w - w_t)`` is added to each local (DP) gradient before the
optimiser. It reads no data, so with record-level DP it post-processes the DP release and
the privacy record is FedAvg's. ``mu = 0`` is FedAvg, draw for draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float, PyTree

from swarmjax._validation import check_nonnegative
from swarmjax.fl.algorithms.fedavg import FedAvg, FedAvgHyper
from swarmjax.fl.data.clients import ClientData
from swarmjax.fl.protocol import RunSpec

__all__ = ["FedProx", "FedProxHyper", "proximal_term"]


@flax.struct.dataclass
class FedProxHyper(FedAvgHyper):
    """FedAvg's hyper-parameters and the proximal weight ``mu`` (>= 0)."""

    mu: Float[Array, ""]


class _Anchor(NamedTuple):
    anchor: PyTree  # the model the local training started from: the global model w_t


def proximal_term(mu: Float[Array, ""]) -> optax.GradientTransformation:
    """Adds ``mu (w - w_t)`` to the gradient, ``w_t`` being the parameters at ``init``."""

    def update(grads: PyTree, state: _Anchor, params: PyTree) -> tuple[PyTree, _Anchor]:
        prox = jax.tree.map(lambda g, w, a: g + mu * (w - a), grads, params, state.anchor)
        return prox, state

    return optax.GradientTransformation(_Anchor, update)


@dataclass(frozen=True)
class FedProx(FedAvg):
    """FedAvg with the proximal term; every setting is FedAvg's, ``mu`` is a hyper value."""

    def default_hyper(self, clients: ClientData, spec: RunSpec) -> FedProxHyper:
        """FedAvg's defaults and ``mu = 0.01``."""
        base = super().default_hyper(clients, spec)
        return FedProxHyper(**vars(base), mu=jnp.asarray(0.01, jnp.float32))

    def resolve(self, hyper, clients, spec, epsilon_target):
        check_nonnegative("mu", float(hyper.mu))
        return super().resolve(hyper, clients, spec, epsilon_target)

    def gradient_transform(self, hyper: FedProxHyper) -> optax.GradientTransformation:
        return proximal_term(hyper.mu)
