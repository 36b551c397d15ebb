"""Real secure aggregation across processes (issue 47, items 3 and 5): a SuperLink and 5
SuperNodes on 127.0.0.1 (:class:`LocalDeployment`), distributed-DP FedAvg on a tiny MLP,
cohort 5, ``min_survivors`` 3 (``2 t > m``: the fewest Bonawitz et al. allow), 13-bit
residues (the MLP's 610 parameters rotated in ``d = 625`` coordinates, zero-padded to a
length the FFT takes fast; ``d b = 8,125`` bits: the packed upload's last byte has 3
padding bits).

One run of 5 rounds on the deployment (one ``flwr run``: one ServerApp and one join):

* Round 1 runs without faults and gives the simulator's run: the unmasked sum of
  residues is bit for bit the sum of the simulator's clients' encoded uploads (SHA-256 in
  the operator's ``secagg.csv``); its metrics and bytes, and every round's epsilon, are
  the simulator's; the final model is the unmasked replay's to 1e-6 (measured: 3e-8), and
  that replay with every client counted is the simulator's model (checked in process):
  the decode is one function, but the simulator runs it inside its vmapped round and the
  ServerApp alone, and XLA may order the float32 DCT's sums differently.
* Rounds 2-5 inject faults (the test-only ``secagg-fault-injection`` run configuration
  key), two to a released round (5 - 2 = 3 = t): a client dropping before its upload (its
  masks removed through its reconstructed mask key) or after it (its self mask removed
  through its reconstructed seed; its input counts), and garbage packed uploads (padding
  bits set, one byte too many, the bytes as int8: detected, left out as a dropout) each
  decode to the sum of the clients whose upload was accepted, checked against that sum
  computed without any masks; two rounds beyond the threshold (too few valid uploads; too
  few answers to Unmasking) are refused: nothing unmasked, the model kept,
  ``refused_rounds`` counts them, and the epsilon still charges them. Four fault rounds:
  fewer cannot hold it (the two refusals need a round each; each released round holds at
  most two faults, and a drop before, a drop after and a garbage upload must each happen
  in a released round).

What the server cannot detect: a client that uploads in-range words of its own choosing
(a poisoned but well-formed input); ``tests/test_secagg.py`` shows such a client shifts the
sum by exactly what it chose. Every process is stopped even when a test fails.

Runtimes on the shared 2-core CPU: see docs/testing.md (the nodes compile while they join;
the bad settings run in process, no deployment).
"""

import hashlib
import math
import os
import shutil

import jax
import numpy as np
import pytest

pytest.importorskip("flwr", reason="the flower extra is not installed")

import psutil

from swarmjax.fl.protocol import (
    Slots,
    aggregate_key,
    client_init_key,
    client_key,
    server_init_key,
)
from swarmjax.fl.runtime.flower.client import make_client_app
from swarmjax.fl.runtime.flower.deployment import APP_DIR, LocalDeployment
from swarmjax.fl.runtime.flower.loopback import LoopbackGrid
from swarmjax.fl.runtime.flower.secagg import BUNDLE_BYTES, FAULT_KEY, step_function
from swarmjax.fl.runtime.flower.server import read_run, serve
from swarmjax.fl.runtime.flower.task import load_task
from swarmjax.privacy.bitpack import packed_size
from tests.reproducible import secret_file
from tests.test_flower_runtime import simulated

pytestmark = pytest.mark.slow

CLIENTS = (0, 1, 2, 3, 4)
D, BITS = 625, 13  # d: the 610 parameters zero-padded to 5^4 (DCT rotation)


def config(**extra: object) -> dict:
    """Distributed DP-FedAvg on 150 digits rows (5 clients), an 8-unit MLP (610 parameters,
    rotated in d = 625)."""
    return {
        "task": "swarmjax.fl.runtime.flower.tasks:digits",
        "algorithm": "dp-fedavg-secagg",
        "secret-file": secret_file(),
        "train-size": 150,
        "hidden": 8,
        "num-clients": len(CLIENTS),
        "cohort": len(CLIENTS),
        "min-survivors": 3,
        "bits": BITS,
        "epsilon": 8.0,
        "noise-multiplier": "",  # the app's default is 1.0: distributed DP calibrates
        "accountant": "rdp",
        "rounds": 1,
        **extra,
    }


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """The Flower app with ``cohort`` in its configuration (the shipped app has no default
    that serves every algorithm, docs/flower.md)."""
    folder = tmp_path_factory.mktemp("app") / "flower_app"
    shutil.copytree(APP_DIR, folder, ignore=shutil.ignore_patterns("__pycache__"))
    with open(folder / "pyproject.toml", "a") as f:
        f.write(f"cohort = {len(CLIENTS)}\n")  # the config table is the file's last
    return folder


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or tmp_path_factory.mktemp("jax-cache")
    with LocalDeployment(
        partitions=CLIENTS, node_config={"jax-cache-dir": str(cache)}, task_poll_interval=0.5
    ) as d:
        pids = [p.pid for p in d._procs]
        yield d
        pids += [w.pid for w in d.workers().values()]
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def _deploy(deployment, app, cfg: dict, out):
    cache = deployment.node_config["jax-cache-dir"]
    run_config = {**cfg, "out-dir": str(out), "join-timeout": 1200.0, "jax-cache-dir": cache}
    try:
        deployment.run(run_config, app=app, timeout=1800)
    except RuntimeError as err:
        pytest.fail(f"{err}\n{deployment.logs()}")
    return read_run(out, load_task(cfg))


def _digest(total: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(total, "<u4").tobytes()).hexdigest()


def _replay(cfg: dict, rounds: list[tuple[set[int], set[int], bool]]):
    """The run without any masks: each round the clients in ``computed`` encode their
    update as the simulator's client does, the uploads of ``counted`` are summed modulo
    ``2^b`` in the clear, and the algorithm steps on that sum (``ok`` False: refused).
    Returns the digest of every released round's sum and the final server state."""
    task = load_task(cfg)
    alg, hyper, key = task.algorithm, task.hyper, task.run_key
    ex, plan, n = alg.exchanges[0], alg.plan, task.num_clients
    client = jax.jit(ex.client)
    data = {c: task.client_data(c) for c in CLIENTS}
    states = {
        c: alg.client_init(client_init_key(key, c), data[c], hyper, np.int32(c)) for c in CLIENTS
    }
    server = alg.server_init(server_init_key(key), hyper)
    digests = []
    for r, (computed, counted, ok) in enumerate(rounds, start=1):
        request = ex.request(server)
        total = np.zeros(alg.dimension(hyper.inner), np.uint32)
        for c in sorted(computed):
            states[c], encoded = client(
                states[c], data[c], request, client_key(key, r, 0, c), hyper
            )
            if c in counted:
                total += np.asarray(encoded)
        total &= np.uint32(2**plan.bits - 1)
        digests.append(_digest(total) if ok else "")
        survived = Slots.everyone(np.isin(np.arange(n), sorted(counted)))
        summed = total if ok else np.zeros_like(total)
        okay = np.asarray(ok)
        server = step_function(alg)(server, survived, summed, okay, aggregate_key(key, r, 0), hyper)
    return digests, server


FAULTS = ",".join(
    [  # round 1 runs without a fault
        "1:drop-before-upload@2",  # round 2: its masks removed via its mask key
        "3:garbage-range@2",  # and padding bits set: left out; 3 = t uploads remain
        "2:drop-after-upload@3",  # round 3: its input counts, its seed reconstructed
        "0:garbage-length@3",  # and one byte too many: left out; 3 = t answer Unmasking
        "1:garbage-dtype@4",  # round 4: three uploads bad or missing, 2 < 3 left: refused
        "3:drop-before-upload@4",
        "4:garbage-range@4",
        "0:drop-after-upload@5",  # round 5: 2 < 3 answer Unmasking: refused
        "1:drop-after-upload@5",
        "2:drop-after-upload@5",
    ]
)


def test_the_replay_without_masks_is_the_simulators_run():
    """The reference the deployment is checked against below: with every client counted,
    the unmasked replay's model is the simulator's (so a deployment equal to the replay is
    equal to the simulator)."""
    cfg = config(rounds=5)
    _, server = _replay(cfg, [(set(CLIENTS), set(CLIENTS), True)] * 5)
    for x, y in zip(jax.tree.leaves(server), jax.tree.leaves(simulated(cfg).server), strict=True):
        np.testing.assert_allclose(np.asarray(y)[0], np.asarray(x), rtol=0, atol=1e-6)


def test_across_processes_a_clean_round_is_the_simulators_and_faults_decode_or_are_refused(
    deployment, app, tmp_path
):
    """One deployment run of 5 rounds: round 1 without faults (the simulator's numbers,
    every client in every stage, the bytes of each stage), then the four fault rounds."""
    cfg = config(rounds=5)
    run = _deploy(deployment, app, {**cfg, FAULT_KEY: FAULTS}, tmp_path / "faults")
    everyone = set(CLIENTS)
    digests, server = _replay(
        cfg,
        [  # (computed an update, upload counted, released)
            (everyone, everyone, True),
            ({0, 2, 3, 4}, {0, 2, 4}, True),
            (everyone, {1, 2, 3, 4}, True),
            ({0, 1, 2, 4}, {0, 2}, False),
            (everyone, everyone, False),
        ],
    )
    # round 1: the simulator's numbers; every round charges the simulator's epsilon
    sim = simulated(cfg)
    h, first = run.history, run.history.iloc[:1]
    assert list(h.columns) == list(sim.history.columns)
    for col in ("test_accuracy", "test_loss"):
        np.testing.assert_allclose(first[col], sim.history[col].iloc[:1], rtol=0, atol=1e-6)
    np.testing.assert_allclose(h["epsilon_max"], sim.history["epsilon_max"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(run.privacy.epsilon, sim.privacy.epsilon)
    assert run.privacy.covers == sim.privacy.covers
    assert run.privacy.not_covered == sim.privacy.not_covered
    rec = run.operator.secagg
    for col in ("advertised", "shared"):
        assert rec[col].iloc[0] == "0 1 2 3 4"
    assert list(rec["uploaded"]) == ["0 1 2 3 4", "0 2 4", "1 2 3 4", "0 2", "0 1 2 3 4"]
    assert list(rec["unmasked"]) == ["0 1 2 3 4", "0 2 4", "1 3 4", "", "3 4"]
    assert list(rec["sum_sha256"]) == digests  # the unmasked sums, bit for bit
    assert list(rec["outcome"][:3]) == ["released"] * 3
    assert rec["outcome"][3].startswith("refused: 2 valid masked inputs")
    assert rec["outcome"][4].startswith("refused: 2 clients answered Unmasking")
    for x, y in zip(jax.tree.leaves(run.server), jax.tree.leaves(server), strict=True):
        np.testing.assert_allclose(np.asarray(x)[0], np.asarray(y), rtol=0, atol=1e-6)
    # bytes per client of each stage in round 1 (array payloads): 2 public keys up; 4
    # bundles up; the model down and d = 625 words of 13 bits up, packed: 1,016 bytes, what
    # the simulator's history counts too (the exchange's reply_bits); 5 seed shares up
    messages = run.operator.messages
    m = messages[messages["round"] == 1]
    up = m.groupby("exchange")["bytes_up"].max()
    assert up["train/advertise"] == 64
    assert up["train/share"] == 4 * (8 + BUNDLE_BYTES)
    assert up["train/mask"] == packed_size(D, BITS) == math.ceil(D * BITS / 8) == 1016
    assert sim.history["bytes_up"].iloc[0] / len(CLIENTS) == 1016
    assert up["train/unmask"] == 5 * (8 + 66)
    assert (m["status"] == "ok").all()
    # the faults, each detected where it happened
    status = messages.set_index(["round", "exchange", "client"])["status"]
    padding = "rejected: packed words have padding bits set (after bit 8125)"
    assert "drops before uploading" in status[(2, "train/mask", 1)]
    assert status[(2, "train/mask", 3)] == status[(4, "train/mask", 4)] == padding
    assert "drops after uploading" in status[(3, "train/unmask", 2)]
    longer = "'packed' has shape (1017,) and dtype uint8; expected (1016,)"
    assert longer in status[(3, "train/mask", 0)]
    assert "'packed' has shape (1016,) and dtype int8; expected" in status[(4, "train/mask", 1)]
    assert "drops before uploading" in status[(4, "train/mask", 3)]
    assert all("drops after uploading" in status[(5, "train/unmask", c)] for c in (0, 1, 2))
    # the released record: refused rounds counted, the model kept, the epsilon charged
    assert list(h["refused_rounds"]) == [0, 0, 0, 1, 2]
    assert h["test_accuracy"].iloc[3] == h["test_accuracy"].iloc[4] == h["test_accuracy"].iloc[2]
    assert (np.diff(h["epsilon_max"]) > 0).all()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({FAULT_KEY: "1:explode"}, f"{FAULT_KEY} must be 'ID:FAULT[@ROUND]' items"),
        ({FAULT_KEY: "5:garbage-range"}, f"{FAULT_KEY} must be 'ID:FAULT[@ROUND]' items"),
        ({FAULT_KEY: "1:garbage-range", "bits": 16}, f"{FAULT_KEY}: garbage-range sets"),
        ({FAULT_KEY: "0:garbage-range@x"}, f"{FAULT_KEY} must be 'ID:FAULT[@ROUND]' items"),
        ({"dropout": 0.1}, "dropout must be 0 on Flower (it simulates dropouts"),
    ],
)
def test_bad_secure_aggregation_settings_fail_in_one_line_before_any_message(extra, message):
    cfg = config(**extra, **{"jax-cache-dir": ""})  # "": this process's JAX left alone
    grid = LoopbackGrid.with_partitions(make_client_app(), cfg, CLIENTS)
    with pytest.raises(ValueError) as err:
        serve(grid, cfg)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    assert grid.pushed == 0  # no node was messaged


def test_secure_aggregation_refuses_nodes_without_a_worker_before_any_round():
    """``worker = false`` (each message in a fresh ClientApp process) would lose a client's
    secrets between stages and drop every client from every round: the node says so in its
    hello and the ServerApp stops in one line naming the setting, before any round."""
    cfg = config(**{"jax-cache-dir": ""})
    grid = LoopbackGrid.with_partitions(make_client_app(), cfg, CLIENTS, worker=False)
    with pytest.raises(ValueError) as err:
        serve(grid, cfg)
    assert str(err.value).startswith("node 100 has worker = false in its node configuration")
    assert "\n" not in str(err.value)
    assert grid.pushed == len(CLIENTS)  # the hellos, nothing else
