"""Client data: datasets (:mod:`.datasets`), partitions of a dataset into clients
(:mod:`.partition`) and stacked, padded clients (:mod:`.clients`)."""

from swarmjax.fl.data.clients import (
    ClientData,
    as_test_set,
    check_federated_inputs,
    client,
    poisson_rates,
    stack_clients,
)
from swarmjax.fl.data.datasets import (
    DATASETS,
    MEDMNIST_CLASSES,
    Dataset,
    DatasetNotFoundError,
    load_dataset,
    read_idx,
    subsample,
)
from swarmjax.fl.data.partition import (
    SCHEMES,
    Partition,
    dirichlet_partition,
    flower_partition,
    iid_partition,
    label_skew,
    partition,
    pathological_partition,
)

__all__ = [
    "DATASETS",
    "MEDMNIST_CLASSES",
    "SCHEMES",
    "ClientData",
    "Dataset",
    "DatasetNotFoundError",
    "Partition",
    "as_test_set",
    "check_federated_inputs",
    "client",
    "dirichlet_partition",
    "flower_partition",
    "iid_partition",
    "label_skew",
    "load_dataset",
    "partition",
    "pathological_partition",
    "poisson_rates",
    "read_idx",
    "stack_clients",
    "subsample",
]
