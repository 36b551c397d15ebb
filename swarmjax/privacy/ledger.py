"""A privacy ledger per experiment: every DP release computed from one private dataset, and
the epsilon of publishing all of them together.

A privacy record (``Result.privacy``) states each run's epsilon for that run alone.  A paper
publishes an *experiment*: several algorithms, budgets and seeds trained on the same private
data.  :class:`Ledger` lists every such run as a :class:`Release` (its algorithm, labels,
seed, epsilon, delta, relation, accountant, where its outputs were written and its
dp-accounting events) and states, per privacy unit, the epsilon of publishing every release
together: for each client, the composition of the events of every release that touched it
(plus the samplers' summed overflow chance), maximised over clients.

Selections (picking a best configuration by a metric) are recorded with :meth:`Ledger.select`:
a score of public data is post-processing; a score of private data is charged by plain
composition of its own DP event, and is refused without one.  Two releases whose keys have
one public fingerprint drew the same noise: the second is refused when it is added (one
line naming both); releases tagged as sharing random numbers without fingerprints get no
finite joint epsilon.  Releases are composed per (unit, data source): different private
datasets are stated separately.  Each composition gives a short statement (``(epsilon,
delta)-DP, unit, accountant``, rounded up for reading) and a full one that says which
randomness is secret, the condition a supplied secret puts on the guarantee and every
release's floating-point caveat.  docs/ledger.md explains the file and how a paper's
privacy section reads it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import decimal
import json
import math
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dp_accounting
import numpy as np

from swarmjax._validation import check_choice, check_range
from swarmjax.privacy.accounting import (
    DEFAULT_ACCOUNTANT,
    check_accountant,
    event_epsilon,
    event_from_dict,
    event_to_dict,
)

__all__ = [
    "AUDIT_FIELDS",
    "FORMAT",
    "JSON_NAME",
    "MARKDOWN_NAME",
    "SCORES",
    "UNITS",
    "Composition",
    "Ledger",
    "Release",
    "Selection",
    "releases_from_result",
    "round_up_delta",
    "round_up_epsilon",
    "saved_releases",
]

FORMAT = "swarmjax.privacy_ledger/1"
JSON_NAME = "privacy_ledger.json"
MARKDOWN_NAME = "privacy_ledger.md"
UNITS: tuple[str, ...] = ("record", "client")
"""Privacy units a release can protect (``None``: a run without DP)."""
SCORES: tuple[str, ...] = ("public", "private")
"""Where a selection's metric comes from (:meth:`Ledger.select`)."""

Group = tuple[tuple[int, ...] | None, dp_accounting.DpEvent, float]
"""``(client ids or None for every client, whole-run event, summed overflow chance P)``."""

NOT_PRIVATE = (
    "trained without DP (no privacy unit, or no noise): its outputs are not private "
    "releases, no epsilon covers them, and a paper must not state them as private"
)


# ------------------------------------------------------------------------------ helpers


def _check_text(name: str, value: Any) -> str:
    """``value`` if it is a non-empty string, else a one-line ``ValueError``."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string; got {value!r}")
    return value


def _plain(value: Any) -> Any:
    """A label as a JSON-able Python value: numpy scalars unwrapped, NaN as ``None``."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


AUDIT_FIELDS: tuple[str, ...] = ("epsilon_lower", "confidence", "canaries", "method")
"""Fields every release's ``audit`` holds (:meth:`swarmjax.privacy.canaries.CanaryReport.to_dict`
has more: ``epsilon``, ``delta``, ``tpr_at_fpr``, ...)."""


def _check_audit(audit: Any) -> dict[str, Any]:
    """A release's audit as a dict of plain values, with :data:`AUDIT_FIELDS` checked."""
    if not isinstance(audit, dict) or any(k not in audit for k in AUDIT_FIELDS):
        raise ValueError(
            f"release audit must be None or a dict with {', '.join(AUDIT_FIELDS)}; got {audit!r}"
        )
    check_range("release audit epsilon_lower", audit["epsilon_lower"], 0.0, math.inf)
    check_range("release audit confidence", audit["confidence"], 0.0, 1.0, low_open=True)
    return {str(k): _plain(v) for k, v in audit.items()}


def _check_clients(clients: Any) -> tuple[int, ...] | None:
    """Client ids of a group as a sorted tuple of distinct ints ``>= 0`` (``None``: all)."""
    if clients is None:
        return None
    ids = np.asarray(list(clients))
    if ids.size == 0 or ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(
            f"group clients must be None (every client) or a non-empty list of ints; "
            f"got {clients!r}"
        )
    if ids.min() < 0 or np.unique(ids).size != ids.size:
        raise ValueError("group clients must be distinct client ids >= 0")
    return tuple(int(c) for c in np.sort(ids))


def _check_group(group: Any) -> Group:
    """One ``(clients, event, overflow)`` group, validated and normalised."""
    if not isinstance(group, tuple | list) or len(group) != 3:
        raise ValueError(f"a group must be (clients, event, overflow); got {group!r}")
    clients, event, overflow = group
    if not isinstance(event, dp_accounting.DpEvent):
        raise ValueError(f"a group's event must be a dp_accounting.DpEvent; got {event!r}")
    event_to_dict(event)  # refuses kinds the accountant cannot compose or write
    check_range("group overflow", overflow, 0.0, math.inf)
    return _check_clients(clients), event, float(overflow)


def _group_dict(group: Group) -> dict[str, Any]:
    """JSON-able ``{"clients", "event", "overflow"}`` of one group."""
    clients, event, overflow = group
    return {
        "clients": None if clients is None else list(clients),
        "event": event_to_dict(event),
        "overflow": overflow,
    }


def _finite_or_text(value: Any) -> Any:
    """``value`` with every float ``inf`` written as the string ``"inf"`` (strict JSON)."""
    if isinstance(value, dict):
        return {str(k): _finite_or_text(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_text(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        if math.isnan(value):
            raise ValueError("the ledger holds a NaN; every number it writes must be a number")
        return "inf" if value > 0 else "-inf"
    return value


def _json_text(value: Any, level: int = 0) -> str:
    """Strict JSON of ``value`` indented by two spaces, with lists of scalars (client ids)
    kept on one line so a group of 10,000 clients is one line, not 10,000."""
    pad, end = "  " * (level + 1), "  " * level
    if isinstance(value, dict) and value:
        items = [f"{pad}{json.dumps(k)}: {_json_text(v, level + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{end}}}"
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        items = [pad + _json_text(v, level + 1) for v in value]
        return "[\n" + ",\n".join(items) + f"\n{end}]"
    return json.dumps(value, allow_nan=False)


def _text_to_inf(value: Any) -> Any:
    """Inverse of :func:`_finite_or_text` for numbers (events, labels)."""
    if isinstance(value, dict):
        return {k: _text_to_inf(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_text_to_inf(v) for v in value]
    if value in ("inf", "-inf"):
        return float(value)
    return value


def _round_up(value: float, digits: int = 2) -> str:
    """``value`` rounded UP to ``digits`` decimals (a stated epsilon never understates it),
    decided in decimal arithmetic on the float's shortest repr (``3.0`` stays ``3.00``)."""
    if not math.isfinite(value):
        return "inf"
    step = decimal.Decimal(1).scaleb(-digits)
    return str(decimal.Decimal(repr(float(value))).quantize(step, decimal.ROUND_CEILING))


def _round_up_delta(value: float, digits: int = 3) -> str:
    """``value`` rounded UP to ``digits`` significant digits, for reading: ``6.96e-05`` for
    ``6.958942240779402e-05``, ``1e-05`` for ``1e-05`` (a stated delta never understates)."""
    if value == 0.0 or not math.isfinite(value):
        return repr(float(value))
    exact = decimal.Decimal(repr(float(value)))
    step = decimal.Decimal(1).scaleb(exact.adjusted() - digits + 1)
    rounded = float(exact.quantize(step, decimal.ROUND_CEILING))
    return f"{rounded:.{digits}g}"


round_up_epsilon = _round_up
round_up_delta = _round_up_delta
"""The short statement's rounding (up: a stated number never understates), for reports
and figures that quote an epsilon or a delta."""


def _refuse(path: Path, why: str) -> ValueError:
    return ValueError(
        f"ledger folder {str(path)!r} cannot be created and written ({why}); "
        "choose a writable directory"
    )


def _missing_parents(folder: Path) -> list[Path]:
    """``folder`` and its ancestors that do not exist yet, outermost first."""
    missing = []
    for path in (folder, *folder.parents):
        if path.exists():
            break
        missing.append(path)
    return missing[::-1]


def _check_writable_folder(folder: Any) -> Path:
    """``folder`` as an absolute ``Path`` once a probe file was written to it and deleted.

    Folders created for the probe are removed again if it fails, so a refused folder leaves
    nothing behind.  Raises one ``ValueError`` naming ``ledger folder`` otherwise.
    """
    if not isinstance(folder, str | os.PathLike) or not str(folder):
        raise ValueError(f"ledger folder must be a path; got {folder!r}")
    path = Path(folder).expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise _refuse(path, "it is a file")
    created = _missing_parents(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".ledger-probe-") as probe:
            probe.write(b"probe")
            probe.flush()
    except OSError as err:
        for made in reversed(created):
            with contextlib.suppress(OSError):
                made.rmdir()
        raise _refuse(path, err.strerror or type(err).__name__) from None
    return path


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and ``os.replace``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _strict_constant(name: str) -> float:
    raise ValueError(f"the ledger file holds the non-JSON constant {name}")


_FINGERPRINT_DIGITS = 32  # hex digits of a key fingerprint (128 bits)


def _check_randomness(value: Any) -> dict[str, Any] | str | None:
    """A release's ``randomness``: ``None``, a non-empty tag, or a dict of plain values
    whose ``secret`` (if any) is ``"entropy"`` or ``"supplied"`` and whose ``fingerprint``
    (if any) is 32 lower-case hex digits."""
    if value is None:
        return None
    if isinstance(value, str):
        return _check_text("release randomness", value)
    if not isinstance(value, dict):
        raise ValueError(f"release randomness must be a dict, a tag or None; got {value!r}")
    out = {str(k): _plain(v) for k, v in value.items()}
    if out.get("secret") is not None:
        check_choice("release randomness secret", out["secret"], ("entropy", "supplied"))
    fp = out.get("fingerprint")
    if fp is not None and (
        not isinstance(fp, str)
        or len(fp) != _FINGERPRINT_DIGITS
        or any(c not in "0123456789abcdef" for c in fp)
    ):
        raise ValueError(
            f"release randomness fingerprint must be {_FINGERPRINT_DIGITS} lower-case hex "
            f"digits; got {fp!r}"
        )
    if out.get("shared") is not None:
        _check_text("release randomness shared", out["shared"])
    return out


def _plain_randomness(value: dict[str, Any] | str | None) -> dict[str, Any] | str | None:
    return dict(value) if isinstance(value, dict) else value


def _record_randomness(record: Any, run: int, runs: int, tag: str) -> dict | str | None:
    """Run ``run``'s randomness from its privacy record: the record's ``randomness`` dict
    with the run's key ``fingerprint``; without fingerprints, runs of a call with common
    random numbers get the shared ``tag`` (their keys cannot be compared)."""
    described = getattr(record, "randomness", None)
    prints = tuple(getattr(record, "key_fingerprints", ()) or ())
    out: dict[str, Any] = dict(described) if described else {}
    if prints:
        out["fingerprint"] = str(prints[run])
    elif bool(getattr(record, "shares_randomness", False)) and runs > 1:
        if not out:
            return tag
        out["shared"] = tag
    return out or None


# ------------------------------------------------------------------------------ release


@dataclass(frozen=True)
class Release:
    """One run whose outputs are published: what it is, its privacy and its events.

    Attributes:
        algorithm: the algorithm's name (e.g. ``"dp_fedavg"``).
        variant: the run's labels other than ``seed`` (e.g. ``{"epsilon_target": 2.0}``).
        seed: the run's seed (``None`` when it has none).
        unit: ``"record"``, ``"client"`` or ``None`` (no DP: not a private release).
        relation: the neighbouring relation its epsilon holds under (``None`` without DP).
        delta: the delta its own epsilon is stated at.
        epsilon: its own reported epsilon: the max over clients (``inf`` without DP).
        accountant: the accountant its own epsilon came from.
        path: where its outputs were written.
        groups: ``((clients or None, event, overflow), ...)``: clients with identical
            accounting (``None``: every client), their whole-run dp-accounting event and
            their summed per-step overflow chance ``P``; empty without DP.
        randomness: what drew its random numbers, as a dict: the privacy record's
            ``randomness`` (``generator``, ``secret``: ``"entropy"`` or ``"supplied"``,
            ``common_random_numbers``, ``condition``) plus this run's key ``fingerprint``
            (32 hex digits, :func:`swarmjax.privacy.secret.fingerprint`); a ``"shared"``
            entry tags releases known to share random numbers without fingerprints.  A
            plain string is such a tag alone (older ledgers, PAASO sweeps); ``None``:
            nothing is known of it.  :meth:`Ledger.add` refuses two releases with one
            fingerprint (one of them private): they drew the same noise.
        audit: its empirical privacy audit, if it had one: the fields of a
            :class:`~swarmjax.privacy.canaries.CanaryReport` (``epsilon_lower`` with its
            ``confidence``, beside the accounted ``epsilon``; docs/audits.md). A measured
            lower bound, never composed: the composition uses the events only.
        floating_point: what its exact released float values reveal beyond epsilon (the
            privacy record's ``floating_point`` caveat); carried into the composed statement.
        snapping_tail: the summed tail probability of its snapped sampler, ``coordinate
            releases x 2^-63`` (:func:`swarmjax.privacy.snapping.snapping_cost`'s ``delta``
            times the count), charged to delta like an overflow, ``P (1 + e^eps)``
            (docs/floating_point.md, step 5); ``None``: not stated (a snapped release's
            caveat then says so in the composed statement).
        data: the name of the private dataset it was computed from (e.g. ``"mnist"``; two
            partitions of one dataset are ONE source).  Releases of one unit are composed
            per data source; ``None``: unnamed (then every release of its unit must be).
    """

    algorithm: str
    variant: dict[str, Any]
    seed: int | None
    unit: str | None
    relation: str | None
    delta: float
    epsilon: float
    accountant: str
    path: str
    groups: tuple[Group, ...] = ()
    randomness: dict[str, Any] | str | None = None
    audit: dict[str, Any] | None = None
    floating_point: str | None = None
    snapping_tail: float | None = None
    data: str | None = None

    def __post_init__(self) -> None:
        _check_text("release algorithm", self.algorithm)
        _check_text("release path", self.path)
        if self.unit is None:
            object.__setattr__(self, "epsilon", math.inf)
            object.__setattr__(self, "relation", None)
        else:
            check_choice("release unit", self.unit, UNITS)
            _check_text("release relation", self.relation)
            check_range("release delta", self.delta, 0.0, 1.0, low_open=True, high_open=True)
        check_range("release epsilon", self.epsilon, 0.0, math.inf)
        check_accountant(self.accountant)
        object.__setattr__(self, "randomness", _check_randomness(self.randomness))
        if self.floating_point is not None:
            _check_text("release floating_point", self.floating_point)
        if self.snapping_tail is not None:
            check_range("release snapping_tail", self.snapping_tail, 0.0, 1.0)
            object.__setattr__(self, "snapping_tail", float(self.snapping_tail))
        if self.data is not None:
            _check_text("release data", self.data)
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int)
        ):
            raise ValueError(f"release seed must be an int or None; got {self.seed!r}")
        if not isinstance(self.variant, dict):
            raise ValueError(f"release variant must be a dict of labels; got {self.variant!r}")
        groups = tuple(_check_group(g) for g in self.groups)
        object.__setattr__(self, "groups", groups if self.unit is not None else ())
        object.__setattr__(self, "variant", {str(k): _plain(v) for k, v in self.variant.items()})
        object.__setattr__(self, "delta", float(self.delta))
        object.__setattr__(self, "epsilon", float(self.epsilon))
        if self.audit is not None:
            object.__setattr__(self, "audit", _check_audit(self.audit))

    @property
    def fingerprint(self) -> str | None:
        """The public fingerprint of the run's key (``None`` when not known)."""
        r = self.randomness
        return r.get("fingerprint") if isinstance(r, dict) else None

    @property
    def shared_tag(self) -> str | None:
        """The tag of releases known to share random numbers (``None``: none)."""
        r = self.randomness
        return r if isinstance(r, str) else (r or {}).get("shared")

    @property
    def secret(self) -> str | None:
        """Where its noise's secret came from: ``"entropy"``, ``"supplied"`` or ``None``."""
        r = self.randomness
        return r.get("secret") if isinstance(r, dict) else None

    @property
    def private(self) -> bool:
        """True when the run is a DP release: it has a privacy unit and a finite epsilon (a
        DP algorithm run without noise, e.g. a non-private baseline, is not one)."""
        return self.unit is not None and math.isfinite(self.epsilon)

    @classmethod
    def from_result(
        cls, result: Any, run: int, *, algorithm: str, path: Any, data: str | None = None
    ) -> Release:
        """Release of run ``run`` of a ``Result`` (its ``.privacy`` record and ``.runs``).

        Args:
            result: a :class:`swarmjax.fl.runtime.result.Result` (or any object with a
                ``privacy`` record and a ``runs`` DataFrame, one row of labels per run).
            run: index of the run, in ``[0, runs)``.
            algorithm: the algorithm's name.
            path: where the run's outputs were written.
            data: the private dataset's name (``None``: unnamed).

        Returns:
            Its :class:`Release`, with the record's ``randomness`` and this run's key
            fingerprint; runs of one call with common random numbers whose record has no
            fingerprints share the tag ``"crn:<algorithm>@<path>"``. A run whose record is
            not end to end (``not_covered``: an exact private statistic reached the server, e.g.
            Fed-DP-PSO's paper reading) is listed as NOT private, its covered epsilon and
            the uncovered fields kept as labels.
        """
        record, labels = result.privacy, result.runs
        runs = int(np.asarray(record.final_epsilon).shape[0])
        if isinstance(run, bool) or not isinstance(run, int | np.integer) or not 0 <= run < runs:
            raise ValueError(f"run must be an int in [0, {runs}); got {run!r}")
        row = {str(k): _plain(v) for k, v in labels.iloc[int(run)].items()}
        seed = row.pop("seed", None)
        private = record.unit is not None
        uncovered = tuple(getattr(record, "not_covered", ()) or ())
        if private and uncovered:
            # not end to end: an exact private statistic decided what was released, so no
            # epsilon covers the outputs; keep what the record's epsilon does cover as labels
            row["epsilon_of_covered_steps"] = float(np.max(record.final_epsilon[int(run)]))
            row["not_covered"] = "; ".join(uncovered)
            private = False
        randomness = _record_randomness(record, int(run), runs, f"crn:{algorithm}@{path}")
        audits = tuple(getattr(record, "audit", ()) or ())
        tails = getattr(record, "snapping_tail", None)
        return cls(
            algorithm=algorithm,
            variant=row,
            seed=None if seed is None else int(seed),
            unit=record.unit if private else None,
            relation=record.relation if private else None,
            delta=float(record.delta),
            epsilon=float(np.max(record.final_epsilon[int(run)])) if private else math.inf,
            accountant=record.accountant,
            path=str(path),
            groups=tuple(record.run_events(int(run))) if private else (),
            randomness=randomness,
            audit=dict(audits[int(run)]) if audits else None,
            floating_point=getattr(record, "floating_point", None) if private else None,
            snapping_tail=None if tails is None or not private else float(tails[int(run)]),
            data=data,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able description (floats ``inf`` stay floats: the writer encodes them)."""
        return {
            "algorithm": self.algorithm,
            "variant": dict(self.variant),
            "seed": self.seed,
            "unit": self.unit,
            "private": self.private,
            "relation": self.relation,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "accountant": self.accountant,
            "path": self.path,
            "randomness": _plain_randomness(self.randomness),
            "data": self.data,
            "floating_point": self.floating_point,
            "snapping_tail": self.snapping_tail,
            "groups": [_group_dict(g) for g in self.groups],
            "audit": None if self.audit is None else dict(self.audit),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Release:
        """The release :meth:`to_dict` described (after strict-JSON decoding)."""
        groups = tuple(
            (g["clients"], event_from_dict(_text_to_inf(g["event"])), float(g["overflow"]))
            for g in data["groups"]
        )
        return cls(
            algorithm=data["algorithm"],
            variant=_text_to_inf(data["variant"]),
            seed=data["seed"],
            unit=data["unit"],
            relation=data["relation"],
            delta=float(data["delta"]),
            epsilon=float(data["epsilon"]),
            accountant=data["accountant"],
            path=data["path"],
            groups=groups,
            randomness=data["randomness"],  # a tag or None in ledgers written before keys
            audit=data.get("audit"),  # absent from ledgers written before audits
            # absent from ledgers written before issue 45
            floating_point=data.get("floating_point"),
            snapping_tail=data.get("snapping_tail"),
            data=data.get("data"),
        )


def releases_from_result(
    result: Any, *, algorithm: str, path: Any, data: str | None = None
) -> list[Release]:
    """A :class:`Release` for every run of ``result`` (variants x seeds), in run order;
    ``data`` names the private dataset (:attr:`Release.data`)."""
    runs = int(np.asarray(result.privacy.final_epsilon).shape[0])
    return [
        Release.from_result(result, r, algorithm=algorithm, path=path, data=data)
        for r in range(runs)
    ]


def saved_releases(
    result: Any, *, algorithm: str, path: Any, data: str | None = None, **labels: Any
) -> list[dict]:
    """:func:`releases_from_result` as JSON-able dicts (:meth:`Release.to_dict`), with
    ``labels`` beside each run's own: what a cached experiment call saves with its payload,
    so that reusing the call adds the same releases (:meth:`Ledger.add_saved`)."""
    return [
        dataclasses.replace(r, variant={**labels, **r.variant}).to_dict()
        for r in releases_from_result(result, algorithm=algorithm, path=path, data=data)
    ]


# ---------------------------------------------------------------------------- selection


@dataclass(frozen=True)
class Selection:
    """A choice among releases by a metric (:meth:`Ledger.select`).

    Attributes:
        name: what was selected (e.g. ``"best sigma"``).
        candidates: indices of the releases chosen among (all stay in the composition).
        score: ``"public"`` (post-processing of released outputs and public data: no
            charge) or ``"private"`` (a noised score of private data: ``event`` charged).
        unit: the privacy unit ``event`` is charged to (``None`` for a public score).
        event: the noised score's own dp-accounting event (``None`` for a public score).
        clients: clients the score touched (``None``: every client).
        data: the data source of the candidates ``event`` is charged to (``None``: unnamed).
    """

    name: str
    candidates: tuple[int, ...]
    score: str
    unit: str | None = None
    event: dp_accounting.DpEvent | None = None
    clients: tuple[int, ...] | None = None
    data: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able description."""
        return {
            "name": self.name,
            "candidates": list(self.candidates),
            "score": self.score,
            "unit": self.unit,
            "event": None if self.event is None else event_to_dict(self.event),
            "clients": None if self.clients is None else list(self.clients),
            "data": self.data,
        }


# -------------------------------------------------------------------------- composition


@dataclass(frozen=True)
class Composition:
    """The privacy of publishing every DP release of one unit and one data source together.

    Attributes:
        unit: ``"record"`` or ``"client"``.
        relation: the neighbouring relation of every release of the unit.
        delta: the delta ``epsilon`` is stated at; it includes the samplers' overflow and
            the snapped samplers' stated tails (``P (1 + e^epsilon)``).
        accountant: the accountant that composed the events.
        epsilon: max over clients of the composed epsilon (``inf`` with ``reason``).
        releases: indices of the releases composed.
        selections: names of the private selections charged.
        reason: why ``epsilon`` is ``inf`` (``None`` when finite).
        data: the private dataset the releases were computed from (``None``: unnamed).
        randomness: which randomness is secret: ``generator`` (what drew the noise, or
            ``None`` when no release says), ``entropy`` / ``supplied`` / ``unstated``
            (indices of the releases whose secret came from operating-system entropy, from
            the caller, or is not stated).
        floating_point: ``((caveat, release indices), ...)``: each distinct floating-point
            caveat of the releases, with the releases it applies to.
        snapping_tail: the snapped samplers' summed stated tail probability (charged, as
            part of delta); ``unstated_tails`` the snapped releases that state none.
    """

    unit: str
    relation: str
    delta: float
    accountant: str
    epsilon: float
    releases: tuple[int, ...]
    selections: tuple[str, ...]
    reason: str | None = None
    data: str | None = None
    randomness: dict[str, Any] = dataclasses.field(default_factory=dict)
    floating_point: tuple[tuple[str, tuple[int, ...]], ...] = ()
    snapping_tail: float = 0.0
    unstated_tails: tuple[int, ...] = ()

    @property
    def supplied(self) -> tuple[int, ...]:
        """Releases whose noise came from a secret the caller supplied (reproducible mode)."""
        return tuple(self.randomness.get("supplied", ()))

    def short_statement(self) -> str:
        """The guarantee in one short line: ``(epsilon, delta)-DP, unit, accountant``,
        epsilon rounded up to 2 decimals and delta up to 3 significant digits (e.g.
        ``(18.92, 1e-05)-DP, client-level zero-out, PLD accountant``); the data source
        and a supplied secret's condition are added when they apply."""
        unit = self.relation.split(":")[0].replace(", ", " ")
        where = f" on {self.data}" if self.data is not None else ""
        delta = _round_up_delta(self.delta)
        if self.reason is not None:
            line = f"no finite epsilon at delta {delta}, {unit}{where}, {self.accountant.upper()}"
            return line + " accountant (see the reason)"
        line = (
            f"({_round_up(self.epsilon)}, {delta})-DP, {unit}{where}, "
            f"{self.accountant.upper()} accountant"
        )
        if self.supplied:
            line += ", while the supplied secret is kept"
        return line

    def statement(self, experiment: str, file: str) -> str:
        """What a paper's privacy section can quote: the short statement
        (:meth:`short_statement`), then what it covers and how it was composed, which
        randomness is secret, any supplied secret's condition and every floating-point
        caveat of the releases."""
        n = len(self.releases)
        extra = f" and {len(self.selections)} private selection(s)" if self.selections else ""
        where = f" on data {self.data!r}" if self.data is not None else ""
        if self.reason is not None:
            return (
                f"{self.short_statement()}. The {n} {self.unit}-level releases{where} of "
                f"experiment {experiment!r} have no finite joint epsilon: {self.reason} "
                f"(ledger file {file})."
            )
        parts = [
            f"{self.short_statement()}: all {n} {self.unit}-level DP releases{extra}{where} "
            f"of experiment {experiment!r} together, under {self.relation}, by "
            f"{self.accountant.upper()} composition of their dp-accounting events (ledger "
            f"file {file})."
        ]
        parts.append(_randomness_sentence(self.randomness))
        if self.supplied:
            parts.append(
                f"The guarantee holds only while the supplied secret is kept: releases "
                f"{list(self.supplied)} drew their noise from a secret the caller supplied "
                "(reproducible mode), and whoever holds it can regenerate that noise."
            )
        for caveat, ids in self.floating_point:
            parts.append(f"Floating point (releases {list(ids)}): {caveat}.")
        if self.snapping_tail > 0.0:
            parts.append(
                f"The snapped samplers' tails ({self.snapping_tail:.3g} in total) are "
                "charged to delta."
            )
        if self.unstated_tails:
            parts.append(
                f"Releases {list(self.unstated_tails)} are snapped but state no sampler tail "
                "count: their tails (2^-63 per coordinate-release, times 1 + e^epsilon; "
                "docs/floating_point.md) are not in delta."
            )
        return " ".join(p.rstrip(".") + "." for p in parts if p)

    def to_dict(self, experiment: str, file: str) -> dict[str, Any]:
        """JSON-able description with the short and the full statement."""
        return {
            "unit": self.unit,
            "data": self.data,
            "relation": self.relation,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "accountant": self.accountant,
            "releases": list(self.releases),
            "selections": list(self.selections),
            "reason": self.reason,
            "randomness": {
                k: list(v) if isinstance(v, tuple) else v for k, v in self.randomness.items()
            },
            "floating_point": [
                {"caveat": caveat, "releases": list(ids)} for caveat, ids in self.floating_point
            ],
            "snapping_tail": self.snapping_tail,
            "short_statement": self.short_statement(),
            "statement": self.statement(experiment, file),
        }


def _label(release: Release) -> str:
    """A release in a few words for a refusal: algorithm, seed, data and path."""
    data = f", data {release.data}" if release.data is not None else ""
    return f"{release.algorithm}, seed {release.seed}{data}, {release.path}"


def _snapped(release: Release) -> bool:
    """Whether the release's floating-point caveat says its noise is snapped to a grid."""
    return (release.floating_point or "").lstrip().lower().startswith("snapped")


def _randomness_sentence(randomness: dict[str, Any]) -> str:
    """Which randomness is secret, in one sentence (empty when nothing is known)."""
    if not randomness:
        return ""
    keyed = []
    if randomness.get("entropy"):
        keyed.append(
            f"keyed by operating-system entropy that no one holds (releases "
            f"{list(randomness['entropy'])})"
        )
    if randomness.get("supplied"):
        keyed.append(f"keyed by a supplied secret (releases {list(randomness['supplied'])})")
    text = ""
    if keyed:
        generator = randomness.get("generator") or "an unstated generator"
        text = (
            f"Secret randomness: every noise draw and secret sample, drawn by {generator}, "
            f"{'; '.join(keyed)}; the seeds, settings and code are public and do not "
            "determine them."
        )
    if randomness.get("unstated"):
        text += (
            f" Releases {list(randomness['unstated'])} do not state where their noise came "
            "from: their guarantee assumes it was drawn from a secret no reader holds."
        )
    return text.strip()


def _client_classes(groups: Sequence[Group]) -> list[np.ndarray]:
    """Indices of the groups covering each class of clients with identical coverage.

    Clients named by some group are classed by which groups cover them (``np.unique`` over
    a ``(named clients, groups)`` boolean matrix); one more class holds the clients named
    by no group, covered by the every-client groups only.  Cost ``O(named x groups)``.
    """
    everyone = [k for k, g in enumerate(groups) if g[0] is None]
    named = [np.asarray(g[0]) for g in groups if g[0] is not None]
    classes = [np.asarray(everyone, np.int64)]
    if named:
        ids = np.unique(np.concatenate(named))
        cover = np.zeros((ids.size, len(groups)), bool)
        cover[:, everyone] = True
        for k, (clients, _, _) in enumerate(groups):
            if clients is not None:
                cover[np.searchsorted(ids, clients), k] = True
        classes += [np.flatnonzero(row) for row in np.unique(cover, axis=0)]
    return classes


def _composed_event(events: Sequence[dp_accounting.DpEvent]) -> dp_accounting.DpEvent:
    """One event for ``events`` (a no-op for none, the event itself for one)."""
    if not events:
        return dp_accounting.NoOpDpEvent()
    return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(list(events))


_COMPOSED: dict[tuple[tuple[str, ...], float, str, float], float] = {}
"""The epsilon of every composition this process made, by its (sorted) events' reprs, delta,
accountant and overflow: a pure function of them. PAASO's ``--quick`` ledger composes 68
statements of 4 distinct event multisets (one per configuration's swarms), each about
30 ms by PLD, and writing a ledger composes it twice (the file, the printed statements)."""
_COMPOSED_MAX = 4096  # entries kept before the memo starts over


def _composition_epsilon(
    parts: Sequence[Group], delta: float, accountant: str, overflow: float
) -> float:
    """:func:`~swarmjax.privacy.accounting.event_epsilon` of the composition of ``parts``'
    events (sorted by repr) at ``delta`` with ``overflow`` charged, memoised
    (:data:`_COMPOSED`)."""
    key = (tuple(repr(g[1]) for g in parts), float(delta), accountant, overflow)
    if key not in _COMPOSED:
        if len(_COMPOSED) >= _COMPOSED_MAX:
            _COMPOSED.clear()
        event = _composed_event([g[1] for g in parts])
        _COMPOSED[key] = event_epsilon(event, delta, accountant=accountant, overflow=overflow)
    return _COMPOSED[key]


def _worst_client_epsilon(
    groups: Sequence[Group], delta: float, accountant: str
) -> tuple[float, float]:
    """``(max over clients of the composed epsilon, that client's summed overflow)``.

    Compositions are memoised by their (sorted) multiset of events, delta, accountant and
    overflow (:func:`_composition_epsilon`), so clients, statements and ledger writes with
    identical accounting cost one accountant call.
    """
    worst, worst_overflow = 0.0, 0.0
    for cls in _client_classes(groups):
        parts = sorted((groups[k] for k in cls), key=lambda g: repr(g[1]))
        overflow = float(sum(g[2] for g in parts))
        eps = _composition_epsilon(parts, delta, accountant, overflow)
        if eps >= worst:
            worst, worst_overflow = eps, overflow
    return worst, worst_overflow


@dataclass
class _Index:
    """Lookups over a ledger's releases, kept as each is added, so that adding and
    composing thousands of them (PAASO ``--full``: one private release per configuration,
    about 12,000) is linear in their number: with compositions already memoised, a scan
    of every earlier release per addition and per data source still took 29 s to add
    12,000 and 26 s to compose them.

    Attributes:
        count: how many releases (the first ``count``) it covers.
        first: per unit, its first private release (every private release of a unit
            shares its relation and data naming: :meth:`Ledger.add` checks).
        sources: per ``(unit, data)`` with private releases, their indices in order
            (insertion order: the data sources in the order of their first release).
        fingerprints: per key fingerprint, the releases that state it, in order.
    """

    count: int = 0
    first: dict[str, int] = dataclasses.field(default_factory=dict)
    sources: dict[tuple[str, Any], list[int]] = dataclasses.field(default_factory=dict)
    fingerprints: dict[str, list[int]] = dataclasses.field(default_factory=dict)

    def note(self, i: int, release: Release) -> None:
        """Cover release ``i`` (the next one)."""
        if release.private:
            self.first.setdefault(release.unit, i)
            self.sources.setdefault((release.unit, release.data), []).append(i)
        if release.fingerprint is not None:
            self.fingerprints.setdefault(release.fingerprint, []).append(i)
        self.count = i + 1


# ------------------------------------------------------------------------------- ledger


class Ledger:
    """Every DP release of one experiment and the epsilon of publishing them together.

    >>> ledger = Ledger("results/exp1", "exp1")
    >>> ledger.add_result(result, algorithm="dp_fedavg", path="results/exp1/dp_fedavg")
    >>> ledger.write()  # results/exp1/privacy_ledger.json (+ privacy_ledger.md)

    Args:
        folder: where ``privacy_ledger.json`` and ``privacy_ledger.md`` are written; created
            if missing; checked writable up front (a probe file is written and deleted).
        experiment: the experiment's name.
        delta: the one delta every composed epsilon is stated at; ``None``: per unit, the
            delta the unit's releases share (a release with another delta is refused).
        accountant: ``"pld"`` (default) or ``"rdp"``: the accountant that composes.
    """

    def __init__(
        self,
        folder: Any,
        experiment: str,
        *,
        delta: float | None = None,
        accountant: str = DEFAULT_ACCOUNTANT,
    ):
        _check_text("ledger experiment", experiment)
        check_accountant(accountant)
        if delta is not None:
            check_range("ledger delta", delta, 0.0, 1.0, low_open=True, high_open=True)
        self.folder = _check_writable_folder(folder)
        self._shown = Path(folder) / JSON_NAME
        self._setup(experiment, delta, accountant)

    def _setup(self, experiment: str, delta: float | None, accountant: str) -> None:
        self.experiment = experiment
        self.delta = None if delta is None else float(delta)
        self.accountant = accountant
        self._releases: list[Release] = []
        self._selections: list[Selection] = []
        self._not_released: list[dict[str, str]] = []
        self._index = _Index()

    # ----------------------------------------------------------------------- contents

    @property
    def releases(self) -> tuple[Release, ...]:
        """Every release, in the order added (its index is its id)."""
        return tuple(self._releases)

    @property
    def selections(self) -> tuple[Selection, ...]:
        """Every recorded selection."""
        return tuple(self._selections)

    @property
    def not_released(self) -> tuple[dict[str, str], ...]:
        """Folders of private intermediate state that are not published (``folder``, ``why``)."""
        return tuple(dict(n) for n in self._not_released)

    @property
    def non_private(self) -> tuple[int, ...]:
        """Indices of the releases without DP (not private releases)."""
        return tuple(i for i, r in enumerate(self._releases) if not r.private)

    def _indexed(self) -> _Index:
        """The lookups of every release so far (rebuilt after ``add_result`` undid some)."""
        if self._index.count != len(self._releases):
            self._index = _Index()
            for i, r in enumerate(self._releases):
                self._index.note(i, r)
        return self._index

    def _check_fits(self, release: Release) -> None:
        """Refuse a release whose relation, data naming or delta disagrees with its unit's
        releases (the delta: with those of its data source). Every private release was
        checked against the earlier ones when added, so a unit's releases share one
        relation and one naming, and a data source's one delta: the first of each stands
        for all."""
        index = self._indexed()
        if release.unit not in index.first:
            return
        i = index.first[release.unit]
        other = self._releases[i]
        if other.relation != release.relation:
            raise ValueError(
                f"release relation {release.relation!r} differs from release {i}'s "
                f"{other.relation!r}; every {release.unit}-level release must share one "
                "(a ledger written under another relation, e.g. before swarmjax's "
                "client-level relation became zero-out, takes no new releases: write "
                "the new runs to a new ledger, or recompute the old ones with this "
                "version)"
            )
        if (other.data is None) != (release.data is None):
            raise ValueError(
                f"release data {release.data!r} beside release {i}'s {other.data!r}: name "
                f"the private dataset of every {release.unit}-level release or of none "
                "(an unnamed release could be on any of them)"
            )
        same = index.sources.get((release.unit, release.data))
        if self.delta is None and same and self._releases[same[0]].delta != release.delta:
            raise ValueError(
                f"ledger delta is None but release delta {release.delta} differs from "
                f"release {same[0]}'s {self._releases[same[0]].delta}; pass "
                "Ledger(..., delta=...) to state their composition at one delta"
            )

    def _check_fresh_noise(self, release: Release) -> None:
        """Refuse ``release`` when an already-listed release drew from the same key (equal
        fingerprints) and either of the two is private: publishing both lets a reader
        subtract the shared noise."""
        fp = release.fingerprint
        if fp is None:
            return
        for i in self._indexed().fingerprints.get(fp, ()):
            other = self._releases[i]
            if release.private or other.private:
                new = len(self._releases)
                raise ValueError(
                    f"releases {i} ({_label(other)}) and {new} ({_label(release)}) drew the "
                    f"same noise (key fingerprint {fp}): publishing both lets anyone subtract "
                    "it, and no epsilon covers them together; draw each release from its own "
                    "secret (no common random numbers, no reused keys across data, audits or "
                    "settings), or publish only one of them"
                )

    def add(self, release: Release) -> int:
        """Add ``release``; returns its index (its id in selections and the file).

        Refused (one ``ValueError`` line) when its relation, data naming or delta does not
        fit its unit's releases, or when its key fingerprint equals an already-listed
        release's and either is private (they drew the same noise)."""
        if not isinstance(release, Release):
            raise ValueError(f"release must be a Release; got {type(release).__name__}")
        index = self._indexed()
        if release.private:
            self._check_fits(release)
        self._check_fresh_noise(release)
        self._releases.append(release)
        index.note(len(self._releases) - 1, release)
        return len(self._releases) - 1

    def add_saved(self, releases: Iterable[dict[str, Any]]) -> list[int]:
        """Add releases saved by :func:`saved_releases` (e.g. a reused call's payload)."""
        return [self.add(Release.from_dict(r)) for r in releases]

    def add_result(
        self, result: Any, *, algorithm: str, path: Any, data: str | None = None
    ) -> list[int]:
        """Add every run of ``result`` (:func:`releases_from_result`; ``data``: the private
        dataset's name) and return their indices: all of them, or none (``ValueError``)."""
        new = releases_from_result(result, algorithm=algorithm, path=path, data=data)
        saved = list(self._releases)
        try:
            return [self.add(r) for r in new]
        except ValueError:
            self._releases = saved  # all runs of the call or none
            raise

    def mark_not_released(self, folder: Any, why: str) -> None:
        """List ``folder`` (e.g. checkpoints: private intermediate state) as not released."""
        if not isinstance(folder, str | os.PathLike) or not str(folder):
            raise ValueError(f"not-released folder must be a path; got {folder!r}")
        self._not_released.append({"folder": str(folder), "why": _check_text("why", why)})

    def _check_candidates(self, candidates: Iterable[int]) -> tuple[int, ...]:
        idx = tuple(candidates)
        n = len(self._releases)
        if not idx or any(
            isinstance(i, bool) or not isinstance(i, int | np.integer) or not 0 <= i < n
            for i in idx
        ):
            raise ValueError(
                f"selection candidates must be a non-empty list of release indices in "
                f"[0, {n}); got {idx!r}"
            )
        if len(set(idx)) != len(idx):
            raise ValueError(f"selection candidates must be distinct; got {idx!r}")
        return tuple(int(i) for i in idx)

    def _selection_unit(self, candidates: tuple[int, ...]) -> tuple[str, str | None]:
        """``(unit, data)`` of a private selection's candidates (one of each, or refused)."""
        units = {self._releases[i].unit for i in candidates}
        if (
            None in units
            or len(units) != 1
            or any(not self._releases[i].private for i in candidates)
        ):
            raise ValueError(
                "a private selection's candidates must be DP releases of one unit; got units "
                f"{sorted(map(str, units))}"
            )
        sources = {self._releases[i].data for i in candidates}
        if len(sources) != 1:
            raise ValueError(
                "a private selection's candidates must be releases on one data source; got "
                f"{sorted(map(str, sources))}"
            )
        return units.pop(), sources.pop()

    def select(
        self,
        name: str,
        candidates: Iterable[int],
        *,
        score: str,
        event: dp_accounting.DpEvent | None = None,
        clients: Iterable[int] | None = None,
    ) -> Selection:
        """Record a choice among ``candidates`` by a metric; charge it if the metric is private.

        Every candidate stays in the composition whichever is published: publishing only the
        winner is post-processing of publishing all of them (plain composition;
        docs/ledger.md says why not dp-accounting's repeat-and-select events).

        Args:
            name: what was selected; unique in the ledger.
            candidates: indices of the releases chosen among.
            score: ``"public"`` (computed from released outputs and public data, e.g. test
                accuracy on a public test set: post-processing, no charge) or
                ``"private"`` (computed from private data: needs ``event``).
            event: the noised score's own dp-accounting event (``score="private"`` only),
                charged by composition to the candidates' unit.
            clients: clients whose data the score read (``None``: every client).

        Returns:
            The recorded :class:`Selection`.
        """
        _check_text("selection name", name)
        if any(s.name == name for s in self._selections):
            raise ValueError(f"selection name {name!r} is already in the ledger")
        check_choice("selection score", score, SCORES)
        idx = self._check_candidates(candidates)
        if score == "public":
            if event is not None or clients is not None:
                raise ValueError("selection event and clients apply to score='private' only")
            chosen = Selection(name, idx, score)
        else:
            if not isinstance(event, dp_accounting.DpEvent):
                raise ValueError(
                    "selection score='private' needs event=<the noised score's DpEvent>: a "
                    "selection by an unnoised score of private data has no DP guarantee "
                    "(noise the score, or select on public data with score='public')"
                )
            unit, data = self._selection_unit(idx)
            chosen = Selection(name, idx, score, unit, event, _check_clients(clients), data)
        self._selections.append(chosen)
        return chosen

    # -------------------------------------------------------------------- composition

    def _unit_delta(self, releases: Sequence[int]) -> float:
        """The ledger's delta, else the one delta the releases share (:meth:`add` checks)."""
        return self.delta if self.delta is not None else self._releases[releases[0]].delta

    def _shared_randomness(self, releases: Sequence[int]) -> str | None:
        """Why ``releases`` have no finite joint epsilon (tagged as sharing random numbers,
        without fingerprints to tell which draws), or ``None``."""
        tags: dict[str, list[int]] = {}
        for i in releases:
            tag = self._releases[i].shared_tag
            if tag is not None:
                tags.setdefault(tag, []).append(i)
        shared = {t: ids for t, ids in tags.items() if len(ids) > 1}
        if not shared:
            return None
        which = "; ".join(f"releases {ids} share {t!r}" for t, ids in shared.items())
        return (
            f"{which}: runs with common random numbers share their noise, and composing their "
            "events assumes independent noise, so no accountant bounds their joint release "
            "(publish one run per tag, or rerun without common random numbers)"
        )

    def _inf_reason(self, groups: Sequence[Group], delta: float, overflow: float) -> str:
        """Why a composition without shared randomness came out ``inf``."""
        events = _composed_event([g[1] for g in groups])
        if math.isinf(event_epsilon(events, delta, accountant=self.accountant)):
            return "an event has a non-private part (e.g. noise multiplier 0)"
        return (
            f"the samplers' summed overflow (and stated snapping tail) chance P = "
            f"{overflow:.3g} leaves no delta"
        )

    def _randomness(self, releases: Sequence[int]) -> dict[str, Any]:
        """Which randomness of ``releases`` is secret: the generator(s) and the releases by
        the source of their secret (``entropy``, ``supplied``, ``unstated``)."""
        generators = dict.fromkeys(
            g
            for i in releases
            if isinstance(self._releases[i].randomness, dict)
            and (g := self._releases[i].randomness.get("generator"))
        )
        out: dict[str, Any] = {"generator": "; ".join(generators) or None}
        for source in ("entropy", "supplied"):
            out[source] = tuple(i for i in releases if self._releases[i].secret == source)
        out["unstated"] = tuple(i for i in releases if self._releases[i].secret is None)
        return out

    def _caveats(self, releases: Sequence[int]) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """Each distinct floating-point caveat of ``releases`` with the releases it covers."""
        caveats: dict[str, list[int]] = {}
        for i in releases:
            caveat = self._releases[i].floating_point
            if caveat is not None:
                caveats.setdefault(caveat, []).append(i)
        return tuple((c, tuple(ids)) for c, ids in caveats.items())

    def _compose(self, unit: str, data: str | None, releases: Sequence[int]) -> Composition:
        """The composition of ``releases``, the DP releases of ``unit`` on ``data``."""
        charged = [s for s in self._selections if s.unit == unit and s.data == data]
        delta = self._unit_delta(releases)
        snapped = [i for i in releases if _snapped(self._releases[i])]
        common = dict(
            unit=unit,
            relation=self._releases[releases[0]].relation,
            delta=delta,
            accountant=self.accountant,
            releases=tuple(releases),
            selections=tuple(s.name for s in charged),
            data=data,
            randomness=self._randomness(releases),
            floating_point=self._caveats(releases),
            snapping_tail=float(sum(self._releases[i].snapping_tail or 0.0 for i in releases)),
            unstated_tails=tuple(i for i in snapped if self._releases[i].snapping_tail is None),
        )
        reason = self._shared_randomness(releases)
        if reason is not None:
            return Composition(epsilon=math.inf, reason=reason, **common)
        groups: list[Group] = []
        for i in releases:
            # a snapped sampler's stated tail is a total-variation term like an overflow: it
            # is charged to every client the release covers (each is in one of its groups)
            tail = self._releases[i].snapping_tail or 0.0
            groups += [(c, e, p + tail) for c, e, p in self._releases[i].groups]
        groups += [(s.clients, s.event, 0.0) for s in charged]
        eps, overflow = _worst_client_epsilon(groups, delta, self.accountant)
        if math.isinf(eps):
            reason = self._inf_reason(groups, delta, overflow)
        return Composition(epsilon=eps, reason=reason, **common)

    def composed(self) -> dict[str, Composition]:
        """Per privacy unit and data source with DP releases: the epsilon of publishing all
        of them together.

        For each client, the events of every group covering it (across the releases of the
        unit and data source, and the private selections charged to them) are composed with
        the summed overflow ``P`` at the ledger's delta by its accountant; the max over
        clients is reported.  Record- and client-level releases are composed separately
        (different neighbouring relations), and so are releases on different private
        datasets (:attr:`Release.data`: a unit of one dataset is not a unit of another).
        Runs without DP are not composed (see :attr:`non_private`).

        Returns:
            ``{key: Composition}``: the key is the unit (``"record"``, ``"client"``) when
            its releases are on one data source, else ``"<unit>:<data>"`` per source.
        """
        index = self._indexed()
        sources = [(u, d) for u in UNITS for (v, d) in index.sources if v == u]
        per_unit = collections.Counter(u for u, _ in sources)
        out = {}
        for unit, data in sources:
            key = f"{unit}:{data}" if per_unit[unit] > 1 else unit
            out[key] = self._compose(unit, data, index.sources[(unit, data)])
        return out

    # ------------------------------------------------------------------------ writing

    @property
    def path(self) -> Path:
        """Where :meth:`write` puts ``privacy_ledger.json``."""
        return self.folder / JSON_NAME

    def to_dict(self) -> dict[str, Any]:
        """Everything the ledger file holds (floats ``inf`` still floats)."""
        file = str(self._shown)
        return {
            "format": FORMAT,
            "experiment": self.experiment,
            "written": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "accountant": self.accountant,
            "delta": self.delta,
            "releases": [r.to_dict() for r in self._releases],
            "non_private_releases": {"releases": list(self.non_private), "note": NOT_PRIVATE},
            "selections": [s.to_dict() for s in self._selections],
            "not_released": [dict(n) for n in self._not_released],
            "composed": {u: c.to_dict(self.experiment, file) for u, c in self.composed().items()},
        }

    def write(self) -> Path:
        """Write ``privacy_ledger.json`` (strict JSON, ``inf`` as ``"inf"``) and
        ``privacy_ledger.md`` atomically into the folder; returns the JSON's path."""
        data = self.to_dict()
        text = _json_text(_finite_or_text(data)) + "\n"
        _write_atomic(self.path, text)
        _write_atomic(self.folder / MARKDOWN_NAME, _markdown(data))
        return self.path

    @classmethod
    def load(cls, path: Any) -> Ledger:
        """The ledger a :meth:`write` left at ``path`` (its JSON file, or the folder).

        The composition is not read back: :meth:`composed` recomputes it from the stored
        events, so a reader can check the file's statement from the file alone.
        """
        file = Path(path)
        file = file / JSON_NAME if file.is_dir() else file
        try:
            data = json.loads(file.read_text(encoding="utf-8"), parse_constant=_strict_constant)
        except OSError as err:
            raise ValueError(f"ledger path {str(file)!r} cannot be read ({err.strerror})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"ledger path {str(file)!r} is not a {FORMAT} file")
        ledger = cls.__new__(cls)
        ledger.folder = file.parent.absolute()
        ledger._shown = file
        experiment = _check_text("ledger experiment", data["experiment"])
        ledger._setup(experiment, data["delta"], check_accountant(data["accountant"]))
        for r in data["releases"]:
            ledger.add(Release.from_dict(r))
        for s in data["selections"]:
            event = None if s["event"] is None else event_from_dict(_text_to_inf(s["event"]))
            ledger.select(
                s["name"], s["candidates"], score=s["score"], event=event, clients=s["clients"]
            )
        for n in data["not_released"]:
            ledger.mark_not_released(n["folder"], n["why"])
        return ledger

    def __repr__(self) -> str:
        return (
            f"Ledger({str(self.folder)!r}, {self.experiment!r}, releases={len(self._releases)}, "
            f"accountant={self.accountant!r})"
        )


# ----------------------------------------------------------------------------- markdown


def _cell(value: Any) -> str:
    """A markdown table cell: ``-`` for None, ``inf`` for infinity, pipes escaped."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.6g}"
    if isinstance(value, dict):
        value = ", ".join(f"{k}={_cell(v)}" for k, v in value.items()) or "-"
    return str(value).replace("|", "\\|")


def _randomness_cells(randomness: Any) -> dict[str, Any]:
    """The ``secret`` (source), ``key`` (fingerprint, first 12 hex digits) and ``shared``
    (tag) cells of a release's randomness."""
    if isinstance(randomness, str):
        return {"secret": None, "key": None, "shared": randomness}
    r = randomness or {}
    fp = r.get("fingerprint")
    return {"secret": r.get("secret"), "key": fp[:12] if fp else None, "shared": r.get("shared")}


def _release_table(releases: Sequence[dict[str, Any]]) -> list[str]:
    cols = "algorithm variant seed unit data epsilon delta accountant secret key shared path"
    cols = cols.split()
    lines = ["| # | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for i, r in enumerate(releases):
        row = {**r, **_randomness_cells(r.get("randomness"))}
        lines.append(f"| {i} | " + " | ".join(_cell(row.get(c)) for c in cols) + " |")
    return lines


def _audit_power(audit: dict[str, Any]) -> str:
    """``; verdict V (power P at audit delta D, noise errors of Fx detectable)`` from a
    report's power fields, empty for reports written before they existed."""
    verdict = audit.get("verdict")
    if verdict is None:
        return ""
    parts = []
    if audit.get("power_epsilon") is not None:
        at = audit.get("audit_delta")
        parts.append(
            f"power {_cell(audit['power_epsilon'])}"
            + (f" at audit delta {_cell(at)}" if at is not None else "")
        )
    factor = audit.get("detectable_noise_factor")
    if factor is not None:
        parts.append(f"noise errors of {_cell(factor)}x or more detectable")
    return f"; verdict **{verdict}**" + (f" ({', '.join(parts)})" if parts else "")


def _markdown(data: dict[str, Any]) -> str:
    """The human-readable ``privacy_ledger.md`` of a ledger's :meth:`Ledger.to_dict`."""
    lines = [
        f"# Privacy ledger: {data['experiment']}",
        "",
        f"Written {data['written']}; composed by the {data['accountant'].upper()} accountant.",
        "",
        "## Composed statement",
        "",
    ]
    composed = data["composed"]
    for c in composed.values():
        where = f" on {c['data']}" if c.get("data") is not None else ""
        lines.append(
            f"* **{c['unit']}-level{where}**: {c['short_statement']} "
            f"(epsilon = {_cell(c['epsilon'])}, delta = {_cell(c['delta'])})"
        )
        lines.append(f"  * {c['statement']}")
    if not composed:
        lines.append("No DP releases.")
    non_private = data["non_private_releases"]["releases"]
    if non_private:
        lines += ["", f"Releases {non_private}: {NOT_PRIVATE}."]
    lines += ["", "## Releases", "", *_release_table(data["releases"])]
    audited = [(i, r["audit"]) for i, r in enumerate(data["releases"]) if r.get("audit")]
    if audited:
        lines += ["", "## Empirical audits (lower bounds, not guarantees)", ""]
        lines += [
            f"* release {i}: empirical epsilon >= {_cell(a['epsilon_lower'])} at "
            f"{_cell(a['confidence'])} confidence ({a['canaries']} canaries; {a['method']}) "
            f"vs accounted {_cell(data['releases'][i]['epsilon'])}{_audit_power(a)}"
            for i, a in audited
        ]
    if data["selections"]:
        lines += ["", "## Selections", ""]
        for s in data["selections"]:
            charge = "charged by composition" if s["score"] == "private" else "no charge"
            lines.append(f"* {s['name']}: among {s['candidates']}, {s['score']} score ({charge})")
    if data["not_released"]:
        lines += ["", "## Not released", ""]
        lines += [f"* `{n['folder']}`: {n['why']}" for n in data["not_released"]]
    return "\n".join(lines) + "\n"
