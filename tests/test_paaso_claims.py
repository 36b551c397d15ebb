"""The PAASO paper's findings that hold under the default ("stable") reading, and the
decision rules of ``experiments/_paaso_claims.py`` (claims.csv)."""

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from experiments._paaso_claims import (
    F5_CLAIM,
    _summary_claims,
    converge_iteration,
    kruskal_p,
    less_p,
)
from experiments.paaso import FIG4, fig2_setting, parse_args
from swarmjax import paaso

RUNS = 20
P_M = (0.6, 0.7, 0.8, 0.9, 1.0)


def _hyper(setting: dict, reading: str = "stable", **numeric) -> paaso.PAASOHyper:
    values = {k: v for k, v in setting.items() if k != "phi"}
    values.update(phi_p=setting["phi"], phi_g=setting["phi"], **paaso.READINGS[reading])
    values.update(numeric)
    return paaso.PAASOHyper(**values)


def _objective(
    cfg: paaso.PAASOConfig, hyper: paaso.PAASOHyper, configs: int = 1, runs: int = RUNS
) -> np.ndarray:
    """``(configs, runs, T)``; every leaf of ``hyper`` is a scalar or a ``(configs,)`` array."""
    keys = jax.vmap(jax.random.key)(jnp.arange(runs))
    hyper = jax.tree.map(lambda x: jnp.broadcast_to(jnp.asarray(x, jnp.float32), configs), hyper)

    def over_seeds(h):
        return jax.vmap(lambda key: paaso.run(key, cfg, h)["objective"])(keys)

    return np.asarray(jax.jit(jax.vmap(over_seeds))(hyper))


@pytest.fixture(scope="module")
def pbdrd_fig2():
    """PbDRD at the Fig. 2-3 setting for every p_m: ``(5, 20, 1000)`` (one compile); p_c = 1
    declared (``draw_casts=False``), as the experiment's sweep task runs it."""
    cfg = paaso.PAASOConfig(strategy="pbdrd", function="f4", iterations=1000, draw_casts=False)
    setting = fig2_setting("stable")
    return _objective(cfg, _hyper({**setting, "p_m": jnp.array(P_M)}), configs=len(P_M))


def test_pbdrd_converges_by_500_iterations(pbdrd_fig2):
    """Figs. 1-2: the most private strategy still converges by 500 iterations (mean f < 1)."""
    assert converge_iteration(pbdrd_fig2[P_M.index(0.9)]) <= 500


def test_pram_keep_probability_has_little_effect(pbdrd_fig2):
    """Fig. 3: every p_m in 0.6-1.0 converges, and the final f(pG) differs little across
    them (the paper: a little slower early under stronger masking).

    "Converges" and "little" by the median over runs (the final f is heavy-tailed): every
    median below 1 and within 0.5 of each other.  Not "no detectable effect": with 100
    runs per p_m, Kruskal-Wallis finds one (p ~ 1e-5 to 1e-7, before and after issue 16
    changed which draws the mechanism consumes; medians 0.36 at p_m 0.6 to 0.12 at 1.0),
    and with 20 runs its p-value fell anywhere from 0.003 to 0.11 with the draws."""
    median = np.median(pbdrd_fig2[:, :, -1], axis=1)
    assert np.all(median < 1.0)
    assert median.max() - median.min() < 0.5


def test_fl_is_worse_than_bdrd_at_the_fig4_setting():
    """Fig. 4 (w 0.005, phi 2, wG 0.01): FL's f(pG) after 1000 iterations is larger than
    bDRD's and FL rarely converges."""
    final = {}
    for strategy in ("fl", "bdrd"):
        cfg = paaso.PAASOConfig(strategy=strategy, function="f4", iterations=1000)
        final[strategy] = _objective(cfg, _hyper(FIG4))[0, :, -1]
    assert less_p(final["bdrd"], final["fl"]) < 0.05
    assert np.mean(final["fl"] < 1.0) <= 0.2


def test_converge_iteration():
    objective = np.array([[5.0, 2.0, 0.5, 0.1], [3.0, 1.0, 0.9, 0.1]])  # means 4, 1.5, .7, .1
    assert converge_iteration(objective) == 3
    assert converge_iteration(objective, threshold=0.05) == np.inf


def test_kruskal_and_mann_whitney_decide_on_shifted_samples():
    rng = np.random.default_rng(0)
    same = [rng.normal(size=40) for _ in range(4)]
    assert kruskal_p(same) > 0.05
    assert kruskal_p([np.ones(5), np.ones(5)]) == 1.0  # all equal: no evidence of an effect
    assert kruskal_p([*same, rng.normal(size=40) + 2.0]) < 1e-3
    assert less_p(same[0] - 2.0, same[1]) < 1e-3
    assert less_p(same[0] + 2.0, same[1]) > 0.5


def test_readings_are_named_options():
    assert fig2_setting("stable")["w"] == 0.4 and fig2_setting("spec")["w"] == 4.0
    assert paaso.READINGS["spec"] == {"vmax_factor": 1.0, "speed": 1.0}
    assert parse_args([]).reading == "stable"
    with pytest.raises(SystemExit):
        parse_args(["--reading", "loose"])


def test_summary_claims_read_the_search_table():
    """f5 unsolved by the private strategies, per-function configurations, convergence."""
    rows = []
    for function, optimum in (("f1", 0.0), ("f5", -837.9658)):
        for i, strategy in enumerate(paaso.STRATEGIES):
            final = optimum + (0.0 if strategy == "pso" else 0.5 if function == "f1" else 600.0)
            config = {"w": 0.4 if function == "f1" else 0.005, "phi_p": 1.0 + i, "w_g": 0.01}
            rows.append(
                {
                    "function": function,
                    "strategy": strategy,
                    "final_mean": final,
                    "optimum": optimum,
                    "speed": 1.0,
                    **config,
                }
            )
    claims = {c["finding"]: c["holds"] for c in _summary_claims(pd.DataFrame(rows))}
    assert claims == {
        "f5 unsolved by every privacy-aware strategy (best -7.9; PSO -837)": "yes",
        "privacy slows convergence but does not prevent it (f5 aside)": "yes",
        "the best (w, phi, wG) differs per function and strategy": "yes",
    }


def test_fl_unit_step_moves_the_centre_by_the_voted_step():
    """``fl_step="unit"``: pG moves exactly ``wG * speed`` per iteration (away from walls)."""
    cfg = paaso.PAASOConfig(strategy="fl", function="f1", iterations=1, fl_step="unit")
    hyper = paaso.PAASOHyper(w=0.4, phi_p=2.0, phi_g=2.0, w_g=0.005, speed=5.0, vmax_factor=0.1)
    state = paaso.init(jax.random.key(3), cfg)
    moved, _ = jax.jit(lambda s: paaso.step(s, cfg, hyper))(state)
    np.testing.assert_allclose(np.linalg.norm(moved.center - state.center), 0.025, rtol=1e-4)
    with pytest.raises(ValueError, match="fl_step"):
        paaso.PAASOConfig(strategy="fl", fl_step="sum")


def test_claims_a_short_run_cannot_test_are_na_with_the_reason():
    """A --quick run (f4 only, 100 iterations) says n/a and why, never "no"."""
    rows = [
        {"function": "f4", "strategy": s, "final_mean": 5.0, "optimum": 0.0, "speed": 1.0,
         "w": 0.4, "phi_p": 2.0, "w_g": 0.01}
        for s in paaso.STRATEGIES
    ]  # fmt: skip
    claims = {c["finding"]: c["holds"] for c in _summary_claims(pd.DataFrame(rows), 100)}
    assert all(v.startswith("n/a (") for v in claims.values()), claims
    assert (
        "100 iterations" in claims["privacy slows convergence but does not prevent it (f5 aside)"]
    )
    assert "does not search f5" in claims[F5_CLAIM]
