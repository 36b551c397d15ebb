"""PAASO: PSO accuracy on f1-f8, the paper's qualitative findings, privacy, validation."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from swarmjax import paaso
from swarmjax.privacy import mechanisms as mech

RUNS = 20


@functools.cache
def _program(cfg, voting=False):
    """One jitted program per static configuration, vmapped over runs, the hyper-parameters
    (and, for ``strategy="voting"``, the strategy's index) its arguments: tests whose
    configurations agree share a compilation whatever their numbers (most of this file's
    time is compiling)."""
    if voting:
        return jax.jit(
            jax.vmap(lambda k, h, v: paaso.run(k, cfg, h, voting=v), in_axes=(0, None, None))
        )
    return jax.jit(jax.vmap(lambda k, h: paaso.run(k, cfg, h), in_axes=(0, None)))


def _run(cfg, hyper, runs=RUNS, offset=0, voting=None):
    keys = jax.vmap(jax.random.key)(jnp.arange(runs) + offset)
    if voting is not None:
        return _program(cfg, voting=True)(keys, hyper, paaso.VOTING.index(voting))
    return _program(cfg)(keys, hyper)


PSO = paaso.PAASOHyper(w=0.7, phi_p=1.4, phi_g=1.4)


@functools.cache
def _pso_any_function():
    """PSO over 20 runs with the function as data: one compilation for f1-f8."""
    cfg = paaso.PAASOConfig(strategy="pso", function=None, iterations=1000)
    keys = jax.vmap(jax.random.key)(jnp.arange(RUNS))
    fn = jax.jit(jax.vmap(lambda k, f: paaso.run(k, cfg, PSO, f), in_axes=(0, None)))
    return lambda function: fn(keys, paaso.FUNCTIONS.index(function))


@pytest.mark.parametrize("function", ["f1", "f2", "f3", "f4"])
def test_pso_reaches_the_optimum_of_unimodal_functions(function):
    """50 agents, 1000 iterations, w = 0.7, phi = 1.4: >= 95 % of 20 runs within 1e-4."""
    cfg = paaso.PAASOConfig(strategy="pso", function=function, iterations=1000)
    out = _pso_any_function()(function)
    gap = np.asarray(out["final_objective"]) - cfg.objective.optimum_value(2)
    dist = np.linalg.norm(
        np.asarray(out["final_position"]) - cfg.objective.optimum_point(2), axis=1
    )
    assert np.mean((gap < 1e-4) & (dist < 1e-2)) >= 0.95


# Median behaviour on the multimodal functions (same settings): the median run finds the
# global optimum; some runs stay in a local minimum (f5: a neighbouring well ~118 higher,
# f6: the ring at 0.995, f8: a local minimum near 0.0074).
MEDIAN_GAP = {"f5": 1e-2, "f6": 1e-4, "f7": 1e-4, "f8": 1e-2}


@pytest.mark.parametrize("function", sorted(MEDIAN_GAP))
def test_pso_median_on_multimodal_functions(function):
    cfg = paaso.PAASOConfig(strategy="pso", function=function, iterations=1000)
    out = _pso_any_function()(function)
    gap = np.asarray(out["final_objective"]) - cfg.objective.optimum_value(2)
    assert np.median(gap) < MEDIAN_GAP[function]
    assert gap.min() > -1e-3  # never below the true optimum (the paper's f5 value is 30-D)


def _iterations_to(objective, threshold):
    below = np.asarray(objective).mean(axis=0) < threshold
    return int(np.argmax(below)) if below.any() else len(below)


def test_paper_ordering_pso_then_fl_then_voting_on_f4():
    """f4, 50 agents, k_alpha 8, w 0.7, phi_p = phi_g = 1.4, wG 0.1, p_c 1, p_m 0.9.

    Convergence speed = first iteration at which the mean f over 20 runs is below 30.
    The three voting strategies run as one program (``strategy="voting"``, the strategy
    an index: the static programs' swarms, test_function_and_voting_strategy_as_data_...).
    """
    hyper = paaso.PAASOHyper(w=0.7, phi_p=1.4, phi_g=1.4, w_g=0.1, p_c=1.0, p_m=0.9)
    speed = {}
    for strategy in paaso.STRATEGIES:
        voting = strategy in paaso.VOTING
        cfg = paaso.PAASOConfig(
            strategy="voting" if voting else strategy, function="f4", iterations=150
        )
        out = _run(cfg, hyper, voting=strategy if voting else None)
        speed[strategy] = _iterations_to(out["objective"], 30.0)
    assert speed["pso"] < speed["fl"] < min(speed[s] for s in ("adrd", "bdrd", "pbdrd"))
    assert max(speed.values()) < 150  # every strategy converges (privacy slows, not stops)


def test_more_agents_make_bdrd_converge_faster():
    """The paper's Fig. 5 setting: f4, bDRD, w 0.005, phi 2, wG 0.01, p_c 1; 40 runs.

    Mean objective over the first 300 iterations (area under the mean curve).
    """
    hyper = paaso.PAASOHyper(w=0.005, phi_p=2.0, phi_g=2.0, w_g=0.01)
    area = {}
    for agents in (50, 200):
        cfg = paaso.PAASOConfig(strategy="bdrd", function="f4", iterations=300, num_agents=agents)
        area[agents] = float(np.asarray(_run(cfg, hyper, runs=40)["objective"]).mean())
    assert area[200] < area[50]


def test_cognitive_fl_rule_is_available_and_differs():
    hyper = paaso.PAASOHyper(w=0.7, phi_p=1.4, phi_g=1.4, w_g=0.1)
    a = _run(paaso.PAASOConfig(strategy="fl", iterations=100), hyper)
    b = _run(paaso.PAASOConfig(strategy="fl", iterations=100, fl_rule="cognitive"), hyper)
    # the spec's literal reading carries no information about where pG should go
    assert np.asarray(b["objective"])[:, -1].mean() > 5 * np.asarray(a["objective"])[:, -1].mean()


def test_voting_counts_and_privacy_summary():
    hyper = paaso.PAASOHyper(w=0.7, phi_p=1.4, phi_g=1.4, w_g=0.1, p_c=0.6, p_m=0.7)
    cfg = paaso.PAASOConfig(strategy="pbdrd", iterations=100, num_agents=30)
    out = _run(cfg, hyper, runs=4)
    voters = np.asarray(out["voters"])
    assert voters.shape == (4, 100) and voters.min() >= 0 and voters.max() <= 30
    summary = paaso.privacy_summary(cfg, 0.7, voters)
    bound = np.log(2 * 38 / 39)
    np.testing.assert_allclose(summary["drd_eps_bound"], bound)
    np.testing.assert_allclose(summary["drd_eps_basic"], 100 * bound)
    assert np.all(summary["drd_eps_mean"] <= bound + 1e-12)
    n = voters + 8.0  # the realised epsilon per iteration, computed directly
    np.testing.assert_array_equal(summary["drd_eps_mean"], np.log(2 * n / (n + 1)).mean(-1))
    with pytest.raises(ValueError, match=r"voters must be in \[0, 30\]"):
        paaso.privacy_summary(cfg, 0.7, voters + 31)
    assert np.all(summary["drd_eps_advanced"] <= summary["drd_eps_basic"])
    np.testing.assert_allclose(summary["pram_eps_vote"], 2.79, atol=0.01)
    pso = paaso.privacy_summary(paaso.PAASOConfig(strategy="pso"), 0.7, voters)
    assert np.isinf(pso["drd_eps_basic"]).all()  # no DP claim for PSO


def test_all_voters_vote_with_pc_one_in_adrd():
    # the configuration (and so the compiled program) of the next test's drawn casts
    hyper = paaso.PAASOHyper(p_c=1.0)
    out = _run(paaso.PAASOConfig(strategy="adrd", iterations=60), hyper, runs=8)
    assert np.all(np.asarray(out["voters"]) == 50)


def test_vote_direction_binning():
    v = jnp.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.01], [0.0, -1.0], [1.0, -0.1]])
    np.testing.assert_array_equal(paaso._vote_directions(tuple(v.T), 4), [0, 1, 2, 3, 0])


def test_vote_binning_matches_atan2():
    """The diamond-angle bins are atan2's nearest direction, for several k_alpha."""
    v = jax.random.normal(jax.random.key(0), (2, 20_000))
    v = v.at[:, :3].set(jnp.array([[0.0, 1e-30, -1.0], [0.0, 0.0, -0.0]]))
    for k in (2, 3, 8, 16):
        bins = np.asarray(paaso._vote_directions(tuple(v), k))
        angle = np.arctan2(np.asarray(v[1], np.float64), np.asarray(v[0], np.float64))
        expected = np.mod(np.round(angle * k / (2 * np.pi)), k).astype(int)
        assert np.mean(bins == expected) > 1 - 1e-3  # only float rounding at the edges
        assert bins[0] == 0 and bins[1] == 0 and bins[2] == k // 2 % k


def test_dictator_draws_every_ballot_of_the_pool_once():
    """Exact, no sampling: the pool's n = voters + k positions give each direction its
    votes + 1 outcomes (the DRD law), whichever agents cast."""
    k = 8
    v = jax.random.normal(jax.random.key(2), (2, 50))
    votes = np.asarray(paaso._vote_directions(tuple(v), k))
    for cast in (np.arange(50) % 3 != 1, np.zeros(50, bool), np.ones(50, bool)):
        pool = int(cast.sum()) + k
        u = (jnp.arange(pool) + 0.5) / pool
        draw = jax.jit(jax.vmap(lambda x, c: paaso._dictator(x, c, k), in_axes=(0, None)))
        who, real, voters = draw(u, jnp.asarray(cast))  # one program per pool size
        who, real = np.asarray(who), np.asarray(real)
        assert np.all(np.asarray(voters) == cast.sum())
        assert np.all(cast[who[real]]) and len(set(who[real])) == real.sum() == cast.sum()
        outcome = np.where(real, votes[np.minimum(who, 49)], who)
        expected = np.bincount(votes[cast], minlength=k) + 1
        np.testing.assert_array_equal(np.bincount(outcome, minlength=k), expected)


@pytest.mark.parametrize(
    ("strategy", "k", "k_as_data"), [("bdrd", 8, False), ("pbdrd", 8, False), ("pbdrd", 5, True)]
)
def test_vote_has_the_mechanisms_law(strategy, k, k_as_data):
    """One iteration's vote, drawn 100,000 times with fixed agents, against the exact law
    (mechanisms.random_dictatorship_pram_probs; keep-probability 1 for bDRD), by chi-square:
    only agents better than pG cast, PbDRD masks the dictator's ballot only; ``k_alpha``
    static or given per call (its bin edges from a table)."""
    p, draws = 0.6, 100_000
    cfg = paaso.PAASOConfig(
        strategy=strategy,
        num_agents=12,
        iterations=1,
        draw_casts=False,
        k_alpha=None if k_as_data else k,
    )
    hyper = paaso.PAASOHyper(p_m=p, speed=1.0)
    state = paaso.init(jax.random.key(3), cfg)
    velocity = jax.random.normal(jax.random.key(4), (2, 12))
    best_loss = jnp.where(jnp.arange(12) % 4 == 0, 1e9, -1.0)  # 3 agents do not cast
    state = state.replace(
        agents=state.agents.replace(velocity=tuple(velocity), best_loss=best_loss)
    )
    rule = paaso._rule(cfg, None, np.int32(k) if k_as_data else None)
    u = jax.random.uniform(jax.random.key(5), (draws, 3))
    direction, voters = jax.jit(jax.vmap(lambda x: paaso._vote(cfg, hyper, rule, state, x)))(u)
    assert np.all(np.asarray(voters) == 9)
    angle = np.arctan2(np.asarray(direction[:, 1]), np.asarray(direction[:, 0]))
    outcome = np.mod(np.round(angle * k / (2 * np.pi)), k).astype(int)
    votes = paaso._vote_directions(tuple(velocity), k)
    keep = p if strategy == "pbdrd" else 1.0
    probs = np.asarray(mech.random_dictatorship_pram_probs(votes, best_loss < 0, k, keep), float)
    observed = np.bincount(outcome, minlength=k)
    assert stats.chisquare(observed, probs / probs.sum() * draws).pvalue > 1e-3


def test_p_c_one_without_cast_draws_is_the_same_mechanism():
    """draw_casts=False (p_c = 1 declared) draws no casting uniforms; every agent votes,
    as with the casts drawn at p_c = 1."""
    hyper = paaso.PAASOHyper(w=0.7, phi_p=1.4, phi_g=1.4, w_g=0.1, p_c=1.0)
    kw = {"strategy": "adrd", "iterations": 60}
    fast = _run(paaso.PAASOConfig(**kw, draw_casts=False), hyper, runs=8)
    drawn = _run(paaso.PAASOConfig(**kw), hyper, runs=8)
    assert np.all(np.asarray(fast["voters"]) == 50)
    assert np.all(np.asarray(drawn["voters"]) == 50)


def test_function_and_voting_strategy_as_data_run_the_same_swarms_as_static_ones():
    """One program for every function and voting strategy (``function=None``,
    ``strategy="voting"`` + indices) runs the static programs' swarms up to float rounding
    (XLA fuses the objective differently inside the switch): here PbDRD on f4 bit for bit
    at XLA's defaults (to 1e-6 under the suite's legacy fusion emitters, tests/conftest.py),
    aDRD on f7 (exp, cos) within 1e-4.  Over 1000 iterations rounding differences do
    appear on f4 too (FL at the Fig. 4 setting: from iteration ~880 in 19 of 20 runs)."""
    hyper = paaso.PAASOHyper(w=0.4, phi_p=1.0, phi_g=1.0, w_g=0.1, p_m=0.8)
    kw = {"iterations": 30, "num_agents": 10, "draw_casts": False}
    keys = jax.vmap(jax.random.key)(jnp.arange(4))
    cfg = paaso.PAASOConfig(**kw, strategy="voting", function=None)
    run_any = jax.jit(
        jax.vmap(lambda k, h, f, v: paaso.run(k, cfg, h, f, v), in_axes=(0, None, None, None))
    )
    for strategy, name in (("pbdrd", "f4"), ("adrd", "f7")):
        static = _run(paaso.PAASOConfig(**kw, strategy=strategy, function=name), hyper, runs=4)
        data = run_any(keys, hyper, paaso.FUNCTIONS.index(name), paaso.VOTING.index(strategy))
        chex.assert_trees_all_equal_shapes(static, data)
        for k, v in static.items():
            if name == "f4" and not np.issubdtype(np.asarray(v).dtype, np.floating):
                np.testing.assert_array_equal(data[k], v, err_msg=k)  # the same choices
            elif name == "f4":  # bitwise at XLA's defaults; the suite's emitters round apart
                np.testing.assert_allclose(data[k], v, rtol=1e-6, atol=0, err_msg=k)
            else:
                np.testing.assert_allclose(data[k], v, rtol=1e-4, atol=1e-4, err_msg=k)


def test_k_alpha_as_data_runs_the_same_swarms_as_static_ones():
    """``PAASOConfig(k_alpha=None)`` with ``k_alpha`` per run (batched here) runs the static
    programs' swarms bit for bit: the table holds the same float32 bin edges."""
    hyper = paaso.PAASOHyper(w=0.4, phi_p=1.0, phi_g=1.0, w_g=0.1, p_c=0.7, p_m=0.8)
    kw = {"strategy": "pbdrd", "iterations": 40, "num_agents": 10}
    ks = np.asarray([2, 3, 16, 64], np.int32)
    data_cfg = paaso.PAASOConfig(**kw, k_alpha=None)
    keys = jax.vmap(jax.random.key)(jnp.zeros(len(ks), jnp.int32))
    by_k = jax.vmap(lambda key, h, k: paaso.run(key, data_cfg, h, k_alpha=k), in_axes=(0, None, 0))
    data = jax.jit(by_k)(keys, hyper, ks)
    for i, k in enumerate(ks):
        static = _run(paaso.PAASOConfig(**kw, k_alpha=int(k)), hyper, runs=1)
        for name, v in static.items():
            np.testing.assert_array_equal(data[name][i], v[0], err_msg=f"{name}, k {k}")


@pytest.mark.parametrize(
    ("config", "call", "match"),
    [
        ({"function": None}, {}, "needs function="),
        ({}, {"function": 3}, "not both"),
        ({"function": None}, {"function": 8}, r"function must be an integer index in \[0, 8\)"),
        ({"function": None}, {"function": 1.0}, "function must be an integer index"),
        ({"strategy": "voting"}, {}, "needs voting="),
        ({"strategy": "voting"}, {"voting": 3}, r"voting must be an integer index in \[0, 3\)"),
        ({"strategy": "bdrd"}, {"voting": 1}, "only with strategy='voting'"),
        ({"strategy": "bdrd", "k_alpha": None}, {}, "needs k_alpha="),
        ({"strategy": "bdrd"}, {"k_alpha": 8}, "k_alpha: give it in PAASOConfig"),
        (
            {"strategy": "bdrd", "k_alpha": None},
            {"k_alpha": 65},
            r"k_alpha must be an integer in \[2, 64\]",
        ),
    ],
)
def test_function_voting_and_k_alpha_as_data_are_checked_before_work(config, call, match):
    cfg = paaso.PAASOConfig(**{"strategy": "pso", **config, "iterations": 5})
    with pytest.raises(ValueError, match=match):
        paaso.run(jax.random.key(0), cfg, PSO, **call)


def test_config_without_its_function_or_strategy_refuses_what_needs_them():
    with pytest.raises(ValueError, match="function is None"):
        _ = paaso.PAASOConfig(function=None).objective
    with pytest.raises(ValueError, match="strategy"):
        paaso.privacy_summary(paaso.PAASOConfig(strategy="voting"), 0.9, np.zeros((2, 5)))


def test_positions_stay_in_domain_with_divergent_inertia():
    """The paper's Fig. 1 uses w = 4, which diverges without the clamps (20 runs: the
    program of test_cognitive_fl_rule_is_available_and_differs's direction rule)."""
    hyper = paaso.PAASOHyper(w=4.0, phi_p=2.0, phi_g=2.0, w_g=0.005)
    out = _run(paaso.PAASOConfig(strategy="fl", iterations=100), hyper)
    pos = np.asarray(out["final_position"])
    assert np.all(np.isfinite(pos)) and np.all(np.abs(pos) <= 2.0)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"strategy": "gossip"}, "strategy"),
        ({"function": "f42"}, "function"),
        ({"k_alpha": 1, "strategy": "adrd"}, "k_alpha"),
        ({"num_agents": 0}, "num_agents"),
        ({"dim": 3, "strategy": "bdrd"}, "dim"),
        ({"fl_rule": "sideways"}, "fl_rule"),
    ],
)
def test_invalid_config_names_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        paaso.PAASOConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"p_m": 1.2}, "p_m"),
        ({"p_c": -0.1}, "p_c"),
        ({"w_g": -1.0}, "w_g"),
        ({"phi_p": -2.0}, "phi_p"),
        ({"speed": -1.0}, "speed"),
    ],
)
def test_invalid_hyper_names_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        paaso.PAASOHyper(**kwargs).validate()
