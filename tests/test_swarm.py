"""Generic pytree PSO: updates, bests, non-finite losses, coefficient modes, validation."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax import swarm


def _state(num=4):
    position = {
        "a": jnp.arange(num * 3, dtype=jnp.float32).reshape(num, 3),
        "b": jnp.ones((num, 2, 2)),
    }
    loss = jnp.arange(num, dtype=jnp.float32)[::-1]
    return swarm.init(jax.random.key(0), position, loss)


def test_init_picks_global_best_and_zero_velocity():
    st = _state()
    assert float(st.global_best_loss) == 0.0
    chex.assert_trees_all_close(st.global_best, jax.tree_util.tree_map(lambda x: x[3], st.position))
    chex.assert_trees_all_close(st.velocity, jax.tree_util.tree_map(jnp.zeros_like, st.position))
    chex.assert_shape(st.best_loss, (4,))


@pytest.mark.parametrize("mode", ["particle", "element"])
@pytest.mark.parametrize("rng", ["hash", "threefry"])
def test_move_matches_formula(mode, rng):
    opts = swarm.PSOOptions(rng=rng, coefficients=mode)
    st = _state()
    st = st.replace(velocity=jax.tree_util.tree_map(lambda x: 0.1 * x, st.position))
    hyper = swarm.PSOHyperParams(inertia=0.5, cognitive=1.2, social=0.8)
    r1, r2 = swarm.coefficients(st.seed, st.iteration, st.position, opts)
    new = swarm.move(st, hyper, opts)
    for name in ("a", "b"):
        x, v, p = st.position[name], st.velocity[name], st.best_position[name]
        g = st.global_best[name][None]
        expect_v = 0.5 * v + 1.2 * r1[name] * (p - x) + 0.8 * r2[name] * (g - x)
        np.testing.assert_allclose(new.velocity[name], expect_v, rtol=1e-6)
        np.testing.assert_allclose(new.position[name], x + expect_v, rtol=1e-6)
    if mode == "particle":  # one pair per particle, shared by every coordinate and leaf
        assert r1["a"].shape == (4, 1) and r1["b"].shape == (4, 1, 1)
        np.testing.assert_array_equal(r1["a"][:, 0], r1["b"][:, 0, 0])
    else:
        assert r1["a"].shape == (4, 3)


def test_coefficients_change_every_iteration_and_are_uniform():
    st = _state(num=2000)
    a, _ = swarm.coefficients(st.seed, 0, st.position)
    b, _ = swarm.coefficients(st.seed, 1, st.position)
    assert not np.allclose(a["a"], b["a"])
    u = np.asarray(a["a"]).ravel()
    assert 0.0 <= u.min() and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.05


def test_clamps_apply():
    st = _state()
    hyper = swarm.PSOHyperParams(
        inertia=1.0,
        cognitive=5.0,
        social=5.0,
        velocity_clamp=0.25,
        position_low=-1.0,
        position_high=1.5,
    )
    st = st.replace(velocity=jax.tree_util.tree_map(lambda x: x + 100.0, st.position))
    new = swarm.move(st, hyper)
    for leaf in jax.tree_util.tree_leaves(new.velocity):
        assert float(jnp.max(jnp.abs(leaf))) <= 0.25 + 1e-6
    for leaf in jax.tree_util.tree_leaves(new.position):
        assert float(leaf.min()) >= -1.0 and float(leaf.max()) <= 1.5


def test_social_target_overrides_global_best():
    st = _state()
    target = jax.tree_util.tree_map(lambda x: jnp.full(x.shape[1:], 100.0), st.position)
    hyper = swarm.PSOHyperParams(inertia=0.0, cognitive=0.0, social=1.0)
    new = swarm.move(st, hyper, social_target=target)
    assert float(jnp.min(new.position["a"] - st.position["a"])) >= 0.0


def test_nonfinite_losses_never_become_best_and_are_counted():
    st = _state()
    moved = st.replace(position=jax.tree_util.tree_map(lambda x: x + 1.0, st.position))
    new = swarm.observe(moved, jnp.array([jnp.nan, -jnp.inf, jnp.inf, -5.0]))
    assert int(new.nonfinite) == 3
    assert float(new.global_best_loss) == -5.0
    np.testing.assert_array_equal(new.best_loss, [3.0, 2.0, 1.0, -5.0])
    np.testing.assert_allclose(new.global_best["a"], moved.position["a"][3])
    assert int(new.iteration) == 1


def test_step_mean_loss_averages_only_finite_losses():
    st = swarm.init(jax.random.key(0), jnp.array([[1.0], [2.0], [3.0]]), jnp.zeros(3))
    still = swarm.PSOHyperParams(0.0, 0.0, 0.0)  # nothing moves: positions stay 1, 2, 3
    loss = lambda p: jnp.where(p[0] > 2.5, jnp.nan, p[0])
    _, m = swarm.step(st, still, loss)
    assert float(m["mean_loss"]) == pytest.approx(1.5)
    assert int(m["nonfinite"]) == 1
    _, m = swarm.step(st, still, lambda p: jnp.nan * p[0])
    assert np.isnan(float(m["mean_loss"]))


def test_init_with_all_nan_losses():
    st = swarm.init(jax.random.key(1), jnp.zeros((3, 2)), jnp.full(3, jnp.nan))
    assert int(st.nonfinite) == 3 and np.isinf(float(st.global_best_loss))


def test_step_minimises_sphere_in_10d_under_vmap():
    def run(key):
        x = jax.random.uniform(key, (30, 10), minval=-5, maxval=5)
        loss = lambda p: jnp.sum(p * p)
        st = swarm.init(key, x, jax.vmap(loss)(x))
        hyper = swarm.PSOHyperParams(0.7, 1.4, 1.4, 10.0, -5.0, 5.0)
        start = st.global_best_loss
        st, m = jax.lax.scan(lambda s, _: swarm.step(s, hyper, loss), st, None, length=300)
        return m["global_best_loss"], start

    traj, start = jax.jit(jax.vmap(run))(jax.vmap(jax.random.key)(jnp.arange(4)))
    chex.assert_shape(traj, (4, 300))
    assert np.all(np.diff(np.asarray(traj), axis=1) <= 0)  # global best never worsens
    assert np.all(np.asarray(traj[:, -1]) < 1e-2 * np.asarray(start))
    assert float(traj[:, -1].max()) < 0.1


def test_hyper_validation_names_parameter():
    with pytest.raises(ValueError, match="cognitive"):
        swarm.PSOHyperParams(cognitive=-1.0).validate()
    with pytest.raises(ValueError, match="velocity_clamp"):
        swarm.PSOHyperParams(velocity_clamp=0.0).validate()
    with pytest.raises(ValueError, match="position_low"):
        swarm.PSOHyperParams(position_low=2.0, position_high=1.0).validate()
    with pytest.raises(ValueError, match="rng"):
        swarm.PSOOptions(rng="mt19937")
