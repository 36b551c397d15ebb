"""User-level (client-level) central DP as ONE plan: who takes part, how each update is
clipped, what noise the server adds to their sum, and the accounting of all of it.

A :class:`UserLevelDP` plan is applied around any summed exchange
(``select -> client -> clip -> sum -> noise -> aggregate_sum``) by
:func:`swarmjax.fl.private.private`; the algorithm it wraps never sees a privacy setting.
It holds three objects:

* ``participation`` (:mod:`swarmjax.privacy.participation`): :class:`Poisson` (secret,
  amplified), :class:`FixedCohort` (public, no amplification) or :class:`MinSeparation`
  (a public ``(k, b)`` schedule, for correlated noise);
* ``clipping`` (:mod:`swarmjax.privacy.clipping`): fixed, or adaptive with its noised count;
* ``noise`` (:mod:`swarmjax.privacy.noise`): i.i.d. Gaussian (snapped or float) or DP-FTRL's
  matrix-factorization noise (with state).

Its numbers per variant are a :class:`PlanHyper` (vmappable: ``sample_rate``,
``noise_multiplier``, ``count_noise``, the clip's ``initial_clip``, ``target_quantile``,
``clip_lr``); :meth:`UserLevelDP.privacy_plan` states the run's
:class:`~swarmjax.privacy.plan.PrivacyPlan`, whose ONE dp-accounting event calibrates the
noise (:meth:`UserLevelDP.resolve`) and is what the privacy record and the ledger compose.

The sum and the count are one Gaussian mechanism of multiplier
``z = (sigma_Delta^-2 + k (2 sigma_b)^-2)^(-1/2)`` per accounted event (``k`` counts of one
client in it: 1 per round under Poisson and fixed cohorts, ``k`` for the whole run under
min-separation); fixed clipping makes no count and ``sigma_Delta = z``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree

from swarmjax._validation import check_int, check_range, stored
from swarmjax.privacy.accounting import Rates
from swarmjax.privacy.clipping import (
    AdaptiveClipping,
    FixedClipping,
    adapted_clip,
    clip_update,
    default_count_noise,
    sum_noise_multiplier,
)
from swarmjax.privacy.ftrl import Strategy, build_strategy, check_schedule
from swarmjax.privacy.noise import CorrelatedNoise, GaussianNoise
from swarmjax.privacy.participation import FixedCohort, MinSeparation, Poisson
from swarmjax.privacy.plan import PrivacyPlan, check_delta, default_delta, draw_overflow

if TYPE_CHECKING:
    from swarmjax.privacy.ledger import Release

__all__ = ["ClippedUpdate", "PlanHyper", "PlanState", "UserLevelDP"]


@flax.struct.dataclass
class ClippedUpdate:
    """What a client sends under a user-level plan: its update clipped to ``C_t`` and,
    under adaptive clipping, its bit ``1[||Delta|| <= C_t]`` (``None`` otherwise)."""

    update: PyTree
    unclipped: Float[Array, ""] | None = None


@flax.struct.dataclass
class PlanHyper:
    """The plan's numbers for one variant (vmappable; a leading variant axis in a grid).

    Attributes:
        sample_rate: Poisson rate ``q`` (``1`` for public cohorts).
        noise_multiplier: the accounted ``z`` (per round, or of the whole run under
            min-separation).
        count_noise: ``sigma_b``, std of each round's count (``0``: fixed clipping; NaN
            until :meth:`UserLevelDP.resolve` picks the default).
        initial_clip: ``C_0`` (the clip norm throughout under fixed clipping).
        target_quantile: ``gamma`` of adaptive clipping.
        clip_lr: ``eta_C`` of adaptive clipping (``0`` for fixed).
        participations: ``k``, counts of one client in one accounted event.
        schedule: ``(T, m)`` int32 public cohorts (min-separation), else ``None``.
        strategy: the factorization (correlated noise), else ``None``.
    """

    sample_rate: Float[Array, ""]
    noise_multiplier: Float[Array, ""]
    count_noise: Float[Array, ""]
    initial_clip: Float[Array, ""]
    target_quantile: Float[Array, ""]
    clip_lr: Float[Array, ""]
    participations: Float[Array, ""]
    schedule: Int[Array, "T m"] | None = None
    strategy: Strategy | None = None


@flax.struct.dataclass
class PlanState:
    """The plan's part of the server state: ``C_t``, the noised unclipped fraction of the
    last round (NaN under fixed clipping), the rounds done, the accounted ``(q, z)``, the
    noise's state (a BLT's buffers; ``()`` for i.i.d. noise) and the public schedule."""

    clip: Float[Array, ""]
    noisy_unclipped_fraction: Float[Array, ""]
    rounds: Int[Array, ""]
    sample_rate: Float[Array, ""]
    noise_multiplier: Float[Array, ""]
    noise: PyTree = ()
    schedule: Int[Array, "T m"] | None = None


_f32 = partial(jnp.asarray, dtype=jnp.float32)


@dataclass(frozen=True)
class UserLevelDP:
    """User-level central DP: participation, clipping, noise and their accounting (static
    settings; hashable).

    Attributes:
        participation: :class:`~swarmjax.privacy.participation.Poisson` (default),
            :class:`~swarmjax.privacy.participation.FixedCohort` or
            :class:`~swarmjax.privacy.participation.MinSeparation`.
        clipping: :class:`~swarmjax.privacy.clipping.AdaptiveClipping` (default) or
            :class:`~swarmjax.privacy.clipping.FixedClipping`.
        noise: :class:`~swarmjax.privacy.noise.GaussianNoise` (default, snapped) or
            :class:`~swarmjax.privacy.noise.CorrelatedNoise` (needs ``MinSeparation``).
        noise_cohort: pfl's ``noise_cohort_size`` (public cohorts only): calibrate the
            noise for a deployment with cohorts of ``noise_cohort > m`` clients; the noise
            on this run's sum is ``m / noise_cohort`` of that deployment's. The epsilon then
            holds ONLY for that deployment, never for this run; the record says so.
    """

    participation: Poisson | FixedCohort | MinSeparation = field(default_factory=Poisson)
    clipping: AdaptiveClipping | FixedClipping = field(default_factory=AdaptiveClipping)
    noise: GaussianNoise | CorrelatedNoise = field(default_factory=GaussianNoise)
    noise_cohort: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.participation, Poisson | FixedCohort | MinSeparation):
            raise ValueError(
                "participation must be Poisson, FixedCohort or MinSeparation; got "
                f"{type(self.participation).__name__}"
            )
        if not isinstance(self.clipping, AdaptiveClipping | FixedClipping):
            raise ValueError(
                "clipping must be AdaptiveClipping or FixedClipping; got "
                f"{type(self.clipping).__name__}"
            )
        if not isinstance(self.noise, GaussianNoise | CorrelatedNoise):
            raise ValueError(
                f"noise must be GaussianNoise or CorrelatedNoise; got {type(self.noise).__name__}"
            )
        if self.noise.correlated and not isinstance(self.participation, MinSeparation):
            raise ValueError(
                "noise=CorrelatedNoise needs participation=MinSeparation (its sensitivity is "
                f"that of a (k, b) schedule); got {type(self.participation).__name__}"
            )
        if isinstance(self.participation, MinSeparation) and not self.noise.correlated:
            raise ValueError(
                "participation=MinSeparation takes noise=CorrelatedNoise (a min-separation "
                "schedule has no Poisson amplification; use FixedCohort for i.i.d. noise)"
            )
        if self.noise_cohort is not None:
            cohort = self.participation.public_cohort
            if cohort is None:
                raise ValueError(
                    "noise_cohort needs a public cohort (FixedCohort or MinSeparation): a "
                    "Poisson cohort's size is secret; got participation=Poisson"
                )
            if check_int("noise_cohort", self.noise_cohort, 1) <= cohort:
                raise ValueError(
                    f"noise_cohort must be > cohort ({cohort}): the simulated deployment's "
                    f"cohort; None for this run's own guarantee; got {self.noise_cohort}"
                )

    # ------------------------------------------------------------------ host side

    @property
    def adaptive(self) -> bool:
        """Whether the clip norm adapts (a count query each round)."""
        return self.clipping.adaptive

    @property
    def noise_scale(self) -> float:
        """Factor on this run's noise: ``m / noise_cohort`` (1 without ``noise_cohort``)."""
        if self.noise_cohort is None:
            return 1.0
        return self.participation.public_cohort / self.noise_cohort

    def privacy_plan(self, num_clients: int, sample_rate: float, spec: Any) -> PrivacyPlan:
        """The run's client-level :class:`~swarmjax.privacy.plan.PrivacyPlan` (``spec``:
        rounds, delta and accountant, a :class:`~swarmjax.fl.protocol.RunSpec`); its event
        calibrates the noise and is what the record composes."""
        check_delta(spec.delta)
        return self.participation.plan(
            num_clients, sample_rate, spec.rounds, spec.delta, spec.accountant
        )

    def strategy(self, num_clients: int, rounds: int) -> Strategy:
        """The factorization's strategy and sensitivity for the run (jax-privacy; cached)."""
        return build_strategy(
            self.noise.factorization,
            self.participation.scheme(num_clients, rounds),
            bands=self.noise.bands,
            buffers=self.noise.buffers,
        )

    def default_hyper(self, num_clients: int, rounds: int) -> PlanHyper:
        """``q = 0.1`` (Poisson; 1 for public cohorts), ``z = 1``, ``C_0 = 0.1``,
        ``gamma = 0.5``, ``eta_C = 0.2``, ``sigma_b`` NaN (:meth:`resolve` then takes
        :func:`~swarmjax.privacy.clipping.default_count_noise`); the schedule and the
        strategy of a min-separation run."""
        p = self.participation
        schedule = strategy = None
        if isinstance(p, MinSeparation):
            schedule = jnp.asarray(p.schedule_for(num_clients, rounds))
            strategy = self.strategy(num_clients, rounds)
        return PlanHyper(
            sample_rate=_f32(0.1 if isinstance(p, Poisson) else 1.0),
            noise_multiplier=_f32(1.0),
            count_noise=_f32(jnp.nan),
            initial_clip=_f32(0.1),
            target_quantile=_f32(0.5),
            clip_lr=_f32(0.2),
            participations=_f32(p.participations(num_clients, rounds)),
            schedule=schedule,
            strategy=strategy,
        )

    def resolve(
        self, hyper: PlanHyper, num_clients: int, spec: Any, epsilon_target: float | None
    ) -> PlanHyper:
        """One variant's final numbers, every value checked as stored (float32) before any
        work: a finite ``epsilon_target`` sets ``z`` through the run's plan (its ONE event,
        overflow charged); a NaN ``count_noise`` becomes the default; fixed clipping makes
        no count (``sigma_b = 0``, ``eta_C = 0``); a schedule is checked against the
        scheme."""
        n = check_int("num_clients", num_clients, 1)
        p = self.participation
        q = check_range("sample_rate", stored(hyper.sample_rate), 0.0, 1.0, low_open=True)
        if not isinstance(p, Poisson) and q != 1.0:
            raise ValueError(
                f"sample_rate applies to Poisson participation only ({type(p).__name__} draws "
                f"a public cohort); got sample_rate={q}"
            )
        plan = self.privacy_plan(n, q, spec)
        plan.check_capacity()
        if isinstance(p, MinSeparation):
            check_schedule(hyper.schedule, n, plan.scheme)
            if hyper.schedule.shape[1] != p.cohort:
                raise ValueError(
                    f"schedule must have cohort={p.cohort} columns; got {hyper.schedule.shape}"
                )
        k = p.participations(n, spec.rounds)
        z = stored(hyper.noise_multiplier)
        if epsilon_target is not None and math.isfinite(epsilon_target):
            z = plan.calibrate(epsilon_target).noise_multiplier
        check_range("noise_multiplier", z, 0.0, math.inf, high_open=True)
        b = stored(hyper.count_noise)
        cohort = q * n if p.public_cohort is None else p.public_cohort
        b = default_count_noise(cohort, z, k) if math.isnan(b) else b
        check_range("count_noise", b, 0.0, math.inf, high_open=True)
        inf = math.inf
        check_range("clip", stored(hyper.initial_clip), 0.0, inf, low_open=True, high_open=True)
        gamma = stored(hyper.target_quantile)
        check_range("target_quantile", gamma, 0.0, 1.0, low_open=True, high_open=True)
        clip_lr = check_range("clip_lr", stored(hyper.clip_lr), 0.0, math.inf, high_open=True)
        if not self.adaptive:
            b, clip_lr = 0.0, 0.0
        elif z > 0 and not float(2.0 * (jnp.float32(b) / jnp.sqrt(jnp.float32(k)))) > stored(z):
            need = "noise_multiplier / 2" if k == 1 else "noise_multiplier * sqrt(k) / 2"
            raise ValueError(
                f"count_noise must be > {need} for adaptive clipping (as float32; k={k} counts "
                f"per client); got count_noise={b!r}, noise_multiplier={z!r}"
            )
        strategy = hyper.strategy
        if isinstance(p, MinSeparation):
            strategy = self.strategy(n, spec.rounds)
        return hyper.replace(
            noise_multiplier=_f32(z),
            count_noise=_f32(b),
            clip_lr=_f32(clip_lr),
            participations=_f32(k),
            strategy=strategy,
        )

    def overflow(self, sample_rate: np.ndarray, num_clients: int) -> np.ndarray | None:
        """Per-round chance that the Poisson draw of clients (rate ``sample_rate``, any
        shape) exceeds the buffer and is redrawn, counted for ``N + 1`` candidates (an upper
        bound for both zero-out neighbours, which have ``N``:
        :func:`~swarmjax.privacy.plan.draw_overflow`, what the plan charges); ``None`` when
        no draw can overflow."""
        cap = getattr(self.participation, "capacity", None)
        if not isinstance(self.participation, Poisson) or cap is None or cap > num_clients:
            return None
        q = np.asarray(sample_rate, np.float64)
        probs = {
            v: draw_overflow("client", num_clients, v, cap) if v > 0 else 0.0
            for v in set(q.ravel().tolist())
        }
        return np.vectorize(probs.__getitem__, otypes=[np.float64])(q)

    def describe(self, num_clients: int | None = None) -> str:
        """One line for the privacy record: participation, clipping, noise and, with
        ``noise_cohort``, the simulated deployment the epsilon belongs to."""
        n = 0 if num_clients is None else num_clients
        line = (
            f"{self.clipping.describe()}; {self.noise.describe()} of "
            f"{self.participation.describe(n)} (z: "
            + (
                "the whole run as one Gaussian mechanism, sensitivity of C for that scheme)"
                if isinstance(self.participation, MinSeparation)
                else "each round a Gaussian step)"
            )
        )
        if self.noise_cohort is not None:
            m = self.participation.public_cohort
            line += (
                f"; NOISE CALIBRATED FOR A SIMULATED COHORT OF {self.noise_cohort} CLIENTS "
                f"(noise_cohort): epsilon holds only for a deployment with cohorts of "
                f"{self.noise_cohort}; this run trained cohorts of {m} with "
                f"{m}/{self.noise_cohort} of that noise and has no such guarantee"
            )
        return line

    def count_note(self) -> str:
        """The count's line in the privacy record."""
        return "0/1 bit, summed with N(0, sigma_b^2) each round (part of z)"

    def floating_point(self) -> str:
        """What the exact released values reveal beyond epsilon (docs/floating_point.md)."""
        return self.noise.floating_point()

    # ------------------------------------------------------------------ what a record says

    @staticmethod
    def delta_for(num_clients: int, delta: float | None = None) -> float:
        """The delta of a user-level guarantee over ``num_clients`` clients: ``delta``
        checked (a one-line ``ValueError`` outside ``(0, 1)``), else
        :func:`~swarmjax.privacy.plan.default_delta` of the clients (the plan's unit is the
        client, so its default counts clients, never records). A static method: a run's
        :class:`~swarmjax.fl.protocol.RunSpec` needs it before any plan is built.

        Example: ``UserLevelDP.delta_for(1200)`` -> ``1e-5``;
        ``UserLevelDP.delta_for(1200, 1 / 1200)`` -> ``1 / 1200``."""
        n = check_int("num_clients", num_clients, 1)
        return default_delta(n) if delta is None else check_delta(delta)

    @property
    def own_guarantee(self) -> bool:
        """Whether the accounted epsilon is this run's own guarantee: ``False`` under
        ``noise_cohort``, whose epsilon belongs to a simulated deployment only."""
        return self.noise_cohort is None

    def guarantee(self) -> str:
        """What the accounted epsilon covers, in one line for a summary: ``"this run's own
        (user-level)"``, or, under ``noise_cohort``, a guarantee that ``"holds ONLY for a
        deployment with cohorts of M clients"`` and that this run lacks."""
        if self.own_guarantee:
            return "this run's own (user-level)"
        m, big = self.participation.public_cohort, self.noise_cohort
        return (
            f"holds ONLY for a deployment with cohorts of {big} clients (noise_cohort={big}); "
            f"this run trained cohorts of {m} with {m}/{big} of that noise and has no such "
            "guarantee"
        )

    def released(self, release: Release) -> Release:
        """``release`` (a :class:`~swarmjax.privacy.ledger.Release` of a run under this
        plan) as a privacy ledger must list it: unchanged when the epsilon is the run's own;
        under ``noise_cohort`` with no epsilon covering it (``inf``: listed, never composed)
        and the deployment's epsilon and :meth:`guarantee` kept in its ``variant``
        (``deployment_epsilon``, ``guarantee``), so a composed statement claims nothing the
        run lacks."""
        if self.own_guarantee:
            return release
        deployment = {"deployment_epsilon": release.epsilon, "guarantee": self.guarantee()}
        return dataclasses.replace(
            release, epsilon=math.inf, variant={**release.variant, **deployment}
        )

    def settings(self, num_clients: int, rounds: int) -> dict[str, Any]:
        """The plan's settings as a summary row states them (flat; JSON-able values):
        ``participation`` (its name) and its fields (a fixed cohort's ``size`` as
        ``cohort``; a min-separation's ``min_separation`` ``b`` and ``max_participations``
        ``k`` as they hold for ``num_clients`` and ``rounds``), ``clipping`` (``"fixed"`` or
        ``"adaptive"``), ``noise`` (``"gaussian"`` or ``"correlated"``) and its fields (a
        Gaussian's ``release`` as ``noise_release``), and ``noise_cohort``. Keys of a
        strategy the plan does not use are absent (no ``factorization`` under Gaussian
        noise)."""
        rename = {"size": "cohort", "release": "noise_release"}

        def fields(obj: Any) -> dict[str, Any]:
            return {
                rename.get(f.name, f.name): getattr(obj, f.name) for f in dataclasses.fields(obj)
            }

        p = self.participation
        out: dict[str, Any] = {"participation": p.name, **fields(p)}
        if isinstance(p, MinSeparation):
            scheme = p.scheme(num_clients, rounds)
            out.update(
                min_separation=scheme.min_separation, max_participations=scheme.participations
            )
        out["clipping"] = "adaptive" if self.adaptive else "fixed"
        out["noise"] = "correlated" if self.noise.correlated else "gaussian"
        out.update(fields(self.noise))
        out["noise_cohort"] = self.noise_cohort
        return out

    def sum_noise(self, hyper: PlanHyper) -> Array:
        """The multiplier of the noise :meth:`release` adds to the sum, over ``C_t`` (any
        variant axis kept): ``z`` under fixed clipping; under adaptive clipping
        ``sigma_Delta`` of ``z`` and the count's std per accounted event
        (:func:`~swarmjax.privacy.clipping.sum_noise_multiplier`); times
        :attr:`noise_scale` (``m / noise_cohort``)."""
        z = jnp.asarray(hyper.noise_multiplier, jnp.float32)
        if self.adaptive:
            per_event = hyper.count_noise / jnp.sqrt(hyper.participations)
            z = sum_noise_multiplier(z, per_event)
        return z * jnp.float32(self.noise_scale)

    # ------------------------------------------------------------------ device side

    def init(self, hyper: PlanHyper, like: PyTree) -> PlanState:
        """The plan's server state before round 1 (``like``: the update's pytree)."""
        return PlanState(
            clip=_f32(hyper.initial_clip),
            noisy_unclipped_fraction=_f32(jnp.nan),  # no count made yet
            rounds=jnp.zeros((), jnp.int32),
            sample_rate=hyper.sample_rate,
            noise_multiplier=hyper.noise_multiplier,
            noise=self.noise.init(hyper.strategy, like),
            schedule=hyper.schedule,
        )

    def select(self, state: PlanState, key: PRNGKeyArray, n: int) -> Bool[Array, " N"]:
        """``(N,)`` the clients of this round."""
        return self.participation.select(state, key, n)

    def clip(self, delta: PyTree, clip: Float[Array, ""]) -> ClippedUpdate:
        """A client's reply for raw update ``delta``: clipped to ``clip`` (a non-finite
        update becomes zeros), with its bit under adaptive clipping."""
        clipped, norm, _ = clip_update(delta, clip)
        bit = (norm <= clip).astype(jnp.float32) if self.adaptive else None
        return ClippedUpdate(update=clipped, unclipped=bit)

    def release(
        self,
        state: PlanState,
        total: ClippedUpdate,
        mask: Bool[Array, " S"],
        key: PRNGKeyArray,
        hyper: PlanHyper,
        num_clients: int,
    ) -> tuple[PyTree, Float[Array, ""], PlanState]:
        """The round's private release from ``total`` (the selected replies' sum over ``S``
        slots): ``(noised sum, public denominator, next state)``. The denominator is the
        expected cohort ``q N`` (Poisson: the realised count is secret) or the public ``m``.
        Adaptive clipping also releases the noised count and moves ``C_t``."""
        k_sum, k_count = jax.random.split(key)
        scale = jnp.float32(self.noise_scale)
        slots = mask.shape[0]
        # every coordinate of the clipped sum lies within S * C_t (S reply slots)
        multiplier = self.sum_noise(hyper)
        noised, noise = self.noise.add(
            k_sum, total.update, state.clip, multiplier, slots, state.noise, hyper.strategy
        )
        denominator = self.participation.denominator(hyper.sample_rate, num_clients)
        clip, below = state.clip, state.noisy_unclipped_fraction
        if self.adaptive:
            # sum over the replying slots of (bit - 1/2): exact in float32 (halves)
            centred = total.unclipped - 0.5 * jnp.sum(mask).astype(jnp.float32)
            # sensitivity 1/2 per client, noise std sigma_b; |centred| <= S / 2
            count = self.noise.release_count(k_count, centred, hyper.count_noise * scale, slots / 2)
            below = count / denominator + 0.5
            clip = adapted_clip(clip, below, hyper.target_quantile, hyper.clip_lr)
        state = state.replace(
            clip=clip, noisy_unclipped_fraction=below, rounds=state.rounds + 1, noise=noise
        )
        return noised, denominator, state

    def accounted_steps(self, state: PlanState) -> Int[Array, ""]:
        """Accounted steps so far (int32 ``()``): the rounds done under Poisson sampling or
        a fixed cohort; min-separation charges its whole-run event from the first round on,
        ``min(rounds, 1)`` (each prefix is a post-processing of the whole)."""
        if isinstance(self.participation, Poisson | FixedCohort):
            return state.rounds
        return jnp.minimum(state.rounds, 1)

    def rates(self, hyper: PlanHyper, num_clients: int) -> Rates:
        """Host side: what the privacy record composes with :meth:`accounted_steps`, for
        runs of ``hyper`` (leading run axis ``R``; its dtype, float32 in a run): the
        accounted ``(q, z)`` of every client ``(R, N)`` (Poisson ``(q, z)``, a public
        cohort ``(1, z)``) and the per-round :meth:`overflow` of the draw of clients,
        ``(R, 1, N)`` or ``None``; no other release."""
        z = np.asarray(hyper.noise_multiplier).reshape(-1, 1)
        q = np.asarray(hyper.sample_rate).reshape(-1, 1)
        if not isinstance(self.participation, Poisson):
            q = np.ones(z.shape, z.dtype)
        q, z = np.repeat(q, num_clients, axis=1), np.repeat(z, num_clients, axis=1)
        over = self.overflow(q, num_clients)
        return Rates(q, z, None if over is None else over[:, None, :])

    def metrics(self, state: PlanState) -> dict[str, Array]:
        """Public metrics of the plan: ``clip_norm`` and, adaptive, the noised unclipped
        fraction (both released)."""
        out = {"clip_norm": state.clip}
        if self.adaptive:
            out["noisy_unclipped_fraction"] = state.noisy_unclipped_fraction
        return out

    def check_canaries(self) -> None:
        """One-line ``ValueError`` unless client-level canaries can audit this plan."""
        if self.noise_cohort is not None:
            raise ValueError(
                f"audit needs the run's own guarantee: noise_cohort={self.noise_cohort} "
                "calibrates the noise for another deployment, whose epsilon this run lacks"
            )
        if isinstance(self.participation, MinSeparation):
            self.participation.check_canaries()
