"""The one registry of algorithm names: every name a command line, a benchmark or a Flower
run configuration accepts, the class it builds, a one-line description and, for the
cross-device algorithms, how to build the algorithm and its grid for a run
(:func:`cross_device`).

``experiments.cross_device``, ``benchmarks.vs_pfl`` and the Flower tasks
(:mod:`swarmjax.fl.runtime.flower.tasks`) take their names from here; an unknown name is
one ``ValueError`` line listing the allowed ones (:func:`lookup`).

>>> from swarmjax.fl.algorithms import registry
>>> registry.names(cross_device=True)[-2:]
('dp-ftrl', 'dp-fedavg-secagg')
>>> alg, grid = registry.cross_device("dp-ftrl", run)        # doctest: +SKIP
>>> variants = Variants.grid(alg, clients, run.spec, **grid)  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from swarmjax.fl.algorithms.client_level_dp_fedavg import dp_fedavg
from swarmjax.fl.algorithms.dp_ftrl import dp_ftrl
from swarmjax.fl.algorithms.fed_dp_pso import FedDPPSO
from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.algorithms.fedprox import FedProx
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.distributed import Distributed
from swarmjax.fl.private import Private, private
from swarmjax.fl.protocol import Algorithm, RunSpec
from swarmjax.models import Model
from swarmjax.privacy.distributed import DistributedDP
from swarmjax.privacy.noise import CorrelatedNoise
from swarmjax.privacy.participation import MinSeparation, Poisson

__all__ = [
    "REGISTRY",
    "CrossDeviceRun",
    "Entry",
    "cross_device",
    "lookup",
    "names",
]

Grid = dict[str, Any]


@dataclass(frozen=True)
class CrossDeviceRun:
    """What a cross-device run fixes for every algorithm it compares.

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
class Entry:
    """One registered algorithm.

    Attributes:
        name: the name every command line and run configuration uses.
        algorithm: the class it builds (:class:`~swarmjax.fl.private.Private` for the
            user-level DP ones: FedAvg plus a privacy plan).
        description: one line: what it is.
        user_dp: whether it is user-level (client-level) DP (needs a target epsilon).
        options: the :attr:`CrossDeviceRun.options` it takes (its own settings).
        build: ``CrossDeviceRun -> (algorithm, grid values)`` for a cross-device run;
            ``None`` for an algorithm that is not a cross-device one.
        flower: whether the Flower tasks (:mod:`swarmjax.fl.runtime.flower.tasks`) run it.
    """

    name: str
    algorithm: type[Algorithm]
    description: str
    user_dp: bool = False
    options: tuple[str, ...] = ()
    build: Callable[[CrossDeviceRun], tuple[Algorithm, Grid]] | None = None
    flower: bool = False


def _fedavg(server_optimizer: str | None) -> Callable[[CrossDeviceRun], tuple[Algorithm, Grid]]:
    def build(run: CrossDeviceRun) -> tuple[Algorithm, Grid]:
        alg = FedAvg(
            run.model,
            run.training,
            cohort=run.cohort,
            server_optimizer=server_optimizer,
            eval_batch_size=run.eval_batch_size,
        )
        slr = run.server_lr if server_optimizer is None else run.adaptive_server_lr
        return alg, {"learning_rate": run.learning_rate, "server_lr": slr}

    return build


def _fedprox(run: CrossDeviceRun) -> tuple[Algorithm, Grid]:
    alg = FedProx(run.model, run.training, cohort=run.cohort, eval_batch_size=run.eval_batch_size)
    return alg, {"learning_rate": run.learning_rate, "mu": run.mu}


def _dp_grid(run: CrossDeviceRun) -> Grid:
    return {
        "initial_clip": run.clip,
        "learning_rate": run.learning_rate,
        "server_lr": run.server_lr,
        "epsilon_target": [run.epsilon],
    }


def _dp_fedavg(clipping: str) -> Callable[[CrossDeviceRun], tuple[Algorithm, Grid]]:
    def build(run: CrossDeviceRun) -> tuple[Algorithm, Grid]:
        rate = run.cohort / run.num_clients
        s = run.spec
        # the Poisson participation sizes its buffer for this run
        poisson = Poisson.for_run(
            run.num_clients, rate, s.rounds, s.delta, run.epsilon, s.accountant
        )
        alg = dp_fedavg(
            run.model,
            participation=poisson,
            training=run.training,
            clipping=clipping,
            eval_batch_size=run.eval_batch_size,
        )
        return alg, {"sample_rate": rate, **_dp_grid(run)}

    return build


def _dp_ftrl(run: CrossDeviceRun) -> tuple[Algorithm, Grid]:
    options = dict(run.options)
    factorization = options.pop("factorization", "blt")
    noise_cohort = options.pop("noise_cohort", None)
    # for_run makes b and k explicit and refuses a scheme that cannot hold, before any work
    schedule = MinSeparation(run.cohort, **options).for_run(run.num_clients, run.spec.rounds)
    alg = dp_ftrl(
        run.model,
        schedule,
        noise=CorrelatedNoise(factorization),
        training=run.training,
        clipping="fixed",
        noise_cohort=noise_cohort,
        eval_batch_size=run.eval_batch_size,
    )
    if run.epsilon is not None and math.isfinite(run.epsilon):  # the target is reachable
        alg.plan.privacy_plan(run.num_clients, 1.0, run.spec).calibrate(float(run.epsilon))
    return alg, _dp_grid(run)


FTRL_OPTIONS = ("factorization", "schedule", "min_separation", "max_participations", "noise_cohort")
SCHEDULE_OPTIONS = ("schedule", "min_separation", "max_participations")
SECAGG_OPTIONS = (*SCHEDULE_OPTIONS, "bits", "min_survivors", "max_colluders", "dropout")


def _dp_fedavg_secagg(run: CrossDeviceRun) -> tuple[Algorithm, Grid]:
    options = dict(run.options)
    schedule = {k: options.pop(k) for k in SCHEDULE_OPTIONS if k in options}
    participation = MinSeparation(run.cohort, **schedule).for_run(run.num_clients, run.spec.rounds)
    inner = FedAvg(
        run.model,
        run.training,
        server_optimizer="sgd",
        weighting="uniform",
        eval_batch_size=run.eval_batch_size,
    )
    settings = {k: v for k, v in options.items() if v is not None}
    return private(inner, DistributedDP(participation, **settings)), _dp_grid(run)


REGISTRY: dict[str, Entry] = {
    e.name: e
    for e in (
        Entry(
            "fedavg",
            FedAvg,
            "FedAvg (McMahan et al. 2017): a uniform cohort, the server steps SGD on the mean "
            "update",
            build=_fedavg(None),
            flower=True,
        ),
        Entry(
            "fedprox",
            FedProx,
            "FedProx (Li et al. 2020): FedAvg whose clients add the proximal term "
            "(mu / 2) ||w - w_t||^2",
            build=_fedprox,
            flower=True,
        ),
        Entry(
            "fedadam",
            FedAvg,
            "FedAdam (Reddi et al. 2021): FedAvg with Adam on the server",
            build=_fedavg("adam"),
        ),
        Entry(
            "fedyogi",
            FedAvg,
            "FedYogi (Reddi et al. 2021): FedAvg with Yogi on the server",
            build=_fedavg("yogi"),
        ),
        Entry(
            "dp-fedavg",
            Private,
            "user-level DP-FedAvg (McMahan et al. 2018): a secret Poisson cohort, fixed clipping "
            "in cross-device runs (the Flower task clips adaptively), amplified by sampling",
            user_dp=True,
            build=_dp_fedavg("fixed"),
            flower=True,
        ),
        Entry(
            "dp-fedavg-adaptive",
            Private,
            "user-level DP-FedAvg with adaptive clipping (Andrew et al. 2021)",
            user_dp=True,
            build=_dp_fedavg("adaptive"),
        ),
        Entry(
            "dp-ftrl",
            Private,
            "user-level DP-FTRL (Kairouz et al. 2021): public cohorts, each client at most k "
            "times b rounds apart, correlated matrix-factorization noise, no amplification "
            "(fixed clipping in cross-device runs; the Flower task clips adaptively)",
            user_dp=True,
            options=FTRL_OPTIONS,
            build=_dp_ftrl,
            flower=True,
        ),
        Entry(
            "dp-fedavg-secagg",
            Distributed,
            "user-level DP-FedAvg that does not trust the server: clients add Skellam noise "
            "shares and mask their b-bit uploads with secure aggregation; public "
            "min-separation cohorts, no amplification (docs/secure_aggregation.md)",
            user_dp=True,
            options=SECAGG_OPTIONS,
            build=_dp_fedavg_secagg,
        ),
        Entry(
            "fed-dp-pso",
            FedDPPSO,
            "Fed-DP-PSO: a federated particle swarm over models with record-level DP-Adam "
            "(docs/fed_dp_pso.md); not a cross-device algorithm",
            flower=True,
        ),
    )
}


def names(
    *, cross_device: bool = False, flower: bool = False, user_dp: bool | None = None
) -> tuple[str, ...]:
    """The registered names, in registry order: those with a cross-device build
    (``cross_device``), those the Flower tasks run (``flower``), the user-level DP ones or
    the others (``user_dp``)."""
    return tuple(
        e.name
        for e in REGISTRY.values()
        if (not cross_device or e.build is not None)
        and (not flower or e.flower)
        and (user_dp is None or e.user_dp == user_dp)
    )


def lookup(name: str, allowed: tuple[str, ...] | None = None) -> Entry:
    """The entry of ``name``; a one-line ``ValueError`` listing the allowed names (``allowed``,
    default every registered name) for any other."""
    allowed = tuple(REGISTRY) if allowed is None else allowed
    if name not in allowed:
        raise ValueError(f"unknown algorithm {name!r}; allowed: {', '.join(allowed)}")
    return REGISTRY[name]


def cross_device(name: str, run: CrossDeviceRun) -> tuple[Algorithm, Grid]:
    """``(algorithm, grid values for Variants.grid)`` of ``name`` for the cross-device
    ``run``; one-line ``ValueError`` for an unknown name, a DP algorithm without
    ``run.epsilon``, an option it does not take, or (DP-FTRL) a scheme that cannot hold."""
    entry = lookup(name, names(cross_device=True))
    unused = sorted(set(run.options) - set(entry.options))
    if unused:
        takers = [e.name for e in REGISTRY.values() if unused[0] in e.options]
        raise ValueError(
            f"{unused[0]} does not apply to {name}; it applies to: {', '.join(takers) or 'none'}"
        )
    if entry.user_dp and run.epsilon is None:
        raise ValueError(f"epsilon must be set for {name} (a user-level DP algorithm)")
    build = entry.build
    if build is None:  # unreachable: names(cross_device=True) lists only entries with one
        raise ValueError(f"{name} has no cross-device build")
    return build(run)
