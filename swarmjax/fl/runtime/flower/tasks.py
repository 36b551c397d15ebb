"""Ready-made tasks for deployments and tests: the paper algorithms on scikit-learn's digits
(bundled with scikit-learn, so every node can build its partition offline).

Run configuration keys (all optional): ``algorithm`` (``fedavg``; ``dp-fedavg``:
client-level DP-FedAvg with adaptive clipping; ``fed-dp-pso``: Fed-DP-PSO with DP-Adam at
``target-epsilon``), ``num-clients`` (3), ``rounds`` (2),
``seed`` (0), ``partition-seed`` (0), ``train-size`` (examples used, 600), ``hidden`` (32),
``learning-rate`` (0.1), ``epochs`` (1), ``batch-size`` (32), ``delta`` (1e-5); for
``dp-fedavg`` also ``client-rate`` (Poisson rate of clients, 0.7), ``noise-multiplier``
(1.0) and ``clip`` (initial clip norm, 0.1); for ``fed-dp-pso`` also ``particles`` (3),
``target-epsilon`` (8.0) and ``pso-learning-rate`` (0.005, the DP-Adam step). Every
process builds the same partitions from these; a SuperNode keeps only its own.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import jax.numpy as jnp

from swarmjax._validation import check_choice, check_int
from swarmjax.fl.algorithms.client_level_dp_fedavg import ClientLevelDPFedAvg
from swarmjax.fl.algorithms.fed_dp_pso import FedDPPSO
from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.client.training import LocalTraining, RecordDP
from swarmjax.fl.data import load_dataset
from swarmjax.fl.data.clients import ClientData, stack_clients
from swarmjax.fl.data.partition import partition
from swarmjax.fl.runtime.flower.task import Task, stacked_task
from swarmjax.models import mlp

__all__ = ["ALGORITHMS", "digits", "digits_clients"]

ALGORITHMS = ("fedavg", "dp-fedavg", "fed-dp-pso")


def digits_clients(config: dict[str, Any]) -> tuple[ClientData, tuple[Any, Any]]:
    """Stacked digits clients (IID partition) and the public test set."""
    ds = load_dataset("digits")
    n = check_int("train-size", int(config.get("train-size", 600)), 1)
    if n > len(ds.y_train):
        raise ValueError(f"train-size must be in [1, {len(ds.y_train)}]; got {n}")
    clients = check_int("num-clients", int(config.get("num-clients", 3)), 1)
    part = partition(ds.y_train[:n], clients, "iid", seed=int(config.get("partition-seed", 0)))
    stacked = stack_clients(ds.x_train[:n], ds.y_train[:n], part.indices)
    return stacked, (jnp.asarray(ds.x_test), jnp.asarray(ds.y_test))


def digits(config: dict[str, Any]) -> Task:
    """The task the run configuration describes (see the module docs)."""
    name = check_choice("algorithm", str(config.get("algorithm", "fedavg")), ALGORITHMS)
    clients, test = digits_clients(config)
    rounds = check_int("rounds", int(config.get("rounds", 2)), 1)
    model = mlp((int(config.get("hidden", 32)),), 10, clients.x.shape[2:])
    training = LocalTraining(
        epochs=int(config.get("epochs", 1)), batch_size=int(config.get("batch-size", 32))
    )
    lr = float(config.get("learning-rate", 0.1))
    delta = float(config.get("delta", 1e-5))
    data: Any = clients  # what each client holds: its ClientData, or the algorithm's view
    if name == "fedavg":
        alg = FedAvg(model, training)
        variants = alg.variants(clients, rounds=rounds, learning_rate=lr, target_epsilon=math.inf)
    elif name == "fed-dp-pso":
        target = float(config.get("target-epsilon", 8.0))
        steps = rounds * training.epochs * -(-int(jnp.max(clients.sizes)) // training.batch_size)
        dp = RecordDP.for_sizes(  # a buffer sized for the run, so the target is reachable
            clients.sizes, training.batch_size, steps=steps, delta=delta, epsilon=target
        )
        training = replace(training, optimizer="adamw", weight_decay=1e-4, record_dp=dp)
        alg = FedDPPSO(model, training, particles=int(config.get("particles", 3)))
        variants = alg.variants(
            clients,
            rounds=rounds,
            target_epsilon=target,
            learning_rate=float(config.get("pso-learning-rate", 0.005)),
            delta=delta,
        )
        data = alg.client_data(clients)
    else:  # dp-fedavg
        alg = ClientLevelDPFedAvg(model, training, clipping="adaptive")
        variants = alg.variants(
            clients,
            sample_rate=float(config.get("client-rate", 0.7)),
            noise_multiplier=float(config.get("noise-multiplier", 1.0)),
            clip=float(config.get("clip", 0.1)),
            client_lr=lr,
        )
    return stacked_task(
        alg, variants, data, test, rounds=rounds, seed=int(config.get("seed", 0)), delta=delta
    )
