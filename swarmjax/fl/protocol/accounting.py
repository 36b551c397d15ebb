"""What a private algorithm answers about its privacy: :class:`Accounting` (one object,
returned by :meth:`~swarmjax.fl.protocol.Algorithm.accounting`; ``None`` without DP) and
what a client's accountant counted, :class:`Spend`.

A runtime asks the algorithm once, ``acc = alg.accounting()``, and then only ``acc``: its
privacy unit, each client's :meth:`Accounting.spend` after every round (device side), the
chance that a static-size Poisson buffer overflowed (:meth:`Accounting.overflow`, charged
to delta), the dp-accounting event of a non-Gaussian mechanism
(:meth:`Accounting.step_event`), what exact float values reveal
(:meth:`Accounting.floating_point`) and how an audit attaches
(:meth:`Accounting.canary_hook` for client-level canaries, :meth:`Accounting.audited` for
canaries the clients carry themselves). An algorithm author who makes no privacy claim
never meets either type.

The three accountings of the library: record-level DP-SGD in the clients
(:class:`~swarmjax.fl.algorithms.common.RecordLevel`, FedAvg + DP-SGD and Fed-DP-PSO), a
central user-level plan (:class:`~swarmjax.fl.private.CentralUserLevel`) and the
distributed plan under secure aggregation
(:class:`~swarmjax.fl.distributed.DistributedUserLevel`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import flax.struct
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PyTree

if TYPE_CHECKING:
    from swarmjax.privacy.canaries import CanaryHook

__all__ = ["Accounting", "Spend", "privacy_unit", "spend_of"]

FLOAT_NOISE = (
    "float: noise is added in float32 (inside the clients' DP steps or by the server); "
    "the exact low bits of a released value can reveal the secret beyond epsilon "
    "(Mironov 2012; docs/floating_point.md)"
)
"""The floating-point statement of plain float32 noise (the default of
:meth:`Accounting.floating_point`)."""


@flax.struct.dataclass
class Spend:
    """What a client's privacy accountant has counted so far (one client; stacked over
    clients, seeds and rounds by the simulator).

    Attributes:
        sample_rate: Poisson rate ``q`` of the accounted steps (records per client for
            record-level DP, clients for client-level DP).
        noise_multiplier: ``sigma`` of the accounted steps (0: no noise, epsilon = inf).
        steps: accounted steps taken so far.
        extra_epsilon: epsilon of other noised releases, added by basic composition.
    """

    sample_rate: Float[Array, ""]
    noise_multiplier: Float[Array, ""]
    steps: Int[Array, ""]
    extra_epsilon: Float[Array, ""]

    @classmethod
    def none(cls) -> Spend:
        """Nothing accounted (a non-private algorithm, or a client that never reported)."""
        z = jnp.zeros((), jnp.float32)
        return cls(
            sample_rate=z, noise_multiplier=z, steps=jnp.zeros((), jnp.int32), extra_epsilon=z
        )


class Accounting:
    """How a private algorithm's privacy is accounted: everything a runtime asks after a
    run to write the privacy record, and the hooks an audit attaches to. Subclasses set
    :attr:`unit` and define :meth:`spend`; every other member has a default.

    Attributes:
        unit: the privacy unit, ``"record"`` (one example of a client) or ``"client"``;
            ``None`` for an accountant that counts steps without noise (local training
            without ``record_dp``: the record states the steps, every epsilon infinite).
    """

    unit: Literal["record", "client"] | None

    def spend(self, server: PyTree, client_state: PyTree) -> Spend:
        """Device side: what one client's accountant counted so far (after a round), from
        the server state and that client's state."""
        raise NotImplementedError

    def overflow(
        self,
        spend: Spend,
        num_clients: int,
        sizes: np.ndarray | None = None,
        padded: int | None = None,
    ) -> np.ndarray | None:
        """Per-step chance that a static-size Poisson draw the privacy rests on overflowed
        (charged to delta by the privacy record), broadcastable to the spend's
        ``(runs, rounds, clients)``; ``sizes``/``padded``: the clients' real and padded row
        counts, ``None`` in a deployment (the server holds no data). Default: nothing can
        overflow."""
        del spend, num_clients, sizes, padded
        return None

    def step_event(self, hyper: PyTree) -> Callable[[float, float, int], Any] | None:
        """How the privacy record turns one variant's accounted ``(q, sigma, steps)`` of a
        round into a dp-accounting event: ``None`` (default) for ``steps``
        Poisson-subsampled Gaussian steps; a mechanism that is not Gaussian (the
        distributed Skellam plan) returns its own ``(q, sigma, steps) -> DpEvent`` built
        from ``hyper`` (one variant's values), the event that calibrated it."""
        del hyper
        return None

    def floating_point(self) -> str:
        """What the exact released float values reveal beyond epsilon (the privacy record
        states it; docs/floating_point.md). Default: plain float32 noise, whose low bits can
        reveal the secret (Mironov 2012)."""
        return FLOAT_NOISE

    def canary_hook(self) -> CanaryHook | None:
        """How the algorithm takes client-level canaries for ``simulate(audit=...)``
        (:class:`~swarmjax.privacy.canaries.CanaryHook`), or ``None`` (default: it takes
        none)."""
        return None

    def audited(self, result: Any) -> Any:
        """Host side: a finished run's result with the audit the clients carried themselves
        added (record-level canaries; ``simulate`` calls it last). Default: ``result``
        unchanged."""
        return result


def spend_of(accounting: Accounting | None, server: PyTree, client_state: PyTree) -> Spend:
    """Device side: one client's :class:`Spend` under ``accounting`` (an algorithm's
    :meth:`~swarmjax.fl.protocol.Algorithm.accounting`); nothing counted without one."""
    if accounting is None:
        return Spend.none()
    return accounting.spend(server, client_state)


def privacy_unit(accounting: Accounting | None) -> Literal["record", "client"] | None:
    """The unit of the claim ``accounting`` makes (``None``: no accounting, or one without
    noise: no claim, epsilon inf)."""
    return None if accounting is None else accounting.unit
