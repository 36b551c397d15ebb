"""DP-FTRL's correlated noise: matrix-factorization strategies, their min-separation
sensitivity and the streaming noise generator, on ``jax_privacy.matrix_factorization``.

The mechanism (Kairouz et al. 2021; Choquette-Choo et al. 2023, arXiv 2306.08153; Dvijotham
et al. 2024, arXiv 2404.16706). Over ``T`` rounds the server releases the prefix sums
``A x`` of the per-round clipped sums ``x_1..x_T`` (``A``: the ``T x T`` lower-triangular
ones; SGD on the released sums is a post-processing of them). A factorization ``A = B C``
releases ``B (C x + z)`` with ``z ~ N(0, s^2 I)``, i.e. round ``t`` releases the noised sum

    ``x_t + (C^{-1} z)_t``

and the whole run is ONE Gaussian mechanism on ``C x``: with every client's contribution to
each round's sum at most ``clip`` in L2 and at most ``k`` contributions at least ``b``
rounds apart, ``||C (x - x')||_2 <= clip * sens`` where ``sens`` is the
``(k, b)``-min-separation sensitivity of ``C`` (:func:`build_strategy`, from jax-privacy),
so ``s = z_mult * clip * sens`` gives a Gaussian mechanism of noise multiplier ``z_mult``
(dp-accounting's ``GaussianDpEvent``; see
:meth:`swarmjax.privacy.plan.PrivacyPlan.min_separation_cohorts`).
Continual release with adaptively chosen inputs keeps that guarantee for lower-triangular
``C`` (Denisov et al. 2022, Theorem 2.1).

Factorizations (:data:`FACTORIZATIONS`), all lower-triangular ``T x T``:

* ``"blt"`` (default): a buffered-linear-Toeplitz ``C`` optimised by jax-privacy for the
  participation scheme (``buffered_toeplitz.optimize``); ``C^{-1}`` is applied with
  ``buffers`` running buffers of the model's size.
* ``"banded"``: a ``bands``-banded Toeplitz ``C`` optimised by jax-privacy
  (``toeplitz.optimize_banded_toeplitz``), column-normalised
  (``banded.ColumnNormalizedBanded``); ``C^{-1}`` keeps the last ``bands`` noises. Needs
  ``bands <= min_separation`` (then its sensitivity is exactly ``sqrt(k)``).
* ``"prefix-sum"``: the plain factorization ``B = A, C = I``: independent noise each round,
  DP-SGD's noise (the baseline; its sensitivity is ``sqrt(k)``).

The noise state holds only what ``C^{-1}`` needs (a BLT's buffers, a band's last noises, or
nothing), so it does not grow with the rounds (:func:`noise_state`). The strategy's
coefficients are public constants: a BLT's ``2 * buffers`` numbers, a banded strategy's
``T x bands`` column-normalised band.

Participation (:class:`Participation`, :func:`cohort_schedule`, :func:`check_schedule`):
fixed-size cohorts of ``m`` clients per round, each client at most ``k`` times and at least
``b`` rounds apart (``b = 1``: consecutive rounds allowed; jax-privacy's ``min_sep``),
assigned cyclically or at random subject to the rule, or single participation
(``k = 1``). The schedule is public and fixed before training, independent of the data.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax_privacy.matrix_factorization import banded, buffered_toeplitz, streaming_matrix, toeplitz
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray, PyTree

from swarmjax._validation import check_choice, check_int

__all__ = [
    "FACTORIZATIONS",
    "SCHEDULES",
    "Participation",
    "Strategy",
    "build_strategy",
    "check_schedule",
    "cohort_schedule",
    "correlated_noise",
    "noise_state",
    "strategy_matrix",
]

Factorization = Literal["blt", "banded", "prefix-sum"]
Schedule = Literal["cyclic", "random", "single"]

FACTORIZATIONS: tuple[str, ...] = ("blt", "banded", "prefix-sum")
"""Strategy matrices by name: ``"blt"`` (default), ``"banded"``, ``"prefix-sum"`` (C = I)."""

SCHEDULES: tuple[str, ...] = ("cyclic", "random", "single")
"""Cohort schedules: ``"cyclic"`` (a fixed random order of the clients walked ``m`` at a
time), ``"random"`` (each round ``m`` clients uniformly among those the rule allows) and
``"single"`` (each client at most once)."""

MAX_BANDS = 32
"""Default cap on a banded strategy's bands (jax-privacy: ``b <= 32`` is the regime where
banded Toeplitz strategies are near-optimal)."""


@dataclass(frozen=True)
class Participation:
    """``(k, b)``-min-separation participation over ``rounds`` rounds: each client takes part
    at most ``max_participations`` times, any two of them at least ``min_separation``
    rounds apart (rounds ``i < j`` with ``j - i >= b``).

    Attributes:
        rounds: ``T >= 1``.
        min_separation: ``b`` in ``[1, T]``.
        max_participations: ``k >= 1`` with ``(k - 1) b + 1 <= T`` (``k`` participations
            ``b`` apart fit in ``T`` rounds), or ``None``: as many as fit,
            ``ceil(T / b)``.
    """

    rounds: int
    min_separation: int
    max_participations: int | None = None

    def __post_init__(self) -> None:
        t = check_int("rounds", self.rounds, 1)
        b = check_int("min_separation", self.min_separation, 1)
        if b > t:
            raise ValueError(f"min_separation must be <= rounds ({t}); got {b}")
        if self.max_participations is not None:
            k = check_int("max_participations", self.max_participations, 1)
            if k > -(-t // b):
                raise ValueError(
                    f"max_participations must be <= ceil(rounds / min_separation) = "
                    f"{-(-t // b)} ({k} participations {b} rounds apart need "
                    f"{(k - 1) * b + 1} rounds, the run has {t}); got {k}"
                )

    @classmethod
    def single(cls, rounds: int) -> Participation:
        """Each client at most once (``k = 1``, ``b = T``)."""
        return cls(rounds, check_int("rounds", rounds, 1), 1)

    @property
    def participations(self) -> int:
        """``k``, the most participations of one client the scheme allows (jax-privacy's
        ``minsep_true_max_participations``)."""
        from jax_privacy.matrix_factorization.sensitivity import minsep_true_max_participations

        return int(
            minsep_true_max_participations(
                self.rounds, self.min_separation, self.max_participations
            )
        )

    def describe(self) -> str:
        """One line: ``k`` and ``b`` over ``T`` rounds."""
        return (
            f"each client at most k={self.participations} times, at least "
            f"b={self.min_separation} rounds apart, over T={self.rounds} rounds"
        )


@flax.struct.dataclass
class Strategy:
    """A strategy matrix ``C`` (``T x T``, lower-triangular) in the form its streaming
    inverse needs, and its sensitivity (a pytree: it travels in a run's hyper-parameters).

    Attributes:
        factorization: one of :data:`FACTORIZATIONS` (static).
        buf_decay, output_scale: ``(buffers,)`` float32: a BLT's parameters (jax-privacy's
            ``BufferedToeplitz``); ``(0,)`` for the other factorizations.
        band: ``(T, bands)`` float32: a banded strategy's parameters (jax-privacy's
            ``ColumnNormalizedBanded.params``); ``(0, 0)`` otherwise.
        sensitivity: ``sens``, the ``(k, b)``-min-separation L2 sensitivity of ``C`` for
            contributions of norm at most 1 (unitless; multiply by the clip norm).
    """

    buf_decay: Float[Array, " buffers"]
    output_scale: Float[Array, " buffers"]
    band: Float[Array, "T bands"]
    sensitivity: Float[Array, ""]
    factorization: str = flax.struct.field(pytree_node=False, default="blt")

    def inverse(self) -> streaming_matrix.StreamingMatrix:
        """``C^{-1}`` as jax-privacy's ``StreamingMatrix`` (works under ``jit``/``vmap``)."""
        if self.factorization == "blt":
            builder = buffered_toeplitz.StreamingMatrixBuilder(
                buf_decay=self.buf_decay, output_scale=self.output_scale
            )
            return builder.build_inverse()
        if self.factorization == "banded":
            return banded.ColumnNormalizedBanded(params=self.band).inverse_as_streaming_matrix()
        return streaming_matrix.identity()


def _check_factorization(factorization: str) -> str:
    return check_choice("factorization", factorization, FACTORIZATIONS)


def build_strategy(
    factorization: Factorization,
    participation: Participation,
    *,
    bands: int | None = None,
    buffers: int | None = None,
    error: Literal["mean", "max"] = "mean",
) -> Strategy:
    """The strategy of ``factorization`` for ``participation``, built and optimised by
    jax-privacy, with its min-separation sensitivity (host side; cached per arguments).

    Args:
        factorization: ``"blt"``, ``"banded"`` or ``"prefix-sum"`` (:data:`FACTORIZATIONS`).
        participation: rounds ``T``, min separation ``b`` and participations ``k``.
        bands: ``"banded"`` only: bands of ``C``, in ``[1, b]``; ``None``: ``min(b, 32)``.
        buffers: ``"blt"`` only: buffers of ``C``, ``0..10``; ``None``: jax-privacy picks
            the count (more while the loss improves by 1 %).
        error: what the optimisation minimises over the prefix sums: ``"mean"`` squared
            error (the training loss, as pfl's banded MF) or ``"max"``.

    Returns:
        A :class:`Strategy` (float32 device arrays; the sensitivity is computed in float64
        on the float32 coefficients the device applies).
    """
    _check_factorization(factorization)
    check_choice("error", error, ("mean", "max"))
    if not isinstance(participation, Participation):
        raise TypeError(f"participation must be a Participation; got {type(participation)}")
    if factorization == "banded":
        bands = min(participation.min_separation, MAX_BANDS) if bands is None else bands
        check_int("bands", bands, 1)
        if bands > participation.min_separation:
            raise ValueError(
                f"bands must be <= min_separation ({participation.min_separation}) for a "
                f"banded strategy's min-separation sensitivity; got {bands}"
            )
    elif bands is not None:
        raise ValueError(f"bands applies to factorization='banded' only; got bands={bands}")
    if factorization == "blt":
        if buffers is not None and not 0 <= check_int("buffers", buffers, 0) <= 10:
            raise ValueError(f"buffers must be in [0, 10]; got {buffers}")
    elif buffers is not None:
        raise ValueError(f"buffers applies to factorization='blt' only; got buffers={buffers}")
    return _strategy(factorization, participation, bands, buffers, error)


@functools.lru_cache(maxsize=32)
def _strategy(
    factorization: str,
    participation: Participation,
    bands: int | None,
    buffers: int | None,
    error: str,
) -> Strategy:
    t, b = participation.rounds, participation.min_separation
    k = participation.participations
    f32 = np.float32
    decay = scale = np.zeros((0,), f32)
    band = np.zeros((0, 0), f32)
    with jax.enable_x64():
        if factorization == "blt":
            span = {} if buffers is None else {"min_buffers": buffers, "max_buffers": buffers}
            blt = buffered_toeplitz.optimize(
                n=t, min_sep=b, max_participations=k, error=error, **span
            )
            decay, scale = np.asarray(blt.buf_decay, f32), np.asarray(blt.output_scale, f32)
            applied = buffered_toeplitz.BufferedToeplitz.build(
                decay.astype(np.float64), scale.astype(np.float64)
            )  # the float32 coefficients the device applies
            sens2 = toeplitz.minsep_sensitivity_squared(
                applied.toeplitz_coefs(t), min_sep=b, max_participations=k
            )
        elif factorization == "banded":
            coefs = toeplitz.optimize_banded_toeplitz(
                t, bands=bands, reduction_fn=jnp.mean if error == "mean" else jnp.max
            )
            params = banded.ColumnNormalizedBanded.from_banded_toeplitz(t, coefs).params
            band = np.asarray(params, f32)
            applied = banded.ColumnNormalizedBanded(params=jnp.asarray(band))
            sens2 = banded.minsep_sensitivity_squared(applied, min_sep=b, max_participations=k, n=t)
        else:
            sens2 = toeplitz.minsep_sensitivity_squared(
                jnp.ones((1,)), min_sep=b, max_participations=k, n=t
            )
    return Strategy(
        buf_decay=jnp.asarray(decay),
        output_scale=jnp.asarray(scale),
        band=jnp.asarray(band),
        sensitivity=jnp.asarray(math.sqrt(float(sens2)), f32),
        factorization=factorization,
    )


def strategy_matrix(strategy: Strategy, rounds: int) -> np.ndarray:
    """``C`` materialised by jax-privacy as a ``(rounds, rounds)`` float64 array (tests,
    inspection; never on a hot path)."""
    n = check_int("rounds", rounds, 1)
    with jax.enable_x64():
        if strategy.factorization == "blt":
            blt = buffered_toeplitz.BufferedToeplitz.build(
                np.asarray(strategy.buf_decay, np.float64),
                np.asarray(strategy.output_scale, np.float64),
            )
            return np.asarray(blt.materialize(n), np.float64)
        if strategy.factorization == "banded":
            params = jnp.asarray(np.asarray(strategy.band, np.float64))
            c = banded.ColumnNormalizedBanded(params=params).materialize()
            return np.asarray(c, np.float64)[:n, :n]
    return np.eye(n)


def _size(like: PyTree) -> int:
    """Coordinates of ``like`` (arrays or ``ShapeDtypeStruct`` leaves)."""
    return int(sum(np.prod(jnp.shape(a), dtype=np.int64) for a in jax.tree.leaves(like)))


def noise_state(strategy: Strategy, like: PyTree) -> PyTree:
    """The initial state of ``C^{-1}`` applied to float32 noise over the ``P`` coordinates of
    ``like`` (a pytree of arrays or ``ShapeDtypeStruct``), flattened into one vector: a
    BLT's ``(buffers, P)`` buffers, a banded strategy's round index and ``(bands, P)`` last
    noises, nothing for ``"prefix-sum"``. Its size does not depend on the rounds."""
    flat = jax.ShapeDtypeStruct((_size(like),), jnp.float32)
    return strategy.inverse().init_multiply(flat)


def correlated_noise(
    strategy: Strategy,
    state: PyTree,
    key: PRNGKeyArray,
    like: PyTree,
    std: ArrayLike,
) -> tuple[PyTree, PyTree]:
    """This round's noise ``(C^{-1} z)_t`` and the next state.

    Args:
        strategy: the factorization.
        state: :func:`noise_state`, or the state the previous round returned.
        key: this round's key; ``z_t`` is ONE draw of ``P`` normals from it, scaled by
            ``std`` and cut into the leaves of ``like`` in flattening order (exactly the
            noise :func:`~swarmjax.privacy.mechanisms.gaussian_mechanism` adds with that
            key to a float32 pytree).
        like: the released value's pytree (its shapes; e.g. the clipped sum of the round).
        std: ``s``, the std of ``z`` (noise multiplier x sensitivity x clip), a scalar.

    Returns:
        ``(noise, state)``: float32 noise shaped like ``like``; over rounds its covariance
        is ``s^2 C^{-1} C^{-T}`` per coordinate. ``C^{-1}`` runs on the flat vector (one
        set of buffer operations, not one per leaf: 4x faster on a 1.2 M-parameter model).
    """
    leaves, treedef = jax.tree.flatten(like)
    sizes = [int(np.prod(jnp.shape(a), dtype=np.int64)) for a in leaves]
    z = jnp.asarray(std, jnp.float32) * jax.random.normal(key, (sum(sizes),), jnp.float32)
    flat, state = strategy.inverse().multiply_next(z, state)
    pieces = jnp.split(flat, np.cumsum(sizes)[:-1].tolist())
    noise = [p.reshape(jnp.shape(a)) for p, a in zip(pieces, leaves, strict=True)]
    return jax.tree.unflatten(treedef, noise), state


# ----------------------------------------------------------------------------- schedules


def cohort_schedule(
    kind: Schedule,
    num_clients: int,
    cohort: int,
    participation: Participation,
    seed: int = 0,
) -> np.ndarray:
    """The public cohort of every round: ``(T, cohort)`` int32 client ids (host side).

    Args:
        kind: ``"cyclic"``: the clients in a random order (from ``seed``) walked ``cohort``
            at a time, wrapping around (a client returns every ``floor(N / m)`` or
            ``ceil(N / m)`` rounds); ``"random"``: each round ``cohort`` clients drawn
            uniformly (from ``seed``) among those with fewer than ``k`` participations and
            none in the last ``b - 1`` rounds; ``"single"``: the random order walked once
            (needs ``participation`` with ``k = 1``).
        num_clients: ``N``.
        cohort: ``m`` clients per round, ``1 <= m <= N``.
        participation: the scheme the schedule must satisfy.
        seed: the schedule's public seed.

    Returns:
        The schedule, checked with :func:`check_schedule`. A scheme that the cohort cannot
        fill is a one-line ``ValueError`` naming the option.
    """
    check_choice("schedule", kind, SCHEDULES)
    n = check_int("num_clients", num_clients, 1)
    m = check_int("cohort", cohort, 1)
    if m > n:
        raise ValueError(f"cohort must be <= num_clients ({n}); got {m}")
    t, b, k = participation.rounds, participation.min_separation, participation.participations
    if kind == "single" and k != 1:
        raise ValueError(f"schedule 'single' needs max_participations = 1; got k = {k}")
    if n < m * min(b, t):
        raise ValueError(
            f"cohort must be <= num_clients // min_separation = {n // min(b, t)} (a cohort of "
            f"{m} every round, each client at least {b} rounds apart, needs "
            f"{m * min(b, t)} clients; there are {n}); got {m}"
        )
    if t * m > n * k:
        raise ValueError(
            f"cohort must be <= num_clients * k // rounds = {n * k // t} ({t} rounds of {m} "
            f"need {t * m} slots; {n} clients at most k={k} times give {n * k}); got {m}"
        )
    rng = np.random.default_rng(check_int("schedule_seed", seed, 0))
    if kind in ("cyclic", "single"):
        order = rng.permutation(n)
        out = order[(np.arange(t)[:, None] * m + np.arange(m)[None, :]) % n]
    else:
        out = np.empty((t, m), np.int64)
        last = np.full(n, -b, np.int64)  # round of each client's last participation
        count = np.zeros(n, np.int64)
        for r in range(t):  # rounds in order (each O(N), vectorised over clients)
            free = np.flatnonzero((count < k) & (r - last >= b))
            if free.size < m:
                raise ValueError(
                    f"cohort must be smaller: the random schedule reaches round {r + 1} with "
                    f"only {free.size} clients allowed (k={k}, b={b}) for a cohort of {m}; "
                    "use schedule='cyclic', a smaller cohort or more participations"
                )
            pick = rng.choice(free, m, replace=False)
            out[r], last[pick], count[pick] = pick, r, count[pick] + 1
    out = out.astype(np.int32)
    check_schedule(out, n, participation)
    return out


def check_schedule(schedule: ArrayLike, num_clients: int, participation: Participation) -> None:
    """One-line ``ValueError`` naming ``schedule`` unless it is ``(T, m)`` distinct client
    ids in ``[0, N)`` per round with every client at most ``k`` times, ``b`` rounds apart
    (host side, vectorised; the run refuses such a schedule before any work)."""
    s = np.asarray(schedule)
    t = participation.rounds
    if s.ndim != 2 or s.shape[0] != t or not np.issubdtype(s.dtype, np.integer):
        raise ValueError(f"schedule must be ({t}, cohort) integer client ids; got {s.shape}")
    if s.size and (s.min() < 0 or s.max() >= num_clients):
        raise ValueError(f"schedule must hold client ids in [0, {num_clients})")
    rows = np.sort(s, axis=1)
    dup = np.flatnonzero(np.any(rows[:, 1:] == rows[:, :-1], axis=1))
    if dup.size:
        raise ValueError(f"schedule must not repeat a client within a round (round {dup[0] + 1})")
    k, b = participation.participations, participation.min_separation
    count = np.bincount(s.ravel(), minlength=num_clients)
    over = np.flatnonzero(count > k)
    if over.size:
        c = int(over[0])
        raise ValueError(
            f"schedule refused: client {c} would participate {count[c]} times, more than "
            f"max_participations k={k}"
        )
    rounds = np.repeat(np.arange(t), s.shape[1])
    order = np.lexsort((rounds, s.ravel()))
    ids, when = s.ravel()[order], rounds[order]
    close = np.flatnonzero((ids[1:] == ids[:-1]) & (when[1:] - when[:-1] < b))
    if close.size:
        i = int(close[0])
        raise ValueError(
            f"schedule refused: client {ids[i]} would participate in rounds {when[i] + 1} and "
            f"{when[i + 1] + 1}, closer than min_separation b={b}"
        )


def cohort_ids(schedule: Int[Array, "T m"], round_index: Int[Array, ""]) -> Int[Array, " m"]:
    """Row ``round_index`` (0-based) of the schedule (device side)."""
    return jax.lax.dynamic_index_in_dim(schedule, round_index, keepdims=False)
