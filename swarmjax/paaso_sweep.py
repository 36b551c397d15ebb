"""PAASO as a sweep task: grids over strategies, functions, agent counts and numerics.

Grid keys: static ``strategy``, ``function``, ``num_agents``, ``k_alpha``, ``iterations``,
``dim``, ``fl_rule`` (the function, the voting strategy and ``k_alpha`` reach the compiled
program as data: one program runs all eight functions, all three voting strategies and
every ``k_alpha`` up to 64); numeric ``w``, ``phi_p``, ``phi_g``, ``w_g``, ``p_c``,
``p_m``, ``speed``, ``vmax_factor``; ``seed``.  ``phi`` sets ``phi_p = phi_g`` (the paper's grid).
Numerics a strategy ignores (``w_g`` for PSO, ``p_m`` unless PbDRD, ...) are reset to their
defaults, and ``k_alpha`` to 8 for non-voting strategies, so the grid has no duplicate runs.
The static ``draw_casts`` is derived: off when ``p_c = 1`` (no casting randomness needed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import jax
import numpy as np
import pandas as pd

from swarmjax import paaso
from swarmjax._validation import check_choice
from swarmjax.objectives import get_objective

__all__ = ["PAASOTask", "expand_phi"]

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

        def one(numeric: dict[str, jax.Array], seed: jax.Array, data) -> dict[str, jax.Array]:
            hyper = paaso.PAASOHyper(**numeric)
            out = paaso.run(jax.random.key(seed), cfg, hyper, **data)
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
