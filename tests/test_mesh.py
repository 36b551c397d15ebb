"""One run's cohort over a device mesh (swarmjax.fl.runtime.mesh, ``simulate(mesh=...)``).

FedAvg (vmapped clients), DP-FedAvg (Poisson cohorts, adaptive clipping; blocks of 2) and
DP-FTRL (one client at a time) sharded over 1, 2 and 4
CPU devices (one subprocess with 4 virtual devices, tests/mesh_runs.py) and over two
``jax.distributed`` processes of 2 devices each (started on loopback, cleaned up after)
against the unsharded run: the same privacy record, cohorts and client states bit for bit,
the model to float32 rounding (the replies' sum is added per device, then across devices;
one device: bit for bit). Also: a checkpoint written on 4 devices resumes on 2 and the
finished run's on one, checkpoints hold the client states split as the mesh holds them
(never gathered) and restore onto another device count (padding re-made), a cohort refused
for memory on one device runs on 4 from an unsharded checkpoint, checkpoints and finishes,
a 2-process run killed mid-way resumes from its checkpoint and both processes report the
same result, a client-level canary audit on 4 devices is the unsharded audit, and bad input
is one line before any work.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from swarmjax.fl.runtime.mesh import (
    CLIENTS,
    CohortMemory,
    check_memory,
    clients_mesh,
    describe,
    mesh_for,
    peak_memory,
)
from tests import mesh_runs

REPO = Path(__file__).resolve().parents[1]
HELPER = REPO / "tests" / "mesh_runs.py"
TIMEOUT = 600

# what must be equal bit for bit whatever the devices (and every integer array: the
# clients' participation counts among them); the rest (models, test loss, the clients'
# float statistics of a model received) to float32 rounding of a sum added in another order
EXACT = ("epsilon", "selected")
RTOL, ATOL = 1e-5, 1e-6


def _env(devices: int) -> dict[str, str]:
    flags = os.environ.get("XLA_FLAGS", "")
    flags = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
    return {**os.environ, "XLA_FLAGS": flags, "PYTHONPATH": str(REPO)}


@dataclass
class Job:
    """Processes of the helper started together, their log files and the numbers file."""

    procs: list[subprocess.Popen]
    logs: list[Path]
    out: Path

    def finish(self) -> tuple[dict[str, np.ndarray], list[str]]:
        """Wait (TIMEOUT seconds at most, then kill) and return the numbers and logs."""
        try:
            for p in self.procs:
                p.wait(timeout=TIMEOUT)
        finally:
            self.end()
        logs = [log.read_text() for log in self.logs]
        for p, log in zip(self.procs, logs, strict=True):
            assert p.returncode == 0, log[-3000:]
        with np.load(self.out) as f:
            return dict(f), logs

    def end(self) -> None:
        """Kill the processes still running (a failed test's, at teardown)."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _start(job_args: list[list[str]], devices: int, out: Path) -> Job:
    """One helper process per argument list, each with ``devices`` CPU devices, writing
    ``out``; their output goes to log files (not pipes: no process blocks on output that
    nobody reads yet)."""
    procs, logs = [], []
    for i, args in enumerate(job_args):
        log = out.with_suffix(f".{i}.log")
        with open(log, "w") as sink:
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(HELPER), str(out), *args],
                    cwd=REPO,
                    env=_env(devices),
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                )
            )
        logs.append(log)
    return Job(procs, logs, out)


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Both jobs started at once (the CPU's cores share them): one process with 4 CPU
    devices running every local run, and 2 jax.distributed processes of 2 devices each
    (DP-FedAvg and DP-FTRL on a 4-device clients mesh across them). Every process is
    ended after the module."""
    tmp = tmp_path_factory.mktemp("mesh")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    local = ["fedavg:0,1,2,4", "fedavg-2:0,2x2", "dp-fedavg:0,2,4", "dp-ftrl:0,4"]
    local += ["dp-fedavg-store:0,4"]
    local += ["--resume", f"{tmp / 'checkpoints'}:4:2:0"]
    local += ["--resize", f"{tmp / 'resize'}:4-2,4-3,3-4"]
    local += ["--memory", f"{tmp / 'memory'}:1:4"]
    local += ["--experiment", f"{tmp / 'cross_device'}:1,2", "--audit", "0,4"]
    resume = ["--resume", f"{tmp / 'checkpoints-two'}:4:4"]
    resume += ["--resize", f"{tmp / 'resize-two'}:4-3,3-4"]
    two = ["dp-fedavg:4", "dp-ftrl:4", "dp-fedavg-store:4", *resume]
    ranks = [[*two, "--rank", str(r), "--port", port, "--processes", "2"] for r in (0, 1)]
    jobs = {
        "local": _start([local], 4, tmp / "local.npz"),
        "distributed": _start(ranks, 2, tmp / "two.npz"),
    }
    yield jobs
    for job in jobs.values():
        job.end()


@pytest.fixture(scope="module")
def local(launched):
    """Every local run's numbers and the process's output."""
    numbers, (log,) = launched["local"].finish()
    return numbers, log


@pytest.fixture(scope="module")
def distributed(launched):
    """The numbers of the 2-process runs (process 0's, and process 1's under ``rank1/``),
    and each process's output."""
    job = launched["distributed"]
    numbers, logs = job.finish()
    with np.load(job.out.with_suffix(".rank1.npz")) as f:
        numbers |= {f"rank1/{k}": v for k, v in f.items()}
    return numbers, logs


def _compare(numbers: dict, got: str, want: str, exact: bool = False) -> int:
    """Assert every number of run ``got`` equals run ``want``'s (``exact``: bit for bit
    throughout); returns how many arrays were compared."""
    names = [k.removeprefix(want) for k in numbers if k.startswith(want)]
    assert names, want
    for name in names:
        a, b = numbers[got + name], numbers[want + name]
        if exact or any(name.startswith(e) for e in EXACT) or a.dtype.kind != "f":
            np.testing.assert_array_equal(a, b, err_msg=f"{got}{name}")
        else:
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=f"{got}{name}")
    return len(names)


@pytest.mark.parametrize(
    ("alg", "devices"),
    [
        ("fedavg", "1"),
        ("fedavg", "2"),
        ("fedavg", "4"),
        ("fedavg-2", "2x2"),
        ("dp-fedavg", "2"),
        ("dp-fedavg", "4"),
        ("dp-ftrl", "4"),
        ("dp-fedavg-store", "4"),
    ],
)
def test_sharded_run_is_the_unsharded_run(local, alg, devices):
    """The model to float32 rounding, the privacy record, the realised cohorts and the
    clients' integer state bit for bit; on one device everything (the same slot-order
    sum). ``-store``: a step-reading flat store of unequal clients, split over the mesh,
    its slots' rows sent back to back (``mesh.gather_ragged``)."""
    numbers, _ = local
    _compare(numbers, f"{alg}/{devices}/", f"{alg}/0/", exact=devices == "1")


def test_the_runs_differ_from_each_other(local):
    """The comparisons can fail: the two seeds of FedAvg, and FedAvg against DP-FedAvg's
    noised run, are different numbers."""
    numbers, _ = local
    server = numbers["fedavg-2/0/server/0"]
    assert not np.allclose(server[0], server[1], rtol=RTOL, atol=ATOL)
    assert not np.allclose(
        numbers["fedavg/0/server/0"], numbers["dp-fedavg/0/server/0"], rtol=RTOL, atol=ATOL
    )
    # a Poisson cohort: the rounds' realised counts vary
    assert len(set(numbers["dp-fedavg/0/selected"].reshape(-1).tolist())) > 1


def test_checkpoint_of_four_devices_resumes_on_two(local):
    """DP-FedAvg killed after round 2 on 4 devices, resumed from its checkpoint on 2, and
    the finished run's last checkpoint (written on 2) restored without a mesh: both the
    numbers of the uninterrupted unsharded run."""
    numbers, _ = local
    _compare(numbers, "resumed/", "dp-fedavg/0/")
    _compare(numbers, "resumed-again/", "dp-fedavg/0/")


def test_checkpoints_hold_the_states_split_as_the_mesh_does(local):
    """Every checkpoint of the 4-device process got the client states as the mesh holds
    them: one disjoint block of clients per device of the clients axis (``N'`` rows in
    ``d`` blocks of ``N'/d``), never a replicated copy, with the true ``N`` recorded. In
    order: DP-FedAvg on 4 devices (round 1) and resumed on 2 (rounds 2, 3); the toy states
    on 4, 4 and 3; cross_device on 1 device and on 2 (a flat store: 40 clients' states
    split); the unsharded DP-FedAvg and the memory-limited run resumed from it on 4."""
    numbers, _ = local
    saves = numbers["checkpoint/saves"].tolist()
    assert all(rows == blocks * block for rows, blocks, block, _ in saves), saves
    assert [blocks for _, blocks, _, _ in saves] == [4, 2, 2, 4, 4, 3, 1, 1, 2, 2, 1, 4, 4]
    assert [n for *_, n in saves] == [24] * 3 + [21] * 3 + [40] * 4 + [24] * 3


RESIZED = {"4-2": 22, "4-3": 21, "3-4": 24}  # saved on - restored on: rows restored


def _check_resized(numbers: dict, pairs: list[str]) -> None:
    """Each ``resize/<pair>`` holds the 21 toy clients as saved, then padding rows that
    are all copies of client 20; their PRNG key leaf (``resize/<pair>/keys``, its key
    data) the same way."""
    for name in pairs:
        rows = RESIZED[name]
        for leaf, suffix, width in (("states", "", 3), ("keys", "/keys", 2)):
            saved, got = numbers[f"resize/{leaf}"], numbers[f"resize/{name}{suffix}"]
            assert got.shape == (2, rows, width), (name, leaf)
            np.testing.assert_array_equal(got[:, :21], saved, err_msg=f"{name} {leaf}")
            padding = np.broadcast_to(saved[:, 20:21], (2, rows - 21, width))
            np.testing.assert_array_equal(got[:, 21:], padding, err_msg=f"{name} {leaf}")


def test_a_checkpoint_restores_onto_another_device_count(local, distributed):
    """21 clients' states saved over 4 devices (padded to 24) restore onto 2 (22 rows: the
    saved padding row re-made) and 3 (21: the padding dropped); saved over 3, onto 4 (24:
    three rows past those saved): the 21 clients as saved, every padding row a copy of
    client 20 (as a fresh run pads), each device reading its own rows; a PRNG key leaf of
    the states likewise. Over the 2 processes too (4 -> 3: 2 devices on process 0 and 1
    on process 1; 3 -> 4), where each process gets the whole states on its host."""
    numbers, _ = local
    _check_resized(numbers, ["4-2", "4-3", "3-4"])
    two, _ = distributed
    _check_resized(two, ["4-3", "3-4"])
    _check_resized({k.removeprefix("rank1/"): v for k, v in two.items()}, ["4-3", "3-4"])


def test_a_mesh_leaving_a_process_without_a_device_is_refused(distributed):
    """Over 2 ``jax.distributed`` processes of 2 devices, a 2-device mesh holds process 0's
    devices only; process 1 would wait for its collectives without end: one line, on both
    processes, naming the devices that would include every process."""
    two, _ = distributed
    for prefix in ("", "rank1/"):
        line = str(two[f"{prefix}refused/processes"])
        assert line.startswith("mesh: its 2 devices are all on process(es) [0], none on "), line
        assert "jax.distributed process(es) [1]" in line and "devices >= 4" in line, line
        assert "\n" not in line


def test_canary_audit_on_four_devices_is_the_unsharded_audit(local):
    """A client-level canary audit on a 4-device clients mesh (the canaries join after the
    cross-device sum, before the plan's noise): the run's numbers as the unsharded audited
    run's, and the same canary report (which canaries took part, their scores' AUROC and
    true positive rate exactly; the epsilon lower bound to float32 tolerance)."""
    numbers, log = local
    assert "audit 4: cohort of 19 slots over 4 cpu devices" in log
    _compare(numbers, "audit/4/", "audit/0/")
    for name in ("included", "dropped", "auroc", "tpr_at_fpr"):
        np.testing.assert_array_equal(
            numbers[f"audit/4/report/{name}"], numbers[f"audit/0/report/{name}"], err_msg=name
        )
    assert numbers["audit/0/report/included"] > 0
    # the canaries are in the model: the audited run is not the plain DP-FedAvg run
    assert not np.allclose(
        numbers["audit/0/server/0"], numbers["dp-fedavg/0/server/0"], rtol=RTOL, atol=ATOL
    )


def test_cohort_refused_for_memory_on_one_device_runs_on_four(local):
    """Refused on one device because the federation (data and client states) alone does
    not fit; on 4 devices, each holding a quarter of it, the unsharded run's numbers. The
    run on 4 resumes from an unsharded run's checkpoint (round 1), checkpoints its rounds
    split (test_checkpoints_hold_the_states_split_as_the_mesh_does) and finishes: the
    states reach the host from the split carry, a quarter per device."""
    numbers, log = local
    refused = next(line for line in log.splitlines() if line.startswith("refused:"))
    assert "on 1 device(s)" in refused and "clients_per_device" in refused
    assert "data and client states, which alone do not fit" in refused
    _compare(numbers, "memory/", "dp-fedavg/0/")
    alone, split, everything, four = numbers["estimate/memory"].tolist()
    assert four < alone < everything
    assert split == -(-alone // 4)  # 24 clients: 6 a device, a quarter of data and states
    # and so it ran: each device held 6 of the 24 clients' states and data
    assert numbers["estimate/blocks"].tolist() == [24, 6, 24, 6]
    # finish took them to the host from their 4 blocks: host arrays of the 24 clients
    assert numbers["estimate/finished"].tolist() == [24, 6, 1]


def test_the_metrics_are_computed_by_one_device(local):
    """On a 4-device clients mesh the round's evaluation runs on one device (the others
    would repeat it: on CPU virtual devices that cost the cores 3 more evaluations a round)
    and every device gets its metrics, equal to the plain call's for each of two runs."""
    numbers, _ = local
    got = {k.split("/")[2]: numbers[k] for k in numbers if k.startswith("evaluated/4/")}
    assert got  # the check ran
    np.testing.assert_array_equal(numbers["evaluated/4/device/once"], [0, 0])
    for name in ("sum", "ok"):
        np.testing.assert_array_equal(
            numbers[f"evaluated/4/{name}/once"], numbers[f"evaluated/4/{name}/plain"]
        )
    assert numbers["evaluated/4/sum/once"][1] != numbers["evaluated/4/sum/once"][0]


def test_layout_is_printed_and_cpu_reports_no_peak_memory(local):
    _, log = local
    assert "cohort of 19 slots over 4 cpu devices (5 slots each, 1 padding)" in log
    assert "the 24 clients' data and states split 6 a device; 4 devices" in log
    assert "runs over 2 devices" in log
    # the CPU runtime reports no memory statistics: peak memory per device is None
    assert "peak memory {'cpu:0': None, 'cpu:1': None, 'cpu:2': None, 'cpu:3': None}" in log


def test_experiment_devices_two_is_devices_one(local):
    """``experiments.cross_device --devices 2`` (the 4-device process) gives ``--devices 1``'s
    accuracies and losses to the float32 tolerance, records the devices in summary.csv and
    prints its layout before the run: its flat store split over the 2 devices with the
    client states (``ClientStore.split``), each device reading its own clients' rows and
    drawing a capped client's random 16 of 20 rows as one device draws them."""
    numbers, log = local
    assert numbers["experiment/1/devices"].tolist() == [1]
    assert numbers["experiment/2/devices"].tolist() == [2]
    for name in ("final_accuracy", "test_accuracy", "test_loss"):
        np.testing.assert_allclose(
            numbers[f"experiment/2/{name}"], numbers[f"experiment/1/{name}"], rtol=RTOL, atol=ATOL
        )
    assert "fedavg: one device: the cohort's 5 slots on cpu:0" in log
    assert "fedavg: cohort of 5 slots over 2 cpu devices (3 slots each, 1 padding)" in log
    # its flat store (clients of equal size: read into buffers) is split with the states
    assert "the 40 clients' data and states split 20 a device; 2 devices" in log


def test_two_processes_are_the_unsharded_run(local, distributed):
    """2 jax.distributed processes of 2 devices each (a 4-device clients mesh across
    them) give the unsharded run's numbers, as one process with 4 devices does; both
    processes report the same result bit for bit (the client states reach each host block
    by block); a step-reading store split over the two processes' devices as well."""
    numbers, _ = local
    two, logs = distributed
    for alg in ("dp-fedavg", "dp-ftrl", "dp-fedavg-store"):
        _compare(
            {**numbers, **{f"two/{k}": v for k, v in two.items()}}, f"two/{alg}/4/", f"{alg}/0/"
        )
    assert all("4 devices on 2 process(es)" in log for log in logs)
    first = [k for k in two if not k.startswith("rank1/")]
    assert len(first) == len(two) // 2
    for name in first:
        np.testing.assert_array_equal(two[f"rank1/{name}"], two[name], err_msg=name)


def test_two_processes_checkpoint_and_resume(local, distributed):
    """DP-FedAvg over 2 jax.distributed processes, killed after round 2 and resumed from
    its checkpoint by both: the unsharded run's numbers (process 0 writes the folder's
    files, orbax the replicated carry once, and no process goes on before the checkpoint
    is complete)."""
    numbers, _ = local
    two, _ = distributed
    _compare({**numbers, **{f"two/{k}": v for k, v in two.items()}}, "two/resumed/", "dp-fedavg/0/")
    # each process handed orbax its own blocks of the split states (then the toy states')
    saves = [[24, 4, 6, 24]] * 3 + [[24, 4, 6, 21], [21, 3, 7, 21]]
    assert two["checkpoint/saves"].tolist() == saves


# ---- bad input: one line, before any work (this process: one CPU device) ----


def test_clients_mesh_refuses_more_devices_than_present():
    with pytest.raises(ValueError, match=r"^devices=\d+ but \d+ present"):
        clients_mesh(jax.device_count() + 1)


def test_clients_mesh_refuses_another_process_count():
    with pytest.raises(ValueError, match=r"^processes=2 but jax.distributed runs 1 process"):
        clients_mesh(processes=2)


def test_clients_mesh_refuses_runs_not_dividing_devices():
    with pytest.raises(ValueError, match=r"^runs must be an int >= 1 dividing devices=1;"):
        clients_mesh(1, runs=2)


def test_mesh_for_refuses_bad_meshes_and_options():
    one = np.asarray(jax.devices()[:1])
    with pytest.raises(ValueError, match=r"^mesh must have a 'clients' axis"):
        mesh_for(Mesh(one, ("data",)), None, slots=6, runs=1)
    # a (runs 2, clients 1) mesh named over this process's one device, twice: shapes only
    two_runs = Mesh(np.asarray([one[0], one[0]], dtype=object).reshape(2, 1), ("runs", CLIENTS))
    with pytest.raises(
        ValueError, match=r"^mesh's 'runs' axis \(2 devices\) must divide .* 3 runs"
    ):
        mesh_for(two_runs, None, 6, 3)
    assert mesh_for(two_runs, None, 6, 4) is two_runs
    with pytest.raises(ValueError, match=r"^pass mesh= or clients_per_device=, not both"):
        mesh_for(clients_mesh(1), 2, 6, 1)
    with pytest.raises(ValueError, match=r"^clients_per_device=2 needs 3 devices .* 1 present"):
        mesh_for(None, 2, 6, 1)
    with pytest.raises(ValueError, match=r"^mesh must be a jax\.sharding\.Mesh"):
        mesh_for("clients", None, 6, 1)
    assert mesh_for(None, None, 6, 1) is None
    assert mesh_for(None, 6, 6, 1).shape == {CLIENTS: 1}


def test_simulate_refuses_before_any_work(monkeypatch):
    """Through ``simulate``: a mesh without a clients axis, and an algorithm whose round
    exchange is not summed (LocalOnly), refused before the first compiled call."""
    from swarmjax.fl.algorithms.local_only import LocalOnly
    from swarmjax.fl.protocol import RunSpec, Variants
    from swarmjax.fl.runtime import Execution, simulate, simulator

    def no_work(*a, **k):
        raise AssertionError("compiled before refusing")

    monkeypatch.setattr(simulator, "init_runs", no_work)
    clients, test = mesh_runs.federation()
    alg, grid = mesh_runs.algorithms()["fedavg"]
    variants = Variants.grid(alg, clients, RunSpec(1, 1e-3, (0,)), **grid)
    one = np.asarray(jax.devices()[:1])
    with pytest.raises(ValueError, match=r"^mesh must have a 'clients' axis"):
        Execution(mesh=Mesh(one, ("data",)))
    local_only = LocalOnly(alg.model, alg.training)
    variants = Variants.grid(local_only, clients, RunSpec(1, 1e-3, (0,)))
    with pytest.raises(ValueError, match=r"^mesh: LocalOnly's round exchange\(s\) \[0\]"):
        simulate(local_only, clients, test, variants, execution=Execution(mesh=clients_mesh(1)))


def test_start_refuses_a_fresh_secret_per_process(monkeypatch):
    """Over jax.distributed every process must hold the same secret: secret=None (a fresh
    one from each process's entropy) is one line, before any work."""
    from swarmjax.fl.runtime import simulator

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ValueError, match=r"^secret=None would draw a different secret in each"):
        simulator.start(None, None, None, None)


def test_cohort_memory_per_device():
    """The shared part on every device; the padded slots and the runs split by the mesh."""
    memory = CohortMemory(shared=1000, per_slot=10, slots=19, runs=2)
    assert memory.per_device(None) == 1000 + 10 * 19 * 2
    assert memory.per_device(clients_mesh(1)) == 1000 + 10 * 19 * 2
    check_memory(memory, None, limit=1380)
    with pytest.raises(ValueError, match=r"^mesh: the cohort's 19 slots on 1 device\(s\)"):
        check_memory(memory, None, limit=1379)
    with pytest.raises(ValueError, match="data and client states alone do not fit"):
        check_memory(memory, None, limit=999)
    # a stacked federation (2,400 bytes of data, 5 bytes of state per client and run, 24
    # clients) is split over a clients axis: a quarter of it per device on 4 devices
    split = CohortMemory(0, 10, 19, 2, split=2400, per_client=5, clients=24)
    assert split.per_device(None) == 2400 + 5 * 24 * 2 + 10 * 19 * 2
    assert split.federation(clients_mesh(1)) == 2400 + 5 * 24 * 2
    assert split.on_devices(4, 2) == 600 + 5 * 6 * 2 + 10 * 5 * 2
    assert split.fits_on(1500) == 4
    with pytest.raises(ValueError, match=r"states, which alone do not fit.*=clients_mesh\(4\)"):
        check_memory(split, None, limit=1500)


def test_a_split_step_store_holds_its_block_and_one_message_a_device():
    """A step-reading store over a clients axis: each device holds its block of the rows
    and one message of its share of the slots' rows (the largest clients' at most), not
    the whole store; the message is what ``gather_ragged`` is sized by."""
    from swarmjax.fl.protocol import RunSpec, Variants
    from swarmjax.fl.runtime.simulator import cohort_memory

    store, _ = mesh_runs.federation(store=True)
    alg, grid = mesh_runs.algorithms()["dp-fedavg"]
    variants = Variants.grid(alg, store, RunSpec(1, 1e-3), **grid)
    key = jax.random.key(0)[None]
    memory = cohort_memory(alg, store, key, variants.hyper, 1)
    row = store.x[0].nbytes + store.y[0].nbytes  # one stored example and its label
    share = -(-memory.slots // 4)  # 19 Poisson slots: 5 a device
    assert memory.ragged[share - 1] == sum(sorted(mesh_runs.STORE_SIZES)[-share:]) * row
    whole = memory.on_devices(1, 1) - memory.per_slot * memory.slots
    split = memory.on_devices(4, 1) - memory.per_slot * share
    assert (
        split
        == memory.shared
        + -(-memory.split * 6 // 24)
        + memory.per_client * 6
        + (memory.ragged[share - 1])
    )
    assert split < whole
    assert store.split(4).slot_rows(share) * row == memory.ragged[share - 1]


def test_describe_and_peak_memory_in_process():
    assert describe(None, 6).startswith("one device: the cohort's 6 slots")
    assert describe(clients_mesh(1), 6).startswith("cohort of 6 slots over 1 cpu devices")
    assert set(peak_memory()) == {str(d) for d in jax.local_devices()}
