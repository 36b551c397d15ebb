"""Federated learning, cut by role:

* :mod:`~swarmjax.fl.data`: datasets, partitions of a dataset into clients, stacked clients;
* :mod:`~swarmjax.fl.client`: what runs on ONE client (local training, record-level DP);
* :mod:`~swarmjax.fl.protocol`: the contract between algorithms and runtimes (exchanges,
  message protection, keys, variants);
* :mod:`~swarmjax.fl.algorithms`: one file per algorithm (FedAvg with record-level DP and
  combined learning, FedProx, Fed-DP-PSO and FedPSO, clients alone; user-level DP-FedAvg
  and DP-FTRL as FedAvg plus a privacy plan), and the one registry of their names
  (:mod:`~swarmjax.fl.algorithms.registry`);
* :mod:`~swarmjax.fl.private`: a user-level privacy plan
  (:class:`~swarmjax.privacy.user_level.UserLevelDP`) applied around any summed exchange;
* :mod:`~swarmjax.fl.runtime`: the simulator, its one :class:`Result`, and the Flower runtime
  (:mod:`~swarmjax.fl.runtime.flower`).

See ``docs/federated.md``. Every name below is imported on first access, so
``import swarmjax.fl`` stays light.
"""

import importlib

_LAZY = {
    "LocalTraining": "client.training",
    "RecordDP": "client.training",
    "Algorithm": "protocol",
    "Exchange": "protocol",
    "Protection": "protocol",
    "RunSpec": "protocol",
    "Variants": "protocol",
    "client_key": "protocol",
    "server_key": "protocol",
    "FedAvg": "algorithms.fedavg",
    "FedProx": "algorithms.fedprox",
    "dp_fedavg": "algorithms.client_level_dp_fedavg",
    "dp_ftrl": "algorithms.dp_ftrl",
    "private": "private",
    "Private": "private",
    "Update": "protocol",
    "FedDPPSO": "algorithms.fed_dp_pso",
    "fedpso": "algorithms.fed_dp_pso",
    "LocalOnly": "algorithms.local_only",
    "centralised_clients": "algorithms.local_only",
    "CombinedAggregator": "algorithms.combined",
    "PrivacyRecord": "runtime",
    "Result": "runtime",
    "simulate": "runtime",
    "Execution": "runtime",
    "Publication": "runtime",
}


def _data_names() -> list[str]:
    return list(importlib.import_module("swarmjax.fl.data").__all__)


def __getattr__(name: str):
    # swarmjax.fl.data's names too, imported only when one is asked for (it imports JAX)
    if name == "__all__":
        return sorted({*_LAZY, *_data_names()})
    module = _LAZY.get(name)
    if module is None and not name.startswith("_") and name in _data_names():
        module = "data"
    if module is not None:
        value = getattr(importlib.import_module(f"swarmjax.fl.{module}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'swarmjax.fl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_data_names()))
