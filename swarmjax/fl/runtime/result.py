"""What every federated run returns: :class:`Result` (final states, public history, privacy
record), how the privacy record is derived from the clients' accounted steps and the plan,
:func:`report`, which turns any runtime's outputs (the simulator's and the Flower
ServerApp's) into that one :class:`Result`, and :class:`Publication`: what a call publishes
and where it is recorded."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dp_accounting
import jax
import numpy as np
import pandas as pd

from swarmjax.fl.protocol import (
    Accounting,
    Algorithm,
    Exchange,
    RunSpec,
    Variants,
    coverage,
    privacy_unit,
)
from swarmjax.privacy.accounting import (
    PureDpEvent,
    Rates,
    epsilon_curve,
    poisson_gaussian_event,
)
from swarmjax.privacy.canaries import CanaryReport
from swarmjax.privacy.ledger import Ledger
from swarmjax.privacy.plan import RELATIONS

__all__ = [
    "RELATIONS",
    "SELECTED",
    "Disclosure",
    "PrivacyRecord",
    "PublicRounds",
    "Publication",
    "Result",
    "history",
    "metric_columns",
    "privacy_record",
    "relation",
    "report",
    "run_labels",
    "run_privacy",
    "step_events",
]

ClientGroup = tuple[tuple[int, ...] | None, dp_accounting.DpEvent, float]
"""Clients with identical accounting in one run: (their ids, ``None`` for every client; the
whole run's dp-accounting event; the summed overflow chance ``P`` charged to delta)."""


def relation(unit: str | None) -> str | None:
    """The neighbouring relation every epsilon of ``unit`` is stated under (:data:`RELATIONS`);
    ``None`` without DP."""
    return None if unit is None else RELATIONS[unit]


@dataclass(frozen=True)
class PrivacyRecord:
    """The privacy of a run, derived from the exchanges' declarations, the clients' accounted
    steps and the plan's rates.

    Attributes:
        unit: ``"record"`` (one example of a client), ``"client"`` (a whole client) or
            ``None`` (no DP: every epsilon is ``inf``).
        relation: the neighbouring relation every epsilon holds under
            (:data:`RELATIONS` of ``unit``: zero-out of one record, or of one client).
        delta: the delta every epsilon is stated at.
        epsilon: ``(runs, rounds, clients)`` cumulative epsilon of each client after each
            round: the accountant's composition of its accounted steps (their DpEvents,
            sampler overflow charged to delta) plus the noised releases' epsilons.
        sample_rate, noise_multiplier: ``(runs, clients)`` of the accounted steps.
        steps: ``(runs, rounds, clients)`` accounted steps so far.
        covers: one line per protected message field (what epsilon covers).
        not_covered: one line per ``unprotected`` field (exact private statistics that the
            server saw and that no epsilon covers); empty when the guarantee is end-to-end.
        accountant: ``"pld"`` or ``"rdp"``: what composed the events.
        shares_randomness: the runs of this call share random numbers (common random
            numbers): each epsilon holds for its run alone, and publishing two or more of
            them together has no finite epsilon (a ledger refuses to compose them).
        groups: per run, the :data:`ClientGroup` s of its clients (:meth:`run_events`).
        floating_point: what the exact released float values reveal beyond epsilon
            (:meth:`~swarmjax.fl.protocol.Algorithm.floating_point`); ``None`` without DP.
        audit: per run, its canary audit as a dict
            (:meth:`~swarmjax.privacy.canaries.CanaryReport.to_dict`: ``epsilon_lower``,
            ``confidence``, ...); empty when the run was not audited.
        randomness: what drew the runs' numbers (:func:`randomness`: generator, secret
            source, common random numbers, the condition a supplied secret puts on every
            epsilon); ``None`` for a record built outside a runtime.
        key_fingerprints: per run, a public 128-bit commitment to its key
            (:func:`~swarmjax.privacy.secret.fingerprint`): equal fingerprints, equal draws.
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
    accountant: str = "pld"
    shares_randomness: bool = False
    groups: tuple[tuple[ClientGroup, ...], ...] = ()
    floating_point: str | None = None
    audit: tuple[dict[str, Any], ...] = ()
    randomness: dict[str, Any] | None = None
    key_fingerprints: tuple[str, ...] = ()

    def __repr__(self) -> str:
        """One line: unit, relation, the final epsilon over runs and clients, delta and what
        is not covered; never the arrays (``epsilon``, ``steps``, ... hold them)."""
        return f"PrivacyRecord({_privacy_line(self)})"

    @property
    def final_epsilon(self) -> np.ndarray:
        """``(runs, clients)`` epsilon after the last round."""
        return self.epsilon[:, -1]

    @property
    def end_to_end(self) -> bool:
        """True when no message field is ``unprotected``."""
        return not self.not_covered

    def run_events(self, run: int) -> list[ClientGroup]:
        """Run ``run``'s clients grouped by identical accounting: ``(client ids or None for
        every client, the whole run's DpEvent, summed overflow)``; the noised releases'
        epsilon is a :class:`~swarmjax.privacy.accounting.PureDpEvent` inside the event."""
        return list(self.groups[run])


StepEvent = Callable[[float, float, int], dp_accounting.DpEvent]
"""``(q, sigma, steps) -> DpEvent``: a round's accounted steps as an event."""


def _column_event(
    q, sigma, dsteps, extra: float, step_event: StepEvent = poisson_gaussian_event
) -> dp_accounting.DpEvent:
    """One client's whole-run event from its per-round ``(q, sigma, new steps)``: runs of
    equal ``(q, sigma)`` merged into one self-composition."""
    parts: list[tuple[float, float, int]] = []
    for qi, si, ti in zip(q, sigma, dsteps, strict=True):
        if ti == 0:
            continue
        if parts and parts[-1][:2] == (qi, si):
            parts[-1] = (qi, si, parts[-1][2] + int(ti))
        else:
            parts.append((float(qi), float(si), int(ti)))
    events = [step_event(max(qi, 1e-12), si, ti) for qi, si, ti in parts]
    if extra > 0:
        events.append(PureDpEvent(float(extra)))
    if not events:
        return dp_accounting.NoOpDpEvent()
    return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)


@dataclass(frozen=True)
class Disclosure:
    """What a privacy record states beside its epsilons; none of it changes a number.

    Attributes:
        randomness: what drew the runs' numbers (:func:`randomness`); ``None``: not stated.
        key_fingerprints: per run, the public fingerprint of its key.
        shares_randomness: the runs used common random numbers.
        floating_point: what the exact released values reveal (the mechanism's
            floating-point note; dropped from records without a privacy unit).
    """

    randomness: dict[str, Any] | None = None
    key_fingerprints: tuple[str, ...] = ()
    shares_randomness: bool = False
    floating_point: str | None = None


def privacy_record(
    steps: np.ndarray,
    exchanges: tuple[Exchange, ...],
    *,
    unit: str | None,
    delta: float,
    rates: Rates | None = None,
    accountant: str = "pld",
    step_events: Sequence[StepEvent | None] | None = None,
    disclosure: Disclosure = Disclosure(),
) -> PrivacyRecord:
    """The privacy record of a run: epsilon per (run, round, client) by ``accountant``.

    Args:
        steps: ``(runs, rounds, clients)`` accounted steps of each client after each round
            (:meth:`~swarmjax.fl.protocol.Accounting.steps`).
        exchanges: the algorithm's exchanges; their declarations say what epsilon covers.
        unit: ``"record"``, ``"client"`` or ``None`` (no DP: every epsilon is inf).
        delta: the delta every epsilon is stated at.
        rates: the accounted steps' Poisson rate ``q`` and noise multiplier ``sigma``, the
            chance a static-size Poisson draw overflowed (charged to ``delta``, so the
            stated delta covers the sampler) and the epsilon of other noised releases
            (added by basic composition), each broadcastable to ``steps``' shape
            (:class:`~swarmjax.privacy.accounting.Rates`; ``q``, ``sigma`` as
            ``(runs, 1, clients)`` from :meth:`~swarmjax.fl.protocol.Accounting.rates`);
            ``None``: ``Rates()``, no noise.
        accountant: ``"pld"`` or ``"rdp"`` (:mod:`swarmjax.privacy.accounting`).
        step_events: per run, how its ``(q, sigma, steps)`` become events
            (:meth:`~swarmjax.fl.protocol.Accounting.step_event`); ``None`` (or a ``None``
            entry): Poisson-subsampled Gaussian steps. With any entry set, no two runs
            share a group (their events differ beyond ``(q, sigma, steps)``).
        disclosure: what the record states beside its epsilons (:class:`Disclosure`).

    Returns:
        A :class:`PrivacyRecord`; clients with equal per-round ``(q, sigma, steps,
        overflow)`` are accounted once (a 10,000-client federation under client-level DP is
        one composition).
    """
    steps = np.asarray(steps, np.int64)
    if steps.ndim != 3:
        raise ValueError(f"steps must be (runs, rounds, clients); got shape {steps.shape}")
    rates = Rates() if rates is None else rates
    q = np.broadcast_to(np.asarray(rates.sample_rate, np.float64), steps.shape)
    sigma = np.broadcast_to(np.asarray(rates.noise_multiplier, np.float64), steps.shape)
    extra = np.broadcast_to(
        np.asarray(0.0 if rates.extra_epsilon is None else rates.extra_epsilon, np.float64),
        steps.shape,
    )
    runs, rounds, clients = steps.shape
    over = np.broadcast_to(
        np.zeros(clients) if rates.overflow is None else np.asarray(rates.overflow), steps.shape
    )
    dsteps = np.diff(steps, axis=1, prepend=0)
    # one row per (run, client): its per-round (q, sigma, new steps, overflow)
    table = np.stack([q, sigma, dsteps.astype(np.float64), over], axis=-1)  # (R, T, N, 4)
    rows = table.transpose(0, 2, 1, 3).reshape(runs * clients, rounds * 4)
    # one row per (run, client): its per-round accounting and its final extra epsilon (the
    # noised releases'), so a group shares its whole-run event
    rows = np.concatenate([rows, extra[:, -1, :].reshape(-1, 1)], axis=1)
    per_run = step_events is not None and any(e is not None for e in step_events)
    if per_run:  # the run's index joins its rows: groups never span runs
        rows = np.concatenate([np.repeat(np.arange(runs), clients)[:, None], rows], axis=1)
    if np.array_equal(rows, np.broadcast_to(rows[:1], rows.shape), equal_nan=True):
        # one group (client-level DP, or equal clients in every run): np.unique's row sort
        # of (runs x clients, 4 rounds + 1) values would cost 0.08 s at 16 rounds x 1,200
        # clients and grow with the rounds, to find the same single row
        unique, inverse = rows[:1], np.zeros((runs, clients), np.int64)
    else:
        unique, inverse = np.unique(rows, axis=0, return_inverse=True)
        inverse = inverse.reshape(runs, clients)
    curves = np.zeros((len(unique), rounds))
    overflows = np.zeros(len(unique))
    events: list[dp_accounting.DpEvent] = []
    for g, row in enumerate(unique):
        step_event: StepEvent = poisson_gaussian_event
        if per_run:
            step_event = step_events[int(row[0])] or poisson_gaussian_event
            row = row[1:]
        gq, gs, gt, gp = row[:-1].reshape(rounds, 4).T
        gt = gt.astype(np.int64)
        if unit is None:
            curves[g] = np.where(np.cumsum(gt) > 0, math.inf, 0.0)
            events.append(dp_accounting.NonPrivateDpEvent())
        else:
            rounds_events = [
                step_event(max(a, 1e-12), b, int(c)) for a, b, c in zip(gq, gs, gt, strict=True)
            ]
            curves[g] = epsilon_curve(rounds_events, delta, accountant=accountant, overflow=gt * gp)
            events.append(_column_event(gq, gs, gt, float(row[-1]), step_event))
        overflows[g] = float(np.sum(gt * gp))
    epsilon = curves[inverse].transpose(0, 2, 1) + extra  # (R, T, N)
    if unit is None:
        epsilon = np.full(steps.shape, math.inf)
    groups = []
    for r in range(runs):
        found = []
        for g in np.unique(inverse[r]):
            members = np.flatnonzero(inverse[r] == g)
            ids = None if len(members) == clients else tuple(int(i) for i in members)
            found.append((ids, events[g], float(overflows[g])))
        groups.append(tuple(found))
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
        accountant=accountant,
        shares_randomness=bool(disclosure.shares_randomness),
        groups=tuple(groups),
        floating_point=disclosure.floating_point if unit is not None else None,
        randomness=disclosure.randomness,
        key_fingerprints=tuple(disclosure.key_fingerprints),
    )


def run_privacy(
    alg: Algorithm,
    steps: np.ndarray,
    hyper: Any,
    spec: RunSpec,
    num_clients: int,
    *,
    sizes: np.ndarray | None = None,
    disclosure: Disclosure = Disclosure(),
) -> PrivacyRecord:
    """The privacy record of ``alg``'s runs as every runtime releases it (the simulator's
    ``finish`` and the Flower ServerApp): :func:`privacy_record` with what the algorithm
    declares (its exchanges) and what its one
    :class:`~swarmjax.fl.protocol.Accounting` answers (unit, floating-point note, the
    plan's rates, overflow and other releases, per-run step events) at ``spec``'s delta
    and accountant.

    Args:
        alg: the algorithm that ran.
        steps: the clients' accounted steps after each round (``(runs, rounds, clients)``
            ints).
        hyper: the runs' hyper values (leading run axis).
        spec: the run's :class:`~swarmjax.fl.protocol.RunSpec`.
        num_clients: ``N``.
        sizes: ``(N,)`` the clients' real row counts (record-level ``q_i`` and buffer
            overflow); ``None`` where the runtime has none.
        disclosure: what the runtime states beside the epsilons (its ``floating_point`` is
            replaced by the accounting's own note).
    """
    acc = alg.accounting()
    steps = np.asarray(steps, np.int64)
    runs, rounds = steps.shape[:2]
    rates = Rates()
    if acc is not None:
        rates = acc.rates(jax.device_get(hyper), rounds, num_clients, sizes)
        rates = dataclasses.replace(  # one (q, sigma) per run and client, for every round
            rates,
            sample_rate=np.asarray(rates.sample_rate)[:, None, :],
            noise_multiplier=np.asarray(rates.noise_multiplier)[:, None, :],
        )
    return privacy_record(
        steps,
        alg.setup + alg.exchanges,
        unit=privacy_unit(acc),
        delta=spec.delta,
        rates=rates,
        accountant=spec.accountant,
        step_events=step_events(alg, hyper, runs),
        disclosure=dataclasses.replace(
            disclosure, floating_point=None if acc is None else acc.floating_point()
        ),
    )


def step_events(alg: Algorithm, hyper: Any, runs: int) -> list | None:
    """Per run (``hyper``'s leading axis), the ``(q, sigma, steps) -> DpEvent`` of
    ``alg``'s accounting (``None``: Gaussian steps, or no claim;
    :meth:`~swarmjax.fl.protocol.Accounting.step_event`)."""
    acc = alg.accounting()
    if acc is None or type(acc).step_event is Accounting.step_event:  # nothing to ask
        return None
    host = jax.device_get(hyper)
    rows = [acc.step_event(jax.tree.map(lambda a, r=r: a[r], host)) for r in range(runs)]
    return None if all(e is None for e in rows) else rows


_NOT_METRICS = frozenset(
    {"round", "epsilon_max", "bytes_up", "bytes_down", "cum_bytes_up", "cum_bytes_down"}
)


def _span(values: np.ndarray) -> str:
    """``v`` when every value is equal, else ``lo..hi`` (4 significant digits)."""
    lo, hi = float(np.min(values)), float(np.max(values))
    return f"{lo:.4g}" if lo == hi else f"{lo:.4g}..{hi:.4g}"


def _privacy_line(p: PrivacyRecord) -> str:
    """The privacy claim of a record in one line (no arrays)."""
    if p.unit is None:
        return "no DP (epsilon = inf)"
    eps = np.asarray(p.final_epsilon)
    relation = (p.relation or f"{p.unit}-level").split(":")[0]  # e.g. "record-level, zero-out"
    line = (
        f"{relation}; final epsilon {_span(eps)} at delta={p.delta:.3g} ({p.accountant}; "
        f"{eps.shape[0]} runs x {eps.shape[1]} clients)"
    )
    if p.not_covered:
        n = len(p.not_covered)
        line += f"; NOT covered: {n} message field{'s' * (n != 1)} or undeclared exchange"
        line += f"{'s' * (n != 1)} (privacy.not_covered)"
    if p.shares_randomness:
        line += "; runs share their random numbers"
    if p.randomness is not None and p.randomness.get("secret") == "supplied":
        line += "; noise from a supplied secret: holds only while it is kept"
    return line


def _sizes(tree: Any, axes: int) -> str:
    """``Type: n arrays, m values, leading (a, b)`` of a state pytree (no values)."""
    import jax

    leaves = jax.tree.leaves(tree)
    if not leaves:
        return f"{type(tree).__name__}: empty"
    values = sum(int(np.prod(np.shape(leaf))) for leaf in leaves)
    lead = tuple(np.shape(leaves[0])[:axes])
    return f"{type(tree).__name__}: {len(leaves)} arrays, {values:,} values, leading axes {lead}"


def _result_repr(res: Result) -> str:
    """:meth:`Result.__repr__`."""
    h = res.history
    runs = len(res.runs)
    rounds = int(h["round"].max()) if len(h) else 0
    clients = np.shape(res.privacy.epsilon)[2] if np.ndim(res.privacy.epsilon) == 3 else "?"
    name = res.algorithm or f"server state {type(res.server).__name__}"
    lines = [f"Result({name}: {runs} runs x {rounds} rounds x {clients} clients"]
    labels = [
        f"{c}={_span(res.runs[c].to_numpy())}"
        if pd.api.types.is_numeric_dtype(res.runs[c])
        else f"{c}={sorted(set(map(str, res.runs[c])))}"
        for c in res.runs.columns
    ]
    if labels:
        lines.append("  runs: " + ", ".join(labels))
    last = h[h["round"] == rounds] if len(h) else h
    metrics = [
        f"{c}={_span(last[c].to_numpy())}"
        for c in metric_columns(h, res.runs.columns)
        if pd.api.types.is_numeric_dtype(h[c])
    ]
    if metrics:
        lines.append(f"  round {rounds}: " + ", ".join(metrics))
    lines.append(f"  privacy: {_privacy_line(res.privacy)}")
    clients = "held by the clients" if res.clients is None else _sizes(res.clients, 2)
    lines.append(f"  server: {_sizes(res.server, 1)}; clients: {clients}")
    if res.audit:
        lines.append(f"  audit: {len(res.audit)} canary reports (res.audit)")
    if res.operator is not None:
        lines.append("  operator: operator-only outputs, NOT released (res.operator)")
    return "\n".join(lines) + ")"


@dataclass(frozen=True)
class Result:
    """The one result type of every federated run.

    Attributes:
        server: final server states, leading run axis (a deployment: one run).
        clients: final client states, leading ``(runs, clients)`` axes, kept to resume or
            inspect a simulation (device arrays; host NumPy arrays where a device mesh split
            them, copied to the host block by block); ``None`` from a deployment, where they
            never leave the clients (the server never holds them).
        history: the released history: one row per (run, round) with the run's labels
            (``seed`` and e.g. ``epsilon_target``), ``round``, the algorithm's public metrics
            (server state + public test set), the bytes every exchange moved and
            ``epsilon_max`` (the largest client epsilon so far; see ``privacy``).
        metrics: the same public metrics as arrays ``(runs, rounds, ...)`` (vector metrics
            such as the reported losses live only here).
        privacy: the :class:`PrivacyRecord`.
        runs: one row per run: its labels.
        private_diagnostics: statistics of private data for debugging (empty unless the run
            asked for them: the clients' state scalars by path and the realised selections);
            never part of the history, NOT covered by any epsilon.
        audit: per run, its :class:`~swarmjax.privacy.canaries.CanaryReport` (the empirical
            epsilon lower bound beside the accounted one); empty without ``audit=``.
        algorithm: the algorithm's class name, e.g. ``"FedAvg"`` (``None`` when the runtime
            did not state it; the repr then names the server state's type).
        operator: a deployment's operator-only outputs
            (:class:`~swarmjax.fl.runtime.flower.server.Operator`: who was messaged, each
            round's wall seconds), NOT released and NOT covered by any epsilon, like
            ``clients`` and ``private_diagnostics``: a ``Result`` is what the runtime hands
            whoever ran it, and only ``server``, ``history`` and ``privacy`` are ever
            written to a release. ``None`` from the simulator and from a released copy.
    """

    server: Any
    clients: Any
    history: pd.DataFrame
    metrics: dict[str, np.ndarray]
    privacy: PrivacyRecord
    runs: pd.DataFrame
    private_diagnostics: dict[str, np.ndarray] = field(default_factory=dict)
    audit: tuple[CanaryReport, ...] = ()
    algorithm: str | None = None
    operator: Any = None

    def __repr__(self) -> str:
        """A few lines: the algorithm, runs x rounds x clients, the runs' labels, the final
        round's public metrics (one value, or the range over runs), the privacy claim and the
        states' sizes; never the arrays (``server``, ``history``, ``metrics`` hold them)."""
        return _result_repr(self)


# ------------------------------------------------------------------------- one report

SELECTED = "selected_"
"""Prefix of the history's released client counts, one column per round exchange:
``selected_<exchange name>``."""


def run_labels(variants: Variants) -> dict[str, np.ndarray]:
    """Every label of every run, ``(runs,)`` each: the variants' labels and ``seed``; runs
    are the (variant, seed) pairs, variant outermost (the order of the runs' keys)."""
    seeds = np.asarray(variants.spec.seeds)
    labels = {k: np.repeat(np.asarray(v), len(seeds)) for k, v in variants.labels.items()}
    labels["seed"] = np.tile(seeds, variants.size)
    return labels


def metric_columns(history: pd.DataFrame, labels: Sequence[str]) -> list[str]:
    """The columns of ``history`` that are the algorithm's public metrics (not a label,
    ``round``, a released count, bytes or ``epsilon_max``)."""
    return [
        c
        for c in history.columns
        if c not in _NOT_METRICS and c not in labels and not str(c).startswith(SELECTED)
    ]


def _whole(*arrays: np.ndarray) -> list[np.ndarray]:
    """``arrays`` as ``int64`` when every value of every one is whole, else unchanged."""
    whole = not any(np.any(np.mod(a, 1)) for a in arrays)
    return [a.astype(np.int64) if whole else a for a in arrays]


def history(
    labels: Mapping[str, np.ndarray],
    metrics: Mapping[str, np.ndarray],
    selected: Mapping[str, np.ndarray],
    bytes_down: np.ndarray,
    bytes_up: np.ndarray,
    epsilon: np.ndarray,
) -> pd.DataFrame:
    """The released history, one row per (run, round), as every runtime releases it.

    Args:
        labels: the runs' labels, ``(runs,)`` each (:func:`run_labels`).
        metrics: the public metrics, ``(runs, rounds, ...)``; the scalar ones (``(runs,
            rounds)``) become columns, the others stay in ``Result.metrics``.
        selected: per round exchange (by name), the released number of clients ``(runs,
            rounds)``: the realised count where the selection is public, the expected one
            where it is a secret sample (a count is whole: ``int64`` then).
        bytes_down, bytes_up: ``(runs, rounds)`` bytes the round's exchanges released as
            carried (``int64`` when every value is whole).
        epsilon: the privacy record's ``(runs, rounds, clients)`` epsilon.

    Returns:
        Columns: the labels, ``round`` (from 1), the scalar metrics, ``selected_<exchange>``,
        ``bytes_up``, ``bytes_down``, their running sums ``cum_bytes_up``,
        ``cum_bytes_down`` and ``epsilon_max`` (the largest client epsilon so far).
    """
    down, up = np.asarray(bytes_down, np.float64), np.asarray(bytes_up, np.float64)
    runs, rounds = up.shape
    frame: dict[str, Any] = {name: np.repeat(np.asarray(v), rounds) for name, v in labels.items()}
    frame["round"] = np.tile(np.arange(1, rounds + 1), runs)
    for name, value in metrics.items():
        value = np.asarray(value)
        if value.ndim == 2:
            frame[name] = value.reshape(-1)
    for name, count in selected.items():
        (frame[f"{SELECTED}{name}"],) = _whole(np.asarray(count, np.float64).reshape(-1))
    up, down, cum_up, cum_down = _whole(up, down, np.cumsum(up, axis=1), np.cumsum(down, axis=1))
    frame["bytes_up"], frame["bytes_down"] = up.reshape(-1), down.reshape(-1)
    frame["cum_bytes_up"], frame["cum_bytes_down"] = cum_up.reshape(-1), cum_down.reshape(-1)
    frame["epsilon_max"] = np.asarray(epsilon).max(axis=2).reshape(-1)
    return pd.DataFrame(frame)


@dataclass(frozen=True)
class PublicRounds:
    """What a runtime's rounds released in public, the arguments of :func:`history` but the
    epsilon (which the privacy record gives).

    Attributes:
        labels: the runs' labels, ``(runs,)`` each (:func:`run_labels`).
        metrics: the public metrics, ``(runs, rounds, ...)``.
        selected: per round exchange (by name), the released number of clients ``(runs,
            rounds)``.
        bytes_down, bytes_up: ``(runs, rounds)`` bytes the rounds' exchanges carried.
    """

    labels: Mapping[str, np.ndarray]
    metrics: Mapping[str, np.ndarray]
    selected: Mapping[str, np.ndarray]
    bytes_down: np.ndarray
    bytes_up: np.ndarray


def report(
    rounds: PublicRounds,
    privacy: PrivacyRecord,
    *,
    server: Any,
    clients: Any,
    algorithm: str | None,
    private_diagnostics: Mapping[str, np.ndarray] | None = None,
    audit: tuple[CanaryReport, ...] = (),
    operator: Any = None,
) -> Result:
    """The :class:`Result` of a runtime's outputs (the simulator's :func:`finish` and the
    Flower ServerApp's ``drive``): the :func:`history` of ``rounds`` with ``privacy``'s
    epsilon, the rounds' ``metrics`` as arrays and the runs' labels; ``server`` (leading run
    axis), ``clients``, ``private_diagnostics``, ``audit``, ``algorithm`` and ``operator``
    as :class:`Result` holds them."""
    metrics = {k: np.asarray(v) for k, v in rounds.metrics.items()}
    up, down = rounds.bytes_up, rounds.bytes_down
    return Result(
        server=server,
        clients=clients,
        history=history(rounds.labels, metrics, rounds.selected, down, up, privacy.epsilon),
        metrics=metrics,
        privacy=privacy,
        runs=pd.DataFrame(dict(rounds.labels)),
        private_diagnostics=dict(private_diagnostics or {}),
        audit=audit,
        algorithm=algorithm,
        operator=operator,
    )


@dataclass(frozen=True)
class Publication:
    """What a call publishes and where it is recorded (``Publication()``, the default: nothing
    recorded; the :class:`Result` is returned either way). Checked at construction, one
    ``ValueError`` line. Not :class:`swarmjax.privacy.ledger.Release`, the ledger's entry
    for one released run: the ledger makes one of those per run of the call.

    Attributes:
        ledger: the experiment's :class:`~swarmjax.privacy.ledger.Ledger`: every run of the
            call is added to it as a release (written at ``path``), and a
            ``checkpoint_dir`` of the call is listed as not released. A ledger composes
            every run it is given, so a call whose variants share their random numbers
            (``RunSpec(common_random_numbers=True)``, more than one variant) is refused.
        path: where the caller writes the call's released outputs (for the ledger;
            ``None``: recorded as ``"(not written)"``).
        data_source: the private dataset's name for the ledger (releases on different data
            sources are composed apart; partitions of one dataset are one source).
    """

    ledger: Ledger | None = None
    path: str | os.PathLike | None = None
    data_source: str | None = None

    def __post_init__(self) -> None:
        if self.ledger is not None and not isinstance(self.ledger, Ledger):
            raise ValueError(
                "ledger must be a swarmjax.privacy.ledger.Ledger or None; got "
                f"{type(self.ledger).__name__}"
            )
        if self.path is not None and not isinstance(self.path, str | os.PathLike):
            raise ValueError(
                f"path must be a str or os.PathLike or None; got {type(self.path).__name__}"
            )
        if self.data_source is not None and not isinstance(self.data_source, str):
            raise ValueError(
                f"data_source must be a str or None; got {type(self.data_source).__name__}"
            )

    def record(self, result: Result, algorithm: str) -> None:
        """Add every run of ``result`` (by ``algorithm``) to the ledger (none: nothing)."""
        if self.ledger is not None:
            where = "(not written)" if self.path is None else str(self.path)
            self.ledger.add_result(result, algorithm=algorithm, path=where, data=self.data_source)
