"""The ledger's side of secret randomness and of readable statements (issue 45, issue 50):
releases that drew the same noise are refused, a supplied secret conditions the composed
statement, floating-point caveats and snapping tails are carried, releases are composed per
data source, a short statement is given beside the full one, and an experiment like
``cross_device --quick`` with two DP algorithms at epsilon 2 and 8 over two seeds states a
finite composed epsilon."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import dp_accounting
import numpy as np
import pandas as pd
import pytest

from swarmjax.privacy import accounting as acc
from swarmjax.privacy.ledger import JSON_NAME, MARKDOWN_NAME, Ledger, Release, _round_up_delta
from swarmjax.privacy.plan import RELATIONS, PrivacyPlan, default_delta

DELTA = 1e-5
CLIENT = RELATIONS["client"]
GENERATOR = "ChaCha20 (RFC 8439), 256-bit keys"
EVENT = acc.poisson_gaussian_event(0.1, 1.2, 20)
SNAPPED = "snapped: noised values snapped to a power-of-two grid (test caveat)"
FLOAT = "float: plain float32 noise (test caveat)"


def fp(n: int) -> str:
    """A 32-hex-digit fingerprint."""
    return f"{n:032x}"


def randomness(n: int | None, secret: str = "entropy") -> dict:
    out = {"generator": GENERATOR, "secret": secret, "common_random_numbers": False}
    return out if n is None else {**out, "fingerprint": fp(n)}


def release(*, seed=0, unit="client", key=None, secret="entropy", **kw) -> Release:
    args = dict(
        algorithm="dp_fedavg",
        variant={"epsilon_target": 2.0},
        seed=seed,
        unit=unit,
        relation=CLIENT if unit else None,
        delta=DELTA,
        epsilon=1.0 if unit else math.inf,
        accountant="pld",
        path=f"runs/{seed}.csv",
        groups=((None, EVENT, 0.0),) if unit else (),
        randomness=randomness(seed if key is None else key, secret),
    )
    args.update(kw)
    return Release(**args)


# ------------------------------------------------------------------- same noise refused


def test_two_releases_with_one_key_are_refused_in_one_line(tmp_path):
    ledger = Ledger(tmp_path, "exp")
    ledger.add(release(seed=0, key=7))
    ledger.add(release(seed=1, key=8))
    with pytest.raises(ValueError) as err:
        ledger.add(release(seed=2, key=7, data=None, path="audited.csv"))
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith("releases 0 (dp_fedavg, seed 0, runs/0.csv) and 2 (dp_fedavg, ")
    assert "drew the same noise" in text and fp(7) in text
    assert len(ledger.releases) == 2  # nothing added
    # a private release and a non-private one with its key: its draws reveal the cohorts
    with pytest.raises(ValueError, match=r"releases 1 .* and 2 .* drew the same noise"):
        ledger.add(release(seed=5, key=8, unit=None))
    # two non-private runs may share a key: neither has noise to subtract
    plain = Ledger(tmp_path / "plain", "exp")
    plain.add(release(seed=0, key=3, unit=None))
    plain.add(release(seed=1, key=3, unit=None))


@dataclass
class Record:
    """The attributes of ``PrivacyRecord`` the ledger reads, with randomness and keys."""

    unit: str | None
    relation: str | None
    delta: float
    accountant: str
    shares_randomness: bool
    final_epsilon: np.ndarray
    randomness: dict | None = None
    key_fingerprints: tuple[str, ...] = ()
    floating_point: str | None = None
    events: list = field(default_factory=list)

    def run_events(self, run):
        return [(None, EVENT, 0.0)]


@dataclass
class Result:
    privacy: Record
    runs: pd.DataFrame


def result(prints, *, secret="entropy", crn=False, caveat=FLOAT) -> Result:
    runs = len(prints)
    described = {
        "generator": GENERATOR,
        "secret": secret,
        "common_random_numbers": crn,
        "condition": "holds only while it is kept" if secret == "supplied" else None,
    }
    record = Record(
        "client",
        CLIENT,
        DELTA,
        "pld",
        crn,
        np.full((runs, 3), 1.5),
        described,
        tuple(fp(p) for p in prints),
        caveat,
    )
    labels = pd.DataFrame({"epsilon_target": [2.0] * runs, "seed": list(range(runs))})
    return Result(record, labels)


def test_a_result_gives_each_run_its_fingerprint_and_common_random_numbers_are_refused(
    tmp_path,
):
    ledger = Ledger(tmp_path, "exp")
    assert ledger.add_result(result([1, 2]), algorithm="a", path="a.csv", data="mnist") == [0, 1]
    first = ledger.releases[0]
    assert first.fingerprint == fp(1) and ledger.releases[1].fingerprint == fp(2)
    assert first.randomness["generator"] == GENERATOR and first.secret == "entropy"
    assert first.floating_point == FLOAT and first.data == "mnist"
    # common random numbers: two variants of one seed drew from one key -> refused, and
    # none of the call's runs is added
    with pytest.raises(ValueError, match=r"releases 2 .* and 3 .* drew the same noise"):
        ledger.add_result(result([5, 5], crn=True), algorithm="b", path="b.csv", data="mnist")
    assert len(ledger.releases) == 2
    # the same call's releases listed twice: the second copy is refused too
    with pytest.raises(ValueError, match="drew the same noise"):
        ledger.add_result(result([1, 2]), algorithm="a", path="a.csv", data="mnist")


def test_records_without_keys_keep_the_shared_tag(tmp_path):
    res = result([], crn=True)
    res.privacy.key_fingerprints = ()
    res.runs = pd.DataFrame({"epsilon_target": [2.0, 8.0], "seed": [0, 0]})
    res.privacy.final_epsilon = np.full((2, 3), 1.5)
    ledger = Ledger(tmp_path, "exp")
    ledger.add_result(res, algorithm="a", path="a.csv")
    assert ledger.releases[0].shared_tag == "crn:a@a.csv" == ledger.releases[1].shared_tag
    comp = ledger.composed()["client"]
    assert math.isinf(comp.epsilon) and "common random numbers" in comp.reason


# ------------------------------------------------------------- which randomness is secret


def test_a_supplied_secret_conditions_the_statement(tmp_path):
    ledger = Ledger(tmp_path, "exp")
    ledger.add_result(result([1, 2], secret="supplied"), algorithm="a", path="a.csv")
    ledger.add(release(seed=9, key=9))
    comp = ledger.composed()["client"]
    assert comp.supplied == (0, 1)
    assert comp.short_statement().endswith(", while the supplied secret is kept")
    text = comp.statement("exp", "ledger.json")
    assert "holds only while the supplied secret is kept: releases [0, 1]" in text
    assert f"drawn by {GENERATOR}" in text
    assert "keyed by operating-system entropy that no one holds (releases [2])" in text
    assert "keyed by a supplied secret (releases [0, 1])" in text
    data = json.loads(ledger.write().read_text())["composed"]["client"]
    assert data["randomness"] == {
        "generator": GENERATOR,
        "entropy": [2],
        "supplied": [0, 1],
        "unstated": [],
    }
    # entropy only: no condition
    fresh = Ledger(tmp_path / "fresh", "exp")
    fresh.add(release(seed=0))
    fresh_comp = fresh.composed()["client"]
    assert not fresh_comp.supplied
    assert "supplied" not in fresh_comp.statement("exp", "f")


def test_bad_randomness_is_refused():
    with pytest.raises(ValueError, match="release randomness secret"):
        release(randomness={"secret": "seed"})
    with pytest.raises(ValueError, match="fingerprint must be 32 lower-case hex digits"):
        release(randomness={"fingerprint": "xyz"})
    with pytest.raises(ValueError, match="release randomness must be a dict"):
        release(randomness=3)
    with pytest.raises(ValueError, match="release data must be a non-empty string"):
        release(data="")


# --------------------------------------------------------------------- floating point


def test_floating_point_caveats_are_carried_into_the_composed_statement(tmp_path):
    ledger = Ledger(tmp_path, "exp")
    ledger.add(release(seed=0, floating_point=FLOAT))
    ledger.add(release(seed=1, floating_point=SNAPPED, snapping_tail=1e-9))
    ledger.add(release(seed=2, floating_point=SNAPPED))  # snapped, no tail count stated
    comp = ledger.composed()["client"]
    text = comp.statement("exp", "f")
    assert f"Floating point (releases [0]): {FLOAT}." in text
    assert f"Floating point (releases [1, 2]): {SNAPPED}." in text
    assert "tails (1e-09 in total) are charged to delta" in text
    assert "Releases [2] are snapped but state no sampler tail count" in text
    # the stated tail is charged like an overflow: P (1 + e^eps) out of delta
    events = dp_accounting.ComposedDpEvent([EVENT] * 3)
    assert comp.epsilon == pytest.approx(acc.event_epsilon(events, DELTA, overflow=1e-9))
    assert comp.epsilon > acc.event_epsilon(events, DELTA)
    data = json.loads(ledger.write().read_text())
    assert data["composed"]["client"]["floating_point"] == [
        {"caveat": FLOAT, "releases": [0]},
        {"caveat": SNAPPED, "releases": [1, 2]},
    ]
    again = Ledger.load(tmp_path)
    assert again.releases == ledger.releases
    assert again.composed()["client"].epsilon == pytest.approx(comp.epsilon, rel=1e-12)


# ------------------------------------------------------------------ per data source


def test_releases_on_different_data_are_composed_separately(tmp_path):
    ledger = Ledger(tmp_path, "exp")
    for seed in range(3):
        ledger.add(release(seed=seed, data="mnist"))
    ledger.add(release(seed=3, data="shakespeare"))
    got = ledger.composed()
    assert set(got) == {"client:mnist", "client:shakespeare"}
    assert got["client:mnist"].releases == (0, 1, 2) and got["client:mnist"].data == "mnist"
    alone = Ledger(tmp_path / "alone", "exp")
    for seed in range(3):
        alone.add(release(seed=seed, data="mnist"))
    assert set(alone.composed()) == {"client"}  # one data source: the unit's key
    assert got["client:mnist"].epsilon == pytest.approx(alone.composed()["client"].epsilon)
    one = acc.event_epsilon(EVENT, DELTA)
    assert got["client:shakespeare"].epsilon == pytest.approx(one)
    assert "on data 'shakespeare'" in got["client:shakespeare"].statement("exp", "f")
    assert got["client:mnist"].short_statement().startswith("(")
    assert " on mnist, PLD accountant" in got["client:mnist"].short_statement()
    # a private selection is charged to its candidates' data source only, and must not mix
    ledger.select("best", [0, 1], score="private", event=dp_accounting.LaplaceDpEvent(1.0))
    after = ledger.composed()
    assert after["client:mnist"].selections == ("best",)
    assert after["client:shakespeare"].epsilon == pytest.approx(one)
    with pytest.raises(ValueError, match="releases on one data source"):
        ledger.select("mixed", [0, 3], score="private", event=dp_accounting.LaplaceDpEvent(1.0))
    # the file keeps the data and recomputes the same compositions
    ledger.write()
    loaded = Ledger.load(tmp_path)
    assert [r.data for r in loaded.releases] == ["mnist"] * 3 + ["shakespeare"]
    assert loaded.selections[0].data == "mnist"
    for key, comp in loaded.composed().items():
        assert comp.epsilon == pytest.approx(after[key].epsilon, rel=1e-12)


def test_named_and_unnamed_data_do_not_mix_in_a_unit(tmp_path):
    ledger = Ledger(tmp_path, "exp")
    ledger.add(release(seed=0, data="mnist"))
    with pytest.raises(ValueError, match="name the private dataset of every client-level"):
        ledger.add(release(seed=1))
    ledger.add(release(seed=1, unit="record", relation=RELATIONS["record"]))  # other unit


def test_an_old_release_without_the_new_fields_still_loads():
    old = release(seed=0).to_dict()
    for key in ("data", "floating_point", "snapping_tail"):
        del old[key]
    old["randomness"] = "crn:dp_fedavg@runs.csv"
    back = Release.from_dict(json.loads(json.dumps(old)))
    assert back.shared_tag == "crn:dp_fedavg@runs.csv" and back.fingerprint is None
    assert back.data is None and back.floating_point is None and back.snapping_tail is None


# ----------------------------------------------------------------- the short statement


def test_short_statement_rounds_for_reading(tmp_path):
    delta = 6.958942240779402e-05
    assert _round_up_delta(delta) == "6.96e-05"
    assert _round_up_delta(1e-05) == "1e-05" and _round_up_delta(1.234e-05) == "1.24e-05"
    ledger = Ledger(tmp_path, "exp")
    ledger.add(release(seed=0, delta=delta))
    comp = ledger.composed()["client"]
    eps = comp.epsilon
    shown = f"{math.ceil(eps * 100) / 100:.2f}"
    short = comp.short_statement()
    assert short == f"({shown}, 6.96e-05)-DP, client-level zero-out, PLD accountant"
    assert len(short) < 80
    ledger.write()
    data = json.loads((tmp_path / JSON_NAME).read_text())["composed"]["client"]
    assert data["short_statement"] == short and data["delta"] == delta  # exact in the file
    assert data["statement"].startswith(short + ": all 1 client-level DP releases")
    assert "6.958942240779402e-05" not in data["statement"]
    assert short in (tmp_path / MARKDOWN_NAME).read_text()


# ------------------------------------------------- a finite composed epsilon (finding 6)


CLIENTS, COHORT, ROUNDS = 100, 10, 3  # cross_device --quick


def _cross_device_like(tmp_path, composed_epsilon=None) -> tuple[Ledger, list[int]]:
    """DP-FedAvg (Poisson cohorts in a sized buffer) and DP-FTRL (min-separation
    cohorts) at targets 2 and 8, two seeds each, as cross_device --quick builds them, at
    the default delta; ``composed_epsilon``: size each buffer for that composed epsilon
    (``None``: the plan's default)."""
    delta = default_delta(CLIENTS)
    ledger = Ledger(tmp_path, "cross_device", delta=delta)
    capacities = []
    for target in (2.0, 8.0):
        plan = PrivacyPlan("client", CLIENTS, COHORT / CLIENTS, ROUNDS, delta)
        sized = plan.sized(target, composed_epsilon=composed_epsilon or 64.0)
        capacities.append(sized.capacity)
        fedavg = sized.calibrate(target, rtol=1e-2)
        ftrl = PrivacyPlan.min_separation_cohorts(
            "client", CLIENTS, COHORT, ROUNDS, ROUNDS, 1, delta
        ).calibrate(target, rtol=1e-2)
        for seed in (0, 1):
            for name, p in (("dp-fedavg", fedavg), ("dp-ftrl", ftrl)):
                ledger.add(
                    release(
                        seed=seed,
                        key=len(ledger.releases),
                        algorithm=name,
                        variant={"epsilon_target": target},
                        delta=delta,
                        epsilon=p.epsilon(),
                        groups=((None, p.event, p.overflow),),
                    )
                )
    return ledger, capacities


def test_cross_device_quick_like_experiment_states_a_finite_epsilon(tmp_path):
    ledger, capacities = _cross_device_like(tmp_path)
    assert default_delta(CLIENTS) == 1e-5
    comp = ledger.composed()["client"]
    assert len(comp.releases) == 8
    assert math.isfinite(comp.epsilon) and comp.reason is None
    assert 8.0 < comp.epsilon < 20.0  # 16.2 (PLD)
    # the overflow charge is negligible: the same events without it give the same epsilon
    events = [g[1] for r in ledger.releases for g in r.groups]
    plain = acc.event_epsilon(dp_accounting.ComposedDpEvent(events), comp.delta)
    assert comp.epsilon == pytest.approx(plain, rel=1e-6)
    assert capacities == [62, 62]  # expected cohort 10
    # buffers sized for each run's own target (the old rule) leave no delta for the total
    old, old_caps = _cross_device_like(tmp_path / "old", composed_epsilon=1e-9)
    assert old_caps == [33, 36]
    got = old.composed()["client"]
    assert math.isinf(got.epsilon) and "overflow" in got.reason
