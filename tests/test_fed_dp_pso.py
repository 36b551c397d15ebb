"""Fed-DP-PSO and FedPSO on the protocol: the server rule, the client's scores and
refinement, privacy accounting per client, learning, and errors before any work.

Compilation dominates: every simulated run below is compiled once and shared through a
module-scoped fixture (a DP run with two target epsilons x two seeds in one batch, an
epsilon = inf run), on digits with 3 clients and a tiny MLP. The protocol-level properties
(released outputs, one upload per round) are in ``test_fl_protocol.py``.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from swarmjax import swarm
from swarmjax.fl import Execution, load_dataset, partition, simulate, stack_clients
from swarmjax.fl.algorithms.fed_dp_pso import (
    FedDPPSO,
    FedDPPSOHyper,
    PSOData,
    evaluation_subset,
    fedpso,
    server_select,
)
from swarmjax.fl.client.local import local_train
from swarmjax.fl.client.record_dp import poisson_sampler, sampler_capacity
from swarmjax.fl.client.training import LocalTraining, RecordDP
from swarmjax.fl.data.clients import client
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.models import cross_entropy, mlp
from swarmjax.privacy.accounting import epsilon
from tests.reproducible import SECRET

TARGETS = [4.0, 6.0]
DELTA = 1e-5


def _dp(clients, batch_size: int) -> LocalTraining:
    return LocalTraining(
        batch_size=batch_size,
        optimizer="adamw",
        weight_decay=1e-4,
        record_dp=RecordDP.for_sizes(clients.sizes, batch_size),
    )


def _plain(batch_size: int) -> LocalTraining:
    return LocalTraining(batch_size=batch_size, optimizer="adamw", weight_decay=1e-4)


def _simulate(alg, clients, test, *, rounds, seeds=0, **kwargs):
    variants = Variants.grid(alg, clients, RunSpec(rounds, DELTA, seeds), **kwargs)
    return simulate(alg, clients, test, variants)


@pytest.fixture(scope="module")
def digits():
    ds = load_dataset("digits", standardize=True)
    part = partition(ds.y_train, 3, "iid", seed=0)
    clients = stack_clients(ds.x_train, ds.y_train, part.indices)
    return ds, clients, mlp((16,), 10, ds.input_shape)


@pytest.fixture(scope="module")
def uneven():
    """Digits over 3 clients of different sizes (Dirichlet 1.0), so each runs its own
    number of local steps."""
    ds = load_dataset("digits", standardize=True)
    part = partition(ds.y_train, 3, "dirichlet", alpha=1.0, seed=1)
    clients = stack_clients(ds.x_train, ds.y_train, part.indices)
    assert len(set(np.asarray(clients.sizes).tolist())) == 3
    return ds, clients, FedDPPSO(mlp((16,), 10, ds.input_shape), _plain(32), particles=3)


def _plain_run(uneven, client_map: str):
    ds, clients, alg = uneven
    variants = Variants.grid(alg, clients, RunSpec(3, DELTA, (3,)), learning_rate=0.01)
    # one supplied secret: the vmapped and sequential calls are compared draw for draw
    return simulate(
        alg, clients, (ds.x_test, ds.y_test), variants, secret=SECRET,
        execution=Execution(client_map=client_map),
    )  # fmt: skip


@pytest.fixture(scope="module")
def plain_run(uneven):
    return _plain_run(uneven, "vmap")


@pytest.mark.parametrize("n", [1, 2, 3, 6])
def test_server_picks_uniformly_among_top_three(n: int) -> None:
    losses = jnp.asarray(np.random.default_rng(n).permutation(n).astype(np.float32))
    keys = jax.random.split(jax.random.key(0), 6000)
    picks = np.asarray(jax.vmap(lambda k: server_select(k, losses, 3))(keys))
    top = set(np.argsort(np.asarray(losses))[: min(3, n)].tolist())
    assert set(picks.tolist()) == top
    counts = np.bincount(picks, minlength=n)[sorted(top)]
    expected = len(keys) / len(top)
    # 4.5 standard deviations of a binomial count: fails for a biased rule.
    assert np.all(np.abs(counts - expected) < 4.5 * math.sqrt(expected)), counts


def test_a_nan_report_is_never_picked() -> None:
    losses = jnp.array([jnp.nan, 0.3, 0.1, 0.2, 0.5])
    keys = jax.random.split(jax.random.key(1), 500)
    picks = set(np.asarray(jax.vmap(lambda k: server_select(k, losses, 3))(keys)).tolist())
    assert picks == {1, 2, 3}


def test_epsilon_inf_refinement_is_plain_adamw(digits, plain_run) -> None:
    _, clients, model = digits
    params = model.init(jax.random.key(1))
    one = client(clients, 0)
    key = jax.random.key(2)
    lr = jnp.float32(0.01)
    plain = _plain(32)
    got = jax.jit(plain.train, static_argnums=0)(model, params, one, key, lr, jnp.float32(5.0))
    want = jax.jit(
        lambda p, d, k: local_train(
            p,
            d,
            k,
            apply_fn=model.apply,
            optimizer=optax.adamw(0.01, weight_decay=1e-4),
            epochs=1,
            batch_size=32,
        )
    )(params, one, key)
    for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(want.params), strict=True):
        np.testing.assert_array_equal(a, b)
    # The DP path with the same inputs clips and adds noise: it must differ.
    dp_train = jax.jit(_dp(clients, 32).train, static_argnums=0)
    dp = dp_train(model, params, one, key, lr, jnp.float32(5.0))
    assert not np.allclose(jax.tree.leaves(dp.params)[0], jax.tree.leaves(want.params)[0])
    # The run at epsilon = inf calibrates no noise and reports no privacy.
    assert plain_run.privacy.unit is None
    np.testing.assert_array_equal(plain_run.privacy.noise_multiplier, 0.0)
    assert np.isinf(plain_run.privacy.epsilon).all()


def test_poisson_sampler_rates_and_active_steps() -> None:
    mask = jnp.arange(100) < 40
    sample = poisson_sampler(10, sampler_capacity([40], 10))
    keys = jax.random.split(jax.random.key(0), 200)
    batches = jax.jit(jax.vmap(lambda k: sample(k, mask, jnp.int32(40))))(keys)
    assert batches.idx.shape[1] == 10  # ceil(max_n / B) static steps
    np.testing.assert_array_equal(np.asarray(batches.active[0]), np.arange(10) < 4)
    taken = np.asarray(batches.mask)
    assert not taken[:, 4:].any()  # inactive steps sample nothing
    assert np.all(np.asarray(batches.idx)[taken] < 40)  # padding never sampled
    mean = taken[:, :4].sum(-1).mean()
    assert abs(mean - 10.0) < 0.5  # E|batch| = q |D_i| = B


def test_smaller_targets_get_more_noise_per_client(digits) -> None:
    """Calibration (host side, before any compilation): one noise multiplier per (target,
    client); each reaches its target after the run's steps, a smaller target needs more."""
    _, clients, model = digits
    alg = FedDPPSO(model, _dp(clients, 64), particles=2)
    sigma = np.asarray(
        Variants.grid(
            alg, clients, RunSpec(2, DELTA), epsilon_target=TARGETS
        ).hyper.noise_multiplier
    )
    assert sigma.shape == (len(TARGETS), 3)
    assert np.all(sigma[0] > sigma[1]) and np.all(sigma > 0)
    sizes = np.asarray(clients.sizes)
    over = alg.training.sampler_overflow(sizes, clients.mask.shape[1])
    for t, target in enumerate(TARGETS):
        for i, n in enumerate(sizes):
            steps = 2 * math.ceil(n / 64)
            got = epsilon(64 / n, float(sigma[t, i]), steps, DELTA, overflow_prob=over[i])
            assert 0.9 * target < got <= target


def test_evaluation_subset_keeps_real_rows(digits) -> None:
    _, clients, _ = digits
    sub = evaluation_subset(clients, 100, seed=3)
    assert sub.x.shape[:2] == (3, 100)
    np.testing.assert_array_equal(np.asarray(sub.sizes), [100, 100, 100])
    rows = np.asarray(clients.x[0])[: int(clients.sizes[0])]
    for r in np.asarray(sub.x[0]):  # every kept row is one of the client's real rows
        assert np.any(np.all(rows == r, axis=1))
    small = evaluation_subset(clients, 10_000)
    np.testing.assert_array_equal(np.asarray(small.sizes), np.asarray(clients.sizes))
    np.testing.assert_array_equal(np.asarray(small.mask), np.asarray(clients.mask))


def test_short_run_on_digits_beats_chance(plain_run) -> None:
    acc = plain_run.history["test_accuracy"].iloc[-1]
    assert acc > 0.6, acc  # chance is 0.1
    assert set(plain_run.history["leader"]) <= {0, 1, 2}
    assert np.isinf(plain_run.history["epsilon_max"]).all()


def test_fedpso_is_fed_dp_pso_with_one_particle_sgd_and_the_best_report() -> None:
    alg = fedpso(mlp((8,), 10, (8, 8, 1)), batch_size=16)
    assert alg.particles == 1 and alg.top_k == 1 and alg.training.record_dp is None
    assert alg.training.optimizer == "sgd" and alg.training.batch_size == 16
    assert alg.accounting().unit is None


def test_bad_input_raises_before_compiling(digits) -> None:
    ds, clients, model = digits
    test = (ds.x_test, ds.y_test)
    dp = _dp(clients, 64)

    def variants(alg, rounds=1, **kw):
        return Variants.grid(alg, clients, RunSpec(rounds, DELTA), **{"epsilon_target": 5.0, **kw})

    with pytest.raises(ValueError, match="batch_size"):
        variants(FedDPPSO(model, dataclasses.replace(dp, batch_size=10_000)))
    with pytest.raises(ValueError, match="particles"):
        variants(FedDPPSO(model, dp, particles=0))
    with pytest.raises(ValueError, match="epsilon_target"):
        variants(FedDPPSO(model, dp), epsilon_target=0)
    with pytest.raises(ValueError, match="epsilon_target must be inf exactly"):
        variants(FedDPPSO(model, dp), epsilon_target=[5.0, math.inf])
    with pytest.raises(ValueError, match="epsilon_target must be inf exactly"):
        variants(FedDPPSO(model, _plain(64)))
    with pytest.raises(ValueError, match="eval_subset"):
        variants(FedDPPSO(model, dp, eval_subset=0))
    with pytest.raises(ValueError, match="rounds"):
        variants(FedDPPSO(model, dp), rounds=0)
    with pytest.raises(ValueError, match="selection_metric"):
        variants(FedDPPSO(model, dp, selection_metric="accuracy"))
    with pytest.raises(ValueError, match="capacity"):
        variants(FedDPPSO(model, dataclasses.replace(dp, record_dp=RecordDP(capacity=2))))
    small = FedDPPSO(mlp((8,), 4, ds.input_shape), _plain(64))
    with pytest.raises(ValueError, match="labels must be in"):
        _simulate(small, clients, test, rounds=1, epsilon_target=math.inf)
    alg = FedDPPSO(model, dp)
    with pytest.raises(ValueError, match="client_map"):
        simulate(alg, clients, test, variants(alg), execution=Execution(client_map="loop"))


@pytest.mark.parametrize("metric", ["loss", "error"])
def test_particles_scored_by_loss_or_error_rate_on_real_rows(digits, metric) -> None:
    """The score of each particle is its mean cross-entropy or its error rate over the
    client's real rows (padding ignored); the private-selection bound is 1 for the error."""
    _, clients, model = digits
    one = client(clients, 1)
    n = int(one.sizes)
    particles = jax.vmap(model.init)(jax.random.split(jax.random.key(4), 3))
    alg = FedDPPSO(model, _plain(32), selection_metric=metric)
    got = np.asarray(jax.jit(alg.scores)(particles, one, jax.random.key(0), jnp.float32(0.0)))
    x, y = np.asarray(one.x)[:n], np.asarray(one.y)[:n]
    apply = jax.jit(model.apply)
    for j in range(3):
        logits = apply(jax.tree.map(lambda a, j=j: a[j], particles), x)
        if metric == "error":
            want = np.mean(np.argmax(np.asarray(logits), -1) != y)
        else:
            want = float(jnp.mean(cross_entropy(logits, y)))
        np.testing.assert_allclose(got[j], want, rtol=1e-5)
    assert 0.0 < got.min() and (metric == "loss" or got.max() <= 1.0)
    assert alg.score_bound() == (10.0 if metric == "loss" else 1.0)


@pytest.mark.parametrize("start", ["pbest", "position"])
def test_refinement_starts_from_best_pbest_or_best_position(digits, start) -> None:
    """A pbest better than every moved particle: "pbest" refines it, "position" does not."""
    _, clients, model = digits
    one = client(clients, 0)
    data = PSOData(train=one, score=one)
    alg = FedDPPSO(model, _plain(64), particles=3, refine_start=start)
    still = swarm.PSOHyperParams(inertia=0.0, cognitive=0.0, social=0.0)  # positions stay
    hyper = FedDPPSOHyper(
        pso=jax.tree.map(jnp.float32, still),
        learning_rate=jnp.float32(1e-9),  # the refinement barely moves its start
        noise_multiplier=jnp.zeros(3, jnp.float32),
        score_epsilon=jnp.float32(0.0),
    )
    state = alg.client_init(jax.random.key(0), data, hyper, jnp.int32(0))
    init = state.swarm.position
    stored = model.init(jax.random.key(7))  # particle 1's pbest, claimed to be the best
    sw = state.swarm.replace(
        best_position=jax.tree.map(lambda b, s: b.at[1].set(s), state.swarm.best_position, stored),
        best_loss=jnp.array([5.0, -1.0, 5.0]),
    )
    gbest = jax.tree.map(lambda a: a[0], init)
    new, report = jax.jit(alg.train)(state.replace(swarm=sw), data, gbest, jax.random.key(2), hyper)
    losses = alg.scores(init, one, jax.random.key(3), jnp.float32(0.0))
    j = 1 if start == "pbest" else int(jnp.argmin(losses))
    expected = stored if start == "pbest" else jax.tree.map(lambda a: a[j], init)
    got = jax.tree.map(lambda a: a[j], new.swarm.position)
    for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(g, e, atol=1e-5)
    for k in [k for k in range(3) if k != j]:  # untouched particles keep their positions
        for g, e in zip(
            jax.tree.leaves(jax.tree.map(lambda a, k=k: a[k], new.swarm.position)),
            jax.tree.leaves(jax.tree.map(lambda a, k=k: a[k], init)),
            strict=True,
        ):
            np.testing.assert_allclose(g, e, atol=1e-6)
    assert float(report) == float(jnp.min(new.swarm.best_loss))
    assert int(new.swarm.iteration) == int(state.swarm.iteration) + 1


def test_sequential_clients_match_vmapped_clients(uneven, plain_run) -> None:
    """lax.map over clients (each runs its own number of local steps) gives the vmap
    result."""
    a, b = plain_run, _plain_run(uneven, "sequential")
    np.testing.assert_allclose(a.history["test_accuracy"], b.history["test_accuracy"], atol=1e-6)
    np.testing.assert_array_equal(a.history["leader"], b.history["leader"])
    for x, y in zip(jax.tree.leaves(a.server.gbest), jax.tree.leaves(b.server.gbest), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)


def test_an_unreachable_target_warns_and_a_run_sized_buffer_reaches_it() -> None:
    """A buffer sized for 1e-9 overflow per step caps epsilon (its overflow is charged to
    delta with the e^epsilon factor): calibration warns instead of silently adding more
    noise than the target needs; a buffer sized for the run reaches the target."""
    sizes = np.array([200, 200, 200])
    per_step = LocalTraining(batch_size=32, record_dp=RecordDP.for_sizes(sizes, 32))
    alg = FedDPPSO(mlp((8,), 10, (8, 8, 1)), per_step, particles=2)
    fake = stack_clients(
        np.zeros((600, 8, 8, 1), np.float32), np.arange(600) % 10, np.split(np.arange(600), 3)
    )
    with pytest.warns(UserWarning, match="target_epsilon=8.0 is out of reach"):
        Variants.grid(alg, fake, RunSpec(2, DELTA), epsilon_target=8.0)
    run = RecordDP.for_sizes(sizes, 32, steps=14, delta=DELTA, epsilon=8.0)
    sized = dataclasses.replace(alg, training=dataclasses.replace(per_step, record_dp=run))
    grid = Variants.grid(sized, fake, RunSpec(2, DELTA), epsilon_target=8.0)
    sigma = float(grid.hyper.noise_multiplier[0, 0])
    over = sized.training.sampler_overflow(sizes, 200)[0]
    assert 0.99 * 8.0 < epsilon(32 / 200, sigma, 14, DELTA, overflow_prob=over) <= 8.0
