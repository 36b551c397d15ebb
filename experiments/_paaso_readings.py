"""The readings study of the PAASO paper's ambiguous parts, as one vmapped sweep per program.

The paper's Figs. 1-3 setting (f4, 50 agents, k_alpha 8, phi_p = phi_g = 2, wG 0.005, p_c 1,
p_m 0.9) leaves open: the inertia (``w = 4.00`` as printed, or 0.40, the value of its own
search grid), the velocity clamp and position clip (the paper has neither; an
inertia-weighted swarm at ``w = 4`` diverges without them), the length of the voted step
(``speed``) and the FL rule's undefined ``b_i`` (``fl_rule``).  :func:`run_readings` runs
every combination for every strategy over the same seeds: the numeric readings are array
leaves (one compiled program per strategy, position clip and FL rule, vmapped over
readings x seeds), and returns one row per reading with the statistics that decide the
paper's findings.  ``python -m experiments.paaso --readings`` writes it to
``readings.csv``; docs/paaso.md discusses the numbers.

Every (configuration, run) draws from its own key: the study's secret with the
configuration's index and the run's folded in, so no two configurations share noise (each
is a release in the experiment's ledger, composed as independent). Each row's
``key_fingerprint`` is the joint fingerprint of its runs' keys (a public commitment the
ledger entry states, :func:`swarmjax.privacy.secret.joint_fingerprint`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from swarmjax import paaso
from swarmjax.privacy.secret import Secret, fingerprints, joint_fingerprint

INERTIA = {"literal": 4.0, "typo": 0.4}  # the paper's printed w, and its search grid's 0.4
VMAX_FACTORS = (1.0, 0.25, 0.1, math.inf)
SPEEDS = (1.0, 2.0, 5.0, 10.0)
CHECKPOINTS = (100, 250, 500, 1000)
CONVERGED = 1.0  # f4 value under which a run (or the mean over runs) counts as converged


def study_keys(secret: Secret | None, first: int, configs: int, runs: int) -> jax.Array:
    """``(configs, runs)`` keys: ``secret``'s key (a fresh secret when ``None``) with the
    configuration index ``first + c`` and then the run ``r`` folded in."""
    root = (Secret.generate() if secret is None else secret).key()
    index = jnp.arange(first, first + configs, dtype=jnp.uint32)

    def config(root: jax.Array, c: jax.Array) -> jax.Array:
        k = jax.random.fold_in(root, c)
        return jax.vmap(lambda r: jax.random.fold_in(k, r))(jnp.arange(runs, dtype=jnp.uint32))

    # the root is an argument, never a constant of the program: a compiled program's
    # constants are kept in any persistent compilation cache (docs/privacy.md)
    return jax.jit(jax.vmap(config, in_axes=(None, 0)))(root, index)


def key_fingerprint(keys: jax.Array) -> str:
    """The joint fingerprint of one configuration's ``(runs,)`` keys (its row's
    ``key_fingerprint``)."""
    return joint_fingerprint(fingerprints(keys))


def _stats(objective: np.ndarray) -> dict[str, float]:
    """Statistics of ``objective`` ``(runs, T)`` at the checkpoints (those within ``T``)."""
    mean = objective.mean(axis=0)
    T = objective.shape[1]
    out: dict[str, float] = {}
    for t in (c for c in CHECKPOINTS if c <= T):
        out[f"mean_{t}"] = float(mean[t - 1])
    last = objective[:, -1]
    out["std_last"] = float(last.std(ddof=1)) if len(last) > 1 else math.nan
    out["median_last"] = float(np.median(last))
    out["converged_last"] = float(np.mean(last < CONVERGED))
    below = mean < CONVERGED
    out["iters_to_mean_below_1"] = int(np.argmax(below)) + 1 if below.any() else math.inf
    return out


def run_readings(
    runs: int = 20,
    iterations: int = 1000,
    strategies: Sequence[str] = paaso.STRATEGIES,
    inertia: dict[str, float] = INERTIA,
    vmax_factors: Sequence[float] = VMAX_FACTORS,
    speeds: Sequence[float] = SPEEDS,
    fl_rules: Sequence[str] = paaso.FL_RULES,
    clip_positions: Sequence[bool] = (True, False),
    base: dict[str, float] | None = None,
    secret: Secret | None = None,
) -> pd.DataFrame:
    """One row per (strategy, reading): statistics over ``runs`` seeds of ``f(pG)`` / ``f(g)``.
    ``secret``: the study's (:func:`study_keys`; ``None``: a fresh one).

    ``base``: the other numerics (default the Fig. 2 setting).  Readings a strategy ignores
    (``speed`` for PSO and FL, ``fl_rule`` for PSO) are not repeated.
    """
    base = base or {"phi_p": 2.0, "phi_g": 2.0, "w_g": 0.005, "p_c": 1.0, "p_m": 0.9}
    secret = Secret.generate() if secret is None else secret
    rows = []
    for strategy, clip, rule in itertools.product(strategies, clip_positions, fl_rules):
        if strategy == "pso" and rule != fl_rules[0]:
            continue
        cfg = paaso.PAASOConfig(
            strategy=strategy,
            function="f4",
            iterations=iterations,
            clip_positions=clip,
            fl_rule=rule,
        )
        voting = strategy in paaso.VOTING
        grid = list(
            itertools.product(inertia.items(), vmax_factors, speeds if voting else speeds[:1])
        )
        hyper = paaso.PAASOHyper(
            w=jnp.array([w for (_, w), _, _ in grid]),
            vmax_factor=jnp.array([v for _, v, _ in grid]),
            speed=jnp.array([s for _, _, s in grid]),
            **{k: jnp.full(len(grid), v) for k, v in base.items()},
        )

        keys = study_keys(secret, len(rows), len(grid), runs)

        def over_seeds(h: paaso.PAASOHyper, ks, cfg: paaso.PAASOConfig = cfg) -> jax.Array:
            return jax.vmap(lambda key: paaso.run(key, cfg, h)["objective"])(ks)

        objective = np.asarray(jax.jit(jax.vmap(over_seeds))(hyper, keys), dtype=np.float64)
        for ((name, w), vmax, speed), obj, ks in zip(grid, objective, keys, strict=True):
            obj = np.where(np.isfinite(obj), obj, np.inf)
            rows.append(
                {
                    "strategy": strategy,
                    "inertia": name,
                    "w": w,
                    "vmax_factor": vmax,
                    "clip_positions": clip,
                    "fl_rule": rule if strategy != "pso" else "-",
                    "speed": speed if voting else math.nan,
                    **_stats(obj),
                    "key_fingerprint": key_fingerprint(ks),
                }
            )
    return pd.DataFrame(rows)


AGENT_READINGS = ((1.0, 1.0), (0.1, 1.0), (0.1, 2.0), (0.1, 5.0))  # (vmax_factor, speed)


def run_agents_study(
    runs: int = 40,
    iterations: int = 1000,
    agents: Sequence[int] = (50, 100, 200),
    readings: Sequence[tuple[float, float]] = AGENT_READINGS,
    early: int = 300,
    secret: Secret | None = None,
) -> pd.DataFrame:
    """Fig. 5 (bDRD, f4, w 0.005, phi 2, wG 0.01) under each (clamp, voted step) reading.

    One row per (reading, agent count): mean f over the first ``early`` iterations (area
    under the mean curve), over all iterations, and the one-sided Mann-Whitney p-value that
    this agent count does better than the smallest (per-run areas over ``early``).
    """
    from scipy import stats

    secret = Secret.generate() if secret is None else secret
    vmax = jnp.array([v for v, _ in readings])
    speed = jnp.array([s for _, s in readings])
    areas, prints = {}, {}
    for a, n in enumerate(agents):
        cfg = paaso.PAASOConfig(strategy="bdrd", function="f4", iterations=iterations, num_agents=n)
        keys = study_keys(secret, a * len(readings), len(readings), runs)

        def over_seeds(v, s, ks, cfg: paaso.PAASOConfig = cfg) -> jax.Array:
            hyper = paaso.PAASOHyper(
                w=0.005, phi_p=2.0, phi_g=2.0, w_g=0.01, p_c=1.0, vmax_factor=v, speed=s
            )
            return jax.vmap(lambda key: paaso.run(key, cfg, hyper)["objective"])(ks)

        areas[n] = np.asarray(jax.jit(jax.vmap(over_seeds))(vmax, speed, keys), np.float64)
        prints[n] = [key_fingerprint(ks) for ks in keys]
    rows = []
    for i, (v, s) in enumerate(readings):
        base = areas[agents[0]][i, :, :early].mean(axis=1)
        for n in agents:
            obj = areas[n][i]
            rows.append(
                {
                    "vmax_factor": v,
                    "speed": s,
                    "num_agents": n,
                    f"area_{early}": float(obj[:, :early].mean()),
                    "area_all": float(obj.mean()),
                    "p_better_than_first": float(
                        stats.mannwhitneyu(
                            obj[:, :early].mean(axis=1), base, alternative="less"
                        ).pvalue
                    ),
                    "key_fingerprint": prints[n][i],
                }
            )
    return pd.DataFrame(rows)


def run_fl_step_study(
    runs: int = 20,
    iterations: int = 1000,
    speeds: Sequence[float] = (1.0, 5.0, 10.0),
    secret: Secret | None = None,
) -> pd.DataFrame:
    """FL with ``fl_step="unit"`` (pG moves ``wG * speed`` toward the agents' mean velocity)
    at the Fig. 2 (w 0.4) and Fig. 4 settings, clamp 0.1 widths; one row per speed."""
    secret = Secret.generate() if secret is None else secret
    cfg = paaso.PAASOConfig(strategy="fl", function="f4", iterations=iterations, fl_step="unit")
    rows = []
    for i, (setting, w, w_g) in enumerate((("Fig. 2", 0.4, 0.005), ("Fig. 4", 0.005, 0.01))):
        keys = study_keys(secret, i * len(speeds), len(speeds), runs)

        def over_seeds(speed, ks, w=w, w_g=w_g) -> jax.Array:
            hyper = paaso.PAASOHyper(
                w=w, phi_p=2.0, phi_g=2.0, w_g=w_g, vmax_factor=0.1, speed=speed
            )
            return jax.vmap(lambda key: paaso.run(key, cfg, hyper)["objective"])(ks)

        objective = np.asarray(jax.jit(jax.vmap(over_seeds))(jnp.array(speeds), keys), np.float64)
        for speed, obj, ks in zip(speeds, objective, keys, strict=True):
            row = {"setting": setting, "w": w, "w_g": w_g, "speed": speed, **_stats(obj)}
            rows.append(row | {"key_fingerprint": key_fingerprint(ks)})
    return pd.DataFrame(rows)
