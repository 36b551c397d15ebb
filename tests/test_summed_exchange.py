"""Summed exchanges (``Exchange.aggregate_sum``): the simulator adds each reply into the sum
as it comes instead of stacking the cohort's replies; the result is the stacked path's, bit
for bit, under every client map, and unused slots (NaN included) add nothing."""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmjax.fl.algorithms.client_level_dp_fedavg import dp_fedavg
from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data import load_dataset
from swarmjax.fl.private import Private
from swarmjax.fl.protocol import RunSpec, Variants, slot_sum
from swarmjax.fl.runtime import Execution, simulate
from swarmjax.fl.runtime import simulator as sim
from swarmjax.models import mlp
from swarmjax.privacy.participation import Poisson
from tests.reproducible import SECRET
from tests.test_fl_protocol import forty_clients

MODEL = mlp((8,), 10, (8, 8, 1))


def _client(state, data, cid):
    """A client whose reply is NaN unless its slot is used (``data`` > 0)."""
    reply = {
        "w": jnp.where(data > 0, jnp.sin(jnp.arange(5.0) * data + cid), jnp.nan),
        "b": jnp.where(data > 0, data * 0.1, jnp.inf),
    }
    return state + 1.0, reply


@pytest.mark.parametrize("client_map", ["vmap", "sequential", 2, 3])
def test_the_fold_is_the_stacked_slot_sum_bit_for_bit(client_map):
    s = 7
    used = jnp.array([True, False, True, True, False, False, True])
    data = jnp.where(used, jnp.arange(1.0, s + 1) * 1.37, 0.0)
    args = (jnp.zeros(s), data, jnp.arange(s))
    fold = jax.jit(lambda a, u: sim._map_clients(_client, a, client_map, u, summed=True))
    stack = jax.jit(lambda a, u: sim._map_clients(_client, a, client_map, u))
    states, total = fold(args, used)
    states_stacked, replies = stack(args, used)
    chex.assert_trees_all_equal(total, slot_sum(replies, used))
    assert np.isfinite(total["w"]).all() and np.isfinite(total["b"])
    np.testing.assert_array_equal(np.asarray(states)[used], np.asarray(states_stacked)[used])
    expected = sum(np.sin(np.arange(5.0) * float(d) + i) for i, d in enumerate(data) if d > 0)
    np.testing.assert_allclose(total["w"], expected, rtol=1e-5)


def test_slot_sum_with_weights_and_a_start():
    tree = {"a": jnp.array([[1.0, 2.0], [jnp.nan, 1.0], [3.0, 4.0]])}
    mask = jnp.array([True, False, True])
    out = slot_sum(tree, mask, jnp.array([2.0, 5.0, 0.5]), start={"a": jnp.array([10.0, 0.0])})
    np.testing.assert_array_equal(out["a"], [10.0 + 2.0 + 1.5, 4.0 + 2.0])


def test_slot_sum_of_no_slots_and_of_bfloat16():
    empty = slot_sum({"a": jnp.zeros((0, 3))}, jnp.zeros((0,), bool))
    np.testing.assert_array_equal(empty["a"], np.zeros(3))
    low = slot_sum({"a": jnp.ones((2, 3), jnp.bfloat16)}, jnp.array([True, False]))
    assert low["a"].dtype == jnp.float32  # summed float32 or wider
    np.testing.assert_array_equal(low["a"], np.ones(3))


@settings(max_examples=25, deadline=None)
@given(  # no subnormals: XLA's CPU flushes them to zero (1.4e-45 summed to 0.0, a false failure)
    st.lists(
        st.tuples(st.booleans(), st.floats(-1e6, 1e6, width=32, allow_subnormal=False)),
        min_size=1,
        max_size=9,
    ),
    st.sampled_from([np.nan, np.inf, -np.inf, 1e30]),
)
def test_slot_sum_is_the_sum_of_the_selected_slots_whatever_the_others_hold(slots, junk):
    mask = np.array([m for m, _ in slots])
    values = np.array([v if m else junk for m, v in slots], np.float32)
    out = slot_sum({"x": jnp.asarray(values)[:, None]}, jnp.asarray(mask))
    expected = np.float32(0)
    for m, v in zip(mask, values, strict=True):  # in slot order, float32, as documented
        expected = np.float32(expected + v) if m else expected
    np.testing.assert_array_equal(out["x"], [expected])


def test_the_accelerator_product_is_the_loop_to_rounding():
    """On a GPU or TPU ``slot_sum`` is a masked product (not run here otherwise)."""
    from swarmjax.fl.protocol import _slot_product

    rng = np.random.default_rng(0)
    x = rng.normal(size=(11, 4, 3)).astype(np.float32)
    mask = rng.random(11) < 0.6
    x[~mask] = np.nan  # unselected slots hold junk
    w = rng.random(11).astype(np.float32)
    start = {"a": jnp.full((4, 3), 0.25)}
    for weights in (None, jnp.asarray(w)):
        loop = slot_sum({"a": jnp.asarray(x)}, jnp.asarray(mask), weights, start=start)
        product = _slot_product({"a": jnp.asarray(x)}, jnp.asarray(mask), weights, start)
        assert np.isfinite(product["a"]).all()
        np.testing.assert_allclose(product["a"], loop["a"], rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def federation():
    clients, _, _ = forty_clients()  # 40 digits clients of 20 rows
    test = load_dataset("digits")
    return clients, (test.x_test[:200], test.y_test[:200])


def _unsummed(cls, monkeypatch):
    """``cls`` with its exchanges' ``aggregate_sum`` removed (the stacked path), same type
    and settings (so the same run keys); compiled programs are dropped first."""
    summed = cls.exchanges

    def stacked(self):
        return tuple(dataclasses.replace(ex, aggregate_sum=None) for ex in summed.fget(self))

    jax.clear_caches()
    monkeypatch.setattr(cls, "exchanges", property(stacked))


NAMES, MAPS = ("dp-fedavg", "fedavg"), ("sequential", 3)


def _algorithm(name: str):
    """The class whose exchange carries the summed fold, the algorithm and its grid: DP-FedAvg
    (Poisson cohort, adaptive clipping) is FedAvg under a plan, whose exchange is summed;
    FedAvg's uniform cohort sums its own."""
    training = LocalTraining(batch_size=10)
    if name == "dp-fedavg":
        alg = dp_fedavg(MODEL, training=training, participation=Poisson(20))
        return Private, alg, {"sample_rate": 0.1, "noise_multiplier": 0.8}
    return FedAvg, FedAvg(MODEL, training, cohort=6, server_optimizer="sgd"), {}


@pytest.fixture(scope="module")
def summed_and_stacked(federation):
    """Each (algorithm, client map)'s run summed, then stacked: every summed run first, then
    each class's stacked runs with its fold removed (the compiled programs dropped once per
    class, not once per case), so runs of one kind share what they have in common (run
    initialisation, evaluation). One supplied secret for every call: the same cohorts,
    batches and noise."""
    clients, test = federation

    def run(alg, grid, client_map):
        variants = Variants.grid(alg, clients, RunSpec(3, 1e-3, (0, 1)), **grid)
        execution = Execution(client_map=client_map)
        return simulate(alg, clients, test, variants, secret=SECRET, execution=execution)

    out = {}
    for name in NAMES:
        _, alg, grid = _algorithm(name)
        assert alg.exchanges[0].aggregate_sum is not None
        for client_map in MAPS:
            out[name, client_map] = [run(alg, grid, client_map)]
    for name in NAMES:
        cls, alg, grid = _algorithm(name)
        with pytest.MonkeyPatch.context() as patch:
            _unsummed(cls, patch)
            assert alg.exchanges[0].aggregate_sum is None
            for client_map in MAPS:
                out[name, client_map].append(run(alg, grid, client_map))
    jax.clear_caches()  # the stacked programs, keyed as the summed ones, must not outlive it
    return out


@pytest.mark.parametrize("client_map", MAPS)
@pytest.mark.parametrize("name", NAMES)
def test_a_summed_run_is_the_stacked_run(summed_and_stacked, client_map, name):
    """Whole runs: the summed fold and the stacked replies give the same bits."""
    summed, stacked = summed_and_stacked[name, client_map]
    chex.assert_trees_all_equal(summed.server, stacked.server)
    assert np.isfinite(np.asarray(summed.history["test_loss"])).all()
