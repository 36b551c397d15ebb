"""swarmjax: a JAX-accelerated, vectorised swarm engine for privacy-preserving federated learning.

Start with docs/quickstart.md (your data to clients, an NNX model, user-level DP with a
cohort, the privacy record and ledger, your own algorithm, Flower). Front doors, by job:

Federated learning (``docs/federated.md``)
    ``from swarmjax.fl import load_dataset, partition, stack_clients``: data to clients
    (``ClientStore`` for thousands of clients, ``docs/cross_device.md``).
    ``from swarmjax.models import from_nnx, from_flax, from_haiku, mlp``: a model as an
    ``(init, apply)`` pair (Flax NNX, Flax linen, Haiku, the papers' models).
    ``from swarmjax.fl import FedAvg, dp_fedavg, private, LocalTraining, RecordDP``:
    algorithms (``swarmjax.fl.algorithms``: FedProx, Fed-DP-PSO, ...), user-level DP as a
    plan on any summed algorithm (``private(alg, UserLevelDP(...))``) and local training
    with record-level DP-SGD.
    ``from swarmjax.fl import RunSpec, Variants, simulate``: state a call once, sweep
    hyper-parameters and targets, run; ``simulate`` returns a ``Result`` (``history``,
    ``privacy``, ``server``).
    ``from swarmjax.fl import Execution, Publication``: ``simulate``'s options, how a call
    runs (``execution=``: client map, mesh, checkpoints, progress, callbacks; never the
    numbers) and what it publishes (``publication=``: ledger, path, data source).
    ``from swarmjax.fl.protocol import Algorithm, Exchange, Slots``: write your own
    algorithm; ``swarmjax.fl.runtime.flower`` runs it on Flower (``docs/flower.md``).

Privacy (``docs/privacy.md``, ``docs/ledger.md``)
    ``from swarmjax.privacy.user_level import UserLevelDP``: participation, clipping,
    noise and accounting of user-level DP as one plan, applied to any summed algorithm by
    ``swarmjax.fl.private``; ``from swarmjax.privacy import PrivacyPlan, default_delta``:
    buffers, calibration; ``from swarmjax.privacy import Ledger``: every release of an
    experiment, composed; ``swarmjax.privacy.dpsgd``: DP-SGD steps for your own loop.

Swarms (``docs/paaso.md``)
    ``swarmjax.swarm`` (PSO as pure functions), ``swarmjax.paaso`` (the PAASO strategies),
    ``swarmjax.objectives`` (f1-f8), ``swarmjax.sweep.run_sweep`` (grids of runs on every
    device, resumable).

Experiments reproduce the papers: ``python -m experiments.<name> --help`` (README.md).
Subpackages are imported on demand, so ``import swarmjax`` stays light.
"""

__version__ = "0.1.0"

from swarmjax import _moved

_moved.install()  # old module paths of swarmjax.fl and swarmjax.flower, for one release
