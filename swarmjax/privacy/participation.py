"""Who takes part in a round of a user-level plan, and what that means for the accounting.

Three strategies, each an object that selects (device side), states the run's
:class:`~swarmjax.privacy.plan.PrivacyPlan` (host side) and tells canaries when they may
take part (audits):

* :class:`Poisson`: every client joins each round independently at the secret rate
  ``sample_rate`` ``q`` (a hyper-parameter), in a static buffer of ``capacity`` slots whose
  overflow the plan charges to delta; amplified by sampling. The realised count is secret:
  the server divides by the expected ``q N``.
* :class:`FixedCohort`: ``size`` clients drawn uniformly without replacement each round;
  no amplification is claimed (every client charged every round).
* :class:`MinSeparation`: a public schedule fixed before training (``m`` clients a round,
  each at most ``k`` times at least ``b`` rounds apart), for correlated noise (DP-FTRL).

A plan's device state (:class:`~swarmjax.privacy.user_level.PlanState`) carries what
selection reads: the rate, the rounds done and the schedule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, PRNGKeyArray

from swarmjax._validation import check_choice, check_int
from swarmjax.privacy.ftrl import SCHEDULES, Participation, cohort_ids, cohort_schedule
from swarmjax.privacy.plan import PrivacyPlan
from swarmjax.privacy.sampling import fixed_cohort, poisson_sample

__all__ = ["FixedCohort", "MinSeparation", "Poisson", "Selection"]


@dataclass(frozen=True)
class Poisson:
    """Secret Poisson sampling of clients at rate ``sample_rate`` into ``capacity`` slots.

    Attributes:
        capacity: static bound on sampled clients (``None``: all of them, whatever ``N``);
            at least the plan's floor (:meth:`~swarmjax.privacy.plan.PrivacyPlan.check_capacity`).
            :meth:`for_run` sizes it for a run.
    """

    capacity: int | None = None

    name = "poisson"

    def __post_init__(self) -> None:
        if self.capacity is not None:
            check_int("capacity", self.capacity, 1)

    @classmethod
    def for_run(
        cls,
        num_clients: int,
        sample_rate: float,
        rounds: int,
        delta: float,
        epsilon_target: float | None,
        accountant: str = "pld",
    ) -> Poisson:
        """The smallest buffer whose overflow over ``rounds`` rounds adds at most
        ``1e-3 delta`` to an ``(eps, delta)`` guarantee for any eps up to a composed epsilon
        of 64 (or ``epsilon_target`` if larger;
        :meth:`~swarmjax.privacy.plan.PrivacyPlan.sized`; example: 1,200 clients at rate
        50/1200, 100 rounds, delta 1/1200, epsilon 2 -> 158 slots); ``capacity=None`` when
        it would hold every client anyway."""
        probe = cls().plan(num_clients, sample_rate, rounds, delta, accountant)
        bound = math.inf if epsilon_target is None else float(epsilon_target)
        capacity = probe.sized(bound).capacity
        return cls(None if capacity >= num_clients else capacity)

    @property
    def max_selected(self) -> int | None:
        """Reply slots a round needs (``None``: one per client)."""
        return self.capacity

    @property
    def public_cohort(self) -> int | None:
        """The public cohort size (``None``: secret, Poisson)."""
        return None

    def select(self, state: Any, key: PRNGKeyArray, n: int) -> Bool[Array, " N"]:
        """``(N,)`` the clients drawn this round at ``state.sample_rate`` (an overflowing
        draw is redrawn, never truncated)."""
        capacity = n if self.capacity is None else min(self.capacity, n)
        ids, mask, _ = poisson_sample(key, state.sample_rate, jnp.ones(n, bool), capacity)
        return jnp.zeros(n, bool).at[ids].max(mask)

    def denominator(self, sample_rate: Array, num_clients: int) -> Array:
        """What the server divides the noised sum by: the expected cohort ``q N``."""
        return sample_rate * num_clients

    def plan(
        self, num_clients: int, sample_rate: float, rounds: int, delta: float, accountant: str
    ) -> PrivacyPlan:
        """``rounds`` Poisson-subsampled steps of ``N`` candidates at ``sample_rate`` into
        this buffer, client level."""
        return PrivacyPlan(
            unit="client",
            population=check_int("num_clients", num_clients, 1),
            rate=float(sample_rate),
            steps=rounds,
            delta=delta,
            accountant=accountant,
            capacity=self.capacity,
        )

    def participations(self, num_clients: int, rounds: int) -> int:
        """Counts of one client per accounted step: 1."""
        del num_clients, rounds
        return 1

    def canaries(self, state: Any, key: PRNGKeyArray, included: Bool[Array, " M"]) -> Array:
        """``(M,)`` the canaries taking part this round: each included one at the accounted
        rate (a buffer of every canary: never redrawn)."""
        m = included.shape[0]
        ids, mask, _ = poisson_sample(key, state.sample_rate, included, m)
        return jnp.zeros(m, bool).at[ids].max(mask)

    def describe(self, num_clients: int) -> str:
        """One line for the privacy record."""
        del num_clients
        return "a secret Poisson cohort each round (rate q), amplified by sampling"


@dataclass(frozen=True)
class FixedCohort:
    """``size`` clients drawn uniformly without replacement each round (public); every
    client is charged every round (no amplification claimed).

    Attributes:
        size: clients per round.
    """

    size: int

    name = "fixed"

    def __post_init__(self) -> None:
        check_int("cohort", self.size, 1)

    @property
    def max_selected(self) -> int:
        """Reply slots a round needs: the cohort."""
        return self.size

    @property
    def public_cohort(self) -> int:
        """The public cohort size ``m``."""
        return self.size

    def select(self, state: Any, key: PRNGKeyArray, n: int) -> Bool[Array, " N"]:
        """``(N,)`` ``size`` clients uniformly without replacement."""
        del state
        ids = fixed_cohort(key, n, self.size)
        return jnp.zeros((n,), bool).at[ids].set(True)

    def denominator(self, sample_rate: Array, num_clients: int) -> Array:
        """The public cohort ``m``."""
        del sample_rate, num_clients
        return jnp.float32(self.size)

    def plan(
        self, num_clients: int, sample_rate: float, rounds: int, delta: float, accountant: str
    ) -> PrivacyPlan:
        """``rounds`` unsampled Gaussian steps (:meth:`PrivacyPlan.fixed_cohort`)."""
        del sample_rate
        return PrivacyPlan.fixed_cohort("client", num_clients, self.size, rounds, delta, accountant)

    def participations(self, num_clients: int, rounds: int) -> int:
        """Counts of one client per accounted step: 1."""
        del num_clients, rounds
        return 1

    def canaries(self, state: Any, key: PRNGKeyArray, included: Bool[Array, " M"]) -> Array:
        """Every included canary, every round (what the accounting charges)."""
        del state, key
        return included

    def describe(self, num_clients: int) -> str:
        """One line for the privacy record."""
        return (
            f"a public uniform cohort of {self.size} of {num_clients} clients each round, "
            "no amplification claimed"
        )


@dataclass(frozen=True)
class MinSeparation:
    """Public cohorts of ``cohort`` clients, fixed before training: each client at most
    ``k`` times, at least ``b`` rounds apart (DP-FTRL's participation).

    Attributes:
        cohort: ``m``, clients per round.
        min_separation: ``b`` (``1``: consecutive rounds allowed); ``None``:
            ``min(N // m, T)``, the most the cohort allows. ``None`` for
            ``schedule="single"``.
        max_participations: ``k`` cap; ``None``: as many as fit (``ceil(T / b)``).
        schedule: ``"cyclic"`` (default), ``"random"`` or ``"single"``
            (:data:`~swarmjax.privacy.ftrl.SCHEDULES`).
        schedule_seed: the public seed of the schedule.
    """

    cohort: int
    min_separation: int | None = None
    max_participations: int | None = None
    schedule: Literal["cyclic", "random", "single"] = "cyclic"
    schedule_seed: int = 0

    name = "min-separation"

    def __post_init__(self) -> None:
        check_int("cohort", self.cohort, 1)
        check_choice("schedule", self.schedule, SCHEDULES)
        if self.min_separation is not None:
            check_int("min_separation", self.min_separation, 1)
            if self.schedule == "single":
                raise ValueError(
                    "min_separation must be None for schedule='single' (each client once); "
                    f"got {self.min_separation}"
                )
        if self.max_participations is not None:
            check_int("max_participations", self.max_participations, 1)
            if self.schedule == "single" and self.max_participations != 1:
                raise ValueError(
                    "max_participations must be 1 or None for schedule='single'; got "
                    f"{self.max_participations}"
                )
        check_int("schedule_seed", self.schedule_seed, 0)

    def scheme(self, num_clients: int, rounds: int) -> Participation:
        """The ``(k, b)``-min-separation scheme of a run (one-line ``ValueError`` naming the
        option when it cannot hold)."""
        n, t = check_int("num_clients", num_clients, 1), check_int("rounds", rounds, 1)
        if self.cohort > n:
            raise ValueError(f"cohort must be <= num_clients ({n}); got {self.cohort}")
        if self.schedule == "single":
            return Participation.single(t)
        b = min(n // self.cohort, t) if self.min_separation is None else self.min_separation
        return Participation(t, b, self.max_participations)

    def for_run(self, num_clients: int, rounds: int) -> MinSeparation:
        """This participation with ``b`` and ``k`` made explicit for the run (records then
        name numbers) and its schedule built and checked: every refusal is one line."""
        p = self.scheme(num_clients, rounds)
        out = self
        if self.schedule != "single":
            out = replace(
                self, min_separation=p.min_separation, max_participations=p.participations
            )
        out.schedule_for(num_clients, rounds)
        return out

    def schedule_for(self, num_clients: int, rounds: int) -> np.ndarray:
        """The public ``(T, m)`` int32 schedule (checked against the scheme)."""
        p = self.scheme(num_clients, rounds)
        return cohort_schedule(self.schedule, num_clients, self.cohort, p, self.schedule_seed)

    @property
    def max_selected(self) -> int:
        """Reply slots a round needs: the cohort."""
        return self.cohort

    @property
    def public_cohort(self) -> int:
        """The public cohort size ``m``."""
        return self.cohort

    def select(self, state: Any, key: PRNGKeyArray, n: int) -> Bool[Array, " N"]:
        """Row ``rounds`` of the public schedule (nobody after the last scheduled round)."""
        del key
        t = state.schedule.shape[0]
        ids = cohort_ids(state.schedule, jnp.minimum(state.rounds, t - 1))
        return jnp.zeros(n, bool).at[ids].set(state.rounds < t)

    def denominator(self, sample_rate: Array, num_clients: int) -> Array:
        """The public cohort ``m``."""
        del sample_rate, num_clients
        return jnp.float32(self.cohort)

    def plan(
        self, num_clients: int, sample_rate: float, rounds: int, delta: float, accountant: str
    ) -> PrivacyPlan:
        """The whole run as ONE Gaussian mechanism
        (:meth:`PrivacyPlan.min_separation_cohorts`)."""
        del sample_rate
        p = self.scheme(num_clients, rounds)
        return PrivacyPlan.min_separation_cohorts(
            "client",
            num_clients,
            self.cohort,
            p.rounds,
            p.min_separation,
            p.max_participations,
            delta,
            accountant,
        )

    def participations(self, num_clients: int, rounds: int) -> int:
        """``k``: counts of one client in the one accounted event."""
        return self.scheme(num_clients, rounds).participations

    def canaries(self, state: Any, key: PRNGKeyArray, included: Bool[Array, " M"]) -> Array:
        """Canary ``i`` holds the public slots ``r = (i mod b) + j b`` (0-based rounds,
        ``j < k``): like any client it takes part at most ``k`` times, exactly ``b``
        rounds apart (``"single"``: once, at round ``i mod T``); only included ones take
        their slots. Needs ``min_separation`` set (:meth:`for_run`)."""
        del key
        t = state.schedule.shape[0]
        single = self.schedule == "single"
        b = t if single else min(int(self.min_separation), t)
        cap = self.max_participations
        k = 1 if single else (math.ceil(t / b) if cap is None else cap)
        r = state.rounds
        slot = jnp.arange(included.shape[0]) % b
        return included & (r < t) & (r % b == slot) & (r // b < k)

    def check_canaries(self) -> None:
        """One-line ``ValueError`` unless canaries can take slots of the scheme."""
        if self.schedule != "single" and self.min_separation is None:
            raise ValueError(
                "audit needs MinSeparation's min_separation set (MinSeparation.for_run): "
                "canaries take slots of the (k, b) scheme; got min_separation=None"
            )

    def describe(self, num_clients: int) -> str:
        """One line for the privacy record."""
        del num_clients
        b = "min(N // m, T)" if self.min_separation is None else str(self.min_separation)
        k = "ceil(T / b)" if self.max_participations is None else str(self.max_participations)
        if self.schedule == "single":
            b, k = "T", "1"
        return (
            f"a {self.schedule!r} public schedule of cohorts of {self.cohort}, each client at "
            f"most k={k} times at least b={b} rounds apart"
        )


Selection = Poisson | FixedCohort | MinSeparation
