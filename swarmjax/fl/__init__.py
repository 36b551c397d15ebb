"""Federated learning, cut along what stays on a client and what leaves it:

* data: :mod:`~swarmjax.fl.data` (datasets), :mod:`~swarmjax.fl.partition` (clients from a
  dataset), :mod:`~swarmjax.fl.clients` (stacked, padded, masked client data),
  :mod:`~swarmjax.fl.comm` (bytes on the wire);
* client-side training: :mod:`~swarmjax.fl.client_training` (local steps, record-level DP,
  the optimiser convention) over :mod:`~swarmjax.fl.local` and :mod:`~swarmjax.fl.dp_local`;
* the protocol: :mod:`~swarmjax.fl.protocol` (exchanges, message protection, keys);
* algorithms, one file each: :mod:`~swarmjax.fl.algorithms` (FedAvg with record-level DP and
  combined learning, client-level DP-FedAvg, Fed-DP-PSO and FedPSO, clients alone and the
  centralised reference);
* runtime: :mod:`~swarmjax.fl.runtime` (the simulator and its one :class:`Result`).

See ``docs/federated.md``. The algorithms and the runtime are imported lazily (on first
attribute access), so ``import swarmjax.fl`` stays light.
"""

import importlib

from swarmjax.fl import comm
from swarmjax.fl.clients import ClientData, client, poisson_rates, stack_clients
from swarmjax.fl.data import (
    DATASETS,
    Dataset,
    DatasetNotFoundError,
    load_dataset,
    read_idx,
    subsample,
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
    "LocalTraining": "client_training",
    "RecordDP": "client_training",
    "Exchange": "protocol",
    "Protection": "protocol",
    "Spend": "protocol",
    "client_key": "protocol",
    "server_key": "protocol",
    "FedAvg": "algorithms.fedavg",
    "ClientLevelDPFedAvg": "algorithms.client_level_dp_fedavg",
    "FedDPPSO": "algorithms.fed_dp_pso",
    "fedpso": "algorithms.fed_dp_pso",
    "LocalOnly": "algorithms.local_only",
    "centralised_clients": "algorithms.local_only",
    "CombinedAggregator": "combined",
    "PrivacyRecord": "runtime",
    "Result": "runtime",
    "Variants": "runtime",
    "simulate": "runtime",
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
    "DATASETS",
    "SCHEMES",
    "ClientData",
    "ClientLevelDPFedAvg",
    "CombinedAggregator",
    "Dataset",
    "DatasetNotFoundError",
    "Exchange",
    "FedAvg",
    "FedDPPSO",
    "LocalOnly",
    "LocalTraining",
    "Partition",
    "PrivacyRecord",
    "Protection",
    "RecordDP",
    "Result",
    "Spend",
    "Variants",
    "centralised_clients",
    "client",
    "client_key",
    "comm",
    "dirichlet_partition",
    "fedpso",
    "flower_partition",
    "iid_partition",
    "label_skew",
    "load_dataset",
    "partition",
    "pathological_partition",
    "poisson_rates",
    "read_idx",
    "server_key",
    "simulate",
    "stack_clients",
    "subsample",
]
