"""APDIM vs uniform Laplace on Adult, MGM, CMC and Heart (seed 003, docs/algorithms.md section 5).

    python -m experiments.apdim            # default slice: all datasets and epsilons, 2 seeds
    python -m experiments.apdim --quick    # CI smoke run (< 1 minute)
    python -m experiments.apdim --full     # full training sets, 5 seeds, larger models

Measures, for the corrected mode (budget to informative features, record sensitivity) and the
paper mode (published formula, sensitivity range / n), at equal total epsilon:
F1 of five scikit-learn classifiers trained on noised data and tested on clean data, the
attribute-inference attack accuracy, the processing time per batch of rows, and the F1 over
(theta, alpha).  Writes CSV/JSON and figures (PNG + PDF, column-sized) under
``results/apdim/`` and prints a summary table.

Privacy ledger (``privacy_ledger.json/.md``, :func:`table_releases`): each noised table of
the correct mode is a record-level DP release (:data:`RELATION`; per-feature Laplace
events); the paper mode's tables (range / n sensitivity: about n times the claimed
epsilon), the clean baseline, the attack scores (read the clean sensitive attribute; the
majority share too), the fitted plans, the timing and the command's wall seconds are listed
as not private; every other file is public or computed from these (:data:`PUBLIC_FILES`).
Every (table, mode, mechanism, epsilon, seed) draws its own noise (:func:`release_seed`), so
releases never share it.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from sklearn.ensemble import AdaBoostClassifier, RandomForestClassifier
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import f1_score
from sklearn.model_selection import train_test_split
from sklearn.naive_bayes import GaussianNB
from sklearn.neighbors import KNeighborsClassifier
from sklearn.neural_network import MLPClassifier
from tqdm import tqdm

from experiments import _cli, _report
from swarmjax.privacy import apdim
from swarmjax.privacy.ledger import Ledger, Release
from swarmjax.privacy.secret import Secret, fingerprints, randomness

EPSILONS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0)
# mode -> (allocation, sensitivity)
MODES = {"correct": ("corrected", "record"), "paper": ("paper", "paper")}
MECHANISMS = ("apdim", "uniform")
PLANS = tuple((mode, mechanism) for mode in MODES for mechanism in MECHANISMS)
PARAMS_STREAM = 2**31 - 1  # root key of the (theta, alpha) grid's releases: no table's seed

RELATION = (
    "record-level, replace-one row (local DP): neighbouring tables differ in the feature "
    "values of one training row, replaced by any values in the unit box [0, 1]^d the "
    "encoder's ranges map to; every row gets independent per-feature Laplace noise whose "
    "budgets sum to epsilon. Public by assumption and covered by no epsilon: the label "
    "column (released unnoised, as in the paper), the encoder's ranges and the plan (MI, "
    "groups, shares: plans.json) fit on the raw rows, and the 30% test split. Each table is "
    "its own dataset (no person is in two): a row's ledger client id is its table's index "
    "in experiments.apdim.DATASETS (adult 0, mgm 1, cmc 2, heart 3), so tables compose in "
    "parallel"
)
"""The neighbouring relation of every DP release of this experiment, as
:mod:`swarmjax.privacy.apdim` accounts it (its module docstring and docs/apdim.md)."""


@dataclasses.dataclass(frozen=True)
class Dataset:
    file: str
    target: str
    sensitive: str  # attacked column (a feature of the released table)
    drop: tuple[str, ...] = ()
    binarise_sensitive: bool = False  # a numeric column: predict "above the median"


# Sensitive columns: a demographic attribute of each table that is also a released feature.
DATASETS = {
    "adult": Dataset("adults.csv", "income", "sex"),
    "mgm": Dataset("mgm.csv", "severity", "age", drop=("ID",), binarise_sensitive=True),
    "cmc": Dataset("cmc.csv", "method", "religion", drop=("ID",)),
    "heart": Dataset("heart.csv", "HeartDisease", "Sex"),
}


@dataclasses.dataclass(frozen=True)
class Profile:
    seeds: int
    epsilons: tuple[float, ...]
    max_train: int | None
    max_test: int | None
    rf_trees: int
    mlp_hidden: int
    mlp_iter: int
    ada_rounds: int
    batch_sizes: tuple[int, ...]
    timing_epsilons: tuple[float, ...]
    timing_reps: int
    thetas: tuple[float, ...]
    alphas: tuple[float, ...]


PROFILES = {
    "quick": Profile(1, (0.1, 5.0), 300, 300, 20, 16, 100, 20, (2000, 4000), (0.1, 1.0), 1,
                     (0.5, 0.9), (0.2, 0.8)),
    "default": Profile(2, EPSILONS, 3000, 2000, 50, 32, 150, 50,
                       (10_000, 20_000, 30_000, 40_000), (0.01, 0.1, 1.0), 2,
                       (0.5, 0.7, 0.9), (0.2, 0.5, 0.8, 1.0)),
    "full": Profile(5, EPSILONS, None, None, 100, 64, 300, 100,
                    (10_000, 20_000, 30_000, 40_000), (0.01, 0.1, 1.0), 5,
                    (0.5, 0.6, 0.7, 0.8, 0.9), (0.2, 0.5, 0.8, 1.0)),
}  # fmt: skip


# ----------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------


def find_tables(given: str | None) -> Path:
    """The folder of the four CSVs: ``<data dir>/tabular/``, or the data dir itself when it
    holds them (data dir as in ``experiments/_cli.py``)."""
    base = _cli.data_dir(given)
    return base / "tabular" if (base / "tabular").is_dir() else base


@dataclasses.dataclass
class Split:
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    sensitive: np.ndarray  # clean attacked attribute of the training rows (class codes)
    encoder: apdim.TabularEncoder


def _cap(frame: pd.DataFrame, target: str, limit: int | None, seed: int) -> pd.DataFrame:
    if limit is None or len(frame) <= limit:
        return frame
    kept, _ = train_test_split(frame, train_size=limit, stratify=frame[target], random_state=seed)
    return kept


def load_split(data_dir: Path, name: str, profile: Profile) -> Split:
    """70/30 stratified split; the encoder (codes, imputation, ranges) is fit on train only."""
    spec = DATASETS[name]
    frame = apdim.load_csv(data_dir / spec.file)
    train, test = train_test_split(
        frame, test_size=0.3, stratify=frame[spec.target], random_state=0
    )
    train = _cap(train, spec.target, profile.max_train, 0)
    test = _cap(test, spec.target, profile.max_test, 0)
    encoder = apdim.fit_encoder(train, spec.target, drop=spec.drop)
    X_train, y_train = encoder.transform(train)
    X_test, y_test = encoder.transform(test)
    j = encoder.features.index(spec.sensitive)
    raw = encoder.encode(train)[:, j]
    sensitive = (raw > np.median(raw)) if spec.binarise_sensitive else raw
    sensitive = np.unique(sensitive, return_inverse=True)[1]
    return Split(X_train, y_train, X_test, y_test, sensitive, encoder)


# ----------------------------------------------------------------------------------------
# models and metrics
# ----------------------------------------------------------------------------------------


def classifiers(profile: Profile, seed: int) -> dict[str, Callable[[], Any]]:
    return {
        "KNN": lambda: KNeighborsClassifier(n_neighbors=5),
        "GNB": lambda: GaussianNB(),
        "RF": lambda: RandomForestClassifier(profile.rf_trees, random_state=seed, n_jobs=1),
        "MLP": lambda: MLPClassifier(
            (profile.mlp_hidden,), max_iter=profile.mlp_iter, random_state=seed
        ),
        "ADB": lambda: AdaBoostClassifier(n_estimators=profile.ada_rounds, random_state=seed),
    }


def f1(model: Any, X: np.ndarray, y: np.ndarray, X_test: np.ndarray, y_test: np.ndarray) -> float:
    """Support-weighted F1 on the clean test set (the paper's Adult numbers are weighted)."""
    if np.unique(y).size < 2:
        return float(f1_score(y_test, np.full_like(y_test, y[0]), average="weighted"))
    model.fit(X, y)
    return float(f1_score(y_test, model.predict(X_test), average="weighted"))


def attack_accuracy(released: np.ndarray, sensitive: np.ndarray, seed: int) -> float:
    """Attribute inference: the attacker knows the sensitive value of half the released rows,
    trains a random forest on their released (noised) features, and predicts the other half.
    """
    rng = np.random.default_rng(seed)
    known = rng.permutation(len(sensitive)) < len(sensitive) // 2
    if np.unique(sensitive[known]).size < 2:
        return float(np.mean(sensitive[~known] == sensitive[known][0]))
    model = RandomForestClassifier(50, random_state=seed, n_jobs=1)
    model.fit(released[known], sensitive[known])
    return float(np.mean(model.predict(released[~known]) == sensitive[~known]))


# ----------------------------------------------------------------------------------------
# the experiment parts
# ----------------------------------------------------------------------------------------


def make_plans(split: Split, *, theta: float = 0.7, alpha: float = 0.8) -> dict:
    plans = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", apdim.PaperSensitivityWarning)
        for mode, (allocation, sensitivity) in MODES.items():
            plans[(mode, "apdim")] = apdim.fit_apdim(
                split.X_train,
                split.y_train,
                mi_weight=alpha,
                theta=theta,
                allocation=allocation,
                sensitivity=sensitivity,
                discrete=split.encoder.categorical,
            )
            plans[(mode, "uniform")] = apdim.uniform_plan(split.X_train, sensitivity=sensitivity)
    return plans


def release_seed(name: str, mode: str, mechanism: str, seed: int) -> int:
    """The seed :func:`swarmjax.privacy.apdim.privatize_sweep` draws the noise of ``seed``
    from for table ``name`` under (``mode``, ``mechanism``): distinct for every table, plan
    and seed, so no two releases share noise (the same key under two plans would give the
    same standard Laplace draws at two scales, from which the clean row is solved exactly).
    """
    table = list(DATASETS).index(name)
    return seed * len(DATASETS) * len(PLANS) + table * len(PLANS) + PLANS.index((mode, mechanism))


def run_utility(
    split: Split, plans: dict, name: str, profile: Profile, bar: tqdm, *, secret: Secret
) -> tuple[pd.DataFrame, list[dict]]:
    """F1 per (mode, mechanism, epsilon, seed, classifier), and the attack accuracy rows;
    ``plans`` is ``make_plans(split)``; the noise of ``seed`` comes from the call's
    ``secret`` (:meth:`~swarmjax.resume.CallStore.secret`) at :func:`release_seed`."""
    majority = float(np.bincount(split.sensitive).max() / len(split.sensitive))

    def labels(mode: str, mechanism: str, epsilon: float, seed: int) -> dict:
        return {
            "dataset": name,
            "mode": mode,
            "mechanism": mechanism,
            "epsilon": epsilon,
            "seed": seed,
        }

    rows = [
        labels("clean", "none", np.inf, 0)
        | {
            "classifier": clf,
            "f1": f1(make(), split.X_train, split.y_train, split.X_test, split.y_test),
        }
        for clf, make in classifiers(profile, 0).items()
    ]
    attacks = [
        labels("clean", "none", np.inf, 0)
        | {"accuracy": attack_accuracy(split.X_train, split.sensitive, 0), "majority": majority}
    ]
    seeds = list(range(profile.seeds))
    for (mode, mechanism), plan in plans.items():
        draws = [release_seed(name, mode, mechanism, s) for s in seeds]
        released = np.asarray(
            apdim.privatize_sweep(split.X_train, plan, profile.epsilons, draws, secret=secret),
            np.float32,
        )
        for e, epsilon in enumerate(profile.epsilons):
            for s in seeds:
                X_noisy = released[e, s]
                for clf, make in classifiers(profile, s).items():
                    score = f1(make(), X_noisy, split.y_train, split.X_test, split.y_test)
                    rows.append(
                        labels(mode, mechanism, epsilon, s) | {"classifier": clf, "f1": score}
                    )
                    bar.update(1)
                accuracy = attack_accuracy(X_noisy, split.sensitive, s)
                attacks.append(
                    labels(mode, mechanism, epsilon, s)
                    | {"accuracy": accuracy, "majority": majority}
                )
    return pd.DataFrame(rows), attacks


def params_keys(secret: Secret, runs: int) -> jax.Array:
    """``(runs,)`` keys of the (theta, alpha) grid's runs under the call's ``secret``: its
    key with ``PARAMS_STREAM`` and then the run's index folded in (:func:`run_params` draws
    run ``i`` from key ``i``; :func:`params_releases` states its fingerprint)."""
    root = jax.random.fold_in(secret.key(), PARAMS_STREAM)
    return jax.vmap(lambda i: jax.random.fold_in(root, i))(jnp.arange(runs, dtype=jnp.uint32))


def run_params(
    split: Split, profile: Profile, epsilon: float = 1.0, *, secret: Secret
) -> tuple[pd.DataFrame, dict]:
    """Fig. 3: random-forest F1 over (theta, alpha) on one dataset at one epsilon, and
    ``{"noise": per run, its labels and the Laplace scales it drew with}`` (for the ledger,
    saved with the call: refitting the plans on a rerun would cost the MI estimates again).
    Each run draws from its own key (the call's secret folded with ``PARAMS_STREAM`` and
    the run's index)."""
    keys = params_keys(secret, len(profile.thetas) * len(profile.alphas) * len(MODES))
    rows, noise = [], []
    for theta in profile.thetas:
        for alpha in profile.alphas:
            plans = make_plans(split, theta=theta, alpha=alpha)
            for mode in MODES:
                plan = plans[(mode, "apdim")]
                noisy = apdim.privatize(keys[len(rows)], split.X_train, plan, epsilon)
                model = classifiers(profile, 0)["RF"]()
                score = f1(model, np.asarray(noisy), split.y_train, split.X_test, split.y_test)
                labels = {"mode": mode, "theta": theta, "alpha": alpha, "epsilon": epsilon}
                rows.append(labels | {"f1": score})
                noise.append(labels | {"scales": noise_scales(plan, epsilon)})
    return pd.DataFrame(rows), {"noise": noise}


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def run_timing(data_dir: Path, profile: Profile) -> pd.DataFrame:
    """Fig. 2: seconds per batch of Adult rows (resampled with replacement up to the size).

    APDIM = fit (MI, grouping, allocation) + noise; uniform = plan + noise.  jit compilation
    is excluded (one warm-up call per shape): it is paid once per shape, not per batch.
    """
    frame = apdim.load_csv(data_dir / DATASETS["adult"].file)
    encoder = apdim.fit_encoder(frame, "income")
    X_all, y_all = encoder.transform(frame)
    rng = np.random.default_rng(0)
    rows = []
    for size in profile.batch_sizes:
        idx = rng.integers(0, len(X_all), size)
        X, y = X_all[idx], y_all[idx]
        for epsilon in profile.timing_epsilons:
            key = Secret.generate().key()  # the timed noise is never published, and secret

            def apdim_batch(X=X, y=y, epsilon=epsilon, key=key):
                plan = apdim.fit_apdim(X, y, discrete=encoder.categorical)
                return apdim.privatize(key, X, plan, epsilon)

            def uniform_batch(X=X, epsilon=epsilon, key=key):
                return apdim.privatize(key, X, apdim.uniform_plan(X), epsilon)

            uniform_batch()  # compile for this shape
            for rep in range(profile.timing_reps):
                rows.append(
                    {
                        "batch": size,
                        "epsilon": epsilon,
                        "rep": rep,
                        "apdim_s": _timed(apdim_batch),
                        "uniform_s": _timed(uniform_batch),
                    }
                )
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------
# the privacy ledger
# ----------------------------------------------------------------------------------------


def noise_scales(plan: apdim.APDIMPlan, epsilon: float) -> list[float]:
    """Laplace scale of every feature at total ``epsilon``, in normalised units, as the
    device computes it (float32 ``sensitivity / (epsilon * share)``)."""
    eps = np.float32(epsilon) * plan.shares.astype(np.float32)
    return (plan.sensitivity.astype(np.float32) / eps).astype(np.float64).tolist()


def laplace_event(scales: list[float]) -> dp_accounting.DpEvent:
    """One row's release: a Laplace mechanism per feature, each of sensitivity 1 (a feature
    moves by at most 1 in the unit box) and noise multiplier its scale, composed (features
    with equal scales as one self-composition).  The worst pair of neighbouring rows moves
    every feature at once, and the row's privacy loss is the sum of the features' losses:
    exactly the composition of these mechanisms."""
    counts = collections.Counter(scales)
    parts = [
        dp_accounting.LaplaceDpEvent(b)
        if n == 1
        else dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(b), n)
        for b, n in counts.items()
    ]
    return parts[0] if len(parts) == 1 else dp_accounting.ComposedDpEvent(parts)


def table_release(
    name: str,
    labels: dict,
    scales: list[float],
    seed: int | None,
    *,
    private: bool,
    path: Path,
    delta: float,
    accountant: str,
    randomness: dict | None = None,
) -> Release:
    """The release of one noised copy of table ``name`` (``labels``: mode, mechanism,
    epsilon, ...) drawn with ``scales``.

    ``private`` (the record sensitivity): a DP release under :data:`RELATION` whose event is
    :func:`laplace_event`, for the table's client id; its own epsilon is the pure epsilon
    ``sum_i 1 / scale_i`` (= the total epsilon), valid at any delta, so it is stated at the
    experiment's ``delta``.  Otherwise (the paper's range / n sensitivity) it is listed as
    NOT private with that per-record epsilon as a label: about n times the claimed one, no
    meaningful guarantee (the attack recovers the sensitive attribute), and beyond what an
    accountant represents (e^epsilon overflows).  ``randomness``: what drew its noise
    (:func:`swarmjax.privacy.secret.randomness` with the key's fingerprint).
    """
    record_eps = float(np.sum(1.0 / np.asarray(scales)))
    algorithm = "uniform_laplace" if labels.get("mechanism") == "uniform" else "apdim"
    if not private:
        labels = labels | {"claimed_epsilon": labels.get("epsilon"), "record_epsilon": record_eps}
        labels["sensitivity"] = "range / n (a column mean's): the claimed epsilon does not hold"
        return Release(algorithm, labels, seed, None, None, delta, math.inf, accountant,
                       str(path), randomness=randomness)  # fmt: skip
    table = list(DATASETS).index(name)
    return Release(
        algorithm=algorithm,
        variant=labels,
        seed=seed,
        unit="record",
        relation=RELATION,
        delta=delta,
        epsilon=record_eps,
        accountant=accountant,
        path=str(path),
        groups=(((table,), laplace_event(scales), 0.0),),
        randomness=randomness,
    )


def _not_private(what: str, labels: dict, path: Path, delta: float, accountant: str) -> Release:
    """A release of ``what`` computed from the raw rows without noise."""
    return Release(what, labels, None, None, None, delta, math.inf, accountant, str(path))


def table_releases(
    name: str,
    plans: dict,
    profile: Profile,
    out: Path,
    *,
    delta: float,
    accountant: str,
    secret: Secret,
) -> list[Release]:
    """Every release of table ``name``'s utility and attack step (:func:`run_utility`): the
    clean baseline, one per (mode, mechanism, epsilon, seed), the attack scores and the
    fitted plans.  They follow from the plans and settings alone (not from the noise
    drawn), so a reused call lists the same releases; each noised one states the call's
    ``secret``'s source and its key's fingerprint (:func:`apdim.release_fingerprint` at
    :func:`release_seed`)."""
    f1_csv, on = out / "f1.csv", {"dataset": name}
    releases = [_not_private("no noise (clean baseline)", on, f1_csv, delta, accountant)]
    for (mode, mechanism), plan in plans.items():
        private = plan.sensitivity_mode == "record"
        for epsilon in profile.epsilons:
            scales = noise_scales(plan, epsilon)
            labels = on | {"mode": mode, "mechanism": mechanism, "epsilon": epsilon}
            for seed in range(profile.seeds):
                drawn = randomness(secret.source, False) | {
                    "fingerprint": apdim.release_fingerprint(
                        secret, release_seed(name, mode, mechanism, seed), epsilon
                    )
                }
                release = table_release(
                    name, labels, scales, seed, private=private, path=f1_csv, delta=delta,
                    accountant=accountant, randomness=drawn,
                )  # fmt: skip
                releases.append(release)
    attack = on | {
        "score": "attribute inference, against the clean sensitive attribute",
        "majority": "the share of the most common sensitive value among the training rows",
    }
    releases.append(_not_private("attack", attack, out / "attack.csv", delta, accountant))
    fit = on | {"what": "MI, correlation groups, shares of every plan"}
    releases.append(_not_private("apdim_plan", fit, out / "plans.json", delta, accountant))
    return releases


def params_releases(
    name: str, noise: list[dict], out: Path, *, delta: float, accountant: str, secret: Secret
) -> list[Release]:
    """The releases of the (theta, alpha) grid on table ``name`` (``noise``: the payload of
    :func:`run_params`, whose ``secret`` drew run ``i`` from its key with ``PARAMS_STREAM``
    and ``i`` folded in: each release states the secret's source and that key's
    fingerprint)."""
    drawn = randomness(secret.source, False)
    prints = fingerprints(params_keys(secret, len(noise)))
    return [
        table_release(
            name,
            {"dataset": name, "mechanism": "apdim"}
            | {k: v for k, v in run.items() if k != "scales"},
            run["scales"],
            None,
            private=run["mode"] == "correct",
            path=out / "params.csv",
            delta=delta,
            accountant=accountant,
            randomness=drawn | {"fingerprint": key},
        )
        for run, key in zip(noise, prints, strict=True)
    ]


# ----------------------------------------------------------------------------------------
# figures and summary
# ----------------------------------------------------------------------------------------

PUBLIC_FILES = {
    "summary.csv": "F1 and attack accuracy per (dataset, mode, epsilon), means of f1.csv and "
    "attack.csv (the attack's scores are listed as not private)",
    "summary.json": "the settings, summary.csv, the clean baseline's mean F1 (f1.csv, listed as "
    "not private), timing.csv's medians (listed as not private), the wall seconds and peak "
    "memory of the whole command",
    "fig2_timing.png": "figure of timing.csv",
    "fig3_params.png": "figure of params.csv",
    "fig*_f1_*.png": "figures of f1.csv (the clean baseline drawn as a line: not private)",
    "fig8_attack.png": "figure of attack.csv (not private)",
}
SECONDS_NOT_COVERED = (
    "the command's wall seconds include fitting the plans, the clean baseline and the attack "
    "on the raw training rows, whose running time follows their values"
)
"""Files under ``--out`` besides the ledger's release paths and not-released folders: each
holds public settings, or is computed only from the releases and public data (so it is as
private as the releases it repeats); tests/test_released_files.py checks every file."""

STYLE = {  # colour and dash per line: told apart in grey print too
    ("correct", "apdim"): ("tab:blue", "-", "APDIM (correct)"),
    ("correct", "uniform"): ("tab:cyan", "--", "uniform (correct)"),
    ("paper", "apdim"): ("tab:red", "-", "APDIM (paper)"),
    ("paper", "uniform"): ("tab:orange", "--", "uniform (paper)"),
}


def _mode_curves(ax: Any, part: pd.DataFrame, column: str) -> None:
    """One errorbar curve (seed mean +- std over epsilon, log x) of ``column`` per mode x
    mechanism; with one epsilon, a labelled bar each (experiments._report.curves)."""
    noised = part[part["mode"] != "clean"]
    if noised.epsilon.nunique() == 1:
        labels = {(m, k): label for (m, k), (_, _, label) in STYLE.items()}
        colors = {label: color for color, _, label in STYLE.values()}
        keys = list(zip(noised["mode"], noised.mechanism, strict=True))
        shown = noised.assign(line=[labels[k] for k in keys])
        order = [label for _, _, label in STYLE.values()]
        shown = shown.sort_values("line", key=lambda c: c.map(order.index))
        _report.curves(ax, shown, column, line="line", x="epsilon", colors=colors,
                       xlabel="total epsilon")  # fmt: skip
        return
    for (mode, mechanism), (color, ls, label) in STYLE.items():
        sel = part[(part["mode"] == mode) & (part.mechanism == mechanism)]
        stats = sel.groupby("epsilon")[column].agg(["mean", "std"]).fillna(0.0)
        ax.errorbar(stats.index, stats["mean"], stats["std"], color=color, ls=ls, marker="o",
                    ms=3, capsize=2, label=label)  # fmt: skip
    _report.log_x(ax, noised.epsilon)
    ax.set_xlabel("total epsilon")


def plot_f1(f1_frame: pd.DataFrame, name: str, path: Path) -> None:
    """F1 against epsilon, one panel per classifier (a grid of at most three columns, 7 in
    wide), the clean baseline dotted; one legend below the panels."""
    data = f1_frame[f1_frame.dataset == name]
    clfs = list(dict.fromkeys(data.classifier))
    fig, axes = _report.panels(len(clfs), sharey=True)
    for ax, clf in zip(axes, clfs, strict=True):
        part = data[data.classifier == clf]
        _mode_curves(ax, part, "f1")
        clean = part[part["mode"] == "clean"].f1
        if len(clean):
            ax.axhline(clean.mean(), color="k", lw=0.8, ls=":", label="no noise")
        ax.set_title(clf)
        ax.legend()
    for ax in axes[:: _report.layout(len(clfs))[1]]:
        ax.set_ylabel("weighted F1 (clean test)")
    _report.save(fig, path, caption=f"{name}: classifiers trained on noised rows")


def plot_attack(attack: pd.DataFrame, path: Path) -> None:
    """Attribute-inference accuracy against epsilon, one panel per dataset."""
    names = list(dict.fromkeys(attack.dataset))
    fig, axes = _report.panels(len(names))
    for ax, name in zip(axes, names, strict=True):
        part = attack[attack.dataset == name]
        _mode_curves(ax, part, "accuracy")
        ax.axhline(part.majority.iloc[0], color="gray", lw=0.8, label="majority class")
        clean = part[part["mode"] == "clean"].accuracy
        ax.axhline(clean.mean(), color="k", lw=0.8, ls=":", label="no noise")
        ax.set_title(f"{name}: {DATASETS[name].sensitive}")
        ax.set_ylabel("attacker accuracy")
        ax.legend()
    _report.save(fig, path, caption="attribute inference from the noised rows")


def plot_timing(timing: pd.DataFrame, path: Path) -> None:
    """Median seconds per batch against the batch size (one column wide)."""
    fig, axes = _report.grid(1, 1)
    ax = axes[0, 0]
    stats = timing.groupby(["epsilon", "batch"])[["apdim_s", "uniform_s"]].median()
    for i, epsilon in enumerate(stats.index.get_level_values(0).unique()):
        part = stats.loc[epsilon]
        lines = len(part) > 1  # one batch size: markers, no line
        for column, ls, marker, what in (("apdim_s", "-", "o", "APDIM"),
                                         ("uniform_s", "--", "s", "Laplace")):  # fmt: skip
            ax.plot(part.index, part[column], color=f"C{i}", ls=ls if lines else "none",
                    marker=marker, label=f"{what} eps={epsilon:g}")  # fmt: skip
    ax.set_yscale("log")
    ax.set_xlabel("batch size (rows)")
    ax.set_ylabel("seconds per batch (median)")
    ax.set_title("Processing time")
    ax.legend()
    _report.save(fig, path)


def plot_params(params: pd.DataFrame, path: Path, name: str = "adult") -> None:
    """RF F1 on ``name`` over the (theta, alpha) grid, one heat map per mode."""
    modes = list(dict.fromkeys(params["mode"]))
    fig, axes = _report.panels(len(modes))
    for ax, mode in zip(axes, modes, strict=True):
        grid = params[params["mode"] == mode].pivot(index="theta", columns="alpha", values="f1")
        im = ax.imshow(grid.to_numpy(), cmap="viridis", aspect="auto", origin="lower")
        ax.set_xticks(range(grid.shape[1]), [f"{a:g}" for a in grid.columns])
        ax.set_yticks(range(grid.shape[0]), [f"{t:g}" for t in grid.index])
        for (i, j), value in np.ndenumerate(grid.to_numpy()):
            ax.text(j, i, f"{value:.3f}", ha="center", va="center", fontsize=6, color="w")
        ax.set_xlabel("alpha (mi_weight)")
        ax.set_ylabel("theta")
        ax.set_title(mode)
        fig.colorbar(im, ax=ax)
    _report.save(fig, path, caption=f"RF F1 on {name} at eps={params.epsilon.iloc[0]:g}")


def _read_split(data_dir: Path, name: str, profile: Profile) -> Split:
    """:func:`load_split`, a table that cannot be read (truncated, empty, a column missing)
    reported as one line naming its file."""
    try:
        return load_split(data_dir, name, profile)
    except _cli.UNREADABLE as err:
        raise _cli.unreadable(str(data_dir / DATASETS[name].file), err, "tabular/*.csv") from None


def summarise(f1_frame: pd.DataFrame, attack: pd.DataFrame) -> pd.DataFrame:
    """Per dataset, mode and epsilon: F1 averaged over classifiers, APDIM minus uniform."""
    noisy = f1_frame[f1_frame["mode"] != "clean"]
    mean = noisy.groupby(["dataset", "mode", "epsilon", "mechanism"]).f1.mean().unstack()
    table = mean.rename(columns={"apdim": "f1_apdim", "uniform": "f1_uniform"})
    table["f1_gain"] = table.f1_apdim - table.f1_uniform
    att = attack[attack["mode"] != "clean"]
    att = att.groupby(["dataset", "mode", "epsilon", "mechanism"]).accuracy.mean().unstack()
    table["attack_apdim"] = att["apdim"]
    table["attack_uniform"] = att["uniform"]
    return table.reset_index()


# ----------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None):
    parser = _cli.parser(
        "apdim",
        "APDIM vs uniform Laplace (correct and paper modes): F1, attribute inference, "
        "processing time and the (theta, alpha) grid.",
        quick="CI smoke run (< 1 minute)",
        full="all rows, 5 seeds, larger models",
        data="tabular/*.csv (adults, cmc, heart, mgm)",
        seeds="quick 1, default 2, full 5; vmapped",
        privacy="records",
    )
    parser.add_argument(
        "--datasets",
        nargs="+",
        choices=list(DATASETS),
        help="tables to run (default: all four; without this option a missing CSV is "
        "reported and skipped, with it a missing CSV is an error)",
    )
    parser.add_argument("--skip-timing", action="store_true", help="skip the Fig. 2 timing")
    return parser.parse_args(argv)


@_cli.entry_point
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    _cli.process_options(args)  # before anything compiles
    name = _cli.profile_name(args)
    profile = PROFILES[name]
    profile = dataclasses.replace(profile, seeds=len(_cli.seeds(args, profile.seeds)))
    data_dir = find_tables(args.data_dir)
    requested = args.datasets or list(DATASETS)
    missing = [ds for ds in requested if not (data_dir / DATASETS[ds].file).is_file()]
    from swarmjax.data import fetch_command

    stage = f"stage them with `{fetch_command('tabular', args.data_dir)}`"
    if missing and args.datasets:
        files = ", ".join(DATASETS[ds].file for ds in missing)
        raise _cli.UserError(f"--datasets: {files} not found in {str(data_dir)!r}: {stage}")
    if len(missing) == len(requested):
        files = ", ".join(DATASETS[ds].file for ds in requested)
        raise _cli.UserError(f"none of the APDIM tables ({files}) is in {str(data_dir)!r}: {stage}")
    for ds in missing:
        print(f"skipping {ds}: {data_dir / DATASETS[ds].file} not found")
    args.datasets = [ds for ds in requested if ds not in missing]
    out = _cli.out_dir(args)
    # every noised table is a release of its rows (docs/ledger.md); checked writable now
    ledger = Ledger(out, "apdim", accountant=args.accountant)
    settings = dataclasses.asdict(profile)
    store = _cli.call_store(
        out,
        settings,
        __name__,
        args,
        ledger=ledger,
    )
    warnings.filterwarnings("ignore", category=ConvergenceWarning)
    started = time.perf_counter()

    splits = {ds: _read_split(data_dir, ds, profile) for ds in args.datasets}
    # pure DP holds at any delta: state every release at 0.1 / (training rows of all tables)
    delta = _cli.delta(args, sum(len(split.y_train) for split in splits.values()))
    on_ledger = {"delta": delta, "accountant": args.accountant}
    n_fits = len(args.datasets) * len(MODES) * len(MECHANISMS) * len(profile.epsilons)
    n_fits *= profile.seeds * 5
    plans_json, f1_frames, attack_frames = {}, [], []
    hide = not _cli.progress_bars()
    with tqdm(total=n_fits, desc="APDIM F1 fits", unit="fit", disable=hide) as bar:
        for ds, split in splits.items():
            bar.set_postfix(dataset=ds)
            plans = make_plans(split)
            run = partial(run_utility, split, plans, ds, profile, bar)
            f1_ds, attacks, reused = store.fetch_or_run(f"utility_{ds}", run, with_secret=True)
            if reused:
                bar.update(n_fits // len(splits))
            secret = store.secret(f"utility_{ds}")  # the one the call drew from
            for release in table_releases(ds, plans, profile, out, secret=secret, **on_ledger):
                ledger.add(release)
            f1_frames.append(f1_ds)
            attack_frames.append(pd.DataFrame(attacks))
            pd.concat(f1_frames).to_csv(out / "f1.csv", index=False)
            pd.concat(attack_frames).to_csv(out / "attack.csv", index=False)
            plans_json[ds] = {
                f"{mode}/{mech}": {
                    "features": list(split.encoder.features),
                    "importance": plan.importance.round(4).tolist(),
                    "groups": [list(g) for g in plan.groups],
                    "shares": plan.shares.round(4).tolist(),
                    "sensitivity": plan.sensitivity.tolist(),
                    "record_epsilon_at_eps1": apdim.record_epsilon(plan, 1.0),
                }
                for (mode, mech), plan in plans.items()
            }
    _report.write_json(out / "plans.json", plans_json)
    f1_frame, attack = pd.concat(f1_frames), pd.concat(attack_frames)
    for i, ds in enumerate(args.datasets):
        plot_f1(f1_frame, ds, out / f"fig{4 + i}_f1_{ds}.png")
    plot_attack(attack, out / "fig8_attack.png")

    params_ds = "adult" if "adult" in splits else next(iter(splits))
    params, noise, _ = store.fetch_or_run(
        f"params_{params_ds}", partial(run_params, splits[params_ds], profile), with_secret=True
    )
    secret = store.secret(f"params_{params_ds}")
    for release in params_releases(params_ds, noise["noise"], out, secret=secret, **on_ledger):
        ledger.add(release)
    params.to_csv(out / "params.csv", index=False)
    plot_params(params, out / "fig3_params.png", params_ds)
    timing = None
    if not args.skip_timing:
        timing = store.fetch_or_run_table("timing", partial(run_timing, data_dir, profile))
        timing.to_csv(out / "timing.csv", index=False)
        plot_timing(timing, out / "fig2_timing.png")
        what = {"dataset": "adult", "what": "seconds per batch of resampled rows"}
        ledger.add(_not_private("timing", what, out / "timing.csv", **on_ledger))

    table = summarise(f1_frame, attack)
    table.to_csv(out / "summary.csv", index=False)
    clean = f1_frame[f1_frame["mode"] == "clean"].groupby("dataset").f1.mean()
    summary = {
        "profile": name,
        "profile_settings": dataclasses.asdict(profile),
        "seconds": round(time.perf_counter() - started, 1),
        "clean_f1_mean_over_classifiers": clean.round(4).to_dict(),
        "sensitive_columns": {ds: DATASETS[ds].sensitive for ds in args.datasets},
        "table": table.round(4).to_dict(orient="records"),
    }
    if timing is not None:
        med = timing.groupby(["batch", "epsilon"])[["apdim_s", "uniform_s"]].median()
        summary["timing_median_s"] = med.round(4).reset_index().to_dict(orient="records")
    _report.write_json(out / "summary.json", summary)

    with pd.option_context("display.width", 160, "display.max_rows", 200):
        print(table.round(3).to_string(index=False))
        print("\nclean F1 (mean over classifiers):", clean.round(3).to_dict())
        if timing is not None:
            print("\nmedian seconds per batch:\n", med.round(4).to_string())
    if store.reused:
        print(f"\nreused from {store.folder} (--restart runs them again): {store.reused}")
    _report.not_covered(
        ledger, "wall-clock timing", out / "summary.json", SECONDS_NOT_COVERED, delta=delta,
        keys="seconds (summary.json)",
    )  # fmt: skip
    _report.write_ledger(ledger)
    print(f"\n{summary['seconds']} s")
    _report.finish(out, out / "summary.json")


if __name__ == "__main__":
    main()
