"""Issue 30: every privacy record true under ONE stated neighbouring relation, and nothing
released that voids it (relation per unit, released vs operator-only outputs, noise in
float32, overflow for both neighbours, the mask rule on clipped private values, checks on
the stored float32 values)."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.fl.algorithms.client_level_dp_fedavg import dp_fedavg
from swarmjax.fl.algorithms.fed_dp_pso import FedDPPSO
from swarmjax.fl.client.training import LocalTraining, RecordDP
from swarmjax.fl.data import load_dataset
from swarmjax.fl.data.clients import stack_clients
from swarmjax.fl.data.partition import iid_partition
from swarmjax.fl.protocol import (
    RunSpec,
    Variants,
    run_keys,
    server_init_key,
    variant_identities,
)
from swarmjax.fl.runtime import simulate
from swarmjax.fl.runtime.result import RELATIONS
from swarmjax.models import mlp
from swarmjax.privacy.participation import Poisson
from tests.reproducible import SECRET

MODEL = mlp((8,), 10, (8, 8, 1))


@pytest.fixture(scope="module")
def digits():
    data = load_dataset("digits")
    x, y = data.x_train[:240], data.y_train[:240]
    clients = stack_clients(x, y, iid_partition(y, 4, seed=0).indices)
    return clients, (data.x_test[:200], data.y_test[:200])


def _pso(**kw) -> FedDPPSO:
    training = LocalTraining(batch_size=30, optimizer="adam", record_dp=RecordDP(capacity=60))
    return FedDPPSO(MODEL, training, particles=2, private_selection=True, **kw)


# ------------------------------------------------------------------ 1. one relation per unit


def test_every_privacy_record_states_its_one_relation(digits):
    clients, test = digits
    spec = RunSpec(rounds=1, delta=1e-5)
    pso = _pso(eval_subset=20)
    res = simulate(pso, clients, test, Variants.grid(pso, clients, spec, epsilon_target=4.0))
    assert res.privacy.relation == RELATIONS["record"]
    assert res.privacy.relation.startswith("record-level, zero-out")
    # the Laplace score is calibrated for zero-out: sensitivity bound / m, m the public
    # size of the fixed scored subset (n unchanged under zero-out)
    eps1 = pso.selection_epsilon / (2 + 1 * (2 + 1))  # S at setup + S + 1 per round
    scale = np.asarray(res.clients.score_scale)[0]
    np.testing.assert_allclose(scale, pso.loss_bound / (20 * eps1), rtol=1e-6)
    dp = dp_fedavg(MODEL, training=LocalTraining(batch_size=30), clipping="fixed")
    res = simulate(dp, clients, test, Variants.grid(dp, clients, spec, sample_rate=0.5))
    assert res.privacy.relation == RELATIONS["client"]
    assert res.privacy.relation.startswith("client-level, add/remove")


# ------------------------------------------------------- 2. released versus operator-only


def test_flower_releases_no_membership_and_no_timing(tmp_path):
    pytest.importorskip("flwr", reason="the flower extra is not installed")
    from swarmjax.fl.runtime.flower.client import make_client_app
    from swarmjax.fl.runtime.flower.loopback import LoopbackGrid
    from swarmjax.fl.runtime.flower.server import ServerSettings, drive, read_run
    from swarmjax.fl.runtime.flower.task import load_task

    cfg = {
        "task": "swarmjax.fl.runtime.flower.tasks:digits",
        "algorithm": "dp-fedavg",
        "rounds": 2,
        "train-size": 150,
        "hidden": 8,
    }
    task = load_task(cfg)
    grid = LoopbackGrid.with_partitions(make_client_app(), cfg, (0, 1, 2))
    settings = ServerSettings(join_timeout=1.0, reply_timeout=1.0, out_dir=tmp_path)
    run = drive(grid, task, settings)
    released = sorted(p.name for p in (tmp_path / "released").iterdir())
    assert released == ["history.csv", "privacy.json", "server.npz"]
    operator = sorted(p.name for p in (tmp_path / "operator").iterdir())
    assert operator == ["messages.csv", "rounds.csv", "server.log"]
    record = json.loads((tmp_path / "released" / "privacy.json").read_text())
    assert record["relation"] == RELATIONS["client"]
    assert sorted(record["not_released"]) == [f"operator/{name}" for name in operator]
    # the released history: the expected cohort q_c N, no wall time, no realised count
    history = run.released.history
    assert "seconds" not in history
    expected = float(task.hyper.sample_rate) * task.num_clients
    np.testing.assert_allclose(history["selected_train"], expected)
    # the operator holds the realised cohort, named as the simulator's diagnostics
    realised = run.operator.private_diagnostics["selected"]
    assert realised.shape == (1, 2, 1)
    messaged = run.operator.messages.query("not setup").groupby("round").size()
    np.testing.assert_array_equal(realised[0, :, 0], messaged.reindex([1, 2], fill_value=0))
    assert "seconds" in run.operator.rounds
    again = read_run(tmp_path, task)
    assert again.privacy.relation == RELATIONS["client"]
    pd_equal = again.operator.rounds["selected_train"].to_numpy()
    np.testing.assert_array_equal(pd_equal, realised[0, :, 0])
    for name in operator:  # a released copy without operator/ still reads
        (tmp_path / "operator" / name).unlink()
    assert read_run(tmp_path, task).operator is None


# --------------------------------------------------------------- 3. noise in float32


def test_noise_on_a_bfloat16_value_is_a_float32_draw():
    from swarmjax.privacy.mechanisms import gaussian_mechanism, laplace_mechanism

    zeros = {"w": jnp.zeros((200_000,), jnp.bfloat16)}
    g = gaussian_mechanism(jax.random.key(0), zeros, l2_sensitivity=1.0, noise_multiplier=1.0)
    lap = laplace_mechanism(jax.random.key(1), zeros, l1_sensitivity=1.0, epsilon=1.0)
    for out, beyond in ((g["w"], 4.0), (lap["w"], 8.0)):
        assert out.dtype == jnp.bfloat16  # cast after the noise is added
        values = np.abs(np.asarray(out, np.float32))
        # a bfloat16 draw: ~128 values, the Gaussian cut off near 2.9 sigma
        assert values.max() > beyond and len(np.unique(values)) > 1000


def test_a_bfloat16_model_gets_float32_server_noise_through_simulate(digits):
    clients, test = digits
    base = mlp((128,), 10, (8, 8, 1))
    model = dataclasses.replace(
        base,
        init=lambda key: jax.tree.map(lambda a: a.astype(jnp.bfloat16), base.init(key)),
        name="mlp-bf16",
    )
    dp = dp_fedavg(model, training=LocalTraining(batch_size=60), clipping="fixed")
    spec = RunSpec(rounds=1, delta=1e-5)
    hyper = dict(sample_rate=1.0, noise_multiplier=10.0, initial_clip=1.0, learning_rate=1e-9)
    variants = Variants.grid(dp, clients, spec, **hyper)
    # a supplied secret: the test rebuilds the run's initial model from its key
    res = simulate(dp, clients, test, variants, secret=SECRET)
    assert np.isfinite(res.privacy.final_epsilon).all()
    key = run_keys(SECRET, [0], variant_identities(dp, variants), False)[0]
    start = model.init(server_init_key(key))
    moved = np.concatenate(
        [
            (np.asarray(a[0], np.float32) - np.asarray(b, np.float32)).ravel()
            for a, b in zip(jax.tree.leaves(res.server.params), jax.tree.leaves(start), strict=True)
        ]
    )
    std = 10.0 * 1.0 / clients.num_clients  # z C / (q N): the sum's noise, averaged
    assert moved.size > 9000
    assert abs(moved.std() / std - 1) < 0.05
    assert np.abs(moved / std).max() > 3.3  # a bfloat16 draw stops near 2.9 sigma


# ------------------------------------------------- 5. overflow charged for both neighbours


def test_client_level_overflow_is_charged_for_the_add_one_neighbour():
    from scipy import stats

    from swarmjax.fl.protocol import RunSpec, Spend
    from swarmjax.privacy.accounting import sigma_for_epsilon
    from swarmjax.privacy.plan import PrivacyPlan
    from swarmjax.privacy.sampling import overflow_probability, poisson_capacity

    def client_draw_overflow(capacity, num_clients, rate):
        return PrivacyPlan("client", num_clients, rate, 1, 0.5, capacity=capacity).overflow_prob

    n, q, cap = 100, 0.1, 22
    worse, same = stats.binom.sf(cap, n + 1, q), stats.binom.sf(cap, n, q)
    assert 1.08 < worse / same < 8
    np.testing.assert_allclose(client_draw_overflow(cap, n, q), worse, rtol=1e-12)
    np.testing.assert_allclose(overflow_probability(n, q, cap, add_one=True), worse, rtol=1e-12)
    alg = dp_fedavg(MODEL, participation=Poisson(cap))
    shape = (1, 3, n)
    spend = Spend(
        sample_rate=np.full(shape, q),
        noise_multiplier=np.ones(shape),
        steps=np.broadcast_to(np.arange(1, 4)[None, :, None], shape),
        extra_epsilon=np.zeros(shape),
    )
    np.testing.assert_allclose(alg.sampling_overflow(spend, n), worse, rtol=1e-12)
    # a buffer of exactly N clients still overflows on the N + 1 neighbour
    assert client_draw_overflow(n, n, q) == pytest.approx(q ** (n + 1))
    assert client_draw_overflow(n + 1, n, q) == 0.0 == client_draw_overflow(None, n, q)
    # calibration charges the same value as the record
    cap = 30
    worse = stats.binom.sf(cap, n + 1, q)
    assert worse > 1.08 * stats.binom.sf(cap, n, q)
    plan = dp_fedavg(MODEL, participation=Poisson(cap)).plan.privacy_plan(n, q, RunSpec(20, 1e-3))
    z = plan.calibrate(4.0).noise_multiplier
    assert z == sigma_for_epsilon(4.0, q, 20, 1e-3, overflow_prob=worse)
    # the capacity helpers size for the add-one neighbour
    k = poisson_capacity(n, q, 1e-9, add_one=True)
    assert stats.binom.sf(k, n + 1, q) < 1e-9 <= stats.binom.sf(k - 1, n + 1, q)
    big = PrivacyPlan("client", n, q, 20, 1e-5).sized(4.0).capacity
    assert big >= PrivacyPlan("record", n, q, 20, 1e-5).sized(4.0).capacity


def test_record_level_overflow_keeps_n_rows_under_zero_out():
    """Pinned on purpose: under zero-out both neighbours hold ``|D_i|`` rows, so the
    record-level buffer's charge is ``P(Bin(|D_i|, q_i) > capacity)``, not the ``+ 1``
    value of add/remove (which would over-charge and is not the stated relation)."""
    from scipy import stats

    training = LocalTraining(batch_size=30, record_dp=RecordDP(capacity=40))
    sizes = np.array([60, 90, 120])
    over = training.sampler_overflow(sizes, 120)
    want = [stats.binom.sf(40, n, 30 / n) for n in sizes]
    np.testing.assert_allclose(over, want, rtol=1e-12)
    plus_one = [stats.binom.sf(40, n + 1, 30 / n) for n in sizes]
    assert np.all(np.asarray(plus_one) > over)


# ------------------------------------------------------- 6. the mask rule on score clips


@pytest.mark.parametrize("metric", ["loss", "error"])
def test_a_hostile_record_counts_as_the_bound_in_a_noised_score(digits, metric):
    """NaN, inf and 3e38 features (the last overflows the logits: its loss is NaN) count as
    ``score_bound`` in the clipped mean, never as NaN; the noised score stays finite."""
    from swarmjax.fl.data.clients import client
    from swarmjax.models import cross_entropy

    clients, _ = digits
    data = client(clients, 0)
    m = int(data.sizes)
    hostile = np.asarray(data.x).copy()
    hostile[0] = np.nan
    hostile[1] = np.inf
    hostile[2] = 3e38
    data = data.replace(x=jnp.asarray(hostile))
    alg = _pso(selection_metric=metric, loss_bound=5.0)
    params = MODEL.init(jax.random.key(0))
    positions = jax.tree.map(lambda a: a[None], params)
    exact = alg.scores(positions, data, jax.random.key(1), jnp.float32(0.0))
    noised = alg.scores(positions, data, jax.random.key(1), jnp.float32(0.1))
    assert np.isfinite(np.asarray(exact)).all() and np.isfinite(np.asarray(noised)).all()
    logits = MODEL.apply(params, data.x[3:m])
    if metric == "loss":
        clean = np.minimum(np.asarray(cross_entropy(logits, data.y[3:m])), 5.0)
    else:
        clean = np.asarray(jnp.argmax(logits, -1) != data.y[3:m], np.float32)
    bound = alg.score_bound()
    np.testing.assert_allclose(exact[0], (clean.sum() + 3 * bound) / m, rtol=1e-5)


def test_bounded_maps_every_non_finite_value_to_the_bound():
    from swarmjax.privacy.mechanisms import bounded

    x = jnp.asarray([np.nan, np.inf, -np.inf, 3e38, -1.0, 0.5], jnp.float32)
    np.testing.assert_array_equal(bounded(x, 0.0, 2.0), [2.0, 2.0, 2.0, 2.0, 0.0, 0.5])


# ------------------------------------------------------ 7. checks on the stored float32


def test_privacy_parameters_are_checked_as_stored_in_float32(digits):
    from swarmjax._validation import check_stored, stored

    clients, test = digits
    spec = RunSpec(rounds=1, delta=1e-5)
    assert stored(0.50000001) == 0.5 and stored(1e-46) == 0.0 and stored(1e-40) == 0.0
    with pytest.raises(ValueError, match=r"x \(as float32\)"):
        check_stored("x", 1e-46, 0.0, 1.0, low_open=True)
    # adaptive clipping needs 2 sigma_b > z on the device's values: 0.50000001 is 0.5
    adaptive = dp_fedavg(MODEL, training=LocalTraining(batch_size=30))
    with pytest.raises(ValueError, match="count_noise"):
        Variants.grid(
            adaptive, clients, spec, sample_rate=0.5, noise_multiplier=1.0, count_noise=0.50000001
        )
    # a score epsilon that is 0 on the device would release exact scores at epsilon 0
    for tiny in (1e-46, 1e-40):
        with pytest.raises(ValueError, match="selection_epsilon"):
            pso = _pso(selection_epsilon=tiny)
            Variants.grid(pso, clients, spec, epsilon_target=4.0)
    training = LocalTraining(batch_size=30, record_dp=RecordDP(clip_norm=1e-46, capacity=60))
    with pytest.raises(ValueError, match="clip_norm"):
        FedDPPSO(MODEL, training).check(clients, test)


def test_a_small_score_epsilon_gets_its_full_laplace_scale(digits):
    """The scale is ``bound / (m eps_1)`` for every stored ``eps_1 > 0`` (a ``1e-30`` floor
    under ``eps_1`` used to understate it, by 700x here)."""
    clients, _ = digits
    spec = RunSpec(rounds=1, delta=1e-5)
    pso = _pso(selection_epsilon=7e-33)
    v = Variants.grid(pso, clients, spec, epsilon_target=4.0)
    eps1 = float(v.hyper.score_epsilon[0])
    assert 0 < eps1 < 1e-30
    states = jax.vmap(
        lambda k, i: pso.client_init(
            k,
            jax.tree.map(lambda a: a[i], pso.client_data(clients)),
            jax.tree.map(lambda a: a[0], v.hyper),
            i,
        )
    )(jax.random.split(jax.random.key(0), 4), jnp.arange(4))
    want = pso.loss_bound / (np.asarray(clients.sizes, np.float32) * np.float32(eps1))
    np.testing.assert_allclose(np.asarray(states.score_scale), want, rtol=1e-5)
