"""A distributed-DP plan applied around any summed exchange: ``private(alg, DistributedDP())``.

The plan (:class:`~swarmjax.privacy.distributed.DistributedDP`) takes over the exchange the
way the central plan does (:mod:`swarmjax.fl.private`), except that the noise is added by
the clients and the server never sees a single update::

    select (plan) -> client (alg) -> encode: clip, rotate, round, + Skellam share (plan)
        -> mask (secure aggregation) -> unmask the survivors' sum (server)
        -> decode (plan) -> aggregate_sum (alg, on Update(decoded sum, survivors))

The exchange has no runtime sum: the runtime hands the server the cohort's encoded uploads,
the plan simulates the clients' masking as one vectorised step and the server reads the
masked uploads of the survivors alone, exactly what a deployment's server would see. A
round with too few survivors is refused: the wrapped algorithm's state is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dp_accounting
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, Bool, Int, PRNGKeyArray, UInt32

from swarmjax.fl.private import PlanAround, PrivateHyper, PrivateServer, UserLevel
from swarmjax.fl.protocol import (
    Algorithm,
    Exchange,
    Protection,
    RunSpec,
    Slots,
    Update,
)
from swarmjax.privacy.distributed import DistributedDP

__all__ = ["Distributed", "DistributedUserLevel"]


@dataclass(frozen=True)
class Distributed(PlanAround):
    """``algorithm`` under the distributed ``plan`` (static settings; hashable). Build it
    with :func:`swarmjax.fl.private.private`, which checks the pair before any work.

    Attributes:
        algorithm: the wrapped algorithm: one summed exchange replying with an
            :class:`~swarmjax.fl.protocol.Update`, no privacy of its own.
        plan: the :class:`~swarmjax.privacy.distributed.DistributedDP` plan.
    """

    algorithm: Algorithm
    plan: DistributedDP

    @property
    def exchanges(self) -> tuple[Exchange, ...]:
        """The wrapped exchange with the plan's cohort, encoding, secure sum and decoding;
        its upload, ``d`` residues modulo ``2^bits``, goes on the wire packed
        (``reply_bits``: ``ceil(d bits / 8)`` bytes)."""
        protection = {"upload": Protection("accounted", "client", self.plan.describe())}
        return self._exchange(protection, reply_bits=self.plan.bits)

    def request(self, server: PrivateServer) -> tuple[Any, Int[Array, ""]]:
        """The wrapped request and the round index (it names the public rotation)."""
        return self._inner.request(server.inner), server.plan.rounds

    def client(
        self,
        state: Any,
        data: Any,
        request: tuple[Any, Array],
        key: PRNGKeyArray,
        hyper: PrivateHyper,
    ) -> tuple[Any, UInt32[Array, " d"]]:
        inner_request, rounds = request
        state, delta = self._update(state, data, inner_request, key, hyper)
        return state, self.plan.encode(delta, hyper.plan, rounds, key)

    def aggregate(
        self,
        server: PrivateServer,
        uploads: UInt32[Array, "S d"],
        slots: Slots,
        key: PRNGKeyArray,
        hyper: PrivateHyper,
    ) -> PrivateServer:
        """The simulated secure sum of the survivors' uploads (the plan's
        :meth:`~swarmjax.privacy.distributed.DistributedDP.secure_sum`), then :meth:`step`."""
        total, survived, ok = self.plan.secure_sum(uploads, slots.mask, slots.ids, key)
        kept = Slots(mask=survived, ids=slots.ids, num_clients=slots.num_clients)
        return self.step(server, kept, total, ok, key, hyper)

    def step(
        self,
        server: PrivateServer,
        survivors: Slots,
        total: UInt32[Array, " d"],
        ok: Bool[Array, ""],
        key: PRNGKeyArray,
        hyper: PrivateHyper,
    ) -> PrivateServer:
        """The server's step from a round's secure sum, shared by the simulator
        (:meth:`aggregate`) and a deployment's real secure aggregation
        (:mod:`swarmjax.fl.runtime.flower.secagg`): the plan's
        :meth:`~swarmjax.privacy.distributed.DistributedDP.decode` of ``total`` (``(d,)``
        uint32, the survivors' residues summed modulo ``2^b``), then the wrapped algorithm's
        step on ``Update(decoded sum, number of survivors)``; ``ok`` False (a refused round)
        keeps the wrapped state. ``survivors``: the slots whose upload is in ``total``
        (``mask``); ``key``: the exchange's aggregate key."""
        like = self._inner.request(server.inner)
        total_tree, plan = self.plan.decode(server.plan, total, ok, hyper.plan, like)
        weight = jnp.maximum(jnp.sum(survivors.mask), 1).astype(jnp.float32)
        stepped = self._inner_step(server, Update(total_tree, weight), survivors, key, hyper)
        inner = jax.tree.map(lambda a, b: jnp.where(ok, a, b), stepped, server.inner)
        return PrivateServer(inner=inner, plan=plan)

    # ------------------------------------------------------------------ device side

    def server_init(self, key: PRNGKeyArray, hyper: PrivateHyper) -> PrivateServer:
        return PrivateServer(
            inner=self.algorithm.server_init(key, hyper.inner), plan=self.plan.init(hyper.plan)
        )

    def accounting(self) -> DistributedUserLevel:
        """The plan's accounting under secure aggregation (:class:`DistributedUserLevel`)."""
        return DistributedUserLevel(self.plan)

    def fits(self, clients: Any) -> None:
        """One ``ValueError`` line unless the plan's cohort fits ``clients``."""
        n = clients.num_clients
        if self.plan.cohort > n:
            raise ValueError(f"cohort must be <= num_clients ({n}); got {self.plan.cohort}")

    def resolve(
        self, hyper: PrivateHyper, clients: Any, spec: RunSpec, epsilon_target: float | None
    ) -> PrivateHyper:
        """The algorithm's values checked without a target; the plan's grid and noise
        derived from ``epsilon_target`` for the model's rotated dimension."""
        self.fits(clients)
        if spec.accountant != "rdp":
            raise ValueError(
                "accountant must be 'rdp' for a DistributedDP plan (dp-accounting's PLD cannot "
                f"represent the multi-dimensional Skellam mechanism); got {spec.accountant!r}"
            )
        inner = self.algorithm.resolve(hyper.inner, clients, spec, None)
        dim = self.dimension(inner)
        return PrivateHyper(
            inner=inner,
            plan=self.plan.resolve(hyper.plan, clients.num_clients, spec, epsilon_target, dim),
        )

    def dimension(self, inner_hyper: Any) -> int:
        """``d``: the length one update is rotated and uploaded in (the model's parameters;
        the next power of two under Hadamard), from the wrapped algorithm's broadcast
        shapes."""
        server = jax.eval_shape(lambda: self.algorithm.server_init(jax.random.key(0), inner_hyper))
        like = jax.eval_shape(self._inner.request, server)
        flat = jax.eval_shape(lambda t: ravel_pytree(t)[0], like)
        return self.plan.dimension(int(flat.shape[0]))


@dataclass(frozen=True)
class DistributedUserLevel(UserLevel):
    """The accounting of the distributed plan: a public cohort (``q = 1``) whose noise is
    the clients' summed Skellam shares, accounted by the plan's own Skellam event.

    Attributes:
        plan: the :class:`~swarmjax.privacy.distributed.DistributedDP` plan.
    """

    plan: DistributedDP

    def step_event(self, hyper: PrivateHyper) -> Callable[[float, float, int], Any]:
        """``(q, sigma, steps) ->`` ``steps`` participations of the plan's Skellam event of
        this variant (the event that calibrated it)."""
        plan = hyper.plan

        def one(q: float, sigma: float, steps: int) -> dp_accounting.DpEvent:
            del q, sigma
            return self.plan.event(plan, steps)

        return one
