"""User-level DP-FTRL with matrix-factorization noise (Kairouz et al. 2021; Choquette-Choo
et al. 2023; the buffered-Toeplitz mechanisms of Dvijotham et al. 2024), on the protocol;
the strategies, their sensitivity and the streaming noise come from jax-privacy through
:mod:`swarmjax.privacy.ftrl`. ``docs/dp_ftrl.md`` has the algebra and the privacy argument.

One exchange per round ``t = 1..T``:

* ``select``: the public cohort of round ``t``, row ``t`` of the schedule fixed before
  training (:func:`~swarmjax.privacy.ftrl.cohort_schedule`: ``m`` clients, each client at
  most ``k`` times at least ``b`` rounds apart; checked before any work).
* ``request``: the global model ``w_t`` and the clip norm ``C_t``.
* ``client``: local training from ``w_t``; the update clipped to ``C_t`` and, under adaptive
  clipping, the bit ``1[||Delta|| <= C_t]`` (the same client as DP-FedAvg).
* ``aggregate``: ``x_t`` = the sum of the cohort's clipped updates; the server releases
  ``x_t + C_t s (C^{-1} z)_t`` with ``z ~ N(0, I)`` (``s = sigma_Delta sens``, ``sens`` the
  factorization's ``(k, b)``-min-separation sensitivity), divides by the public cohort
  size ``m`` and takes a server-optimiser step; adaptive clipping adds the noised count
  ``sum (bit - 1/2) + N(0, sigma_b^2)`` each round and moves ``C_t`` as DP-FedAvg does.

Accounting: the sums are one Gaussian mechanism over the run (multiplier ``sigma_Delta``)
and the counts ``k`` participations of an independent Gaussian (sensitivity ``1/2``, std
``sigma_b``), so the run is ONE Gaussian mechanism of multiplier
``z = (sigma_Delta^-2 + k (2 sigma_b)^-2)^(-1/2)``, the accounted ``noise_multiplier``
(:meth:`~swarmjax.privacy.plan.PrivacyPlan.min_separation_cohorts`). Every client is
charged that whole-run event from the first round on (each prefix of the run is a
post-processing of the whole release).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import partial
from typing import ClassVar, Literal

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree

from swarmjax._validation import check_choice, check_int, check_range, stored
from swarmjax.fl.algorithms.client_level_dp_fedavg import (
    FLOAT_RELEASE,
    ClientLevelDPFedAvg,
    ClientUpdate,
    Clipping,
    adapted_clip,
    advance_server,
    check_client_level,
    check_clipping_hyper,
    sum_noise_multiplier,
)
from swarmjax.fl.algorithms.common import Trainer
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data.clients import ClientData
from swarmjax.fl.protocol import (
    Algorithm,
    Exchange,
    Protection,
    RunSpec,
    Slots,
    Spend,
    SummedAggregate,
)
from swarmjax.models import Model
from swarmjax.privacy.canaries import CanaryHook
from swarmjax.privacy.ftrl import (
    FACTORIZATIONS,
    SCHEDULES,
    Participation,
    Strategy,
    build_strategy,
    check_schedule,
    cohort_ids,
    cohort_schedule,
    correlated_noise,
    noise_state,
)
from swarmjax.privacy.mechanisms import gaussian_mechanism
from swarmjax.privacy.plan import PrivacyPlan

__all__ = ["DPFTRL", "DPFTRLHyper", "DPFTRLServer", "default_ftrl_count_noise"]

Schedule = Literal["cyclic", "random", "single"]
Factorization = Literal["blt", "banded", "prefix-sum"]
COUNT = Protection(
    "accounted", "client", "0/1 bit, summed with N(0, sigma_b^2) each round (part of z)"
)


def default_ftrl_count_noise(cohort: int, noise_multiplier: float, participations: int) -> float:
    """``sigma_b = max(m / 20, z sqrt(k))``: Andrew et al.'s ``m / 20`` (``m`` the cohort),
    raised so that the count takes at most a quarter of the privacy budget
    (``2 sigma_b / sqrt(k) >= 2 z``, whereas the count needs ``> z``)."""
    return max(0.05 * cohort, float(noise_multiplier) * math.sqrt(participations))


@flax.struct.dataclass
class DPFTRLHyper:
    """Numeric hyper-parameters of one variant (vmappable).

    ``client_lr``, ``server_lr``; ``noise_multiplier`` ``z`` (the accounted multiplier of the
    whole run); ``count_noise`` ``sigma_b`` (std of each round's count noise; NaN until
    :meth:`DPFTRL.resolve`); ``initial_clip`` ``C_0``; ``target_quantile`` ``gamma``;
    ``clip_lr`` ``eta_C`` (0 for fixed clipping); ``participations``: ``k`` of the scheme
    (set by :meth:`DPFTRL.resolve`); ``schedule``: ``(T, m)`` int32 public cohorts;
    ``strategy``: the factorization's :class:`~swarmjax.privacy.ftrl.Strategy`.
    """

    client_lr: Float[Array, ""]
    server_lr: Float[Array, ""]
    noise_multiplier: Float[Array, ""]
    count_noise: Float[Array, ""]
    initial_clip: Float[Array, ""]
    target_quantile: Float[Array, ""]
    clip_lr: Float[Array, ""]
    participations: Float[Array, ""]
    schedule: Int[Array, "T m"]
    strategy: Strategy


@flax.struct.dataclass
class DPFTRLServer:
    """Global model, server optimiser state, ``C_t``, the noised unclipped fraction of the
    last round (NaN under fixed clipping), the rounds done, the accounted ``z``, the noise
    generator's state (a BLT's buffers, a band's last noises: fixed size, independent of
    the rounds) and the public ``(T, m)`` schedule."""

    params: PyTree
    opt_state: PyTree
    clip: Float[Array, ""]
    noisy_unclipped_fraction: Float[Array, ""]
    rounds: Int[Array, ""]
    noise_multiplier: Float[Array, ""]
    noise: PyTree
    schedule: Int[Array, "T m"]


@dataclass(frozen=True)
class DPFTRL(SummedAggregate, Algorithm):
    """User-level DP-FTRL (static settings; hashable).

    Attributes:
        model: the ``(init, apply)`` pair.
        cohort: ``m``, clients per round (fixed, public).
        min_separation: ``b``, fewest rounds between two participations of a client
            (``1``: consecutive rounds allowed); ``None``: ``min(N // m, T)``, the most the
            cohort allows. Must be ``None`` for ``schedule="single"``.
        max_participations: ``k`` cap; ``None``: as many as fit (``ceil(T / b)``).
        schedule: ``"cyclic"`` (default), ``"random"`` or ``"single"``
            (:data:`~swarmjax.privacy.ftrl.SCHEDULES`); the run refuses a schedule that
            breaks the scheme before any work.
        factorization: ``"blt"`` (default), ``"banded"`` or ``"prefix-sum"``
            (:data:`~swarmjax.privacy.ftrl.FACTORIZATIONS`).
        bands: ``"banded"``: bands (``<= b``; ``None``: ``min(b, 32)``).
        buffers: ``"blt"``: buffers (``None``: jax-privacy chooses up to 10).
        training: local training (no record-level DP: the unit is the client).
        clipping: ``"fixed"`` or ``"adaptive"`` (default, as DP-FedAvg).
        noise_cohort: pfl's ``noise_cohort_size``: calibrate the noise for a deployment
            with cohorts of ``noise_cohort > m`` clients (the noise on this run's sum is
            ``m / noise_cohort`` of that deployment's). The epsilon then holds ONLY for a
            deployment of that cohort size, never for this run; the privacy record says so.
            ``None`` (default): the noise of this run's own guarantee.
        schedule_seed: the public seed of the schedule.
        server_momentum: momentum of the server SGD (0: plain step).
        eval_batch_size: chunk size of the test evaluation.
    """

    model: Model
    cohort: int
    min_separation: int | None = None
    max_participations: int | None = None
    schedule: Schedule = "cyclic"
    factorization: Factorization = "blt"
    bands: int | None = None
    buffers: int | None = None
    training: LocalTraining = field(default_factory=lambda: LocalTraining(batch_size=10))
    clipping: Clipping = "adaptive"
    noise_cohort: int | None = None
    schedule_seed: int = 0
    server_momentum: float = 0.0
    eval_batch_size: int | None = None

    privacy_unit: ClassVar[str] = "client"

    def __post_init__(self) -> None:
        check_int("cohort", self.cohort, 1)
        check_choice("schedule", self.schedule, SCHEDULES)
        check_choice("factorization", self.factorization, FACTORIZATIONS)
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
        if self.noise_cohort is not None and check_int("noise_cohort", self.noise_cohort, 1) <= (
            self.cohort
        ):
            raise ValueError(
                f"noise_cohort must be > cohort ({self.cohort}): the simulated deployment's "
                f"cohort; None for this run's own guarantee; got {self.noise_cohort}"
            )
        check_int("schedule_seed", self.schedule_seed, 0)

    # ------------------------------------------------------------------ the scheme

    def participation(self, num_clients: int, rounds: int) -> Participation:
        """The ``(k, b)``-min-separation scheme of a run of ``rounds`` rounds over
        ``num_clients`` clients (one-line ``ValueError`` naming the option when it cannot
        hold)."""
        n, t = check_int("num_clients", num_clients, 1), check_int("rounds", rounds, 1)
        if self.cohort > n:
            raise ValueError(f"cohort must be <= num_clients ({n}); got {self.cohort}")
        if self.schedule == "single":
            return Participation.single(t)
        b = min(n // self.cohort, t) if self.min_separation is None else self.min_separation
        return Participation(t, b, self.max_participations)

    def plan(self, num_clients: int, spec: RunSpec) -> PrivacyPlan:
        """The client-level min-separation :class:`~swarmjax.privacy.plan.PrivacyPlan` of a
        run: cohorts of ``m`` of ``N`` clients over ``spec.rounds`` rounds, ``k`` and ``b``
        of :meth:`participation`, at ``spec.delta`` by ``spec.accountant``."""
        p = self.participation(num_clients, spec.rounds)
        return PrivacyPlan.min_separation_cohorts(
            "client",
            num_clients,
            self.cohort,
            p.rounds,
            p.min_separation,
            p.max_participations,
            spec.delta,
            spec.accountant,
        )

    def strategy(self, num_clients: int, rounds: int) -> Strategy:
        """The factorization's strategy and sensitivity for the run (jax-privacy; cached)."""
        return build_strategy(
            self.factorization,
            self.participation(num_clients, rounds),
            bands=self.bands,
            buffers=self.buffers,
        )

    def cohorts(self, num_clients: int, rounds: int) -> Array:
        """The public ``(T, m)`` int32 schedule (checked against the scheme)."""
        p = self.participation(num_clients, rounds)
        s = cohort_schedule(self.schedule, num_clients, self.cohort, p, self.schedule_seed)
        return jnp.asarray(s)

    @property
    def noise_scale(self) -> float:
        """Factor on this run's noise: ``m / noise_cohort`` (1 without ``noise_cohort``)."""
        return 1.0 if self.noise_cohort is None else self.cohort / self.noise_cohort

    def mechanism_note(self) -> str:
        """One line naming the scheme, ``k``, ``b``, the factorization and, with
        ``noise_cohort``, the simulated deployment (the privacy record's line)."""
        b = "min(N // m, T)" if self.min_separation is None else str(self.min_separation)
        k = "ceil(T / b)" if self.max_participations is None else str(self.max_participations)
        if self.schedule == "single":
            b, k = "T", "1"
        line = (
            f"clipped to C_t by the client; the server adds correlated noise of the "
            f"{self.factorization!r} matrix factorization (jax-privacy) to the sum of a "
            f"{self.schedule!r} public schedule of cohorts of {self.cohort}, each client at most "
            f"k={k} times at least b={b} rounds apart (z: the whole run as one Gaussian "
            "mechanism, sensitivity of C for that scheme)"
        )
        if self.noise_cohort is not None:
            line += (
                f"; NOISE CALIBRATED FOR A SIMULATED COHORT OF {self.noise_cohort} CLIENTS "
                f"(noise_cohort): epsilon holds only for a deployment with cohorts of "
                f"{self.noise_cohort}; this run trained cohorts of {self.cohort} with "
                f"{self.cohort}/{self.noise_cohort} of that noise and has no such guarantee"
            )
        return line

    # ------------------------------------------------------------------ device side

    @property
    def exchanges(self) -> tuple[Exchange, ...]:
        """One exchange a round: the public cohort (``max_selected = m``; the selection is
        public, so released byte counts use the realised cohort)."""
        protection = {"update": Protection("accounted", "client", self.mechanism_note())}
        if self.clipping == "adaptive":
            protection["unclipped"] = COUNT
        clients = self._clients  # DP-FedAvg's request and clients
        steps = (self.select, clients.request, clients.client, self.aggregate)
        return (
            Exchange(
                "train",
                *steps,
                protection,
                max_selected=self.cohort,
                aggregate_sum=self.aggregate_sum,
            ),
        )

    @property
    def _clients(self) -> ClientLevelDPFedAvg:
        """DP-FedAvg with these client settings: DP-FTRL's request, clients (local training,
        clipping, the bit), server optimiser and public metrics are DP-FedAvg's."""
        return ClientLevelDPFedAvg(
            self.model,
            self.training,
            self.clipping,
            server_momentum=self.server_momentum,
            eval_batch_size=self.eval_batch_size,
        )

    def _server_optimizer(self, server_lr: Array) -> optax.GradientTransformation:
        return self._clients._server_optimizer(server_lr)

    def server_init(self, key: PRNGKeyArray, hyper: DPFTRLHyper) -> DPFTRLServer:
        params = self.model.init(key)
        f32 = partial(jnp.asarray, dtype=jnp.float32)
        return DPFTRLServer(
            params,
            self._server_optimizer(hyper.server_lr).init(params),
            f32(hyper.initial_clip),
            f32(jnp.nan),  # no count made yet
            jnp.zeros((), jnp.int32),
            hyper.noise_multiplier,
            noise_state(hyper.strategy, params),
            hyper.schedule,
        )

    def client_init(
        self, key: PRNGKeyArray, data: ClientData, hyper: DPFTRLHyper, client_id: Int[Array, ""]
    ) -> Trainer:
        return self._clients.client_init(key, data, hyper, client_id)

    def select(self, server: DPFTRLServer, key: PRNGKeyArray, n: int) -> Bool[Array, " N"]:
        """Row ``rounds`` of the public schedule (nobody after the last scheduled round)."""
        del key
        t = server.schedule.shape[0]
        ids = cohort_ids(server.schedule, jnp.minimum(server.rounds, t - 1))
        return jnp.zeros(n, bool).at[ids].set(server.rounds < t)

    def _sum_multiplier(self, hyper: DPFTRLHyper) -> Array:
        """``sigma_Delta``: ``z`` under fixed clipping; with adaptive clipping the part of
        ``z`` left to the sums once the ``k`` counts take theirs."""
        if self.clipping != "adaptive":
            return hyper.noise_multiplier
        per_run = hyper.count_noise / jnp.sqrt(hyper.participations)
        return sum_noise_multiplier(hyper.noise_multiplier, per_run)

    def canary_hook(self) -> CanaryHook:
        """Client-level canaries (:mod:`swarmjax.privacy.canaries`) by this run's scheme:
        canary ``i`` holds the public slots ``r = (i mod b) + j b`` (0-based rounds,
        ``j < k``), so like any client it takes part at most ``k`` times, exactly ``b``
        rounds apart (``"single"``: once, at round ``i mod T``); only canaries whose secret
        coin is in take their slots.  The factorization's sensitivity is the largest over
        every pattern the ``(k, b)`` scheme allows, so the accounted ``z`` covers each
        canary.  A canary replies as a client whose raw update is its direction times
        ``C_t`` (clipped, with its bit: DP-FedAvg's client) and joins the cohort's sum
        before the correlated noise; the server still divides by the public ``m``.  Scored
        on the global model.  Needs ``min_separation`` set (:meth:`for_run` sets it) and no
        ``noise_cohort`` (its epsilon is another deployment's): one-line ``ValueError``
        otherwise, before any work."""
        if self.noise_cohort is not None:
            raise ValueError(
                f"audit needs the run's own guarantee: noise_cohort={self.noise_cohort} "
                "calibrates the noise for another deployment, whose epsilon this run lacks"
            )
        single = self.schedule == "single"
        if not single and self.min_separation is None:
            raise ValueError(
                "audit needs DPFTRL's min_separation set (build it with DPFTRL.for_run): "
                "canaries take slots of the (k, b) scheme; got min_separation=None"
            )

        def participate(server, key, round_index, included):
            del key, round_index  # the slots are public; only the coins are secret
            t = server.schedule.shape[0]
            b = t if single else min(int(self.min_separation), t)
            cap = self.max_participations
            k = 1 if single else (math.ceil(t / b) if cap is None else cap)
            r = server.rounds  # rounds done: row r of the schedule is this round's cohort
            slot = jnp.arange(included.shape[0]) % b
            return included & (r < t) & (r % b == slot) & (r // b < k)

        hook = self._clients.canary_hook()
        return CanaryHook(0, participate, hook.reply, lambda server: server.params)

    def aggregate_sum(
        self,
        server: DPFTRLServer,
        total: ClientUpdate,
        slots: Slots,
        key: PRNGKeyArray,
        hyper: DPFTRLHyper,
    ) -> DPFTRLServer:
        """The server's step from ``total``, the selected replies' sum (the clipped
        updates' sum and, adaptive, the count of unclipped bits)."""
        k_sum, k_count = jax.random.split(key)
        scale = jnp.float32(self.noise_scale)
        # the mechanism runs on the normalised stream x_t / C_t (contributions of norm <= 1,
        # C_t public from earlier releases): C^{-1} acts on noise of constant std, and the
        # round's output is scaled back by C_t (never C^{-1} of noise scaled by past C_j)
        std = self._sum_multiplier(hyper) * hyper.strategy.sensitivity * scale
        noise, state = correlated_noise(hyper.strategy, server.noise, k_sum, total.update, std)
        m = jnp.float32(self.cohort)
        neg_mean = jax.tree.map(lambda x, e: -(x + server.clip * e) / m, total.update, noise)
        clip, below = server.clip, server.noisy_unclipped_fraction
        if self.clipping == "adaptive":
            # sum over the replying slots of (bit - 1/2): exact in float32 (halves)
            centred = total.unclipped - 0.5 * jnp.sum(slots.mask).astype(jnp.float32)
            noisy = gaussian_mechanism(
                k_count, centred, l2_sensitivity=1.0, noise_multiplier=hyper.count_noise * scale
            )
            below = noisy / m + 0.5
            clip = adapted_clip(clip, below, hyper.target_quantile, hyper.clip_lr)
        opt = self._server_optimizer(hyper.server_lr)
        return advance_server(server, opt, neg_mean, clip, below).replace(noise=state)

    def floating_point(self) -> str:
        """What the exact released values reveal beyond epsilon (docs/floating_point.md):
        DP-FTRL releases its correlated noise in plain float32 (no snapped release of a
        factorized mechanism exists here yet)."""
        return FLOAT_RELEASE

    def evaluate(self, server: DPFTRLServer, test: tuple[Array, Array]) -> dict[str, Array]:
        return self._clients.evaluate(server, test)

    def spend(self, server: DPFTRLServer, state: Trainer) -> Spend:
        """The whole run's event (ONE Gaussian of multiplier ``z``) from the first round on:
        ``q = 1``, one step."""
        del state
        return Spend(
            sample_rate=jnp.ones((), jnp.float32),
            noise_multiplier=server.noise_multiplier,
            steps=jnp.minimum(server.rounds, 1),
            extra_epsilon=jnp.zeros((), jnp.float32),
        )

    def private_diagnostics(self, state: Trainer) -> dict[str, Array]:
        return self._clients.private_diagnostics(state)

    # ------------------------------------------------------------------------ host side

    def client_data(self, clients: ClientData) -> ClientData:
        """What each client holds: as DP-FedAvg (its local training's view of the data)."""
        return self._clients.client_data(clients)

    def check(self, clients: ClientData, test: tuple[Array, Array] | None = None) -> None:
        check_client_level(self, clients, test)
        if self.cohort > clients.num_clients:
            raise ValueError(
                f"cohort must be <= num_clients ({clients.num_clients}); got {self.cohort}"
            )

    def default_hyper(self, clients: ClientData, spec: RunSpec) -> DPFTRLHyper:
        """Client lr 0.1, server lr 1.0, ``z = 1``, ``C_0 = 0.1``, ``gamma = 0.5``,
        ``eta_C = 0.2``, ``sigma_b`` NaN (:meth:`resolve`: :func:`default_ftrl_count_noise`),
        the schedule and the strategy of the run."""
        n = clients.num_clients
        f = partial(jnp.asarray, dtype=jnp.float32)
        return DPFTRLHyper(
            client_lr=f(0.1),
            server_lr=f(1.0),
            noise_multiplier=f(1.0),
            count_noise=f(jnp.nan),
            initial_clip=f(0.1),
            target_quantile=f(0.5),
            clip_lr=f(0.2),
            participations=f(self.participation(n, spec.rounds).participations),
            schedule=self.cohorts(n, spec.rounds),
            strategy=self.strategy(n, spec.rounds),
        )

    def resolve(
        self,
        hyper: DPFTRLHyper,
        clients: ClientData,
        spec: RunSpec,
        epsilon_target: float | None,
    ) -> DPFTRLHyper:
        """Checks every value as stored (float32) and the schedule against the scheme
        (refused before any work); ``epsilon_target`` (finite) sets ``z`` through the plan;
        a NaN ``count_noise`` becomes :func:`default_ftrl_count_noise`; fixed clipping
        makes no count; the strategy is the run's (jax-privacy)."""
        n = clients.num_clients
        plan = self.plan(n, spec)
        check_schedule(hyper.schedule, n, plan.scheme)
        if hyper.schedule.shape[1] != self.cohort:
            raise ValueError(
                f"schedule must have cohort={self.cohort} columns; got {hyper.schedule.shape}"
            )
        k = plan.participations
        z = stored(hyper.noise_multiplier)
        if epsilon_target is not None and math.isfinite(epsilon_target):
            z = plan.calibrate(epsilon_target).noise_multiplier
        check_range("noise_multiplier", z, 0.0, math.inf, high_open=True)
        b = stored(hyper.count_noise)
        b = default_ftrl_count_noise(self.cohort, z, k) if math.isnan(b) else b
        check_range("count_noise", b, 0.0, math.inf, high_open=True)
        clip_lr = check_clipping_hyper(hyper)
        if self.clipping == "fixed":
            b, clip_lr = 0.0, 0.0
        elif z > 0 and not float(2.0 * (jnp.float32(b) / jnp.sqrt(jnp.float32(k)))) > stored(z):
            raise ValueError(
                "count_noise must be > noise_multiplier * sqrt(k) / 2 for adaptive clipping "
                f"(k={k} counts per client); got count_noise={b!r}, noise_multiplier={z!r}"
            )
        f = partial(jnp.asarray, dtype=jnp.float32)
        return hyper.replace(
            noise_multiplier=f(z),
            count_noise=f(b),
            clip_lr=f(clip_lr),
            participations=f(k),
            strategy=self.strategy(n, spec.rounds),
        )

    @classmethod
    def for_run(
        cls,
        model: Model,
        num_clients: int,
        cohort: int,
        spec: RunSpec,
        epsilon_target: float | None = None,
        **settings,
    ) -> DPFTRL:
        """This algorithm with its scheme made explicit for the run (``min_separation`` and
        ``max_participations`` set to the ``b`` and ``k`` that hold, so records name
        numbers), its schedule built and checked and, for a finite ``epsilon_target``, the
        target checked reachable: every refusal (min separation beyond the rounds,
        participations that do not fit, an unknown factorization, a cohort that cannot give
        every client its slots) is a one-line ``ValueError`` before any work.
        ``settings``: the other fields (``factorization``, ``schedule``, ``clipping``...)."""
        alg = cls(model=model, cohort=cohort, **settings)
        p = alg.participation(num_clients, spec.rounds)
        if alg.schedule != "single":
            alg = replace(alg, min_separation=p.min_separation, max_participations=p.participations)
        alg.cohorts(num_clients, spec.rounds)
        if epsilon_target is not None and math.isfinite(epsilon_target):
            alg.plan(num_clients, spec).calibrate(float(epsilon_target))
        return alg
