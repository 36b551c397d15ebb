"""What a private algorithm answers about its privacy: :class:`Accounting` (one object,
returned by :meth:`~swarmjax.fl.protocol.Algorithm.accounting`; ``None`` without DP).

A runtime asks the algorithm once, ``acc = alg.accounting()``, and then only ``acc``: its
privacy unit, each client's accounted :meth:`Accounting.steps` after every round (device
side: a count, the one number the clients' accountants keep), and on the host the rest of
the record from the plan, :meth:`Accounting.rates` (each client's Poisson rate and noise
multiplier, the chance that a static-size Poisson buffer overflowed, charged to delta, and
the epsilon of other noised releases), the dp-accounting event of a non-Gaussian mechanism
(:meth:`Accounting.step_event`), what exact float values reveal
(:meth:`Accounting.floating_point`) and how an audit attaches
(:meth:`Accounting.canary_hook` for client-level canaries, :meth:`Accounting.audited` for
canaries the clients carry themselves). An algorithm author who makes no privacy claim
never meets it.

The three accountings of the library: record-level DP-SGD in the clients
(:class:`~swarmjax.fl.algorithms.common.RecordLevel`, FedAvg + DP-SGD and Fed-DP-PSO), a
central user-level plan (:class:`~swarmjax.fl.private.CentralUserLevel`) and the
distributed plan under secure aggregation
(:class:`~swarmjax.fl.distributed.DistributedUserLevel`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, PyTree

if TYPE_CHECKING:
    from swarmjax.privacy.accounting import Rates
    from swarmjax.privacy.canaries import CanaryHook

__all__ = ["Accounting", "privacy_unit", "steps_of"]

FLOAT_NOISE = (
    "float: noise is added in float32 (inside the clients' DP steps or by the server); "
    "the exact low bits of a released value can reveal the secret beyond epsilon "
    "(Mironov 2012; docs/floating_point.md)"
)
"""The floating-point statement of plain float32 noise (the default of
:meth:`Accounting.floating_point`)."""


class Accounting:
    """How a private algorithm's privacy is accounted: everything a runtime asks after a
    run to write the privacy record, and the hooks an audit attaches to. Subclasses set
    :attr:`unit` and define :meth:`steps` and :meth:`rates`; every other member has a
    default.

    Attributes:
        unit: the privacy unit, ``"record"`` (one example of a client) or ``"client"``;
            ``None`` for an accountant that counts steps without noise (local training
            without ``record_dp``: the record states the steps, every epsilon infinite).
    """

    unit: Literal["record", "client"] | None

    def steps(self, server: PyTree, client_state: PyTree) -> Int[Array, ""]:
        """Device side: how many accounted steps one client has taken so far (after a
        round), from the server state and that client's state: int32, ``()``."""
        raise NotImplementedError

    def rates(
        self, hyper: PyTree, rounds: int, num_clients: int, sizes: np.ndarray | None = None
    ) -> Rates:
        """Host side: what the privacy record composes with the counted :meth:`steps`, from
        the plan and the runs' ``hyper`` (leading run axis ``R``).

        Args:
            hyper: the runs' hyper values, leaves with a leading run axis.
            rounds: ``T``, the rounds the record covers.
            num_clients: ``N``.
            sizes: ``(N,)`` the clients' real row counts (record-level ``q_i = B /
                |D_i|``; ``|D_i|`` is public under record-level zero-out), ``None`` where
                the runtime was given none.

        Returns:
            :class:`~swarmjax.privacy.accounting.Rates`: ``sample_rate`` and
            ``noise_multiplier`` ``(R, N)`` float32, the Poisson rate ``q`` and the noise
            multiplier ``sigma`` of the accounted steps (0 and 0 without noise);
            ``overflow`` ``None`` (nothing can overflow) or the per-step chance that a
            static-size Poisson draw the privacy rests on overflowed, broadcastable to
            ``(R, T, N)`` (charged to delta); ``extra_epsilon`` ``None`` or ``(R, T, N)``:
            the epsilon of other noised releases after each round (added by basic
            composition).
        """
        raise NotImplementedError

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


def steps_of(accounting: Accounting | None, server: PyTree, client_state: PyTree) -> Int[Array, ""]:
    """Device side: one client's accounted steps under ``accounting`` (an algorithm's
    :meth:`~swarmjax.fl.protocol.Algorithm.accounting`); ``0`` without one."""
    if accounting is None:
        return jnp.zeros((), jnp.int32)
    return jnp.asarray(accounting.steps(server, client_state), jnp.int32)


def privacy_unit(accounting: Accounting | None) -> Literal["record", "client"] | None:
    """The unit of the claim ``accounting`` makes (``None``: no accounting, or one without
    noise: no claim, epsilon inf)."""
    return None if accounting is None else accounting.unit
