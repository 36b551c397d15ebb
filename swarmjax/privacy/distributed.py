"""User-level DP that does not trust the server: distributed Skellam noise inside secure
aggregation, as ONE plan (:class:`DistributedDP`) applied around a summed exchange by
:func:`swarmjax.fl.private.private`.

Each client of a round's public cohort (:mod:`swarmjax.privacy.discrete` holds the steps)::

    clip to C -> flatten -> rotate (randomized DCT of the d parameters, public signs)
      -> scale by gamma -> conditional randomized rounding (||z|| <= Delta_2, always)
      -> + Sk(mu / h) per coordinate -> residues mod 2^b -> secure-aggregation masks

and the server, from the masked uploads of the survivors alone
(:mod:`swarmjax.privacy.secagg`), recovers their sum modulo ``2^b``, centres it, divides by
``gamma``, undoes the rotation and hands the wrapped algorithm ``Update(sum, survivors)``.

**Trust model.** The server sees only the masked uploads and the sum modulo ``2^b``; a set
of up to ``max_colluders`` clients colluding with it learns their own shares (so their
noise is not counted); an observer of the released model sees a post-processing of the
noised sum. The noise counted is that of ``h = min_survivors - max_colluders`` honest
surviving clients: each client adds ``Sk(mu / h)``, and a round with fewer than
``min_survivors`` survivors is refused (nothing is released, the model is unchanged), so
every released sum carries at least ``Sk(mu)`` of honest noise; more is post-processing
(the cohort is public and no amplification by sampling is claimed, so extra independent
noise cannot hurt).

**Neighbouring relation**: client-level zero-out (a client replaced by a null client that
takes part and runs the protocol with a zero update), sensitivities in grid units after
rounding: ``Delta_2`` (:func:`~swarmjax.privacy.skellam.rounded_l2_bound` of ``gamma C``)
and ``Delta_1`` (:func:`~swarmjax.privacy.skellam.l1_bound`). Participation: a public
:class:`~swarmjax.privacy.participation.FixedCohort` (each client charged every round) or
:class:`~swarmjax.privacy.participation.MinSeparation` schedule (each client at most ``k``
times); the run is the ``k``-fold composition of the multi-dimensional Skellam mechanism
(:class:`~swarmjax.privacy.skellam.SkellamDpEvent`), accounted by RDP (dp-accounting's PLD
cannot represent it).

**Settings derived from the target** (:meth:`DistributedDP.calibrate`): for each grid scale
``gamma`` the noise ``mu`` that meets the target epsilon; the largest ``gamma`` whose
per-coordinate chance of a modular wrap-around (the decoded sum leaving
``[-2^(b-1), 2^(b-1))``) is below ``wrap_probability`` (:func:`wrap_bound`). A wrap is a
utility failure, never a privacy one (the decode is a post-processing of the noised sum).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import dp_accounting
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree, UInt32

from swarmjax._validation import check_int, check_range, stored
from swarmjax.privacy import secagg
from swarmjax.privacy.accounting import Rates
from swarmjax.privacy.clipping import clip_update
from swarmjax.privacy.discrete import (
    ROTATIONS,
    SPREAD,
    certified_bound,
    conditional_round,
    from_residues,
    rotate,
    rotation_dim,
    rotation_signs,
    skellam,
    sum_error,
    to_residues,
    unrotate,
)
from swarmjax.privacy.participation import FixedCohort, MinSeparation
from swarmjax.privacy.plan import check_delta
from swarmjax.privacy.secagg import SecAggRound, check_threshold, min_degree
from swarmjax.privacy.skellam import (
    SkellamDpEvent,
    l1_bound,
    rounded_l2_bound,
    skellam_epsilon,
    skellam_mu_for_epsilon,
)

__all__ = [
    "DistributedDP",
    "DistributedHyper",
    "DistributedState",
    "skellam_tail",
    "wrap_bound",
]

_ROTATION_SEED = 0x524F54  # public seed of the rotations ("ROT"): signs are public
_DROP_TAG, _MASK_TAG, _ENCODE_TAG = 0x44524F50, 0x4D41534B, 0x454E4344


# ------------------------------------------------------------------ tails of the sum


def skellam_tail(t: float, lam: float) -> float:
    """Chernoff bound on ``P(|Sk(lam)| >= t)``: ``2 exp(-(t asinh(t / 2 lam) - 2 lam
    (sqrt(1 + (t / 2 lam)^2) - 1)))`` (the log-MGF of ``Sk(lam)`` is
    ``2 lam (cosh s - 1)``, minimised at ``s = asinh(t / 2 lam)``); ``lam = 0``: ``0`` for
    ``t > 0``."""
    if t <= 0:
        return 1.0
    if lam <= 0:
        return 0.0
    r = t / (2.0 * lam)
    rate = t * math.asinh(r) - 2.0 * lam * (math.sqrt(1.0 + r * r) - 1.0)
    return min(1.0, 2.0 * math.exp(-rate))


def wrap_bound(
    bits: int, cohort: int, scaled_clip: float, dim: int, noise: float, spread: float = 1.0
) -> float:
    """Upper bound on the chance that one coordinate of a round's integer sum leaves
    ``[-2^(bits-1), 2^(bits-1))`` (and wraps modulo ``2^bits``).

    The sum of ``cohort`` rotated updates of norm ``<= scaled_clip`` (``gamma C``) has norm
    ``<= cohort * scaled_clip``; over the random signs each rotated coordinate is
    sub-Gaussian with variance proxy ``spread (cohort * scaled_clip)^2 / dim`` (Hoeffding;
    ``spread`` the rotation's :data:`~swarmjax.privacy.discrete.SPREAD`); each
    client's rounding moves a coordinate by less than 1 (at most ``cohort`` in all); the
    noise is ``Sk(noise)`` (all the shares together, ``noise`` = ``cohort * mu / h``). The
    bound is minimised over the split of the range between the signal and the noise."""
    half = 2.0 ** (bits - 1) - cohort
    if half <= 0:
        return 1.0
    var = spread * (cohort * scaled_clip) ** 2 / dim
    best = 1.0
    for t1 in np.linspace(0.0, half, 257)[1:-1]:
        signal = 2.0 * math.exp(-(t1 * t1) / (2.0 * var)) if var > 0 else 0.0
        best = min(best, signal + skellam_tail(half - t1, noise))
    return best


# ------------------------------------------------------------------ state and numbers


@flax.struct.dataclass
class DistributedHyper:
    """The plan's numbers for one variant (vmappable).

    Attributes:
        initial_clip: ``C``, the L2 clip of every update (fixed clipping).
        grid_scale: ``gamma``, grid points per unit after rotation (NaN until
            :meth:`DistributedDP.resolve` derives it from the target).
        noise: ``mu``, the Skellam parameter of the honest survivors' noise per coordinate
            (grid units; variance ``2 mu``; ``0``: no noise, epsilon ``inf``).
        l2_bound: ``Delta_2``, the L2 norm bound every client's rounded vector meets (grid
            units; NaN until resolved).
        l1_bound: ``Delta_1``, the L1 bound that follows for an integer vector (grid
            units; NaN until resolved).
        schedule: ``(T, m)`` int32 public cohorts (min-separation), else ``None``.
    """

    initial_clip: Float[Array, ""]
    grid_scale: Float[Array, ""]
    noise: Float[Array, ""]
    l2_bound: Float[Array, ""]
    l1_bound: Float[Array, ""]
    schedule: Int[Array, "T m"] | None = None

    @property
    def noise_multiplier(self) -> Float[Array, ""]:
        """``sqrt(2 mu) / Delta_2``: the multiplier of a Gaussian of the honest noise's
        variance (shown in records; the accounting uses the Skellam event itself)."""
        return jnp.sqrt(2.0 * self.noise) / self.l2_bound


@flax.struct.dataclass
class DistributedState:
    """The plan's server state: rounds done, rounds refused (too few survivors: nothing
    released) and the public schedule (min-separation)."""

    rounds: Int[Array, ""]
    refused: Int[Array, ""]
    schedule: Int[Array, "T m"] | None = None


def _f32(value: Any) -> Array:
    return jnp.asarray(value, jnp.float32)


@dataclass(frozen=True)
class DistributedDP:
    """Distributed user-level DP: Skellam shares added by the clients, summed under secure
    aggregation (static settings; hashable).

    Attributes:
        participation: a public :class:`~swarmjax.privacy.participation.FixedCohort`
            (default cohort 10) or :class:`~swarmjax.privacy.participation.MinSeparation`.
        bits: ``b``, bits of each uploaded coordinate (the sum is kept modulo ``2^b``);
            ``8 <= b <= 32``; default 16.
        min_survivors: ``t``, the fewest surviving clients for which a round decodes (the
            secure aggregation threshold); ``None``: ``ceil(0.8 m)``.
        max_colluders: clients assumed able to collude with the server (their noise is
            not counted); default 0. ``h = t - max_colluders >= 1`` honest survivors carry
            the accounted noise.
        dropout: simulated chance that a client drops after masking (its upload is lost;
            the server unmasks the survivors' sum); default 0.
        wrap_probability: largest per-coordinate chance of a modular wrap the derived
            ``gamma`` may have (:func:`wrap_bound`); default ``1e-6``.
        beta: the conditional rounding's per-draw failure bound (Kairouz et al. 2021);
            default ``exp(-1/2)``.
        tries: rounding draws before a client sends zeros instead; default 16.
        rotation: ``"dct"`` (default: the randomized orthonormal DCT-II of the
            parameters zero-padded to the next length of prime factors 2, 3, 5 and 7,
            where the FFT runs fast: +0.01 % at MNIST's 1,199,882, so an upload is about
            ``b / 32`` of float32's bytes; :func:`~swarmjax.privacy.discrete.smooth_dim`) or
            ``"hadamard"`` (randomized Hadamard after zero-padding to the next power of two:
            up to 2x the coordinates to upload, noise and mask; half the DCT's spread in
            :func:`wrap_bound`). :mod:`swarmjax.privacy.discrete`.
        degree: secure-aggregation neighbours per client; ``None``: the smallest that
            keeps the honest survivors of every released round connected
            (:attr:`mask_degree`; the complete graph's guarantee at a fraction of its cost,
            :mod:`swarmjax.privacy.secagg`).
    """

    participation: FixedCohort | MinSeparation = field(default_factory=lambda: FixedCohort(10))
    bits: int = 16
    min_survivors: int | None = None
    max_colluders: int = 0
    dropout: float = 0.0
    wrap_probability: float = 1e-6
    beta: float = math.exp(-0.5)
    tries: int = 16
    degree: int | None = None
    rotation: str = "dct"

    def __post_init__(self) -> None:
        if not isinstance(self.participation, FixedCohort | MinSeparation):
            raise ValueError(
                "participation must be FixedCohort or MinSeparation (a public cohort: "
                "client-added noise under Poisson sampling has no amplification bound "
                f"swarmjax can defend); got {type(self.participation).__name__}"
            )
        check_int("bits", self.bits, 8)
        if self.bits > 32:
            raise ValueError(f"bits must be in [8, 32] (uint32 words); got {self.bits}")
        m = self.cohort
        check_int("max_colluders", self.max_colluders, 0)
        if self.max_colluders >= self.threshold:
            raise ValueError(
                f"max_colluders must be < min_survivors ({self.threshold}): at least one "
                f"honest survivor must carry the noise; got {self.max_colluders}"
            )
        try:
            check_threshold(self.threshold, m, self.max_colluders)
        except ValueError as err:  # named by this plan's setting
            raise ValueError(f"min_survivors: {err}") from None
        check_range("dropout", self.dropout, 0.0, 1.0, high_open=True)
        check_range("wrap_probability", self.wrap_probability, 0.0, 0.5, low_open=True)
        check_range("beta", self.beta, 0.0, 1.0, low_open=True, high_open=True)
        check_int("tries", self.tries, 1)
        if self.rotation not in ROTATIONS:
            raise ValueError(
                f"rotation must be one of {', '.join(ROTATIONS)}; got {self.rotation!r}"
            )
        if self.degree is not None:
            check_int("degree", self.degree, 1)
        p = self.participation
        if isinstance(p, MinSeparation) and p.schedule != "single" and p.min_separation is None:
            raise ValueError(
                "participation=MinSeparation needs min_separation set (MinSeparation.for_run("
                "num_clients, rounds) makes b and k explicit); got min_separation=None"
            )

    # ------------------------------------------------------------------ host side

    @property
    def cohort(self) -> int:
        """``m``, the public cohort of a round."""
        return self.participation.public_cohort

    @property
    def threshold(self) -> int:
        """``t``: :attr:`min_survivors`, or ``ceil(0.8 m)``."""
        if self.min_survivors is None:
            return max(1, math.ceil(0.8 * self.cohort))
        return check_int("min_survivors", self.min_survivors, 1)

    @property
    def mask_degree(self) -> int | None:
        """Secure-aggregation neighbours per client: :attr:`degree`, else the smallest
        degree that keeps every released round's honest survivors connected
        (:func:`~swarmjax.privacy.secagg.min_degree`; ``None``: the complete graph)."""
        if self.degree is not None:
            return self.degree
        return min_degree(self.cohort, self.threshold, self.max_colluders)

    @property
    def honest(self) -> int:
        """``h = t - max_colluders``: honest survivors whose noise is counted."""
        return self.threshold - self.max_colluders

    def noise_std(self, hyper: DistributedHyper) -> np.ndarray:
        """Std of the noise one round adds to the cohort's decoded sum, per coordinate, in
        units of the clip ``C`` (float64, ``hyper``'s shape: one value per variant):
        ``sqrt(2 mu m / h) / (gamma C)``, every one of the ``m`` clients' Skellam shares of
        ``mu / h`` (variance ``2 mu / h`` grid units each) over ``gamma C`` grid steps per
        clip; ``0`` without noise. Comparable with a central plan's ``z`` per round."""
        mu, gamma, clip = (
            np.asarray(a, np.float64) for a in (hyper.noise, hyper.grid_scale, hyper.initial_clip)
        )
        if np.any(~np.isfinite(gamma) | (gamma <= 0)) or np.any(clip <= 0):
            raise ValueError(
                "hyper: noise_std needs a resolved plan (grid_scale > 0, initial_clip > 0); "
                f"got grid_scale={gamma}, initial_clip={clip}"
            )
        return np.sqrt(2.0 * mu * self.cohort / self.honest) / (gamma * clip)

    def compositions(self, num_clients: int, rounds: int) -> int:
        """``k``: rounds one client takes part in (every round under a fixed cohort)."""
        if isinstance(self.participation, MinSeparation):
            return self.participation.participations(num_clients, rounds)
        return rounds

    def dimension(self, n: int) -> int:
        """``d``: the coordinates an update of ``n`` parameters is rotated, rounded, noised
        and uploaded in (:func:`~swarmjax.privacy.discrete.rotation_dim`)."""
        return rotation_dim(n, self.rotation)

    def sensitivities(self, clip: float, scale: float, dim: int) -> tuple[float, float]:
        """``(Delta_1, Delta_2)`` in grid units for clip ``C``, grid scale ``gamma`` and
        ``dim`` rotated coordinates."""
        # the rounding's bound, widened by the float32 norm check's proven error
        l2 = rounded_l2_bound(scale * clip, dim, self.beta) * math.sqrt(1.0 + sum_error(dim))
        return l1_bound(l2, dim), l2

    def event(self, hyper: DistributedHyper, steps: int = 1) -> dp_accounting.DpEvent:
        """``steps`` participations under one variant's numbers: a
        :class:`~swarmjax.privacy.skellam.SkellamDpEvent` self-composed
        (``NonPrivateDpEvent`` without noise, ``NoOpDpEvent`` for no step)."""
        if steps == 0:
            return dp_accounting.NoOpDpEvent()
        mu = float(np.asarray(hyper.noise))
        if mu <= 0:
            return dp_accounting.NonPrivateDpEvent()
        one = SkellamDpEvent(
            l1_sensitivity=float(np.asarray(hyper.l1_bound)),
            l2_sensitivity=float(np.asarray(hyper.l2_bound)),
            mu=mu,
        )
        return one if steps == 1 else dp_accounting.SelfComposedDpEvent(one, steps)

    def calibrate(
        self, epsilon: float, clip: float, dim: int, compositions: int, delta: float
    ) -> tuple[float, float]:
        """``(gamma, mu)`` for a target ``epsilon``: the largest grid scale whose wrap bound
        is below :attr:`wrap_probability` with the noise that meets the target at that
        scale; one-line ``ValueError`` when no scale fits in ``bits``."""

        def noise_at(scale: float) -> float:
            l1, l2 = self.sensitivities(clip, scale, dim)
            return skellam_mu_for_epsilon(epsilon, l1, l2, compositions, delta)

        def fits(scale: float) -> bool:
            return self._fits_at(scale, epsilon, clip, dim, compositions, delta)

        m = self.cohort

        lo = 1e-6 / clip  # below one grid step per clip: rounding alone sets Delta_2
        if not fits(lo):
            need = next(
                (
                    b
                    for b in range(self.bits + 1, 33)
                    if replace(self, bits=b)._fits_at(lo, epsilon, clip, dim, compositions, delta)
                ),
                None,
            )
            raise ValueError(
                f"bits={self.bits} cannot carry a cohort of {m} at epsilon {epsilon:g} over "
                f"{compositions} participations: the noise that epsilon needs at the finest "
                f"sensitivity (the rounding's own, about sqrt(d)/2 = {math.sqrt(dim) / 2:.0f} "
                f"grid steps for d={dim}) wraps modulo 2^{self.bits} with chance above "
                f"wrap_probability={self.wrap_probability:g}; "
                + (
                    f"use bits >= {need}"
                    if need
                    else "no bits <= 32 can: lower the rounds, raise epsilon or use min-separation"
                )
            )
        hi = lo
        while fits(hi * 2.0):
            hi *= 2.0
            if hi * clip > 2.0**self.bits:
                break
        hi_out = hi * 2.0
        for _ in range(40):  # bisection on log gamma
            mid = math.sqrt(hi * hi_out)
            hi, hi_out = (mid, hi_out) if fits(mid) else (hi, mid)
            if hi_out / hi < 1.001:
                break
        return hi, noise_at(hi)

    def _fits_at(
        self, scale: float, epsilon: float, clip: float, dim: int, compositions: int, delta: float
    ) -> bool:
        """Whether grid scale ``scale``, with the noise that meets ``epsilon`` there, keeps
        the wrap bound below :attr:`wrap_probability`."""
        l1, l2 = self.sensitivities(clip, scale, dim)
        mu = skellam_mu_for_epsilon(epsilon, l1, l2, compositions, delta)
        total = self.cohort * mu / self.honest
        bound = wrap_bound(self.bits, self.cohort, scale * clip, dim, total, SPREAD[self.rotation])
        return bound <= self.wrap_probability

    def default_hyper(self, num_clients: int, rounds: int) -> DistributedHyper:
        """``C = 0.1``; ``gamma``, ``mu`` and ``Delta_2`` NaN until :meth:`resolve`."""
        schedule = None
        if isinstance(self.participation, MinSeparation):
            schedule = jnp.asarray(self.participation.schedule_for(num_clients, rounds))
        nan = _f32(jnp.nan)
        return DistributedHyper(
            initial_clip=_f32(0.1),
            grid_scale=nan,
            noise=nan,
            l2_bound=nan,
            l1_bound=nan,
            schedule=schedule,
        )

    def resolve(
        self,
        hyper: DistributedHyper,
        num_clients: int,
        spec: Any,
        epsilon_target: float | None,
        dim: int,
    ) -> DistributedHyper:
        """One variant's final numbers, checked before any work: a finite
        ``epsilon_target`` derives ``gamma`` and ``mu`` (:meth:`calibrate`); otherwise
        both must be set (``mu = 0``: secure aggregation without noise); ``Delta_2``
        follows from ``C`` and ``gamma``."""
        n = check_int("num_clients", num_clients, 1)
        if self.cohort > n:
            raise ValueError(f"cohort must be <= num_clients ({n}); got {self.cohort}")
        check_delta(spec.delta)
        inf = math.inf
        clip = check_range("clip", stored(hyper.initial_clip), 0.0, inf, low_open=True)
        k = self.compositions(n, spec.rounds)
        if epsilon_target is not None and math.isfinite(epsilon_target):
            scale, mu = self.calibrate(float(epsilon_target), clip, dim, k, spec.delta)
        else:
            scale, mu = stored(hyper.grid_scale), stored(hyper.noise)
            if math.isnan(scale) or math.isnan(mu):
                raise ValueError(
                    "grid_scale and noise must be set without a target epsilon (noise=0: "
                    f"secure aggregation without DP); got grid_scale={scale}, noise={mu}"
                )
        check_range("grid_scale", scale, 0.0, inf, low_open=True, high_open=True)
        check_range("noise", mu, 0.0, inf, high_open=True)
        l1, l2 = self.sensitivities(clip, scale, dim)
        return hyper.replace(
            grid_scale=_f32(scale), noise=_f32(mu), l2_bound=_f32(l2), l1_bound=_f32(l1)
        )

    def epsilon(self, hyper: DistributedHyper, compositions: int, delta: float) -> float:
        """Epsilon of ``compositions`` participations under ``hyper`` at ``delta`` (RDP)."""
        mu = float(np.asarray(hyper.noise))
        if mu <= 0:
            return math.inf
        l1, l2 = float(np.asarray(hyper.l1_bound)), float(np.asarray(hyper.l2_bound))
        return skellam_epsilon(mu, l1, l2, compositions, delta)

    def describe(self, num_clients: int | None = None) -> str:
        """One line for the privacy record: the mechanism and its trust model."""
        n = 0 if num_clients is None else num_clients
        return (
            f"distributed Skellam noise under secure aggregation ({self.bits}-bit residues, "
            f"randomized {self.rotation.upper()} rotation, conditional rounding) over "
            f"{self.participation.describe(n)}; noise counted from h={self.honest} honest "
            f"survivors (rounds with fewer than {self.threshold} survivors are refused; up "
            f"to {self.max_colluders} clients assumed to collude with the server); the "
            "server sees only masked uploads and the sum modulo 2^b"
        )

    own_guarantee = True
    """The accounted epsilon is always this run's own (no simulated deployment)."""

    def guarantee(self) -> str:
        """What the accounted epsilon covers, in one line for a summary."""
        return (
            f"this run's own (user-level; the server sees only masked {self.bits}-bit uploads "
            f"and their noised sum; noise of {self.honest} honest survivors counted)"
        )

    def released(self, release: Any) -> Any:
        """A ledger lists the release unchanged: its epsilon is the run's own."""
        return release

    def settings(self, num_clients: int, rounds: int) -> dict[str, Any]:
        """The plan's settings as a summary row states them (flat, JSON-able):
        ``participation`` and its fields (a min-separation's ``b`` and ``k`` as they hold),
        ``noise`` (``"skellam"``), ``bits``, ``min_survivors``, ``max_colluders``, ``honest``,
        ``dropout``, ``wrap_probability``, ``beta``, ``tries``, ``degree``."""
        p = self.participation
        out: dict[str, Any] = {"participation": p.name}
        if isinstance(p, MinSeparation):
            scheme = p.scheme(num_clients, rounds)
            out.update(
                cohort=p.cohort,
                schedule=p.schedule,
                min_separation=scheme.min_separation,
                max_participations=scheme.participations,
            )
        else:
            out["cohort"] = p.size
        out.update(
            noise="skellam",
            bits=self.bits,
            min_survivors=self.threshold,
            max_colluders=self.max_colluders,
            honest=self.honest,
            dropout=self.dropout,
            wrap_probability=self.wrap_probability,
            beta=self.beta,
            tries=self.tries,
            degree=self.mask_degree,
        )
        return out

    def floating_point(self) -> str:
        """What the sampler and the float steps mean for the guarantee."""
        return (
            "integer release: the sum is exact modulo 2^b; the Skellam sampler's float32 "
            "acceptance tests make its pmf Poisson's up to float32 rounding (the accounting "
            "assumes exact Skellam noise); rotation and scaling are float32 but every "
            "rounded vector's norm is checked conservatively, so Delta_2 holds exactly"
        )

    # ------------------------------------------------------------------ device side

    def init(self, hyper: DistributedHyper) -> DistributedState:
        """The plan's server state before round 1."""
        zero = jnp.zeros((), jnp.int32)
        return DistributedState(rounds=zero, refused=zero, schedule=hyper.schedule)

    def select(self, state: DistributedState, key: PRNGKeyArray, n: int) -> Bool[Array, " N"]:
        """``(N,)`` the public cohort of this round."""
        return self.participation.select(state, key, n)

    @staticmethod
    def signs(rounds: Int[Array, ""], dim: int) -> Float[Array, " d"]:
        """The public rotation signs of the round ``rounds`` (0-based)."""
        return rotation_signs(jax.random.fold_in(jax.random.key(_ROTATION_SEED), rounds), dim)

    def encode(
        self,
        update: PyTree,
        hyper: DistributedHyper,
        rounds: Int[Array, ""],
        key: PRNGKeyArray,
    ) -> UInt32[Array, " d"]:
        """What one client uploads before masking: ``(d,)`` uint32 residues modulo
        ``2^b`` of its clipped, rotated, scaled, rounded update plus its ``Sk(mu / h)``
        share. ``key``: the client's own secret key."""
        clipped, _, _ = clip_update(update, hyper.initial_clip)
        flat, _ = ravel_pytree(clipped)
        dim = self.dimension(flat.shape[0])
        x = jnp.pad(flat.astype(jnp.float32), (0, dim - flat.shape[0]))
        x = rotate(x, self.signs(rounds, dim), self.rotation) * hyper.grid_scale
        k_round, k_noise = jax.random.split(jax.random.fold_in(key, _ENCODE_TAG))
        z, _ = conditional_round(k_round, x, certified_bound(hyper.l2_bound, dim), self.tries)
        share = skellam(k_noise, hyper.noise / self.honest, (dim,))
        return to_residues(z + share, self.bits)

    def release(
        self,
        state: DistributedState,
        encoded: UInt32[Array, "S d"],
        mask: Bool[Array, " S"],
        ids: Int[Array, " S"],
        key: PRNGKeyArray,
        hyper: DistributedHyper,
        like: PyTree,
    ) -> tuple[PyTree, Bool[Array, " S"], Bool[Array, ""], DistributedState]:
        """The round's release from the cohort's encoded uploads: ``(decoded sum shaped
        like ``like``, survivors (public), ok, next state)``: :meth:`secure_sum` then
        :meth:`decode`. ``ok`` False (fewer than ``min_survivors``): a zero sum, the round
        refused."""
        total, survived, ok = self.secure_sum(encoded, mask, ids, key)
        decoded, state = self.decode(state, total, ok, hyper, like)
        return decoded, survived, ok, state

    def secure_sum(
        self,
        encoded: UInt32[Array, "S d"],
        mask: Bool[Array, " S"],
        ids: Int[Array, " S"],
        key: PRNGKeyArray,
    ) -> tuple[UInt32[Array, " d"], Bool[Array, " S"], Bool[Array, ""]]:
        """The simulated secure aggregation of the cohort's encoded uploads: ``(total,
        survived, ok)``. The clients' masking is simulated first
        (:func:`~swarmjax.privacy.secagg.masked_uploads`, a client of ``mask`` dropping
        with chance :attr:`dropout`); the server then reads only the survivors' masked
        uploads (:func:`~swarmjax.privacy.secagg.unmask_sum`); both as one
        :func:`~swarmjax.privacy.secagg.secure_sum`, which adds each tile of the
        survivors' masked uploads as it is made. ``total``: ``(d,)`` uint32,
        the survivors' residues summed modulo ``2^b`` (zeros unless ``ok``); ``survived``
        ``(S,)`` (public); ``ok``: at least ``min_survivors`` survived. A deployment computes
        the same three with real cryptography
        (:mod:`swarmjax.fl.runtime.flower.secagg`)."""
        stay = jax.random.uniform(jax.random.fold_in(key, _DROP_TAG), mask.shape) >= self.dropout
        rnd = SecAggRound(
            key=jax.random.fold_in(key, _MASK_TAG),
            ids=ids,
            selected=mask,
            survived=mask & stay,
            bits=self.bits,
            threshold=self.threshold,
            degree=self.mask_degree,
            colluders=self.max_colluders,
        )
        total, ok = secagg.secure_sum(encoded, rnd)
        return total, rnd.survived, ok

    def decode(
        self,
        state: DistributedState,
        total: UInt32[Array, " d"],
        ok: Bool[Array, ""],
        hyper: DistributedHyper,
        like: PyTree,
    ) -> tuple[PyTree, DistributedState]:
        """The server's decoding of a round's secure sum, the one definition the simulator
        (:meth:`release`) and a deployment share: ``(decoded sum shaped like like, next
        state)``.

        ``total``: ``(d,)`` uint32, the survivors' residues summed modulo ``2^b``
        (grid units). The residues are centred to ``[-2^(b-1), 2^(b-1))``, divided by
        ``gamma`` (back to parameter units), un-rotated with the round's public signs and
        cut to the ``n`` parameters of ``like``. ``ok`` False (a refused round): the
        caller passes zeros and keeps its model; the state counts the round as refused."""
        flat_like, unravel = ravel_pytree(like)
        n = flat_like.shape[0]
        dim = total.shape[-1]
        centred = from_residues(total, self.bits).astype(jnp.float32)
        signs = self.signs(state.rounds, dim)
        decoded = unrotate(centred / hyper.grid_scale, signs, self.rotation)[:n]
        state = state.replace(rounds=state.rounds + 1, refused=state.refused + (~ok))
        return unravel(decoded.astype(flat_like.dtype)), state

    def accounted_steps(self, state: DistributedState) -> Int[Array, ""]:
        """Participations of the worst-placed client so far: every round under a fixed
        cohort; ``ceil(rounds / b)`` (at most ``k``) under min-separation."""
        p = self.participation
        if isinstance(p, MinSeparation):
            b = p.min_separation or 1  # None only for schedule="single": once per client
            steps = (state.rounds + b - 1) // b if p.schedule != "single" else state.rounds > 0
            steps = jnp.asarray(steps, jnp.int32)
            cap = p.max_participations
            return steps if cap is None else jnp.minimum(steps, cap)
        return state.rounds

    def rates(self, hyper: DistributedHyper, num_clients: int) -> Rates:
        """Host side: what the privacy record states beside :meth:`accounted_steps` for runs
        of ``hyper`` (leading run axis ``R``): ``q = 1`` (a public cohort) and ``sigma =
        sqrt(2 mu) / Delta_2`` (the Gaussian multiplier of equal variance; the record
        composes the plan's Skellam :meth:`event`), both ``(R, N)``; nothing overflows."""
        sigma = np.asarray(hyper.noise_multiplier).reshape(-1, 1)
        sigma = np.repeat(sigma, num_clients, axis=1)
        return Rates(np.ones(sigma.shape, sigma.dtype), sigma)

    def metrics(self, state: DistributedState) -> dict[str, Array]:
        """Public metrics: rounds refused so far."""
        return {"refused_rounds": state.refused}
