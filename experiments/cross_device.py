"""Cross-device federated learning: many clients, a cohort per round, user-level DP.

``python -m experiments.cross_device [--quick | --full]`` trains pfl-research's
``simple_cnn`` (conv 32, conv 64, max-pool, dense 128, dense 10) on offline MNIST or
Fashion-MNIST split into many small clients (``--clients``; IID: a seeded shuffle cut into
equal consecutive chunks, as pfl's benchmark; Dirichlet label skew; McMahan's shards; or
a power law of client sizes), kept as one flat store of rows (memory: the dataset, not
clients x the largest client), ``--cohort``
clients per round, 1 local epoch of SGD at batch 10, and compares FedAvg, FedProx,
FedAdam, FedYogi and user-level DP-FedAvg (fixed or adaptive clipping; a secret Poisson
cohort of expected size ``--cohort`` calibrated to ``--epsilon`` at ``--delta`` by
``--accountant``, its buffer sized by the algorithm's privacy plan).

Results go to ``results/cross_device/``: ``history.csv`` (per seed and round: test accuracy
on ``--test-size`` public test rows, bytes, epsilon), ``summary.csv`` / ``summary.json``
(final accuracy on the whole test set, seconds per round, epsilon and what it covers),
``privacy.json``, the experiment's privacy ledger ``privacy_ledger.json`` / ``.md`` (every
run as a release and the epsilon of publishing the DP ones together), and the figures
``accuracy_per_round.png`` (mean and a band of one std over seeds) and
``accuracy_vs_epsilon.png``. Every algorithm checkpoints its run after each round
(``checkpoints/``, orbax): rerunning the same command resumes a killed run from its
last round and ends with the same numbers (``checkpoints/`` holds private state: it is
marked not released); ``--restart`` starts over.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import time
from pathlib import Path

import jax
import numpy as np
import pandas as pd

from experiments import _cli, _report
from swarmjax.fl.algorithms.client_level_dp_fedavg import ClientLevelDPFedAvg
from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.algorithms.fedprox import FedProx
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data import load_dataset, partition
from swarmjax.fl.data.store import ClientStore
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import simulate
from swarmjax.fl.runtime.simulator import CHECKPOINT_NOT_RELEASED
from swarmjax.models import evaluate, simple_cnn
from swarmjax.privacy.ledger import Ledger
from swarmjax.privacy.plan import default_delta

ALGORITHMS = ("fedavg", "fedprox", "fedadam", "fedyogi", "dp-fedavg", "dp-fedavg-adaptive")
PARTITIONS = ("consecutive", "dirichlet", "shards", "power_law")
EVAL_BATCH = 250  # test rows per evaluation chunk: a one-pass CNN evaluation of 1,000 rows
# holds ~0.8 GiB of activations (measured); chunks keep a run's peak memory to the cohort's


@dataclasses.dataclass(frozen=True)
class Profile:
    """One run of the experiment (every option of the command line)."""

    dataset: str
    clients: int
    rows_per_client: int | None  # consecutive: rows per client (None: all rows split)
    cohort: int
    rounds: int
    algorithms: tuple[str, ...]
    epsilon: float
    delta: float | None  # None: default_delta(clients) = 0.1 / clients
    seeds: tuple[int, ...]
    partition: str
    test_size: int
    accountant: str = "pld"
    client_lr: float = 0.1
    server_lr: float = 1.0
    clip: float = 0.4
    mu: float = 0.01
    adaptive_server_lr: float = 0.01  # FedAdam / FedYogi


PROFILES = {
    "quick": Profile(
        dataset="mnist",
        clients=100,
        rows_per_client=50,
        cohort=10,
        rounds=3,
        algorithms=("fedavg", "dp-fedavg"),
        epsilon=8.0,
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
        epsilon=2.0,
        delta=None,
        seeds=(0,),
        partition="consecutive",
        test_size=2000,
    ),
}
PROFILES["full"] = dataclasses.replace(
    PROFILES["default"], rounds=100, algorithms=ALGORITHMS, seeds=(0, 1), test_size=10000
)


def _parser() -> argparse.ArgumentParser:
    p = _cli.parser(
        "cross_device",
        __doc__.split("\n\n")[0],
        quick="CI: 100 clients, cohort 10, 3 rounds, FedAvg and DP-FedAvg",
        full="every algorithm, 1,200 clients of 50 rows, cohort 50, 100 rounds, 2 seeds",
        data="mnist/ or fashion_mnist/ (IDX files)",
        seeds="quick 1, default 1, full 2",
        privacy="clients",
    )
    p.add_argument(
        "--dataset",
        choices=("mnist", "fashion_mnist", "digits"),
        help="default mnist; digits (8x8, bundled with scikit-learn) needs no data folder",
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
    p.add_argument(
        "--algorithm", nargs="+", choices=ALGORITHMS, help="default fedavg fedadam dp-fedavg"
    )
    p.add_argument(
        "--epsilon",
        type=_cli.positive_float("--epsilon"),
        help="user-level target epsilon of the DP algorithms (default 2)",
    )
    p.add_argument(
        "--partition",
        choices=PARTITIONS,
        help="consecutive (default: seeded shuffle, equal chunks), dirichlet (alpha 0.5), "
        "shards (2 label-sorted shards per client), power_law (sizes ~ Pareto 1.5, >= 10)",
    )
    p.add_argument("--test-size", type=_cli.count("--test-size"), help="public test rows per round")
    return p


def profile(args: argparse.Namespace) -> Profile:
    """The profile of ``--quick`` / default / ``--full`` with every given option applied,
    checked before any work (one-line errors naming the option)."""
    base = PROFILES[_cli.profile_name(args)]
    given = {
        "dataset": args.dataset,
        "clients": args.clients,
        "rows_per_client": args.rows_per_client,
        "cohort": args.cohort,
        "rounds": args.rounds,
        "algorithms": tuple(args.algorithm) if args.algorithm else None,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "accountant": args.accountant,
        "partition": args.partition,
        "test_size": args.test_size,
        "seeds": tuple(range(args.seeds)) if args.seeds else None,
    }
    prof = dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})
    if prof.cohort > prof.clients:
        raise _cli.UserError(f"--cohort {prof.cohort} must be <= --clients {prof.clients}")
    return prof


def clients_and_test(prof: Profile, data_dir: Path | None):
    """The clients as one flat :class:`~swarmjax.fl.data.store.ClientStore` and the public
    test set (the first ``test_size`` rows for the per-round curve, all for the end)."""
    data = load_dataset(prof.dataset, data_dir)
    n = len(data.y_train)
    rows = prof.rows_per_client if prof.partition == "consecutive" else None
    if prof.clients * (rows or 1) > n:
        raise _cli.UserError(
            f"--clients x --rows-per-client = {prof.clients * (rows or 1)} exceeds the {n} "
            f"training rows of {prof.dataset}"
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
        raise _cli.UserError(f"--partition {prof.partition}: {err}") from None
    store = ClientStore.build(data.x_train, data.y_train, part.indices)
    test = (data.x_test[: prof.test_size], data.y_test[: prof.test_size])
    return store, test, (data.x_test, data.y_test)


def algorithm(name: str, prof: Profile, clients) -> tuple:
    """``(algorithm, grid values)`` of ``name`` under ``prof``."""
    model = simple_cnn(10, clients.example_shape)
    local = LocalTraining(epochs=1, batch_size=10, optimizer="sgd")
    ev = {"eval_batch_size": EVAL_BATCH}
    lr = {"learning_rate": prof.client_lr}
    if name in ("fedavg", "fedadam", "fedyogi"):
        server = {"fedavg": None, "fedadam": "adam", "fedyogi": "yogi"}[name]
        alg = FedAvg(model, local, cohort=prof.cohort, server_optimizer=server, **ev)
        slr = prof.server_lr if server is None else prof.adaptive_server_lr
        return alg, {**lr, "server_lr": slr}
    if name == "fedprox":
        return FedProx(model, local, cohort=prof.cohort, **ev), {**lr, "mu": prof.mu}
    q = prof.cohort / prof.clients
    clipping = "adaptive" if name.endswith("adaptive") else "fixed"
    # the algorithm's privacy plan sizes the Poisson buffer for this run
    alg = ClientLevelDPFedAvg.for_run(
        model, prof.clients, q, spec(prof), prof.epsilon, training=local, clipping=clipping, **ev
    )
    grid = {
        "sample_rate": q,
        "initial_clip": prof.clip,
        "client_lr": prof.client_lr,
        "server_lr": prof.server_lr,
        "epsilon_target": [prof.epsilon],
    }
    return alg, grid


def _delta(prof: Profile) -> float:
    return default_delta(prof.clients) if prof.delta is None else prof.delta


def spec(prof: Profile) -> RunSpec:
    """Rounds, delta, seeds and accountant of every run of ``prof``."""
    return RunSpec(prof.rounds, _delta(prof), prof.seeds, accountant=prof.accountant)


def run_one(
    name: str, prof: Profile, clients, test, full_test, out: Path, ledger: Ledger | None = None
) -> dict:
    """One algorithm's run (checkpointed per round): its history and summary row; its runs
    go into ``ledger`` as releases written to ``history.csv``."""
    alg, grid = algorithm(name, prof, clients)
    variants = Variants.grid(alg, clients, spec(prof), **grid)
    t0 = time.perf_counter()
    res = simulate(
        alg,
        clients,
        test,
        variants,
        rounds_per_call=1,
        client_map=None,  # the device's choice: convolutions run one client at a time on a CPU
        progress=True,
        checkpoint_dir=out / "checkpoints" / name,
    )
    if ledger is not None:  # under the experiment's name for the algorithm
        ledger.add_result(res, algorithm=name, path=str(out / "history.csv"))
        ledger.mark_not_released(out / "checkpoints" / name, CHECKPOINT_NOT_RELEASED)
    wall = time.perf_counter() - t0
    params = res.server.params
    finals = [
        float(
            evaluate(alg.model.apply, jax.tree.map(lambda a, i=i: a[i], params), *full_test, 2000)[
                1
            ]
        )
        for i in range(len(prof.seeds))
    ]
    history = res.history.assign(algorithm=name)
    eps = res.privacy.final_epsilon.max(axis=1)
    row = {
        "algorithm": name,
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
    }
    return {"history": history, "row": row}


def figures(history: pd.DataFrame, out: Path) -> None:
    """Accuracy per round (mean, one-std band over seeds) and against epsilon."""
    _report.per_round(
        history.assign(federation="cross-device"),
        "test_accuracy",
        out / "accuracy_per_round.png",
        panel="federation",
        line="algorithm",
        ylabel="test accuracy",
        panel_title=lambda _: "Cross-device: accuracy per round",
    )
    dp = history[np.isfinite(history["epsilon_max"])]
    if len(dp):
        fig, axes = _report.grid(1, 1, width=6, height=4)
        ax = axes[0, 0]
        for name, g in dp.groupby("algorithm"):
            _report.band(ax, g, "test_accuracy", x="epsilon_max", label=name, marker=".")
        ax.set(
            xlabel="epsilon spent (user-level)",
            ylabel="test accuracy",
            title=_report.title("Cross-device: accuracy vs epsilon"),
        )
        ax.legend(fontsize=8)
        _report.save(fig, out / "accuracy_vs_epsilon.png")


@_cli.entry_point
def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    prof = profile(args)
    data_dir = None if prof.dataset == "digits" else _cli.data_dir(args.data_dir)
    out = _cli.out_dir(args)
    if args.restart:
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
    ledger = Ledger(out, "cross_device", accountant=prof.accountant)
    clients, test, full_test = clients_and_test(prof, data_dir)
    print(
        f"{prof.clients} clients of {int(clients.sizes.min())}-{int(clients.sizes.max())} rows "
        f"({prof.partition}), cohort {prof.cohort}, {prof.rounds} rounds, seeds {prof.seeds}",
        flush=True,
    )
    histories, rows = [], []
    for name in prof.algorithms:
        got = run_one(name, prof, clients, test, full_test, out, ledger)
        histories.append(got["history"])
        rows.append(got["row"])
        print(
            f"{name}: accuracy {got['row']['final_accuracy']:.4f}, epsilon "
            f"{got['row']['epsilon']:.3g}, {got['row']['seconds_per_round']:.2f} s/round",
            flush=True,
        )
    history = pd.concat(histories, ignore_index=True)
    history.to_csv(out / "history.csv", index=False)
    table = pd.DataFrame(rows)
    table.drop(columns=["covers", "not_covered"]).to_csv(out / "summary.csv", index=False)
    summary = {"profile": dataclasses.asdict(prof), "delta": _delta(prof), "runs": rows}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    privacy = {
        r["algorithm"]: {
            k: r[k]
            for k in (
                "epsilon",
                "delta",
                "accountant",
                "relation",
                "covers",
                "not_covered",
                "floating_point",
            )
        }
        for r in rows
    }
    (out / "privacy.json").write_text(json.dumps(privacy, indent=1, default=str))
    figures(history, out)
    cols = ["algorithm", "final_accuracy", "epsilon", "seconds_per_round"]
    print(table[cols].to_markdown(index=False, floatfmt=".4g"))
    _report.write_ledger(ledger)
    print(f"results in {out}")


if __name__ == "__main__":
    main()
