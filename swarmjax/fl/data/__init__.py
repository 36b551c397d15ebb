"""Client data: datasets (:mod:`.datasets`), partitions of a dataset into clients
(:mod:`.partition`), stacked, padded clients (:mod:`.clients`), and for cross-device
federations a flat client store (:mod:`.store`) and cohort samplers (:mod:`.cohort`);
Shakespeare by speaking role, a natural federation (:mod:`.shakespeare`)."""

from swarmjax.fl.data.clients import (
    ClientData,
    as_test_set,
    check_federated_inputs,
    client,
    poisson_rates,
    stack_clients,
)
from swarmjax.fl.data.cohort import fixed_cohort, poisson_cohort
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
    consecutive_partition,
    dirichlet_partition,
    flower_partition,
    iid_partition,
    label_skew,
    partition,
    pathological_partition,
    power_law_partition,
    shards_partition,
)
from swarmjax.fl.data.shakespeare import (
    ShakespeareFederation,
    ShakespeareNotFoundError,
    load_shakespeare,
)
from swarmjax.fl.data.store import ClientStore, choose_max_rows, gather, memory_estimate

__all__ = [
    "DATASETS",
    "MEDMNIST_CLASSES",
    "SCHEMES",
    "ClientData",
    "ClientStore",
    "Dataset",
    "DatasetNotFoundError",
    "Partition",
    "ShakespeareFederation",
    "ShakespeareNotFoundError",
    "as_test_set",
    "check_federated_inputs",
    "choose_max_rows",
    "client",
    "consecutive_partition",
    "dirichlet_partition",
    "fixed_cohort",
    "flower_partition",
    "gather",
    "iid_partition",
    "label_skew",
    "load_dataset",
    "load_shakespeare",
    "memory_estimate",
    "partition",
    "pathological_partition",
    "poisson_cohort",
    "poisson_rates",
    "power_law_partition",
    "read_idx",
    "shards_partition",
    "stack_clients",
    "subsample",
]
