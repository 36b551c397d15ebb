"""FedProx, the algorithm docs/federated.md adds in one new file: mu = 0 is FedAvg draw for
draw, a large mu keeps the clients at the global model, record-level DP is FedAvg's record,
and the docs' example runs as printed."""

from __future__ import annotations

import dataclasses
import math
import re

import jax
import numpy as np
import pytest

from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.algorithms.fedprox import FedProx
from swarmjax.fl.client.training import LocalTraining, RecordDP
from swarmjax.fl.data import load_dataset, partition, stack_clients
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import simulate
from swarmjax.models import mlp
from tests.conftest import REPO
from tests.reproducible import SECRET

MODEL = mlp((16,), 10, (8, 8, 1))
SPEC = RunSpec(2, 1e-5, (0, 1))


@pytest.fixture(scope="module")
def digits():
    ds = load_dataset("digits")
    part = partition(ds.y_train[:600], 3, "iid", seed=0)
    return stack_clients(ds.x_train, ds.y_train, part.indices), (ds.x_test, ds.y_test)


def _run(alg, clients, test, common_random_numbers=False, **hyper):
    spec = dataclasses.replace(SPEC, common_random_numbers=common_random_numbers)
    variants = Variants.grid(alg, clients, spec, epsilon_target=[math.inf], **hyper)
    # one supplied secret for every call: FedAvg and FedProx are compared draw for draw
    return simulate(alg, clients, test, variants, secret=SECRET)


def test_mu_zero_is_fedavg_and_a_large_mu_holds_the_model(digits):
    clients, test = digits
    training = LocalTraining(batch_size=32)
    # two algorithms are two releases with independent keys: pair them on purpose
    paired = dict(learning_rate=[0.3], common_random_numbers=True)
    fedavg = _run(FedAvg(MODEL, training), clients, test, **paired)
    prox0 = _run(FedProx(MODEL, training), clients, test, mu=0.0, **paired)
    for a, b in zip(jax.tree.leaves(fedavg.server), jax.tree.leaves(prox0.server), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    moved = {}  # how far the test loss moves over the run: less when clients stay near w_t
    for mu in (0.0, 30.0):
        res = _run(FedProx(MODEL, training), clients, test, learning_rate=[0.03], mu=mu)
        first = res.metrics["test_loss"][:, 0]
        last = res.metrics["test_loss"][:, -1]
        moved[mu] = float(np.mean(np.abs(last - first)))
    assert moved[30.0] < moved[0.0]


def test_record_level_dp_is_fedavgs_record(digits):
    clients, test = digits
    dp = LocalTraining(batch_size=32, record_dp=RecordDP.for_sizes(clients.sizes, 32))
    spec = RunSpec(1, 1e-5)
    grid = {"epsilon_target": [8.0], "learning_rate": [0.1]}
    runs = {}
    for alg in (FedAvg(MODEL, dp), FedProx(MODEL, dp)):
        runs[type(alg).__name__] = simulate(
            alg, clients, test, Variants.grid(alg, clients, spec, **grid)
        )
    avg, prox = runs["FedAvg"], runs["FedProx"]
    np.testing.assert_array_equal(avg.privacy.epsilon, prox.privacy.epsilon)
    assert prox.privacy.end_to_end
    with pytest.raises(ValueError, match="mu"):
        Variants.grid(FedProx(MODEL, dp), clients, spec, mu=-1.0)


def test_the_docs_example_runs_as_printed():
    text = (REPO / "docs" / "federated.md").read_text()
    block = re.search(r"<!-- example: fedprox-run -->\s*```python\n(.*?)```", text, re.S)
    assert block, "docs/federated.md lost its FedProx example"
    namespace: dict = {}
    exec(compile(block.group(1), "docs/federated.md", "exec"), namespace)
    assert namespace["res"].history["test_accuracy"].iloc[-1] > 0.3
