"""Mid-run checkpoints: a simulation killed (SIGKILL) after round 2 of 5 resumes from its
orbax checkpoint (and the secret saved beside it) and ends with exactly the numbers of an
uninterrupted run under that secret; a folder of another run is refused. Client states
saved with one padding restore with another (the padding cut, or grown and refilled), and
what a checkpoint cannot hold is one line. (Split over several devices: tests/test_mesh.py.)"""

from __future__ import annotations

import stat
import subprocess
import sys

import jax
import numpy as np
import pandas as pd
import pytest

from swarmjax.fl.runtime.checkpoint import SECRET_FILE
from swarmjax.privacy.secret import Secret
from tests.conftest import REPO

SETUP = r"""
import math
from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data import load_dataset, partition, stack_clients
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import Execution, simulate
from swarmjax.models import mlp

data = load_dataset("digits")
clients = stack_clients(data.x_train, data.y_train, partition(data.y_train, 6, "iid").indices)
alg = FedAvg(mlp((16,), 10, data.input_shape), LocalTraining(batch_size=32), cohort=3,
             server_optimizer="adam")
variants = Variants.grid(alg, clients, RunSpec(5, 1e-5, (0, 1)), server_lr=[0.01, 0.03])
test = (data.x_test, data.y_test)
"""

KILL_AFTER_TWO = r"""
import os, signal, sys
from swarmjax.fl.runtime import checkpoint

save = checkpoint.Checkpoints.save

def save_then_die(self, rounds_done, *args, **kwargs):
    save(self, rounds_done, *args, **kwargs)
    if rounds_done == 2:
        os.kill(os.getpid(), signal.SIGKILL)

checkpoint.Checkpoints.save = save_then_die
execution = Execution(rounds_per_call=1, checkpoint_dir=sys.argv[1])
simulate(alg, clients, test, variants, execution=execution)
raise SystemExit("not killed")
"""


def _namespace() -> dict:
    ns: dict = {}
    exec(SETUP, ns)
    return ns


def test_a_killed_run_resumes_and_ends_as_an_uninterrupted_one(tmp_path):
    folder = tmp_path / "ckpt"
    proc = subprocess.run(
        [sys.executable, "-c", SETUP + KILL_AFTER_TWO, str(folder)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert (folder / "outputs_2.npz").exists() and not (folder / "outputs_3.npz").exists()
    # no secret was passed: the run drew one from OS entropy and kept it, owner-only
    key_file = folder / SECRET_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    secret = Secret.load(key_file)
    assert secret.source == "entropy"

    ns = _namespace()
    run = ns["simulate"]
    args = (ns["alg"], ns["clients"], ns["test"], ns["variants"])
    Execution = ns["Execution"]
    resumed = run(*args, execution=Execution(rounds_per_call=1, checkpoint_dir=folder))
    whole = run(*args, secret=secret, execution=Execution(rounds_per_call=1))  # uninterrupted
    pd.testing.assert_frame_equal(resumed.history, whole.history)
    for a, b in zip(jax.tree.leaves(resumed.server), jax.tree.leaves(whole.server), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(resumed.privacy.epsilon, whole.privacy.epsilon)
    assert (folder / "outputs_5.npz").exists()
    assert resumed.privacy.key_fingerprints == whole.privacy.key_fingerprints
    assert resumed.privacy.randomness["secret"] == "entropy"

    other = ns["Variants"].grid(ns["alg"], ns["clients"], ns["RunSpec"](5, 1e-5, (0, 1)))
    with pytest.raises(ValueError, match="holds a run with other settings"):
        run(ns["alg"], ns["clients"], ns["test"], other, execution=Execution(checkpoint_dir=folder))


def test_a_zero_size_leaf_round_trips_through_a_checkpoint(tmp_path):
    """orbax refuses zero-size arrays; a carry holding one (a BLT noise state of 0 buffers,
    shape (0, P)) still saves and restores, the empty leaf coming back with its shape."""
    from swarmjax.fl.runtime.checkpoint import Checkpoints

    carry = {"noise": np.zeros((0, 7), np.float32), "w": jax.numpy.arange(3.0)}
    saved = Checkpoints(tmp_path / "ck", "digest", {})
    saved.save(1, carry, {"m": np.ones((2, 1))})
    like = {"noise": np.zeros((0, 7), np.float32), "w": jax.numpy.zeros(3)}
    restored, outputs = saved.restore(1, like, {"m": np.zeros((2, 1))})
    saved.close()
    assert restored["noise"].shape == (0, 7)
    np.testing.assert_array_equal(np.asarray(restored["w"]), [0.0, 1.0, 2.0])
    np.testing.assert_array_equal(outputs["m"], np.ones((2, 1)))


def test_a_restored_carry_is_placed_as_the_fresh_one_so_the_round_is_not_compiled_again(tmp_path):
    """A fresh run's carry is uncommitted (default device); orbax restores committed arrays.
    The compiled round is keyed by placement, so a resume in the same process (a notebook
    after Ctrl-C, the tests) compiled it again. Restored leaves now take the fresh carry's
    placement: uncommitted stays uncommitted (PRNG keys too), committed gets its sharding;
    one jitted program serves both carries."""
    from swarmjax.fl.runtime.checkpoint import Checkpoints

    device = jax.devices()[0]
    carry = {
        "w": jax.numpy.arange(3.0),
        "key": jax.random.key(1),
        "pinned": jax.device_put(np.arange(4, dtype=np.int32), device),
    }
    saved = Checkpoints(tmp_path / "ck", "digest", {})
    saved.save(1, carry, {"m": np.ones((1,))})
    restored, _ = saved.restore(1, carry, {"m": np.zeros((1,))})
    saved.close()
    assert not restored["w"].committed and not restored["key"].committed
    assert restored["pinned"].committed and restored["pinned"].sharding == carry["pinned"].sharding
    np.testing.assert_array_equal(
        jax.random.key_data(restored["key"]), jax.random.key_data(carry["key"])
    )
    step = jax.jit(lambda c: jax.tree.map(lambda x: x, c))
    step(carry)
    step(restored)
    assert step._cache_size() == 1


@pytest.mark.parametrize("changed", ["carry", "outputs"])
def test_a_checkpoint_of_another_state_layout_is_one_line_not_a_traceback(tmp_path, changed):
    """A folder saved by another version of the code (its client states held other fields:
    session 28 replaced each client's ``Spend`` by a step count) under the same settings'
    fingerprint: the resume stops in one line naming the folder and ``--restart``, before
    any round, instead of orbax's tree mismatch or outputs unflattened into the wrong
    leaves."""
    from swarmjax.fl.runtime.checkpoint import Checkpoints
    from swarmjax.resume import OutputConflict

    carry = {"w": jax.numpy.arange(3.0), "spend": {"q": np.zeros(2), "steps": np.zeros(2, int)}}
    outputs = {"m": np.ones((1, 2)), "steps": np.zeros((1, 2, 4), np.int32)}
    saved = Checkpoints(tmp_path / "ck", "digest", {})
    saved.save(1, carry, outputs)
    saved.close()
    if changed == "carry":
        carry = {"w": jax.numpy.zeros(3), "steps": np.zeros(2, np.int32)}
    else:
        outputs = {"m": np.ones((1, 2)), "steps": np.zeros((1, 2), np.int32)}
    again = Checkpoints(tmp_path / "ck", "digest", {})
    with pytest.raises(OutputConflict) as err:
        again.restore(1, carry, outputs)
    again.close()
    message = str(err.value)
    assert "\n" not in message and str(tmp_path / "ck") in message and "--restart" in message


def _split_carry(rows: int, fill: float) -> tuple:
    """A simulator-like carry ``(server, client states, rounds done)``: 5 real clients'
    states ``(runs 2, rows, 3)`` then ``rows - 5`` padding rows of ``fill``."""
    states = np.arange(30, dtype=np.float32).reshape(2, 5, 3)
    padding = np.full((2, rows - 5, 3), fill, np.float32)
    split = jax.numpy.asarray(np.concatenate([states, padding], axis=1))
    return jax.numpy.ones(4), split, np.ones((), np.int32)


def test_client_states_restore_with_another_padding_and_the_padding_is_refilled(tmp_path):
    """Client states saved with 8 rows (5 clients, 3 padding) restore into 6 rows (the
    padding cut) and 10 (zeros past the 8 saved, which ``refill_padding`` turns into copies
    of client 4, as a fresh run pads), the 5 clients as saved, with the target's
    placement."""
    from jax.sharding import NamedSharding, PartitionSpec

    from swarmjax.fl.runtime.checkpoint import Checkpoints
    from swarmjax.fl.runtime.mesh import clients_mesh, refill_padding

    carry = _split_carry(8, -1.0)
    saved = Checkpoints(tmp_path / "ck", "digest", {})
    saved.save(1, carry, {"m": np.ones((1,))}, clients=5)
    real = np.asarray(carry[1])[:, :5]
    (_, cut, _), _ = saved.restore(1, _split_carry(6, 0.0), {"m": np.zeros((1,))}, clients=5)
    np.testing.assert_array_equal(np.asarray(cut), np.asarray(carry[1])[:, :6])
    sharding = NamedSharding(clients_mesh(1), PartitionSpec(None, "clients"))
    like = (carry[0], jax.device_put(np.zeros((2, 10, 3), np.float32), sharding), carry[2])
    (_, grown, _), _ = saved.restore(1, like, {"m": np.zeros((1,))}, clients=5)
    saved.close()
    assert grown.sharding == sharding
    np.testing.assert_array_equal(np.asarray(grown)[:, 8:], 0.0)  # past the rows saved
    refilled = np.asarray(refill_padding(sharding, grown, 5))
    np.testing.assert_array_equal(refilled[:, :5], real)
    np.testing.assert_array_equal(refilled[:, 5:], np.broadcast_to(real[:, 4:], (2, 5, 3)))


@pytest.mark.parametrize("change", ["too few rows", "another N", "server", "old folder"])
def test_a_client_states_checkpoint_it_cannot_hold_is_one_line(tmp_path, change):
    """Refused in one ``OutputConflict`` line, never padded or cut silently: a target with
    fewer rows than the clients ``N``, another ``N`` than recorded, a server leaf of
    another shape, and a folder saved before ``N`` was recorded (the carry alone)."""
    import orbax.checkpoint as ocp

    from swarmjax.fl.runtime.checkpoint import Checkpoints
    from swarmjax.resume import OutputConflict

    saved = Checkpoints(tmp_path / "ck", "digest", {})
    carry, clients, like = _split_carry(8, -1.0), 5, _split_carry(6, 0.0)
    if change == "old folder":
        saved._manager.save(1, args=ocp.args.StandardSave(carry))
        saved.save(2, carry, {"m": np.ones((1,))}, clients=5)  # writes outputs_2.npz
        (tmp_path / "ck" / "outputs_2.npz").rename(tmp_path / "ck" / "outputs_1.npz")
    else:
        saved.save(1, carry, {"m": np.ones((1,))}, clients=5)
    if change == "too few rows":
        like = (carry[0], np.zeros((2, 4, 3), np.float32), carry[2])
    elif change == "another N":
        clients = 6
    elif change == "server":
        like = (jax.numpy.ones(3), *like[1:])
    with pytest.raises(OutputConflict, match="another layout") as err:
        saved.restore(1, like, {"m": np.zeros((1,))}, clients=clients)
    saved.close()
    assert "\n" not in str(err.value) and "--restart" in str(err.value)
