"""benchmarks.secagg end to end at a tiny size (a 1,210-parameter MLP on random 8x8 images
in place of MNIST's simple_cnn): both central baselines, the secret Poisson cohort and the
distributed runs' public cohort, beside one distributed run; the rows it prints, the noise
on one scale and the table against each baseline. Its refusals are in
tests/test_bad_input.py."""

from __future__ import annotations

import ast
import math

import numpy as np
import pytest

from benchmarks import secagg
from swarmjax.fl.data import ClientStore
from swarmjax.models import mlp

USERS, COHORT = 20, 5


def _tiny_work(data_dir, source, users):
    del data_dir, source
    rng = np.random.default_rng(0)
    x, y = rng.random((10 * users, 8, 8, 1), np.float32), rng.integers(0, 10, 10 * users)
    store = ClientStore.build(x, y, np.array_split(np.arange(10 * users), users))
    test = (x[:100], y[:100])
    return secagg.Work("mnist", mlp((16,), 10, (8, 8, 1)), store, test, test, 0.1, 0.4)


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(secagg, "mnist_work", _tiny_work)


def _rows(out: str) -> dict[str, dict]:
    rows = [ast.literal_eval(line) for line in out.splitlines() if line.startswith("{")]
    return {(r["algorithm"], r["bits"]): r for r in rows}


def test_the_public_baseline_takes_the_distributed_runs_schedule(tiny):
    work = _tiny_work(None, None, USERS)
    public, distributed = (
        secagg._build(name, work, COHORT, 8, 8.0, options)[0]
        for _, name, options in (secagg.CENTRAL["public"], (0, secagg.DISTRIBUTED, {"bits": 16}))
    )
    assert public.plan.participation == distributed.plan.participation  # b, k, kind, seed
    assert public.plan.participation.min_separation == USERS // COHORT
    assert public.plan.participation.max_participations == 2  # 8 rounds, b = 4
    assert public.plan.noise.factorization == "prefix-sum"  # C = I: independent noise
    poisson = secagg._build("dp-fedavg", work, COHORT, 8, 8.0, {})[0]
    assert secagg.participations(poisson) is None


def test_secagg_prints_both_baselines_and_each_distributed_row_against_them(tiny, capsys, tmp_path):
    argv = ["--users", str(USERS), "--cohort", str(COHORT), "--rounds", "1", "--bits", "16"]
    secagg.main([*argv, "--data-dir", str(tmp_path)])
    out = capsys.readouterr().out
    rows = _rows(out)
    poisson = rows[("dp-fedavg (secret Poisson)", None)]
    public = rows[("dp-fedavg (public cohort)", None)]
    dist = rows[("dp-fedavg-secagg", 16)]
    for r in (poisson, public, dist):
        assert r["epsilon"] == pytest.approx(8.0, abs=0.05)
        assert 0.0 <= r["test_accuracy"] <= 1.0
    assert poisson["participations"] is None
    assert public["participations"] == dist["participations"] == 1  # 2 rounds, b = 2
    # one participation: the public cohort's whole-run multiplier is its per-round one
    assert public["noise_std_per_round"] == pytest.approx(public["noise_multiplier"])
    # same participation, same budget: the Skellam event costs what the Gaussian does
    assert dist["noise_multiplier"] == pytest.approx(public["noise_multiplier"], rel=0.1)
    # every client's share is added, only h = ceil(0.8 m) = 4 of 5 honest ones are counted
    assert dist["noise_std_per_round"] >= dist["noise_multiplier"] * math.sqrt(5 / 4) * 0.999
    # 16 of 32 bits, over the 1,210 parameters rotated in d = 1,215 (DCT: zero-padded)
    ratio = dist["bytes_up_per_client"] / public["bytes_up_per_client"]
    assert ratio == pytest.approx(0.5 * 1215 / 1210, 1e-3)
    for name in ("dp-fedavg (secret Poisson)", "dp-fedavg (public cohort)"):
        assert f"|     16 | {name}" in out  # the table against each baseline
    gap = 100 * (dist["test_accuracy"] - public["test_accuracy"])
    assert f"{gap:.4g}" in out


def test_secagg_runs_one_baseline_when_asked(tiny, capsys, tmp_path):
    argv = ["--users", str(USERS), "--cohort", str(COHORT), "--rounds", "1", "--bits", "16"]
    secagg.main([*argv, "--central", "public", "--data-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert set(_rows(out)) == {("dp-fedavg (public cohort)", None), ("dp-fedavg-secagg", 16)}
    assert "secret Poisson" not in out


def test_secagg_stages_times_every_stage_at_a_tiny_size(capsys):
    """benchmarks.secagg_stages at d = 300, a cohort of 5: one line per stage."""
    from benchmarks import secagg_stages

    secagg_stages.main(["--d", "300", "--cohort", "5", "--lam", "50", "--repeats", "1"])
    out = capsys.readouterr().out
    medians = {}
    for line in out.splitlines():
        if " median " in line:
            name, rest = line.split(" median ", 1)
            medians[name.strip()] = float(rest.split()[0])
    summed = ("rotate", "round", "skellam", "to_residues", "secure_sum", "decode")
    assert set(medians) == {*summed, "masks alone", "unmask alone", "bits (for scale)"}
    # the round adds the stages the simulator runs; the halves of secure_sum are not added
    total = float(out.split("median-sum")[1].split()[0])
    assert total == pytest.approx(sum(medians[k] for k in summed), abs=5e-3)


def test_secagg_over_seeds_compares_means_with_welch_intervals(tiny, capsys, tmp_path):
    """``--seed 0 1 2``: every run once per seed, per-seed pairs only within a seed, and
    each run's mean over its seeds against the central one's with Welch's interval."""
    argv = ["--users", str(USERS), "--cohort", str(COHORT), "--rounds", "1", "--bits", "16"]
    secagg.main([*argv, "--central", "public", "--seed", "0", "1", "2"])
    out = capsys.readouterr().out
    rows = [ast.literal_eval(line) for line in out.splitlines() if line.startswith("{")]
    assert [(r["seed"], r["bits"]) for r in rows] == [(s, b) for s in (0, 1, 2) for b in (None, 16)]
    assert len(secagg.against_central(rows)) == 3  # one pair per seed, never across seeds
    means = {(r["algorithm"], r["bits"]): r for r in secagg.over_seeds(rows)}
    dist = [100 * r["test_accuracy"] for r in rows if r["bits"] == 16]
    cent = [100 * r["test_accuracy"] for r in rows if r["bits"] is None]
    assert means[("dp-fedavg-secagg", 16)]["runs"] == 3
    assert means[("dp-fedavg-secagg", 16)]["accuracy_mean_pct"] == pytest.approx(np.mean(dist))
    (vs,) = secagg.against_central_over_seeds(rows)
    assert vs["runs"] == "3 vs 3"
    assert vs["mean_accuracy_points"] == pytest.approx(np.mean(dist) - np.mean(cent))
    assert "accuracy_mean_pct" in out and "interval_95_low" in out  # the two tables


@pytest.mark.parametrize(
    "a, b", [([1.0, 2.0, 4.0, 3.5], [0.5, 0.7, 2.0]), ([86.1, 85.8, 87.2], [86.4, 85.0])]
)
def test_mean_difference_is_welchs_interval(a, b):
    from scipy import stats

    diff, low, high = secagg.mean_difference(a, b)
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert diff == pytest.approx(np.mean(a) - np.mean(b))
    assert (low, high) == pytest.approx((ci.low, ci.high))
    assert all(map(math.isnan, secagg.mean_difference([1.0], [2.0, 3.0])[1:]))


def test_shakespeare_work_takes_the_lstm_widths(data_dir):
    if not (data_dir / "shakespeare").is_dir():
        pytest.skip(f"no shakespeare/ in {data_dir}: the plays are not staged")
    import jax

    work = secagg.shakespeare_work(data_dir, 20, (16,))
    params = work.model.init(jax.random.key(0))
    # embedding 80 x 8, one LSTM layer (4 gates over 8 inputs + 16 state + bias), the head
    assert sum(a.size for a in jax.tree.leaves(params)) == 80 * 8 + 4 * 16 * (8 + 16 + 1) + 17 * 80
    assert work.store.num_clients == 20
