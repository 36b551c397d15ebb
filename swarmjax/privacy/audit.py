"""Statistical privacy audits: empirical epsilon lower bounds and membership inference.

:func:`empirical_epsilon_lower_bound` turns samples of a mechanism's output on two
neighbouring inputs into a lower confidence bound on its epsilon.  For any event ``E``,
(epsilon, delta)-DP implies ``P_a(E) <= e^epsilon P_b(E) + delta``, hence
``epsilon >= ln((P_a(E) - delta) / P_b(E))``.  Replacing ``P_a(E)`` by a Clopper-Pearson
lower bound and ``P_b(E)`` by an upper bound (each at ``1 - alpha/2``, union bound) gives
a bound that holds with probability ``>= confidence``.  A mechanism whose bound exceeds its
claimed epsilon is broken (with that confidence); a correct one may still show a bound near
its epsilon when the best event is found.

Selection bias: the best event is chosen on the first half of each sample set and the
bound is computed on the second half, so the bound is valid for the chosen event (choosing
and bounding on the same samples would overstate epsilon).  Events tried, in both
directions (``a`` vs ``b`` and ``b`` vs ``a``):

* discrete outputs: ``{x = v}`` and ``{x != v}`` for every observed value ``v``;
* continuous outputs: ``{x > t}`` and ``{x <= t}`` for ``t`` on a grid of pooled quantiles.

:func:`membership_inference_advantage` is the loss-threshold attack of Yeom et al. (2018).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from jaxtyping import ArrayLike
from scipy import stats

from swarmjax._validation import check_range

__all__ = ["AuditResult", "empirical_epsilon_lower_bound", "membership_inference_advantage"]

_NUM_THRESHOLDS = 256
_MAX_DISCRETE_VALUES = 64


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """Outcome of :func:`empirical_epsilon_lower_bound`.

    Attributes:
        epsilon_lower: lower confidence bound on epsilon (``0`` if nothing is detected).
        epsilon_hat: point estimate ``ln((p_a - delta) / p_b)`` for the chosen event on the
            held-out half.
        event: the chosen event, e.g. ``"a: x == 3"`` or ``"b: x > 0.52"`` (the prefix is the
            input whose output probability is the numerator).
        p_num, p_den: held-out frequencies of the event under numerator/denominator input.
        n_a, n_b: sample counts per input; confidence, delta: as requested.
    """

    epsilon_lower: float
    epsilon_hat: float
    event: str
    p_num: float
    p_den: float
    n_a: int
    n_b: int
    confidence: float
    delta: float


def _cp_lower(k: np.ndarray, n: int, alpha: float) -> np.ndarray:
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        out = stats.beta.ppf(alpha, k, n - k + 1)
    return np.where(k > 0, out, 0.0)


def _cp_upper(k: np.ndarray, n: int, alpha: float) -> np.ndarray:
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        out = stats.beta.ppf(1.0 - alpha, k + 1, n - k)
    return np.where(k < n, out, 1.0)


def _log_ratio(num: np.ndarray, den: np.ndarray, delta: float) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.log(np.maximum(num - delta, 0.0)) - np.log(den)
    return np.where(np.isnan(r), -np.inf, r)


def _as_samples(name: str, samples: ArrayLike) -> np.ndarray:
    arr = np.asarray(samples)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1 or arr.size < 4:
        raise ValueError(
            f"{name} must be a 1-D array of at least 4 scalar outputs; got {arr.shape}"
        )
    if np.issubdtype(arr.dtype, np.floating) and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite")
    return arr


def _is_discrete(a: np.ndarray, b: np.ndarray) -> bool:
    if np.issubdtype(a.dtype, np.integer) or a.dtype == bool:
        return True
    return np.unique(np.concatenate([a, b])).size <= _MAX_DISCRETE_VALUES


def _event_counts(x: np.ndarray, discrete: bool, pivots: np.ndarray) -> np.ndarray:
    """Counts of each candidate event: ``(2 * len(pivots),)`` (events, then complements)."""
    xs = np.sort(x)
    right = np.searchsorted(xs, pivots, side="right")
    hits = right - np.searchsorted(xs, pivots, side="left") if discrete else x.size - right
    return np.concatenate([hits, x.size - hits])


def _event_names(discrete: bool, pivots: np.ndarray) -> list[str]:
    ops = ("==", "!=") if discrete else (">", "<=")
    return [f"x {op} {p:.6g}" for op in ops for p in pivots]


def empirical_epsilon_lower_bound(
    samples_a: ArrayLike,
    samples_b: ArrayLike,
    *,
    delta: float = 0.0,
    confidence: float = 0.95,
    discrete: bool | None = None,
) -> AuditResult:
    """Clopper-Pearson lower bound on epsilon from outputs on neighbouring inputs a and b.

    Args:
        samples_a, samples_b: ``(n_a,)``, ``(n_b,)`` independent scalar outputs of the
            mechanism run on inputs ``a`` and ``b``.
        delta: the delta the mechanism claims (``0`` for pure DP), in ``[0, 1)``.
        confidence: probability, in ``(0, 1)``, that the returned bound is below the true
            epsilon.
        discrete: treat outputs as categories; ``None`` decides from the data (integer or
            boolean dtype, or at most 64 distinct values).

    Returns:
        An :class:`AuditResult`; ``epsilon_lower`` is ``>= 0``.
    """
    a = _as_samples("samples_a", samples_a)
    b = _as_samples("samples_b", samples_b)
    check_range("delta", delta, 0.0, 1.0, high_open=True)
    check_range("confidence", confidence, 0.0, 1.0, low_open=True, high_open=True)
    if discrete is None:
        discrete = _is_discrete(a, b)
    alpha = (1.0 - confidence) / 2.0
    rng = np.random.default_rng(0)  # fixed split: the audit is a deterministic function
    a, b = rng.permutation(a), rng.permutation(b)
    (a_sel, a_eval), (b_sel, b_eval) = np.array_split(a, 2), np.array_split(b, 2)

    pooled = np.concatenate([a_sel, b_sel])
    if discrete:
        pivots = np.unique(pooled)
    else:
        pivots = np.unique(np.quantile(pooled, np.linspace(0.0, 1.0, _NUM_THRESHOLDS)))
    names = _event_names(discrete, pivots)

    # Selection half: score each (event, direction) by its own CP bound, pick the best.
    ka, kb = _event_counts(a_sel, discrete, pivots), _event_counts(b_sel, discrete, pivots)
    na, nb = a_sel.size, b_sel.size
    score_ab = _log_ratio(_cp_lower(ka, na, alpha), _cp_upper(kb, nb, alpha), delta)
    score_ba = _log_ratio(_cp_lower(kb, nb, alpha), _cp_upper(ka, na, alpha), delta)
    scores = np.concatenate([score_ab, score_ba])
    best = int(np.argmax(scores))
    flip, idx = divmod(best, len(names))
    num_eval, den_eval = (b_eval, a_eval) if flip else (a_eval, b_eval)

    # Evaluation half: bound for that one event.
    k_num = _event_counts(num_eval, discrete, pivots)[idx]
    k_den = _event_counts(den_eval, discrete, pivots)[idx]
    n_num, n_den = num_eval.size, den_eval.size
    lower = _log_ratio(
        _cp_lower(np.array(k_num), n_num, alpha), _cp_upper(np.array(k_den), n_den, alpha), delta
    )
    p_num, p_den = k_num / n_num, k_den / n_den
    hat = _log_ratio(np.array(p_num), np.array(p_den), delta)
    return AuditResult(
        epsilon_lower=float(max(0.0, lower)),
        epsilon_hat=float(hat),
        event=f"{'b' if flip else 'a'}: {names[idx]}",
        p_num=float(p_num),
        p_den=float(p_den),
        n_a=int(a.size),
        n_b=int(b.size),
        confidence=float(confidence),
        delta=float(delta),
    )


def membership_inference_advantage(
    member_losses: ArrayLike, nonmember_losses: ArrayLike
) -> tuple[float, float]:
    """Loss-threshold membership inference (Yeom et al. 2018).

    The attack guesses "member" when an example's loss is ``<= threshold``.  Returns
    ``(advantage, threshold)`` with ``advantage = max_t TPR(t) - FPR(t)`` in ``[0, 1]``
    (TPR on members, FPR on non-members) and the best threshold (``-inf`` when no threshold
    beats guessing, i.e. advantage 0).  Under (epsilon, 0)-DP the advantage is at most
    ``e^epsilon - 1`` (Yeom et al., Thm 1).
    """
    m = np.asarray(member_losses, dtype=np.float64).ravel()
    n = np.asarray(nonmember_losses, dtype=np.float64).ravel()
    for name, arr in (("member_losses", m), ("nonmember_losses", n)):
        if arr.size == 0:
            raise ValueError(f"{name} must not be empty")
        if np.isnan(arr).any():
            raise ValueError(f"{name} must not contain NaN")
    thresholds = np.unique(np.concatenate([m, n]))
    tpr = np.searchsorted(np.sort(m), thresholds, side="right") / m.size
    fpr = np.searchsorted(np.sort(n), thresholds, side="right") / n.size
    gap = tpr - fpr
    best = int(np.argmax(gap))
    if gap[best] <= 0.0:
        return 0.0, -math.inf
    return float(gap[best]), float(thresholds[best])
