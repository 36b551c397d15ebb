"""Ready-made tasks for deployments and tests: the paper algorithms on scikit-learn's digits
(bundled with scikit-learn, so every node can build its partition offline).

Every algorithm is built by the registry (:func:`swarmjax.fl.algorithms.registry.build`)
from its typed settings, which the run configuration fills by key
(:func:`~swarmjax.fl.algorithms.registry.from_config`: a setting's key is its field name
with ``-`` for ``_``; ``""`` makes an optional one ``None``) and which are checked before
any data is loaded. A new algorithm runs here once its registry entry says ``flower=True``.

Run configuration keys (all optional). The run: ``algorithm`` (one of :data:`ALGORITHMS`,
the names of :mod:`swarmjax.fl.algorithms.registry` the Flower tasks run: ``fedavg``;
``fedprox``; ``dp-fedavg``: client-level DP-FedAvg, adaptive clipping by default;
``dp-ftrl``; ``dp-fedavg-secagg``: distributed DP under real secure aggregation,
:mod:`swarmjax.fl.runtime.flower.secagg`; ``fed-dp-pso``: Fed-DP-PSO with DP-Adam at
``target-epsilon``),
``num-clients`` (3), ``rounds`` (2), ``seed`` (0), ``partition-seed`` (0), ``train-size``
(examples used, 600), ``hidden`` (32), ``epochs`` (1), ``batch-size`` (32),
``eval-batch-size`` (test rows scored at a time; ``""``: all), ``secret-file`` (``""``:
every process draws its own secret from operating-system entropy; a path: reproducible
mode, every process reads the run's secret from that file, which each node must keep
private: :meth:`~swarmjax.privacy.secret.Secret.from_file`), ``delta`` (``""``: swarmjax's
one default, ``min(1e-5, 0.1 / records)``), ``accountant`` (``pld``).

The algorithm's settings (:mod:`swarmjax.fl.algorithms.settings`, defaults in brackets):
for ``fedavg`` ``learning-rate`` (0.1), ``server-lr`` (1.0), ``server-optimizer`` (``""``:
none) and ``cohort`` (``""``: every client); for ``fedprox`` ``learning-rate``, ``mu``
(the proximal weight, 0.01) and ``cohort``; for ``dp-fedavg`` ``client-rate`` (Poisson
rate of clients, 0.7), ``noise-multiplier`` (1.0) or ``epsilon`` (``""``; a user-level
target the noise is calibrated to, with ``noise-multiplier = ""``), ``clip`` (initial clip
norm, 0.1), ``clipping`` (``adaptive`` or ``fixed``), ``learning-rate`` and ``server-lr``;
for ``dp-ftrl`` the same noise, clip, clipping and learning rates, and ``cohort`` (clients
per round, 1), ``factorization`` (``blt``), ``buffers`` (BLT buffers, ``""``:
jax-privacy's choice), ``bands`` (``""``), ``schedule`` (``cyclic``), ``min-separation``
and ``max-participations`` (``""``: the most the cohort allows, as many as fit) and
``noise-cohort`` (``""``: this run's cohort); for ``dp-fedavg-secagg`` ``epsilon`` (required,
with ``noise-multiplier = ""``), ``clip``, the learning rates, ``cohort``, ``schedule``,
``min-separation``, ``max-participations``, ``bits`` (16), ``min-survivors`` (``""``:
``ceil(0.8 cohort)``) and ``max-colluders`` (0); for ``fed-dp-pso`` ``particles`` (3),
``target-epsilon`` (8.0, record-level), ``pso-learning-rate`` (0.005, the DP-Adam step),
``eval-subset`` (rows per client the particles are scored on; ``""``: all),
``selection-metric`` (``loss``), ``refine-start`` (``pbest``), ``reading`` (``paper``; see
:data:`~swarmjax.fl.algorithms.fed_dp_pso.READINGS`) and ``reading-<field>`` keys
replacing one choice of the reading (e.g. ``reading-init = "shared"``; ``""``: the
reading's own). Every process builds the same partitions from these; a SuperNode keeps
only its own.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from swarmjax._validation import check_int
from swarmjax.fl.algorithms import registry
from swarmjax.fl.algorithms.fed_dp_pso import Reading
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data import load_dataset
from swarmjax.fl.data.clients import ClientData, stack_clients
from swarmjax.fl.data.partition import partition
from swarmjax.fl.data.transforms import scale_inputs
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime.flower.task import Task, stacked_task
from swarmjax.models import mlp
from swarmjax.privacy.plan import default_delta
from swarmjax.privacy.secret import Secret

__all__ = ["ALGORITHMS", "digits", "digits_clients"]

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
    """The task the run configuration describes (see the module docs): the algorithm's
    settings read and checked first (:func:`~swarmjax.fl.algorithms.registry.from_config`),
    then the data, then the one registry build."""
    name = registry.lookup(str(config.get("algorithm", "fedavg")), ALGORITHMS).name
    settings = registry.from_config(name, config)
    clients, test = digits_clients(config, settings.inputs())
    records = int(jnp.sum(clients.sizes))
    spec = RunSpec(
        rounds=check_int("rounds", int(config.get("rounds", 2)), 1),
        delta=float(given) if (given := config.get("delta", "")) != "" else default_delta(records),
        accountant=str(config.get("accountant", "pld")),
        seeds=(int(config.get("seed", 0)),),
    )
    training = LocalTraining(
        epochs=int(config.get("epochs", 1)), batch_size=int(config.get("batch-size", 32))
    )
    eval_batch = config.get("eval-batch-size", "")
    base = registry.Base(
        model=mlp((int(config.get("hidden", 32)),), 10, clients.x.shape[2:]),
        training=training,
        spec=spec,
        num_clients=clients.num_clients,
        eval_batch_size=None if eval_batch == "" else int(eval_batch),
        sizes=clients.sizes,
    )
    alg, grid = registry.build(name, base, settings)
    variants = Variants.grid(alg, clients, spec, **grid)
    secret_file = str(config.get("secret-file", ""))
    secret = Secret.from_file(secret_file) if secret_file else None
    return stacked_task(alg, variants, clients, test, secret)
