"""APDIM: mutual-information-guided adaptive Laplace noise for tabular data (seed 003).

Pipeline (algorithms.md section 5): :func:`fit_encoder` / :meth:`TabularEncoder.transform` encode,
impute, clip and min-max normalise a table; :func:`feature_importance` scores each feature by
its mutual information with the label; :func:`correlation_groups` groups features greedily by
Pearson correlation; :func:`budget_shares` splits the budget; :func:`privatize` and
:func:`privatize_sweep` add per-feature Laplace noise (the latter for many epsilons and seeds
in one jit-compiled call).  :func:`fit_apdim` and :func:`uniform_plan` bundle the steps.

Privacy guarantee (default modes ``allocation="corrected"``, ``sensitivity="record"``)
---------------------------------------------------------------------------------------
Record-level epsilon-local DP.  Every record ``x`` (one row, clipped to the box
``[0, 1]^d`` that the encoder's ranges map to) is released as
``x_i + Lap(Delta_i / eps_i)`` with independent draws per feature and ``Delta_i = 1``, the width
of feature ``i``'s clipped range.  For any two records ``x, x'`` in the box the output
density ratio is at most ``exp(sum_i eps_i |x_i - x'_i| / Delta_i) <= exp(sum_i eps_i)``
(sequential composition over a record's features), and ``sum_i eps_i = epsilon`` exactly.
Rows are noised independently, so the released table is also epsilon-DP for
replace-one-record adjacency.  The label column is *not* noised (as in the paper).

Groups: "the same eps for a group" means every feature ``j`` of a correlation group ``G``
gets the group mean ``eps_G = mean_{j in G} eps_j`` and its *own independent* Laplace draw.
The group then costs ``|G| eps_G = sum_{j in G} eps_j``: averaging conserves the budget, so
groups change how the budget is split, never the total.  Sharing one draw across a group
(a literally "coordinated" noise) is deliberately not offered: with a shared draw the contrast
``y_j / Delta_j - y_k / Delta_k`` is noise-free and reveals ``x_j / Delta_j - x_k / Delta_k``
exactly, an unbounded privacy loss.

What the guarantee does not cover: the plan (importance scores, groups and hence the shares)
and, by default, the encoder's ranges are computed from the raw data without noise.  For a
strict end-to-end guarantee fit them on public data (or pass public ``bounds`` to
:func:`fit_encoder`); the paper's "5% of the budget for correlation analysis" is not spent
on any noised statistic in its formulas or code, and neither is it here.

Published variants: ``allocation="paper"`` is the literal formula (6) of the paper,
``adaptive_i = remaining * (1 - importance_ratio_i * alpha)``, which gives *important*
features *less* budget (the opposite of its text).  ``sensitivity="paper"`` uses
``Delta_i = range_i / n`` as the authors' code does: that is the sensitivity of a column
*mean*, ``n`` times too small for a per-record release, so the claimed epsilon does not hold
(the empirical audit in the tests measures a far larger privacy loss).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from swarmjax._validation import check_choice, check_int, check_positive, check_range
from swarmjax.privacy.mechanisms import bounded, laplace_mechanism
from swarmjax.privacy.secret import Secret, fingerprint

__all__ = [
    "ALLOCATIONS",
    "SENSITIVITIES",
    "APDIMPlan",
    "PaperSensitivityWarning",
    "TabularEncoder",
    "budget_shares",
    "correlation_groups",
    "feature_importance",
    "feature_sensitivity",
    "fit_apdim",
    "fit_encoder",
    "load_csv",
    "privatize",
    "privatize_sweep",
    "record_epsilon",
    "release_fingerprint",
    "uniform_plan",
]

ALLOCATIONS = ("corrected", "paper")
SENSITIVITIES = ("record", "paper")
Groups = tuple[tuple[int, ...], ...]


class PaperSensitivityWarning(UserWarning):
    """``sensitivity="paper"`` (range / n) does not give the claimed per-record epsilon."""


# ----------------------------------------------------------------------------------------
# Input checks
# ----------------------------------------------------------------------------------------


def _numeric_matrix(name: str, X: Any) -> np.ndarray:
    """``X`` as a float64 ``(n, d)`` array; ValueError for text columns or NaN/inf."""
    if isinstance(X, pd.DataFrame):
        for column in X.columns:
            dtype = X[column].dtype
            if not (pd.api.types.is_numeric_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype)):
                raise ValueError(
                    f"{name}: column {column!r} is not numeric (dtype {dtype}); encode it "
                    "first (apdim.fit_encoder(...).transform)"
                )
        columns = list(map(str, X.columns))
        X = X.to_numpy()
    else:
        columns = None
    arr = np.asarray(X)
    if arr.dtype.kind not in "iuf":
        raise ValueError(
            f"{name} must be numeric; got dtype {arr.dtype} (a non-numeric column left "
            "unencoded?); encode it first (apdim.fit_encoder(...).transform)"
        )
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} must be a non-empty 2-D (rows, features) table; got {arr.shape}")
    arr = arr.astype(np.float64)
    bad = ~np.isfinite(arr)
    if bad.any():
        j = int(np.argmax(bad.any(axis=0)))
        label = repr(columns[j]) if columns else str(j)
        raise ValueError(
            f"{name} contains NaN/inf ({int(bad.sum())} cells, first in column {label}); "
            "impute missing values first (apdim.fit_encoder imputes)"
        )
    return arr


def _normalised_matrix(name: str, X: Any) -> np.ndarray:
    """Like :func:`_numeric_matrix`, and every value must lie in ``[0, 1]``."""
    arr = _numeric_matrix(name, X)
    if arr.min() < 0.0 or arr.max() > 1.0:
        raise ValueError(
            f"{name} must be min-max normalised to [0, 1] (apdim.fit_encoder(...).transform); "
            f"got values in [{arr.min():g}, {arr.max():g}]"
        )
    return arr


def _labels(y: Any, n: int) -> np.ndarray:
    arr = np.asarray(y)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ValueError(f"y must be 1-D with one label per row ({n}); got shape {arr.shape}")
    if pd.isna(arr).any():
        raise ValueError("y must not contain missing labels")
    return arr


# ----------------------------------------------------------------------------------------
# 1. Preprocessing
# ----------------------------------------------------------------------------------------


def load_csv(path: Any, *, missing: Sequence[str] = ("?",)) -> pd.DataFrame:
    """Read a CSV, strip the leading spaces of text cells, and mark ``missing`` tokens NaN."""
    frame = pd.read_csv(path, skipinitialspace=True, na_values=list(missing))
    for column in frame.columns:
        if pd.api.types.is_string_dtype(frame[column]):
            frame[column] = frame[column].str.strip().replace(list(missing), np.nan)
    return frame


@dataclasses.dataclass(frozen=True)
class TabularEncoder:
    """Fitted preprocessing: ordinal codes, imputation values and the clipped ranges.

    ``lower`` / ``upper`` (shape ``(d,)``, in encoded units) are the ranges each feature is
    clipped to before min-max normalisation; the record-level sensitivity of a normalised
    feature is the width of that range, i.e. 1.  ``public`` is True when every range came from
    the caller's ``bounds`` rather than from the data.
    """

    features: tuple[str, ...]
    target: str
    categories: Mapping[str, tuple[Any, ...]]
    fill: Mapping[str, float]
    lower: np.ndarray
    upper: np.ndarray
    classes: tuple[Any, ...]
    public: bool

    @property
    def categorical(self) -> np.ndarray:
        """Boolean mask ``(d,)``: which features were encoded from categories."""
        return np.array([f in self.categories for f in self.features])

    def encode(self, frame: pd.DataFrame) -> np.ndarray:
        """Ordinal-encode and impute the features of ``frame``: ``(n, d)`` float64, raw units."""
        missing = [f for f in self.features if f not in frame.columns]
        if missing:
            raise ValueError(f"frame lacks feature columns {missing}")
        columns = []
        for f in self.features:
            col = frame[f]
            if f in self.categories:
                known = col.where(col.isin(self.categories[f]))  # unseen -> missing
                codes = pd.Categorical(known, categories=self.categories[f]).codes
                col = pd.Series(np.where(codes < 0, np.nan, codes), index=frame.index)
            else:
                col = pd.to_numeric(col, errors="coerce")
            columns.append(col.fillna(self.fill[f]).to_numpy(np.float64))
        return np.stack(columns, axis=1)

    def transform(self, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """``(X, y)``: features clipped and scaled to ``[0, 1]`` (float32), labels as codes."""
        raw = self.encode(frame)
        width = np.where(self.upper > self.lower, self.upper - self.lower, 1.0)
        X = (np.clip(raw, self.lower, self.upper) - self.lower) / width
        y = pd.Categorical(frame[self.target], categories=self.classes).codes
        if (y < 0).any():
            raise ValueError(f"target {self.target!r} has labels not seen when fitting")
        return X.astype(np.float32), y.astype(np.int64)


def fit_encoder(
    frame: pd.DataFrame,
    target: str,
    *,
    drop: Iterable[str] = (),
    bounds: Mapping[str, tuple[float, float]] | None = None,
) -> TabularEncoder:
    """Fit the preprocessing on ``frame`` (the training split).

    Text/bool columns get ordinal codes in sorted category order (unseen categories become
    missing); missing values are imputed with the median (numeric) or the most frequent code
    (categorical).  Each feature is clipped to ``bounds[name]`` (encoded units; give public
    bounds for an end-to-end guarantee) or else to its training min/max.
    """
    if target not in frame.columns:
        raise ValueError(f"target {target!r} is not a column; columns: {list(frame.columns)}")
    dropped = set(drop) | {target}
    features = tuple(str(c) for c in frame.columns if c not in dropped)
    if not features:
        raise ValueError("frame has no feature columns left after dropping target and drop")
    bounds = dict(bounds or {})
    unknown = set(bounds) - set(features)
    if unknown:
        raise ValueError(f"bounds names unknown features {sorted(unknown)}")
    categories: dict[str, tuple[Any, ...]] = {}
    for f in features:
        if not pd.api.types.is_numeric_dtype(frame[f]) or pd.api.types.is_bool_dtype(frame[f]):
            categories[f] = tuple(sorted(frame[f].dropna().unique(), key=str))
    fill: dict[str, float] = {}
    for f in features:
        if f in categories:
            codes = pd.Categorical(frame[f], categories=categories[f]).codes
            codes = codes[codes >= 0]
            fill[f] = float(np.bincount(codes).argmax()) if codes.size else 0.0
        else:
            col = pd.to_numeric(frame[f], errors="coerce")
            fill[f] = float(col.median()) if col.notna().any() else 0.0
    classes = tuple(sorted(frame[target].dropna().unique(), key=str))
    partial = TabularEncoder(
        features, target, categories, fill, np.zeros(0), np.zeros(0), classes, False
    )
    raw = partial.encode(frame)
    lower, upper = raw.min(axis=0), raw.max(axis=0)
    for j, f in enumerate(features):
        if f in bounds:
            lo, hi = (float(v) for v in bounds[f])
            if not hi > lo:
                raise ValueError(f"bounds[{f!r}] must have upper > lower; got {(lo, hi)}")
            lower[j], upper[j] = lo, hi
    public = set(bounds) == set(features)
    return dataclasses.replace(partial, lower=lower, upper=upper, public=public)


# ----------------------------------------------------------------------------------------
# 2. Importance, 3. groups
# ----------------------------------------------------------------------------------------


def feature_importance(
    X: Any,
    y: Any,
    *,
    discrete: ArrayLike | None = None,
    random_state: int = 0,
) -> np.ndarray:
    """Normalised mutual information of each feature with the class label, shape ``(d,)``.

    ``MI_i / sum_j MI_j`` (scikit-learn's ``mutual_info_classif``, nats; ``discrete`` is a
    boolean mask of categorical features); uniform ``1/d`` if every MI is 0.
    """
    from sklearn.feature_selection import mutual_info_classif

    arr = _numeric_matrix("X", X)
    labels = _labels(y, arr.shape[0])
    mask = False if discrete is None else np.asarray(discrete, dtype=bool)
    with warnings.catch_warnings():
        # Discrete columns arrive as normalised floats; sklearn's type sniffing complains.
        warnings.filterwarnings("ignore", message="Clustering metrics expects discrete")
        mi = mutual_info_classif(arr, labels, discrete_features=mask, random_state=random_state)
    mi = np.maximum(np.asarray(mi, np.float64), 0.0)
    total = mi.sum()
    return mi / total if total > 0 else np.full(arr.shape[1], 1.0 / arr.shape[1])


def correlation_groups(X: Any, theta: float = 0.7) -> Groups:
    """Greedy Pearson grouping: ``((i, j, ...), ...)``, each feature in exactly one group.

    Features are visited in order; an ungrouped feature ``i`` opens a group and takes every
    later ungrouped ``j`` with ``|pearson(i, j)| > theta``.  A constant feature has no defined
    correlation and is treated as uncorrelated (the paper adds tiny noise instead).
    """
    check_range("theta", theta, 0.0, 1.0)
    arr = _numeric_matrix("X", X)
    with np.errstate(divide="ignore", invalid="ignore"):
        corr = np.corrcoef(arr, rowvar=False) if arr.shape[1] > 1 else np.ones((1, 1))
    corr = np.nan_to_num(np.atleast_2d(corr), nan=0.0)
    d = arr.shape[1]
    grouped = np.zeros(d, dtype=bool)
    groups = []
    for i in range(d):
        if grouped[i]:
            continue
        members = [i] + [j for j in range(i + 1, d) if not grouped[j] and abs(corr[i, j]) > theta]
        grouped[members] = True
        groups.append(tuple(members))
    return tuple(groups)


def _check_groups(groups: Sequence[Sequence[int]], d: int) -> Groups:
    flat = sorted(int(i) for g in groups for i in g)
    if flat != list(range(d)) or any(len(g) == 0 for g in groups):
        raise ValueError(f"groups must partition the {d} features 0..{d - 1}; got {groups!r}")
    return tuple(tuple(int(i) for i in g) for g in groups)


# ----------------------------------------------------------------------------------------
# 4. Allocation
# ----------------------------------------------------------------------------------------


def budget_shares(
    importance: ArrayLike,
    groups: Sequence[Sequence[int]] | None = None,
    *,
    mi_weight: float = 0.8,
    base_ratio: float = 0.05,
    allocation: Literal["corrected", "paper"] = "corrected",
) -> np.ndarray:
    """Fraction of the total epsilon per feature, shape ``(d,)``, positive, summing to 1.

    ``eps_i = epsilon * share_i`` (the allocation is linear in epsilon).  With
    ``r = importance / sum(importance)``, ``base = base_ratio``, ``remaining = 1 - d * base``:

    * ``"corrected"`` (default): ``share_i = base + remaining * r_i^alpha / sum_j r_j^alpha``,
      so more informative features get more budget; ``alpha = mi_weight`` moves from an even
      split (0) to a split proportional to MI (1).  Needs ``base_ratio <= 1/d``.
    * ``"paper"``: formula (6)-(7), ``share_i = base + remaining * (1 - r_i * alpha)``, which
      gives more informative features *less* budget.

    Then each multi-feature group's shares are replaced by their mean (conserving the group's
    sum) and everything is rescaled to sum to 1 (a no-op for ``"corrected"``; for ``"paper"``
    it is the authors' final rescaling).
    """
    imp = np.asarray(importance, dtype=np.float64)
    if imp.ndim != 1 or imp.size == 0:
        raise ValueError(f"importance must be a non-empty 1-D array; got shape {imp.shape}")
    check_range("importance", imp, 0.0)
    check_range("mi_weight", mi_weight, 0.0, 1.0)
    check_range("base_ratio", base_ratio, 0.0, 1.0, low_open=True)
    check_choice("allocation", allocation, ALLOCATIONS)
    d = imp.size
    groups = tuple((i,) for i in range(d)) if groups is None else _check_groups(groups, d)
    total = imp.sum()
    ratio = imp / total if total > 0 else np.full(d, 1.0 / d)
    remaining = 1.0 - d * base_ratio
    if allocation == "corrected":
        if remaining < -1e-12:
            raise ValueError(
                f"base_ratio must be <= 1/d = {1.0 / d:g} for {d} features; got {base_ratio!r}"
            )
        weight = ratio**mi_weight
        share = base_ratio + max(remaining, 0.0) * weight / weight.sum()
    else:
        share = base_ratio + remaining * (1.0 - ratio * mi_weight)
    for group in groups:
        if len(group) > 1:
            share[list(group)] = share[list(group)].mean()
    if np.any(share <= 0):
        raise ValueError(
            f"allocation {allocation!r} gives non-positive budgets with base_ratio={base_ratio!r} "
            f"for {d} features (remaining budget {remaining:g} < 0); lower base_ratio"
        )
    return share / share.sum()


# ----------------------------------------------------------------------------------------
# 5. Sensitivity and the fitted plan
# ----------------------------------------------------------------------------------------


def feature_sensitivity(X: Any, sensitivity: Literal["record", "paper"] = "record") -> np.ndarray:
    """Per-feature L1 sensitivity ``Delta_i``, shape ``(d,)``, for normalised ``X`` in [0, 1].

    ``"record"``: 1, the width of every feature's clipped range (record-level local DP).
    ``"paper"``: ``max(range_i / n, 1e-8)`` as the authors' code; warns
    (:class:`PaperSensitivityWarning`): that is a mean's sensitivity, not a record's.
    """
    check_choice("sensitivity", sensitivity, SENSITIVITIES)
    arr = _normalised_matrix("X", X)
    if sensitivity == "record":
        return np.ones(arr.shape[1])
    warnings.warn(
        "sensitivity='paper' uses range / n, the sensitivity of a column mean: each record gets "
        "n times too little noise, so the per-record epsilon claimed does NOT hold",
        PaperSensitivityWarning,
        stacklevel=2,
    )
    return np.maximum((arr.max(axis=0) - arr.min(axis=0)) / arr.shape[0], 1e-8)


@dataclasses.dataclass(frozen=True)
class APDIMPlan:
    """A fitted noise plan: budget shares, sensitivities and how they were obtained.

    ``shares`` and ``sensitivity`` have shape ``(d,)``; ``shares`` sums to 1.  ``importance``
    is the normalised MI (uniform for the baseline); ``groups`` partitions the features.
    """

    shares: np.ndarray
    sensitivity: np.ndarray
    importance: np.ndarray
    groups: Groups
    allocation: str
    sensitivity_mode: str

    @property
    def num_features(self) -> int:
        return int(self.shares.shape[0])

    def epsilons(self, epsilon: ArrayLike) -> np.ndarray:
        """Per-feature budgets ``(..., d)`` for total ``epsilon`` (scalar or array)."""
        check_positive("epsilon", epsilon)
        return np.asarray(epsilon, np.float64)[..., None] * self.shares

    def noise_scale(self, epsilon: ArrayLike) -> np.ndarray:
        """Laplace scale ``Delta_i / eps_i`` per feature, shape ``(..., d)``."""
        return self.sensitivity / self.epsilons(epsilon)


def fit_apdim(
    X: Any,
    y: Any,
    *,
    mi_weight: float = 0.8,
    theta: float = 0.7,
    base_ratio: float = 0.05,
    allocation: Literal["corrected", "paper"] = "corrected",
    sensitivity: Literal["record", "paper"] = "record",
    discrete: ArrayLike | None = None,
    random_state: int = 0,
) -> APDIMPlan:
    """Fit APDIM on a normalised table ``X`` ``(n, d)`` in [0, 1] with labels ``y`` ``(n,)``.

    Importance -> groups -> shares -> sensitivities; see the module docstring for the
    guarantee of each mode.  The fit itself reads the raw data without noise.
    """
    check_range("theta", theta, 0.0, 1.0)
    check_range("mi_weight", mi_weight, 0.0, 1.0)
    check_choice("allocation", allocation, ALLOCATIONS)
    check_choice("sensitivity", sensitivity, SENSITIVITIES)
    arr = _normalised_matrix("X", X)
    importance = feature_importance(arr, y, discrete=discrete, random_state=random_state)
    groups = correlation_groups(arr, theta)
    shares = budget_shares(
        importance, groups, mi_weight=mi_weight, base_ratio=base_ratio, allocation=allocation
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PaperSensitivityWarning)
        delta = feature_sensitivity(arr, sensitivity)
    if sensitivity == "paper":
        warnings.warn(
            "fit_apdim(sensitivity='paper'): range / n is a mean's sensitivity; the released "
            "records do NOT satisfy the claimed epsilon",
            PaperSensitivityWarning,
            stacklevel=2,
        )
    return APDIMPlan(shares, delta, importance, groups, allocation, sensitivity)


def uniform_plan(X: Any, *, sensitivity: Literal["record", "paper"] = "record") -> APDIMPlan:
    """The uniform-Laplace baseline: ``epsilon / d`` per feature, same sensitivity rule."""
    arr = _normalised_matrix("X", X)
    d = arr.shape[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PaperSensitivityWarning)
        delta = feature_sensitivity(arr, sensitivity)
    if sensitivity == "paper":
        warnings.warn(
            "uniform_plan(sensitivity='paper'): range / n does not give the claimed epsilon",
            PaperSensitivityWarning,
            stacklevel=2,
        )
    uniform = np.full(d, 1.0 / d)
    groups = tuple((i,) for i in range(d))
    return APDIMPlan(uniform, delta, uniform, groups, "uniform", sensitivity)


# ----------------------------------------------------------------------------------------
# 6. Noise (JAX)
# ----------------------------------------------------------------------------------------


def _noise(key: PRNGKeyArray, x: Array, shares: Array, sensitivity: Array, epsilon: Array) -> Array:
    # Clipping to the unit box is what makes Delta_i = 1 a valid record sensitivity for any
    # input, so it is part of the mechanism, not of the caller's preprocessing.
    return laplace_mechanism(
        key, bounded(x, 0.0, 1.0), l1_sensitivity=sensitivity, epsilon=epsilon * shares
    )


def privatize(
    key: PRNGKeyArray,
    X: Float[ArrayLike, "*rows d"],
    plan: APDIMPlan,
    epsilon: float,
) -> Float[Array, "*rows d"]:
    """Release ``X`` (clipped to [0, 1]) with ``Lap(Delta_i / (epsilon * share_i))`` noise.

    ``key`` must be secret (e.g. ``Secret.generate().key()`` with the release's index
    folded in, :mod:`swarmjax.privacy.secret`) and used for one release only: a key
    derived from anything published lets a reader regenerate the noise."""
    check_positive("epsilon", epsilon)
    x = jnp.asarray(X, jnp.float32)
    if x.shape[-1] != plan.num_features:
        raise ValueError(f"X has {x.shape[-1]} features; the plan has {plan.num_features}")
    return _noise(
        key,
        x,
        jnp.asarray(plan.shares, jnp.float32),
        jnp.asarray(plan.sensitivity, jnp.float32),
        jnp.asarray(epsilon, jnp.float32),
    )


def _run_key(root: PRNGKeyArray, seed: Array, epsilon: Array) -> PRNGKeyArray:
    # The secret root with the run's own (seed, epsilon) folded in: batch-invariant, and
    # nothing published (seed, epsilon) determines it without the root.
    bits = jax.lax.bitcast_convert_type(epsilon.astype(jnp.float32), jnp.uint32)
    return jax.random.fold_in(jax.random.fold_in(root, seed), bits)


@jax.jit
def _sweep(
    root: PRNGKeyArray,
    x: Array,
    shares: Array,
    sensitivity: Array,
    epsilons: Array,
    seeds: Array,
) -> Array:
    def one(epsilon: Array, seed: Array) -> Array:
        return _noise(_run_key(root, seed, epsilon), x, shares, sensitivity, epsilon)

    per_seed = jax.vmap(one, in_axes=(None, 0))
    return jax.vmap(per_seed, in_axes=(0, None))(epsilons, seeds)


def privatize_sweep(
    X: Float[ArrayLike, "n d"],
    plan: APDIMPlan,
    epsilons: Sequence[float] | ArrayLike,
    seeds: Sequence[int] | ArrayLike,
    *,
    secret: Secret | None = None,
) -> Float[Array, "eps seeds n d"]:
    """Noised copies of ``X`` for every (total epsilon, seed) pair in one jit-compiled call.

    Output ``[e, s]`` is the release at ``epsilons[e]`` with randomness from the secret's
    ChaCha20 key with ``seeds[s]`` and the bits of ``epsilons[e]`` folded in: identical
    whatever else is in the sweep, and never a function of the seed alone. ``secret``:
    ``None`` (default) draws a fresh one from operating-system entropy (two calls never
    share noise); pass one (:class:`~swarmjax.privacy.secret.Secret`) to reproduce a
    release, which is then private only while that secret is kept. Seeds must differ
    between releases drawn under one secret (equal seeds and epsilons give equal noise).
    """
    eps = np.atleast_1d(np.asarray(epsilons, np.float64))
    check_positive("epsilons", eps)
    seed_arr = np.atleast_1d(np.asarray(seeds))
    for s in seed_arr.tolist():
        check_int("seeds", s, minimum=0)
    arr = _numeric_matrix("X", X)
    if arr.shape[1] != plan.num_features:
        raise ValueError(f"X has {arr.shape[1]} features; the plan has {plan.num_features}")
    if secret is None:
        secret = Secret.generate()
    return _sweep(
        secret.key(),
        jnp.asarray(arr, jnp.float32),
        jnp.asarray(plan.shares, jnp.float32),
        jnp.asarray(plan.sensitivity, jnp.float32),
        jnp.asarray(eps, jnp.float32),
        jnp.asarray(seed_arr, jnp.uint32),
    )


def release_fingerprint(secret: Secret, seed: int, epsilon: float) -> str:
    """The public fingerprint (:func:`~swarmjax.privacy.secret.fingerprint`) of the key the
    release at (``epsilon``, ``seed``) of :func:`privatize_sweep` under ``secret`` draws
    from: what a ledger entry states of its noise (equal fingerprints, equal noise)."""
    seed = check_int("seed", seed, minimum=0)
    key = _run_key(secret.key(), jnp.uint32(seed), jnp.asarray(epsilon, jnp.float32))
    return fingerprint(key)


def record_epsilon(plan: APDIMPlan, epsilon: float) -> float:
    """The per-record epsilon the release actually satisfies (record-level local DP).

    ``sum_i eps_i * 1 / Delta_i`` (the widest change of feature ``i`` is 1 in normalised
    units): equals ``epsilon`` for ``sensitivity="record"``; for ``"paper"`` it is about
    ``n * epsilon``.
    """
    return float(np.sum(plan.epsilons(epsilon) / plan.sensitivity))
