"""A user-level privacy plan applied around any summed exchange: ``private(alg, plan)``.

The plan (:class:`~swarmjax.privacy.user_level.UserLevelDP`) takes over the parts of the
exchange that privacy rests on and leaves the rest to the algorithm::

    select (plan) -> client (alg) -> clip (plan) -> sum (runtime) -> noise (plan)
        -> aggregate_sum (alg, on Update(noised sum, public denominator))

So FedAvg, FedAdam, FedYogi, FedProx or any algorithm whose one exchange is summed and
replies with an :class:`~swarmjax.fl.protocol.Update` becomes central user-level DP without
a new class: DP-FedAvg is ``private(FedAvg(..., server_optimizer="sgd",
weighting="uniform"), UserLevelDP())`` and DP-FTRL the same with a
:class:`~swarmjax.privacy.participation.MinSeparation` participation and
:class:`~swarmjax.privacy.noise.CorrelatedNoise`
(:mod:`swarmjax.fl.algorithms.client_level_dp_fedavg`, :mod:`swarmjax.fl.algorithms.dp_ftrl`).

The wrapped algorithm must make no privacy claim of its own (no record-level DP inside),
select no cohort of its own (the plan's participation selects), weight clients uniformly
(a client's size is private at the client level) and have no setup exchanges: each is a
one-line ``ValueError`` before any work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import flax.struct
import jax
import numpy as np
from jaxtyping import Array, Bool, Int, PRNGKeyArray, PyTree

from swarmjax.fl.protocol import (
    Accounting,
    Algorithm,
    Exchange,
    Protection,
    RunSpec,
    Slots,
    SummedAggregate,
    Update,
    privacy_unit,
)
from swarmjax.privacy.accounting import Rates
from swarmjax.privacy.canaries import CanaryHook
from swarmjax.privacy.user_level import ClippedUpdate, PlanHyper, PlanState, UserLevelDP

__all__ = [
    "CentralUserLevel",
    "PlanAround",
    "Private",
    "PrivateHyper",
    "PrivateServer",
    "UserLevel",
    "algorithm_name",
    "check_pair",
    "private",
]

_INNER_KEY = 0x696E6E72  # fold_in tag of the wrapped algorithm's aggregate key


@flax.struct.dataclass
class PrivateHyper:
    """The wrapped algorithm's hyper-parameters (``inner``) and the plan's (``plan``,
    :class:`~swarmjax.privacy.user_level.PlanHyper`). :meth:`~swarmjax.fl.protocol.Variants.grid`
    takes either's fields by name; a name both have (``noise_multiplier``) is the plan's."""

    inner: PyTree
    plan: PlanHyper

    def __getattr__(self, name: str) -> Any:
        """Reads of a field of neither fall through to the plan's, then the algorithm's
        (``hyper.noise_multiplier`` is the plan's ``z``)."""
        if name.startswith("__"):
            raise AttributeError(name)
        for part in ("plan", "inner"):
            value = object.__getattribute__(self, part)
            if name in {f.name for f in dataclasses.fields(value)}:
                return getattr(value, name)
        raise AttributeError(name)

    def names(self) -> tuple[str, ...]:
        """Every hyper-parameter name a grid may set."""
        inner = [f.name for f in dataclasses.fields(self.inner)]
        plan = [f.name for f in dataclasses.fields(self.plan)]
        return tuple(dict.fromkeys(plan + inner))

    def with_values(self, **values: Any) -> PrivateHyper:
        """This hyper with ``values`` set by name (the plan's fields first)."""
        plan_names = {f.name for f in dataclasses.fields(self.plan)}
        mine = {k: v for k, v in values.items() if k in plan_names}
        theirs = {k: v for k, v in values.items() if k not in plan_names}
        return PrivateHyper(
            inner=self.inner.replace(**theirs) if theirs else self.inner,
            plan=self.plan.replace(**mine) if mine else self.plan,
        )


@flax.struct.dataclass
class PrivateServer:
    """The wrapped algorithm's server state (``inner``) and the plan's
    (:class:`~swarmjax.privacy.user_level.PlanState`: ``C_t``, rounds, noise state).
    Attribute reads that are neither fall through to ``inner`` (``server.params``)."""

    inner: PyTree
    plan: PlanState

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(object.__getattribute__(self, "inner"), name)


class PlanAround(Algorithm):
    """What every algorithm under a user-level plan shares (:class:`Private`, central;
    :class:`~swarmjax.fl.distributed.Distributed`, under secure aggregation): the wrapped
    ``algorithm``'s one exchange, its clients' data and state, and its metrics beside the
    plan's. Subclasses are frozen dataclasses with the fields ``algorithm`` and ``plan``."""

    algorithm: Algorithm
    plan: Any

    def __post_init__(self) -> None:
        check_pair(self.algorithm, self.plan)

    @property
    def _inner(self) -> Exchange:
        return self.algorithm.exchanges[0]

    def _exchange(self, protection: dict[str, Protection], **options: Any) -> tuple[Exchange]:
        """The round's one exchange: the wrapped exchange's name, this class's select,
        request, client and aggregate, ``protection``, the plan's bound on the cohort
        (``max_selected``) and ``options`` (the other :class:`Exchange` fields)."""
        return (
            Exchange(
                self._inner.name,
                self.select,
                self.request,
                self.client,
                self.aggregate,
                protection,
                max_selected=self.plan.participation.max_selected,
                **options,
            ),
        )

    def select(self, server: PrivateServer, key: PRNGKeyArray, n: int) -> Bool[Array, " N"]:
        """The plan's participation selects the round's clients."""
        return self.plan.select(server.plan, key, n)

    def _update(
        self, state: Any, data: Any, request: Any, key: PRNGKeyArray, hyper: PrivateHyper
    ) -> tuple[Any, PyTree]:
        """The wrapped client's new state and the ``delta`` of its
        :class:`~swarmjax.fl.protocol.Update` (a ``TypeError`` naming the algorithm for any
        other reply), which the plan then protects."""
        state, reply = self._inner.client(state, data, request, key, hyper.inner)
        if not isinstance(reply, Update):
            raise TypeError(
                f"{type(self.algorithm).__name__}'s client must reply with an Update(delta, "
                f"weight) to take a privacy plan; got {type(reply).__name__}"
            )
        return state, reply.delta

    def _inner_step(
        self, server: PrivateServer, total: Update, slots: Slots, key: PRNGKeyArray, hyper: Any
    ) -> PyTree:
        """The wrapped algorithm's server step on ``total`` (the plan's released sum and
        its denominator), under its own key folded from the exchange's."""
        inner_key = jax.random.fold_in(key, _INNER_KEY)
        return self._inner.aggregate_sum(server.inner, total, slots, inner_key, hyper.inner)

    def client_init(
        self, key: PRNGKeyArray, data: Any, hyper: PrivateHyper, client_id: Int[Array, ""]
    ) -> Any:
        return self.algorithm.client_init(key, data, hyper.inner, client_id)

    def evaluate(self, server: PrivateServer, test: tuple[Array, Array]) -> dict[str, Array]:
        out = dict(self.algorithm.evaluate(server.inner, test))
        out.update(self.plan.metrics(server.plan))
        return out

    def client_data(self, clients: Any, test: tuple[Array, Array] | None = None) -> PyTree:
        """The wrapped algorithm's client data, once it and the plan fit ``clients``."""
        self.fits(clients)
        return self.algorithm.client_data(clients, test)

    def default_hyper(self, clients: Any, spec: RunSpec) -> PrivateHyper:
        return PrivateHyper(
            inner=self.algorithm.default_hyper(clients, spec),
            plan=self.plan.default_hyper(clients.num_clients, spec.rounds),
        )


@dataclass(frozen=True)
class Private(SummedAggregate, PlanAround):
    """``algorithm`` under the user-level ``plan`` (static settings; hashable). Build it
    with :func:`private`, which checks the pair before any work.

    Attributes:
        algorithm: the wrapped algorithm: one summed exchange replying with an
            :class:`~swarmjax.fl.protocol.Update`, no privacy of its own.
        plan: the :class:`~swarmjax.privacy.user_level.UserLevelDP` plan.
    """

    algorithm: Algorithm
    plan: UserLevelDP

    # ------------------------------------------------------------------ the exchange

    @property
    def exchanges(self) -> tuple[Exchange, ...]:
        """The wrapped exchange with the plan's selection, clipping and noise: the plan's
        participation bounds the reply slots; a Poisson cohort's size is secret, so
        released byte counts use the expected ``q N``."""
        protection = {
            "update": Protection("accounted", "client", self.plan.describe()),
        }
        if self.plan.adaptive:
            protection["unclipped"] = Protection("accounted", "client", self.plan.count_note())
        secret = self.plan.participation.public_cohort is None
        return self._exchange(
            protection,
            expected_selected=_expected_clients if secret else None,
            aggregate_sum=self.aggregate_sum,
        )

    def request(self, server: PrivateServer) -> tuple[Any, Array]:
        return self._inner.request(server.inner), server.plan.clip

    def client(
        self,
        state: Any,
        data: Any,
        request: tuple[Any, Array],
        key: PRNGKeyArray,
        hyper: PrivateHyper,
    ) -> tuple[Any, ClippedUpdate]:
        inner_request, clip = request
        state, delta = self._update(state, data, inner_request, key, hyper)
        return state, self.plan.clip(delta, clip)

    def aggregate_sum(
        self,
        server: PrivateServer,
        total: ClippedUpdate,
        slots: Slots,
        key: PRNGKeyArray,
        hyper: PrivateHyper,
    ) -> PrivateServer:
        """The plan releases the noised sum (and count), then the algorithm steps on
        ``Update(noised sum, public denominator)``."""
        noised, denominator, plan = self.plan.release(
            server.plan, total, slots.mask, key, hyper.plan, slots.num_clients
        )
        inner = self._inner_step(server, Update(noised, denominator), slots, key, hyper)
        return PrivateServer(inner=inner, plan=plan)

    # ------------------------------------------------------------------ device side

    def server_init(self, key: PRNGKeyArray, hyper: PrivateHyper) -> PrivateServer:
        inner = self.algorithm.server_init(key, hyper.inner)
        like = self._inner.request(inner)  # the update is shaped like the broadcast model
        return PrivateServer(inner=inner, plan=self.plan.init(hyper.plan, like))

    # ------------------------------------------------------------------ host side

    def fits(self, clients: Any) -> None:
        """One ``ValueError`` line unless the plan's public cohort fits ``clients``."""
        cohort = self.plan.participation.public_cohort
        n = clients.num_clients
        if cohort is not None and cohort > n:
            raise ValueError(f"cohort must be <= num_clients ({n}); got {cohort}")

    def resolve(
        self, hyper: PrivateHyper, clients: Any, spec: RunSpec, epsilon_target: float | None
    ) -> PrivateHyper:
        """The algorithm's values checked without a target (it makes no claim); the plan's
        calibrated to ``epsilon_target``."""
        self.fits(clients)
        return PrivateHyper(
            inner=self.algorithm.resolve(hyper.inner, clients, spec, None),
            plan=self.plan.resolve(hyper.plan, clients.num_clients, spec, epsilon_target),
        )

    def accounting(self) -> CentralUserLevel:
        """The plan's central user-level accounting (:class:`CentralUserLevel`)."""
        return CentralUserLevel(self.plan, self._inner.request)


@dataclass(frozen=True)
class UserLevel(Accounting):
    """What the accountings of user-level plans share: the unit is the client, the server
    counts the plan's steps, the plan gives its rates and states what its released floats
    reveal.

    Attributes:
        plan: the user-level plan (central or distributed).
    """

    plan: Any

    unit: ClassVar[str] = "client"

    def floating_point(self) -> str:
        return self.plan.floating_point()

    def steps(self, server: PrivateServer, client_state: Any) -> Int[Array, ""]:
        """The plan's accounted steps (server side), the same for every client."""
        del client_state
        return self.plan.accounted_steps(server.plan)

    def rates(
        self, hyper: PrivateHyper, rounds: int, num_clients: int, sizes: np.ndarray | None = None
    ) -> Rates:
        """The plan's ``(q, z)`` of every client and its overflow charge, from the runs'
        plan hyper values (``rates`` of the plan); no other release."""
        del rounds, sizes
        return self.plan.rates(hyper.plan, num_clients)


@dataclass(frozen=True)
class CentralUserLevel(UserLevel):
    """The accounting of a central user-level plan (:class:`Private`): every client is
    accounted by the plan's ``(q, z, steps)``, the Poisson draw of clients is charged its
    overflow, and client-level canaries take part by the plan's participation rule.

    Attributes:
        plan: the :class:`~swarmjax.privacy.user_level.UserLevelDP` plan.
        broadcast: the wrapped exchange's ``request`` (the model the canaries are scored
            on), ``inner server -> request``.
    """

    plan: UserLevelDP
    broadcast: Callable[[Any], Any]

    def canary_hook(self) -> CanaryHook:
        """Client-level canaries by the plan's participation rule: each in canary takes part
        as the rule allows and replies as a client whose raw update is its direction times
        ``C_t`` (clipped, with its bit); scored on the broadcast model."""
        self.plan.check_canaries()
        participation = self.plan.participation

        def participate(server, key, round_index, included):
            del round_index
            return participation.canaries(server.plan, key, included)

        def reply(request, direction, hyper):
            del hyper
            _, clip = request
            return self.plan.clip(jax.tree.map(lambda d: d * clip, direction), clip)

        return CanaryHook(0, participate, reply, lambda server: self.broadcast(server.inner))


def _expected_clients(hyper: PrivateHyper, num_clients: int) -> Array:
    return hyper.plan.sample_rate * num_clients


def check_pair(alg: Algorithm, plan: Any) -> None:
    """One ``ValueError`` line naming the setting unless ``plan`` (a user-level plan,
    central or distributed) can wrap ``alg``."""
    name = type(alg).__name__
    if not isinstance(plan, UserLevelDP) and type(plan).__name__ != "DistributedDP":
        raise ValueError(f"plan must be a UserLevelDP or DistributedDP; got {type(plan).__name__}")
    if not isinstance(alg, Algorithm) or isinstance(alg, PlanAround):
        raise ValueError(f"private() takes an algorithm without a plan; got {name}")
    if alg.setup:
        raise ValueError(f"a privacy plan wraps one round exchange; {name} has setup exchanges")
    if len(alg.exchanges) != 1 or alg.exchanges[0].aggregate_sum is None:
        raise ValueError(
            f"a privacy plan needs one summed exchange (aggregate_sum: the server uses only "
            f"the sum of the replies); {name} has {len(alg.exchanges)} exchange(s)"
            + ("" if len(alg.exchanges) != 1 else " without aggregate_sum")
        )
    own = privacy_unit(alg.accounting())
    if own is not None:
        raise ValueError(
            f"{name} makes its own {own}-level claim (training.record_dp must be "
            "None): a user-level plan's unit is the client"
        )
    if getattr(alg, "cohort", None) is not None:
        raise ValueError(
            f"{name}.cohort must be None under a privacy plan: the plan's participation "
            "selects (FixedCohort(size) for a uniform cohort)"
        )
    if getattr(alg, "weighting", "uniform") != "uniform":
        raise ValueError(
            f"{name}.weighting must be 'uniform' under a user-level plan: a client's size is "
            "private at the client level"
        )


def private(algorithm: Algorithm, plan: Any = None) -> Algorithm:
    """``algorithm`` under a user-level privacy ``plan`` (default
    :class:`~swarmjax.privacy.user_level.UserLevelDP`: Poisson participation, adaptive
    clipping, snapped Gaussian noise, the server trusted; a
    :class:`~swarmjax.privacy.distributed.DistributedDP` plan gives a
    :class:`~swarmjax.fl.distributed.Distributed` algorithm: client-added Skellam noise
    under secure aggregation). One-line ``ValueError`` before any work when the pair cannot
    hold: no single summed exchange, a claim of its own, its own cohort, non-uniform
    weights or setup exchanges.

    Example (central DP on FedAdam, a buffer sized for the run)::

        alg = private(
            FedAvg(model, training, server_optimizer="adam", weighting="uniform"),
            UserLevelDP(Poisson.for_run(N, q, rounds, delta, epsilon)),
        )
    """
    if plan is None or isinstance(plan, UserLevelDP):
        return Private(algorithm, UserLevelDP() if plan is None else plan)
    from swarmjax.fl.distributed import Distributed  # imports the secure-aggregation code

    return Distributed(algorithm, plan)


def algorithm_name(alg: Algorithm) -> str:
    """The name a result, a progress bar and a ledger give ``alg``: its class name, or
    ``Private(<class of the wrapped algorithm>)`` under a privacy plan."""
    if isinstance(alg, PlanAround):
        return f"{type(alg).__name__}({type(alg.algorithm).__name__})"
    return type(alg).__name__
