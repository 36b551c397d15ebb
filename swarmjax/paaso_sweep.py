"""PAASO as a sweep task: grids over strategies, functions, agent counts and numerics.

Grid keys: static ``strategy``, ``function``, ``num_agents``, ``k_alpha``, ``iterations``,
``dim``, ``fl_rule`` (the function, the voting strategy and ``k_alpha`` reach the compiled
program as data: one program runs all eight functions, all three voting strategies and
every ``k_alpha`` up to 64); numeric ``w``, ``phi_p``, ``phi_g``, ``w_g``, ``p_c``,
``p_m``, ``speed``, ``vmax_factor``; ``seed``.  ``phi`` sets ``phi_p = phi_g`` (the paper's grid).
Numerics a strategy ignores (``w_g`` for PSO, ``p_m`` unless PbDRD, ...) are reset to their
defaults, and ``k_alpha`` to 8 for non-voting strategies, so the grid has no duplicate runs.
The static ``draw_casts`` is derived: off when ``p_c = 1`` (no casting randomness needed).

Privacy ledger (``run_sweep(..., ledger=...)``, :meth:`PAASOTask.releases`): each
configuration of a voting strategy is one agent-level release (:data:`AGENT_RELATION`,
the ledger's ``"client"`` unit) covering its runs; PSO and FL share positions or
directions in the clear and are listed as not private.  Every run draws from its own key,
the sweep's secret with the run's id folded in (:mod:`swarmjax.sweep`), so configurations
never share noise and the ledger composes them; each release states the secret's source and
the joint fingerprint of its runs' keys (:func:`swarmjax.sweep.run_randomness`); a sweep
with common random numbers (runs of one seed sharing draws across configurations,
:data:`COMMON_RANDOMNESS`) is refused a ledger.  The sweep folder itself holds unnoised
counts of the agents' state (:data:`NOT_RELEASED`) and its secret, and is listed as not
released.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import dp_accounting
import jax
import numpy as np
import pandas as pd

from swarmjax import paaso
from swarmjax._validation import check_choice, check_int
from swarmjax.objectives import get_objective
from swarmjax.privacy.accounting import PureDpEvent, event_epsilon
from swarmjax.privacy.ledger import Release
from swarmjax.privacy.mechanisms import random_dictatorship_epsilon, randomized_response_epsilon

__all__ = [
    "AGENT_RELATION",
    "COMMON_RANDOMNESS",
    "NOT_RELEASED",
    "PAASOTask",
    "expand_phi",
    "run_release",
    "swarm_source",
]

AGENT_RELATION = (
    "agent-level (the ledger's client unit), add/remove: neighbouring swarms differ in one "
    "agent added or removed with all of its votes over the run; each iteration's DP random "
    "dictatorship is ln(2n/(n+1))-DP at the largest pool n = agents + k_alpha dummies (the "
    "realised pool depends on private data, so only this bound composes), composed over "
    "the run's iterations. Public: the benchmark function, the centre pG and f(pG) (the "
    "outputs), the nominal number of agents, k_alpha and every hyper-parameter. Each run "
    "(seed) is its own swarm, so a configuration's runs compose in parallel. PbDRD's PRAM "
    "adds a local guarantee per vote (replace-one vote: pram_epsilon_per_vote), not "
    "composed here"
)
"""The neighbouring relation of a voting strategy's release (:func:`run_release`)."""

COMMON_RANDOMNESS = (
    "crn:paaso: runs with one seed share their random streams across configurations "
    "(run_sweep(common_random_numbers=True))"
)
"""The randomness tag of PAASO releases drawn with common random numbers (``run_release(...,
common_random_numbers=True)``): two or more such voting configurations have no finite
joint epsilon."""

NOT_RELEASED = (
    "raw sweep rows: per-run mean_voters, drd_eps_mean and nonfinite are unnoised counts of "
    "the agents' private state (who voted, whose state diverged), covered by no epsilon"
)
"""Why a PAASO sweep folder is private intermediate state (publish the figures' CSVs)."""


@functools.lru_cache(maxsize=256)
def _drd_event(agents: int, k_alpha: int, iterations: int) -> dp_accounting.DpEvent:
    """One agent's whole run: the DRD bound at pool ``agents + k_alpha``, every iteration."""
    bound = float(random_dictatorship_epsilon(np.asarray(agents + k_alpha)))
    return dp_accounting.SelfComposedDpEvent(PureDpEvent(bound), iterations)


@functools.lru_cache(maxsize=256)
def _drd_epsilon(agents: int, k_alpha: int, iterations: int, delta: float, accountant: str):
    return event_epsilon(_drd_event(agents, k_alpha, iterations), delta, accountant=accountant)


def _seeds_text(seeds: Sequence[int]) -> str:
    """``"0..19"`` for a contiguous range, else the seeds joined by commas."""
    ordered = sorted(int(s) for s in seeds)
    if ordered == list(range(ordered[0], ordered[-1] + 1)) and len(ordered) > 2:
        return f"{ordered[0]}..{ordered[-1]}"
    return ",".join(map(str, ordered))


def run_release(
    config: Mapping[str, Any],
    seeds: Sequence[int],
    path: str,
    *,
    delta: float,
    accountant: str,
    common_random_numbers: bool = False,
    randomness: Mapping[str, Any] | None = None,
) -> Release:
    """The release of one PAASO configuration run for every seed of ``seeds``.

    ``config`` holds ``strategy``, ``num_agents``, ``k_alpha`` and ``iterations`` (and any
    other labels, e.g. the function and the numerics; ``p_m`` gives PbDRD's per-vote PRAM
    epsilon).  A voting strategy is an agent-level DP release (:data:`AGENT_RELATION`; its
    event is the DRD bound self-composed over the iterations, its epsilon that event's at
    ``delta`` by ``accountant``); PSO and FL are not private.  ``randomness``: what drew
    the runs' random numbers (:func:`swarmjax.sweep.run_randomness`: the secret's source
    and the joint fingerprint of their keys; ``None``: not stated).  Runs drawn with
    common random numbers carry the tag :data:`COMMON_RANDOMNESS` instead (the ledger then
    refuses to compose two of them).
    """
    drawn = COMMON_RANDOMNESS if common_random_numbers else (dict(randomness or {}) or None)
    data = swarm_source(config, path)
    if not seeds:
        raise ValueError("seeds must name at least one run of the configuration")
    strategy = check_choice("strategy", config.get("strategy"), paaso.STRATEGIES)
    labels = {k: v for k, v in config.items() if k != "strategy"}
    labels |= {"runs": len(seeds), "seeds": _seeds_text(seeds)}
    if strategy not in paaso.VOTING:
        return Release(f"paaso_{strategy}", labels, None, None, None, delta, math.inf,
                       accountant, path, randomness=drawn, data=data)  # fmt: skip
    agents = check_int("num_agents", int(config["num_agents"]), minimum=1)
    k_alpha = check_int("k_alpha", int(config["k_alpha"]), minimum=2)
    iterations = check_int("iterations", int(config["iterations"]), minimum=1)
    if strategy == "pbdrd" and "p_m" in config:
        pram = randomized_response_epsilon(float(config["p_m"]), k_alpha)
        labels["pram_epsilon_per_vote"] = float(pram)
    return Release(
        algorithm=f"paaso_{strategy}",
        variant=labels,
        seed=None,
        unit="client",
        relation=AGENT_RELATION,
        delta=delta,
        epsilon=_drd_epsilon(agents, k_alpha, iterations, float(delta), accountant),
        accountant=accountant,
        path=path,
        groups=((None, _drd_event(agents, k_alpha, iterations), 0.0),),
        randomness=drawn,
        data=data,
    )


def swarm_source(config: Mapping[str, Any], path: str) -> str:
    """The ledger's data source of one configuration's runs: their own swarms.

    A PAASO run's private data are its agents, which the run itself creates from its own
    secret key, so the swarms of two configurations (or of one configuration in two sweeps)
    share no agent and their releases compose in parallel, not in sequence: each is its own
    data source in the ledger, named by a digest of the configuration and where it was
    published."""
    text = json.dumps({str(k): str(v) for k, v in config.items()}, sort_keys=True) + path
    return f"paaso swarms {hashlib.sha256(text.encode()).hexdigest()[:10]}"


_NUMERIC = {f.name: f.default for f in fields(paaso.PAASOHyper)}
_RELEVANT = {
    "pso": {"w", "phi_p", "phi_g", "vmax_factor"},
    "fl": {"w", "phi_p", "phi_g", "vmax_factor", "w_g"},
    "adrd": {"w", "phi_p", "phi_g", "vmax_factor", "w_g", "p_c", "speed"},
    "bdrd": {"w", "phi_p", "phi_g", "vmax_factor", "w_g", "p_c", "speed"},
    "pbdrd": {"w", "phi_p", "phi_g", "vmax_factor", "w_g", "p_c", "speed", "p_m"},
}
_STATIC_DEFAULTS = {
    "strategy": "pso",
    "function": "f4",
    "num_agents": 50,
    "k_alpha": 8,
    "iterations": 1000,
    "dim": 2,
    "fl_rule": "direction",
}


def expand_phi(grid: Mapping[str, Any]) -> dict[str, Any]:
    """Replace a ``phi`` entry by equal ``phi_p`` and ``phi_g`` (handled as one numeric).

    Since the product over two keys would pair every phi_p with every phi_g, the pairing
    is kept by sweeping ``phi_p`` and tying ``phi_g`` to it (``phi_g = "phi_p"``).
    """
    grid = dict(grid)
    if "phi" in grid:
        if "phi_p" in grid or "phi_g" in grid:
            raise ValueError("give either phi or phi_p/phi_g in a grid, not both")
        grid["phi_p"] = grid.pop("phi")
        grid["tie_phi"] = True
    return grid


@dataclass(frozen=True)
class PAASOTask:
    """The PAASO family for :func:`swarmjax.sweep.run_sweep`."""

    name: str = "paaso"
    static_keys: tuple[str, ...] = (*_STATIC_DEFAULTS, "tie_phi", "draw_casts")
    numeric_defaults: Mapping[str, float] = None  # type: ignore[assignment]
    trajectory_every: int = 1
    not_released: ClassVar[str] = NOT_RELEASED

    def __post_init__(self) -> None:
        object.__setattr__(self, "numeric_defaults", dict(_NUMERIC))
        if self.trajectory_every < 1:
            raise ValueError(f"trajectory_every must be >= 1; got {self.trajectory_every}")

    def config(self, static: Mapping[str, Any]) -> paaso.PAASOConfig:
        kwargs = {k: static.get(k, v) for k, v in _STATIC_DEFAULTS.items()}
        return paaso.PAASOConfig(**kwargs, draw_casts=bool(static.get("draw_casts", True)))

    def normalise(self, static: dict[str, Any], numeric: dict[str, float]) -> None:
        for k, v in _STATIC_DEFAULTS.items():
            static.setdefault(k, v)
        static["tie_phi"] = bool(static.get("tie_phi", False))
        check_choice("strategy", static["strategy"], paaso.STRATEGIES)  # not "voting"
        get_objective(static["function"])  # a name, never None
        cfg = self.config(static)  # validates the static values
        if static["tie_phi"]:
            numeric["phi_g"] = numeric["phi_p"]
        paaso.PAASOHyper(**numeric).validate()
        for k in numeric:
            if k not in _RELEVANT[cfg.strategy]:
                numeric[k] = float(_NUMERIC[k])
        if cfg.strategy not in paaso.VOTING:
            static["k_alpha"] = _STATIC_DEFAULTS["k_alpha"]
        # p_c = 1 needs no casting randomness (derived, never read from the grid)
        static["draw_casts"] = cfg.strategy in paaso.VOTING and numeric["p_c"] < 1.0

    def program(self, static: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The function, and a voting group's strategy and ``k_alpha`` (up to
        ``paaso.MAX_DATA_K_ALPHA``), become data."""
        program = {**static, "function": None}
        function = paaso.FUNCTIONS.index(get_objective(static["function"]).name)
        data = {"function": np.int32(function)}
        if static["strategy"] in paaso.VOTING:
            program["strategy"] = paaso.ANY_VOTING
            data["voting"] = np.int32(paaso.VOTING.index(static["strategy"]))
            if static["k_alpha"] <= paaso.MAX_DATA_K_ALPHA:
                program["k_alpha"] = None
                data["k_alpha"] = np.int32(static["k_alpha"])
        return program, data

    def batched(self, program: Mapping[str, Any]):
        cfg = self.config(program)
        every = self.trajectory_every

        def one(numeric: dict[str, jax.Array], key: jax.Array, data) -> dict[str, jax.Array]:
            hyper = paaso.PAASOHyper(**numeric)
            out = paaso.run(key, cfg, hyper, **data)
            out["objective"] = out["objective"][every - 1 :: every]
            return out

        return jax.vmap(one, in_axes=(0, 0, None))

    def bytes_per_run(self, static: Mapping[str, Any]) -> int:
        cfg = self.config(static)
        state = cfg.num_agents * cfg.dim * 4 * 8
        return state + cfg.iterations * 4 * 4

    def rows(
        self,
        static: Mapping[str, Any],
        numeric: Mapping[str, np.ndarray],
        seeds: np.ndarray,
        outputs: dict[str, np.ndarray],
    ) -> pd.DataFrame:
        cfg = self.config(static)
        frame = pd.DataFrame({k: static[k] for k in _STATIC_DEFAULTS}, index=range(len(seeds)))
        for k, v in numeric.items():
            frame[k] = v
        frame["seed"] = seeds
        frame["final_objective"] = outputs["final_objective"]
        frame["gap"] = outputs["final_objective"] - cfg.objective.optimum_value(cfg.dim)
        for i in range(cfg.dim):
            frame[f"x{i + 1}"] = outputs["final_position"][:, i]
        frame["nonfinite"] = outputs["nonfinite"]
        frame["mean_voters"] = outputs["voters"].mean(axis=-1)
        for k, v in paaso.privacy_summary(cfg, numeric["p_m"], outputs["voters"]).items():
            frame[k] = v
        return frame

    def arrays(self, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"objective": outputs["objective"].astype(np.float32)}

    def releases(
        self,
        rows: pd.DataFrame,
        path: str,
        *,
        delta: float,
        accountant: str,
        randomness: Callable[[Sequence[str]], Mapping[str, Any]] | None = None,
    ) -> list[Release]:
        """One :func:`run_release` per configuration of ``rows`` (a sweep's results: its
        static and numeric columns name the configuration, ``seed`` its runs, ``run_id``
        their keys), in order of first appearance; ``randomness(run_ids)`` states what drew
        a configuration's runs (:func:`swarmjax.sweep.run_randomness`; ``None``: not
        stated)."""
        if rows.empty:
            return []
        config = [*_STATIC_DEFAULTS, *self.numeric_defaults]
        releases = []
        for key, group in rows.groupby(config, sort=False, dropna=False):
            labels = {
                k: v.item() if isinstance(v, np.generic) else v
                for k, v in zip(config, key, strict=True)
            }
            drawn = None if randomness is None else randomness(group["run_id"].tolist())
            releases.append(
                run_release(
                    labels,
                    group["seed"].tolist(),
                    path,
                    delta=delta,
                    accountant=accountant,
                    randomness=drawn,
                )
            )
        return releases
