"""Snapped Gaussian / Laplace mechanisms: the floating-point attack and its defence, exactly.

The attack and the bound are checked by EXHAUSTIVE enumeration of a reduced-precision sampler:
the module's own bit-to-noise functions fed every bit pattern of 12 position bits and 16
binades (139,264 atoms), so the noise takes each value with a known probability and the
law of every output is exact.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special, stats

from swarmjax.privacy import snapping as sn
from swarmjax.privacy.mechanisms import bounded

# ----------------------------------------------------------------------------------------
# Reduced-precision enumeration
# ----------------------------------------------------------------------------------------

POSITION_BITS = 12  # bins per binade: 2^12 (the full sampler has 2^22)
TAIL_BINADE = 16  # binades 0..15, then one lump for everything below 2^-17


def _reduced_atoms() -> tuple[np.ndarray, np.ndarray]:
    """Every bit pattern of the reduced sampler as full float32 words, with its weight.

    Binade ``G < 16`` has probability ``2^-(G+1)``, the lump ``G = 16`` the rest ``2^-16``;
    the low 10 of the 22 position bits are fixed at ``10...0``, so each atom sits within
    ``2^-23`` (relative) of the middle of its reduced bin.  Returns ``(words (3, n),
    weights (n,))`` with weights summing to 1.
    """
    g, m, sign = np.meshgrid(
        np.arange(TAIL_BINADE + 1), np.arange(2**POSITION_BITS), np.arange(2), indexing="ij"
    )
    g, m, sign = g.ravel(), m.ravel(), sign.ravel()
    low = 22 - POSITION_BITS
    position = (m << low) | (1 << (low - 1))
    words = np.stack(
        [
            (np.uint32(1) << (31 - g).astype(np.uint32)),
            np.zeros_like(g, np.uint32),
            ((position << 10) | sign).astype(np.uint32),
        ]
    ).astype(np.uint32)
    weight = np.where(g < TAIL_BINADE, 2.0 ** -(g + 1.0), 2.0**-TAIL_BINADE)
    return words, weight / (2 * 2**POSITION_BITS)


def _ideal_cells(noise: str, x: float, scale: float, grid: float, bound: float) -> np.ndarray:
    """Exact probabilities of cells ``-J..J`` of the snapped mechanism with exact noise."""
    j = np.floor(bound / grid)
    edges = (np.arange(-j, j + 1) - 0.5) * grid  # lower edge of each cell
    cdf = stats.norm.cdf if noise == "gaussian" else stats.laplace.cdf
    upper = np.append(cdf((edges[1:] - x) / scale), 1.0)
    lower = np.append(0.0, cdf((edges[1:] - x) / scale))
    return upper - lower


def _enumerated_cells(noise: str, x: float, scale: float, grid: float, bound: float):
    """Law of the snapped output from the enumeration: ``(cells (2J+1,), plain outputs)``."""
    words, weight = _reduced_atoms()
    draw = sn.normal_from_bits if noise == "gaussian" else sn.laplace_from_bits
    noise_values = jnp.float32(scale) * draw(jnp.asarray(words))
    xs = jnp.full(noise_values.shape, x, jnp.float32)
    b, g = jnp.float32(bound), jnp.float32(grid)
    snapped = np.asarray(jax.jit(sn._snap)(bounded(xs, -b, b), noise_values, g, b))
    j = np.round(snapped / grid).astype(int) + int(np.floor(bound / grid))
    cells = np.bincount(j, weights=weight, minlength=2 * int(np.floor(bound / grid)) + 1)
    return cells, np.asarray(xs + noise_values), weight


def _reduced_bound(noise: str, scale: float, grid: float, bound: float) -> tuple[float, float]:
    """``(r, tau)`` of the module's bound at the reduced precision."""
    f_reach = 2.0 ** -(TAIL_BINADE + 1)
    reach = -special.ndtri(f_reach) if noise == "gaussian" else -np.log(2 * f_reach)
    v = min(reach, 2 * bound / scale)
    half_bin = 2.0 ** -(POSITION_BITS + 1) + 2.0**-23
    e = sn._coupling_error(noise, v, half_bin, 2.0**-24)
    return float(sn._cell_ratio(noise, grid / scale, v + e, e)), 2.0**-TAIL_BINADE


@pytest.mark.parametrize("noise", ["gaussian", "laplace"])
def test_exhaustive_attack_on_plain_float32_and_exact_bound_for_snapping(noise):
    scale, bound, x, sensitivity = 1.0, 2.0, 0.3, 1.0
    x2 = x + sensitivity
    std = scale if noise == "gaussian" else np.sqrt(2.0) * scale
    grid = sn.snapping_grid(bound, std)
    assert grid == 0.125

    cells, plain, weight = _enumerated_cells(noise, x, scale, grid, bound)
    cells2, plain2, _ = _enumerated_cells(noise, x2, scale, grid, bound)

    # The attack: most plain float32 outputs of x cannot come from x' (and back), so one
    # exact output tells them apart with probability > 0.9: delta >= 0.9 at any epsilon.
    only_x = weight[~np.isin(plain, plain2)].sum()
    only_x2 = weight[~np.isin(plain2, plain)].sum()
    assert only_x > 0.9 and only_x2 > 0.9

    # Snapped: the same support, every cell of -J..J reachable from both secrets.
    assert np.all(cells > 0) and np.all(cells2 > 0)

    # Each cell's probability is within (1 +- r) of the exact-noise one; the tail lump
    # (lands beyond bound, in an end cell) adds at most 2 tau there.
    r, tau = _reduced_bound(noise, scale, grid, bound)
    for law, at in ((cells, x), (cells2, x2)):
        ideal = _ideal_cells(noise, at, scale, grid, bound)
        slack = r * ideal
        slack[[0, -1]] += 2 * tau
        assert np.all(np.abs(law - ideal) <= slack)
        inner = np.abs(law - ideal)[1:-1] / ideal[1:-1]
        assert inner.max() > r / 20  # the enumeration resolves deviations near the bound

    # Privacy loss per inner cell: the exact-noise loss plus at most log((1 + r) / (1 - r)).
    ideal_loss = np.log(_ideal_cells(noise, x, scale, grid, bound))
    ideal_loss -= np.log(_ideal_cells(noise, x2, scale, grid, bound))
    excess = np.abs(np.log(cells / cells2) - ideal_loss)[1:-1]
    assert excess.max() <= np.log1p(r) - np.log1p(-r)


# ----------------------------------------------------------------------------------------
# Exact snapping, also when XLA fuses the noise product into an FMA
# ----------------------------------------------------------------------------------------


def _near_midpoint_cases(seed: int, n: int = 4000):
    """float32 ``(x, std, z)`` whose ``x + std * z`` lands on, or an ulp or two from, a cell
    midpoint of grid ``2^-4`` (bound 4), plus random ones."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-4, 4, n).astype(np.float32)
    std = np.float32(0.7)
    c = ((rng.integers(-60, 60, n) + 0.5) * 2.0**-4).astype(np.float32)
    z = ((c.astype(np.float64) - x) / std).astype(np.float32)
    z = np.nextafter(z, np.float32(np.inf) * rng.choice([-1, 1], n).astype(np.float32))
    z[: n // 4] = rng.standard_normal(n // 4).astype(np.float32)
    return x, std, z


def _reference_index(x: np.ndarray, noise: np.ndarray, grid: float, bound: float) -> np.ndarray:
    """``clip(floor((x + noise) / grid + 1/2))`` in float64, where ``x + noise`` is exact."""
    limit = np.floor(bound / grid)
    return np.clip(np.floor((x.astype(np.float64) + noise) / grid + 0.5), -limit, limit)


def test_snap_rounds_the_real_sum_exactly():
    x, std, z = _near_midpoint_cases(0)
    noise = std * z  # float32 product, as the mechanism computes it without fusion
    out = np.asarray(jax.jit(sn._snap)(x, noise, jnp.float32(2**-4), jnp.float32(4.0)))
    want = _reference_index(x, noise.astype(np.float64), 2**-4, 4.0)
    np.testing.assert_array_equal(out / 2**-4, want)
    assert np.sum(np.float32(x) + noise != x.astype(np.float64) + noise) > 100  # float32 sums
    # exact ties (8.5 and -8.5 cells) round half up
    g, b = jnp.float32(2**-4), jnp.float32(4.0)
    assert float(sn._snap(jnp.float32(0.5), jnp.float32(2**-5), g, b)) == 9 * 2**-4
    assert float(sn._snap(jnp.float32(-0.5), jnp.float32(-(2**-5)), g, b)) == -8 * 2**-4


def test_snap_is_exact_for_fused_or_unfused_product_at_O2():
    """At XLA's default -O2 the CPU backend fuses ``x + std * z`` into an FMA; the decision is
    then exact for the unrounded ``std * z`` (or the rounded one): never anything else."""
    script = textwrap.dedent(
        """
        import sys, numpy as np, jax, jax.numpy as jnp
        sys.path.insert(0, sys.argv[1])
        from tests.test_snapping import _near_midpoint_cases, _reference_index
        from swarmjax.privacy import snapping as sn
        x, std, z = _near_midpoint_cases(1)
        f = jax.jit(lambda x, z: sn._snap(x, std * z, jnp.float32(2**-4), jnp.float32(4.0)))
        got = np.asarray(f(x, z)) / 2**-4
        exact = _reference_index(x, np.float64(std) * z, 2**-4, 4.0)
        rounded = _reference_index(x, (std * z).astype(np.float64), 2**-4, 4.0)
        assert np.all((got == exact) | (got == rounded))
        print("fused", int(np.sum(got != rounded)), "of", got.size)
        """
    )
    env = dict(os.environ, XLA_FLAGS="--xla_backend_optimization_level=2", JAX_PLATFORMS="cpu")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run(
        [sys.executable, "-c", script, repo], env=env, capture_output=True, text=True, cwd=repo
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("fused")


# ----------------------------------------------------------------------------------------
# Outputs, hostile inputs, determinism
# ----------------------------------------------------------------------------------------

HOSTILE = np.array(
    [np.nan, np.inf, -np.inf, 3e38, -3e38, 1e-45, -0.0, 2.0, -2.0, 1.9999999], np.float32
)


def _on_grid(out: np.ndarray, grid: float, bound: float) -> bool:
    j = out / grid
    return bool(np.all(np.isfinite(out)) and np.all(j == np.round(j)) and np.all(abs(out) <= bound))


def test_outputs_on_grid_and_within_bound_for_hostile_inputs():
    key = jax.random.key(3)
    tree = {"a": jnp.asarray(HOSTILE), "b": jnp.asarray(HOSTILE[::-1]).astype(jnp.bfloat16)}
    out = sn.snapped_gaussian_mechanism(
        key, tree, l2_sensitivity=0.4, noise_multiplier=1.0, bound=2.0
    )
    grid = sn.snapping_grid(2.0, 0.4)
    assert _on_grid(np.asarray(out["a"]), grid, 2.0) and out["b"].dtype == jnp.bfloat16
    lap = sn.snapped_laplace_mechanism(
        key, jnp.asarray(HOSTILE), l1_sensitivity=1.0, epsilon=jnp.linspace(0.5, 5.0, 10), bound=2.0
    )
    grids = sn.snapping_grid(2.0, np.sqrt(2.0) / np.linspace(0.5, 5.0, 10, dtype=np.float32))
    assert np.all(np.asarray(lap) / grids == np.round(np.asarray(lap) / grids))
    assert np.all(np.abs(np.asarray(lap)) <= 2.0)
    # non-finite secrets are the secret `bound` (the rule of mechanisms.bounded)
    same = jnp.where(jnp.isfinite(tree["a"]), tree["a"], 2.0)
    again = sn.snapped_gaussian_mechanism(
        key, {"a": same, "b": tree["b"]}, l2_sensitivity=0.4, noise_multiplier=1.0, bound=2.0
    )
    np.testing.assert_array_equal(out["a"], again["a"])


def test_huge_noise_and_tiny_noise_stay_on_the_grid():
    key = jax.random.key(4)
    x = jnp.linspace(-3.0, 3.0, 1000)
    loud = sn.snapped_gaussian_mechanism(
        key, x, l2_sensitivity=1.0, noise_multiplier=1e6, bound=3.0
    )
    assert _on_grid(np.asarray(loud), 2.0, 3.0)  # grid = largest power of two <= bound
    assert set(np.unique(np.asarray(loud))) <= {-2.0, 0.0, 2.0}
    assert np.any(np.asarray(loud) == 2.0) and np.any(np.asarray(loud) == -2.0)
    quiet = sn.snapped_gaussian_mechanism(
        key, x, l2_sensitivity=1.0, noise_multiplier=1e-4, bound=3.0
    )
    grid = sn.snapping_grid(3.0, 1e-4)
    assert _on_grid(np.asarray(quiet), grid, 3.0)
    assert np.max(np.abs(np.asarray(quiet) - np.asarray(x))) < 6e-4  # ~5 sigma + half a cell


def test_jit_vmap_and_eager_agree_and_the_draw_depends_only_on_key_and_structure():
    key = jax.random.key(5)
    tree = {"a": jnp.arange(3.0), "b": jnp.ones((2, 2))}
    kwargs = dict(l2_sensitivity=0.5, noise_multiplier=1.1, bound=4.0)
    eager = sn.snapped_gaussian_mechanism(key, tree, **kwargs)
    jitted = jax.jit(lambda k, t: sn.snapped_gaussian_mechanism(k, t, **kwargs))(key, tree)
    jax.tree_util.tree_map(np.testing.assert_array_equal, eager, jitted)
    flat = jnp.concatenate([tree["a"], tree["b"].ravel()])  # same flattening order
    one = sn.snapped_gaussian_mechanism(key, flat, **kwargs)
    np.testing.assert_array_equal(one, jnp.concatenate([eager["a"], eager["b"].ravel()]))
    keys = jax.random.split(key, 4)
    batched = jax.vmap(lambda k: sn.snapped_gaussian_mechanism(k, flat, **kwargs))(keys)
    for i in range(4):
        np.testing.assert_array_equal(
            batched[i], sn.snapped_gaussian_mechanism(keys[i], flat, **kwargs)
        )
    assert not np.array_equal(batched[0], batched[1])
    lap = dict(l1_sensitivity=1.0, epsilon=jnp.array([0.5, 1.0, 2.0]), bound=4.0)
    np.testing.assert_array_equal(
        sn.snapped_laplace_mechanism(key, jnp.ones(3), **lap),
        jax.jit(lambda k: sn.snapped_laplace_mechanism(k, jnp.ones(3), **lap))(key),
    )


def test_traced_noise_multiplier_uses_the_host_grid_rule():
    key, x = jax.random.key(6), jnp.linspace(-1.0, 1.0, 50)
    mults = jnp.array([0.3, 1.0, 7.0])
    # traced under vmap, in one jitted program (not batched op by op: one compilation)
    traced = jax.jit(
        jax.vmap(
            lambda z: sn.snapped_gaussian_mechanism(
                key, x, l2_sensitivity=0.4, noise_multiplier=z, bound=24.0
            )
        )
    )(mults)
    for i, z in enumerate([0.3, 1.0, 7.0]):
        host = sn.snapped_gaussian_mechanism(
            key, x, l2_sensitivity=0.4, noise_multiplier=z, bound=24.0
        )
        np.testing.assert_array_equal(traced[i], host)


def test_float64_path_under_x64():
    with jax.enable_x64(True):
        x = jnp.linspace(-1.0, 1.0, 64, dtype=jnp.float64)
        kwargs = dict(l2_sensitivity=0.4, noise_multiplier=1.0, bound=24.0)
        out = sn.snapped_gaussian_mechanism(jax.random.key(7), x, **kwargs)
        assert out.dtype == jnp.float64 and _on_grid(np.asarray(out), 2.0**-5, 24.0)
        wide = sn.snapped_gaussian_mechanism(
            jax.random.key(7), x.astype(jnp.float32), dtype=jnp.float64, **kwargs
        )
        assert wide.dtype == jnp.float32 and _on_grid(np.asarray(wide), 2.0**-5, 24.0)
        words = jnp.zeros((4, 1), jnp.uint32)
        top = float(sn.normal_from_bits(words, jnp.float64)[0])
        f = np.ldexp(1.0 + 0.5 * 2.0**-51, -66)
        assert abs(top + special.ndtri(f)) < 1e-13
    with pytest.raises(ValueError, match="jax_enable_x64"):
        sn.standard_normal(jax.random.key(0), (2,), jnp.float64)


# ----------------------------------------------------------------------------------------
# The sampler
# ----------------------------------------------------------------------------------------


def _words_for(binade: np.ndarray, position: np.ndarray, sign: np.ndarray) -> jnp.ndarray:
    w0 = np.where(binade < 32, np.uint32(1) << np.clip(31 - binade, 0, 31).astype(np.uint32), 0)
    w1 = np.where(
        (binade >= 32) & (binade < 64),
        np.uint32(1) << np.clip(63 - binade, 0, 31).astype(np.uint32),
        0,
    )
    w2 = (position.astype(np.uint32) << 10) | sign.astype(np.uint32)
    return jnp.asarray(np.stack([w0, w1, w2]).astype(np.uint32))


@pytest.mark.parametrize("noise", ["gaussian", "laplace"])
def test_bits_to_noise_on_extreme_patterns_and_every_binade(noise):
    """Every binade 0..64 at its extreme and 512 spread positions against float64 scipy, within
    the budget the bound uses; values are monotone across binade edges; the sign bit negates."""
    draw = sn.normal_from_bits if noise == "gaussian" else sn.laplace_from_bits
    positions = np.concatenate([[0, 1, 2**21, 2**22 - 2, 2**22 - 1], np.arange(1, 512) * 8191])
    g, m = (a.ravel() for a in np.meshgrid(np.arange(65), positions, indexing="ij"))
    got = np.asarray(draw(_words_for(g, m, np.zeros_like(g))), np.float64)
    f = np.ldexp(1.0 + (m + 0.5) * 2.0**-22, -(g + 2))
    want = -special.ndtri(f) if noise == "gaussian" else -np.log(2.0 * f)
    budget = sn._FUNCTION_ERROR[noise] * 2.0**-24 * (np.abs(want) + 1.0)
    assert np.all(np.abs(got - want) <= budget)
    assert np.all(got > 0)
    # the tails: binade 63 reaches the stated reach, the all-zero pattern a bit further
    reach = sn.GAUSSIAN_REACH if noise == "gaussian" else sn.LAPLACE_REACH
    last = got[(g == 63) & (m == 0)][0]
    assert reach - 1e-3 < last < reach + 0.05
    zeros = float(draw(jnp.zeros((3, 1), jnp.uint32))[0])
    assert zeros > last and np.isfinite(zeros)
    # monotone: a larger binade (smaller f) gives a larger |value|
    edge_low = got[m == 2**22 - 1]  # largest f of each binade
    edge_high = got[m == 0]  # smallest f of each binade
    assert np.all(edge_low < edge_high) and np.all(np.diff(edge_high) > 0)
    neg = np.asarray(draw(_words_for(g, m, np.ones_like(g))), np.float64)
    np.testing.assert_array_equal(neg, -got)


def test_sampler_laws_on_a_large_draw():
    key = jax.random.key(8)
    z = np.asarray(sn.standard_normal(key, (1 << 20,)), np.float64)
    lap = np.asarray(sn.standard_laplace(key, (1 << 20,)), np.float64)
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert stats.kstest(lap, "laplace").pvalue > 1e-3
    n = z.size
    assert abs(z.mean()) < 5 / np.sqrt(n) and abs(z.var() - 1) < 5 * np.sqrt(2 / n)
    assert abs(np.mean(np.abs(z) > 3) - 2 * stats.norm.sf(3)) < 5 * np.sqrt(2.7e-3 / n)
    assert abs(lap.var() - 2) < 5 * np.sqrt(20 / n)
    # different keys, different draws; the same key, the same draw
    assert not np.array_equal(z[:10], np.asarray(sn.standard_normal(jax.random.key(9), (10,))))
    np.testing.assert_array_equal(z[:4], np.asarray(sn.standard_normal(key, (1 << 20,)))[:4])


# ----------------------------------------------------------------------------------------
# Grid rule, cost, composition
# ----------------------------------------------------------------------------------------


def test_grid_rule():
    assert sn.snapping_grid(24.0, 0.4) == 2.0**-5  # 0.4 / 8 = 0.05
    assert sn.snapping_grid(1.0, 8.0) == 1.0  # capped at bound
    std = np.array([0.01, 0.37, 5.0, 900.0])
    grid = sn.snapping_grid(1000.0, std)
    assert np.all((grid > std / 16) & (grid <= std / 8))
    assert np.all(np.frexp(grid)[0] == 0.5)
    assert sn.snapping_grid(2.0**18, 1.0) == 2.0**-3  # = 4 float32 ulps of 2^18: just fits
    with pytest.raises(ValueError, match="bound must be at most"):
        sn.snapping_grid(2.0**19, 1.0)
    assert sn.snapping_grid(2.0**19, 1.0, jnp.float64) == 2.0**-3


def test_cost_numbers_and_composition():
    gauss = sn.snapping_cost("gaussian", scale=0.4, bound=24.0)
    lap = sn.snapping_cost("laplace", scale=0.5, bound=4.0)
    wide = sn.snapping_cost("gaussian", scale=0.4, bound=24.0, dtype=jnp.float64)
    assert 1e-4 < gauss.epsilon < 1e-3 and 1e-5 < lap.epsilon < 1e-3
    assert wide.epsilon < 1e-11 and gauss.delta == wide.delta == 2.0**-63
    assert gauss.epsilon == pytest.approx(2 * gauss.ratio, rel=1e-6)
    # a coarser grid and a smaller bound (less reach needed) never cost more here
    coarse = sn.snapping_cost("laplace", scale=0.5, bound=4.0, grid=0.25)
    near = sn.snapping_cost("laplace", scale=0.5, bound=0.5)
    assert coarse.epsilon < lap.epsilon and near.epsilon < lap.epsilon
    eps, delta = sn.snapped_epsilon_delta(1.0, 1e-6, gauss, 0)
    assert (eps, delta) == (1.0, 1e-6)
    eps, delta = sn.snapped_epsilon_delta(1.0, 1e-6, gauss, 1000)
    assert eps == pytest.approx(1.0 + 1000 * gauss.epsilon)
    growth = (1 + gauss.ratio) ** 1000
    assert delta == pytest.approx(growth * 1e-6 + 1000 * 2.0**-63 * (1 + np.exp(eps)))
    assert sn.snapped_epsilon_delta(1.0, 1e-6, gauss, 10**9)[1] == 1.0


# ----------------------------------------------------------------------------------------
# Bad arguments
# ----------------------------------------------------------------------------------------

_KEY = jax.random.key(0)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (
            lambda: sn.snapped_gaussian_mechanism(
                _KEY, 1.0, l2_sensitivity=0.0, noise_multiplier=1.0, bound=1.0
            ),
            "l2_sensitivity",
        ),
        (
            lambda: sn.snapped_gaussian_mechanism(
                _KEY, 1.0, l2_sensitivity=1.0, noise_multiplier=-1.0, bound=1.0
            ),
            "noise_multiplier",
        ),
        (
            lambda: sn.snapped_gaussian_mechanism(
                _KEY, 1.0, l2_sensitivity=1.0, noise_multiplier=np.inf, bound=1.0
            ),
            "noise_multiplier",
        ),
        (
            lambda: sn.snapped_gaussian_mechanism(
                _KEY, 1.0, l2_sensitivity=1.0, noise_multiplier=1.0, bound=0.0
            ),
            "bound",
        ),
        (
            lambda: sn.snapped_gaussian_mechanism(
                _KEY, 1.0, l2_sensitivity=1.0, noise_multiplier=1.0, bound=np.nan
            ),
            "bound",
        ),
        (
            lambda: sn.snapped_gaussian_mechanism(
                _KEY, 1.0, l2_sensitivity=1.0, noise_multiplier=1.0, bound=[1.0, 2.0]
            ),
            "bound",
        ),
        (
            lambda: sn.snapped_gaussian_mechanism(
                _KEY, 1.0, l2_sensitivity=1.0, noise_multiplier=1.0, bound=1.0, grid=0.3
            ),
            "grid",
        ),
        (
            lambda: sn.snapped_gaussian_mechanism(
                _KEY, 1.0, l2_sensitivity=1.0, noise_multiplier=1.0, bound=1.0, grid=2.0
            ),
            "grid",
        ),
        (
            lambda: sn.snapped_gaussian_mechanism(
                _KEY, 1.0, l2_sensitivity=1.0, noise_multiplier=1.0, bound=1.0, grid=2.0**-30
            ),
            "grid",
        ),
        (
            lambda: sn.snapped_gaussian_mechanism(
                _KEY, 1.0, l2_sensitivity=1.0, noise_multiplier=1e-7, bound=10.0
            ),
            "bound",
        ),
        (
            lambda: sn.snapped_gaussian_mechanism(
                _KEY, 1.0, l2_sensitivity=1.0, noise_multiplier=1.0, bound=1.0, dtype=jnp.float16
            ),
            "dtype",
        ),
        (
            lambda: sn.snapped_laplace_mechanism(
                _KEY, 1.0, l1_sensitivity=1.0, epsilon=0.0, bound=1.0
            ),
            "epsilon",
        ),
        (
            lambda: sn.snapped_laplace_mechanism(
                _KEY, 1.0, l1_sensitivity=1.0, epsilon=np.inf, bound=1.0
            ),
            "epsilon",
        ),
        (
            lambda: sn.snapped_laplace_mechanism(
                _KEY, 1.0, l1_sensitivity=-1.0, epsilon=1.0, bound=1.0
            ),
            "l1_sensitivity",
        ),
        (
            lambda: sn.snapped_laplace_mechanism(
                _KEY, 1.0, l1_sensitivity=1.0, epsilon=1.0, bound=-1.0
            ),
            "bound",
        ),
        (lambda: sn.snapping_grid(0.0, 1.0), "bound"),
        (lambda: sn.snapping_grid(1.0, -1.0), "std"),
        (lambda: sn.snapping_cost("uniform", scale=1.0, bound=1.0), "noise"),
        (lambda: sn.snapping_cost("gaussian", scale=0.0, bound=1.0), "scale"),
        (lambda: sn.snapped_epsilon_delta(1.0, 2.0, sn.SnappingCost(0.1, 0.2, 0.0), 1), "delta"),
        (lambda: sn.snapped_epsilon_delta(1.0, 0.0, sn.SnappingCost(0.1, 0.2, 0.0), -1), "count"),
        (lambda: sn.normal_from_bits(jnp.zeros((2, 3), jnp.uint32)), "words"),
    ],
)
def test_bad_arguments_raise_one_clear_error(call, name):
    with pytest.raises(ValueError, match=name):
        call()
