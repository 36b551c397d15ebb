"""What every federated run returns: :class:`Result` (final states, public history, privacy
record) and how the privacy record is derived from the clients' :class:`Spend`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from swarmjax.fl.protocol import Exchange, Spend, coverage
from swarmjax.privacy.accounting import epsilon as accounted_epsilon

__all__ = ["RELATIONS", "PrivacyRecord", "Result", "privacy_record", "relation"]

RELATIONS: dict[str, str] = {
    "record": "record-level, zero-out: neighbouring datasets differ in one record of one "
    "client replaced by a null record that contributes nothing to any gradient or score "
    "(every |D_i|, hence q_i = B / |D_i| and the scored subset, is public and unchanged)",
    "client": "client-level, add/remove: neighbouring datasets differ in one whole client "
    "(with all of its data) added or removed",
}
"""The ONE neighbouring relation of each privacy unit: every mechanism of a run is
calibrated and accounted under it, and every privacy record states it (docs/privacy.md)."""


def relation(unit: str | None) -> str | None:
    """The neighbouring relation every epsilon of ``unit`` is stated under (:data:`RELATIONS`);
    ``None`` without DP."""
    return None if unit is None else RELATIONS[unit]


@dataclass(frozen=True)
class PrivacyRecord:
    """The privacy of a run, derived from the exchanges' declarations and the clients' spend.

    Attributes:
        unit: ``"record"`` (one example of a client), ``"client"`` (a whole client) or
            ``None`` (no DP: every epsilon is ``inf``).
        relation: the neighbouring relation every epsilon holds under
            (:data:`RELATIONS` of ``unit``: zero-out for records, add/remove for clients).
        delta: the delta every epsilon is stated at.
        epsilon: ``(runs, rounds, clients)`` cumulative epsilon of each client after each
            round (RDP accountant on the accounted steps + the noised releases' epsilons).
        sample_rate, noise_multiplier: ``(runs, clients)`` of the accounted steps.
        steps: ``(runs, rounds, clients)`` accounted steps so far.
        covers: one line per protected message field (what epsilon covers).
        not_covered: one line per ``unprotected`` field (exact private statistics that the
            server saw and that no epsilon covers); empty when the guarantee is end-to-end.
    """

    unit: str | None
    delta: float
    epsilon: np.ndarray
    sample_rate: np.ndarray
    noise_multiplier: np.ndarray
    steps: np.ndarray
    covers: tuple[str, ...]
    not_covered: tuple[str, ...]
    relation: str | None = None

    @property
    def final_epsilon(self) -> np.ndarray:
        """``(runs, clients)`` epsilon after the last round."""
        return self.epsilon[:, -1]

    @property
    def end_to_end(self) -> bool:
        """True when no message field is ``unprotected``."""
        return not self.not_covered


def privacy_record(
    spend: Spend,
    exchanges: tuple[Exchange, ...],
    *,
    unit: str | None,
    delta: float,
    overflow_prob: np.ndarray | None = None,
) -> PrivacyRecord:
    """The privacy record of a run: epsilon per (run, round, client) by the RDP accountant.

    Args:
        spend: what the clients' accountants counted after each round (a :class:`Spend`
            with ``(runs, rounds, clients)`` leaves).
        exchanges: the algorithm's exchanges; their declarations say what epsilon covers.
        unit: ``"record"``, ``"client"`` or ``None`` (no DP: every epsilon is inf).
        delta: the delta every epsilon is stated at.
        overflow_prob: per-step chance (``(clients,)`` or broadcastable to the spend's
            shape) that a static-size Poisson draw overflowed (a client's batch buffer, or
            the draw of clients), charged to ``delta`` so the stated delta covers the
            sampler.

    Returns:
        A :class:`PrivacyRecord`; equal ``(q, sigma, steps, overflow)`` are accounted once.
    """
    q = np.asarray(spend.sample_rate, np.float64)
    sigma = np.asarray(spend.noise_multiplier, np.float64)
    steps = np.asarray(spend.steps, np.int64)
    extra = np.asarray(spend.extra_epsilon, np.float64)
    over = np.broadcast_to(
        np.zeros(steps.shape[-1]) if overflow_prob is None else np.asarray(overflow_prob),
        steps.shape,
    )
    cache: dict[tuple[float, float, int, float], float] = {}

    def eps(qi: float, si: float, ti: int, pi: float) -> float:
        if ti == 0:
            return 0.0
        if si <= 0.0 or unit is None:
            return math.inf
        if (qi, si, ti, pi) not in cache:
            cache[qi, si, ti, pi] = accounted_epsilon(qi, si, ti, delta, overflow_prob=pi)
        return cache[qi, si, ti, pi]

    values = zip(q.ravel(), sigma.ravel(), steps.ravel(), over.ravel(), strict=True)
    flat = [eps(*v) for v in values]
    epsilon = np.asarray(flat, np.float64).reshape(steps.shape) + extra
    if unit is None:
        epsilon = np.full(steps.shape, math.inf)
    covered, uncovered = coverage(exchanges)
    return PrivacyRecord(
        unit=unit,
        delta=float(delta),
        epsilon=epsilon,
        sample_rate=q[:, -1],
        noise_multiplier=sigma[:, -1],
        steps=steps,
        covers=covered,
        not_covered=uncovered,
        relation=relation(unit),
    )


@dataclass(frozen=True)
class Result:
    """The one result type of every federated run.

    Attributes:
        server: final server states, leading run axis.
        clients: final client states, leading ``(runs, clients)`` axes (they never leave
            the clients in a deployment; kept here to resume or inspect a simulation).
        history: the released history: one row per (run, round) with the run's labels
            (``seed`` and e.g. ``epsilon_target``), ``round``, the algorithm's public metrics
            (server state + public test set), the bytes every exchange moved and
            ``epsilon_max`` (the largest client epsilon so far; see ``privacy``).
        metrics: the same public metrics as arrays ``(runs, rounds, ...)`` (vector metrics
            such as the reported losses live only here).
        privacy: the :class:`PrivacyRecord`.
        runs: one row per run: its labels.
        private_diagnostics: statistics of private data for debugging (empty unless the run
            asked for them); never part of the history, NOT covered by any epsilon.
    """

    server: Any
    clients: Any
    history: pd.DataFrame
    metrics: dict[str, np.ndarray]
    privacy: PrivacyRecord
    runs: pd.DataFrame
    private_diagnostics: dict[str, np.ndarray] = field(default_factory=dict)
