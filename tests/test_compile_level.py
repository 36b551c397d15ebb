"""The suite compiles with its own XLA flags (``tests/conftest.py``: LLVM at -O0, the
legacy elemental fusion emitters and one LLVM module per program) on the premise that they
change speed, not results. This checks it: the same DP-Adam FedAvg round (Poisson sampling,
per-example clipping, Gaussian noise, a matmul model) and the same PAASO voting swarm,
computed in fresh processes with the suite's flags and at XLA's defaults (what users run),
make the same discrete choices and agree to float32 rounding (they are not bit-identical:
-O2 fuses multiply-adds, and the two emitters fuse differently; measured 1e-7 relative on
the model, 5e-7 on the swarms)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.conftest import REPO, SUITE_XLA_FLAGS

_PROGRAM = r"""
import sys
import jax, jax.numpy as jnp, numpy as np
from swarmjax import paaso
from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.client.training import LocalTraining, RecordDP
from swarmjax.fl.data.clients import stack_clients
from swarmjax.fl.data import load_dataset
from swarmjax.fl.data.partition import iid_partition
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import simulate
from swarmjax.models import mlp
from tests.reproducible import SECRET  # both processes draw the same noise

data = load_dataset("digits")
part = iid_partition(data.y_train[:200], 2, seed=0)
clients = stack_clients(data.x_train, data.y_train, part.indices)
dp = LocalTraining(batch_size=16, optimizer="adam", record_dp=RecordDP.for_sizes(clients.sizes, 16))
alg = FedAvg(mlp((8,), 10, (8, 8, 1)), dp)
variants = Variants.grid(alg, clients, RunSpec(1, 1e-5), learning_rate=[0.01], epsilon_target=[8.0])
res = simulate(alg, clients, (data.x_test[:100], data.y_test[:100]), variants, secret=SECRET)
cfg = paaso.PAASOConfig(strategy="voting", function="f5", iterations=50)
pbdrd = paaso.VOTING.index("pbdrd")
swarms = jax.jit(jax.vmap(lambda k: paaso.run(k, cfg, paaso.PAASOHyper(), voting=pbdrd)))(
    jax.random.split(jax.random.key(3), 4))
leaves = [np.asarray(leaf) for leaf in jax.tree.leaves((res.server, swarms))]
leaves.append(res.history[["test_loss", "test_accuracy"]].to_numpy())
np.savez(sys.argv[1], *leaves)
"""


def _run(suite_flags: bool, out: Path) -> list[np.ndarray]:
    """The program in a fresh process, with the suite's XLA flags or with none of them."""
    flags = [
        f
        for f in os.environ.get("XLA_FLAGS", "").split()
        if not any(name in f for name in SUITE_XLA_FLAGS)
    ]
    if suite_flags:
        flags += [f"--{k}={v}" for k, v in SUITE_XLA_FLAGS.items()]
    env = {**os.environ, "XLA_FLAGS": " ".join(flags)}
    proc = subprocess.run(
        [sys.executable, "-c", _PROGRAM, str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(out) as arrays:
        return [arrays[k] for k in arrays.files]


def test_the_suites_compile_flags_change_no_result(tmp_path):
    fast, default = _run(True, tmp_path / "suite.npz"), _run(False, tmp_path / "default.npz")
    assert len(fast) == len(default) == 10
    for a, b in zip(fast, default, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        if a.dtype.kind == "f":
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        else:  # voters, non-finite counts: the same choices
            np.testing.assert_array_equal(a, b)
