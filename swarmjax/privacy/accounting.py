"""Privacy accounting on Google's ``dp_accounting`` library: events, accountants, calibration.

A run's privacy is a dp-accounting ``DpEvent`` (:mod:`swarmjax.privacy.plan` builds it): e.g.
``T`` steps of the Poisson-subsampled Gaussian mechanism (DP-SGD, DP-Adam, DP-FedAvg: each
unit is in a step's batch independently with probability ``q``, the clipped sum gets
``N(0, (sigma C)^2)`` noise) is ``SelfComposedDpEvent(PoissonSampledDpEvent(q,
GaussianDpEvent(sigma)), T)``.  Epsilon comes from composing events with an accountant the
caller names; neighbouring datasets differ by adding or removing one unit (the Gaussian and
Laplace events' analysis also bounds swarmjax's record-level zero-out relation:
docs/privacy.md).

Accountants (:data:`ACCOUNTANTS`):

* ``"pld"`` (the default, and what calibration uses): privacy-loss distributions (Koskela
  et al. 2020; Doroshenko et al. 2022) with dp-accounting's pessimistic discretisation at
  interval :data:`PLD_INTERVAL` = ``1e-3``: an upper bound on the true epsilon at every
  interval (a coarser interval can only raise it: ``1.835059`` instead of ``1.835021`` at
  ``1e-4`` for 100 rounds at ``q = 50/1200``, ``sigma = 1``, ``delta = 1/1200``), ten times
  faster than dp-accounting's default ``1e-4`` (0.05 s instead of 0.5 s per evaluation on
  the project's CPU).  RDP overstates epsilon by 13-32 % against it on every shipped
  configuration, so at the same target PLD calibrates less noise (as pfl does).
* ``"rdp"``: Renyi DP (Mironov 2017; Mironov, Talwar & Zhang 2019) with the improved
  RDP -> (epsilon, delta) conversion of Canonne, Kamath & Steinke (2020, Prop. 12), which
  Opacus uses too; about ten times faster than PLD, looser.

Events supported: ``GaussianDpEvent``, ``LaplaceDpEvent``, ``PoissonSampledDpEvent`` of
either, ``SelfComposedDpEvent``, ``ComposedDpEvent``, ``NoOpDpEvent``,
``NonPrivateDpEvent`` (epsilon ``inf``), :class:`PureDpEvent` (any ``epsilon``-DP
release, e.g. a random dictatorship's vote; PLD: its dominating pair, RDP:
``min(epsilon, alpha epsilon^2 / 2)``, Bun & Steinke 2016) and
:class:`~swarmjax.privacy.skellam.SkellamDpEvent` (multi-dimensional Skellam mechanism: RDP
only, integer orders only; ``accountant="pld"`` refuses it, and so does
``PoissonSampledDpEvent`` around it: :mod:`swarmjax.privacy.skellam`).

Sampler overflow: a static-shape Poisson buffer redraws an overflowing draw; with ``P`` the
summed per-step overflow chance, :func:`event_epsilon` returns the smallest ``eps`` (a
fixed-point iteration) such that the exact-Poisson mechanism is
``(eps, delta - P (1 + e^eps))``-DP, so the sampler used is ``(eps, delta)``-DP
(:func:`swarmjax.privacy.sampling.sampler_delta`).  For a PLD that epsilon comes in closed
form from the PMF's suffix sums (:func:`_pmf_epsilon`; ``P = 0``: dp-accounting's
``get_epsilon_for_delta``) and holds by dp-accounting's own ``get_delta_for_epsilon``,
checked for each value (:func:`_pld_with_overflow`; docs/cross_device.md has the costs).

Warnings.  For fractional orders at large ``q`` and moderate ``sigma`` ``dp_accounting``
logs ``_compute_log_a_frac failed to converge ... Excluding this order`` (absl, WARNING),
dozens of times per bisection.  Excluding an order can only raise the reported epsilon (a
minimum over fewer orders), so the bound stays valid; this module drops exactly that message
while it computes an RDP curve and lets every other log record through.

RDP order grid: dp-accounting's :data:`DEFAULT_RDP_ORDERS` (``1.1 .. 10.9`` step 0.1,
``11 .. 63``, ``128 .. 1024``): Opacus's grid plus order 11 and large orders.  Published
values: Opacus's test (sigma 1.5, q 0.04, 2250 steps, delta 1e-5) reports 7.32911, we get
7.32933 by RDP (dp-accounting's fractional-order series errs 3e-5 relative on the
conservative side); TF-Privacy's test (q 0.0025, sigma 1.3, 6000 steps, delta 1e-5) reports
0.7242234, reproduced to 1e-12 by RDP.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import attr
import dp_accounting
import numpy as np
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant

from swarmjax._validation import (
    check_choice,
    check_int,
    check_nonnegative,
    check_positive,
    check_range,
)
from swarmjax.privacy.mechanisms import (
    gaussian_sigma,
    random_dictatorship_epsilon,
    randomized_response_epsilon,
)
from swarmjax.privacy.skellam import SkellamDpEvent, skellam_rdp

__all__ = [
    "ACCOUNTANTS",
    "DEFAULT_ACCOUNTANT",
    "DEFAULT_ORDERS",
    "PLD_INTERVAL",
    "PrivacyAccountant",
    "PureDpEvent",
    "Rates",
    "advanced_composition",
    "basic_composition",
    "check_accountant",
    "epsilon",
    "epsilon_curve",
    "event_epsilon",
    "event_from_dict",
    "event_to_dict",
    "gaussian_sigma",
    "parallel_composition",
    "poisson_gaussian_event",
    "random_dictatorship_epsilon",
    "randomized_response_epsilon",
    "sigma_for_epsilon",
]


@dataclasses.dataclass(frozen=True)
class Rates:
    """What a privacy record composes with each client's counted steps (host side, NumPy):
    the mechanism's parameters of every client, for runs ``R``, rounds ``T`` and clients
    ``N``.

    Attributes:
        sample_rate: the Poisson rate ``q`` of an accounted step (``1``: a public cohort;
            ``0`` without noise), broadcastable to ``(R, T, N)``.
        noise_multiplier: its noise multiplier ``sigma`` (``0`` without noise),
            broadcastable to ``(R, T, N)``.
        overflow: ``None`` (nothing can overflow), or the per-step chance that a
            static-size Poisson draw the privacy rests on overflowed (a client's batch
            buffer, or the draw of clients), broadcastable to ``(R, T, N)``: charged to
            delta.
        extra_epsilon: ``None``, or the epsilon of other noised releases after each round,
            broadcastable to ``(R, T, N)``, added by basic composition.
    """

    sample_rate: np.ndarray | float = 0.0
    noise_multiplier: np.ndarray | float = 0.0
    overflow: np.ndarray | None = None
    extra_epsilon: np.ndarray | None = None


ACCOUNTANTS: tuple[str, ...] = ("pld", "rdp")
DEFAULT_ACCOUNTANT = "pld"
PLD_INTERVAL = 1e-3
DEFAULT_ORDERS: tuple[float, ...] = tuple(rdp_privacy_accountant.DEFAULT_RDP_ORDERS)


def check_accountant(accountant: str) -> str:
    """``accountant`` if it is one of :data:`ACCOUNTANTS`, else a one-line ``ValueError``."""
    return check_choice("accountant", accountant, ACCOUNTANTS)


@attr.define(frozen=True)
class PureDpEvent(dp_accounting.DpEvent):
    """Any ``epsilon``-DP release (pure DP, no delta): e.g. a DP random dictatorship or
    randomized response whose epsilon its own mechanism states."""

    epsilon: float


# ------------------------------------------------------------------------------- events


def poisson_gaussian_event(q: float, sigma: float, steps: int) -> dp_accounting.DpEvent:
    """``steps`` Poisson-subsampled Gaussian steps at rate ``q`` and noise multiplier
    ``sigma`` (``q = 1``: every unit in every step, no subsampling)."""
    q, sigma = _check_q(q), _check_sigma(sigma)
    steps = check_int("steps", steps, minimum=0)
    if steps == 0:
        return dp_accounting.NoOpDpEvent()
    if sigma == 0.0:
        return dp_accounting.NonPrivateDpEvent()
    one: dp_accounting.DpEvent = dp_accounting.GaussianDpEvent(sigma)
    if q < 1.0:
        one = dp_accounting.PoissonSampledDpEvent(q, one)
    return one if steps == 1 else dp_accounting.SelfComposedDpEvent(one, steps)


_KINDS: dict[str, type] = {
    "gaussian": dp_accounting.GaussianDpEvent,
    "laplace": dp_accounting.LaplaceDpEvent,
    "poisson_sampled": dp_accounting.PoissonSampledDpEvent,
    "self_composed": dp_accounting.SelfComposedDpEvent,
    "composed": dp_accounting.ComposedDpEvent,
    "no_op": dp_accounting.NoOpDpEvent,
    "non_private": dp_accounting.NonPrivateDpEvent,
    "pure": PureDpEvent,
    "skellam": SkellamDpEvent,
}


def event_to_dict(event: dp_accounting.DpEvent) -> dict[str, Any]:
    """A JSON-able description of ``event`` (:func:`event_from_dict` inverts it)."""
    kind = {cls: name for name, cls in _KINDS.items()}.get(type(event))
    if kind is None:
        raise ValueError(f"event {event!r} is not one swarmjax accounts ({', '.join(_KINDS)})")
    out: dict[str, Any] = {"kind": kind}
    for name, value in attr.asdict(event, recurse=False).items():
        if isinstance(value, dp_accounting.DpEvent):
            out[name] = event_to_dict(value)
        elif isinstance(value, list | tuple):
            out[name] = [event_to_dict(e) for e in value]
        else:
            out[name] = value
    return out


def event_from_dict(data: dict[str, Any]) -> dp_accounting.DpEvent:
    """The event :func:`event_to_dict` described."""
    fields = dict(data)
    cls = _KINDS[check_choice("event kind", fields.pop("kind", None), _KINDS)]
    for name, value in fields.items():
        if isinstance(value, dict):
            fields[name] = event_from_dict(value)
        elif isinstance(value, list):
            fields[name] = [event_from_dict(v) for v in value]
    return cls(**fields)


# ------------------------------------------------------------------------------ checks


def _check_q(q: float) -> float:
    check_range("q", q, 0.0, 1.0, low_open=True)
    return float(q)


def _check_sigma(sigma: float) -> float:
    check_nonnegative("sigma", sigma)
    return float(sigma)


def _check_delta(delta: float) -> float:
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    return float(delta)


def _orders_tuple(orders: Iterable[float] | None) -> tuple[float, ...]:
    if orders is None:
        return DEFAULT_ORDERS
    out = tuple(float(a) for a in orders)
    if not out:
        raise ValueError("orders must not be empty")
    check_range("orders", out, 1.0, math.inf, low_open=True)
    return out


_NOT_CONVERGED = "_compute_log_a_frac failed to converge"


def _not_convergence_warning(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_NOT_CONVERGED)


@contextlib.contextmanager
def _without_convergence_warnings() -> Iterator[None]:
    logger = logging.getLogger("absl")
    logger.addFilter(_not_convergence_warning)
    try:
        yield
    finally:
        logger.removeFilter(_not_convergence_warning)


# ------------------------------------------------------------------------------ RDP side


@functools.lru_cache(maxsize=4096)
def _rdp_leaf(event: dp_accounting.DpEvent, orders: tuple[float, ...]) -> np.ndarray:
    """RDP curve (one value per order) of one non-composite event."""
    if isinstance(event, PureDpEvent):
        a = np.asarray(orders)
        return np.minimum(event.epsilon, a * event.epsilon**2 / 2.0)
    if isinstance(event, SkellamDpEvent):
        rdp = skellam_rdp(orders, event.mu, event.l1_sensitivity, event.l2_sensitivity)
        rdp.setflags(write=False)
        return rdp
    if isinstance(event, dp_accounting.PoissonSampledDpEvent) and _has_skellam(event):
        raise ValueError("no amplification by sampling is claimed for SkellamDpEvent")
    acc = rdp_privacy_accountant.RdpAccountant(list(orders))
    with _without_convergence_warnings():
        acc.compose(event)
    rdp = acc._rdp.copy()  # the accountant exposes no public getter for the curve
    rdp.setflags(write=False)
    return rdp


def _rdp_curve(event: dp_accounting.DpEvent, orders: tuple[float, ...]) -> np.ndarray:
    if isinstance(event, dp_accounting.NoOpDpEvent):
        return np.zeros(len(orders))
    if isinstance(event, dp_accounting.NonPrivateDpEvent):
        return np.full(len(orders), np.inf)
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        if event.count == 0:  # 0 * inf (an order a leaf leaves unclaimed) would be nan
            return np.zeros(len(orders))
        return event.count * _rdp_curve(event.event, orders)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return sum((_rdp_curve(e, orders) for e in event.events), np.zeros(len(orders)))
    return _rdp_leaf(event, orders)


def _rdp_epsilon(rdp: np.ndarray, orders: tuple[float, ...], delta: float) -> float:
    if not np.any(rdp):
        return 0.0
    if np.all(np.isinf(rdp)):
        return math.inf
    eps, _ = rdp_privacy_accountant.compute_epsilon(list(orders), list(rdp), delta)
    return float(eps)


# ------------------------------------------------------------------------------ PLD side

_Pld = pld_lib.PrivacyLossDistribution


@functools.lru_cache(maxsize=1024)
def _pld_leaf(event: dp_accounting.DpEvent) -> _Pld:
    """Pessimistic PLD of one non-composite event at :data:`PLD_INTERVAL`."""
    q, inner = 1.0, event
    if isinstance(event, dp_accounting.PoissonSampledDpEvent):
        q, inner = float(event.sampling_probability), event.event
    if isinstance(inner, dp_accounting.GaussianDpEvent):
        return pld_lib.from_gaussian_mechanism(
            inner.noise_multiplier, sampling_prob=q, value_discretization_interval=PLD_INTERVAL
        )
    if isinstance(inner, dp_accounting.LaplaceDpEvent):
        return pld_lib.from_laplace_mechanism(
            inner.noise_multiplier, sampling_prob=q, value_discretization_interval=PLD_INTERVAL
        )
    if isinstance(event, PureDpEvent):
        params = pld_common.DifferentialPrivacyParameters(event.epsilon, 0.0)
        return pld_lib.from_privacy_parameters(params, value_discretization_interval=PLD_INTERVAL)
    raise ValueError(f"event {event!r} is not one swarmjax accounts ({', '.join(_KINDS)})")


def _pld(event: dp_accounting.DpEvent) -> _Pld | None:
    """The event's PLD; ``None`` for a no-op."""
    if isinstance(event, dp_accounting.NoOpDpEvent):
        return None
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        inner = _pld(event.event)
        return None if inner is None or event.count == 0 else inner.self_compose(event.count)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        out = None
        for e in event.events:
            part = _pld(e)
            out = part if out is None else out if part is None else out.compose(part)
        return out
    return _pld_leaf(event)


def _has_skellam(event: dp_accounting.DpEvent) -> bool:
    """Whether ``event`` holds a :class:`SkellamDpEvent` anywhere in its tree."""
    if isinstance(event, SkellamDpEvent):
        return True
    inner = getattr(event, "event", None)
    parts = [inner] if isinstance(inner, dp_accounting.DpEvent) else []
    return any(_has_skellam(e) for e in [*parts, *getattr(event, "events", [])])


def _refuse_skellam_pld(events: Iterable[dp_accounting.DpEvent]) -> None:
    if any(_has_skellam(e) for e in events):
        raise ValueError(
            "dp-accounting's PLD cannot represent the multi-dimensional Skellam mechanism; "
            "use accountant='rdp'"
        )


def _private(event: dp_accounting.DpEvent) -> bool:
    """False when the event holds a non-private part (epsilon is ``inf``)."""
    if isinstance(event, dp_accounting.NonPrivateDpEvent):
        return False
    if isinstance(event, SkellamDpEvent):  # mu < 0 goes on to skellam_rdp's ValueError
        return event.mu != 0
    if isinstance(event, dp_accounting.GaussianDpEvent | dp_accounting.LaplaceDpEvent):
        return event.noise_multiplier > 0
    if isinstance(event, PureDpEvent):  # beyond e^700 no accountant gives a usable bound
        return event.epsilon < _PURE_LIMIT
    if isinstance(event, dp_accounting.PoissonSampledDpEvent | dp_accounting.SelfComposedDpEvent):
        return _private(event.event)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return all(_private(e) for e in event.events)
    return True


_PURE_LIMIT = 700.0  # a pure epsilon at or above this is reported as inf (exp overflows)

# ----------------------------------------------------------------------------- epsilon


_CONTROLLER: Any = None  # threadpoolctl's controller, made on first use (a 1.5 ms scan)


@contextlib.contextmanager
def _one_blas_thread() -> Iterator[None]:
    """BLAS (numpy's OpenBLAS) on one thread while accounting runs, restored afterwards.

    dp-accounting's hockey-stick divergence is an ``np.dot`` of ~20,000 values: 3 us on one
    thread, but 12 ms on two OpenBLAS threads when the cores are busy with other work (an
    idle pool thread must be scheduled first), measured on the project's loaded 2-core CPU.
    threadpoolctl is scikit-learn's dependency (and so swarmjax's); without it nothing
    changes.
    """
    global _CONTROLLER
    try:
        if _CONTROLLER is None:
            from threadpoolctl import ThreadpoolController

            _CONTROLLER = ThreadpoolController()
        limit = _CONTROLLER.limit(limits=1, user_api="blas")
    except Exception:  # no threadpoolctl, or it cannot read a library
        limit = contextlib.nullcontext()
    with limit:
        yield


def _pmf_epsilon(pmf: Any, delta: float, overflow: float) -> float:
    """Smallest ``eps >= 0`` with ``D(eps) + P (1 + e^eps) <= delta`` for one side of a PLD.

    ``D(eps) = m_inf + sum_{l_i > eps} p_i (1 - e^(eps - l_i))`` is dp-accounting's
    hockey-stick divergence of the (pessimistic, discretised) PMF with losses ``l_i``,
    masses ``p_i`` and infinite-loss mass ``m_inf``.  Between two consecutive losses it is
    ``U_k - e^eps L_k`` with the suffix sums ``U_k = m_inf + sum_{i >= k} p_i`` and ``L_k =
    sum_{i >= k} p_i e^(-l_i)``, so ``D(eps) + P (1 + e^eps) <= delta`` reads ``e^eps (L_k -
    P) >= U_k + P - delta`` there: a closed form per segment.  All segments at once with two
    cumulative sums (the same sums, in the same order, as dp-accounting's
    ``get_epsilon_for_delta``, which walks them in a Python loop: ~2.5 ms per call at
    vs_pfl's PMF of ~13,000-23,000 losses against ~0.2 ms here).  ``P = 0`` gives
    dp-accounting's ``get_epsilon_for_delta``.  The caller checks the value with
    dp-accounting's own ``get_delta_for_epsilon`` (:func:`_pld_with_overflow`).
    """
    try:  # dp-accounting has no public getter; another version may name these otherwise
        dense = pmf.to_dense_pmf()
        probs = np.asarray(dense._probs, np.float64)
        m_inf = float(dense._infinity_mass)
        lower_loss, discretization = int(dense._lower_loss), float(dense._discretization)
    except (AttributeError, TypeError, ValueError):
        return math.nan  # the caller falls back to dp-accounting's own lookups
    if probs.size == 0:
        return 0.0 if m_inf + 2.0 * overflow <= delta else math.inf
    losses = (np.arange(probs.size) + lower_loss) * discretization
    with np.errstate(over="ignore", invalid="ignore"):
        weighted = np.where(probs > 0, probs * np.exp(-losses), 0.0)
    # suffix sums over i >= k for k = 0..n (k = n: the empty tail), accumulated from the top
    upper = np.cumsum(np.concatenate([[m_inf], probs[::-1]]))[::-1]
    lower = np.cumsum(np.concatenate([[0.0], weighted[::-1]]))[::-1]
    if not np.all(np.isfinite(lower)):
        return math.nan  # the caller falls back to dp-accounting's own lookups
    lo = np.maximum(np.concatenate([[0.0], losses]), 0.0)  # segment k: [l_{k-1}, l_k], eps >= 0
    hi = np.concatenate([losses, [math.inf]])
    a = upper + overflow - delta  # feasible in segment k:  e^eps (L_k - P) >= a_k
    b = lower - overflow
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        root = np.where((a > 0) & (b > 0), np.log(a / b), -math.inf)
        start = np.maximum(lo, root)
        decreasing = (b > 0) & (start <= hi)  # D + P(1 + e^eps) falls: feasible from start on
        flat = (b <= 0) & (a + np.exp(lo) * -b <= 0)  # rises: only its low end can be feasible
    ok = (decreasing | flat) & (lo <= hi)
    if not np.any(ok):
        return math.inf
    return float(np.min(np.where(decreasing, start, lo)[ok]))


def _pld_with_overflow(pld: _Pld, delta: float, overflow: float) -> float:
    """Smallest ``eps`` with ``delta_mech(eps) + P (1 + e^eps) <= delta`` (``P = 0``:
    dp-accounting's ``get_epsilon_for_delta``), by :func:`_pmf_epsilon` on each side of the
    PLD; the value is then checked with dp-accounting's ``get_delta_for_epsilon`` (the
    defining statement: the exact-Poisson mechanism is ``(eps, delta - P (1 + e^eps))``-DP)
    and raised by ``1e-12`` relative until it holds; when it does not within a few steps,
    the lookup is dp-accounting's own (:func:`_pld_with_overflow_bisection`)."""
    sides = [pld._pmf_remove] if pld._symmetric else [pld._pmf_remove, pld._pmf_add]
    each = [_pmf_epsilon(side, delta, overflow) for side in sides]
    if any(math.isnan(e) for e in each):
        return _pld_with_overflow_bisection(pld, delta, overflow)
    eps = max(each)
    if math.isinf(eps):
        return math.inf
    for _ in range(4):
        if not math.isfinite(eps) or eps > 700.0:
            break
        if float(pld.get_delta_for_epsilon(eps)) + overflow * (1.0 + math.exp(eps)) <= delta:
            return eps
        eps = eps * (1.0 + 1e-12) + 1e-15
    return _pld_with_overflow_bisection(pld, delta, overflow)


def _pld_with_overflow_bisection(pld: _Pld, delta: float, overflow: float) -> float:
    """:func:`_with_overflow` for a PLD, by bisection on ``eps`` over the PLD's
    ``get_delta_for_epsilon``: the smallest ``eps`` (to ``1e-9`` relative) with
    ``delta_mech(eps) + P (1 + e^eps) <= delta``, which is ``eps >= eps_mech(delta - P (1 +
    e^eps))``; the returned value is checked against the latter, so it is the same
    guarantee the fixed-point iteration gives.  dp-accounting's lookups alone: the reference
    and fallback of :func:`_pld_with_overflow` (~25 lookups, 5-200 ms at vs_pfl's PMF)."""
    base = float(pld.get_epsilon_for_delta(delta))
    if overflow == 0.0 or not math.isfinite(base):
        return base

    def valid(e: float) -> bool:
        return (
            e <= 700.0
            and float(pld.get_delta_for_epsilon(e)) + overflow * (1.0 + math.exp(e)) <= delta
        )

    step, lo, hi = max(1e-6, 1e-3 * base), base, base
    while not valid(hi):
        lo, hi, step = hi, base + 2.0 * step, 2.0 * step
        if hi > 700.0:
            return math.inf
    while hi - lo > 1e-9 * max(hi, 1e-9):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if valid(mid) else (mid, hi)
    for _ in range(8):  # the epsilon side of the same statement holds too
        rest = delta - overflow * (1.0 + math.exp(hi))
        if rest > 0.0 and float(pld.get_epsilon_for_delta(rest)) <= hi:
            return hi
        hi = hi * (1.0 + 1e-9) + 1e-12
    return _pld_with_overflow_bisection(pld, delta, overflow)


def _with_overflow(mechanism_epsilon: Callable[[float], float], delta: float, overflow: float):
    """Smallest ``eps`` with ``eps >= mechanism_epsilon(delta - overflow (1 + e^eps))``."""
    if overflow == 0.0:
        return mechanism_epsilon(delta)
    eps = 0.0
    for _ in range(100):  # eps_{k+1} = eps_mech(delta - P (1 + e^eps_k)) increases
        if eps > 700.0:
            return math.inf
        rest = delta - overflow * (1.0 + math.exp(eps))
        if rest <= 0.0:
            return math.inf
        new = mechanism_epsilon(rest)
        if new <= eps:
            return eps
        eps = new * (1.0 + 1e-9) + 1e-12  # a step above, so the last check is strict
    return math.inf


def event_epsilon(
    event: dp_accounting.DpEvent,
    delta: float,
    *,
    accountant: str = DEFAULT_ACCOUNTANT,
    overflow: float = 0.0,
    orders: Iterable[float] | None = None,
) -> float:
    """Epsilon of ``event`` at ``delta`` by ``accountant``.

    Args:
        event: a dp-accounting event (see the module docs for the kinds supported).
        delta: target delta in ``(0, 1)``; it includes the sampler's overflow term.
        accountant: ``"pld"`` (default) or ``"rdp"``.
        overflow: summed per-step chance that a static Poisson buffer overflowed (the run's
            ``P``, charged as ``P (1 + e^eps)`` out of ``delta``).
        orders: RDP orders (``"rdp"`` only); default :data:`DEFAULT_ORDERS`.

    Returns:
        epsilon (``inf`` when the event has a non-private part, or the overflow term eats
        ``delta``; ``0`` for a no-op).
    """
    delta = _check_delta(delta)
    check_accountant(accountant)
    check_range("overflow", overflow, 0.0, math.inf)
    if accountant == "pld":
        _refuse_skellam_pld([event])
    if not _private(event):
        return math.inf
    if accountant == "rdp":
        grid = _orders_tuple(orders)
        with _without_convergence_warnings():
            curve = _rdp_curve(event, grid)
        return _with_overflow(lambda d: _rdp_epsilon(curve, grid, d), delta, overflow)
    if orders is not None:
        raise ValueError("orders apply to accountant='rdp' only")
    with _one_blas_thread():
        pld = _pld(event)
        return 0.0 if pld is None else _pld_with_overflow(pld, delta, overflow)


def epsilon_curve(
    rounds: Sequence[dp_accounting.DpEvent],
    delta: float,
    *,
    accountant: str = DEFAULT_ACCOUNTANT,
    overflow: Sequence[float] | None = None,
) -> np.ndarray:
    """Cumulative epsilon after each of ``rounds`` (one event per round, composed in order).

    Args:
        rounds: the event of each round (``NoOpDpEvent`` for a round without a step).
        delta: target delta of every value.
        accountant: ``"pld"`` or ``"rdp"``.
        overflow: per-round summed overflow chance (cumulated like the events).

    Returns:
        ``(len(rounds),)`` float64: epsilon of rounds ``1..t`` composed, for each ``t``; equal
        to :func:`event_epsilon` of their ``ComposedDpEvent`` (PLD composition is associative
        up to float rounding).  Every value is computed at its own round (one PLD
        ``compose`` a round, ~4-15 ms at vs_pfl's PMF), none interpolated.
    """
    delta = _check_delta(delta)
    check_accountant(accountant)
    if accountant == "pld":
        _refuse_skellam_pld(rounds)
    over = np.zeros(len(rounds)) if overflow is None else np.asarray(overflow, np.float64)
    cum_over = np.cumsum(over)
    out = np.zeros(len(rounds))
    private = True
    if accountant == "rdp":
        grid = DEFAULT_ORDERS
        curve = np.zeros(len(grid))
        for t, ev in enumerate(rounds):
            private = private and _private(ev)
            if not private:
                out[t:] = math.inf
                break
            with _without_convergence_warnings():
                curve = curve + _rdp_curve(ev, grid)
            c = curve.copy()
            out[t] = _with_overflow(lambda d, c=c: _rdp_epsilon(c, grid, d), delta, cum_over[t])
        return out
    pld = None
    with _one_blas_thread():
        for t, ev in enumerate(rounds):
            private = private and _private(ev)
            if not private:
                out[t:] = math.inf
                break
            part = _pld(ev)
            pld = part if pld is None else pld if part is None else pld.compose(part)
            if pld is None:
                continue
            out[t] = _pld_with_overflow(pld, delta, cum_over[t])
    return out


def epsilon(
    q: float,
    sigma: float,
    steps: int,
    delta: float,
    *,
    accountant: str = DEFAULT_ACCOUNTANT,
    orders: Iterable[float] | None = None,
    overflow_prob: float = 0.0,
) -> float:
    """Epsilon after ``steps`` Poisson-subsampled Gaussian steps, at ``delta``.

    Args:
        q: sampling rate in ``(0, 1]`` (expected batch size / dataset size).
        sigma: noise multiplier (noise std / clipping norm), ``>= 0``; ``0`` gives ``inf``.
        steps: number of steps, ``>= 0``; ``0`` gives ``0``.
        delta: target delta in ``(0, 1)``.
        accountant: ``"pld"`` (default) or ``"rdp"``.
        orders: RDP orders (``"rdp"`` only); default :data:`DEFAULT_ORDERS`.
        overflow_prob: per-step probability that the sampler's static buffer overflowed
            (:func:`swarmjax.privacy.sampling.overflow_probability`); ``delta`` then
            covers the sampler's conditioning on "fits" too.
    """
    steps = check_int("steps", steps, minimum=0)
    check_range("overflow_prob", overflow_prob, 0.0, 1.0)
    event = poisson_gaussian_event(q, sigma, steps)
    return event_epsilon(
        event, delta, accountant=accountant, overflow=steps * float(overflow_prob), orders=orders
    )


def sigma_for_epsilon(
    target_epsilon: float,
    q: float,
    steps: int,
    delta: float,
    *,
    accountant: str = DEFAULT_ACCOUNTANT,
    rtol: float = 1e-3,
    orders: Iterable[float] | None = None,
    overflow_prob: float = 0.0,
) -> float:
    """Smallest noise multiplier (to ``rtol``) whose epsilon is ``<= target_epsilon``.

    The accounting primitive under :meth:`swarmjax.privacy.plan.PrivacyPlan.calibrate` (call
    that instead). Bisection on ``sigma`` (epsilon decreases in sigma): the returned value
    always satisfies ``epsilon(q, sigma, steps, delta) <= target_epsilon`` by the same
    ``accountant`` and is within ``rtol`` (relative) of the exact threshold.
    ``target_epsilon = inf`` (and ``steps = 0``) return ``0.0``. ``overflow_prob`` as in
    :func:`epsilon`.
    """
    check_positive("target_epsilon", target_epsilon)
    _check_q(q)
    steps = check_int("steps", steps, minimum=0)
    _check_delta(delta)
    check_range("rtol", rtol, 0.0, 1.0, low_open=True, high_open=True)
    check_accountant(accountant)
    if math.isinf(target_epsilon) or steps == 0:
        return 0.0
    orders = None if orders is None else tuple(float(o) for o in orders)
    return _sigma_for_epsilon(
        float(target_epsilon),
        float(q),
        steps,
        float(delta),
        accountant,
        rtol,
        orders,
        float(overflow_prob),
    )


@functools.lru_cache(maxsize=1024)
def _sigma_for_epsilon(
    target_epsilon: float,
    q: float,
    steps: int,
    delta: float,
    accountant: str,
    rtol: float,
    orders: tuple[float, ...] | None,
    overflow_prob: float,
) -> float:
    """:func:`sigma_for_epsilon` on checked arguments, cached: a bisection costs about a
    dozen PLD builds (0.2 s each on the 2-core CPU), and sweeps and resumed runs calibrate
    the same settings again."""
    eps = functools.partial(
        epsilon,
        q,
        steps=steps,
        delta=delta,
        accountant=accountant,
        orders=orders,
        overflow_prob=overflow_prob,
    )
    lo, hi = 0.0, 1.0
    while eps(hi) > target_epsilon:
        lo, hi = hi, 2.0 * hi
        if hi > 1e6:
            raise ValueError(
                f"target_epsilon={target_epsilon} needs sigma > 1e6 for q={q}, steps={steps}"
            )
    while hi - lo > rtol * hi:
        mid = 0.5 * (lo + hi)
        if eps(mid) <= target_epsilon:
            hi = mid
        else:
            lo = mid
    return hi


class PrivacyAccountant:
    """Running accountant for heterogeneous Poisson-subsampled Gaussian steps.

    >>> acc = PrivacyAccountant()
    >>> acc.step(q=0.01, sigma=1.1, count=100)
    >>> acc.step(q=0.02, sigma=1.5)
    >>> eps = acc.epsilon(1e-5)

    ``event`` is the composed dp-accounting event of every recorded step; ``epsilon(delta)``
    is :func:`event_epsilon` of it with the summed overflow ``P`` of the recorded steps
    (``overflow_prob`` per step: see the module docs).
    """

    def __init__(
        self, *, accountant: str = DEFAULT_ACCOUNTANT, orders: Iterable[float] | None = None
    ):
        self.accountant = check_accountant(accountant)
        if orders is not None and accountant != "rdp":
            raise ValueError("orders apply to accountant='rdp' only")
        self.orders = None if orders is None else _orders_tuple(orders)
        self._events: list[tuple[float, float, int]] = []
        self.steps = 0
        self.overflow = 0.0  # sum over steps of P(the sampler's buffer overflowed)

    def step(self, q: float, sigma: float, count: int = 1, overflow_prob: float = 0.0) -> None:
        """Record ``count`` steps with sampling rate ``q`` and noise multiplier ``sigma``.

        ``overflow_prob``: each step's probability that its sampler had to redraw (see the
        module docs); 0 for exact Poisson sampling.
        """
        q, sigma = _check_q(q), _check_sigma(sigma)
        count = check_int("count", count, minimum=0)
        check_range("overflow_prob", overflow_prob, 0.0, 1.0)
        if count == 0:
            return
        self.steps += count
        self.overflow += count * float(overflow_prob)
        if self._events and self._events[-1][:2] == (q, sigma):
            self._events[-1] = (q, sigma, self._events[-1][2] + count)
        else:
            self._events.append((q, sigma, count))

    @property
    def event(self) -> dp_accounting.DpEvent:
        """Everything recorded so far as one dp-accounting event."""
        parts = [poisson_gaussian_event(q, s, c) for q, s, c in self._events]
        return parts[0] if len(parts) == 1 else dp_accounting.ComposedDpEvent(parts)

    def epsilon(self, delta: float) -> float:
        """Epsilon of everything recorded so far at ``delta`` (``inf`` if any sigma was 0).

        ``delta`` includes the samplers' overflow term when steps recorded one.
        """
        return event_epsilon(
            self.event, delta, accountant=self.accountant, overflow=self.overflow,
            orders=self.orders,
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"PrivacyAccountant(accountant={self.accountant!r}, steps={self.steps})"


def basic_composition(
    epsilons: Iterable[float], deltas: Iterable[float] | None = None
) -> tuple[float, float]:
    """Sequential composition: ``(sum epsilons, sum deltas)`` (deltas default to 0)."""
    eps = np.asarray(list(epsilons), dtype=np.float64)
    if eps.size == 0:
        return 0.0, 0.0
    check_nonnegative("epsilons", eps)
    if deltas is None:
        return float(eps.sum()), 0.0
    dl = np.asarray(list(deltas), dtype=np.float64)
    if dl.shape != eps.shape:
        raise ValueError(f"deltas must have the length of epsilons ({eps.size}); got {dl.size}")
    check_range("deltas", dl, 0.0, 1.0)
    return float(eps.sum()), float(min(1.0, dl.sum()))


def advanced_composition(
    epsilon: float, steps: int, delta_prime: float, delta: float = 0.0
) -> tuple[float, float]:
    """Advanced composition (Dwork, Rothblum & Vadhan 2010) of ``steps`` (eps, delta) mechanisms.

    ``eps_total = sqrt(2 T ln(1/delta')) eps + T eps (e^eps - 1)``,
    ``delta_total = T delta + delta'``.
    """
    check_nonnegative("epsilon", epsilon)
    steps = check_int("steps", steps, minimum=0)
    check_range("delta_prime", delta_prime, 0.0, 1.0, low_open=True, high_open=True)
    check_range("delta", delta, 0.0, 1.0, high_open=True)
    t, e = float(steps), float(epsilon)
    eps_total = math.sqrt(2.0 * t * math.log(1.0 / delta_prime)) * e + t * e * math.expm1(e)
    return eps_total, min(1.0, t * delta + delta_prime)


def parallel_composition(epsilons: Iterable[float]) -> float:
    """Parallel composition over disjoint data: the maximum epsilon (0 for none)."""
    eps = np.asarray(list(epsilons), dtype=np.float64)
    if eps.size == 0:
        return 0.0
    check_nonnegative("epsilons", eps)
    return float(eps.max())
