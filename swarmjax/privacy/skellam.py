"""Privacy accounting of the multi-dimensional Skellam mechanism (issue 47).

The mechanism releases ``x + Z`` for an integer vector ``x`` (the secure sum, in grid units)
and noise ``Z`` with i.i.d. coordinates ``Sk(mu) = Poisson(mu) - Poisson(mu)`` (variance
``2 mu``, pmf ``P(k) = e^(-2 mu) I_|k|(2 mu)``).  Neighbouring inputs differ by an integer
vector ``v`` with ``||v||_2 <= Delta_2`` and ``||v||_1 <= Delta_1``.  All quantities here are
in grid units: sensitivities of the rounded integer vectors, ``mu`` of the summed noise.

* :class:`SkellamDpEvent`: one such release, a dp-accounting event that
  :mod:`swarmjax.privacy.accounting` accounts with ``accountant="rdp"`` only (its PLD path
  refuses it: dp-accounting's PLD has no Skellam mechanism).
* :func:`skellam_rdp`: the RDP bound of Agarwal, Kairouz & Liu, "The Skellam Mechanism for
  Differentially Private Federated Learning", NeurIPS 2021 (arXiv:2110.04995), for the
  multi-dimensional mechanism.  With ``mu`` the mean of each Poisson (variance ``2 mu``),
  for every INTEGER order ``alpha > 1``::

      eps(alpha) = alpha Delta_2^2 / (4 mu)
                   + min(((2 alpha - 1) Delta_2^2 + 6 Delta_1) / (16 mu^2), 3 Delta_1 / (4 mu))

  The paper's noise parameter is the VARIANCE ``v`` (pmf ``e^(-v) I_k(v)``, i.e.
  ``Poisson(v/2) - Poisson(v/2)``), in which the bound reads ``alpha D2^2 / (2 v) +
  min(((2 alpha - 1) D2^2 + 6 D1) / (4 v^2), 3 D1 / (2 v))``; ``v = 2 mu`` gives the form
  above.  (The theorem's text was not readable from here: its constants and units are
  taken from the authors' reference code, google-research/federated
  ``distributed_dp/accounting_utils.py::_skellam_rdp``, whose ``mu`` is the central
  variance; other code cites it as Theorem 3.5 or Corollary 3.6, the numbering varying
  across versions.)  The leading term is the Gaussian mechanism's ``alpha D2^2 / (2 variance)``.
  It is stated for integer orders ``alpha > 1`` only, so non-integer orders get ``inf``
  (never a claim at an unproven order).  ``tests/test_skellam_accounting.py`` checks it
  against the exact divergence below for every integer vector with ``||v||_2 <= 4`` (up to
  sign and permutation), ``mu`` in 0.25..64 and every integer order 2..64: never below
  (bound / exact >= 1.009); read with ``v = mu`` it would fall below at every order.
* :func:`skellam_rdp_exact_1d`: the exact Renyi divergence between ``Sk(mu) + shift`` and
  ``Sk(mu)``, from the pmf in log space with a proven bound on the truncated tails.  Renyi
  divergences of product distributions add, so the exact RDP of one integer shift vector is
  the sum over its coordinates.
* :func:`rounded_l2_bound`, :func:`l1_bound`: the sensitivities after conditional randomized
  rounding (Kairouz, Liu & Steinke, "The Distributed Discrete Gaussian Mechanism for
  Federated Learning with Secure Aggregation", ICML 2021, arXiv:2102.06387).
* :func:`skellam_epsilon`, :func:`skellam_mu_for_epsilon`: ``k``-fold composition through
  :func:`swarmjax.privacy.accounting.event_epsilon` (``accountant="rdp"``: dp-accounting's
  RDP -> (eps, delta) conversion, Canonne, Kamath & Steinke 2020, Prop. 12) on the integer
  grid :data:`SKELLAM_ORDERS`, and the smallest ``mu`` for a target epsilon.

Mixing events.  The RDP accountant composes by adding curves on one order grid.  A
``ComposedDpEvent`` of Gaussian and Skellam leaves is accounted on the grid asked for: the
Skellam leaf is ``inf`` at its non-integer orders, so the sum is too and epsilon comes from
the integer orders alone, where the Gaussian's curve ``alpha / (2 sigma^2)`` is exact.  On
:data:`swarmjax.privacy.accounting.DEFAULT_ORDERS` those are 2..63 and 128..1024; a finer
integer grid (:data:`SKELLAM_ORDERS`) can only lower epsilon.  No amplification by sampling
is claimed: a Skellam event under ``PoissonSampledDpEvent`` is refused.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

import attr
import dp_accounting
import numpy as np
from scipy.special import gammaln, ive, logsumexp

from swarmjax._validation import check_int, check_nonnegative, check_positive, check_range

__all__ = [
    "SKELLAM_ORDERS",
    "SkellamDpEvent",
    "l1_bound",
    "rounded_l2_bound",
    "skellam_epsilon",
    "skellam_mu_for_epsilon",
    "skellam_rdp",
    "skellam_rdp_exact_1d",
]

SKELLAM_ORDERS: tuple[float, ...] = (
    *(float(a) for a in range(2, 257)),
    *(320.0, 384.0, 512.0, 768.0, 1024.0),
)


@attr.define(frozen=True)
class SkellamDpEvent(dp_accounting.DpEvent):
    """One release of an integer vector plus i.i.d. ``Sk(mu) = Poisson(mu) - Poisson(mu)``
    noise per coordinate (variance ``2 mu``); sensitivities and ``mu`` in grid units."""

    l1_sensitivity: float
    l2_sensitivity: float
    mu: float


def skellam_rdp(
    orders: Iterable[float], mu: float, l1_sensitivity: float, l2_sensitivity: float
) -> np.ndarray:
    """RDP upper bound of the multi-dimensional Skellam mechanism (module docs: the bound).

    Args:
        orders: Renyi orders, each ``> 1``; the bound is proven at integer orders only and
            every non-integer order gets ``inf``.
        mu: mean of each Poisson of the summed noise (variance ``2 mu``), grid units.
        l1_sensitivity, l2_sensitivity: ``Delta_1``, ``Delta_2`` of the integer inputs.

    Returns:
        ``(len(orders),)`` float64: ``eps(alpha)`` per order (``0`` when a sensitivity is 0:
        the inputs then coincide; ``inf`` when ``mu = 0`` and they do not).
    """
    a = np.asarray(list(orders), np.float64)
    check_range("orders", a, 1.0, math.inf, low_open=True)
    check_nonnegative("mu", mu)
    check_range("l1_sensitivity", l1_sensitivity, 0.0, math.inf, high_open=True)
    check_range("l2_sensitivity", l2_sensitivity, 0.0, math.inf, high_open=True)
    d1, d2, mu = float(l1_sensitivity), float(l2_sensitivity), float(mu)
    if d1 == 0.0 or d2 == 0.0:
        out = np.zeros(a.shape)
    elif mu == 0.0:
        out = np.full(a.shape, math.inf)
    else:
        lead = a * d2**2 / (4.0 * mu)
        extra = np.minimum(((2.0 * a - 1.0) * d2**2 + 6.0 * d1) / (16.0 * mu**2), 0.75 * d1 / mu)
        out = lead + extra
    return np.where(np.isfinite(a) & (a == np.floor(a)), out, math.inf)


# --------------------------------------------------------------------- exact, one dimension

_IVE_FLOOR = math.log(1e-250)  # below: the pmf from its series (ive nears underflow)


@functools.lru_cache(maxsize=64)
def _log_pmf(mu: float, kmax: int) -> np.ndarray:
    """``log P(k)`` of ``Sk(mu)`` for ``k = 0..kmax`` (``P(-k) = P(k)``).

    ``ive(k, 2 mu) = e^(-2 mu) I_k(2 mu)`` where it is above ``1e-250``; beyond, the series
    ``I_k(2 mu) = sum_j mu^(2j+k) / (j! (j+k)!)`` summed in log space.  Its term ratio
    ``mu^2 / ((j+1)(j+k+1))`` is ``<= 1/4`` from ``j >= 2 mu``, so the ``2 mu + 100`` terms
    kept miss a relative ``< 4^-100``."""
    k = np.arange(kmax + 1)
    with np.errstate(divide="ignore"):
        out = np.log(ive(k, 2.0 * mu))
    far = ~(out >= _IVE_FLOOR)
    if np.any(far):
        j = np.arange(math.ceil(2.0 * mu) + 100)[None, :]
        kf = k[far][:, None]
        terms = (2 * j + kf) * math.log(mu) - gammaln(j + 1.0) - gammaln(j + kf + 1.0)
        out[far] = -2.0 * mu + logsumexp(terms, axis=1)
    out.setflags(write=False)
    return out


def _ratio_bound(alpha: float, mu: float, n: int, m: int) -> float:
    """Bound on ``t(k') / t(k)`` for ``t(k) = P(n)^alpha P(m)^(1 - alpha)`` and every further
    outward step (``n, m`` both grow by one): ``P(n+1)/P(n) <= mu/(n+1)`` (the series, term by
    term) and ``P(m)/P(m+1) <= (m+1)/mu + mu/(m+2)`` (``I_m = (m+1)/mu I_(m+1) + I_(m+2)``,
    then the first bound); nonincreasing in the step."""
    bracket = max(m + 1, n + 1) / (n + 1) + mu * mu / ((m + 2) * (n + 1))
    return mu / (n + 1) * bracket ** (alpha - 1.0)


def _log_moment(alpha: float, mu: float, t: int) -> float:
    """Upper bound on ``log sum_k P(k - t)^alpha P(k)^(1 - alpha)``, tight to ``e^-60``.

    The sum runs over ``[lo, hi]``, widened until each end's term is ``e^-60`` of the sum and
    the outward ratio bound (:func:`_ratio_bound`) is ``r <= 1/2``: each tail beyond is then
    ``<= t_end r / (1 - r) <= t_end``, which is added."""
    width = math.ceil(alpha * abs(t) + 3.0 * mu + 20.0)
    while True:
        lo, hi = min(t, 0) - width, max(t, 0) + width
        table = _log_pmf(mu, 1 << (max(-lo, hi) + abs(t)).bit_length())
        k = np.arange(lo, hi + 1)
        terms = alpha * table[np.abs(k - t)] + (1.0 - alpha) * table[np.abs(k)]
        total = float(logsumexp(terms))
        ends = max(terms[0], terms[-1])
        r = max(_ratio_bound(alpha, mu, hi - t, hi), _ratio_bound(alpha, mu, t - lo, -lo))
        if r <= 0.5 and ends <= total - 60.0:
            return float(logsumexp([total, terms[0], terms[-1]]))
        width = math.ceil(1.5 * width)


def skellam_rdp_exact_1d(alpha: float, mu: float, shift: int) -> float:
    """Exact ``max(D_alpha(Sk(mu) + shift || Sk(mu)), D_alpha(Sk(mu) || Sk(mu) + shift))``.

    Computed from the pmf in log space (:func:`_log_moment`; the value is an upper bound
    within a relative ``e^-60`` of the sum, up to float rounding).  Both directions are equal
    by the pmf's symmetry; both are computed.  Any real ``alpha > 1``.
    """
    check_range("alpha", alpha, 1.0, math.inf, low_open=True, high_open=True)
    check_range("mu", mu, 0.0, math.inf, low_open=True, high_open=True)
    shift = abs(check_int("shift", shift))
    if shift == 0:
        return 0.0
    a, m = float(alpha), float(mu)
    return max(_log_moment(a, m, shift), _log_moment(a, m, -shift)) / (a - 1.0)


# ------------------------------------------------------------------------ sensitivities


def rounded_l2_bound(scaled_norm: float, dim: int, beta: float) -> float:
    """L2 norm bound after conditional randomized rounding (Kairouz, Liu & Steinke 2021,
    section 4.1; the authors' code cites Theorem 1 of arXiv:2102.06387), re-derived here.

    A vector of L2 norm ``c = scaled_norm`` (``gamma C``, grid units) in dimension ``d``,
    rounded coordinate-wise to ``floor(x)`` or ``floor(x) + 1`` without bias, has
    ``||x~||_2 <= c + sqrt(d)`` always (each coordinate moves by < 1), and
    ``||x~||_2^2 <= c^2 + d/4 + sqrt(2 ln(1/beta)) (c + sqrt(d)/2)`` with probability
    ``>= 1 - beta``: ``E||x~||^2 <= c^2 + d/4`` and Hoeffding's inequality on the independent
    ``x~_i^2``, each in an interval of width ``<= 2|x_i| + 1`` (``||2|x| + 1||_2 <= 2c +
    sqrt(d)``).  Conditional rounding redraws until the second holds, so it always does.

    Returns:
        ``min(c + sqrt(d), sqrt(c^2 + d/4 + sqrt(2 ln(1/beta)) (c + sqrt(d)/2)))``;
        ``c + sqrt(d)`` for ``beta = 0`` (no conditioning).
    """
    check_range("scaled_norm", scaled_norm, 0.0, math.inf, high_open=True)
    d = check_int("dim", dim, minimum=1)
    check_range("beta", beta, 0.0, 1.0, high_open=True)
    c, root_d = float(scaled_norm), math.sqrt(d)
    always = c + root_d
    if beta == 0.0:
        return always
    square = c * c + d / 4.0 + math.sqrt(2.0 * math.log(1.0 / beta)) * (c + root_d / 2.0)
    return min(always, math.sqrt(square))


def l1_bound(l2: float, dim: int) -> float:
    """L1 bound of an integer vector of L2 norm ``<= l2`` in dimension ``dim``:
    ``min(l2^2, sqrt(dim) l2)`` (``|v_i| <= v_i^2`` for integers; Cauchy-Schwarz)."""
    check_range("l2", l2, 0.0, math.inf, high_open=True)
    d = check_int("dim", dim, minimum=1)
    return min(float(l2) ** 2, math.sqrt(d) * float(l2))


# ----------------------------------------------------------------------------- epsilon


def skellam_epsilon(mu: float, l1: float, l2: float, compositions: int, delta: float) -> float:
    """Epsilon at ``delta`` of ``compositions`` releases of the Skellam mechanism.

    ``event_epsilon(SelfComposedDpEvent(SkellamDpEvent(l1, l2, mu), compositions), delta,
    accountant="rdp", orders=SKELLAM_ORDERS)``: the :func:`skellam_rdp` curve times
    ``compositions``, converted by dp-accounting.  ``0`` for no composition, ``inf`` for
    ``mu = 0`` (with a nonzero sensitivity).
    """
    from swarmjax.privacy.accounting import event_epsilon  # it imports this module

    check_nonnegative("mu", mu)
    check_range("l1", l1, 0.0, math.inf, high_open=True)
    check_range("l2", l2, 0.0, math.inf, high_open=True)
    compositions = check_int("compositions", compositions, minimum=0)
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    if compositions == 0:
        return 0.0
    one = SkellamDpEvent(float(l1), float(l2), float(mu))
    event = dp_accounting.SelfComposedDpEvent(one, compositions)
    return event_epsilon(event, delta, accountant="rdp", orders=SKELLAM_ORDERS)


def skellam_mu_for_epsilon(
    target_epsilon: float,
    l1: float,
    l2: float,
    compositions: int,
    delta: float,
    rtol: float = 1e-3,
) -> float:
    """Smallest ``mu`` (to ``rtol``, relative) with ``skellam_epsilon(mu, ...) <= target``.

    Bisection (every order's bound falls as ``mu`` grows, so epsilon does): the value
    returned always satisfies the target.  ``0`` when no noise is needed (``target = inf``,
    no composition, or a zero sensitivity); a one-line ``ValueError`` when the target needs
    ``mu > 1e15``.
    """
    check_positive("target_epsilon", target_epsilon)
    check_range("l1", l1, 0.0, math.inf, high_open=True)
    check_range("l2", l2, 0.0, math.inf, high_open=True)
    compositions = check_int("compositions", compositions, minimum=0)
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    check_range("rtol", rtol, 0.0, 1.0, low_open=True, high_open=True)
    if math.isinf(target_epsilon) or compositions == 0 or l1 == 0.0 or l2 == 0.0:
        return 0.0

    def eps(mu: float) -> float:
        return skellam_epsilon(mu, l1, l2, compositions, delta)

    lo, hi = 0.0, 1.0
    while eps(hi) > target_epsilon:
        lo, hi = hi, 2.0 * hi
        if hi > 1e15:
            raise ValueError(
                f"target_epsilon={target_epsilon} needs mu > 1e15 for l2={l2}, "
                f"compositions={compositions}, delta={delta}"
            )
    while hi - lo > rtol * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if eps(mid) <= target_epsilon else (mid, hi)
    return hi
