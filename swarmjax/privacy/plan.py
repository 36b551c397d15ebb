"""Privacy plans: ONE object per privacy unit of a run owns its DP arithmetic.

A :class:`PrivacyPlan` states, for one privacy unit (a record of a client under
record-level DP-SGD / DP-Adam; a whole client under client-level server aggregation):

* the **participation scheme** (:data:`PARTICIPATIONS`): each step draws every candidate
  unit independently with probability ``rate`` (Poisson; ``rate = 1``: every unit takes
  part in every step), or a fixed-size cohort charged without amplification
  (:meth:`PrivacyPlan.fixed_cohort`), or fixed-size cohorts in which each unit takes part
  at most ``k`` times at least ``b`` steps apart, released through a matrix factorization
  (DP-FTRL: :meth:`PrivacyPlan.min_separation_cohorts`); the candidates of one draw are
  ``population`` units (a client's records, or the federation's clients);
* the **buffer** the draw lands in (``capacity`` static slots) and its **overflow charge**
  (:attr:`PrivacyPlan.overflow_prob`: the chance per step that a draw exceeds the buffer
  and is redrawn, bounded for both neighbouring datasets, charged to delta);
* the **neighbouring relation** (:data:`RELATIONS`, one per unit);
* **calibration** (:meth:`PrivacyPlan.calibrate`: target epsilon -> noise multiplier) and
  **accounting** (:attr:`PrivacyPlan.event`, a dp-accounting ``DpEvent``, composed by the
  accountant the plan names: ``"pld"`` by default, or ``"rdp"``).

Algorithms build their plans and delegate to them; experiments and benchmarks never size
buffers or calibrate noise themselves. The one default delta is :func:`default_delta`.

Entry points, one each: buffer overflow :attr:`PrivacyPlan.overflow_prob`; buffer sizing
:meth:`PrivacyPlan.sized`; calibration :meth:`PrivacyPlan.calibrate`; default delta
:func:`default_delta`. (:mod:`swarmjax.privacy.sampling` and
:mod:`swarmjax.privacy.accounting` hold the mathematics they call.)
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Literal

import dp_accounting

from swarmjax._validation import check_choice, check_int, check_range
from swarmjax.privacy.accounting import (
    DEFAULT_ACCOUNTANT,
    check_accountant,
    event_epsilon,
    poisson_gaussian_event,
    sigma_for_epsilon,
)
from swarmjax.privacy.sampling import overflow_probability, poisson_capacity

__all__ = [
    "COMPOSED_EPSILON",
    "DELTA_CEILING",
    "FLOOR_OVERFLOW",
    "OVERFLOW_SHARE",
    "PARTICIPATIONS",
    "RELATIONS",
    "PrivacyPlan",
    "Unit",
    "check_delta",
    "default_delta",
    "draw_floor",
    "draw_overflow",
]

Unit = Literal["record", "client"]

RELATIONS: dict[str, str] = {
    "record": "record-level, zero-out: neighbouring datasets differ in one record of one "
    "client replaced by a null record that contributes nothing to any gradient or score "
    "(every |D_i|, hence q_i = B / |D_i| and the scored subset, is public and unchanged)",
    "client": "client-level, zero-out: neighbouring datasets differ in one client whose data "
    "is replaced by a null client, which keeps its participation (Poisson draws, slots in "
    "public cohorts and min-separation schedules) and contributes zero to every released "
    "sum and count (its update and its centred clipping bit); the federation size N is "
    "public and unchanged (the server divides by q N or the cohort size m), as is every "
    "public cohort. Poisson cohorts are secret and a null client in them is invisible to "
    "the server, so there the accounting equals add/remove's (McMahan et al. 2018); fixed "
    "cohorts and min-separation schedules (DP-FTRL) are public and need zero-out (Kairouz "
    "et al. 2021, Definition 1.1)",
}
"""The ONE neighbouring relation of each privacy unit: every mechanism of a run is
calibrated and accounted under it, and every privacy record states it (docs/privacy.md).
Both are zero-out relations.  At client level add/remove would not do: with a fixed
cohort of ``m`` clients, an added client that is drawn displaces another, so the cohort's
sum moves by ``x_u - x_w`` (norm up to ``2 C``), not ``C`` (docs/privacy.md, "The
client-level relation: zero-out"; ``tests/test_privacy_relations.py``)."""

PARTICIPATIONS: tuple[str, ...] = ("poisson", "fixed", "min-separation")
"""Participation schemes a plan states: ``"poisson"`` (every unit independently at rate
``q`` per step: amplification by subsampling), ``"fixed"`` (a fixed-size cohort, no
amplification claimed: :meth:`PrivacyPlan.fixed_cohort`) and ``"min-separation"``
(fixed-size cohorts, each unit at most ``k`` times at least ``b`` steps apart, the whole
run one Gaussian mechanism through a matrix factorization: DP-FTRL,
:meth:`PrivacyPlan.min_separation_cohorts`)."""

FLOOR_OVERFLOW = 1e-9
"""Largest per-step overflow chance any buffer may have, whatever the run."""

OVERFLOW_SHARE = 1e-3
"""Share of delta a buffer sized for a run (:meth:`PrivacyPlan.sized`) may use."""

COMPOSED_EPSILON = 64.0
"""The composed epsilon up to which a buffer sized by :meth:`PrivacyPlan.sized` keeps its
overflow charge below :data:`OVERFLOW_SHARE` of delta.  The charge of a redrawn Poisson draw
is ``P (1 + e^eps)`` at the epsilon being stated; an experiment's ledger states the
composition of many runs, whose epsilon is far above any one run's, so a buffer sized for
its own run's epsilon made the composed statement infinite (cross_device --quick with
DP-FedAvg and DP-FTRL at targets 2 and 8 over two seeds composes to about 16: each
DP-FedAvg run's ``P``, sized at its target, was charged ``e^8`` to ``e^14`` times over).
The Poisson tail is super-exponential, so sizing for 64 costs few slots and no noise:
1,200 clients at rate 50/1200 over 100 rounds, delta 1/1200, take 158 slots instead of 97
at epsilon 2 (expected cohort 50); 100 clients at rate 0.1 over 3 rounds, delta 1e-5, 62
instead of 33 to 36 (docs/ledger.md, "Buffers sized for the composition")."""

DELTA_CEILING = 1e-5
"""The largest default delta (:func:`default_delta`)."""


def draw_overflow(unit: Unit, population: int, rate: float, capacity: int | None) -> float:
    """Chance per step that a Poisson draw of ``population`` candidates at ``rate`` exceeds
    ``capacity`` slots (and is redrawn), charged for both neighbours: record level counts
    the ``population`` candidates that both zero-out neighbours have; client level counts
    one more (conservative, :attr:`PrivacyPlan.add_one`); ``0`` when the buffer holds every
    candidate counted. What :attr:`PrivacyPlan.overflow_prob` charges; it depends on the
    draw only, not on the run's steps or delta."""
    # Client level keeps the ``population + 1`` count of the former add/remove statement
    # although both zero-out neighbours have ``population`` candidates (the null client is
    # still drawn): P(Bin(N + 1, q) > k) >= P(Bin(N, q) > k), so the charge stays an upper
    # bound, every buffer, epsilon and stored ledger number is unchanged, and a Poisson
    # run's statement also holds under add/remove (the Gaussian part is the same there).
    add_one = unit == "client"
    if capacity is None or rate >= 1.0 or capacity >= population + int(add_one):
        return 0.0
    return overflow_probability(population, rate, capacity, add_one=add_one)


def draw_floor(unit: Unit, population: int, rate: float) -> int:
    """The smallest buffer whose per-step overflow (:func:`draw_overflow`, client level
    with its conservative ``population + 1`` candidates) is below :data:`FLOOR_OVERFLOW`:
    :meth:`PrivacyPlan.floor_capacity`."""
    return poisson_capacity(population, rate, FLOOR_OVERFLOW, add_one=unit == "client")


def default_delta(units: int) -> float:
    """The one default delta: ``min(1e-5, 0.1 / units)`` for a dataset of ``units`` privacy
    units (records for record-level DP, clients for client-level DP).

    Delta bounds the chance that the guarantee fails outright: a mechanism that publishes
    each unit's data with probability ``delta`` is ``(0, delta)``-DP.  So ``delta`` must be
    well below ``1 / units``, and ``0.1 / units`` keeps the expected number of exposed units
    at 0.1 or less.  For small datasets that alone is loose (``1e-3`` for 100 clients: one
    chance in a thousand that a given client is exposed), so it is capped at ``1e-5``, the
    value the DP literature and its reviewers take as the usual ceiling (Abadi et al. 2016;
    the DP-SGD and DP-FedAvg benchmarks).  Examples: 100 clients -> ``1e-5``; 1,200
    clients -> ``1e-5``; 60,000 records -> ``1.67e-6``.  Papers choose otherwise
    (Fed-DP-PSO 1e-5, DP-FedAvg ``N^-1.1``): pass ``delta`` explicitly to reproduce them.

    Args:
        units: privacy units in the dataset (``>= 1``).

    Returns:
        The delta, a float in ``(0, 1e-5]``.
    """
    n = check_int("units", units, 1)
    return min(DELTA_CEILING, 0.1 / n)


def check_delta(delta: float, name: str = "delta") -> float:
    """``delta`` as a float in ``(0, 1)``, else a one-line ``ValueError`` naming ``name``."""
    if isinstance(delta, bool) or not isinstance(delta, int | float) or math.isnan(delta):
        raise ValueError(f"{name} must be a number in (0, 1); got {delta!r}")
    return float(check_range(name, delta, 0.0, 1.0, low_open=True, high_open=True))


@dataclass(frozen=True)
class PrivacyPlan:
    """The DP arithmetic of one privacy unit over one run (immutable; hashable).

    Attributes:
        unit: ``"record"`` or ``"client"`` (its relation: :data:`RELATIONS`).
        population: candidates of one draw: the client's records (record-level) or the
            federation's clients (client-level); ``>= 1``.
        rate: Poisson inclusion probability ``q`` per step in ``(0, 1]`` (``1``: every unit
            in every step).
        steps: accounted steps of one unit over the run (``>= 0``).
        delta: the delta every epsilon of the plan is stated at, in ``(0, 1)``.
        accountant: ``"pld"`` (default) or ``"rdp"``.
        capacity: static buffer slots of one draw; ``None``: a buffer that holds every
            candidate (it never overflows).
        noise_multiplier: ``sigma`` (noise std / sensitivity) of each step; ``0``: none.
        participation: ``"poisson"`` (default), ``"fixed"`` or ``"min-separation"``
            (:data:`PARTICIPATIONS`).
        min_separation: ``b``, the fewest steps between two participations of a unit
            (``"min-separation"`` only; ``1``: consecutive steps allowed).
        max_participations: ``k`` cap (``"min-separation"`` only; ``None``: as many as
            fit, ``ceil(steps / b)``).
    """

    unit: Unit
    population: int
    rate: float
    steps: int
    delta: float
    accountant: str = DEFAULT_ACCOUNTANT
    capacity: int | None = None
    noise_multiplier: float = 0.0
    participation: str = "poisson"
    min_separation: int | None = None
    max_participations: int | None = None

    def __post_init__(self) -> None:
        check_choice("unit", self.unit, ("record", "client"))
        check_int("population", self.population, 1)
        check_range("sample_rate", self.rate, 0.0, 1.0, low_open=True)
        check_int("steps", self.steps, 0)
        check_delta(self.delta)
        if self.delta * self.population >= 1.0:  # legal, but no guarantee worth stating
            warnings.warn(
                f"delta {self.delta:g} is not below 1/{self.population} (one over the plan's "
                f"{self.unit}s): a mechanism that publishes one {self.unit} in full at random "
                f"meets it; choose delta well below (default_delta gives "
                f"{default_delta(self.population):.3g})",
                UserWarning,
                stacklevel=3,
            )
        check_accountant(self.accountant)
        if self.capacity is not None:
            check_int("capacity", self.capacity, 1)
        check_range("noise_multiplier", self.noise_multiplier, 0.0, math.inf, high_open=True)
        check_choice("participation", self.participation, PARTICIPATIONS)
        if self.participation in ("fixed", "min-separation") and self.rate != 1.0:
            raise ValueError(
                f"sample_rate must be 1 for a fixed cohort (participation "
                f"{self.participation!r}: no amplification); got {self.rate}"
            )
        if self.participation == "min-separation":
            if self.min_separation is None:
                raise ValueError("min_separation must be set for min-separation participation")
            self.scheme  # noqa: B018 (validates rounds, b and k in one place)
        elif self.min_separation is not None or self.max_participations is not None:
            raise ValueError(
                "min_separation and max_participations apply to participation="
                f"'min-separation' only; got participation={self.participation!r}"
            )
        object.__setattr__(self, "rate", float(self.rate))
        object.__setattr__(self, "delta", float(self.delta))
        object.__setattr__(self, "noise_multiplier", float(self.noise_multiplier))

    @classmethod
    def fixed_cohort(
        cls,
        unit: Unit,
        population: int,
        cohort: int,
        steps: int,
        delta: float,
        accountant: str = DEFAULT_ACCOUNTANT,
    ) -> PrivacyPlan:
        """A fixed-size cohort: ``cohort`` of ``population`` units drawn uniformly without
        replacement each step. No amplification is claimed (a unit is charged every step,
        as if always drawn), so the event is ``steps`` unsampled Gaussian steps; the buffer
        is the cohort and never overflows. Sound under zero-out (:data:`RELATIONS`): the
        null unit keeps its slot, so the cohort is the same on both neighbours and the sum
        moves by at most one contribution (sensitivity ``C``); under add/remove a drawn
        added unit would displace another and move it by up to ``2 C``."""
        cohort = check_int("cohort", cohort, 1)
        if cohort > check_int("population", population, 1):
            raise ValueError(f"cohort must be <= population ({population}); got {cohort}")
        return cls(unit, population, 1.0, steps, delta, accountant, cohort, participation="fixed")

    @classmethod
    def min_separation_cohorts(
        cls,
        unit: Unit,
        population: int,
        cohort: int,
        steps: int,
        min_separation: int,
        max_participations: int | None,
        delta: float,
        accountant: str = DEFAULT_ACCOUNTANT,
    ) -> PrivacyPlan:
        """Fixed-size cohorts of ``cohort`` of ``population`` units over ``steps`` steps,
        each unit at most ``max_participations`` times (``None``: as many as fit) and at
        least ``min_separation`` steps apart, released through a matrix factorization
        (DP-FTRL, :mod:`swarmjax.privacy.ftrl`). No amplification is claimed: the whole run
        is ONE Gaussian mechanism on ``C x`` whose noise std is ``noise_multiplier`` times
        the clip norm times ``C``'s ``(k, b)``-min-separation sensitivity, so its event is
        ``GaussianDpEvent(noise_multiplier)`` whatever ``C`` is (the factorization sets
        the sensitivity, not the accounting). The cohorts are the buffer; nothing
        overflows. Example: 1,200 clients, cohorts of 50, 96 rounds, ``b = 24`` -> ``k = 4``.
        """
        cohort = check_int("cohort", cohort, 1)
        if cohort > check_int("population", population, 1):
            raise ValueError(f"cohort must be <= population ({population}); got {cohort}")
        return cls(
            unit,
            population,
            1.0,
            steps,
            delta,
            accountant,
            cohort,
            participation="min-separation",
            min_separation=min_separation,
            max_participations=max_participations,
        )

    # ------------------------------------------------------------------ participation

    @property
    def scheme(self):  # -> swarmjax.privacy.ftrl.Participation (imported lazily: jax-privacy)
        """The ``(k, b)``-min-separation scheme over ``steps`` rounds
        (:class:`~swarmjax.privacy.ftrl.Participation`); ``ValueError`` for another
        participation."""
        if self.participation != "min-separation":
            raise ValueError(f"participation {self.participation!r} has no min-separation scheme")
        from swarmjax.privacy.ftrl import Participation

        return Participation(self.steps, self.min_separation, self.max_participations)

    @property
    def participations(self) -> int:
        """Most steps one unit takes part in: ``k`` under min-separation (as many as fit
        when uncapped), ``steps`` otherwise (every step charged)."""
        if self.participation == "min-separation":
            return self.scheme.participations
        return self.steps

    @property
    def relation(self) -> str:
        """The neighbouring relation every epsilon of this plan holds under."""
        return RELATIONS[self.unit]

    @property
    def add_one(self) -> bool:
        """Whether the overflow charge counts one candidate more than ``population``:
        client level does, record level does not.  Both relations are zero-out, so both
        neighbours have ``population`` candidates; the client-level ``+ 1`` is kept as a
        conservative bound (:func:`draw_overflow` says why): it changes no stated number."""
        return self.unit == "client"

    @property
    def overflow_prob(self) -> float:
        """Chance per step that the Poisson draw exceeds ``capacity`` (and is redrawn) on
        either neighbour: ``P(Binomial(population (+1 at client level: conservative,
        :attr:`add_one`), rate) > capacity)``; ``0`` when the buffer holds every candidate
        counted."""
        if self.participation == "fixed":
            return 0.0
        return draw_overflow(self.unit, self.population, self.rate, self.capacity)

    @property
    def overflow(self) -> float:
        """The run's summed overflow ``P = steps * overflow_prob`` charged to delta."""
        return self.steps * self.overflow_prob

    def floor_capacity(self) -> int:
        """The smallest buffer whose per-step overflow is below :data:`FLOOR_OVERFLOW`."""
        return draw_floor(self.unit, self.population, self.rate)

    def sized(
        self,
        epsilon_bound: float,
        *,
        share: float = OVERFLOW_SHARE,
        composed_epsilon: float = COMPOSED_EPSILON,
    ) -> PrivacyPlan:
        """This plan with the smallest buffer whose overflow over the run adds at most
        ``share * delta`` to an ``(eps, delta)`` guarantee for every ``eps`` up to
        ``max(epsilon_bound, composed_epsilon)``, never below :meth:`floor_capacity`.

        ``epsilon_bound`` is an upper bound on the run's own epsilon (e.g. the target);
        ``composed_epsilon`` (default :data:`COMPOSED_EPSILON`, 64) the largest epsilon of
        a composition the run takes part in (an experiment's ledger) for which the overflow
        charge must stay negligible.  A run without noise (``epsilon_bound`` infinite) or
        without steps gets the floor buffer.

        Example: 1,200 clients at rate 50/1200, 100 rounds, delta 1/1200, epsilon 2 -> 158
        slots (97 when sized for the run's own epsilon alone, ``composed_epsilon=2``).
        """
        check_range("share", share, 0.0, 1.0, low_open=True)
        check_range("composed_epsilon", composed_epsilon, 0.0, 700.0, low_open=True)
        floor = self.floor_capacity()
        if not math.isfinite(epsilon_bound) or self.steps == 0:
            return dataclasses.replace(self, capacity=floor)
        check_range("epsilon", epsilon_bound, 0.0, 700.0, low_open=True)
        eps = max(float(epsilon_bound), float(composed_epsilon))
        per_step = share * self.delta / (self.steps * (1.0 + math.exp(eps)))
        run = poisson_capacity(self.population, self.rate, per_step, add_one=self.add_one)
        return dataclasses.replace(self, capacity=max(run, floor))

    def check_capacity(self) -> None:
        """One-line ``ValueError`` naming ``capacity`` when the buffer's per-step overflow
        exceeds :data:`FLOOR_OVERFLOW` (a fixed or min-separation cohort is its own buffer:
        nothing to check)."""
        if self.participation != "poisson":
            return
        if self.capacity is not None and self.capacity < self.floor_capacity():
            raise ValueError(
                f"capacity must be >= {self.floor_capacity()} (overflow below "
                f"{FLOOR_OVERFLOW:g} per step at q = {self.rate:g} for {self.population} "
                f"candidates{', plus one counted conservatively' if self.add_one else ''}) or "
                f"None; got {self.capacity}"
            )

    # ------------------------------------------------------------------ accounting

    @property
    def _gaussian_steps(self) -> int:
        """Gaussian steps of the event: ``steps``; one for min-separation (the whole run
        is one Gaussian mechanism), none for a run without steps."""
        if self.participation == "min-separation":
            return min(self.steps, 1)
        return self.steps

    @property
    def event(self) -> dp_accounting.DpEvent:
        """The run's dp-accounting event: ``steps`` Poisson-subsampled Gaussian steps, or,
        under min-separation, ONE ``GaussianDpEvent(noise_multiplier)`` for the run."""
        return poisson_gaussian_event(self.rate, self.noise_multiplier, self._gaussian_steps)

    def epsilon(self) -> float:
        """Epsilon of the run at ``delta`` by the plan's accountant, the overflow charged."""
        return event_epsilon(
            self.event, self.delta, accountant=self.accountant, overflow=self.overflow
        )

    def calibrate(self, target_epsilon: float, *, rtol: float = 1e-3) -> PrivacyPlan:
        """This plan with the smallest noise multiplier (to ``rtol``) whose epsilon, by the
        plan's accountant with its overflow charged, is ``<= target_epsilon``; ``inf``
        gives ``0`` (no noise). The one calibration entry point of swarmjax."""
        if target_epsilon is None or math.isinf(target_epsilon):
            return dataclasses.replace(self, noise_multiplier=0.0)
        sigma = sigma_for_epsilon(
            float(target_epsilon),
            self.rate,
            self._gaussian_steps,
            self.delta,
            accountant=self.accountant,
            rtol=rtol,
            overflow_prob=self.overflow_prob,
        )
        return dataclasses.replace(self, noise_multiplier=sigma)
