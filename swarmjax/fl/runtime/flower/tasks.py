"""Ready-made tasks for deployments and tests: the paper algorithms on scikit-learn's digits
(bundled with scikit-learn, so every node can build its partition offline).

Run configuration keys (all optional): ``algorithm`` (one of :data:`ALGORITHMS`, the names
of :mod:`swarmjax.fl.algorithms.registry` the Flower tasks run: ``fedavg``; ``fedprox``;
``dp-fedavg``: client-level DP-FedAvg with adaptive clipping; ``dp-ftrl``; ``fed-dp-pso``:
Fed-DP-PSO with DP-Adam at ``target-epsilon``), ``num-clients`` (3), ``rounds`` (2),
``seed`` (0), ``partition-seed`` (0), ``train-size`` (examples used, 600), ``hidden`` (32),
``learning-rate`` (0.1), ``epochs`` (1), ``batch-size`` (32), ``secret-file`` (``""``:
every process draws its own secret from operating-system entropy; a path: reproducible
mode, every process reads the run's secret from that file, which each node must keep
private: :meth:`~swarmjax.privacy.secret.Secret.from_file`), ``delta`` (``""``: swarmjax's one
default, ``min(1e-5, 0.1 / records)``), ``accountant`` (``pld``); for ``fedprox`` also
``mu`` (the
proximal weight, 0.01); for
``dp-fedavg`` also ``client-rate`` (Poisson rate of clients, 0.7), ``noise-multiplier``
(1.0) and ``clip`` (initial clip norm, 0.1); for ``dp-ftrl`` (user-level DP-FTRL with
adaptive clipping) also ``cohort`` (clients per round, 1), ``factorization`` (``blt``),
``buffers`` (BLT buffers, ``""``: jax-privacy's choice), ``bands`` (``""``),
``schedule`` (``cyclic``), ``min-separation`` and ``max-participations`` (``""``: the
most the cohort allows, as many as fit), ``noise-multiplier`` (1.0) and ``clip`` (0.1);
for ``fed-dp-pso`` also ``particles`` (3),
``target-epsilon`` (8.0), ``pso-learning-rate`` (0.005, the DP-Adam step),
``eval-batch-size`` (rows scored at a time; ``""``: all), ``eval-subset`` (rows per client
the particles are scored on; ``""``: all), ``selection-metric`` (``loss``),
``refine-start`` (``pbest``), ``reading``
(``paper``; see :data:`~swarmjax.fl.algorithms.fed_dp_pso.READINGS`) and
``reading-<field>`` keys replacing one choice of the reading (e.g. ``reading-init =
"shared"``; ``""``: the reading's own). Every
process builds the same partitions from these; a SuperNode keeps only its own.
"""

from __future__ import annotations

import math
from dataclasses import fields, replace
from typing import Any

import jax.numpy as jnp

from swarmjax._validation import check_choice, check_int
from swarmjax.fl.algorithms import registry
from swarmjax.fl.algorithms.client_level_dp_fedavg import dp_fedavg
from swarmjax.fl.algorithms.dp_ftrl import dp_ftrl
from swarmjax.fl.algorithms.fed_dp_pso import (
    DEFAULT_READING,
    READINGS,
    Reading,
    fed_dp_pso,
    reading_hyper,
)
from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.algorithms.fedprox import FedProx
from swarmjax.fl.client.training import LocalTraining, RecordDP
from swarmjax.fl.data import load_dataset
from swarmjax.fl.data.clients import ClientData, stack_clients
from swarmjax.fl.data.partition import partition
from swarmjax.fl.data.transforms import scale_inputs
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime.flower.task import Task, stacked_task
from swarmjax.models import mlp
from swarmjax.privacy.noise import CorrelatedNoise
from swarmjax.privacy.participation import MinSeparation
from swarmjax.privacy.plan import default_delta
from swarmjax.privacy.secret import Secret

__all__ = ["ALGORITHMS", "digits", "digits_clients", "fed_dp_pso_reading"]

ALGORITHMS = registry.names(flower=True)  # the registry's names these tasks run


def digits_clients(
    config: dict[str, Any], reading: Reading | None = None
) -> tuple[ClientData, tuple[Any, Any]]:
    """Stacked digits clients (IID partition) and the public test set, the inputs scaled
    as ``reading`` says (Fed-DP-PSO; ``None``: pixels in [0, 1])."""
    ds = load_dataset("digits")
    if reading is not None:
        ds = scale_inputs(ds, reading.input_scaling, reading.public_rows)
    n = check_int("train-size", int(config.get("train-size", 600)), 1)
    if n > len(ds.y_train):
        raise ValueError(f"train-size must be in [1, {len(ds.y_train)}]; got {n}")
    clients = check_int("num-clients", int(config.get("num-clients", 3)), 1)
    part = partition(ds.y_train[:n], clients, "iid", seed=int(config.get("partition-seed", 0)))
    stacked = stack_clients(ds.x_train[:n], ds.y_train[:n], part.indices)
    return stacked, (jnp.asarray(ds.x_test), jnp.asarray(ds.y_test))


def digits(config: dict[str, Any]) -> Task:
    """The task the run configuration describes (see the module docs)."""
    name = registry.lookup(str(config.get("algorithm", "fedavg")), ALGORITHMS).name
    reading = fed_dp_pso_reading(config) if name == "fed-dp-pso" else None
    clients, test = digits_clients(config, reading)
    records = int(jnp.sum(clients.sizes))
    spec = RunSpec(
        rounds=check_int("rounds", int(config.get("rounds", 2)), 1),
        delta=float(given) if (given := config.get("delta", "")) != "" else default_delta(records),
        accountant=str(config.get("accountant", "pld")),
        seeds=(int(config.get("seed", 0)),),
    )
    model = mlp((int(config.get("hidden", 32)),), 10, clients.x.shape[2:])
    training = LocalTraining(
        epochs=int(config.get("epochs", 1)), batch_size=int(config.get("batch-size", 32))
    )
    lr = float(config.get("learning-rate", 0.1))
    if name == "fedavg":
        alg = FedAvg(model, training)
        variants = Variants.grid(alg, clients, spec, epsilon_target=[math.inf], learning_rate=[lr])
    elif name == "fedprox":
        alg = FedProx(model, training)
        mu = float(config.get("mu", 0.01))
        variants = Variants.grid(alg, clients, spec, learning_rate=[lr], mu=[mu])
    elif reading is not None:  # fed-dp-pso
        target = float(config.get("target-epsilon", 8.0))
        dp = RecordDP.for_run(  # a buffer sized for the run, so the target is reachable
            [clients.sizes],
            training.batch_size,
            rounds=spec.rounds,
            epsilons=[target],
            delta=spec.delta,
            epochs=training.epochs,
        )
        eval_batch, eval_subset = config.get("eval-batch-size", ""), config.get("eval-subset", "")
        alg = fed_dp_pso(
            model,
            reading,
            batch_size=training.batch_size,
            record_dp=dp,
            particles=int(config.get("particles", 3)),
            eval_batch_size=None if eval_batch == "" else int(eval_batch),
            eval_subset=None if eval_subset == "" else int(eval_subset),
            selection_metric=str(config.get("selection-metric", "loss")),
            refine_start=str(config.get("refine-start", "pbest")),
        )
        variants = Variants.grid(
            alg,
            clients,
            spec,
            epsilon_target=[target],
            learning_rate=float(config.get("pso-learning-rate", 0.005)),
            **reading_hyper(reading),
        )
    elif name == "dp-ftrl":
        ints = {
            field: int(raw)
            for field in ("buffers", "bands", "min_separation", "max_participations")
            if (raw := config.get(field.replace("_", "-"), "")) != ""
        }
        noise = {k: ints.pop(k) for k in ("buffers", "bands") if k in ints}
        schedule = MinSeparation(
            int(config.get("cohort", 1)), schedule=str(config.get("schedule", "cyclic")), **ints
        ).for_run(clients.num_clients, spec.rounds)
        factorization = str(config.get("factorization", "blt"))
        alg = dp_ftrl(
            model,
            schedule,
            noise=CorrelatedNoise(factorization, **noise),
            training=training,
            clipping="adaptive",
        )
        variants = Variants.grid(
            alg,
            clients,
            spec,
            noise_multiplier=[float(config.get("noise-multiplier", 1.0))],
            initial_clip=float(config.get("clip", 0.1)),
            learning_rate=lr,
        )
    else:  # dp-fedavg
        alg = dp_fedavg(model, training=training, clipping="adaptive")
        variants = Variants.grid(
            alg,
            clients,
            spec,
            sample_rate=float(config.get("client-rate", 0.7)),
            noise_multiplier=[float(config.get("noise-multiplier", 1.0))],
            initial_clip=float(config.get("clip", 0.1)),
            learning_rate=lr,
        )
    secret_file = str(config.get("secret-file", ""))
    secret = Secret.from_file(secret_file) if secret_file else None
    return stacked_task(alg, variants, clients, test, secret)


def fed_dp_pso_reading(config: dict[str, Any]) -> Reading:
    """The Fed-DP-PSO reading the run configuration names (``reading``, default
    ``paper``), each ``reading-<field>`` key that is set replacing that field (as the
    experiment's flags do)."""
    name = check_choice("reading", str(config.get("reading", DEFAULT_READING)), tuple(READINGS))
    reading = READINGS[name]
    kinds = {f.name: type(getattr(reading, f.name)) for f in fields(reading) if f.name != "about"}
    changes = {}
    for field_name, kind in kinds.items():
        raw = config.get(f"reading-{field_name.replace('_', '-')}", "")
        if raw != "":
            changes[field_name] = kind(raw) if kind is not bool else _as_bool(raw)
    return replace(reading, **changes).check()


def _as_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if str(raw).lower() in ("true", "yes", "1"):
        return True
    if str(raw).lower() in ("false", "no", "0"):
        return False
    raise ValueError(f"expected a boolean (true/false); got {raw!r}")
