"""Runs of FedAvg, DP-FedAvg (Poisson, adaptive clipping) and DP-FTRL on tiny digits
federations, unsharded and over client meshes: what tests/test_mesh.py compares. Run as a
script in a process whose XLA_FLAGS give it several CPU devices (and, with ``--rank``,
under ``jax.distributed``); it writes one ``.npz`` of every run's numbers.

    python tests/mesh_runs.py OUT.npz RUNS [--resume ...] [--resize DIR] [--memory ...]
        [--experiment DIR:1,2] [--audit 0,4] [--rank R --port P --processes N]

Over ``jax.distributed`` process 0 writes ``OUT.npz`` and process ``r`` its own numbers to
``OUT.rank<r>.npz``. Every checkpoint the process saves is recorded (``checkpoint/saves``,
see :func:`record_saves`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import numpy as np

ROUNDS, NUM_CLIENTS = 3, 24
# each algorithm's client map, the same with and without a mesh: every map runs inside
# shard_map (vmapped, in blocks of 2 with a tail, one at a time with skipped slots)
CLIENT_MAP = {"fedavg": "vmap", "dp-fedavg": 2, "dp-ftrl": "sequential"}


def algorithms() -> dict:
    """The three algorithms and their hyper-parameters (tiny: a 4-unit MLP)."""
    from swarmjax.fl.algorithms.client_level_dp_fedavg import dp_fedavg
    from swarmjax.fl.algorithms.dp_ftrl import dp_ftrl
    from swarmjax.fl.algorithms.fedavg import FedAvg
    from swarmjax.fl.client.training import LocalTraining
    from swarmjax.models import mlp
    from swarmjax.privacy.noise import CorrelatedNoise
    from swarmjax.privacy.participation import MinSeparation, Poisson

    model = mlp((4,), 10, (8, 8, 1))
    training = LocalTraining(epochs=1, batch_size=10)
    return {
        "fedavg": (FedAvg(model, training, cohort=6, server_optimizer="sgd"), {}),
        "dp-fedavg": (
            dp_fedavg(model, training=training, participation=Poisson(19), clipping="adaptive"),
            {"sample_rate": 0.2, "noise_multiplier": 0.8},
        ),
        "dp-ftrl": (
            dp_ftrl(  # prefix-sum: the BLT's optimisation would take ~30 s here
                model,
                MinSeparation(6, min_separation=2),
                noise=CorrelatedNoise("prefix-sum"),
                training=training,
            ),
            {"noise_multiplier": 0.8},
        ),
    }


# a flat store of unequal clients read step by step ("-store" runs): 12 of 3 rows, 8 of 10
# and 4 of 50-70, the 360 rows of the stacked federation
STORE_SIZES = (3,) * 12 + (10,) * 8 + (60, 70, 64, 50)


def federation(store: bool = False):
    """The stacked digits federation, or (``store``) the same rows as a step-reading flat
    store of :data:`STORE_SIZES` clients."""
    from swarmjax.fl.data import load_dataset
    from swarmjax.fl.data.store import ClientStore
    from swarmjax.fl.runtime.flower.tasks import digits_clients

    clients, test = digits_clients({"train-size": 360, "num-clients": NUM_CLIENTS})
    if not store:
        return clients, test
    ds = load_dataset("digits")
    indices = np.split(np.arange(360), np.cumsum(STORE_SIZES)[:-1])
    return ClientStore.build(ds.x_train, ds.y_train, indices).with_read("step"), test


def numbers(result, prefix: str) -> dict[str, np.ndarray]:
    """What two runs must share: the final models, the per-round public metrics, the
    privacy record's epsilons, the realised selections and the clients' final states."""
    out = {
        f"{prefix}/server/{i}": np.asarray(a) for i, a in enumerate(jax.tree.leaves(result.server))
    }
    out |= {
        f"{prefix}/clients/{i}": np.asarray(a)
        for i, a in enumerate(jax.tree.leaves(result.clients))
    }
    out[f"{prefix}/epsilon"] = np.asarray(result.privacy.epsilon, np.float64)
    out[f"{prefix}/selected"] = np.asarray(result.private_diagnostics["selected"])
    out[f"{prefix}/test_loss"] = result.history["test_loss"].to_numpy()
    return out


def mesh(label: str, processes: int):
    """``"0"``: no mesh; ``"d"``: a clients mesh over ``d`` devices; ``"rxc"``: a
    ``(runs r, clients c)`` mesh."""
    from swarmjax.fl.runtime.mesh import clients_mesh

    if label == "0":
        return None
    if "x" in label:
        r, c = (int(v) for v in label.split("x"))
        return clients_mesh(r * c, runs=r, processes=processes)
    return clients_mesh(int(label), processes=processes)


def layout(name: str, label: str, processes: int) -> str:
    """How algorithm ``name``'s cohort is laid out on mesh ``label`` (its printed line)."""
    from swarmjax.fl.runtime.mesh import describe
    from swarmjax.fl.runtime.simulator import slot_buffer

    alg = algorithms()[name.removesuffix("-2").removesuffix("-store")][0]
    slots = slot_buffer(alg, NUM_CLIENTS)
    return describe(mesh(label, processes), slots, NUM_CLIENTS, data_split=True)


def run(name: str, label: str, processes: int = 1, audit=None, **kw):
    """The run of algorithm ``name`` (``"fedavg-2"``: FedAvg with two seeds) on mesh
    ``label``; ``kw``: more of the call's ``Execution`` fields."""
    from swarmjax.fl.protocol import RunSpec, Variants
    from swarmjax.fl.runtime import Execution, simulate
    from tests.reproducible import SECRET

    clients, test = federation(store=name.endswith("-store"))
    base = name.removesuffix("-2").removesuffix("-store")
    alg, grid = algorithms()[base]
    seeds = (0, 1) if name.endswith("-2") else (0,)
    kw.setdefault("client_map", CLIENT_MAP[base])
    variants = Variants.grid(alg, clients, RunSpec(ROUNDS, 1e-3, seeds), **grid)
    execution = Execution(diagnostics=True, mesh=mesh(label, processes), rounds_per_call=1, **kw)
    return simulate(alg, clients, test, variants, secret=SECRET, audit=audit, execution=execution)


class Stop(Exception):
    """Raised by a callback to kill a run after some rounds (its checkpoint stays)."""


def interrupted(folder: str, label: str, after: int, processes: int = 1) -> None:
    """DP-FedAvg on mesh ``label`` with checkpoints in ``folder``, killed after round
    ``after`` (the callback runs before that round's checkpoint is written)."""

    def stop(round_: int, metrics, runs) -> None:
        if round_ == after:
            raise Stop

    try:
        run("dp-fedavg", label, processes, checkpoint_dir=folder, callbacks=[stop])
    except Stop:
        return
    raise AssertionError("the run was not interrupted")


SAVES: list[tuple[int, int, int, int]] = []
"""Per checkpoint saved in this process, its client states ``(runs, N', ...)`` as handed to
orbax: ``N'``, how many distinct blocks of clients the devices hold, the rows of one
device's block, and the ``N`` recorded."""


def record_saves() -> None:
    """Record every checkpoint's client states as ``simulate`` hands them to orbax
    (:data:`SAVES`): split by client id over the mesh, never gathered first."""
    from swarmjax.fl.runtime.checkpoint import Checkpoints

    save = Checkpoints.save

    def spy(self, rounds_done, carry, outputs, clients=None):
        leaf = jax.tree.leaves(carry[1])[0]
        where = leaf.sharding.devices_indices_map(leaf.shape).values()  # every process's
        blocks = len({tuple((s.start, s.stop) for s in index) for index in where})
        rows = leaf.addressable_shards[0].data.shape[1]
        SAVES.append((leaf.shape[1], blocks, rows, clients))
        return save(self, rounds_done, carry, outputs, clients)

    Checkpoints.save = spy


RESIZE_CLIENTS = 21


def resized(folder: str, pairs: str) -> dict[str, np.ndarray]:
    """Client states of 21 clients, ``(runs 2, clients, 3)`` floats and a PRNG key leaf
    ``(runs 2, clients)``, saved split over ``d`` devices (padded with -1s and other keys)
    and restored onto ``e`` for each ``d-e`` of ``pairs`` (``"4-2,3-4"``; e.g. 4 -> 2: 22
    rows, one from the saved padding; 4 -> 3: 21, the padding dropped; 3 -> 4: 24, three
    past the rows saved) through ``Checkpoints`` and ``refill_padding``, as a resume does:
    the restored padded states, brought to the host by ``on_host``, as ``resize/<d>-<e>``
    and their keys' data as ``resize/<d>-<e>/keys``."""
    from swarmjax.fl.runtime import simulator
    from swarmjax.fl.runtime.checkpoint import Checkpoints
    from swarmjax.fl.runtime.mesh import on_host, padded_clients, refill_padding

    n = RESIZE_CLIENTS
    states = np.arange(2 * n * 3, dtype=np.float32).reshape(2, n, 3)
    keys = np.arange(2 * n * 2, dtype=np.uint32).reshape(2, n, 2)  # threefry key data

    def carry(devices: int, fill: float) -> tuple:  # (server, states, done) split on devices
        on = mesh(str(devices), jax.process_count())
        extra = padded_clients(on, n) - n
        sharding = simulator._split_sharding(on)  # each process places its own blocks

        def split(values: np.ndarray, pad: float) -> jax.Array:
            padded = np.concatenate([values, np.full((2, extra, values.shape[2]), pad)], 1)
            padded = padded.astype(values.dtype)
            return jax.make_array_from_callback(padded.shape, sharding, lambda i: padded[i])

        key_leaf = jax.random.wrap_key_data(split(keys, 7 + fill), impl="threefry2x32")
        held = {"floats": split(states, fill), "keys": key_leaf}
        return np.ones((2, 4), np.float32), held, np.ones((), np.int32)

    out = {"resize/states": states, "resize/keys": keys}
    for pair in pairs.split(","):
        saved_on, restored_on = (int(d) for d in pair.split("-"))
        saved = Checkpoints(Path(folder) / pair, "resize", {})
        saved.save(1, carry(saved_on, -1.0), {"m": np.zeros((1, 1))}, clients=n)
        like = carry(restored_on, 0.0)
        restored, _ = saved.restore(1, like, {"m": np.zeros((1, 1))}, clients=n)
        saved.close()
        split = restored[1]
        rows = split["floats"].shape[1]
        if rows > n:
            split = refill_padding(like[1]["floats"].sharding, split, n)
        for name in ("floats", "keys"):
            assert split[name].sharding == like[1][name].sharding, split[name].sharding
        host = on_host(split, rows)
        out[f"resize/{pair}"] = host["floats"]
        out[f"resize/{pair}/keys"] = np.asarray(jax.random.key_data(host["keys"]))
    return out


AUDIT_CANARIES = 32


def audited(label: str) -> dict[str, np.ndarray]:
    """DP-FedAvg on mesh ``label`` with a client-level canary audit (32 Dirac canaries,
    every one a slot every round): its run's numbers and its canary report's, as
    ``audit/<label>/...``."""
    from swarmjax.privacy.canaries import CanaryAudit

    audit = CanaryAudit(AUDIT_CANARIES, slots=AUDIT_CANARIES)
    result = run("dp-fedavg", label, audit=audit)
    print(f"audit {label}: {layout('dp-fedavg', label, 1)}", flush=True)
    (report,) = result.audit
    out = numbers(result, f"audit/{label}")
    for name in ("included", "dropped", "auroc", "tpr_at_fpr", "epsilon_lower"):
        out[f"audit/{label}/report/{name}"] = np.asarray(getattr(report, name), np.float64)
    return out


def memory_limited(folder: str, refused: str, runs_on: str) -> tuple[str, dict[str, np.ndarray]]:
    """DP-FedAvg under a device memory limit below what the federation alone (its data and
    client states) needs per device on mesh ``refused`` and above all a device holds on
    mesh ``runs_on``, which splits the federation (the simulator's own estimate): the
    refusal's line, and the numbers of the run on ``runs_on``, with the estimates as
    ``estimate/memory`` (federation on ``refused``, on ``runs_on``; all on each) and what
    the run held as ``estimate/blocks`` (the states' clients and one device's share of
    them, then the same for the data). The run on ``runs_on`` resumes from a checkpoint in
    ``folder`` written by the unsharded run (killed after round 2, before the limit is
    lowered), checkpoints its last round and finishes: ``estimate/finished`` is the
    states' clients and one device's share of them as ``finish`` takes them to the host,
    then whether every client state came back as a host array."""
    from swarmjax.fl.protocol import RunSpec, Variants
    from swarmjax.fl.runtime import simulator

    interrupted(folder, "0", after=2)

    clients, _ = federation()
    alg, grid = algorithms()["dp-fedavg"]
    variants = Variants.grid(alg, clients, RunSpec(ROUNDS, 1e-3, (0,)), **grid)
    keys = jax.random.split(jax.random.key(0), 1)
    memory = simulator.cohort_memory(alg, alg.client_data(clients), keys, variants.hyper, 1)
    low, high = (memory.per_device(mesh(x, 1)) for x in (runs_on, refused))
    alone, split = (memory.federation(mesh(x, 1)) for x in (refused, runs_on))
    assert low < alone < high, (low, alone, high)
    simulator.device_memory_bytes = lambda device=None: (low + alone) // 2
    try:
        run("dp-fedavg", refused)
    except ValueError as e:
        line = str(e)
    else:
        raise AssertionError(f"not refused on mesh {refused}")
    blocks: list[int] = []  # what one device holds: client rows of the states and the data
    advance = simulator.advance

    def spy(r, rounds):  # simulate's own loop, which looks at the run's placement
        r, metrics = advance(r, rounds)
        held = []
        for tree, axis in ((r.carry[1], 1), (r.federation, 0)):  # states: (runs, clients, ...)
            leaf = jax.tree.leaves(tree)[0]
            held += [leaf.shape[axis], leaf.addressable_shards[0].data.shape[axis]]
        blocks[:] = held
        return r, metrics

    finished: list[int] = []
    on_host = simulator.on_host

    def spy_host(states, num):  # finish's states: split until they reach the host
        leaf = jax.tree.leaves(states)[0]
        host = on_host(states, num)
        whole = all(isinstance(a, np.ndarray) for a in jax.tree.leaves(host))
        finished[:] = [leaf.shape[1], leaf.addressable_shards[0].data.shape[1], whole]
        return host

    simulator.advance, simulator.on_host = spy, spy_host
    try:
        found = numbers(run("dp-fedavg", runs_on, checkpoint_dir=folder), "memory")
    finally:
        simulator.advance, simulator.on_host = advance, on_host
    estimates = {
        "estimate/memory": np.asarray([alone, split, high, low], np.int64),
        "estimate/blocks": np.asarray(blocks, np.int64),
        "estimate/finished": np.asarray(finished, np.int64),
    }
    return line, found | estimates


def experiment(folder: str, devices: str) -> dict[str, np.ndarray]:
    """``experiments.cross_device`` run with each ``--devices`` of ``devices`` (``"1,2"``)
    under ``folder``, its clients capped at 16 of their 20 rows a round: its summary's
    final accuracy and devices, and its history's per-round test accuracy and loss, as
    ``experiment/<devices>/...``."""
    import pandas as pd

    from experiments import cross_device
    from tests.argv import override
    from tests.test_experiment_cross_device import ARGS  # its tiny digits run

    # a cap below the clients' 20 rows: each round draws a random 16 of a client's rows,
    # which on 2 devices the client's owner draws (under its federation id) from its block
    tiny = override(ARGS, ["--algorithms", "fedavg", "--max-examples", "16"])

    secret = Path(folder) / "secret.bin"  # one secret: the same cohorts and client keys
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_bytes(bytes(range(32)))
    out = {}
    for d in devices.split(","):
        run_dir = Path(folder) / d
        argv = [*tiny, "--devices", d, "--secret-file", str(secret), "--out", str(run_dir)]
        cross_device.main(argv)
        summary = pd.read_csv(run_dir / "summary.csv")
        history = pd.read_csv(run_dir / "history.csv")
        out[f"experiment/{d}/final_accuracy"] = summary["final_accuracy"].to_numpy()
        for name in ("test_accuracy", "test_loss"):
            out[f"experiment/{d}/{name}"] = history[name].to_numpy()
        out[f"experiment/{d}/devices"] = summary["devices"].to_numpy()
    return out


def evaluated(processes: int) -> dict[str, np.ndarray]:
    """``mesh.evaluated_once`` on the largest clients mesh, two runs (a vmap over runs, as
    the simulator calls it): an evaluation that reports the device computing it (its index
    on the ``clients`` axis) and the test set's sum, against the plain call. Every device
    computing it would report ``0 + 1 + ... + d-1``; one device reports 0."""
    import jax.numpy as jnp

    from swarmjax.fl.runtime.mesh import CLIENTS, evaluated_once

    devices = jax.device_count()
    mesh_d = mesh(str(devices), processes)
    test = (jnp.arange(12.0).reshape(6, 2), jnp.arange(6))
    server = jnp.asarray([1.5, -2.0])

    def evaluate(server, test, inside=True):
        x, y = test
        device = jax.lax.axis_index(CLIENTS) if inside else jnp.int32(0)
        return {"device": device, "sum": (x.sum(1) * server[0] + y).sum(), "ok": y.max() > 4}

    once = jax.jit(jax.vmap(lambda s: evaluated_once(mesh_d, evaluate, s, test)))(
        jnp.stack([server, 2 * server])
    )
    plain = jax.vmap(lambda s: evaluate(s, test, inside=False))(jnp.stack([server, 2 * server]))
    return {f"evaluated/{devices}/{k}/{which}": np.asarray(v[k])
            for which, v in (("once", once), ("plain", plain)) for k in v}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("runs", nargs="+", help="NAME:MESH,MESH,... e.g. fedavg:0,1,2,4 fedavg-2:2x2")
    p.add_argument("--resume", help="DIR:FROM:TO[:AGAIN], e.g. /tmp/ck:4:2:0 (DP-FedAvg)")
    p.add_argument("--resize", help="DIR:PAIRS of toy states' checkpoints, e.g. /tmp/r:4-2,3-4")
    p.add_argument("--memory", help="DIR:REFUSED:RUNS_ON meshes, e.g. /tmp/m:1:4 (DP-FedAvg)")
    p.add_argument("--experiment", help="DIR:DEVICES, e.g. /tmp/xd:1,2 (cross_device)")
    p.add_argument("--audit", help="MESHES of an audited DP-FedAvg run, e.g. 0,4")
    p.add_argument("--rank", type=int)
    p.add_argument("--port")
    p.add_argument("--processes", type=int, default=1)
    args = p.parse_args(argv)
    jax.config.update("jax_platforms", "cpu")
    if args.rank is not None:
        jax.distributed.initialize(
            coordinator_address=f"127.0.0.1:{args.port}",
            num_processes=args.processes,
            process_id=args.rank,
        )
    from swarmjax.fl.runtime.mesh import peak_memory

    record_saves()
    out: dict[str, np.ndarray] = {}
    for item in args.runs:
        name, labels = item.split(":")
        for label in labels.split(","):
            started = time.perf_counter()
            out |= numbers(run(name, label, args.processes), f"{name}/{label}")
            line = layout(name, label, args.processes)
            print(f"{name} {label}: {time.perf_counter() - started:.1f} s; {line}", flush=True)
    if args.resume:
        folder, first, then, *again = args.resume.split(":")
        interrupted(folder, first, after=2, processes=args.processes)
        resumed = run("dp-fedavg", then, args.processes, checkpoint_dir=folder)
        out |= numbers(resumed, "resumed")
        for label in again:  # the finished run's last checkpoint, restored on `label`
            out |= numbers(run("dp-fedavg", label, checkpoint_dir=folder), "resumed-again")
    if args.resize:
        out |= resized(*args.resize.split(":"))
    if args.rank is not None:  # a mesh of process 0's 2 devices alone: refused, not hung
        from swarmjax.fl.runtime.mesh import mesh_for

        try:
            mesh_for(mesh("2", args.processes), None, 6, 1)
        except ValueError as err:
            out["refused/processes"] = np.asarray(str(err))
    if args.rank is None:
        out |= evaluated(args.processes)
    if args.audit:
        for label in args.audit.split(","):
            out |= audited(label)
    if args.experiment:  # before --memory, which leaves the device's memory limit lowered
        out |= experiment(*args.experiment.split(":"))
    if args.memory:
        line, more = memory_limited(*args.memory.split(":"))
        print("refused:", line, flush=True)
        out |= more
    print("peak memory", peak_memory(), flush=True)
    out["checkpoint/saves"] = np.asarray(SAVES, np.int64).reshape(-1, 4)
    target = Path(args.out)
    if args.rank:
        target = target.with_suffix(f".rank{args.rank}.npz")
    target.parent.mkdir(parents=True, exist_ok=True)
    np.savez(target, **out)
    if args.rank is not None:
        jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
