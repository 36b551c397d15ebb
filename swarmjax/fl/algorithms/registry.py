"""The one registry of algorithm names: every name a command line, a benchmark or a Flower
run configuration accepts, the class it builds, a one-line description, its typed settings
(:mod:`swarmjax.fl.algorithms.settings`) and the one function that builds it from them.

Every consumer builds through :func:`build` ``(name, base, settings)``: the Flower tasks
(:mod:`swarmjax.fl.runtime.flower.tasks`) with settings from the run configuration
(:func:`from_config`), ``experiments.cross_device``, ``benchmarks.vs_pfl`` and
``benchmarks.secagg`` with settings from a :class:`CrossDeviceRun` (:func:`cross_device`),
and every other experiment and benchmark with :func:`settings` directly (none of them
calls an algorithm's constructor: ``tests/test_registry.py`` checks). An unknown name is one
``ValueError`` line listing the allowed ones (:func:`lookup`); an unknown or bad setting
is one line naming it (:func:`settings`).

Adding an algorithm: a settings dataclass (fields with defaults, ``check``), a build
function ``(Base, settings) -> (algorithm, grid values)`` and an :class:`Entry` in
:data:`REGISTRY` (``flower=True`` to run it on Flower; ``from_run`` for cross-device runs).

>>> from swarmjax.fl.algorithms import registry
>>> registry.names(cross_device=True)[-2:]
('dp-ftrl', 'dp-fedavg-secagg')
>>> registry.settings("dp-fedavg", client_rate=0.5).clipping
'adaptive'
>>> registry.settings("dp-fedavg", rate=0.5)  # doctest: +ELLIPSIS
Traceback (most recent call last):
ValueError: dp-fedavg has no setting 'rate'; its settings: clip, learning_rate, ...
>>> alg, grid = registry.build("dp-fedavg", base, settings)   # doctest: +SKIP
>>> alg, grid = registry.cross_device("dp-ftrl", run)        # doctest: +SKIP
>>> variants = Variants.grid(alg, clients, run.spec, **grid)  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from swarmjax._validation import did_you_mean
from swarmjax.fl.algorithms.client_level_dp_fedavg import dp_fedavg
from swarmjax.fl.algorithms.combined import CombinedAggregator
from swarmjax.fl.algorithms.dp_ftrl import dp_ftrl
from swarmjax.fl.algorithms.fed_dp_pso import FedDPPSO, fed_dp_pso, reading_hyper
from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.algorithms.fedprox import FedProx
from swarmjax.fl.algorithms.local_only import LocalOnly
from swarmjax.fl.algorithms.settings import (
    CombinedSettings,
    DistributedDpSettings,
    DpFedAvgSettings,
    DpFtrlSettings,
    FedAvgSettings,
    FedDpPsoSettings,
    FedProxSettings,
    LocalOnlySettings,
    Settings,
)
from swarmjax.fl.client.training import LocalTraining, RecordDP
from swarmjax.fl.distributed import Distributed
from swarmjax.fl.private import Private, private
from swarmjax.fl.protocol import Algorithm, RunSpec
from swarmjax.models import Model
from swarmjax.privacy.canaries import CanaryAudit
from swarmjax.privacy.distributed import DistributedDP
from swarmjax.privacy.noise import CorrelatedNoise
from swarmjax.privacy.participation import Poisson

__all__ = [
    "REGISTRY",
    "Base",
    "CrossDeviceRun",
    "Entry",
    "build",
    "cross_device",
    "from_config",
    "lookup",
    "names",
    "settings",
]

Grid = dict[str, Any]


@dataclass(frozen=True)
class CrossDeviceRun:
    """What a cross-device comparison fixes for every algorithm it compares; each entry's
    :attr:`~Entry.from_run` turns it into that algorithm's own settings.

    Attributes:
        model: the ``(init, apply)`` pair.
        num_clients: ``N``, clients in the federation.
        cohort: ``m``, clients per round (a DP-FedAvg cohort is Poisson of expected size
            ``m``, rate ``m / N``).
        spec: rounds, delta, seeds and accountant.
        training: local training (no record-level DP).
        epsilon: user-level target epsilon of a DP algorithm (required by them, unused by
            the others).
        learning_rate: local learning rate.
        server_lr: server learning rate of FedAvg, FedProx and the DP algorithms.
        adaptive_server_lr: server learning rate of FedAdam and FedYogi.
        clip: the (initial) user-level clip norm of the DP algorithms.
        mu: FedProx's proximal weight.
        eval_batch_size: test rows per evaluation chunk (``None``: one pass).
        options: settings of one algorithm only, by the names of its
            :attr:`Entry.options` (e.g. DP-FTRL's ``factorization``); an option the chosen
            algorithm does not take is refused by :func:`cross_device`.
    """

    model: Model
    num_clients: int
    cohort: int
    spec: RunSpec
    training: LocalTraining
    epsilon: float | None = None
    learning_rate: float = 0.1
    server_lr: float = 1.0
    adaptive_server_lr: float = 0.01
    clip: float = 0.4
    mu: float = 0.01
    eval_batch_size: int | None = None
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Base:
    """What every build takes beside the algorithm's own settings: the run's pieces.

    Attributes:
        model: the ``(init, apply)`` pair.
        training: local training (its batch size and epochs also set record-level DP).
        spec: rounds, delta, seeds and accountant.
        num_clients: ``N``, clients in the federation.
        eval_batch_size: test rows per evaluation chunk (``None``: one pass).
        sizes: ``(N,)`` records per client, or a list of such arrays: every client set
            one algorithm serves (Fed-DP-PSO sizes its DP-Adam buffer for each of them;
            ``None`` where the build does not need them).
        audit: the empirical audit the run carries (record-level canaries of FedAvg with
            DP-SGD and of Fed-DP-PSO; docs/audits.md); ``None``: none. An infinite target
            drops it (a non-private run has no epsilon to audit); any other build refuses
            it in one line.
    """

    model: Model
    training: LocalTraining
    spec: RunSpec
    num_clients: int
    eval_batch_size: int | None = None
    sizes: Any = None
    audit: CanaryAudit | None = None


Build = Callable[[Base, Any], tuple[Algorithm, Grid]]
"""``(base, the entry's settings) -> (algorithm, values for Variants.grid)``."""

FromRun = Callable[[CrossDeviceRun], dict[str, Any]]
"""A cross-device run's values of an entry's settings (by field name)."""


@dataclass(frozen=True)
class Entry:
    """One registered algorithm.

    Attributes:
        name: the name every command line and run configuration uses.
        algorithm: the class it builds (:class:`~swarmjax.fl.private.Private` for the
            user-level DP ones: FedAvg plus a privacy plan).
        description: one line: what it is.
        settings: its settings class (:mod:`swarmjax.fl.algorithms.settings`): every value
            a user may set, checked on creation.
        build: ``(Base, settings) -> (algorithm, grid values)``: the one way it is built.
        defaults: this entry's own values of its settings (e.g. FedAdam's server
            optimiser), before any the caller sets.
        user_dp: whether it is user-level (client-level) DP.
        options: the :attr:`CrossDeviceRun.options` it takes (settings a cross-device run
            does not fix for every algorithm).
        from_run: a cross-device run's values of its settings; ``None`` for an algorithm
            that is not a cross-device one.
        flower: whether the Flower tasks (:mod:`swarmjax.fl.runtime.flower.tasks`) run it.
    """

    name: str
    algorithm: type[Algorithm]
    description: str
    settings: type[Settings]
    build: Build
    defaults: Mapping[str, Any] = field(default_factory=dict)
    user_dp: bool = False
    options: tuple[str, ...] = ()
    from_run: FromRun | None = None
    flower: bool = False


# ------------------------------------------------------------------------------- builds


def _record_dp(base: Base, epsilons: list[float]) -> RecordDP | None:
    """Record-level DP whose Poisson buffer is sized for the run at every target of
    ``epsilons`` and every client set of ``base.sizes`` (so each target is reachable);
    ``None`` when no target is finite (exact local training)."""
    if not any(math.isfinite(e) for e in epsilons):
        return None
    if base.sizes is None:
        raise ValueError("record-level DP needs the clients' sizes (Base.sizes) to size it")
    sets = list(base.sizes) if isinstance(base.sizes, list | tuple) else [base.sizes]
    training, spec = base.training, base.spec
    return RecordDP.for_run(
        sets,
        training.batch_size,
        rounds=spec.rounds,
        epsilons=epsilons,
        delta=spec.delta,
        epochs=training.epochs,
    )


def _fedavg(base: Base, s: FedAvgSettings) -> tuple[Algorithm, Grid]:
    if base.audit is not None and s.record_epsilon is None:
        raise ValueError("Base.audit needs record-level DP to audit: set record_epsilon")
    eps = math.inf if s.record_epsilon is None else s.record_epsilon
    dp = _record_dp(base, [eps])
    alg = FedAvg(
        base.model,
        replace(base.training, record_dp=dp),
        cohort=s.cohort,
        server_optimizer=s.server_optimizer,
        eval_batch_size=base.eval_batch_size,
        audit=None if dp is None else base.audit,  # an infinite target: nothing to audit
    )
    grid = {"learning_rate": s.learning_rate, "server_lr": s.server_lr}
    return alg, grid if s.record_epsilon is None else {**grid, "epsilon_target": [eps]}


def _combined(base: Base, s: CombinedSettings) -> tuple[Algorithm, Grid]:
    rule = CombinedAggregator(s.conv, s.variant)
    alg = FedAvg(base.model, base.training, combine=rule, eval_batch_size=base.eval_batch_size)
    return alg, {"learning_rate": s.learning_rate}


def _local_only(base: Base, s: LocalOnlySettings) -> tuple[Algorithm, Grid]:
    alg = LocalOnly(
        base.model,
        base.training,
        keep_optimizer_state=s.keep_optimizer_state,
        eval_batch_size=base.eval_batch_size,
    )
    return alg, {"learning_rate": s.learning_rate}


def _fedprox(base: Base, s: FedProxSettings) -> tuple[Algorithm, Grid]:
    alg = FedProx(base.model, base.training, cohort=s.cohort, eval_batch_size=base.eval_batch_size)
    return alg, {"learning_rate": s.learning_rate, "mu": s.mu}


def _dp_fedavg(base: Base, s: DpFedAvgSettings) -> tuple[Algorithm, Grid]:
    participation = None  # given a noise multiplier alone: a Poisson draw without a buffer
    if s.sized_for() is not None:  # the Poisson participation sizes its buffer for the run
        b = base.spec
        participation = Poisson.for_run(
            base.num_clients, s.client_rate, b.rounds, b.delta, s.sized_for(), b.accountant
        )
    alg = dp_fedavg(
        base.model,
        participation=participation,
        training=base.training,
        clipping=s.clipping,
        server_momentum=s.server_momentum,
        eval_batch_size=base.eval_batch_size,
    )
    return alg, {"sample_rate": s.client_rate, **s.grid()}


def _dp_ftrl(base: Base, s: DpFtrlSettings) -> tuple[Algorithm, Grid]:
    # for_run makes b and k explicit and refuses a scheme that cannot hold, before any work
    schedule = s.participation(base.num_clients, base.spec.rounds)
    alg = dp_ftrl(
        base.model,
        schedule,
        noise=CorrelatedNoise(s.factorization, bands=s.bands, buffers=s.buffers),
        training=base.training,
        clipping=s.clipping,
        noise_cohort=s.noise_cohort,
        eval_batch_size=base.eval_batch_size,
    )
    eps = s.epsilon
    if eps is not None and math.isfinite(eps):  # the target is reachable
        alg.plan.privacy_plan(base.num_clients, 1.0, base.spec).calibrate(float(eps))
    return alg, s.grid()


def _dp_fedavg_secagg(base: Base, s: DistributedDpSettings) -> tuple[Algorithm, Grid]:
    inner = FedAvg(
        base.model,
        base.training,
        server_optimizer="sgd",
        weighting="uniform",
        eval_batch_size=base.eval_batch_size,
    )
    plan = DistributedDP(
        s.participation(base.num_clients, base.spec.rounds),
        bits=s.bits,
        min_survivors=s.min_survivors,
        max_colluders=s.max_colluders,
        dropout=s.dropout,
    )
    return private(inner, plan), s.grid()


def _fed_dp_pso(base: Base, s: FedDpPsoSettings) -> tuple[Algorithm, Grid]:
    dp = None  # an infinite target: plain Adam, no clipping, noise nor audit
    if math.isfinite(s.target_epsilon):
        dp = _record_dp(base, [s.target_epsilon, *s.buffer_epsilons])
    scoring = {k: getattr(s, k) for k in ("eval_subset", "selection_metric", "refine_start")}
    alg = fed_dp_pso(
        base.model,
        s.reading,
        batch_size=base.training.batch_size,
        record_dp=dp,
        particles=s.particles,
        eval_batch_size=base.eval_batch_size,
        audit=None if dp is None else base.audit,
        **scoring,
    )
    grid = {"learning_rate": s.pso_learning_rate, **reading_hyper(s.reading)}
    return alg, {"epsilon_target": [s.target_epsilon], **grid}


# ------------------------------------------------------- a cross-device run's settings


def _fedavg_run(adaptive: bool) -> FromRun:
    def values(run: CrossDeviceRun) -> dict[str, Any]:
        slr = run.adaptive_server_lr if adaptive else run.server_lr
        return {"learning_rate": run.learning_rate, "server_lr": slr, "cohort": run.cohort}

    return values


def _fedprox_run(run: CrossDeviceRun) -> dict[str, Any]:
    return {"learning_rate": run.learning_rate, "mu": run.mu, "cohort": run.cohort}


def _user_dp_run(run: CrossDeviceRun) -> dict[str, Any]:
    """The settings every user-level DP algorithm takes from a cross-device run (the noise
    calibrated to its epsilon) and its options that are set."""
    return {
        "clip": run.clip,
        "learning_rate": run.learning_rate,
        "server_lr": run.server_lr,
        "epsilon": run.epsilon,
        "noise_multiplier": None,
        **{k: v for k, v in run.options.items() if v is not None},
    }


def _dp_fedavg_run(clipping: str) -> FromRun:
    def values(run: CrossDeviceRun) -> dict[str, Any]:
        rate = run.cohort / run.num_clients
        return {"client_rate": rate, "clipping": clipping, **_user_dp_run(run)}

    return values


def _schedule_run(clipping: str | None) -> FromRun:
    def values(run: CrossDeviceRun) -> dict[str, Any]:
        fixed = {} if clipping is None else {"clipping": clipping}
        return {"cohort": run.cohort, **fixed, **_user_dp_run(run)}

    return values


FTRL_OPTIONS = ("factorization", "schedule", "min_separation", "max_participations", "noise_cohort")
SCHEDULE_OPTIONS = ("schedule", "min_separation", "max_participations")
SECAGG_OPTIONS = (*SCHEDULE_OPTIONS, "bits", "min_survivors", "max_colluders", "dropout")


REGISTRY: dict[str, Entry] = {
    e.name: e
    for e in (
        Entry(
            "fedavg",
            FedAvg,
            "FedAvg (McMahan et al. 2017): a uniform cohort, the server steps SGD on the mean "
            "update",
            FedAvgSettings,
            _fedavg,
            from_run=_fedavg_run(adaptive=False),
            flower=True,
        ),
        Entry(
            "fedprox",
            FedProx,
            "FedProx (Li et al. 2020): FedAvg whose clients add the proximal term "
            "(mu / 2) ||w - w_t||^2",
            FedProxSettings,
            _fedprox,
            from_run=_fedprox_run,
            flower=True,
        ),
        Entry(
            "fedadam",
            FedAvg,
            "FedAdam (Reddi et al. 2021): FedAvg with Adam on the server",
            FedAvgSettings,
            _fedavg,
            defaults={"server_optimizer": "adam", "server_lr": 0.01},
            from_run=_fedavg_run(adaptive=True),
        ),
        Entry(
            "fedyogi",
            FedAvg,
            "FedYogi (Reddi et al. 2021): FedAvg with Yogi on the server",
            FedAvgSettings,
            _fedavg,
            defaults={"server_optimizer": "yogi", "server_lr": 0.01},
            from_run=_fedavg_run(adaptive=True),
        ),
        Entry(
            "dp-fedavg",
            Private,
            "user-level DP-FedAvg (McMahan et al. 2018): a secret Poisson cohort, amplified by "
            "sampling; adaptive clipping by default, fixed in cross-device runs",
            DpFedAvgSettings,
            _dp_fedavg,
            user_dp=True,
            from_run=_dp_fedavg_run("fixed"),
            flower=True,
        ),
        Entry(
            "dp-fedavg-adaptive",
            Private,
            "user-level DP-FedAvg with adaptive clipping (Andrew et al. 2021)",
            DpFedAvgSettings,
            _dp_fedavg,
            defaults={"clipping": "adaptive"},
            user_dp=True,
            from_run=_dp_fedavg_run("adaptive"),
        ),
        Entry(
            "dp-ftrl",
            Private,
            "user-level DP-FTRL (Kairouz et al. 2021): public cohorts, each client at most k "
            "times b rounds apart, correlated matrix-factorization noise, no amplification "
            "(adaptive clipping by default, fixed in cross-device runs)",
            DpFtrlSettings,
            _dp_ftrl,
            user_dp=True,
            options=FTRL_OPTIONS,
            from_run=_schedule_run("fixed"),
            flower=True,
        ),
        Entry(
            "dp-fedavg-secagg",
            Distributed,
            "user-level DP-FedAvg that does not trust the server: clients add Skellam noise "
            "shares and mask their b-bit uploads with secure aggregation; public "
            "min-separation cohorts, no amplification (docs/secure_aggregation.md)",
            DistributedDpSettings,
            _dp_fedavg_secagg,
            user_dp=True,
            options=SECAGG_OPTIONS,
            from_run=_schedule_run(None),
            flower=True,
        ),
        Entry(
            "combined",
            FedAvg,
            "combined learning: FedAvg whose server combines the uploaded models by their "
            "relevance instead of averaging them (docs/combined_learning.md); not a "
            "cross-device algorithm",
            CombinedSettings,
            _combined,
        ),
        Entry(
            "local-only",
            LocalOnly,
            "every client training alone, no server step (the centralised reference when one "
            "client holds every row)",
            LocalOnlySettings,
            _local_only,
        ),
        Entry(
            "fed-dp-pso",
            FedDPPSO,
            "Fed-DP-PSO: a federated particle swarm over models with record-level DP-Adam "
            "(docs/fed_dp_pso.md); not a cross-device algorithm",
            FedDpPsoSettings,
            _fed_dp_pso,
            flower=True,
        ),
    )
}


def names(
    *, cross_device: bool = False, flower: bool = False, user_dp: bool | None = None
) -> tuple[str, ...]:
    """The registered names, in registry order: the cross-device ones (``cross_device``),
    those the Flower tasks run (``flower``), the user-level DP ones or the others
    (``user_dp``)."""
    return tuple(
        e.name
        for e in REGISTRY.values()
        if (not cross_device or e.from_run is not None)
        and (not flower or e.flower)
        and (user_dp is None or e.user_dp == user_dp)
    )


def lookup(name: str, allowed: tuple[str, ...] | None = None) -> Entry:
    """The entry of ``name``; a one-line ``ValueError`` listing the allowed names (``allowed``,
    default every registered name) for any other."""
    allowed = tuple(REGISTRY) if allowed is None else allowed
    if name not in allowed:
        raise ValueError(
            f"unknown algorithm {name!r}{did_you_mean(name, allowed)}; allowed: "
            f"{', '.join(allowed)}"
        )
    return REGISTRY[name]


def settings(name: str, **values: Any) -> Settings:
    """The settings of ``name``: its entry's :attr:`~Entry.defaults`, then ``values``
    (by field name); one-line ``ValueError`` for a setting it does not have or a bad
    value."""
    entry = lookup(name)
    allowed = [f.name for f in fields(entry.settings)]
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise ValueError(
            f"{name} has no setting {unknown[0]!r}; its settings: {', '.join(allowed)}"
        )
    return entry.settings(**{**entry.defaults, **values})


def from_config(name: str, config: Mapping[str, Any]) -> Settings:
    """The settings of ``name`` that a run configuration gives (string keys: a field's
    name with ``-`` for ``_``; :meth:`~swarmjax.fl.algorithms.settings.Settings.from_config`);
    keys that are no setting of ``name`` are left to the run."""
    entry = lookup(name)
    return entry.settings.from_config(config, entry.defaults)


def build(name: str, base: Base, chosen: Settings | None = None) -> tuple[Algorithm, Grid]:
    """``(algorithm, grid values for Variants.grid)`` of ``name`` with the settings
    ``chosen`` (``None``: :func:`settings` ``(name)``, its defaults); one-line
    ``ValueError`` for settings of another algorithm's class, or a ``base`` whose training
    already carries record-level DP (the settings size it, for the run)."""
    entry = lookup(name)
    chosen = settings(name) if chosen is None else chosen
    if type(chosen) is not entry.settings:
        raise ValueError(f"{name} takes {entry.settings.__name__}; got {type(chosen).__name__}")
    if base.training.record_dp is not None:
        raise ValueError(
            "Base.training.record_dp must be None: record-level DP is sized by the settings "
            "(fedavg: record_epsilon; fed-dp-pso: target_epsilon and buffer_epsilons)"
        )
    if base.audit is not None and entry.build not in (_fedavg, _fed_dp_pso):
        raise ValueError(
            f"Base.audit: {name} carries no record-level canaries (fedavg, fedadam, fedyogi "
            "and fed-dp-pso do); audit a user-level run with simulate(audit=...)"
        )
    return entry.build(base, chosen)


def cross_device(name: str, run: CrossDeviceRun) -> tuple[Algorithm, Grid]:
    """``(algorithm, grid values for Variants.grid)`` of ``name`` for the cross-device
    ``run``, built as every caller builds it (:func:`build`); one-line ``ValueError`` for an
    unknown name, a DP algorithm without ``run.epsilon``, an option it does not take, or
    (DP-FTRL) a scheme that cannot hold."""
    entry = lookup(name, names(cross_device=True))
    unused = sorted(set(run.options) - set(entry.options))
    if unused:
        takers = [e.name for e in REGISTRY.values() if unused[0] in e.options]
        raise ValueError(
            f"{unused[0]} does not apply to {name}; it applies to: {', '.join(takers) or 'none'}"
        )
    if entry.user_dp and run.epsilon is None:
        raise ValueError(f"epsilon must be set for {name} (a user-level DP algorithm)")
    from_run = entry.from_run
    if from_run is None:  # unreachable: names(cross_device=True) lists only entries with one
        raise ValueError(f"{name} is not a cross-device algorithm")
    base = Base(run.model, run.training, run.spec, run.num_clients, run.eval_batch_size)
    return build(name, base, settings(name, **from_run(run)))
