"""Time per Fed-DP-PSO round: vectorised (one jit, clients x particles under vmap) vs
straightforward per-client, per-particle Python loops of the same algorithm (same model, same
jitted single-particle loss). 5 clients x 5 particles. Two loop baselines differ only in the
DP-Adam refinement of a client's best particle:

* "loop, compiled epoch": one call of swarmjax's jitted single-client ``refine`` (the whole
  epoch of DP-Adam steps compiled as one loop), the stricter baseline;
* "loop, per mini-batch": a Python loop over the epoch's Poisson batches calling a jitted
  DP-Adam step, as Algorithm 1 (lines 29-31) is written and as the paper's code runs it.
  Checked to give the same parameters as ``refine`` (same keys, same batches).

``python -m benchmarks.fed_round [--quick] [--write]``; ``--write`` writes the ``fed_round``
section of RESULTS.md
with the machine load (the 2-core CPU is shared) and a profile of the vectorised round (each
part jitted alone, best of N), and, when ``results/fed_dp_pso/table{1,2}/summary.json`` exist,
the ``fed_dp_pso_tables`` section (wall time of each table as one command).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import _cli as _bcli
from benchmarks._results import best_time, machine, write_section
from experiments import _cli
from swarmjax import swarm
from swarmjax.fl import load_dataset, partition, stack_clients
from swarmjax.fl.algorithms import registry
from swarmjax.fl.algorithms.fed_dp_pso import READINGS, FedDPPSO
from swarmjax.fl.client.record_dp import poisson_sampler
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data.clients import client
from swarmjax.fl.protocol import RunSpec, Variants, release_identity, run_keys
from swarmjax.fl.runtime import simulator
from swarmjax.models import cross_entropy, evaluate, loss, mlp
from swarmjax.privacy.dpsgd import dp_step
from swarmjax.privacy.secret import Secret

N, S = 5, 5


def _setup(rounds: int):
    ds = load_dataset("digits", standardize=True)
    clients = stack_clients(ds.x_train, ds.y_train, partition(ds.y_train, N, seed=0).indices)
    model = mlp((32,), 10, ds.input_shape)
    spec = RunSpec(rounds, 1e-5)
    base = registry.Base(model, LocalTraining(batch_size=32), spec, N, sizes=clients.sizes)
    chosen = registry.settings(  # DP-Adam's Poisson buffer sized for the run (epsilon 8)
        "fed-dp-pso",
        reading=replace(READINGS["paper"], weight_decay="decoupled"),  # AdamW
        particles=S,
        target_epsilon=8.0,
    )
    alg, grid = registry.build("fed-dp-pso", base, chosen)
    variants = Variants.grid(alg, clients, spec, **grid)
    hyper = jax.tree.map(lambda a: a[0], variants.hyper)  # the one variant
    test = (jnp.asarray(ds.x_test), jnp.asarray(ds.y_test))
    return alg, variants.hyper, hyper, clients, test


def _refine(alg: FedDPPSO, training: LocalTraining, hyper):
    """The vectorised round's refinement of one client: ``(params, data, key, sigma) ->
    params`` (one compiled epoch)."""

    def run(params, data, key, sigma):
        return training.train(alg.model, params, data, key, hyper.learning_rate, sigma).params

    return run


def _per_batch_refine(alg: FedDPPSO, hyper):
    """The refinement (one client, E = 1) as a Python loop over the epoch's Poisson batches,
    each step one jitted DP-Adam step: ``(params, data, key, sigma) -> params``."""
    tr = alg.training
    opt = tr.optimizer_for(hyper.learning_rate)
    sample = jax.jit(poisson_sampler(tr.batch_size, tr.record_dp.capacity))

    @jax.jit
    def step(p, st, data, idx, mask, key, sigma):
        return dp_step(
            key,
            p,
            st,
            data.x[idx],
            data.y[idx],
            mask & data.mask[idx],
            optimizer=opt,
            apply_fn=alg.model.apply,
            loss_fn=cross_entropy,
            clip_norm=tr.record_dp.clip_norm,
            noise_multiplier=sigma,
            expected_batch_size=float(tr.batch_size),
        )

    def run(params, data, key, sigma):
        # The same key derivation as local_train's epoch 0.
        sample_key, step_key = jax.random.split(jax.random.fold_in(key, 0))
        batches = sample(sample_key, data.mask, data.sizes)
        state = opt.init(params)
        for s in range(int(jnp.sum(batches.active))):
            params, state = step(
                params,
                state,
                data,
                batches.idx[s],
                batches.mask[s],
                jax.random.fold_in(step_key, s),
                sigma,
            )
        return params

    return run


def _loop_round(hyper, clients, pos, vel, pb, pbl, gbest, key, jloss, jrefine):
    """Algorithm 1 + 2 with Python loops over clients and particles; ``jrefine(params, data,
    key, sigma) -> params`` refines a client's best particle."""
    rng = np.random.default_rng(int(jax.random.randint(key, (), 0, 2**31 - 1)))
    reports, bests = [], []
    for i in range(N):
        data = client(clients, i)
        losses = []
        for j in range(S):
            r1, r2 = rng.random(), rng.random()
            vel[i][j] = jax.tree.map(
                lambda v, x, p, g, a=r1, b=r2: 0.7 * v + 1.4 * a * (p - x) + 1.4 * b * (g - x),
                vel[i][j],
                pos[i][j],
                pb[i][j],
                gbest,
            )
            pos[i][j] = jax.tree.map(jnp.add, pos[i][j], vel[i][j])
            losses.append(float(jloss(pos[i][j], data.x, data.y, data.mask)))
            if losses[j] < pbl[i][j]:
                pb[i][j], pbl[i][j] = pos[i][j], losses[j]
        j = int(np.argmin(losses))
        pos[i][j] = jrefine(pos[i][j], data, jax.random.fold_in(key, i), hyper.noise_multiplier[i])
        lj = float(jloss(pos[i][j], data.x, data.y, data.mask))
        if lj < pbl[i][j]:
            pb[i][j], pbl[i][j] = pos[i][j], lj
        b = int(np.argmin(pbl[i]))
        reports.append(pbl[i][b])
        bests.append(pb[i][b])
    order = np.argsort(reports)
    gbest = bests[int(order[rng.integers(min(3, N))])]
    jax.block_until_ready(gbest)
    return gbest


def _check_same_refinement(compiled, per_batch, swarms, clients, key, hyper) -> None:
    """The per-mini-batch loop must be the same algorithm: same parameters as the compiled
    refinement."""
    start = jax.tree.map(lambda a: a[0, 0], swarms.position)
    data = client(clients, 0)
    args = (start, data, jax.random.fold_in(key, 0), hyper.noise_multiplier[0])
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6),
        compiled(*args),
        per_batch(*args),
    )


def _loop_runner(hyper, clients, sw, gbest, key, jloss, jrefine):
    """A compiled, ready-to-time loop round on the vectorised swarms ``(N, S, ...)`` split into
    per-particle lists (each call continues from the last, like successive rounds)."""
    take = lambda t, i, j: jax.tree.map(lambda a: a[i, j], t)
    pos = [[take(sw.position, i, j) for j in range(S)] for i in range(N)]
    vel = [[take(sw.velocity, i, j) for j in range(S)] for i in range(N)]
    pb = [[take(sw.best_position, i, j) for j in range(S)] for i in range(N)]
    pbl = [[float(sw.best_loss[i, j]) for j in range(S)] for i in range(N)]
    args = (hyper, clients, pos, vel, pb, pbl, gbest, key, jloss, jrefine)
    _loop_round(*args)  # compile
    return lambda: _loop_round(*args)


def _interleaved(fns: dict[str, object], repeats: int) -> dict[str, np.ndarray]:
    """Seconds per call of each blocking ``fn``, timed round-robin ``repeats`` times so that
    a slow spell of the shared machine hits every implementation alike."""
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: np.asarray(t) for name, t in times.items()}


def _profile(alg: FedDPPSO, hyper, clients, test, sw, gbest, key, repeats: int):
    """Seconds per call of each part of the vectorised round, each jitted alone."""
    first = jax.tree.map(lambda a: a[:, 0], sw.position)
    keys = jax.random.split(key, N)
    sig = hyper.noise_multiplier
    tr = alg.training
    dp, plain = _refine(alg, tr, hyper), _refine(alg, replace(tr, record_dp=None), hyper)
    sample = poisson_sampler(tr.batch_size, tr.record_dp.capacity)
    zero = jnp.zeros((), jnp.float32)
    parts = [
        ("DP-Adam refinement, 5 clients (clip + noise)", jax.vmap(dp), (first, clients, keys, sig)),
        ("same, plain Adam (no DP), for scale", jax.vmap(plain), (first, clients, keys, sig)),
        (
            "Poisson batches of one epoch, 5 clients",
            jax.vmap(lambda d, k: sample(k, d.mask, d.sizes)),
            (clients, keys),
        ),
        (
            "particle scores, 5 clients x 5 particles",
            jax.vmap(lambda pp, d, k: alg.scores(pp, d, k, zero)),
            (sw.position, clients, keys),
        ),
        (
            "PSO move, 5 clients x 5 particles",
            jax.vmap(lambda s: swarm.move(s, hyper.pso, alg.pso_options, social_target=gbest)),
            (sw,),
        ),
        (
            "test evaluation of gbest",
            lambda p: evaluate(alg.model.apply, p, *test, None),
            (gbest,),
        ),
    ]
    out = []
    for name, fn, args in parts:
        f = jax.jit(fn)
        jax.block_until_ready(f(*args))
        out.append(
            (name, best_time(lambda f=f, a=args: jax.block_until_ready(f(*a)), repeats=repeats))
        )
    return out


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def _tables_section() -> str | None:
    """Wall time of each Table reproduction, from the experiment's summary.json files."""
    rows = []
    for table in ("table1", "table2"):
        path = Path("results/fed_dp_pso") / table / "summary.json"
        if not path.exists():
            continue
        summ = json.loads(path.read_text())
        plan = summ["plan"]
        for name in plan["datasets"]:
            cells = [c for c in summ["cells"] if c["dataset"] == name]
            met = sum(bool(c["meets_paper"]) for c in cells)
            eps_ok = sum(bool(c["epsilon_ok"]) for c in cells)
            rows.append(
                f"| {table} ({name}) | {summ['wall_seconds'][name] / 60:.1f} | {len(cells)} | "
                f"{met}/{len(cells)} | {eps_ok}/{len(cells)} | "
                f"{summ['load_average']['start']} -> {summ['load_average']['after_tables']} |"
            )
    if not rows:
        return None
    return (
        "## fed_dp_pso_tables: Tables 1-2 of seed 000, one command each\n\n"
        "`python -m experiments.fed_dp_pso --full --datasets mnist --no-fig3 --out "
        "results/fed_dp_pso/table1` (Table 1; `fashion_mnist` and `table2` for Table 2); "
        f"{summ['header']}\n"
        f"{summ['cpu_count']} CPU cores shared with other jobs; load average (1, 5, 15 min) at "
        "start -> end of the tables. Wall time includes data loading and every compilation.\n\n"
        "| run | wall (min) | cells | meets paper mean - std | per-client eps <= target | "
        "load |\n|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )


@_cli.entry_point
def main(argv: list[str] | None = None) -> None:
    p = _bcli.parser(
        "fed_round", __doc__.split("\n\n")[0], writes="fed_round (and fed_dp_pso_tables)"
    )
    p.add_argument("--quick", action="store_true", help="3 timing repeats instead of 15")
    p.add_argument(
        "--rounds", type=_cli.count("--rounds"), default=10, help="rounds of a whole experiment"
    )
    p.add_argument("--tables-only", action="store_true", help="only the fed_dp_pso_tables section")
    args = p.parse_args(argv)
    if args.tables_only:
        _cli.refuse_unused(args, ["quick", "rounds"], "--tables-only times nothing")
        tables = _tables_section()
        print(tables or "no results/fed_dp_pso/table*/summary.json yet")
        if tables and args.write:
            write_section("fed_dp_pso_tables", tables)
        return
    repeats = 3 if args.quick else 15
    alg, hypers, hyper, clients, test = _setup(args.rounds)
    key = jax.random.key(0)
    data = alg.client_data(clients)
    keys = run_keys(
        Secret.generate(), [0], [release_identity(alg, hyper, {})], common_random_numbers=False
    )
    carry = simulator.init_runs(alg, keys, hypers, data, "vmap")

    call = simulator.Rounds(alg, 1, "vmap")  # one round, no private diagnostics

    def vround():
        # one round of the protocol simulator: both exchanges, evaluation, privacy spend
        return simulator.run_rounds(call, carry, keys, hypers, data, test)

    jax.block_until_ready(vround())
    sw = jax.tree.map(lambda a: a[0], carry[1].swarm)
    gbest = jax.tree.map(lambda a: a[0], carry[0].gbest)
    load_start = _load()
    profile = _profile(alg, hyper, clients, test, sw, gbest, key, repeats=max(repeats, 3))

    jloss = jax.jit(lambda p, x, y, m: loss(alg.model.apply, p, x, y, m))
    compiled = jax.jit(_refine(alg, alg.training, hyper))
    per_batch = _per_batch_refine(alg, hyper)
    _check_same_refinement(compiled, per_batch, sw, clients, key, hyper)
    runners = {
        f"Python loop over clients x particles, DP-Adam {name}": _loop_runner(
            hyper, clients, sw, gbest, key, jloss, jrefine
        )
        for name, jrefine in (("per mini-batch", per_batch), ("compiled epoch", compiled))
    }
    vec_name = "vectorised (protocol simulator: one jit, vmap)"
    runners[vec_name] = lambda: jax.block_until_ready(vround())
    times = _interleaved(runners, repeats)
    t_vec = times[vec_name]
    rows = []
    for name, t in times.items():
        ratio = (
            "-"
            if name == vec_name
            else (f"{t.min() / t_vec.min():.1f}x ({np.median(t) / np.median(t_vec):.1f}x)")
        )
        rows.append(
            f"| {name} | {t.min():.4f} | {np.median(t):.4f} | {t.min() * args.rounds:.2f} | "
            f"{ratio} |\n"
        )
    md = (
        f"## fed_round: Fed-DP-PSO round, {N} clients x {S} particles\n\n"
        f"`python -m benchmarks.fed_round{' --quick' if args.quick else ''}` on {machine()}.\n"
        f"Digits (1437 train rows), MLP 64-32-10, DP-Adam (eps=8), E=1, B=32; {repeats} "
        "rounds of each implementation, timed round-robin. Both loops run clients and "
        "particles in Python; they differ in the refinement of a client's best particle: a "
        "Python loop over its Poisson mini-batches calling a jitted DP-Adam step (as "
        "Algorithm 1 is written; checked to give the same parameters as `refine`), or one "
        "call of swarmjax's compiled single-client epoch.\n\n"
        f"| implementation | best s / round | median s / round | s / experiment (R="
        f"{args.rounds}, best) | vectorised speed-up over it: best (median) |\n"
        "|---|---|---|---|---|\n" + "".join(rows)
    )
    md += (
        f"\nLoad average (1, 5, 15 min) during the run: {load_start} -> {_load()} on "
        f"{os.cpu_count()} cores (shared machine: absolute times are inflated by other jobs, "
        "both implementations alike).\n\nProfile of the vectorised round (each part jitted "
        "alone):\n\n| part | ms |\n|---|---|\n"
        + "".join(f"| {name} | {t * 1e3:.2f} |\n" for name, t in profile)
    )
    print(md)
    tables = _tables_section()
    if tables:
        print(tables)
    if args.write:
        write_section("fed_round", md)
        if tables:
            write_section("fed_dp_pso_tables", tables)


if __name__ == "__main__":
    main()
