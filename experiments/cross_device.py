"""Cross-device federated learning: many clients, a cohort per round, user-level DP.

``python -m experiments.cross_device [--quick | --full]`` trains pfl-research's
``simple_cnn`` (conv 32, conv 64, max-pool, dense 128, dense 10; ``--model``) on MNIST or
Fashion-MNIST split into many small clients (``--clients``; IID: a seeded shuffle cut into
equal consecutive chunks, as pfl's benchmark; Dirichlet label skew; McMahan's shards; or
a power law of client sizes), kept as one flat store of rows (memory: the dataset, not
clients x the largest client), ``--cohort``
clients per round, 1 local epoch of SGD at batch 10 (``--epochs``, ``--batch-size``,
``--learning-rate``, ``--max-examples``: a per-round cap on each client's rows), and
compares the algorithms of
:mod:`swarmjax.fl.algorithms.registry` (``--algorithms``): FedAvg, FedProx, FedAdam, FedYogi,
user-level DP-FedAvg (fixed or adaptive clipping; a secret Poisson cohort of expected size
``--cohort``, its buffer sized by the algorithm's privacy plan) and user-level DP-FTRL
(fixed clipping; public cohorts of ``--cohort``, each client at most
``--max-participations`` times at least ``--min-separation`` rounds apart by a ``--schedule``,
correlated noise of a ``--factorization``; no amplification). Each DP algorithm runs once
per ``--epsilons`` (several allowed), calibrated at ``--delta`` by ``--accountant``.
``--noise-cohort M`` (DP-FTRL, never the default) calibrates the noise for a deployment with
cohorts of ``M`` as pfl's benchmarks do: the epsilon then holds only for such a deployment,
and the records and the printed summary say so.

Results go to ``results/cross_device/``: ``history.csv`` (per seed and round: test accuracy
on the first ``--test-size`` test rows, bytes, epsilon), ``summary.csv`` / ``summary.json``
(final accuracy on the whole test set, seconds per round, epsilon and what it covers,
the devices and the layout line of ``--devices``; ``test_sets`` says which rows each uses;
the run's peak memory),
``privacy.json``, the experiment's privacy ledger ``privacy_ledger.json`` / ``.md`` (every
run as a release and the epsilon of publishing the DP ones together; the wall times, which
follow the secret cohorts, listed as not covered), and the figures
``accuracy_per_round.png`` (mean and a band of one std over seeds, one line per run) and
``accuracy_vs_epsilon.png`` (final accuracy against the accounted epsilon, one line per DP
algorithm over its ``--epsilons`` runs), titled with the dataset, clients, cohort, rounds and
epsilon. Every
algorithm checkpoints its run after each round (``checkpoints/``, orbax): rerunning the
same command resumes a killed run from its last round and ends with the same numbers
(``checkpoints/`` holds private state: it is marked not released); ``--restart`` starts
over.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import shutil
import time
from pathlib import Path

import jax
import numpy as np
import pandas as pd
from jax.sharding import Mesh

from experiments import _cli, _report
from swarmjax.device import default_eval_batch
from swarmjax.fl.algorithms import registry
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data import partition
from swarmjax.fl.data.store import ClientStore
from swarmjax.fl.distributed import Distributed
from swarmjax.fl.private import Private
from swarmjax.fl.protocol import Algorithm, RunSpec, Variants
from swarmjax.fl.runtime import Execution, simulate
from swarmjax.fl.runtime.simulator import CHECKPOINT_NOT_RELEASED
from swarmjax.models import evaluate, lenet5, mlp, simple_cnn
from swarmjax.privacy.canaries import DEFAULT_CANARIES, CanaryAudit
from swarmjax.privacy.distributed import DistributedDP
from swarmjax.privacy.ftrl import FACTORIZATIONS, SCHEDULES
from swarmjax.privacy.ledger import Ledger, releases_from_result
from swarmjax.privacy.secret import Secret
from swarmjax.privacy.user_level import UserLevelDP

ALGORITHMS = registry.names(cross_device=True)
DP_ALGORITHMS = registry.names(cross_device=True, user_dp=True)
SECAGG = "dp-fedavg-secagg"  # accounted by RDP alone: it sets the accountant of a run
OPTIONS = tuple(dict.fromkeys(o for n in ALGORITHMS for o in registry.lookup(n).options))
"""Options of one algorithm only (the registry's :attr:`~registry.Entry.options`: DP-FTRL's)."""
PARTITIONS = ("consecutive", "dirichlet", "shards", "power_law")
MODELS = {
    "simple_cnn": simple_cnn,  # pfl-research's benchmark CNN (1.2 M parameters on MNIST)
    "lenet5": lambda classes, shape: lenet5(classes, shape),  # 44,426 parameters on MNIST
    "mlp": lambda classes, shape: mlp((256, 256), classes, shape),  # 784-256-256-10
}
"""``--model``: name -> ``builder(num_classes, input_shape)``."""
# Test rows per evaluation chunk: swarmjax.device.default_eval_batch() (25 on a CPU, 250 on
# an accelerator). A one-pass CNN evaluation of 1,000 rows holds ~0.8 GiB of activations;
# chunks keep a run's peak memory to the cohort's (--quick peaked at 4.3 GiB with a final
# evaluation in chunks of 2,000, 1.53 GiB at 250, 1.39 GiB at 125 and 1.17-1.20 GiB at 25:
# issue 38's target is 1.5 GiB), and on a CPU they spare each round's page faults


@dataclasses.dataclass(frozen=True)
class Profile:
    """One run of the experiment (every option of the command line)."""

    dataset: str
    clients: int
    rows_per_client: int | None  # consecutive: rows per client (None: all rows split)
    cohort: int
    rounds: int
    algorithms: tuple[str, ...]
    epsilons: tuple[float, ...]  # one run of each DP algorithm per target
    delta: float | None  # None: the plan's default for clients (UserLevelDP.delta_for)
    seeds: tuple[int, ...]
    partition: str
    test_size: int
    accountant: str = "pld"
    model: str = "simple_cnn"  # a name of MODELS
    batch_size: int = 10
    epochs: int = 1
    max_examples: int | None = None  # per-round cap on a client's rows (None: all)
    learning_rate: float = 0.1
    server_lr: float = 1.0
    clip: float = 0.4
    mu: float = 0.01
    adaptive_server_lr: float = 0.01  # FedAdam / FedYogi
    # DP-FTRL (registry.FTRL_OPTIONS): None: the most the cohort allows / as many as fit
    factorization: str = "blt"
    schedule: str = "cyclic"
    min_separation: int | None = None
    max_participations: int | None = None
    noise_cohort: int | None = None  # pfl's noise_cohort_size: never the default
    # distributed DP (registry.SECAGG_OPTIONS; None: DistributedDP's defaults)
    bits: int | None = None
    min_survivors: int | None = None
    max_colluders: int | None = None
    dropout: float | None = None
    audit: int | None = None  # client-level canaries in every DP run (docs/audits.md)

    def options(self, name: str) -> dict:
        """The settings of algorithm ``name`` alone (its registry entry's
        :attr:`~registry.Entry.options`: DP-FTRL's) as the registry takes them."""
        return {k: getattr(self, k) for k in registry.lookup(name).options}


PROFILES = {
    "quick": Profile(
        dataset="mnist",
        clients=100,
        rows_per_client=50,
        cohort=10,
        rounds=3,
        algorithms=("fedavg", "dp-fedavg"),
        epsilons=(8.0,),
        delta=None,
        seeds=(0,),
        partition="consecutive",
        test_size=1000,
    ),
    "default": Profile(
        dataset="mnist",
        clients=1200,
        rows_per_client=50,
        cohort=50,
        rounds=30,
        algorithms=("fedavg", "fedadam", "dp-fedavg"),
        epsilons=(2.0,),
        delta=None,
        seeds=(0,),
        partition="consecutive",
        test_size=2000,
    ),
}
PROFILES["full"] = dataclasses.replace(
    PROFILES["default"],
    rounds=100,
    algorithms=ALGORITHMS,
    epsilons=(2.0, 8.0),
    seeds=(0, 1),
    test_size=10000,
)


def _parser() -> argparse.ArgumentParser:
    p = _cli.parser(
        "cross_device",
        __doc__.split("\n\n")[0],
        quick="CI: 100 clients, cohort 10, 3 rounds, FedAvg and DP-FedAvg",
        full="every algorithm, 1,200 clients of 50 rows, cohort 50, 100 rounds, 2 seeds, "
        "epsilon 2 and 8",
        data="mnist/ or fashion_mnist/ (IDX files)",
        seeds="quick 1, default 1, full 2",
        privacy="clients",
    )
    p.add_argument(
        "--datasets",
        nargs="+",
        choices=("mnist", "fashion_mnist", "digits"),
        metavar="NAME",
        help="the dataset, one per call (its figures and ledger are one dataset's): mnist "
        "(default), fashion_mnist, or digits (8x8, bundled with scikit-learn: no data folder)",
    )
    p.add_argument("--clients", type=_cli.count("--clients", 2), help="N (default 1200)")
    p.add_argument(
        "--rows-per-client",
        type=_cli.count("--rows-per-client"),
        help="rows each client holds under --partition consecutive (default 50; the "
        "training set must have clients x rows)",
    )
    p.add_argument("--cohort", type=_cli.count("--cohort"), help="clients per round (50)")
    p.add_argument("--rounds", type=_cli.count("--rounds"), help="rounds (default 30)")
    train = p.add_argument_group("the clients' model and training (every algorithm)")
    train.add_argument(
        "--model",
        choices=tuple(MODELS),
        help="simple_cnn (default; pfl's benchmark CNN, 1.2 M parameters), lenet5 (44,426) or "
        "mlp (784-256-256-10, 269,322)",
    )
    train.add_argument(
        "--batch-size", type=_cli.count("--batch-size"), help="local batch size B (default 10)"
    )
    train.add_argument(
        "--epochs", type=_cli.count("--epochs"), help="local epochs E a round (default 1)"
    )
    train.add_argument(
        "--learning-rate",
        type=_cli.positive_float("--learning-rate"),
        help="clients' SGD learning rate (default 0.1)",
    )
    train.add_argument(
        "--server-lr",
        type=_cli.positive_float("--server-lr"),
        help="server learning rate of FedAvg, FedProx and the DP algorithms (default 1; "
        "FedAdam's and FedYogi's is 0.01)",
    )
    train.add_argument(
        "--clip",
        type=_cli.positive_float("--clip"),
        help="user-level clip norm of the DP algorithms (default 0.4; adaptive clipping's "
        "initial one)",
    )
    train.add_argument(
        "--max-examples",
        type=_cli.count("--max-examples"),
        metavar="ROWS",
        help="per-round cap on each client's work: a larger client trains on ROWS of its "
        "rows drawn afresh each round (default: no cap, the algorithm as published; at least "
        "--batch-size)",
    )
    p.add_argument(
        "--algorithms",
        nargs="+",
        choices=ALGORITHMS,
        help="default fedavg fedadam dp-fedavg; "
        + "; ".join(f"{n}: {registry.lookup(n).description}" for n in ALGORITHMS),
    )
    p.add_argument(
        "--epsilons",
        nargs="+",
        type=_cli.epsilon_target("--epsilons"),
        help="user-level target epsilon(s) of the DP algorithms, one run each (default 2; "
        "quick 8; full 2 8)",
    )
    ftrl = p.add_argument_group(
        "DP-FTRL (--algorithms dp-ftrl; the schedule options also set dp-fedavg-secagg's cohorts)"
    )
    ftrl.add_argument(
        "--factorization",
        choices=FACTORIZATIONS,
        help="the noise's matrix factorization: blt (default, buffered Toeplitz), banded, "
        "prefix-sum (independent noise: DP-SGD's)",
    )
    ftrl.add_argument(
        "--min-separation",
        type=_cli.count("--min-separation"),
        help="b: fewest rounds between two participations of a client (default the most the "
        "cohort allows, min(clients // cohort, rounds))",
    )
    ftrl.add_argument(
        "--max-participations",
        type=_cli.count("--max-participations"),
        help="k: participations per client (default as many as fit, ceil(rounds / b))",
    )
    ftrl.add_argument(
        "--schedule",
        choices=SCHEDULES,
        help="who takes part when: cyclic (default; a public seeded cycle), random (drawn "
        "among the clients allowed), single (each client at most once)",
    )
    ftrl.add_argument(
        "--noise-cohort",
        type=_cli.count("--noise-cohort", 2),
        metavar="M",
        help="pfl's noise_cohort_size: calibrate the noise for a deployment with cohorts of M "
        "(> --cohort); epsilon then holds ONLY for such a deployment, not for this run "
        "(never the default)",
    )
    secagg = p.add_argument_group(
        "distributed DP under secure aggregation (--algorithms dp-fedavg-secagg; its cohorts "
        "follow --schedule, --min-separation and --max-participations)"
    )
    secagg.add_argument(
        "--bits",
        type=_cli.count("--bits", 8),
        help="bits per uploaded coordinate, 8..32 (default 16): the secure sum lives modulo "
        "2^bits; too few for the cohort and epsilon is refused with the bits that work",
    )
    secagg.add_argument(
        "--min-survivors",
        type=_cli.count("--min-survivors"),
        help="the secure-aggregation threshold: a round with fewer surviving clients is "
        "refused (default ceil(0.8 cohort))",
    )
    secagg.add_argument(
        "--max-colluders",
        type=_cli.count("--max-colluders", 0),
        help="clients assumed able to collude with the server; their noise is not counted "
        "(default 0)",
    )
    secagg.add_argument(
        "--dropout",
        type=_cli.probability("--dropout"),
        help="simulated chance that a client drops after masking (default 0)",
    )
    p.add_argument(
        "--partition",
        choices=PARTITIONS,
        help="consecutive (default: seeded shuffle, equal chunks), dirichlet (alpha 0.5), "
        "shards (2 label-sorted shards per client), power_law (sizes ~ Pareto 1.5, >= 10)",
    )
    p.add_argument("--test-size", type=_cli.count("--test-size"), help="public test rows per round")
    _cli.add_devices(p)
    p.add_argument(
        "--audit",
        type=_cli.count("--audit", 2),
        nargs="?",
        const=DEFAULT_CANARIES,
        metavar="N",
        help="empirical privacy audit: N client-level canaries in every DP run (--audit alone: "
        f"{DEFAULT_CANARIES}, sized to see a 4x noise error; docs/audits.md); each run's lower "
        "bound, power and verdict are printed beside its accounted epsilon and written to the "
        "ledger",
    )
    return p


TRAINING = (
    "model",
    "batch_size",
    "epochs",
    "learning_rate",
    "server_lr",
    "clip",
    "max_examples",
)
"""Profile fields set by the training options of the command line (same dest names)."""


def _one_dataset(names: list[str] | None) -> str | None:
    """The one dataset of ``--datasets`` (``None`` when not given); two are refused."""
    if names is not None and len(names) > 1:
        raise _cli.UserError(
            f"--datasets {' '.join(names)}: cross_device runs one dataset per call (its "
            "figures and ledger are one dataset's); run it once per dataset, each with its "
            "own --out"
        )
    return None if names is None else names[0]


def profile(args: argparse.Namespace) -> Profile:
    """The profile of ``--quick`` / default / ``--full`` with every given option applied,
    checked before any work (one-line errors naming the option)."""
    base = PROFILES[_cli.profile_name(args)]
    given = {
        "dataset": _one_dataset(args.datasets),
        "clients": args.clients,
        "rows_per_client": args.rows_per_client,
        "cohort": args.cohort,
        "rounds": args.rounds,
        "algorithms": tuple(args.algorithms) if args.algorithms else None,
        "epsilons": tuple(args.epsilons) if args.epsilons else None,
        "delta": args.delta,
        "accountant": args.accountant,
        "partition": args.partition,
        "test_size": args.test_size,
        "seeds": tuple(range(args.seeds)) if args.seeds else None,
        **{k: getattr(args, k) for k in TRAINING},
        **{k: getattr(args, k) for k in OPTIONS},
        "audit": args.audit,
    }
    prof = dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})
    if prof.cohort > prof.clients:
        raise _cli.UserError(
            f"{_cli.setting(args, 'cohort', prof.cohort, 'cohort')} must be <= "
            f"{_cli.setting(args, 'clients', prof.clients, 'number of clients')}"
        )
    if prof.max_examples is not None and prof.max_examples < prof.batch_size:
        raise _cli.UserError(
            f"{_cli.setting(args, 'max_examples', prof.max_examples, 'per-client cap')} must "
            f"be at least {_cli.setting(args, 'batch_size', prof.batch_size, 'batch size')}: "
            "one batch"
        )
    rows = prof.rows_per_client if prof.partition == "consecutive" else None
    if rows is not None and rows < prof.batch_size:
        raise _cli.UserError(  # else each client's one batch is silently all its rows
            f"{_cli.setting(args, 'batch_size', prof.batch_size, 'batch size')} exceeds "
            f"{_cli.setting(args, 'rows_per_client', rows, 'rows per client')}"
            ": lower --batch-size (or raise --rows-per-client)"
        )
    if prof.partition != "consecutive":
        _cli.refuse_unused(
            args, ["rows_per_client"], f"--partition {prof.partition} sizes the clients itself"
        )
    if not any(a in DP_ALGORITHMS for a in prof.algorithms):
        why = f"none of the algorithms {' '.join(prof.algorithms)} is DP"
        _cli.refuse_unused(
            args, ["epsilons"], f"{why} (add one of {', '.join(DP_ALGORITHMS)} to --algorithms)"
        )
        _cli.warn_unused(args, ["delta", "accountant"], f"{why}: they only label the records")
        _cli.refuse_unused(args, ["audit"], f"{why}: a non-private run has no epsilon to audit")
    if prof.audit is not None and prof.noise_cohort is not None:
        raise _cli.UserError(
            "--audit with --noise-cohort: that epsilon is another deployment's, so this run "
            "has none to audit (drop one of them)"
        )
    if len(set(prof.epsilons)) != len(prof.epsilons):
        raise _cli.UserError(f"--epsilons gives a value twice: {' '.join(map(str, args.epsilons))}")
    for option in OPTIONS:  # an algorithm's own option without that algorithm
        takers = [n for n in ALGORITHMS if option in registry.lookup(n).options]
        if not set(takers) & set(prof.algorithms):
            what = " or ".join(n.upper() for n in takers)
            add = " or ".join(takers)
            _cli.refuse_unused(args, [option], f"it is a {what} option (add {add} to --algorithms)")
    if SECAGG in prof.algorithms and prof.accountant != "rdp":
        if "accountant" in _cli.given(args):
            raise _cli.UserError(
                f"--accountant {args.accountant} with --algorithms {SECAGG}: its Skellam noise "
                "is accounted by RDP only (dp-accounting's PLD cannot represent it); use "
                "--accountant rdp or leave it out"
            )
        prof = dataclasses.replace(prof, accountant="rdp")  # every record and the ledger
    if prof.schedule == "single":
        _cli.refuse_unused(
            args,
            ["min_separation", "max_participations"],
            "--schedule single takes each client at most once (b = rounds, k = 1)",
        )
    if prof.dataset == "digits":
        _cli.refuse_unused(args, ["data_dir"], "--datasets digits ships with scikit-learn")
    if prof.model == "lenet5" and EXAMPLE[prof.dataset][0] < 28:
        raise _cli.UserError(
            f"--model lenet5 needs 28x28 examples (two VALID 5x5 convolutions and a pool); "
            f"{_cli.setting(args, 'datasets', prof.dataset, 'dataset')} has "
            f"{EXAMPLE[prof.dataset][0]}x{EXAMPLE[prof.dataset][1]}: use simple_cnn or mlp"
        )
    _cli.check_memory(memory_estimate(prof), *_memory_option(args, prof))
    return prof


TRAIN_ROWS = {"mnist": 60_000, "fashion_mnist": 60_000, "digits": 1_437}
EXAMPLE = {"mnist": (28, 28, 1), "fashion_mnist": (28, 28, 1), "digits": (8, 8, 1)}


def memory_estimate(prof: Profile) -> int:
    """Bytes a run of ``prof`` allocates, estimated before any work (:func:`_cli.array_bytes`):
    the training set, one client store, and per cohort slot (a DP cohort's buffer holds up
    to twice the expected cohort) its gathered rows and four model-sized arrays (the model,
    its update, the optimiser's state), for every seed; DP-FTRL's noise state is up to ten
    model-sized buffers per seed (a BLT's; a band's ``min(b, 32)``)."""
    from swarmjax.models import param_count

    shape = EXAMPLE[prof.dataset]
    rows = prof.rows_per_client or max(1, TRAIN_ROWS[prof.dataset] // prof.clients)
    if prof.partition != "consecutive":
        rows = max(1, TRAIN_ROWS[prof.dataset] // prof.clients)  # the mean; the largest is more
    if prof.max_examples is not None:
        rows = min(rows, prof.max_examples)
    params = param_count(jax.eval_shape(model(prof).init, jax.random.key(0)))
    dp = any(a in DP_ALGORITHMS for a in prof.algorithms)
    slots = (2 if dp else 1) * prof.cohort * len(prof.seeds)
    noise = (32 if prof.factorization == "banded" else 10) if "dp-ftrl" in prof.algorithms else 0
    # dp-fedavg-secagg: each cohort slot's upload, its masked copy and a mask being added
    # (uint32 words of the rotated model: as many as a model-sized float32 array)
    noise += 3 * prof.cohort if "dp-fedavg-secagg" in prof.algorithms else 0
    return _cli.array_bytes(
        (2, TRAIN_ROWS[prof.dataset], *shape),
        (slots, rows, *shape),
        (slots, 4, params),
        (prof.clients, 4),
        (len(prof.seeds), noise, params),
    )


def _memory_option(args: argparse.Namespace, prof: Profile) -> tuple[str, str]:
    """The option a memory refusal names (one the user gave: --cohort, --clients, --seeds,
    else --cohort) and what the estimate holds."""
    option = _cli.option_named(args, ["cohort", "clients", "seeds", "rows_per_client"])
    what = (
        f"{prof.dataset}, {prof.clients} clients, cohort {prof.cohort}, {len(prof.seeds)} "
        "seed(s): the data, each cohort slot's rows and model-sized arrays"
    )
    return option, what


def clients_and_test(prof: Profile, data_dir: Path | None, args: argparse.Namespace):
    """The clients as one flat :class:`~swarmjax.fl.data.store.ClientStore` and the public
    test set (the first ``test_size`` rows for the per-round curve, all for the end)."""
    source = _cli.data_source(args)
    data = _cli.load_dataset(prof.dataset, data_dir, source)
    n = len(data.y_train)
    rows = prof.rows_per_client if prof.partition == "consecutive" else None
    if prof.clients * (rows or 1) > n:
        clients = _cli.setting(args, "clients", prof.clients, "number of clients")
        per = _cli.setting(args, "rows_per_client", rows or 1, "rows per client")
        raise _cli.UserError(
            f"{clients} x {per} = {prof.clients * (rows or 1)} rows exceed the {n} training "
            f"rows of {prof.dataset}: lower --clients or --rows-per-client"
        )
    kw = {
        "consecutive": {"size": rows},
        "dirichlet": {"alpha": 0.5},
        "shards": {"shards_per_client": 2},
        "power_law": {"exponent": 1.5, "min_size": 10},
    }[prof.partition]
    try:
        part = partition(data.y_train, prof.clients, prof.partition, seed=0, **kw)
    except ValueError as err:
        how = _cli.setting(args, "partition", prof.partition, "partition")
        raise _cli.UserError(f"{how}: {err}; change --clients or --partition") from None
    if prof.test_size > len(data.y_test):
        size = _cli.setting(args, "test_size", prof.test_size, "per-round test size")
        raise _cli.UserError(
            f"{size} exceeds the {len(data.y_test)} test rows of {prof.dataset}: lower --test-size"
        )
    store = ClientStore.build(data.x_train, data.y_train, part.indices)
    test = (data.x_test[: prof.test_size], data.y_test[: prof.test_size])
    return store, test, (data.x_test, data.y_test)


_FIELDS = {  # settings that start a library refusal: the Profile field (and the option's
    # dest) of the same name, as a message names a value the user did not give
    "min_separation": "min separation",
    "max_participations": "max participations",
    "noise_cohort": "noise cohort",
    "cohort": "cohort",
    "schedule": "schedule",
    "bits": "bits per coordinate",
}


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of the experiment, its algorithm built before any work.

    Attributes:
        name: the registry's name of the algorithm.
        epsilon: its target epsilon (``None`` without DP).
        label: what names its checkpoints and its rows.
        setup: the registry's :class:`~swarmjax.fl.algorithms.registry.CrossDeviceRun`.
        algorithm: the algorithm (a :class:`~swarmjax.fl.private.Private` for a DP one).
        grid: its values for :meth:`~swarmjax.fl.protocol.Variants.grid`.
        mesh: the device mesh its cohort is split over (``None``: one device;
            :func:`experiments._cli.layout`, ``--devices``).
        layout: one line saying how it is laid out over the devices.
        variants: its resolved variants (the noise calibrated, every value checked
            against the clients: :func:`resolved`), or ``None`` until the clients are
            loaded.
    """

    name: str
    epsilon: float | None
    label: str
    setup: registry.CrossDeviceRun
    algorithm: Algorithm
    grid: dict
    mesh: Mesh | None = None
    layout: str = ""
    variants: Variants | None = None

    @property
    def plan(self) -> UserLevelDP | DistributedDP | None:
        """The run's user-level privacy plan (``None`` without DP): what its epsilon covers,
        its settings and its ledger entry are the plan's answers."""
        return self.algorithm.plan if isinstance(self.algorithm, Private | Distributed) else None


def planned(args: argparse.Namespace, prof: Profile) -> list[Run]:
    """Every run of ``prof`` (:func:`runs`), its algorithm built by the registry before any
    work (a DP-FTRL scheme checked, a DP-FedAvg buffer sized, a target's reachability
    checked) and laid out over ``--devices`` (:func:`experiments._cli.layout`): a refusal
    is one line naming the option (the one given, or the profile's value and the option
    that changes it)."""
    out = []
    for name, eps, label in runs(prof):
        setup = cross_device_run(prof, name, eps)
        try:
            alg, grid = registry.cross_device(name, setup)
        except ValueError as err:
            raise _cli.UserError(_refusal(args, prof, name, err)) from None
        asked = "devices" in _cli.given(args)
        mesh, line = _cli.layout(alg, prof.clients, name, _cli.devices(args), asked)
        out.append(Run(name, eps, label, setup, alg, grid, mesh, line))
    return out


def resolved(args: argparse.Namespace, prof: Profile, todo: list[Run], clients) -> list[Run]:
    """Every run of ``todo`` with its variants resolved against ``clients`` (the noise
    calibrated to its target, every value checked: what needs the data and the model's
    size, such as the bits a distributed plan's secure sum must carry), before any run
    starts: a refusal is one line naming the option."""
    out = []
    for run in todo:
        try:
            variants = Variants.grid(run.algorithm, clients, spec(prof), **run.grid)
        except ValueError as err:
            raise _cli.UserError(_refusal(args, prof, run.name, err)) from None
        out.append(dataclasses.replace(run, variants=variants))
    return out


def _refusal(args: argparse.Namespace, prof: Profile, name: str, err: ValueError) -> str:
    """The library's refusal ``err`` of algorithm ``name``'s build, naming the option."""
    dest, _, rest = str(err).partition(" ")
    dest = dest.partition("=")[0]  # "bits=8 cannot ...": the setting, its value named below
    what = _FIELDS.get(dest)
    if what is None:
        return f"--algorithms {name}: {err}"
    value = getattr(prof, dest)
    named = _cli.setting(args, dest, value, what)
    if value is None:  # the default: the most the cohort allows / as many as fit
        named = f"the default {what} ({_cli.option_named(args, [dest])} changes it)"
    rest = re.sub(r"; got [^;]*$", "", rest)  # the value is named already
    return f"--algorithms {name}: {named} {rest}"


def cross_device_run(prof: Profile, name: str, epsilon: float | None) -> registry.CrossDeviceRun:
    """The registry's :class:`~swarmjax.fl.algorithms.registry.CrossDeviceRun` of ``prof``
    for algorithm ``name`` (with its own options: DP-FTRL's) at target ``epsilon``
    (``None`` for the non-DP algorithms)."""
    return registry.CrossDeviceRun(
        model(prof),
        prof.clients,
        prof.cohort,
        spec(prof),
        LocalTraining(
            epochs=prof.epochs,
            batch_size=prof.batch_size,
            optimizer="sgd",
            max_examples=prof.max_examples,
        ),
        epsilon=epsilon,
        learning_rate=prof.learning_rate,
        server_lr=prof.server_lr,
        adaptive_server_lr=prof.adaptive_server_lr,
        clip=prof.clip,
        mu=prof.mu,
        eval_batch_size=default_eval_batch(),
        options=prof.options(name),
    )


def model(prof: Profile):
    """The clients' model of ``prof`` (``--model``) for its dataset's examples."""
    return MODELS[prof.model](10, EXAMPLE[prof.dataset])


def runs(prof: Profile) -> list[tuple[str, float | None, str]]:
    """``(algorithm, target epsilon or None, label)`` of every run, in order: one run per
    non-DP algorithm, one per ``--epsilons`` of each DP one; the label names its checkpoints
    (the algorithm's name alone when it has one run)."""
    out = []
    for name in prof.algorithms:
        if name not in DP_ALGORITHMS:
            out.append((name, None, name))
            continue
        for eps in prof.epsilons:
            label = name if len(prof.epsilons) == 1 else f"{name}-epsilon-{eps:g}"
            out.append((name, eps, label))
    return out


SHORTEN = "--rounds, --cohort, --model, --max-examples or fewer --algorithms/--epsilons"
"""What the pace warning names as the options that shorten a run (:class:`_cli.Pace`)."""

TIMING_NOT_COVERED = (
    "the wall time of a DP run follows its secret randomness and its clients' data (one "
    "client at a time skips the unused slots of a secret Poisson cohort; local steps follow "
    "the selected clients' sizes), which the accounting assumes hidden; no epsilon covers it"
)
PUBLIC_FILES = {
    "summary.csv": "per run: final accuracy of the released models on the public test split and "
    "the accounting (post-processing of the releases); the wall time, listed as not covered",
    "summary.json": "summary.csv's rows, the settings (public), which test rows each number "
    "uses and the process's peak memory (static shapes: a function of the settings)",
    "privacy.json": "per run, its accounting: epsilon, delta, relation, what it covers (functions "
    "of the public settings)",
    "accuracy_per_round.png": "figure of history.csv",
    "accuracy_vs_epsilon.png": "figure of summary.csv",
    "epsilon_rounds.png": "figure of history.csv's accounted epsilon per round (functions of "
    "the public settings)",
}
"""Files under ``--out`` besides the ledger's release paths and not-released folders: each
holds public settings, or is computed only from the releases and public data (so it is as
private as the releases it repeats); tests/test_released_files.py checks every file."""


def guarantee(run: Run) -> str:
    """What a run's epsilon means, as its plan says (:meth:`UserLevelDP.guarantee`: its own
    user-level guarantee, or with ``--noise-cohort M`` one for a deployment with cohorts of
    ``M`` only); none without DP."""
    return "none (no DP)" if run.plan is None else run.plan.guarantee()


def _delta(prof: Profile) -> float:
    return UserLevelDP.delta_for(prof.clients, prof.delta)


def spec(prof: Profile) -> RunSpec:
    """Rounds, delta (``--delta``, else the user-level plan's default for the clients),
    seeds and accountant of every run of ``prof``."""
    return RunSpec(prof.rounds, _delta(prof), prof.seeds, accountant=prof.accountant)


def add_to_ledger(ledger: Ledger, res, run: Run, path: str, data: str | None = None) -> None:
    """Every run of ``res`` into ``ledger`` under the algorithm's name (``data``: the
    dataset's name), each as its plan says a ledger must list it
    (:meth:`UserLevelDP.released`: a ``--noise-cohort`` run with no epsilon covering it,
    so the experiment's composed statement claims nothing this run lacks)."""
    releases = releases_from_result(res, algorithm=run.name, path=path, data=data)
    for r in releases:
        ledger.add(r if run.plan is None else run.plan.released(r))


def run_one(
    run: Run,
    prof: Profile,
    clients,
    test,
    full_test,
    out: Path,
    ledger: Ledger | None = None,
    secret: Secret | None = None,
    pace: _cli.Pace | None = None,
) -> dict:
    """One run, resolved against ``clients`` (:func:`resolved`; checkpointed per round
    under its label): its history and summary row; its runs go into ``ledger`` as
    releases written to ``history.csv``. ``secret``: the
    supplied secret (``--secret-file``; this run's is derived from it by the label), else a
    fresh one saved with the checkpoints. ``pace``: a callback that prints the time left."""
    name, label, plan = run.name, run.label, run.plan
    variants = run.variants
    if variants is None:  # main resolves every run before the first (resolved)
        raise ValueError(f"run {label!r} was not resolved against the clients (resolved())")
    audit = None if prof.audit is None or plan is None else CanaryAudit(prof.audit)
    t0 = time.perf_counter()
    res = simulate(
        run.algorithm,
        clients,
        test,
        variants,
        audit=audit,
        secret=None if secret is None else secret.derive(f"cross_device/{label}"),
        execution=Execution(
            rounds_per_call=1,
            client_map=None,  # the device's choice: convolutions run one client at a time on a CPU
            progress=_cli.progress_bars(),
            checkpoint_dir=out / "checkpoints" / label,
            callbacks=() if pace is None else (pace,),
            mesh=run.mesh,
        ),
    )
    if ledger is not None:  # under the experiment's name for the algorithm
        add_to_ledger(ledger, res, run, str(out / "history.csv"), prof.dataset)
        ledger.mark_not_released(out / "checkpoints" / label, CHECKPOINT_NOT_RELEASED)
    wall = time.perf_counter() - t0
    params = res.server.params
    # in default_eval_batch() chunks: one chunk of 2,000 rows held 1.3 GB of the CNN's
    # activations, the experiment's peak (issue 38)
    apply = run.setup.model.apply
    pick = [jax.tree.map(lambda a, i=i: a[i], params) for i in range(len(prof.seeds))]
    chunk = default_eval_batch()
    finals = [float(evaluate(apply, p, *full_test, chunk)[1]) for p in pick]
    target = math.nan if run.epsilon is None else run.epsilon
    history = res.history.assign(algorithm=name, run=label, epsilon_target=target)
    eps = res.privacy.final_epsilon.max(axis=1)
    row = {
        "algorithm": name,
        "run": label,
        "epsilon_target": target,
        "final_accuracy": float(np.mean(finals)),
        "final_accuracy_std": float(np.std(finals, ddof=1)) if len(finals) > 1 else math.nan,
        "epsilon": float(np.max(eps)),
        "delta": variants.spec.delta,
        "accountant": res.privacy.accountant,
        "floating_point": res.privacy.floating_point,
        "relation": getattr(res.privacy, "relation", res.privacy.unit),
        "seconds_per_round": wall / prof.rounds,
        "wall_seconds": wall,
        "covers": list(res.privacy.covers),
        "not_covered": list(res.privacy.not_covered),
        "guarantee": guarantee(run),
        "devices": 1 if run.mesh is None else int(run.mesh.devices.size),
        "layout": run.layout,
    }
    if plan is not None:  # the plan's settings as they hold (a DP-FTRL's b and k)
        row.update(plan.settings(prof.clients, prof.rounds))
    if audit is not None:  # the largest lower bound over the seeds (each seed's in the ledger)
        row["epsilon_lower"] = max(r.epsilon_lower for r in res.audit)
    own = plan is None or plan.own_guarantee
    return {"history": history, "row": row, "audit": res.audit, "own_guarantee": own}


def setting_text(prof: Profile, rows: list[dict] = ()) -> str:
    """The run's setting as figure titles state it: dataset, clients, cohort, rounds,
    epsilon (and, for a run whose plan calibrated the noise for another cohort, that its
    epsilon holds only there)."""
    dp = [a for a in prof.algorithms if a in DP_ALGORITHMS]
    targets = ", ".join(f"{e:g}" for e in prof.epsilons)
    eps = f", DP at epsilon {targets} (user-level)" if dp else ", no DP"
    elsewhere = {(r["algorithm"], r["noise_cohort"]) for r in rows if r.get("noise_cohort")}
    for name, cohort in sorted(elsewhere):
        eps += f"; {name}'s epsilon only for cohorts of {cohort}"
    return (
        f"{prof.dataset}, {prof.clients} clients ({prof.partition}), cohort {prof.cohort}, "
        f"{prof.rounds} rounds{eps}"
    )


def curve_test_set(prof: Profile, test_rows: int) -> str:
    """Which test rows the per-round curve uses (the summary uses the whole test set)."""
    return f"the first {test_rows} rows of the {prof.dataset} test split"


def figures(
    history: pd.DataFrame, rows: list[dict], out: Path, prof: Profile, test_rows: int
) -> None:
    """Accuracy per round (mean, one-std band over seeds, one line per run), the final
    accuracy (whole test set) against the accounted epsilon, one line per DP algorithm over
    its runs, and the accounted epsilon against the round of every DP run
    (:func:`_report.plot_epsilon_rounds`; a noise-cohort run's curve is its simulated
    deployment's, and its legend says so); the titles say the dataset, clients, cohort,
    rounds and epsilon, the axes which test rows."""
    ylabel = f"test accuracy ({test_rows} test rows)"
    _report.per_round(
        history.assign(federation="cross-device"),
        "test_accuracy",
        out / "accuracy_per_round.png",
        panel="federation",
        line="run",
        ylabel=ylabel,
        panel_title=lambda _: "Accuracy per round",
        suptitle=f"Cross-device: {setting_text(prof, rows)}; curve on "
        f"{curve_test_set(prof, test_rows)}",
    )
    dp = [r for r in rows if r["algorithm"] in DP_ALGORITHMS]
    if dp:
        fig, axes = _report.grid(1, 1)
        ax = axes[0, 0]
        targets = {r["epsilon_target"] for r in dp}
        if len(targets) == 1:  # one epsilon: a labelled bar per algorithm, never a lone dot
            frame = pd.DataFrame(dp)
            _report.curves(
                ax, frame, "final_accuracy", line="algorithm", x="epsilon_target",
                xlabel="epsilon (user-level target)",
            )  # fmt: skip
        else:
            for name in dict.fromkeys(r["algorithm"] for r in dp):
                mine = sorted((r for r in dp if r["algorithm"] == name), key=lambda r: r["epsilon"])
                eps = [r["epsilon"] for r in mine]
                acc = [r["final_accuracy"] for r in mine]
                std = [np.nan_to_num(r["final_accuracy_std"]) for r in mine]  # one seed: none
                ax.errorbar(eps, acc, yerr=std, label=name, marker="o", capsize=3)
            _report.log_x(ax, [r["epsilon"] for r in dp])
            ax.set_xlabel("epsilon (user-level, accounted)")
        ax.set(ylabel=f"final test accuracy (all {prof.dataset} test rows)")
        ax.set_title("Accuracy vs epsilon")
        ax.legend()
        _report.save(fig, out / "accuracy_vs_epsilon.png", caption=setting_text(prof, rows))
        elsewhere = {r["run"]: r["noise_cohort"] for r in dp if r.get("noise_cohort")}
        _report.plot_epsilon_rounds(
            history,
            out / "epsilon_rounds.png",
            by="run",
            label=lambda run: (
                run + (f" (cohorts of {elsewhere[run]} only)" if run in elsewhere else "")
            ),
            ylabel="user-level epsilon (accounted)",
            caption=f"Cross-device: {setting_text(prof, rows)}",
        )


@_cli.entry_point
def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    _cli.process_options(args)  # before anything compiles
    prof = profile(args)
    todo = planned(args, prof)  # every run's algorithm, built (and refused) before any work
    out = _cli.out_dir(args)
    data_dir = None if prof.dataset == "digits" else _cli.data_dir(args.data_dir)
    if args.restart:
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
    ledger = Ledger(out, "cross_device", accountant=prof.accountant)
    clients, test, full_test = clients_and_test(prof, data_dir, args)
    asked, count = "devices" in _cli.given(args), _cli.devices(args)
    todo = [  # each layout line now says whether the store's data is split too
        dataclasses.replace(r, layout=_cli.layout(r.algorithm, clients, r.name, count, asked)[1])
        for r in resolved(args, prof, todo, clients)
    ]
    test_sets = {
        "history": f"{curve_test_set(prof, len(test[1]))} (test_accuracy per round)",
        "summary": f"all {len(full_test[1])} rows of the {prof.dataset} test split "
        "(final_accuracy of the last round's model)",
    }
    print(
        f"{prof.clients} clients of {int(clients.sizes.min())}-{int(clients.sizes.max())} rows "
        f"({prof.partition}), cohort {prof.cohort}, {prof.rounds} rounds, seeds {prof.seeds}",
        flush=True,
    )
    print(_cli.memory_line(memory_estimate(prof)), flush=True)
    histories, rows, elsewhere = [], [], []
    for i, run in enumerate(todo):
        label, later = run.label, len(todo) - 1 - i
        pace = _cli.Pace(prof.rounds, later * prof.rounds, later, SHORTEN)
        print(f"{label}: {run.layout}", flush=True)
        got = run_one(
            run,
            prof,
            clients,
            test,
            full_test,
            out,
            ledger,
            secret=_cli.supplied_secret(args),
            pace=pace,
        )
        histories.append(got["history"])
        rows.append(got["row"])
        if not got["own_guarantee"]:  # its epsilon is a simulated deployment's (the plan's)
            elsewhere.append(got["row"])
        print(
            f"{label}: accuracy {got['row']['final_accuracy']:.4f}, epsilon "
            f"{got['row']['epsilon']:.3g}, {got['row']['seconds_per_round']:.2f} s/round",
            flush=True,
        )
        for report in got["audit"]:  # empirical lower bounds, not guarantees (docs/audits.md)
            print(f"  {label}: accounted epsilon {report.epsilon:.3f}; {report.line()}")
    history = pd.concat(histories, ignore_index=True)
    history.to_csv(out / "history.csv", index=False)
    table = pd.DataFrame(rows)
    table.drop(columns=["covers", "not_covered"]).to_csv(out / "summary.csv", index=False)
    summary = {
        "profile": dataclasses.asdict(prof),
        "delta": _delta(prof),
        "test_sets": test_sets,
        "runs": rows,
    }
    reasons = {
        "final_accuracy_std": "one seed: no std",
        "epsilon": "no DP: epsilon is infinite",
        "epsilon_target": "no DP: no target epsilon",
        "epsilon_lower": "not audited (no --audit, or a run without DP)",
    }
    _report.write_json(out / "summary.json", summary, reasons)
    privacy = {
        r["run"]: {
            k: r[k]
            for k in (
                "epsilon",
                "delta",
                "accountant",
                "relation",
                "covers",
                "not_covered",
                "floating_point",
                "guarantee",
            )
        }
        for r in rows
    }
    _report.write_json(out / "privacy.json", privacy, reasons)
    figures(history, rows, out, prof, len(test[1]))
    cols = ["run", "final_accuracy", "epsilon", "seconds_per_round"]
    print(table[cols].to_markdown(index=False, floatfmt=".4g"))
    for r in elsewhere:
        print(f"{r['run']}: epsilon {r['epsilon']:.3g} {r['guarantee']}")
    print(f"per-round curve: {test_sets['history']}; summary: {test_sets['summary']}")
    if any(run.plan is not None for run in todo):
        _report.not_covered(
            ledger, "wall-clock timing", out / "summary.csv", TIMING_NOT_COVERED,
            delta=_delta(prof), columns="seconds_per_round, wall_seconds (summary.csv/.json)",
        )  # fmt: skip
    _report.write_ledger(ledger)
    _report.finish(out, out / "summary.json")


if __name__ == "__main__":
    main()
