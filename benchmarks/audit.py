"""Empirical against accounted epsilon, and the cost of auditing (issue #37, point 4).

Two audited settings, each measured without and with canaries in the same script:

* **user-level DP-FedAvg** on :mod:`benchmarks.vs_pfl`'s cross-device work (1,200 MNIST
  users of 50 rows, Poisson cohort of rate 50/1200, one local epoch of SGD, ``simple_cnn``
  of 1,199,882 parameters, fixed clip 0.4, delta 1/1200, PLD accountant; its
  ``load_work``, ``algorithm`` and ``dp_config``) at epsilon 2 and 8, with ``--canaries``
  client-level canaries (``simulate(..., audit=CanaryAudit(M))``, cosine score, Dirac
  directions and sized canary slots by default; a job's ``"directions": "haar"`` with
  ``"slots": M`` runs the audit as it was before 2026-11-27);
* **record-level DP-SGD** on MNIST (all 60,000 training rows, Poisson batches of expected
  size 256 in a buffer its record-level :class:`~swarmjax.privacy.plan.PrivacyPlan` sizes
  and whose overflow it charges, the noise it calibrates, the 784-32-10 MLP of 25,450
  parameters, clip 1, SGD lr 0.5, delta 1e-5) at epsilon 2 and 8, with
  ``--record-canaries`` gradient canaries
  (:class:`~swarmjax.privacy.canaries.GradientCanaries`, white-box ``"gradient"`` score).

Every measured run is its own subprocess, so its peak memory (``ru_maxrss``: the whole
process, data and compilation included) is its own; its time is the wall and process CPU
seconds of the training call, compilation included.  The record-level canaries' directions
(a QR of a ``d x M`` Gaussian, ``O(d M^2)`` once per run) are timed apart, before the
training call (the second last column; ``nan`` at client level, where ``simulate`` makes
them).  The cost of auditing is the audited run's figure over the same run without
canaries (target: at most 1.2x).

Every report states its power and verdict (docs/audits.md, "Power"): the largest bound its
canaries can certify at the audit's own delta, the noise error an ideal canary would show,
and "ok", "cannot tell", "suspect" or "violation".  The record-level runs pass their
accounted curve (epsilon at any delta), so their audit delta is chosen per run; the
client-level runs get the simulator's report.  Every run draws its noise from a fresh
secret (:class:`~swarmjax.privacy.secret.Secret`), so a plain run and its audited twin
never share noise.

``python -m benchmarks.audit [--quick] [--rounds R] [--steps S] [--canaries M]
[--record-canaries M] [--data-dir DIR] [--write]``: prints a table and writes the runs to
``results/audit.json``; ``--write`` also writes the ``audit`` section of
benchmarks/RESULTS.md (which names the sizes cut from the full ones).  Full sizes: 50
rounds and 2,000 DP-SGD steps, :data:`~swarmjax.privacy.canaries.DEFAULT_CANARIES`
canaries at both levels.  ``--quick``: 3 rounds, 64 client-level canaries, 100 DP-SGD
steps, 256 gradient canaries (minutes on a CPU; their power is stated as low).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import resource
import subprocess
import sys
import time

from benchmarks import _cli as _bcli
from experiments import _cli
from experiments._report import write_json
from swarmjax.privacy.canaries import DEFAULT_CANARIES

EPSILONS = (2.0, 8.0)
SGD_BATCH, SGD_CLIP, SGD_LR, SGD_DELTA, SGD_HIDDEN = 256, 1.0, 0.5, 1e-5, (32,)
QUICK = {"rounds": 3, "canaries": 64, "steps": 100, "record_canaries": 256}
DEFAULT = {
    "rounds": 50,
    "canaries": DEFAULT_CANARIES,
    "steps": 2000,
    "record_canaries": DEFAULT_CANARIES,
}


def _peak_mib() -> float:
    """This process's peak resident memory in MiB (``ru_maxrss``, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def client_job(job: dict) -> dict:
    """One DP-FedAvg run of the vs_pfl work (``job``: epsilon, rounds, canaries (0: none),
    data_dir): seconds (wall, CPU) of the ``simulate`` call, peak MiB, the accounted epsilon
    and, audited, the :class:`~swarmjax.privacy.canaries.CanaryReport`'s fields."""
    from benchmarks import vs_pfl
    from swarmjax.fl.protocol import Variants
    from swarmjax.fl.runtime import simulate
    from swarmjax.privacy.canaries import CanaryAudit

    store, _, ds = vs_pfl.load_work(job["data_dir"])
    test = (ds.x_test[:100], ds.y_test[:100])  # vs_pfl's per-round test rows
    dp = {**vs_pfl.dp_config(job["rounds"]), "epsilon": job["epsilon"]}
    alg, grid = vs_pfl.algorithm(dp)
    variants = Variants.grid(alg, store, dp["spec"], **grid)
    audit = None
    if job["canaries"]:  # "haar" with slots = M: the client-level audit before 2026-11-27
        how = {"directions": job.get("directions", "dirac"), "slots": job.get("slots")}
        audit = CanaryAudit(job["canaries"], **how)
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate(alg, store, test, variants, audit=audit)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "peak_mib": _peak_mib(),
        "epsilon": float(res.privacy.final_epsilon.max()),
        "delta": float(res.privacy.delta),
        "accuracy": float(res.history["test_accuracy"].iloc[-1]),
        "audit": res.audit[0].to_dict() if audit is not None else None,
    }


def record_job(job: dict) -> dict:
    """One DP-SGD run on MNIST (``job``: epsilon, steps, canaries (0: none), data_dir):
    seconds (wall, CPU) of the jitted training (compilation included), peak MiB, the
    accounted epsilon and, audited, the report's fields."""
    import jax
    import jax.numpy as jnp
    import optax

    from swarmjax import models
    from swarmjax.fl.data import load_dataset
    from swarmjax.privacy import dpsgd
    from swarmjax.privacy.canaries import CanaryAudit, GradientCanaries
    from swarmjax.privacy.plan import PrivacyPlan
    from swarmjax.privacy.sampling import poisson_sample
    from swarmjax.privacy.secret import Secret

    ds = load_dataset("mnist", job["data_dir"])
    x, y = jnp.asarray(ds.x_train), jnp.asarray(ds.y_train)
    n, steps = int(x.shape[0]), job["steps"]
    q = SGD_BATCH / n
    # the record-level plan sizes the batch buffer for the run (its overflow charged to
    # delta) and calibrates the noise to the target: no DP arithmetic here. Each run is
    # reported alone (no ledger composes them), so its buffer is sized for its own epsilon
    plan = PrivacyPlan("record", n, q, steps, SGD_DELTA)
    plan = plan.sized(job["epsilon"], composed_epsilon=job["epsilon"]).calibrate(job["epsilon"])
    capacity, sigma = int(plan.capacity), plan.noise_multiplier
    model = models.mlp(SGD_HIDDEN, 10, (28, 28, 1))
    params = model.init(jax.random.key(0))
    audit = CanaryAudit(job["canaries"], score="gradient") if job["canaries"] else None
    t0, c0 = time.perf_counter(), time.process_time()  # the directions' QR, once per run
    canaries = (
        None
        if audit is None
        else GradientCanaries.create(jax.random.key(1), audit, params, SGD_CLIP, sample_rate=q)
    )
    canaries = jax.block_until_ready(canaries)
    setup_wall, setup_cpu = time.perf_counter() - t0, time.process_time() - c0
    opt = optax.sgd(SGD_LR)
    # the noise (and the sampling and canary draws) from a fresh secret, never a published
    # constant: this run's noise cannot be regenerated, nor shared with its plain twin
    root = Secret.generate().key()

    @jax.jit
    def train(params, canaries, root):
        def step(carry, t):
            p, state, c = carry
            k = dpsgd.noise_key(root, t)  # the step folded into the secret key
            ids, mask, _ = poisson_sample(jax.random.fold_in(k, 0), q, jnp.ones(n, bool), capacity)
            extra = None
            if c is not None:
                extra, _ = c.gradient_sum(jax.random.fold_in(k, 1), q)
            g = dpsgd.dp_grad(
                jax.random.fold_in(k, 2),
                p,
                x[ids],
                y[ids],
                mask,
                apply_fn=model.apply,
                loss_fn=models.cross_entropy,
                clip_norm=SGD_CLIP,
                noise_multiplier=sigma,
                expected_batch_size=q * n,
                canary_sum=extra,
            )
            updates, state = opt.update(g, state, p)
            c = None if c is None else c.observe(g)
            return (optax.apply_updates(p, updates), state, c), None

        return jax.lax.scan(step, (params, opt.init(params), canaries), jnp.arange(steps))[0]

    t0, c0 = time.perf_counter(), time.process_time()
    final, _, canaries = jax.block_until_ready(train(params, canaries, root))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    _, acc = models.evaluate(model.apply, final, ds.x_test, ds.y_test, batch_size=2000)
    epsilon = plan.epsilon()
    report = None
    if audit is not None:

        def accounted(d: float) -> float:  # the run's epsilon at any delta (audit delta)
            return dataclasses.replace(plan, delta=d).epsilon()

        report = canaries.report(
            audit, epsilon=epsilon, delta=SGD_DELTA, accounted=accounted
        ).to_dict()
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "setup_wall_s": setup_wall,
        "setup_cpu_s": setup_cpu,
        "peak_mib": _peak_mib(),
        "epsilon": float(epsilon),
        "delta": SGD_DELTA,
        "accuracy": float(acc),
        "noise_multiplier": float(sigma),
        "capacity": capacity,
        "audit": report,
    }


JOBS = {"client": client_job, "record": record_job}


def _spawn(job: dict) -> dict:
    """``job`` in a fresh Python process (its own peak memory); its JSON result."""
    cmd = [sys.executable, "-m", "benchmarks.audit", "--job", json.dumps(job)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"job {job} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(sizes: dict, data_dir: str) -> list[dict]:
    """Every setting at every epsilon, without then with canaries: one row each."""
    rows = []
    for unit, count, length in (
        ("client", "canaries", "rounds"),
        ("record", "record_canaries", "steps"),
    ):
        for eps in EPSILONS:
            base = {"unit": unit, "epsilon": eps, length: sizes[length], "data_dir": data_dir}
            plain = _spawn({**base, "canaries": 0})
            audited = _spawn({**base, "canaries": sizes[count]})
            rows.append(
                {
                    "unit": unit,
                    "epsilon_target": eps,
                    "length": f"{sizes[length]} {length}",
                    "plain": plain,
                    "audited": audited,
                    "load": os.getloadavg(),
                }
            )
            print(_line(rows[-1]), flush=True)
    return rows


def _power(r: dict) -> str:
    """The report's power: the most it could certify at its audit delta (against the
    accounted epsilon there) and the noise factor an ideal canary would show."""
    if r.get("power_epsilon") is None:
        return "not stated"
    factor = r["detectable_noise_factor"]
    seen = "none up to 1000x" if not math.isfinite(float(factor)) else f"{float(factor):.1f}x"
    return (
        f"{r['power_epsilon']:.2f} vs {r['epsilon_audit_delta']:.2f} at delta "
        f"{r['audit_delta']:.0e}; noise / {seen}"
    )


def _line(row: dict) -> str:
    a, p, r = row["audited"], row["plain"], row["audited"]["audit"]
    what = "user-level DP-FedAvg (vs_pfl)" if row["unit"] == "client" else "DP-SGD (MNIST)"
    return (
        f"| {what}, {row['length']} | {a['epsilon']:.3f} | {r['epsilon_lower']:.3f} | "
        f"{_power(r)} | {r.get('verdict')} | "
        f"{r['included']}/{r['canaries']} | {r['tpr_at_fpr']:.3f} | {r['auroc']:.3f} | "
        f"{p['wall_s']:.1f} / {a['wall_s']:.1f} ({a['wall_s'] / p['wall_s']:.2f}x) | "
        f"{p['cpu_s']:.1f} / {a['cpu_s']:.1f} ({a['cpu_s'] / p['cpu_s']:.2f}x) | "
        f"{p['peak_mib']:.0f} / {a['peak_mib']:.0f} ({a['peak_mib'] / p['peak_mib']:.2f}x) | "
        f"{a.get('setup_cpu_s', math.nan):.1f} | {row['load'][0]:.1f} |"
    )


def report(rows: list[dict], sizes: dict, argv: list[str] | None) -> str:
    """The RESULTS.md section."""
    from benchmarks._results import machine

    cut = any(sizes[k] != DEFAULT[k] for k in DEFAULT)
    cuts = ", ".join(f"{k.replace('_', '-')} {sizes[k]} of {DEFAULT[k]}" for k in DEFAULT)
    head = [
        "## Empirical privacy audits: measured against accounted epsilon "
        "(`python -m benchmarks.audit`)",
        "",
        f"Machine: {machine()}.  Command: `python -m benchmarks.audit "
        f"{' '.join(argv or [])}`.  Canaries: {sizes['canaries']} client-level (cosine "
        f"score), {sizes['record_canaries']} record-level (gradient score); bound at 95 % "
        "confidence (one-run audit, jax-privacy's CanaryScoreAuditor).  Time: the training "
        "call, compilation included, without / with canaries; memory: each run's own "
        "process peak RSS; the record-level directions' QR (once per run) timed apart.  Load: "
        "1-minute load average after the pair.",
        "",
        "Sizes run against the full ones ("
        + cuts
        + "): "
        + ("none cut." if not cut else "CUT, so the bounds have little power (docs/audits.md)."),
        "",
        "| run | accounted epsilon | empirical bound | power: most certifiable vs accounted, "
        "noise error seen | verdict | canaries in | TPR at FPR 0.05 | AUROC "
        "| wall s | CPU s | peak MiB | directions' QR, CPU s | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    return "\n".join(head + [_line(r) for r in rows]) + "\n"


@_cli.entry_point
def main(argv: list[str] | None = None) -> list[dict] | None:
    p = _bcli.parser("audit", __doc__.split("\n\n")[0], writes="audit")
    count = _cli.count
    p.add_argument("--quick", action="store_true", help=f"small sizes: {QUICK}")
    p.add_argument("--rounds", type=count("--rounds"), help="DP-FedAvg rounds (50; quick 3)")
    p.add_argument("--steps", type=count("--steps"), help="DP-SGD steps (2000; quick 100)")
    p.add_argument(
        "--canaries",
        type=count("--canaries", 2),
        help=f"client-level canaries ({DEFAULT_CANARIES}; quick 64)",
    )
    p.add_argument(
        "--record-canaries",
        type=count("--record-canaries", 2),
        help=f"record-level canaries ({DEFAULT_CANARIES}; quick 256)",
    )
    p.add_argument(
        "--data-dir", help="holds mnist/ (default: $SWARMJAX_DATA, else ~/.cache/swarmjax/data)"
    )
    p.add_argument("--job", help=argparse.SUPPRESS)  # internal: one run's JSON settings
    a = p.parse_args(argv)
    if a.job:
        job = json.loads(a.job)
        print(json.dumps(JOBS[job["unit"]](job)))
        return None
    sizes = dict(QUICK if a.quick else DEFAULT)
    for key in sizes:
        if getattr(a, key) is not None:
            sizes[key] = getattr(a, key)
    if sizes["canaries"] > 1_199_882:
        raise _cli.UserError(
            f"--canaries {sizes['canaries']} exceeds simple_cnn's 1199882 parameters"
        )
    if sizes["record_canaries"] > 25_450:
        raise _cli.UserError(
            f"--record-canaries {sizes['record_canaries']} exceeds the MLP's 25450 parameters"
        )
    # the taking-part canaries' dense replies per round, in K slots (canary_capacity at the
    # cohort's rate; the Dirac directions are 2 M numbers), and their clipped copies
    from benchmarks.vs_pfl import COHORT, USERS
    from swarmjax.privacy.canaries import canary_capacity

    slots, _ = canary_capacity(COHORT / USERS, sizes["canaries"], sizes["rounds"])
    _cli.check_memory(
        _cli.array_bytes((2, slots, 1_199_882)),
        "--canaries",
        f"{sizes['canaries']} canaries ({slots} slots a round) of 1199882 parameters",
    )
    data_dir = str(_cli.data_dir(a.data_dir, ("mnist",)))
    rows = measure(sizes, data_dir)
    text = report(rows, sizes, argv if argv is not None else sys.argv[1:])
    print(text)
    write_json(_cli.RESULTS / "audit.json", {"sizes": sizes, "rows": rows})
    if a.write:
        from benchmarks._results import write_section

        write_section("audit", text)
    return rows


if __name__ == "__main__":
    main()
