"""DP-SGD: clipping against a naive loop, vmap of vmap, padding, fast == generic, noise."""

from __future__ import annotations

import functools

import flax.linen as nn
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from swarmjax import models
from swarmjax.privacy import dpsgd

B, D, C = 8, 5, 3


def plain_apply(params, x):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return h @ params["w2"]


def plain_params(key):
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (D, 4)),
        "b1": jnp.zeros(4),
        "w2": jax.random.normal(k2, (4, C)),
    }


def data(key, b=B):
    kx, ky = jax.random.split(key)
    return jax.random.normal(kx, (b, D)) * 3.0, jax.random.randint(ky, (b,), 0, C)


def naive_clipped_sum(apply_fn, params, x, y, mask, clip):
    """One example at a time, as a Python loop (one jitted single-example gradient)."""
    grad_one = jax.jit(jax.grad(lambda p, xi, yi: models.cross_entropy(apply_fn(p, xi), yi)[0]))
    total = jax.tree_util.tree_map(jnp.zeros_like, params)
    for i in range(x.shape[0]):
        if not bool(mask[i]):
            continue
        g = grad_one(params, x[i : i + 1], y[i : i + 1])
        norm = jnp.sqrt(sum(jnp.sum(leaf**2) for leaf in jax.tree_util.tree_leaves(g)))
        scale = min(1.0, clip / float(norm))
        total = jax.tree_util.tree_map(lambda t, gi, s=scale: t + s * gi, total, g)
    return total


def assert_trees_close(a, b, atol=1e-5):
    jax.tree_util.tree_map(lambda u, v: np.testing.assert_allclose(u, v, atol=atol), a, b)


KW = dict(loss_fn=models.cross_entropy, clip_norm=0.7)


@functools.cache
def _jitted_clipped_sum(apply_fn, method, microbatch_size):
    fn = lambda p, x, y, m: dpsgd.clipped_grad_sum(
        p, x, y, m, apply_fn=apply_fn, method=method, microbatch_size=microbatch_size, **KW
    )
    return jax.jit(fn)


def clipped_sum(params, x, y, mask, *, apply_fn, method="auto", microbatch_size=None):
    """Jitted, cached clipped_grad_sum (compilation dominates the test time)."""
    return _jitted_clipped_sum(apply_fn, method, microbatch_size)(params, x, y, mask)


def test_generic_matches_naive_loop():
    params = plain_params(jax.random.key(0))
    x, y = data(jax.random.key(1))
    mask = jnp.arange(B) < 6
    got, norms = clipped_sum(params, x, y, mask, apply_fn=plain_apply)
    assert_trees_close(got, naive_clipped_sum(plain_apply, params, x, y, mask, 0.7))
    assert norms.shape == (B,) and float(norms.max()) > 0.7  # clipping is active


@pytest.fixture(scope="module")
def flax_mlp():
    model = models.mlp((6, 4), C, (D,))
    return model, jax.jit(model.init)(jax.random.key(2))


def test_fast_path_matches_naive_loop_and_generic(flax_mlp):
    model, params = flax_mlp
    x, y = data(jax.random.key(3))
    mask = jnp.arange(B) < 7
    assert dpsgd.fast_path_supported(model.apply, params, x)[0]
    fast, n_fast = clipped_sum(params, x, y, mask, apply_fn=model.apply, method="fast")
    gen, n_gen = clipped_sum(params, x, y, mask, apply_fn=model.apply, method="generic")
    assert_trees_close(fast, naive_clipped_sum(model.apply, params, x, y, mask, 0.7))
    assert_trees_close(fast, gen)
    np.testing.assert_allclose(n_fast[:7], n_gen[:7], rtol=1e-5)


class TinyCNN(nn.Module):
    """Conv, pool, Dense: exercises the fast path's per-layer VJP for convolutions."""

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(3, (3, 3), padding="VALID")(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = nn.relu(nn.Dense(5)(x.reshape((x.shape[0], -1))))
        return nn.Dense(C, use_bias=False)(x)


def test_fast_equals_generic_noised_gradient_cnn():
    model = models.from_flax(TinyCNN(), (8, 8, 2), C)
    params = jax.jit(model.init)(jax.random.key(4))
    x = jax.random.normal(jax.random.key(5), (4, 8, 8, 2))
    y = jnp.array([0, 2, 1, 1])
    mask = jnp.array([True, True, True, False])
    assert dpsgd.fast_path_supported(model.apply, params, x)[0]
    kw = dict(
        apply_fn=model.apply,
        loss_fn=models.cross_entropy,
        clip_norm=0.5,
        noise_multiplier=1.3,
        expected_batch_size=3.0,
    )
    key = jax.random.key(6)
    run = lambda method: jax.jit(
        lambda k, p, x, y, m: dpsgd.dp_grad(k, p, x, y, m, method=method, **kw)
    )(key, params, x, y, mask)
    fast, gen = run("fast"), run("generic")
    assert_trees_close(fast, gen, atol=1e-6)


def test_microbatching_matches_full_batch(flax_mlp):
    model, params = flax_mlp
    x, y = data(jax.random.key(7))
    mask = jnp.arange(B) != 2
    for method in ("fast", "generic"):
        full, _ = clipped_sum(params, x, y, mask, apply_fn=model.apply, method=method)
        micro, norms = clipped_sum(
            params, x, y, mask, apply_fn=model.apply, method=method, microbatch_size=2
        )
        assert norms.shape == (B,)
        assert_trees_close(full, micro)


@pytest.mark.parametrize("method", ["fast", "generic"])
def test_padding_never_contributes(flax_mlp, method):
    model, params = flax_mlp
    x, y = data(jax.random.key(8))
    x = x.at[5:7].set(jnp.nan).at[7].set(1e6)  # garbage in the padded rows
    mask = jnp.arange(B) < 5
    padded, _ = clipped_sum(params, x, y, mask, apply_fn=model.apply, method=method)
    assert_trees_close(padded, naive_clipped_sum(model.apply, params, x, y, mask, 0.7))


def test_vmap_over_clients_and_particles():
    clients, particles = 2, 2
    keys = jax.random.split(jax.random.key(9), clients * particles)
    params = jax.vmap(plain_params)(keys)
    params = jax.tree_util.tree_map(lambda a: a.reshape(clients, particles, *a.shape[1:]), params)
    xs, ys = jax.vmap(data)(jax.random.split(jax.random.key(10), clients))
    masks = jnp.stack([jnp.arange(B) < 8, jnp.arange(B) < 4])

    def one(p, x, y, m):
        return dpsgd.clipped_grad_sum(p, x, y, m, apply_fn=plain_apply, **KW)[0]

    over_particles = jax.vmap(one, in_axes=(0, None, None, None))
    got = jax.jit(jax.vmap(over_particles))(params, xs, ys, masks)
    for c in range(clients):
        for j in range(particles):
            p = jax.tree_util.tree_map(lambda a, c=c, j=j: a[c, j], params)
            want = naive_clipped_sum(plain_apply, p, xs[c], ys[c], masks[c], 0.7)
            assert_trees_close(jax.tree_util.tree_map(lambda a, c=c, j=j: a[c, j], got), want)


def _noise(key, params, x, y, mask, sigma, clip, ebs, apply_fn=plain_apply):
    noisy = dpsgd.dp_grad(
        key,
        params,
        x,
        y,
        mask,
        apply_fn=apply_fn,
        loss_fn=models.cross_entropy,
        clip_norm=clip,
        noise_multiplier=sigma,
        expected_batch_size=ebs,
    )
    clean, _ = dpsgd.clipped_grad_sum(
        params, x, y, mask, apply_fn=apply_fn, loss_fn=models.cross_entropy, clip_norm=clip
    )
    diff = jax.tree_util.tree_map(lambda a, b: a - b / ebs, noisy, clean)
    return jnp.concatenate([leaf.ravel() for leaf in jax.tree_util.tree_leaves(diff)])


def test_noise_std_and_independence():
    """Noise ~ N(0, (sigma C / ebs)^2) per coordinate, independent across steps, clients,
    particles and coordinates, and independent of which examples are in the batch."""
    wide = lambda p, x: x @ p["w"]
    params = {"w": jnp.zeros((D, 400))}
    sigma, clip, ebs = 1.7, 0.6, 4.0
    root = jax.random.key(12)
    idx = [(s, c, j) for s in range(3) for c in range(2) for j in range(2)]
    keys = [dpsgd.noise_key(root, s, c, j) for s, c, j in idx]
    # one more run: the first key again, with other examples and another mask
    keys = jnp.stack([*keys, keys[0]])
    xs, ys = jax.vmap(data)(jax.random.split(jax.random.key(11), len(idx) + 1))
    masks = jnp.ones((len(idx) + 1, B), bool).at[-1, 3:].set(False)
    run = jax.jit(jax.vmap(lambda k, x, y, m: _noise(k, params, x, y, m, sigma, clip, ebs, wide)))
    z = np.asarray(run(keys, xs, ys, masks)) / (sigma * clip / ebs)  # iid N(0, 1) expected
    np.testing.assert_allclose(z[-1], z[0], atol=1e-4)  # noise does not depend on the data
    z = z[:-1]
    n = z.size
    assert abs(z.mean()) < 5 / np.sqrt(n)
    assert abs(z.var() - 1.0) < 5 * np.sqrt(2.0 / n)
    corr = np.corrcoef(z)
    off = corr[~np.eye(len(idx), dtype=bool)]
    assert np.abs(off).max() < 5 / np.sqrt(z.shape[1])
    lag = np.corrcoef(z[:, :-1].ravel(), z[:, 1:].ravel())[0, 1]
    assert abs(lag) < 5 / np.sqrt(n)


def test_haiku_model_generic_path():
    def forward(x):
        return hk.nets.MLP([6, C])(x)

    model = models.from_haiku(hk.without_apply_rng(hk.transform(forward)), (D,), C)
    params = jax.jit(model.init)(jax.random.key(14))
    x, y = data(jax.random.key(15))
    mask = jnp.arange(B) < 5
    ok, why = dpsgd.fast_path_supported(model.apply, params, x)
    assert not ok and "flax" in why
    got, _ = clipped_sum(params, x, y, mask, apply_fn=model.apply)
    assert_trees_close(got, naive_clipped_sum(model.apply, params, x, y, mask, 0.7))
    with pytest.raises(ValueError, match="fast"):
        dpsgd.clipped_grad_sum(params, x, y, mask, apply_fn=model.apply, method="fast", **KW)


def test_unsupported_flax_layer_falls_back_to_generic():
    class WithNorm(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(C)(nn.LayerNorm()(nn.Dense(4)(x)))

    model = models.from_flax(WithNorm(), (D,), C)
    params = jax.jit(model.init)(jax.random.key(16))
    x, y = data(jax.random.key(17))
    mask = jnp.ones(B, bool)
    ok, why = dpsgd.fast_path_supported(model.apply, params, x)
    assert not ok and "LayerNorm" in why
    got, _ = clipped_sum(params, x, y, mask, apply_fn=model.apply)
    assert_trees_close(got, naive_clipped_sum(model.apply, params, x, y, mask, 0.7))


def test_dp_step_composes_with_optax(flax_mlp):
    """Without noise and with an inactive clip, a DP step is the optax step on the mean grad."""
    model, params = flax_mlp
    x, y = data(jax.random.key(18))
    tx = optax.adamw(1e-2, weight_decay=1e-3)
    state = tx.init(params)
    step = jax.jit(
        functools.partial(
            dpsgd.dp_step,
            optimizer=tx,
            apply_fn=model.apply,
            loss_fn=models.cross_entropy,
            clip_norm=1e6,
            noise_multiplier=0.0,
            expected_batch_size=B,
        )
    )
    new, _ = step(jax.random.key(0), params, state, x, y, jnp.ones(B, bool))

    @jax.jit
    def reference(params, state):
        g = jax.grad(lambda p: models.loss(model.apply, p, x, y))(params)
        updates, _ = tx.update(g, state, params)
        return optax.apply_updates(params, updates)

    assert_trees_close(new, reference(params, state), atol=1e-6)


def test_hyper_parameters_are_vmappable():
    params = plain_params(jax.random.key(19))
    x, y = data(jax.random.key(20))
    clips = jnp.array([0.1, 1.0, 10.0])

    def go(clip):
        return dpsgd.dp_grad(
            jax.random.key(0),
            params,
            x,
            y,
            jnp.ones(B, bool),
            apply_fn=plain_apply,
            loss_fn=models.cross_entropy,
            clip_norm=clip,
            noise_multiplier=0.0,
            expected_batch_size=8.0,
        )

    out = jax.jit(jax.vmap(go))(clips)
    for i, clip in enumerate([0.1, 1.0, 10.0]):
        want = naive_clipped_sum(plain_apply, params, x, y, jnp.ones(B, bool), clip)
        assert_trees_close(
            jax.tree_util.tree_map(lambda a, i=i: a[i], out),
            jax.tree_util.tree_map(lambda a: a / 8.0, want),
        )


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(clip_norm=0.0), "clip_norm"),
        (dict(clip_norm=-1.0), "clip_norm"),
        (dict(noise_multiplier=-0.5), "noise_multiplier"),
        (dict(expected_batch_size=0.0), "expected_batch_size"),
        (dict(microbatch_size=3), "microbatch_size"),
        (dict(method="ghost"), "method"),
    ],
)
def test_invalid_input_names_parameter(kwargs, name):
    params = plain_params(jax.random.key(0))
    x, y = data(jax.random.key(1))
    args = dict(
        apply_fn=plain_apply,
        loss_fn=models.cross_entropy,
        clip_norm=1.0,
        noise_multiplier=1.0,
        expected_batch_size=4.0,
    )
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        dpsgd.dp_grad(jax.random.key(0), params, x, y, jnp.ones(B, bool), **args)
