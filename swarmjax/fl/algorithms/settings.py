"""Each registered algorithm's own settings: one frozen dataclass per algorithm, checked
when it is made (one ``ValueError`` line naming the setting and what it allows, before any
work), and how a run configuration of string keys fills one (:meth:`Settings.from_config`).

The registry (:mod:`swarmjax.fl.algorithms.registry`) pairs each name with its settings
class and a build function ``(Base, settings) -> (algorithm, grid values)``; the Flower
tasks fill the settings from the run configuration, the cross-device comparisons from their
:class:`~swarmjax.fl.algorithms.registry.CrossDeviceRun`.

A setting's run-configuration key is its field name with ``-`` for ``_`` (``client_rate``:
``client-rate``); ``""`` makes an optional setting ``None``; a refusal of a run
configuration names its keys.

>>> DpFedAvgSettings(client_rate=0.5).noise_multiplier
1.0
>>> DpFedAvgSettings.from_config({"noise-multiplier": ""})  # doctest: +ELLIPSIS
Traceback (most recent call last):
ValueError: set one of epsilon and noise-multiplier (...); got neither
"""

from __future__ import annotations

import abc
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Self

from swarmjax._validation import (
    check_choice,
    check_int,
    check_nonnegative,
    check_positive,
    check_probability,
    check_range,
)
from swarmjax.fl.algorithms.combined import VARIANTS
from swarmjax.fl.algorithms.fed_dp_pso import DEFAULT_READING, READINGS, Reading
from swarmjax.privacy.ftrl import FACTORIZATIONS, SCHEDULES
from swarmjax.privacy.participation import MinSeparation

__all__ = [
    "CLIPPINGS",
    "SERVER_OPTIMIZERS",
    "CombinedSettings",
    "DistributedDpSettings",
    "DpFedAvgSettings",
    "DpFtrlSettings",
    "FedAvgSettings",
    "FedDpPsoSettings",
    "FedProxSettings",
    "LocalOnlySettings",
    "ScheduleSettings",
    "Settings",
    "UserDpSettings",
    "as_bool",
    "config_key",
    "reading_from_config",
]

CLIPPINGS = ("fixed", "adaptive")
SERVER_OPTIMIZERS = (None, "sgd", "adam", "yogi")


def config_key(name: str) -> str:
    """The run-configuration key of setting ``name`` (``client_rate``: ``client-rate``)."""
    return name.replace("_", "-")


@dataclass(frozen=True)
class Settings(abc.ABC):
    """Base of every algorithm's settings: each field is one setting, checked on creation."""

    def __post_init__(self) -> None:
        self.check()

    @abc.abstractmethod
    def check(self) -> None:
        """Refuse a bad value: one ``ValueError`` line naming the setting and what it
        allows."""

    def inputs(self) -> Reading | None:
        """The Fed-DP-PSO reading whose input scaling the clients' data take; ``None``:
        pixels in ``[0, 1]`` (every algorithm but Fed-DP-PSO)."""
        return None

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
    ) -> Self:
        """The settings a run configuration gives: each field whose key
        (:func:`config_key`) is in ``config``, converted to the field's type; the others
        from ``defaults`` (the registry entry's) or the field's default. Keys that are no
        setting of this class are left alone (they configure the run or another
        algorithm)."""
        return _made(cls, {**(defaults or {}), **_config_values(cls, config)})


def _made(cls: type[Settings], values: Mapping[str, Any]) -> Settings:
    """``cls(**values)`` for a run configuration: a refusal names the settings by their
    keys (``client-rate must be in ...``, not ``client_rate``)."""
    try:
        return cls(**values)
    except ValueError as err:
        message = str(err)
        for f in fields(cls):
            message = re.sub(rf"\b{f.name}\b", config_key(f.name), message)
        raise ValueError(message) from None


def _config_values(
    cls: type[Settings], config: Mapping[str, Any], skip: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The fields of ``cls`` (except ``skip``) that ``config`` sets, converted."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in fields(cls):
        key = config_key(f.name)
        if f.name not in skip and key in config:
            values[f.name] = _convert(key, config[key], hints[f.name])
    return values


_KINDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _convert(key: str, raw: Any, kind: Any) -> Any:
    """``raw`` (a run configuration's value) as ``kind`` (``T`` or ``T | None``); ``""`` is
    ``None`` where the setting takes it."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) is tuple:  # numbers apart by commas or spaces; "": none
        items = raw if isinstance(raw, list | tuple) else re.split(r"[,\s]+", str(raw).strip())
        return tuple(_convert(key, item, args[0]) for item in items if item != "")
    base = next(a for a in args if a is not type(None)) if args else kind
    if raw == "":
        if type(None) in args:
            return None
        raise ValueError(f"{key} must be {_KINDS[base]}; got '' (only optional settings take '')")
    if base is bool:
        return as_bool(key, raw)
    try:
        if base is int and isinstance(raw, float) and not raw.is_integer():
            raise ValueError
        return base(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be {_KINDS[base]}; got {raw!r}") from None


def as_bool(key: str, raw: Any) -> bool:
    """``raw`` as a boolean (``true``/``yes``/``1`` or ``false``/``no``/``0``)."""
    if isinstance(raw, bool):
        return raw
    if str(raw).lower() in ("true", "yes", "1"):
        return True
    if str(raw).lower() in ("false", "no", "0"):
        return False
    raise ValueError(f"{key} must be true or false; got {raw!r}")


def _check_optional_int(name: str, value: int | None, minimum: int) -> None:
    if value is not None:
        check_int(name, value, minimum)


# ------------------------------------------------------------------------ plain algorithms


@dataclass(frozen=True)
class FedAvgSettings(Settings):
    """FedAvg's (and FedAdam's and FedYogi's) settings.

    Attributes:
        learning_rate: local learning rate.
        server_lr: the server optimiser's learning rate (unused without one).
        server_optimizer: ``None`` (the new model is the clients' mean), ``"sgd"``,
            ``"adam"`` or ``"yogi"``.
        cohort: clients per round (``None``: every client).
        record_epsilon: record-level DP of the clients' local training (DP-SGD, or DP-Adam
            with ``optimizer="adam"``) calibrated to this target, its Poisson buffer sized
            for the run from ``Base.sizes``; ``None`` or ``inf``: exact local training.
    """

    learning_rate: float = 0.1
    server_lr: float = 1.0
    server_optimizer: str | None = None
    cohort: int | None = None
    record_epsilon: float | None = None

    def check(self) -> None:
        check_positive("learning_rate", self.learning_rate, finite=True)
        check_positive("server_lr", self.server_lr, finite=True)
        check_choice("server_optimizer", self.server_optimizer, SERVER_OPTIMIZERS)
        _check_optional_int("cohort", self.cohort, 1)
        if self.record_epsilon is not None:
            check_positive("record_epsilon", self.record_epsilon)


@dataclass(frozen=True)
class FedProxSettings(Settings):
    """FedProx's settings: ``learning_rate`` (local), ``mu`` (the proximal weight) and
    ``cohort`` (clients per round; ``None``: every client)."""

    learning_rate: float = 0.1
    mu: float = 0.01
    cohort: int | None = None

    def check(self) -> None:
        check_positive("learning_rate", self.learning_rate, finite=True)
        check_nonnegative("mu", self.mu)
        _check_optional_int("cohort", self.cohort, 1)


@dataclass(frozen=True)
class CombinedSettings(Settings):
    """Combined learning's settings (FedAvg whose server combines the uploaded models with
    :class:`~swarmjax.fl.algorithms.combined.CombinedAggregator`): ``learning_rate``
    (local), ``conv`` (the combination's convergence threshold) and ``variant``
    (``code`` or ``listing``: docs/combined_learning.md)."""

    learning_rate: float = 0.1
    conv: float = 0.01
    variant: str = "code"

    def check(self) -> None:
        check_positive("learning_rate", self.learning_rate, finite=True)
        check_positive("conv", self.conv, finite=True)
        check_choice("variant", self.variant, VARIANTS)


@dataclass(frozen=True)
class LocalOnlySettings(Settings):
    """Clients training alone (no server step; given one client holding every row, the
    centralised reference): ``learning_rate`` and ``keep_optimizer_state`` (carry the
    optimiser state across rounds, as one centralised run does)."""

    learning_rate: float = 0.1
    keep_optimizer_state: bool = False

    def check(self) -> None:
        check_positive("learning_rate", self.learning_rate, finite=True)
        if not isinstance(self.keep_optimizer_state, bool):
            raise ValueError(
                f"keep_optimizer_state must be true or false; got {self.keep_optimizer_state!r}"
            )


# ---------------------------------------------------------------------- user-level DP ones


@dataclass(frozen=True)
class UserDpSettings(Settings):
    """What every user-level DP algorithm sets.

    Attributes:
        clip: the (initial) user-level clip norm.
        learning_rate: local learning rate.
        server_lr: the server SGD's learning rate.
        epsilon: the user-level target epsilon the noise is calibrated to (at the run's
            delta).
        noise_multiplier: the noise multiplier, when not calibrated (``0``: no noise, a
            non-private baseline whose epsilon is infinite); exactly one of ``epsilon``
            and ``noise_multiplier`` is set.
    """

    clip: float = 0.1
    learning_rate: float = 0.1
    server_lr: float = 1.0
    epsilon: float | None = None
    noise_multiplier: float | None = 1.0

    def check(self) -> None:
        check_positive("clip", self.clip, finite=True)
        check_positive("learning_rate", self.learning_rate, finite=True)
        check_positive("server_lr", self.server_lr, finite=True)
        given = [n for n in ("epsilon", "noise_multiplier") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(
                "set one of epsilon and noise_multiplier (the noise is calibrated to "
                f"the first or given by the second); got {' and '.join(given) or 'neither'}"
            )
        if self.epsilon is not None:
            check_positive("epsilon", self.epsilon)
        else:
            check_nonnegative("noise_multiplier", self.noise_multiplier)

    def grid(self) -> dict[str, Any]:
        """The values every user-level DP build gives ``Variants.grid``: the clip, the
        learning rates and the noise (an axis of one: the run's label)."""
        noise = (
            {"epsilon_target": [self.epsilon]}
            if self.epsilon is not None
            else {"noise_multiplier": [self.noise_multiplier]}
        )
        return {
            "initial_clip": self.clip,
            "learning_rate": self.learning_rate,
            "server_lr": self.server_lr,
            **noise,
        }


@dataclass(frozen=True)
class DpFedAvgSettings(UserDpSettings):
    """User-level DP-FedAvg's settings (and :class:`UserDpSettings`').

    Attributes:
        client_rate: the Poisson rate of clients.
        clipping: ``"fixed"`` or ``"adaptive"``.
        server_momentum: momentum of the server SGD, in ``[0, 1)`` (0: a plain step).
        buffer_epsilon: the target epsilon the Poisson buffer is sized for (``None``:
            ``epsilon``; without either, no buffer). A sweep over targets gives its
            largest here, so that one algorithm, compiled once, serves every target.
    """

    client_rate: float = 0.7
    clipping: str = "adaptive"
    server_momentum: float = 0.0
    buffer_epsilon: float | None = None

    def check(self) -> None:
        super().check()
        check_probability("client_rate", self.client_rate, low_open=True)
        check_choice("clipping", self.clipping, CLIPPINGS)
        check_range("server_momentum", self.server_momentum, 0.0, 1.0, high_open=True)
        if self.buffer_epsilon is not None:
            check_positive("buffer_epsilon", self.buffer_epsilon)

    def sized_for(self) -> float | None:
        """The target epsilon the Poisson buffer is sized for (``None``: no buffer)."""
        return self.epsilon if self.buffer_epsilon is None else self.buffer_epsilon


@dataclass(frozen=True)
class ScheduleSettings(UserDpSettings):
    """User-level DP on public min-separation cohorts
    (:class:`~swarmjax.privacy.participation.MinSeparation`): ``cohort`` (clients per
    round), ``schedule`` (``cyclic``, ``random`` or ``single``), ``min_separation`` and
    ``max_participations`` (``None``: the most the cohort allows, as many as fit)."""

    cohort: int = 1
    schedule: str = "cyclic"
    min_separation: int | None = None
    max_participations: int | None = None

    def check(self) -> None:
        super().check()
        check_int("cohort", self.cohort, 1)
        check_choice("schedule", self.schedule, SCHEDULES)
        _check_optional_int("min_separation", self.min_separation, 1)
        _check_optional_int("max_participations", self.max_participations, 1)

    def participation(self, num_clients: int, rounds: int) -> MinSeparation:
        """The schedule for ``num_clients`` over ``rounds``, ``b`` and ``k`` explicit
        (refused in one line when it cannot hold)."""
        return MinSeparation(
            self.cohort,
            min_separation=self.min_separation,
            max_participations=self.max_participations,
            schedule=self.schedule,
        ).for_run(num_clients, rounds)


@dataclass(frozen=True)
class DpFtrlSettings(ScheduleSettings):
    """User-level DP-FTRL's settings (and :class:`ScheduleSettings`'): ``factorization``
    (``blt``, ``banded`` or ``prefix-sum``), ``buffers`` (BLT; ``None``: jax-privacy's
    choice), ``bands`` (banded; ``None``: ``min(b, 32)``), ``noise_cohort`` (the cohort
    the noise is sized for; ``None``: this run's) and ``clipping``."""

    factorization: str = "blt"
    buffers: int | None = None
    bands: int | None = None
    noise_cohort: int | None = None
    clipping: str = "adaptive"

    def check(self) -> None:
        super().check()
        check_choice("factorization", self.factorization, FACTORIZATIONS)
        _check_optional_int("buffers", self.buffers, 0)
        _check_optional_int("bands", self.bands, 1)
        _check_optional_int("noise_cohort", self.noise_cohort, 1)
        check_choice("clipping", self.clipping, CLIPPINGS)


@dataclass(frozen=True)
class DistributedDpSettings(ScheduleSettings):
    """Distributed DP-FedAvg's settings (and :class:`ScheduleSettings`'; the noise is always
    calibrated to ``epsilon``): ``bits`` per uploaded coordinate,
    ``min_survivors`` (``None``: the plan's), ``max_colluders`` and ``dropout`` (the
    chance a client drops; :class:`~swarmjax.privacy.distributed.DistributedDP`)."""

    noise_multiplier: float | None = None
    bits: int = 16
    min_survivors: int | None = None
    max_colluders: int = 0
    dropout: float = 0.0

    def check(self) -> None:
        if self.epsilon is None or self.noise_multiplier is not None:
            raise ValueError(
                "epsilon must be set and noise_multiplier not (distributed DP calibrates its "
                f"noise); got epsilon={self.epsilon}, noise_multiplier={self.noise_multiplier}"
            )
        super().check()
        check_int("bits", self.bits, 1)
        _check_optional_int("min_survivors", self.min_survivors, 1)
        check_int("max_colluders", self.max_colluders, 0)
        check_probability("dropout", self.dropout)


# ------------------------------------------------------------------------- record-level DP


@dataclass(frozen=True)
class FedDpPsoSettings(Settings):
    """Fed-DP-PSO's settings (record-level DP-Adam).

    Attributes:
        reading: the design choices (:data:`~swarmjax.fl.algorithms.fed_dp_pso.READINGS`;
            in a run configuration ``reading`` names one and ``reading-<field>`` keys
            replace its fields: :func:`reading_from_config`).
        particles: particles per client.
        target_epsilon: record-level epsilon of each client's DP-Adam.
        pso_learning_rate: the DP-Adam step.
        eval_subset: rows per client the particles are scored on (``None``: all).
        selection_metric: ``loss`` or ``error``.
        refine_start: ``pbest`` or ``position``.
        buffer_epsilons: further targets DP-Adam's Poisson buffer must serve: a sweep
            whose targets share one algorithm (compiled once) gives them all here; the
            buffer is sized for these and ``target_epsilon`` at every client set of
            ``Base.sizes``. An infinite ``target_epsilon`` is plain Adam whatever these are.
    """

    reading: Reading = field(default_factory=lambda: READINGS[DEFAULT_READING])
    particles: int = 3
    target_epsilon: float = 8.0
    pso_learning_rate: float = 0.005
    eval_subset: int | None = None
    selection_metric: str = "loss"
    refine_start: str = "pbest"
    buffer_epsilons: tuple[float, ...] = ()

    def check(self) -> None:
        self.reading.check()
        check_int("particles", self.particles, 1)
        check_positive("target_epsilon", self.target_epsilon)
        for e in self.buffer_epsilons:
            check_positive("buffer_epsilons", e)
        check_positive("pso_learning_rate", self.pso_learning_rate)
        _check_optional_int("eval_subset", self.eval_subset, 1)
        check_choice("selection_metric", self.selection_metric, ("loss", "error"))
        check_choice("refine_start", self.refine_start, ("pbest", "position"))

    def inputs(self) -> Reading:
        """The reading: it says how the clients' inputs are scaled."""
        return self.reading

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
    ) -> Self:
        """As :meth:`Settings.from_config`; the reading from ``reading`` and the
        ``reading-<field>`` keys (:func:`reading_from_config`)."""
        values = _config_values(cls, config, skip=("reading",))
        return _made(cls, {**(defaults or {}), **values, "reading": reading_from_config(config)})


def reading_from_config(config: Mapping[str, Any]) -> Reading:
    """The Fed-DP-PSO reading a run configuration names (``reading``, default ``paper``),
    each ``reading-<field>`` key that is set replacing that field (as the experiment's
    flags do)."""
    name = check_choice("reading", str(config.get("reading", DEFAULT_READING)), tuple(READINGS))
    reading = READINGS[name]
    changes = {}
    for f in fields(reading):
        key = f"reading-{config_key(f.name)}"
        if f.name != "about" and config.get(key, "") != "":
            changes[f.name] = _convert(key, config[key], type(getattr(reading, f.name)))
    return replace(reading, **changes).check()
