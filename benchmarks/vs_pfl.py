"""swarmjax side by side with pfl-research 0.6 (PyTorch backend) on the same cross-device work.

Workload (issue #31, point 5): MNIST train split into 1,200 users of 50 rows (seeded
shuffle, consecutive chunks: ``partition(..., "consecutive", size=50)``), cohort 50 drawn
uniformly, 1 local epoch of SGD (lr 0.1, batch 10), central SGD lr 1.0 on the mean delta,
pfl's ``simple_cnn`` (1,199,882 parameters), without and with user-level DP (clip 0.4,
epsilon 2, delta 1/1200, each system's own accountant: pfl's PLD accountant at sampling
rate 50/1200; swarmjax's RDP accountant for a Poisson cohort of rate 50/1200 in a buffer
sized by :func:`swarmjax.fl.data.cohort.cohort_capacity`, its overflow charged to delta).

pfl runs in a subprocess under ``--pfl-python`` (its own venv, see the ``vs-pfl`` extra in
pyproject.toml) on the same rows (``benchmarks/pfl_run.py``). swarmjax runs the prototype
round of :mod:`benchmarks.cohort_round` (store + cohort + gather + ``local_train``) in each
formulation of ``--formulations`` (``CONV:CHUNK``: ``xla`` or ``matmul`` convolutions,
``CHUNK`` clients per vmapped block; ``CHUNK = 50`` is a vmap over the cohort, ``1`` a
sequential ``lax.map``). The FLOP floor is measured in the same run: a 2048 x 2048 float32
matmul in JAX (best of 5) and the workload's FLOPs per round (2,500 examples x forward and
backward of the CNN, counted from its layers).

``python -m benchmarks.vs_pfl [--rounds 100] [--timing-rounds 3] [--pfl-python PATH]``
writes ``results/vs_pfl.json`` and prints a table; seconds per round are medians over the
timing rounds (after the first, compiling, round), with the load average beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.cohort_round import RoundConfig, make_round, simple_cnn
from swarmjax.fl.data import ClientStore, cohort_capacity, cohort_overflow, load_dataset, partition
from swarmjax.models import evaluate, param_count
from swarmjax.privacy.accounting import epsilon as dp_epsilon
from swarmjax.privacy.accounting import sigma_for_epsilon

USERS, ROWS, COHORT = 1200, 50, 50
CLIP, EPSILON = 0.4, 2.0
DEFAULT_PFL_PYTHON = "/work/venv-pfl/bin/python"


def cnn_flops_per_example() -> float:
    """Forward + backward FLOPs of one 28x28x1 example (backward = 2 x forward)."""
    conv1 = 26 * 26 * 32 * (9 * 1) * 2
    conv2 = 24 * 24 * 64 * (9 * 32) * 2
    dense = (9216 * 128 + 128 * 10) * 2
    return 3.0 * (conv1 + conv2 + dense)


def matmul_gflops(n: int = 2048, repeats: int = 5) -> float:
    """Best-of-``repeats`` float32 ``n x n`` matmul rate in JAX on the default device."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    f = jax.jit(lambda a: a @ a)
    f(a).block_until_ready()
    best = min(_timed(lambda: f(a).block_until_ready()) for _ in range(repeats))
    return 2 * n**3 / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def load_work(data_dir: str) -> tuple[ClientStore, tuple, object]:
    ds = load_dataset("mnist", data_dir)
    part = partition(ds.y_train, USERS, "consecutive", size=ROWS, seed=0)
    store = ClientStore.build(ds.x_train, ds.y_train, part.indices)
    return store, (jnp.asarray(ds.x_test), jnp.asarray(ds.y_test)), ds


def dp_config(rounds: int) -> dict:
    """Poisson cohort rate, capacity, overflow and the noise multiplier for epsilon 2."""
    rate, delta = COHORT / USERS, 1.0 / USERS
    capacity = cohort_capacity(USERS, rate, rounds, delta, EPSILON)
    overflow = cohort_overflow(USERS, rate, capacity)
    noise = sigma_for_epsilon(EPSILON, rate, rounds, delta, overflow_prob=overflow)
    eps = dp_epsilon(rate, noise, rounds, delta, overflow_prob=overflow)
    return {"rate": rate, "capacity": capacity, "noise": noise, "epsilon": eps, "delta": delta}


def run_swarmjax(
    store: ClientStore, test, conv: str, chunk: int, rounds: int, dp: dict | None, seed: int = 0
) -> dict:
    """Time (and, for many rounds, evaluate) one formulation of the prototype round."""
    model = simple_cnn(conv)
    extra = {}
    if dp is not None:
        extra = {"rate": dp["rate"], "capacity": dp["capacity"], "noise": dp["noise"], "clip": CLIP}
    cfg = RoundConfig(USERS, cohort=COHORT, max_rows=ROWS, chunk=chunk, **extra)
    round_fn = make_round(model, cfg)
    params = model.init(jax.random.key(seed))
    keys = jax.random.split(jax.random.key(seed + 1), rounds)
    times, cpu = [], []
    for r in range(rounds):
        t, c = time.perf_counter(), time.process_time()
        params = jax.block_until_ready(round_fn(params, store, keys[r]))
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    _, acc = evaluate(model.apply, params, *test, batch_size=1000)
    return {
        "system": "swarmjax",
        "formulation": f"{conv}:{chunk}",
        "dp": dp is not None,
        "rounds": rounds,
        "round_times": times,
        "round_cpu_times": cpu,
        "accuracy": float(acc),
        "epsilon": None if dp is None else dp["epsilon"],
        "noise_multiplier": None if dp is None else dp["noise"],
        "params": param_count(params),
        "load": os.getloadavg()[0],
    }


def run_pfl(python: str, store: ClientStore, ds, rounds: int, dp: bool, workdir: Path) -> dict:
    """pfl on the same users, in a subprocess under ``python``."""
    data = workdir / "data.npz"
    if not data.exists():
        np.savez(
            data,
            x=np.asarray(store.x),
            y=np.asarray(store.y),
            offsets=np.asarray(store.offsets),
            sizes=np.asarray(store.sizes),
            x_test=ds.x_test,
            y_test=ds.y_test,
        )
    cmd = [python, str(Path(__file__).with_name("pfl_run.py")), "--data", str(data)]
    cmd += ["--rounds", str(rounds), "--cohort", str(COHORT), "--threads", str(os.cpu_count())]
    if dp:
        cmd += ["--dp", "--clip", str(CLIP), "--epsilon", str(EPSILON)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["load"] = os.getloadavg()[0]
    return result


def per_round(result: dict, key: str = "round_times") -> float:
    """Median seconds per round, the first (compiling / warm-up) round excluded."""
    times = result[key]
    return float(np.median(times[1:] if len(times) > 1 else times))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default=os.environ.get("SWARMJAX_DATA", "/work/shared/data"))
    p.add_argument("--timing-rounds", type=int, default=4, help="rounds per timing run")
    p.add_argument("--rounds", type=int, default=0, help="full runs for accuracy (0: none)")
    p.add_argument("--formulations", default="xla:1,xla:5,xla:50,matmul:1,matmul:5,matmul:50")
    p.add_argument("--pfl-python", default=DEFAULT_PFL_PYTHON, help="'' to skip pfl")
    p.add_argument("--no-dp", action="store_true", help="skip the user-level DP runs")
    p.add_argument(
        "--no-pfl-full", action="store_true", help="time pfl only (no full --rounds runs)"
    )
    p.add_argument("--out", default="results/vs_pfl.json")
    a = p.parse_args()

    store, test, ds = load_work(a.data_dir)
    flops = cnn_flops_per_example() * COHORT * ROWS
    gflops = matmul_gflops()
    floor = flops / 1e9 / gflops
    print(
        f"FLOP floor: 2048 matmul {gflops:.1f} GFLOP/s; "
        f"round {flops / 1e9:.0f} GFLOP -> {floor:.2f} s"
    )
    results: list[dict] = []
    modes = [False] if a.no_dp else [False, True]
    with tempfile.TemporaryDirectory() as tmp:
        for dp in modes:
            if a.pfl_python:
                results.append(run_pfl(a.pfl_python, store, ds, a.timing_rounds, dp, Path(tmp)))
                print(_line(results[-1], floor), flush=True)
            for form in a.formulations.split(","):
                conv, chunk = form.split(":")
                cfg = dp_config(a.timing_rounds) if dp else None
                results.append(run_swarmjax(store, test, conv, int(chunk), a.timing_rounds, cfg))
                print(_line(results[-1], floor), flush=True)
        if a.rounds:
            best = min((r for r in results if r["system"] == "swarmjax"), key=per_round)
            conv, chunk = best["formulation"].split(":")
            for dp in modes:
                cfg = dp_config(a.rounds) if dp else None
                results.append(run_swarmjax(store, test, conv, int(chunk), a.rounds, cfg))
                print(_line(results[-1], floor), flush=True)
                if a.pfl_python and not a.no_pfl_full:
                    results.append(run_pfl(a.pfl_python, store, ds, a.rounds, dp, Path(tmp)))
                    print(_line(results[-1], floor), flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    summary = {"matmul_gflops": gflops, "round_gflop": flops / 1e9, "floor_s": floor}
    Path(a.out).write_text(json.dumps({"summary": summary, "runs": results}, indent=1))
    print(f"wrote {a.out}")


def _line(r: dict, floor: float) -> str:
    s = per_round(r)
    eps = "" if r["epsilon"] is None else f" eps={r['epsilon']:.3f}"
    return (
        f"{r['system']:8s} {r.get('formulation', 'torch'):10s} dp={r['dp']!s:5s} "
        f"rounds={r['rounds']:3d} {s:6.2f} s/round ({floor / s:5.1%} of floor, "
        f"{per_round(r, 'round_cpu_times'):6.2f} CPU s) "
        f"acc={r['accuracy']:.4f}{eps} load={r['load']:.1f}"
    )


if __name__ == "__main__":
    main()
