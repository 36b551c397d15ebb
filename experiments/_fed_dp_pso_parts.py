"""Parts of ``experiments.fed_dp_pso`` around its runs: the paper's reference numbers
(Tables 1-2), the command-line flags, the Fig. 3 baseline (FedAvg + DP-Adam), the
communication table, the figures and the runs as privacy-ledger releases
(:func:`swarmjax.privacy.ledger.saved_releases`). ``experiments.fed_dp_pso`` re-exports
the public names; its saved calls are keyed by this module's source too.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import fields
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, get_args, get_origin, get_type_hints

import numpy as np
import pandas as pd

from experiments import _cli, _report
from swarmjax.fl import DATASETS
from swarmjax.fl.algorithms import registry
from swarmjax.fl.algorithms.fed_dp_pso import DEFAULT_READING, READINGS, Reading
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import Execution, simulate
from swarmjax.privacy.canaries import CanaryAudit, CanaryReport
from swarmjax.privacy.ledger import Ledger, saved_releases
from swarmjax.privacy.plan import default_delta
from swarmjax.privacy.secret import Secret

if TYPE_CHECKING:
    from experiments.fed_dp_pso import Profile

PAPER = {  # spec 2.5: (mean, std) per (dataset, partition, epsilon)
    "mnist": {
        "dir0.3": [(72.31, 5.78), (74.61, 5.12), (76.24, 3.97), (88.69, 3.53)],
        "dir1": [(85.08, 1.12), (86.54, 1.62), (87.89, 1.09), (94.85, 0.91)],
        "iid": [(88.12, 0.78), (89.21, 0.33), (89.59, 0.58), (96.41, 0.23)],
    },
    "fashion_mnist": {
        "dir0.3": [(58.92, 6.60), (61.18, 7.58), (62.06, 6.73), (69.82, 7.53)],
        "dir1": [(76.12, 1.19), (76.93, 1.22), (77.20, 1.24), (81.86, 1.70)],
        "iid": [(81.34, 0.41), (81.83, 0.35), (82.06, 0.43), (85.66, 0.99)],
    },
}
EPS_COLS = (5.0, 8.0, 10.0, math.inf)
PARTITIONS = ("iid", "dir0.3", "dir1")  # Tables 1-2's column groups
FIG3 = "pathmnist"  # the paper's Fig. 3 dataset (LeNet-5); --full adds it when found
READING_FIELDS = tuple(f.name for f in fields(Reading) if f.name != "about")


def paper_accuracy(name: str, part: str, eps: float) -> tuple[float, float]:
    """The paper's (mean, std) accuracy in % of a table cell; NaNs where it has none."""
    table = PAPER.get(name, {}).get(part)
    return table[EPS_COLS.index(eps)] if table and eps in EPS_COLS else (math.nan, math.nan)


_READING_FLOATS = {  # how each float choice is parsed
    "init_scale": _cli.positive_float("--init-scale"),
    "velocity_clamp": _cli.positive_float("--velocity-clamp", allow_inf=True),
    "decay": _cli.positive_float("--decay", allow_zero=True),
}


def _reading_flag(name: str) -> dict:
    """argparse keywords of ``--<name>``: a :class:`Reading` field (choices from its type)."""
    kind = get_type_hints(Reading)[name]
    if get_origin(kind) is Literal:
        how = {"choices": get_args(kind)}
    else:
        how = {bool: {"choices": ("no", "yes")}, int: {"type": _cli.count(f"--{name}")}}.get(
            kind, {"type": _READING_FLOATS.get(name)}
        )
    return dict(how, help=f"replace the reading's {name} (docs/fed_dp_pso.md)")


_OPTIONS = {  # the other flags: argparse keywords
    "--datasets": dict(nargs="+", choices=DATASETS, help="e.g. mnist (Table 1 only); pathmnist "
                       "(colour: LeNet-5) when its .npz is found"),
    "--epsilons": dict(nargs="+", type=_cli.epsilon_target("--epsilons", allow_inf=True),
                       help="target epsilons, 'inf' for no DP (--full: 5 8 10 inf; else 5 inf)"),
    "--partitions": dict(nargs="+", choices=PARTITIONS, help="column groups (quick: iid; "
                         "default: iid dir1; full: all); they share one padded shape"),
    "--rounds": dict(type=_cli.count("--rounds"), help="R (default 10; quick 2)"),
    "--particles": dict(type=_cli.count("--particles"), default=5, help="S, particles per client"),
    "--batch-size": dict(type=_cli.count("--batch-size"), help="B, expected Poisson batch (full "
                         "256, else 64)"),
    "--runtime": dict(choices=("simulator", "flower"), default="simulator", help="flower: "
                      "digits over a SuperLink + 3 SuperNodes on 127.0.0.1 beside the "
                      "simulator, with this reading and these flags"),
    "--learning-rate": dict(type=_cli.positive_float("--learning-rate"), help="eta of "
                            "(DP-)Adam (default: 0.005 for the MLPs, 0.001 for the CNN)"),
    "--refine-start": dict(choices=("pbest", "position"), default="pbest", help="DP-Adam "
                           "refines the best pbest (default) or best moved position"),
    "--selection-metric": dict(choices=("loss", "error"), default="loss", help="particles "
                               "scored by cross-entropy (the paper) or error rate"),
    "--client-map": dict(choices=("vmap", "sequential"), help="clients as a vmap axis or one "
                         "after another (full: sequential, else vmap)"),
    "--n-train": dict(type=_cli.count("--n-train", 0), help="train subset (0: all rows)"),
    "--eval-subset": dict(type=_cli.count("--eval-subset", 0), help="rows/client (0: all)"),
    "--no-fig3": dict(action="store_true", help="skip the FedAvg + DP baseline"),
    "--audit": dict(type=_cli.count("--audit", 2), help="empirical privacy audit: N record-level "
                    "gradient canaries in every client of every DP run (docs/audits.md); each "
                    "run's lower bound is printed beside its accounted epsilon and written to "
                    "the ledger; the Fig. 3 FedAvg + DP-Adam baseline is audited alike; the "
                    "inf target is not"),
}  # fmt: skip


def parser(description: str) -> argparse.ArgumentParser:
    """The command line of ``experiments.fed_dp_pso`` (``description``: its first line)."""
    p = _cli.parser(
        "fed_dp_pso",
        description,
        quick="CI: digits, 2 rounds, 1 seed",
        full="Tables 1-2: full grid, 5 seeds",
        data="mnist/, fashion_mnist/ (IDX), medmnist/pathmnist.npz",
        seeds="quick 1, default 2, full 5",
        privacy="records",
    )
    for flag, kw in _OPTIONS.items():
        p.add_argument(flag, **kw)
    about = "; ".join(f"{k}: {v.about}" for k, v in READINGS.items())
    p.add_argument(
        "--reading",
        choices=tuple(READINGS),
        default=DEFAULT_READING,
        help=f"a named set of the design choices below (each flag overrides it): {about}",
    )
    for name in READING_FIELDS:
        p.add_argument(f"--{name.replace('_', '-')}", **_reading_flag(name))
    return p


def record_delta(delta: float | None, sizes: Any) -> float:
    """``delta`` (``--delta``) when given, else swarmjax's one default ``0.1 / records`` of
    the clients' record counts ``sizes``."""
    return default_delta(int(np.sum(sizes))) if delta is None else float(delta)


def eps_of(res, eps: float) -> tuple[float, float]:
    """(largest client epsilon at the end, largest sigma) of the runs at target ``eps``."""
    rows = res.runs["epsilon_target"].to_numpy() == eps
    return (
        float(np.max(res.privacy.final_epsilon[rows])),
        float(np.max(res.privacy.noise_multiplier[rows])),
    )


class Dataset(NamedTuple):
    """What Fig. 3 and the communication table need of one dataset's run: the iid (else the
    first) partition's clients."""

    ds: Any
    clients: Any
    model: Any
    batch_size: int
    lr: float
    iid: bool


def print_audits(label: str, releases: list[dict]) -> None:
    """One line per audited run of a call (``releases``: its ledger releases), ``label``
    first (e.g. ``"digits iid"``): the target, the seed and the canaries' report (the
    empirical lower bound beside the accounted record-level epsilon, docs/audits.md)."""
    for r in releases:
        if r.get("audit"):
            report = CanaryReport.from_dict(r["audit"])
            target = r["variant"].get("epsilon_target")
            print(f"  audit {label} eps={target} seed={r['seed']}: {report.line()}")


def _fedavg(
    d: Dataset,
    eps: float,
    rounds: int,
    seeds: int,
    prof: Profile,
    path: str,
    *,
    secret: Secret | None = None,
):
    """FedAvg + DP-Adam (plain Adam at ``inf``) on ``d``'s clients: (history, ``{"epsilon_max",
    "epsilon_lower", "releases": its runs as ledger releases written at path}``); ``secret``:
    the call's (:meth:`~swarmjax.resume.CallStore.secret`). With
    ``prof.audit`` every DP run carries ``prof.audit`` record-level gradient canaries per
    client (``FedAvg(audit=...)``); ``epsilon_lower`` is the largest bound over the seeds
    (``None``: not audited)."""
    sizes = np.asarray(d.clients.sizes)
    delta = record_delta(prof.delta, sizes)
    spec = RunSpec(rounds, delta, tuple(range(seeds)), accountant=prof.accountant)
    audit = None if prof.audit is None else CanaryAudit(prof.audit, score="gradient")
    training = LocalTraining(batch_size=d.batch_size, optimizer="adam")
    base = registry.Base(d.model, training, spec, len(sizes), sizes=sizes, audit=audit)
    chosen = registry.settings("fedavg", learning_rate=d.lr, record_epsilon=eps)
    alg, grid = registry.build("fedavg", base, chosen)  # DP-Adam sized for the run (or none)
    variants = Variants.grid(alg, d.clients, spec, **{**grid, "learning_rate": [d.lr]})
    test = (d.ds.x_test, d.ds.y_test)
    res = simulate(
        alg,
        d.clients,
        test,
        variants,
        secret=secret,
        execution=Execution(progress=_cli.progress_bars()),
    )
    releases = saved_releases(res, algorithm="fedavg_dp_adam", path=path, data=d.ds.name)
    lower = max((r.epsilon_lower for r in res.audit), default=None) if res.audit else None
    privacy = {"epsilon_max": eps_of(res, eps)[0], "epsilon_lower": lower}
    return res.history, {**privacy, "releases": releases}


def fig3(
    name: str,
    d: Dataset,
    prof: Profile,
    cells: list,
    rounds: pd.DataFrame,
    store,
    out,
    ledger: Ledger,
):
    """Fed-DP-PSO against FedAvg + DP-Adam at every epsilon on ``name``'s iid clients,
    printed and written to ``fig3.csv`` (its runs go into ``ledger``): (table rows, FedAvg
    history, both histories)."""
    rows, histories = [], []
    for eps in prof.epsilons:
        run = partial(_fedavg, d, eps, prof.rounds, prof.seeds, prof, str(out / "fig3.csv"))
        history, privacy, _ = store.fetch_or_run(f"fig3_{name}_eps{eps:g}", run, with_secret=True)
        ledger.add_saved(privacy["releases"])
        print_audits(f"fedavg {name} iid", privacy["releases"])
        histories.append(history.assign(dataset=name, method="fedavg"))
        last = history[history["round"] == prof.rounds]
        b_mean, b_std = _report.mean_std(last.test_accuracy, 100)
        key = (name, "iid", eps)
        ours = next(c for c in cells if (c["dataset"], c["partition"], c["epsilon"]) == key)
        rows.append(dict(dataset=name, epsilon=eps, fed_dp_pso=ours["acc_mean"],
                         fed_dp_pso_std=ours["acc_std"], fedavg_dp=b_mean, fedavg_dp_std=b_std,
                         fedavg_epsilon_max=privacy["epsilon_max"]))  # fmt: skip
        if privacy.get("epsilon_lower") is not None:  # audited: the baseline's bound too
            rows[-1]["fedavg_epsilon_lower"] = privacy["epsilon_lower"]
        pd.DataFrame(rows).to_csv(out / "fig3.csv", index=False)
    fedavg = pd.concat(histories)
    ours = rounds[(rounds.dataset == name) & (rounds.partition == "iid")]
    what = "on PathMNIST" if name == FIG3 else "stand-in for PathMNIST"
    print(f"\nFig. 3 {what}: {name} ({d.model.name})")
    shown = pd.DataFrame(rows)
    shown = shown.astype(object).where(shown.notna(), None)  # no std from one seed: "-"
    print(shown.to_markdown(index=False, floatfmt=".2f", missingval="-"))
    return rows, fedavg, pd.concat([ours, fedavg])


def _comm(
    name: str,
    d: Dataset,
    pso: pd.DataFrame,
    fedavg: pd.DataFrame | None,
    store,
    ledger: Ledger,
    prof: Profile,
    path: str,
):
    """Bytes per round the simulator counted for Fed-DP-PSO (``pso``: its history on
    ``d``'s clients) and FedAvg (``fedavg``: Fig. 3's history on the same clients, else one
    round of FedAvg without DP, which goes into ``ledger`` as written at ``path``)."""
    if fedavg is None:
        run = partial(_fedavg, d, math.inf, 1, 1, prof, path)
        fedavg, payload, _ = store.fetch_or_run(f"comm_{name}", run, with_secret=True)
        ledger.add_saved(payload["releases"])
    row = {"dataset": name}
    for method, h in (("pso", pso), ("fedavg", fedavg)):
        for way in ("up", "down"):
            per_round = h[f"bytes_{way}"].unique()  # every round moves the same bytes
            if len(per_round) != 1:
                raise RuntimeError(f"{method} moved different bytes per round: {per_round}")
            row[f"{method}_{way}"] = int(per_round[0])
    return {**row, "upload_saving": 1.0 - row["pso_up"] / row["fedavg_up"]}


def comm_table(
    kept: dict, rounds: pd.DataFrame, fedavg: dict, store, out: Path, ledger: Ledger, prof: Profile
) -> list:
    """The communication table (``kept``: each dataset's :class:`Dataset`; ``fedavg``: the
    Fig. 3 histories by dataset), printed and written to ``comm.csv``: its rows.  A dataset
    without a Fig. 3 history runs one round of FedAvg without DP, listed in ``ledger``."""
    comm = []
    for name, d in kept.items():
        part = "iid" if d.iid else rounds[rounds.dataset == name].partition.iloc[0]
        pso = rounds[(rounds.dataset == name) & (rounds.partition == part)]
        path = str(out / "comm.csv")
        comm.append(_comm(name, d, pso, fedavg.get(name), store, ledger, prof, path))
    pd.DataFrame(comm).to_csv(out / "comm.csv", index=False)
    print("\nCommunication per round (bytes):\n" + pd.DataFrame(comm).to_markdown(index=False))
    return comm


def figures(
    rounds: pd.DataFrame, fig3: pd.DataFrame | None, out: Path, setting: str | None = None
) -> None:
    """Column-sized figures (experiments._report): Fig. 2 (accuracy per round, a panel per
    partition, a band per epsilon) of every dataset; Fig. 3 (a panel per epsilon:
    Fed-DP-PSO against FedAvg + DP-Adam); the accounted epsilon per round of every run with
    DP steps (``epsilon_rounds.png``, a panel per dataset).  ``setting`` (clients,
    particles, rounds) goes into each caption line."""
    acc = dict(scale=100, ylabel="test accuracy (%)", marker="o")
    more = f"; {setting}" if setting else ""
    names = {"fed_dp_pso": "Fed-DP-PSO", "fedavg": "FedAvg + DP-Adam"}
    for name, sub in rounds.groupby("dataset"):
        path = out / f"fig2_accuracy_per_round_{name}.png"
        caption = f"Fig. 2: Fed-DP-PSO on {name}{more}"
        _report.per_round(sub, "test_accuracy", path, panel="partition", line="epsilon_target",
                          label=lambda e: f"eps={e:g}", caption=caption, **acc)  # fmt: skip
    if fig3 is not None:
        name = fig3.dataset.iloc[0]
        title = f"Fig. 3: {name}" + ("" if name == FIG3 else " (stand-in for PathMNIST)")
        _report.per_round(fig3, "test_accuracy", out / "fig3_vs_fedavg_dp.png",
                          caption=title + more, panel="epsilon_target", line="method",
                          label=names.get, panel_title=lambda e: f"eps={e:g}", **acc)  # fmt: skip
    runs = rounds if fig3 is None else pd.concat([rounds, fig3[fig3.method == "fedavg"]])
    runs = runs.assign(partition=runs["partition"].fillna("iid"))  # Fig. 3 runs iid only

    def label(method: str, partition: str, target: str) -> str:
        who = "/".join(names.get(m, m) for m in method.split("/"))
        return f"{who}, {partition}, target {target}"

    _report.plot_epsilon_rounds(
        runs,
        out / "epsilon_rounds.png",
        by=["method", "partition", "epsilon_target"],
        label=label,
        panel="dataset",
        ylabel="record-level epsilon (accounted)",
        caption="epsilon of the DP steps (Fed-DP-PSO's exact scores are not covered)" + more,
    )
