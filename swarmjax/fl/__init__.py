"""Federated learning: data, partitioners, stacked clients, client-side training, and the
federated algorithms as client/server protocols (:mod:`swarmjax.fl.protocol`,
:mod:`swarmjax.fl.algorithms`) run by one simulator (:mod:`swarmjax.fl.runtime`).

The pre-protocol runners (``run_fedavg``, ``run_fed_dp_pso``, ...) are still exported here
until their tests move; new code uses the protocol. See ``docs/federated.md``. The Fed-DP-PSO names
are imported lazily (on first attribute access), so ``import swarmjax.fl`` stays light.
"""

import importlib

from swarmjax.fl.centralized import (
    CentralizedConfig,
    CentralizedHyper,
    CentralizedState,
    centralized_epoch,
    centralized_run,
    run_centralized,
)
from swarmjax.fl.clients import ClientData, client, poisson_rates, stack_clients
from swarmjax.fl.comm import (
    RoundBytes,
    fedavg_bytes,
    model_bytes,
    per_round_table,
    pso_bytes,
    upload_saving,
)
from swarmjax.fl.data import (
    DATASETS,
    Dataset,
    DatasetNotFoundError,
    load_dataset,
    read_idx,
    subsample,
)
from swarmjax.fl.fedavg import (
    Aggregator,
    FedAvgConfig,
    FedAvgHyper,
    FedAvgState,
    RunResult,
    check_federated_inputs,
    fedavg_init,
    fedavg_round,
    fedavg_rounds,
    fedavg_run,
    run_fedavg,
    weighted_average,
)
from swarmjax.fl.local import (
    Batches,
    GradFn,
    LocalResult,
    Sampler,
    default_grad_fn,
    local_train,
    local_train_clients,
    shuffled_batches,
)
from swarmjax.fl.partition import (
    SCHEMES,
    Partition,
    dirichlet_partition,
    flower_partition,
    iid_partition,
    label_skew,
    partition,
    pathological_partition,
)

_LAZY = {
    "COVERAGE_PAPER": "fed_dp_pso",
    "COVERAGE_PRIVATE_SELECTION": "fed_dp_pso",
    "FedDPPSOConfig": "fed_dp_pso",
    "FedDPPSOHyper": "fed_dp_pso",
    "FedDPPSOResult": "fed_dp_pso",
    "FedDPPSOState": "fed_dp_pso",
    "evaluation_subset": "fed_dp_pso",
    "fed_dp_pso_init": "fed_dp_pso",
    "fed_dp_pso_round": "fed_dp_pso",
    "fed_dp_pso_rounds": "fed_dp_pso",
    "run_fed_dp_pso": "fed_dp_pso",
    "server_select": "fed_dp_pso",
    "fedpso_config": "fedpso",
    "run_fedpso": "fedpso",
    "FedAvgDPResult": "fedavg_dp",
    "run_fedavg_dp": "fedavg_dp",
    "calibrate_sigmas": "dp_local",
    "dp_grad_fn": "dp_local",
    "epsilon_history": "dp_local",
    "poisson_sampler": "dp_local",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"swarmjax.fl.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'swarmjax.fl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "COVERAGE_PAPER",
    "COVERAGE_PRIVATE_SELECTION",
    "DATASETS",
    "SCHEMES",
    "Aggregator",
    "Batches",
    "CentralizedConfig",
    "CentralizedHyper",
    "CentralizedState",
    "ClientData",
    "Dataset",
    "DatasetNotFoundError",
    "FedAvgConfig",
    "FedAvgDPResult",
    "FedAvgHyper",
    "FedAvgState",
    "FedDPPSOConfig",
    "FedDPPSOHyper",
    "FedDPPSOResult",
    "FedDPPSOState",
    "GradFn",
    "LocalResult",
    "Partition",
    "RoundBytes",
    "RunResult",
    "Sampler",
    "calibrate_sigmas",
    "centralized_epoch",
    "centralized_run",
    "check_federated_inputs",
    "client",
    "default_grad_fn",
    "dirichlet_partition",
    "dp_grad_fn",
    "epsilon_history",
    "evaluation_subset",
    "fed_dp_pso_init",
    "fed_dp_pso_round",
    "fed_dp_pso_rounds",
    "fedavg_bytes",
    "fedavg_init",
    "fedavg_round",
    "fedavg_rounds",
    "fedavg_run",
    "fedpso_config",
    "flower_partition",
    "iid_partition",
    "label_skew",
    "load_dataset",
    "local_train",
    "local_train_clients",
    "model_bytes",
    "partition",
    "pathological_partition",
    "per_round_table",
    "poisson_rates",
    "poisson_sampler",
    "pso_bytes",
    "read_idx",
    "run_centralized",
    "run_fed_dp_pso",
    "run_fedavg",
    "run_fedavg_dp",
    "run_fedpso",
    "server_select",
    "shuffled_batches",
    "stack_clients",
    "subsample",
    "upload_saving",
    "weighted_average",
]
