"""Client-level DP-FedAvg (McMahan et al. 2018) with fixed or adaptive clipping (Andrew et
al. 2021), on the protocol. Spec section 4; the noise algebra and the privacy argument are
in ``docs/dp_fedavg.md``.

One exchange per round:

* ``select``: secret Poisson sampling of clients at rate ``q_c`` (the server's key); at most
  ``capacity`` clients (an overflowing draw is redrawn, never truncated).
* ``request``: the global model ``w_t`` and the clip norm ``C_t``.
* ``client``: ``E`` local epochs from ``w_t``; the update ``Delta = w - w_t`` is clipped to
  ``C_t`` (a non-finite update is replaced by zeros; :func:`clip_update`); with adaptive
  clipping also the bit ``1[||Delta|| <= C_t]``.
* ``aggregate``: ``(sum of clipped updates + N(0, (sigma_Delta C_t)^2)) / (q_c N)`` applied
  by the server optimiser; adaptive: ``b_t = (sum (bit - 1/2) + N(0, sigma_b^2)) / (q_c N) +
  1/2`` and ``C_{t+1} = C_t exp(-clip_lr (b_t - gamma))``.

The sum and the count are one Gaussian mechanism with multiplier
``z = (sigma_Delta^-2 + (2 sigma_b)^-2)^(-1/2)`` per round (the accounted ``noise_multiplier``);
fixed clipping sends no bit and ``sigma_Delta = z``. Every client's spend is ``rounds`` steps
at ``(q_c, z)``, client-level (add/remove one client with all of its data). The realised
number of participants is part of the mechanism's secret sampling and is not released:
released byte counts use the expected ``q_c N`` clients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import ClassVar, Literal

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray, PyTree

from swarmjax._validation import check_choice, check_int, check_positive, check_range, stored
from swarmjax.fl.algorithms.common import (
    Trainer,
    check_model_inputs,
    keep_if,
    public_metrics,
)
from swarmjax.fl.client.training import LocalTraining, clip_update
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
from swarmjax.privacy.mechanisms import gaussian_mechanism
from swarmjax.privacy.plan import PrivacyPlan, draw_overflow
from swarmjax.privacy.sampling import poisson_sample
from swarmjax.privacy.snapping import snapped_gaussian_mechanism

__all__ = [
    "ClientLevelDPFedAvg",
    "ClientUpdate",
    "DPFedAvgHyper",
    "DPFedAvgServer",
    "adapted_clip",
    "advance_server",
    "check_client_level",
    "check_clipping_hyper",
    "default_count_noise",
    "effective_noise_multiplier",
    "rounds_to_target",
    "sum_noise_multiplier",
]

Clipping = Literal["fixed", "adaptive"]
NoiseRelease = Literal["snapped", "float"]
SNAPPED_RELEASE = (
    "snapped: the noised sum and count are clamped and snapped to a power-of-two grid "
    "(std/16..std/8), so the set of possible outputs does not depend on the secret; the "
    "epsilon is the ideal Gaussian mechanism's, and the float32 sampler's certified extra "
    "charge grows with the coordinates released (docs/floating_point.md)"
)
FLOAT_RELEASE = (
    "float: plain float32 noise; the exact low bits of a released value can reveal the "
    "secret beyond epsilon (Mironov 2012's attack; docs/floating_point.md)"
)
CLIPPED = Protection(
    "accounted",
    "client",
    "clipped to C_t by the client, summed with Gaussian noise by the server (z)",
)


def effective_noise_multiplier(sum_noise: ArrayLike, count_noise: ArrayLike) -> Array:
    """Accounted ``z = (sigma_Delta^-2 + (2 sigma_b)^-2)^(-1/2)`` of sum + count query;
    ``0`` in either gives ``0`` (no privacy)."""
    s = jnp.asarray(sum_noise, jnp.float32)
    b = 2.0 * jnp.asarray(count_noise, jnp.float32)
    return jnp.where((s > 0) & (b > 0), (s**-2 + b**-2) ** -0.5, 0.0)


def sum_noise_multiplier(noise_multiplier: ArrayLike, count_noise: ArrayLike) -> Array:
    """``sigma_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)``, the inverse of
    :func:`effective_noise_multiplier`; needs ``2 sigma_b > z``; ``z = 0`` gives 0."""
    z = jnp.asarray(noise_multiplier, jnp.float32)
    b = 2.0 * jnp.asarray(count_noise, jnp.float32)
    safe_z = jnp.where(z > 0, z, 1.0)
    return jnp.where(z > 0, (safe_z**-2 - b**-2) ** -0.5, 0.0)


def default_count_noise(expected_clients: float, noise_multiplier: float = 0.0) -> float:
    """``sigma_b = max(q_c N / 20, z)`` (Andrew et al.'s ``m / 20``, raised to ``z`` when that
    is below the allowed ``z / 2``)."""
    check_positive("expected_clients", expected_clients)
    check_range("noise_multiplier", noise_multiplier, 0.0, math.inf, high_open=True)
    return max(0.05 * float(expected_clients), float(noise_multiplier))


@flax.struct.dataclass
class DPFedAvgHyper:
    """Numeric hyper-parameters (vmappable; built by :meth:`~swarmjax.fl.protocol.Variants.grid`).

    ``client_lr``, ``server_lr``; ``sample_rate`` ``q_c``; ``noise_multiplier`` ``z`` (the
    accounted multiplier); ``count_noise`` ``sigma_b``; ``initial_clip`` ``C_0``;
    ``target_quantile`` ``gamma``; ``clip_lr`` ``eta_C`` (0 for fixed clipping).
    """

    client_lr: Float[Array, ""]
    server_lr: Float[Array, ""]
    sample_rate: Float[Array, ""]
    noise_multiplier: Float[Array, ""]
    count_noise: Float[Array, ""]
    initial_clip: Float[Array, ""]
    target_quantile: Float[Array, ""]
    clip_lr: Float[Array, ""]


@flax.struct.dataclass
class DPFedAvgServer:
    """Global model, server optimiser state, ``C_t``, the noised unclipped fraction ``b_t``
    of the last round (NaN under fixed clipping: no count is made), the accounted rounds
    and the accounting parameters ``(q_c, z)``."""

    params: PyTree
    opt_state: PyTree
    clip: Float[Array, ""]
    noisy_unclipped_fraction: Float[Array, ""]
    rounds: Int[Array, ""]
    sample_rate: Float[Array, ""]
    noise_multiplier: Float[Array, ""]


@flax.struct.dataclass
class ClientUpdate:
    """A client's clipped update and, under adaptive clipping, its unclipped bit (0/1)."""

    update: PyTree
    unclipped: Float[Array, ""] | None = None


def adapted_clip(
    clip: Float[Array, ""],
    unclipped_fraction: Float[Array, ""],
    target_quantile: Float[Array, ""],
    clip_lr: Float[Array, ""],
) -> Float[Array, ""]:
    """Andrew et al.'s geometric update ``C_t exp(-clip_lr (b_t - gamma))`` from the noised
    unclipped fraction ``b_t``; ``C_t`` is kept when the result is not finite."""
    new = clip * jnp.exp(-clip_lr * (unclipped_fraction - target_quantile))
    return keep_if(jnp.isfinite(new), new, clip)


def advance_server(
    server: PyTree,
    opt: optax.GradientTransformation,
    neg_mean: PyTree,
    clip: Float[Array, ""],
    unclipped_fraction: Float[Array, ""],
) -> PyTree:
    """A client-level DP server after its round: ``opt`` stepped on ``neg_mean`` (minus the
    noised mean update), the new clip norm and noised unclipped fraction, one more round
    (DP-FedAvg, DP-FTRL)."""
    updates, opt_state = opt.update(neg_mean, server.opt_state, server.params)
    return server.replace(
        params=optax.apply_updates(server.params, updates),
        opt_state=opt_state,
        clip=clip,
        noisy_unclipped_fraction=unclipped_fraction,
        rounds=server.rounds + 1,
    )


def check_client_level(alg: Algorithm, clients: ClientData, test) -> None:
    """What a client-level DP algorithm's settings (``clipping``, ``server_momentum``,
    ``training`` without record-level DP, ``model``) must satisfy for ``clients``."""
    check_choice("clipping", alg.clipping, ("fixed", "adaptive"))
    check_range("server_momentum", alg.server_momentum, 0.0, 1.0, high_open=True)
    alg.training.check(clients.sizes)
    if alg.training.record_dp is not None:
        raise ValueError(
            f"training.record_dp must be None: {type(alg).__name__}'s unit is the client"
        )
    check_model_inputs(alg.model, clients, test)


def check_clipping_hyper(hyper: PyTree) -> float:
    """Checks, as float32, the clip and learning-rate values every client-level DP
    algorithm has (``initial_clip``, ``target_quantile``, ``clip_lr``, ``client_lr``,
    ``server_lr``); returns ``clip_lr``."""
    check_range("clip", stored(hyper.initial_clip), 0.0, math.inf, low_open=True, high_open=True)
    check_range(
        "target_quantile", stored(hyper.target_quantile), 0.0, 1.0, low_open=True, high_open=True
    )
    clip_lr = check_range("clip_lr", stored(hyper.clip_lr), 0.0, math.inf, high_open=True)
    check_positive("client_lr", stored(hyper.client_lr))
    check_positive("server_lr", stored(hyper.server_lr))
    return clip_lr


@dataclass(frozen=True)
class ClientLevelDPFedAvg(SummedAggregate, Algorithm):
    """Client-level DP-FedAvg (static settings; hashable).

    Attributes:
        model: the ``(init, apply)`` pair.
        training: local training (no record-level DP here: the unit is the client).
        clipping: ``"fixed"`` (no count query) or ``"adaptive"``.
        capacity: static bound on sampled clients (``None``: all of them, whatever ``N``);
            at least the plan's floor (:meth:`~swarmjax.privacy.plan.PrivacyPlan.check_capacity`);
            :meth:`for_run` sizes it for a run through the plan.
        server_momentum: momentum of the server SGD (0: plain step).
        eval_batch_size: chunk size of the test evaluation.
        noise_release: how the server's noised sum and count are released: ``"snapped"``
            (default: clamped and snapped to a power-of-two grid, so the set of possible
            outputs does not depend on the secret; docs/floating_point.md) or ``"float"``
            (plain float32 noise, whose low bits can reveal the secret: Mironov 2012).
    """

    model: Model
    training: LocalTraining = field(default_factory=lambda: LocalTraining(batch_size=10))
    clipping: Clipping = "adaptive"
    capacity: int | None = None
    server_momentum: float = 0.0
    eval_batch_size: int | None = None
    noise_release: NoiseRelease = "snapped"

    privacy_unit: ClassVar[str] = "client"

    @property
    def exchanges(self) -> tuple[Exchange, ...]:
        protection = {"update": CLIPPED}
        if self.clipping == "adaptive":
            protection["unclipped"] = Protection(
                "accounted", "client", "0/1 bit, summed with N(0, sigma_b^2) (part of z)"
            )
        return (
            Exchange(
                "train",
                self.select,
                self.request,
                self.client,
                self.aggregate,
                protection,
                max_selected=self.capacity,
                expected_selected=_expected_clients,
                aggregate_sum=self.aggregate_sum,
            ),
        )

    def _server_optimizer(self, server_lr: Array) -> optax.GradientTransformation:
        return optax.sgd(server_lr, momentum=self.server_momentum or None)

    def server_init(self, key: PRNGKeyArray, hyper: DPFedAvgHyper) -> DPFedAvgServer:
        params = self.model.init(key)
        return DPFedAvgServer(
            params=params,
            opt_state=self._server_optimizer(hyper.server_lr).init(params),
            clip=jnp.asarray(hyper.initial_clip, jnp.float32),
            noisy_unclipped_fraction=jnp.asarray(jnp.nan, jnp.float32),
            rounds=jnp.zeros((), jnp.int32),
            sample_rate=hyper.sample_rate,
            noise_multiplier=hyper.noise_multiplier,
        )

    def client_init(
        self, key: PRNGKeyArray, data: ClientData, hyper: DPFedAvgHyper, client_id: Int[Array, ""]
    ) -> Trainer:
        del key, data, hyper, client_id
        return Trainer(spend=Spend.none(), loss=jnp.zeros((), jnp.float32))

    def select(self, server: DPFedAvgServer, key: PRNGKeyArray, n: int) -> Bool[Array, " N"]:
        capacity = n if self.capacity is None else min(self.capacity, n)
        ids, mask, _ = poisson_sample(key, server.sample_rate, jnp.ones(n, bool), capacity)
        return jnp.zeros(n, bool).at[ids].max(mask)

    def request(self, server: DPFedAvgServer) -> tuple[PyTree, Float[Array, ""]]:
        return server.params, server.clip

    def client(
        self,
        state: Trainer,
        data: ClientData,
        request: tuple[PyTree, Float[Array, ""]],
        key: PRNGKeyArray,
        hyper: DPFedAvgHyper,
    ) -> tuple[Trainer, ClientUpdate]:
        params, clip = request
        zero = jnp.zeros((), jnp.float32)
        res = self.training.train(self.model, params, data, key, hyper.client_lr, zero)
        delta = jax.tree.map(jnp.subtract, res.params, params)
        return state.replace(loss=res.loss), self._clipped_reply(delta, clip)

    def _clipped_reply(self, delta: PyTree, clip: Float[Array, ""]) -> ClientUpdate:
        """A client's reply for raw update ``delta``: clipped to ``clip``, with its bit."""
        clipped, norm, _ = clip_update(delta, clip)
        bit = (norm <= clip).astype(jnp.float32) if self.clipping == "adaptive" else None
        return ClientUpdate(update=clipped, unclipped=bit)

    def canary_hook(self) -> CanaryHook:
        """Client-level canaries (:mod:`swarmjax.privacy.canaries`) by this run's rule: each
        in canary joins each round at the accounted Poisson rate ``q_c`` (a buffer of every
        canary: never redrawn) and replies as a client whose raw update is its direction
        times ``C_t`` (clipped, with its bit, like any client); scored on the global model."""

        def participate(server, key, round_index, included):
            del round_index
            m = included.shape[0]
            ids, mask, _ = poisson_sample(key, server.sample_rate, included, m)
            return jnp.zeros(m, bool).at[ids].max(mask)

        def reply(request, direction, hyper):
            del hyper
            _, clip = request
            return self._clipped_reply(jax.tree.map(lambda d: d * clip, direction), clip)

        return CanaryHook(0, participate, reply, lambda server: server.params)

    def aggregate_sum(
        self,
        server: DPFedAvgServer,
        total: ClientUpdate,
        slots: Slots,
        key: PRNGKeyArray,
        hyper: DPFedAvgHyper,
    ) -> DPFedAvgServer:
        """The server's step from ``total``, the selected replies' sum (the clipped updates'
        sum and, adaptive, the count of unclipped bits), over ``S`` slots."""
        n = slots.num_clients
        k_sum, k_count = jax.random.split(key)
        adaptive = self.clipping == "adaptive"
        sum_noise = sum_noise_multiplier(hyper.noise_multiplier, hyper.count_noise)
        sum_noise = sum_noise if adaptive else hyper.noise_multiplier
        # every coordinate of the clipped sum lies within S * C_t (S reply slots)
        noisy = self._release(k_sum, total.update, server.clip, sum_noise, slots.mask.shape[0])
        expected = hyper.sample_rate * n
        neg_mean = jax.tree.map(lambda leaf: -leaf / expected, noisy)
        clip, below = server.clip, server.noisy_unclipped_fraction
        if adaptive:
            # sum over the replying slots of (bit - 1/2): exact in float32 (halves)
            centred = total.unclipped - 0.5 * jnp.sum(slots.mask).astype(jnp.float32)
            # sensitivity 1/2 per client, noise std sigma_b; |centred| <= S / 2
            noisy_count = self._release(
                k_count, centred, jnp.float32(1.0), hyper.count_noise, slots.mask.shape[0] / 2
            )
            below = noisy_count / expected + 0.5
            clip = adapted_clip(clip, below, hyper.target_quantile, hyper.clip_lr)
        opt = self._server_optimizer(hyper.server_lr)
        return advance_server(server, opt, neg_mean, clip, below)

    def _release(
        self, key: PRNGKeyArray, value: PyTree, scale: Array, multiplier: Array, reach: float
    ) -> PyTree:
        """``value`` plus Gaussian noise of std ``multiplier * scale``, released as
        ``noise_release`` says: ``"snapped"`` clamps every coordinate to ``reach * scale +
        12 std`` (``reach * scale`` bounds the secret) and snaps the noised value to a
        power-of-two grid whose set does not depend on the secret
        (:func:`~swarmjax.privacy.snapping.snapped_gaussian_mechanism`); ``"float"`` adds
        float32 noise. A zero multiplier (no DP) adds nothing and never snaps."""
        if self.noise_release == "float":
            return gaussian_mechanism(key, value, l2_sensitivity=scale, noise_multiplier=multiplier)
        bound = scale * (reach + 12.0 * multiplier)

        def snapped(v: PyTree) -> PyTree:
            return snapped_gaussian_mechanism(
                key, v, l2_sensitivity=scale, noise_multiplier=multiplier, bound=bound
            )

        return jax.lax.cond(multiplier > 0, snapped, lambda v: v, value)

    def floating_point(self) -> str:
        """What the exact released values reveal beyond epsilon (docs/floating_point.md)."""
        if self.noise_release == "float":
            return FLOAT_RELEASE
        return SNAPPED_RELEASE

    def evaluate(self, server: DPFedAvgServer, test: tuple[Array, Array]) -> dict[str, Array]:
        out = public_metrics(self.model, server.params, test, self.eval_batch_size)
        out["clip_norm"] = server.clip
        if self.clipping == "adaptive":
            out["noisy_unclipped_fraction"] = server.noisy_unclipped_fraction
        return out

    def spend(self, server: DPFedAvgServer, state: Trainer) -> Spend:
        del state
        return Spend(
            sample_rate=server.sample_rate,
            noise_multiplier=server.noise_multiplier,
            steps=server.rounds,
            extra_epsilon=jnp.zeros((), jnp.float32),
        )

    def private_diagnostics(self, state: Trainer) -> dict[str, Array]:
        return {"local_train_loss": state.loss}

    # ------------------------------------------------------------------------ host side

    def client_data(self, clients: ClientData) -> ClientData:
        """The clients under ``training.max_examples`` (a flat store gathers the cap)."""
        return self.training.client_data(clients)

    def check(self, clients: ClientData, test: tuple[Array, Array] | None = None) -> None:
        check_choice("noise_release", self.noise_release, ("snapped", "float"))
        check_client_level(self, clients, test)

    def default_hyper(self, clients: ClientData, spec: RunSpec) -> DPFedAvgHyper:
        """Client lr 0.1, server lr 1.0, ``q_c = 0.1``, ``z = 1``, ``C_0 = 0.1``,
        ``gamma = 0.5``, ``eta_C = 0.2`` and ``sigma_b`` NaN (:meth:`resolve` then takes
        :func:`default_count_noise`)."""
        del clients, spec
        f = partial(jnp.asarray, dtype=jnp.float32)
        return DPFedAvgHyper(
            client_lr=f(0.1),
            server_lr=f(1.0),
            sample_rate=f(0.1),
            noise_multiplier=f(1.0),
            count_noise=f(jnp.nan),
            initial_clip=f(0.1),
            target_quantile=f(0.5),
            clip_lr=f(0.2),
        )

    def resolve(
        self,
        hyper: DPFedAvgHyper,
        clients: ClientData,
        spec: RunSpec,
        epsilon_target: float | None,
    ) -> DPFedAvgHyper:
        """Checks every value as stored (float32); ``epsilon_target`` (finite) sets ``z``
        (:meth:`noise_for_epsilon`); a NaN ``count_noise`` becomes
        :func:`default_count_noise`; fixed clipping makes no count (``sigma_b = 0``,
        ``eta_C = 0``)."""
        n = clients.num_clients
        q = check_range("sample_rate", stored(hyper.sample_rate), 0.0, 1.0, low_open=True)
        plan = self.plan(n, q, spec)
        plan.check_capacity()
        z = stored(hyper.noise_multiplier)
        if epsilon_target is not None and math.isfinite(epsilon_target):
            z = plan.calibrate(epsilon_target).noise_multiplier
        check_range("noise_multiplier", z, 0.0, math.inf, high_open=True)
        b = stored(hyper.count_noise)
        b = default_count_noise(q * n, z) if math.isnan(b) else b
        check_range("count_noise", b, 0.0, math.inf, high_open=True)
        clip_lr = check_clipping_hyper(hyper)
        if self.clipping == "fixed":
            b, clip_lr = 0.0, 0.0
        elif z > 0 and not 2.0 * stored(b) > stored(z):  # as the device will compute it
            raise ValueError(
                "count_noise must be > noise_multiplier / 2 for adaptive clipping (as "
                f"float32); got count_noise={b!r}, noise_multiplier={z!r}"
            )
        f = partial(jnp.asarray, dtype=jnp.float32)
        return hyper.replace(noise_multiplier=f(z), count_noise=f(b), clip_lr=f(clip_lr))

    def sampling_overflow(self, spend, num_clients, sizes=None, padded=None):
        """``(runs, 1, N)`` per-round chance that the Poisson draw of clients (rate ``q_c``
        from ``spend.sample_rate``) exceeds ``capacity`` and is redrawn, on the worse of the
        two add/remove neighbours (:func:`~swarmjax.privacy.plan.draw_overflow`, what
        :meth:`plan` charges); ``None`` when no draw can overflow."""
        del sizes, padded
        if self.capacity is None or self.capacity > num_clients:
            return None
        q = np.asarray(spend.sample_rate, np.float64)[:, -1, :]
        probs = {
            v: draw_overflow("client", num_clients, v, self.capacity) if v > 0 else 0.0
            for v in set(q.ravel().tolist())
        }
        return np.vectorize(probs.__getitem__, otypes=[np.float64])(q)[:, None, :]

    def plan(self, num_clients: int, sample_rate: float, spec: RunSpec) -> PrivacyPlan:
        """The client-level :class:`~swarmjax.privacy.plan.PrivacyPlan` of a run: ``N``
        candidate clients drawn at rate ``sample_rate`` into this ``capacity`` every round,
        ``spec.rounds`` steps at ``spec.delta`` by ``spec.accountant``."""
        return PrivacyPlan(
            unit="client",
            population=check_int("num_clients", num_clients, 1),
            rate=float(sample_rate),
            steps=spec.rounds,
            delta=spec.delta,
            accountant=spec.accountant,
            capacity=self.capacity,
        )

    @classmethod
    def for_run(
        cls,
        model: Model,
        num_clients: int,
        sample_rate: float,
        spec: RunSpec,
        epsilon_target: float | None,
        **settings,
    ) -> ClientLevelDPFedAvg:
        """This algorithm with the Poisson buffer its plan sizes for the run: overflow over
        ``spec.rounds`` rounds adds at most ``1e-3 delta`` to an ``(eps, delta)`` guarantee
        for any eps up to a composed epsilon of 64 (or ``epsilon_target`` if larger;
        :meth:`~swarmjax.privacy.plan.PrivacyPlan.sized`; example: 1,200 clients at rate
        50/1200, 100 rounds, delta 1/1200, epsilon 2 -> 158 slots). No buffer
        (``capacity=None``) when it would hold every client anyway. ``settings``: the other
        fields (``training``, ``clipping``, ...)."""
        probe = cls(model=model, capacity=None, **settings)
        bound = math.inf if epsilon_target is None else float(epsilon_target)
        capacity = probe.plan(num_clients, sample_rate, spec).sized(bound).capacity
        return cls(model=model, capacity=None if capacity >= num_clients else capacity, **settings)


def _expected_clients(hyper: DPFedAvgHyper, num_clients: int) -> Array:
    return hyper.sample_rate * num_clients


def rounds_to_target(
    history: pd.DataFrame, target: float, column: str = "test_accuracy", *, higher: bool = True
) -> pd.Series:
    """First round (per run) at which ``column`` reaches ``target`` (``>=``; ``<=`` when
    ``higher=False``); NaN for a run that never does."""

    def first(frame: pd.DataFrame) -> float:
        hit = frame[column] >= target if higher else frame[column] <= target
        r = frame.loc[hit, "round"]
        return float(r.min()) if len(r) else math.nan

    keys = [c for c in ("noise_multiplier", "seed") if c in history.columns]
    return history.groupby(keys)[["round", column]].apply(first).rename("rounds_to_target")
