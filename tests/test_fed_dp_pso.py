"""Fed-DP-PSO, FedPSO and FedAvg + DP-SGD: server rule, privacy accounting, sanity, errors.

Compilation dominates: every full run below is compiled once and shared through a
module-scoped fixture (one DP run with two target epsilons x two seeds in one batch, one
epsilon = inf run, one private-selection run), on digits with 3 clients and a tiny MLP.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from swarmjax.fl import load_dataset, partition, stack_clients
from swarmjax.fl.clients import client
from swarmjax.fl.dp_local import poisson_sampler, sampler_capacity
from swarmjax.fl.fed_dp_pso import (
    COVERAGE_PAPER,
    COVERAGE_PRIVATE_SELECTION,
    FedDPPSOConfig,
    evaluation_subset,
    refine,
    run_fed_dp_pso,
    server_select,
)
from swarmjax.fl.local import local_train
from swarmjax.models import mlp
from swarmjax.privacy.accounting import epsilon

TARGETS = [4.0, 6.0]


@pytest.fixture(scope="module")
def digits():
    ds = load_dataset("digits", standardize=True)
    part = partition(ds.y_train, 3, "iid", seed=0)
    clients = stack_clients(ds.x_train, ds.y_train, part.indices)
    return ds, clients, mlp((16,), 10, ds.input_shape)


@pytest.fixture(scope="module")
def dp_run(digits):
    """Two target epsilons x two seeds as one batch of one compiled call."""
    ds, clients, model = digits
    cfg = FedDPPSOConfig(model=model, particles=2, batch_size=64)
    return run_fed_dp_pso(
        cfg,
        clients,
        (ds.x_test, ds.y_test),
        rounds=2,
        target_epsilon=TARGETS,
        learning_rate=0.01,
        seeds=[0, 1],
    )


@pytest.fixture(scope="module")
def plain_run(digits):
    ds, clients, model = digits
    cfg = FedDPPSOConfig(model=model, particles=3, batch_size=32)
    return run_fed_dp_pso(cfg, clients, (ds.x_test, ds.y_test), rounds=3, learning_rate=0.01)


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


def test_epsilon_inf_is_plain_adam(digits, plain_run) -> None:
    _, clients, model = digits
    cfg = FedDPPSOConfig(model=model, batch_size=32, dp=False)
    params = model.init(jax.random.key(1))
    one = client(clients, 0)
    key = jax.random.key(2)
    got = refine(params, one, key, jnp.float32(5.0), jnp.float32(0.01), cfg)
    want = local_train(
        params,
        one,
        key,
        apply_fn=model.apply,
        optimizer=optax.adamw(0.01, weight_decay=cfg.weight_decay),
        epochs=1,
        batch_size=32,
    )
    for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(want.params), strict=True):
        np.testing.assert_array_equal(a, b)
    # The DP path with the same inputs clips and adds noise: it must differ.
    dp_cfg = FedDPPSOConfig(model=model, batch_size=32, dp=True, capacity=80)
    dp = refine(params, one, key, jnp.float32(5.0), jnp.float32(0.01), dp_cfg)
    assert not np.allclose(jax.tree.leaves(dp.params)[0], jax.tree.leaves(want.params)[0])
    # The runner at epsilon = inf calibrates no noise and reports no privacy.
    assert plain_run.privacy["sigma"] == [0.0, 0.0, 0.0]
    assert np.isinf(plain_run.privacy["epsilon"]).all()


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


def test_dp_run_epsilon_within_target_and_recomputable(digits, dp_run) -> None:
    _, clients, _ = digits
    h = dp_run.history
    assert sorted(h["epsilon_target"].unique()) == TARGETS
    assert len(h) == len(TARGETS) * 2 * 2  # targets x seeds x rounds
    for target in TARGETS:
        priv = dp_run.privacy_by_epsilon[target]
        assert priv["covers"] == COVERAGE_PAPER
        final = priv["epsilon"][-1]
        assert np.all(final <= target) and np.all(final > 0.9 * target)
        rows = h[(h["epsilon_target"] == target) & (h["seed"] == 0)]
        assert (rows["epsilon_max"] <= target).all()
        for i, (q, sigma, per) in enumerate(
            zip(priv["q"], priv["sigma"], priv["steps_per_round"], strict=True)
        ):
            assert sigma > 0
            assert per == math.ceil(int(clients.sizes[i]) / 64)
            for t in range(2):
                want = epsilon(q, sigma, (t + 1) * per, priv["delta"])
                assert rows[f"epsilon_client_{i}"].iloc[t] == pytest.approx(want)
    # A smaller target needs more noise, and the logged steps match the accountant's.
    assert dp_run.privacy_by_epsilon[4.0]["sigma"][0] > dp_run.privacy_by_epsilon[6.0]["sigma"][0]
    steps = np.asarray(dp_run.state.round)
    assert steps.shape == (len(TARGETS) * 2,) and (steps == 2).all()


def test_private_selection_adds_its_budget(digits) -> None:
    ds, clients, model = digits
    cfg = FedDPPSOConfig(
        model=model, particles=2, batch_size=64, private_selection=True, eval_subset=200
    )
    res = run_fed_dp_pso(
        cfg,
        clients,
        (ds.x_test, ds.y_test),
        rounds=1,
        selection_epsilon=0.5,
        target_epsilon=3.0,
    )
    assert res.privacy["covers"] == COVERAGE_PRIVATE_SELECTION
    assert res.privacy["selection_releases"] == 2 + 1 * 3
    assert res.privacy["epsilon"][-1].max() <= 3.5 + 1e-9
    assert res.privacy["epsilon"][-1].min() > 3.0


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
    assert (plain_run.history["epsilon_target"] == math.inf).all()


def test_bad_input_raises_before_compiling(digits) -> None:
    ds, clients, model = digits
    test = (ds.x_test, ds.y_test)
    with pytest.raises(ValueError, match="batch_size"):
        run_fed_dp_pso(FedDPPSOConfig(model=model, batch_size=10_000), clients, test, rounds=1)
    with pytest.raises(ValueError, match="particles"):
        run_fed_dp_pso(FedDPPSOConfig(model=model, particles=0), clients, test, rounds=1)
    with pytest.raises(ValueError, match="target_epsilon"):
        run_fed_dp_pso(FedDPPSOConfig(model=model), clients, test, rounds=1, target_epsilon=0)
    with pytest.raises(ValueError, match="all finite"):
        run_fed_dp_pso(
            FedDPPSOConfig(model=model), clients, test, rounds=1, target_epsilon=[5.0, math.inf]
        )
    with pytest.raises(ValueError, match="eval_subset"):
        run_fed_dp_pso(FedDPPSOConfig(model=model, eval_subset=0), clients, test, rounds=1)
    with pytest.raises(ValueError, match="classes"):
        run_fed_dp_pso(
            FedDPPSOConfig(model=mlp((8,), 4, ds.input_shape)),
            clients,
            test,
            rounds=1,
            num_classes=10,
        )
    with pytest.raises(ValueError, match="rounds"):
        run_fed_dp_pso(FedDPPSOConfig(model=model), clients, test, rounds=0)
    with pytest.raises(ValueError, match="selection_metric"):
        run_fed_dp_pso(
            FedDPPSOConfig(model=model, selection_metric="accuracy"), clients, test, rounds=1
        )


@pytest.mark.parametrize("metric", ["loss", "error"])
def test_particles_scored_by_loss_or_error_rate_on_real_rows(digits, metric) -> None:
    """The score of each particle is its mean cross-entropy or its error rate over the
    client's real rows (padding ignored); the private-selection bound is 1 for the error."""
    from swarmjax.fl.fed_dp_pso import particle_losses, selection_bound
    from swarmjax.models import cross_entropy

    _, clients, model = digits
    one = client(clients, 1)
    n = int(one.sizes)
    particles = jax.vmap(model.init)(jax.random.split(jax.random.key(4), 3))
    cfg = FedDPPSOConfig(model=model, selection_metric=metric)
    score = jax.jit(particle_losses, static_argnums=0)
    got = np.asarray(score(cfg, particles, one, jax.random.key(0), 0.0))
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
    assert selection_bound(cfg) == (10.0 if metric == "loss" else 1.0)


def test_fedpso_and_fedavg_dp_run(digits) -> None:
    from swarmjax.fl.fedavg_dp import run_fedavg_dp
    from swarmjax.fl.fedpso import run_fedpso

    ds, clients, model = digits
    test = (ds.x_test, ds.y_test)
    pso = run_fedpso(model, clients, test, rounds=2, learning_rate=0.1)
    assert pso.history["test_accuracy"].iloc[-1] > 0.5
    dp = run_fedavg_dp(model, clients, test, rounds=1, target_epsilon=4.0, learning_rate=0.01)
    assert (dp.history["epsilon_max"] <= 4.0).all()
    q, sigma, per = dp.privacy["q"][0], dp.privacy["sigma"][0], dp.privacy["steps_per_round"][0]
    assert dp.history["epsilon_client_0"].iloc[0] == pytest.approx(epsilon(q, sigma, per, 1e-5))


@pytest.mark.parametrize("start", ["pbest", "position"])
def test_refinement_starts_from_best_pbest_or_best_position(digits, start) -> None:
    """A pbest better than every moved particle: "pbest" refines it, "position" does not."""
    from swarmjax import swarm
    from swarmjax.fl.fed_dp_pso import FedDPPSOHyper, client_round, particle_losses

    _, clients, model = digits
    one = client(clients, 0)
    cfg = FedDPPSOConfig(model=model, particles=3, batch_size=64, dp=False, refine_start=start)
    init = jax.vmap(model.init)(jax.random.split(jax.random.key(0), 3))
    stored = model.init(jax.random.key(7))  # particle 1's pbest, claimed to be the best
    state = swarm.init(jax.random.key(1), init, jnp.full(3, 5.0))
    state = state.replace(
        best_position=jax.tree.map(lambda b, s: b.at[1].set(s), state.best_position, stored),
        best_loss=jnp.array([5.0, -1.0, 5.0]),
    )
    still = swarm.PSOHyperParams(inertia=0.0, cognitive=0.0, social=0.0)  # positions stay
    hyper = FedDPPSOHyper(
        pso=jax.tree.map(jnp.float32, still),
        learning_rate=jnp.float32(1e-9),  # the refinement barely moves its start
        noise_multiplier=jnp.float32(0.0),
        selection_scale=jnp.float32(0.0),
    )
    gbest = jax.tree.map(lambda a: a[0], init)
    round_fn = jax.jit(lambda s, g, k: client_round(s, g, one, one, k, 0.0, 0.0, hyper, cfg))
    new, *_ = round_fn(state, gbest, jax.random.key(2))
    losses = particle_losses(cfg, init, one, jax.random.key(3), 0.0)
    j = 1 if start == "pbest" else int(jnp.argmin(losses))
    expected = stored if start == "pbest" else jax.tree.map(lambda a: a[j], init)
    got = jax.tree.map(lambda a: a[j], new.position)
    for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(g, e, atol=1e-5)
    others = [k for k in range(3) if k != j]
    for k in others:  # untouched particles keep their positions
        for g, e in zip(
            jax.tree.leaves(jax.tree.map(lambda a, k=k: a[k], new.position)),
            jax.tree.leaves(jax.tree.map(lambda a, k=k: a[k], init)),
            strict=True,
        ):
            np.testing.assert_allclose(g, e, atol=1e-6)


def test_sequential_clients_match_vmapped_clients() -> None:
    """lax.map over clients (each runs its own number of DP steps) gives the vmap result."""
    ds = load_dataset("digits", standardize=True)
    sizes_differ = partition(ds.y_train, 3, "dirichlet", alpha=0.5, seed=1)
    clients = stack_clients(ds.x_train, ds.y_train, sizes_differ.indices)
    assert len(set(np.asarray(clients.sizes).tolist())) == 3
    model = mlp((8,), 10, ds.input_shape)
    out = {}
    for how in ("vmap", "sequential"):
        cfg = FedDPPSOConfig(model=model, particles=2, batch_size=32, client_map=how)
        res = run_fed_dp_pso(
            cfg, clients, (ds.x_test, ds.y_test), rounds=2, target_epsilon=5.0, seeds=[3]
        )
        out[how] = res
    a, b = out["vmap"], out["sequential"]
    np.testing.assert_allclose(a.history["test_accuracy"], b.history["test_accuracy"], atol=1e-6)
    np.testing.assert_array_equal(a.history["leader"], b.history["leader"])
    for x, y in zip(jax.tree.leaves(a.state.gbest), jax.tree.leaves(b.state.gbest), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="client_map"):
        run_fed_dp_pso(
            FedDPPSOConfig(model=model, client_map="loop"),
            clients,
            (ds.x_test, ds.y_test),
            rounds=1,
        )
    with pytest.raises(ValueError, match="capacity"):
        run_fed_dp_pso(
            FedDPPSOConfig(model=model, capacity=2),
            clients,
            (ds.x_test, ds.y_test),
            rounds=1,
            target_epsilon=5.0,
        )
