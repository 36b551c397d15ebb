"""Privacy ledger: composition against dp-accounting itself, per-client composition, shared
randomness, non-DP releases, selections, bad input, and the file round trip."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import dp_accounting
import numpy as np
import pandas as pd
import pytest
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant

from swarmjax.privacy import accounting as acc
from swarmjax.privacy import ledger as ledger_mod
from swarmjax.privacy.ledger import JSON_NAME, MARKDOWN_NAME, Ledger, Release

DELTA = 1e-5
RECORD = "record-level, zero-out (test relation)"
CLIENT = "client-level, zero-out (test relation)"


def ev(q: float, sigma: float, steps: int) -> dp_accounting.DpEvent:
    return acc.poisson_gaussian_event(q, sigma, steps)


SMALL, BIG, OTHER = ev(0.05, 1.5, 20), ev(0.1, 1.0, 40), ev(0.02, 0.8, 60)


def release(groups, *, unit="record", seed=0, delta=DELTA, **kw) -> Release:
    args = dict(
        algorithm="dp_fedavg",
        variant={"epsilon_target": 2.0},
        seed=seed,
        unit=unit,
        relation={"record": RECORD, "client": CLIENT}.get(unit),
        delta=delta,
        epsilon=1.0,
        accountant="pld",
        path="results/run",
        groups=tuple(groups),
    )
    args.update(kw)
    return Release(**args)


def everyone(event, overflow=0.0):
    return (None, event, overflow)


def pld_reference(events, delta=DELTA, interval=acc.PLD_INTERVAL) -> float:
    """dp-accounting's own PLD accountant on the composition of ``events``."""
    a = PLDAccountant(value_discretization_interval=interval)
    a.compose(dp_accounting.ComposedDpEvent(list(events)))
    return a.get_epsilon(delta)


@functools.cache
def fine_pld_reference(events: tuple, delta: float) -> float:
    """:func:`pld_reference` at the fine interval 1e-4, computed once per ``(events,
    delta)``: the PLD and RDP ledgers below are checked against the same number."""
    return pld_reference(events, delta, interval=1e-4)


def rdp_reference(events, delta=DELTA) -> float:
    a = RdpAccountant(list(acc.DEFAULT_ORDERS))
    a.compose(dp_accounting.ComposedDpEvent(list(events)))
    return a.get_epsilon(delta)


@dataclass
class FakeRecord:
    """The attributes of ``PrivacyRecord`` the ledger reads."""

    unit: str | None
    relation: str | None
    delta: float
    accountant: str
    shares_randomness: bool
    final_epsilon: np.ndarray
    events: list = field(default_factory=list)

    def run_events(self, run):
        return self.events[run]


@dataclass
class FakeResult:
    privacy: FakeRecord
    runs: pd.DataFrame


def fake_result(*, unit="record", shares=False, runs=2) -> FakeResult:
    eps = np.arange(runs * 3, dtype=float).reshape(runs, 3) + 0.5
    events = [[((0, 1), SMALL, 0.0), ((2,), BIG, 1e-9)] for _ in range(runs)]
    record = FakeRecord(unit, RECORD if unit else None, DELTA, "pld", shares, eps, events)
    labels = pd.DataFrame(
        {"epsilon_target": np.repeat(np.float32(2.0), runs), "seed": np.arange(runs)}
    )
    return FakeResult(record, labels)


# ----------------------------------------------------------------- composition is right


def test_composed_equals_dp_accounting_pld(tmp_path):
    ledger = Ledger(tmp_path, "exp")
    for seed, e in enumerate([SMALL, BIG, OTHER]):
        ledger.add(release([everyone(e)], seed=seed))
    got = ledger.composed()["record"]
    assert got.epsilon == pytest.approx(pld_reference([SMALL, BIG, OTHER]), rel=1e-9)
    assert got.releases == (0, 1, 2) and got.reason is None
    # Pessimistic discretisation: the coarser interval can only be larger than the default.
    finer = pld_reference([SMALL, BIG, OTHER], interval=1e-4)
    assert got.epsilon >= finer - 1e-9
    assert got.epsilon == pytest.approx(finer, rel=1e-3)


def test_equal_compositions_are_computed_once(tmp_path, monkeypatch):
    """Statements with the same events (PAASO: one per configuration's swarms, few
    distinct) cost one accountant call in all, across statements and ledger writes, and
    state the epsilon a fresh composition gives; another delta, accountant, overflow or
    event is composed anew."""
    calls = []
    real = ledger_mod.event_epsilon

    def counted(event, delta, accountant="pld", overflow=0.0):
        calls.append(repr(event))
        return real(event, delta, accountant=accountant, overflow=overflow)

    monkeypatch.setattr(ledger_mod, "event_epsilon", counted)
    monkeypatch.setattr(ledger_mod, "_COMPOSED", {})
    ledger = Ledger(tmp_path, "exp")
    for k in range(6):  # six data sources: six statements, two distinct multisets
        ledger.add(release([everyone(SMALL if k % 2 else OTHER)], seed=k, data=f"swarm {k}"))
    composed = ledger.composed()
    ledger.write()
    assert len(composed) == 6 and len(calls) == 2
    for key, comp in composed.items():
        event = SMALL if int(key.rsplit(" ", 1)[1]) % 2 else OTHER
        assert comp.epsilon == pytest.approx(pld_reference([event]), rel=1e-9)
    again = Ledger(tmp_path / "b", "exp", accountant="rdp")
    again.add(release([everyone(SMALL)], accountant="rdp", data="a"))
    again.add(release([everyone(SMALL, overflow=1e-9)], seed=1, accountant="rdp", data="b"))
    again.composed()
    assert len(calls) == 4


def _keyed(fingerprint: str) -> dict:
    return {"generator": "ChaCha20", "secret": "entropy", "fingerprint": fingerprint}


def test_a_refused_call_leaves_no_trace_in_the_checks(tmp_path):
    """``add_result`` adds every run of a call or none, and the lookups behind the checks
    of :meth:`Ledger.add` forget the undone runs too: a refused call's key fingerprint can
    be listed afterwards, and later releases are still checked against every kept one
    (the first offending release named, as a scan of them all would)."""
    ledger = Ledger(tmp_path, "exp")
    ledger.add(release([everyone(SMALL)], randomness=_keyed("b" * 32)))
    result = fake_result()
    result.privacy.randomness = {"generator": "ChaCha20", "secret": "entropy"}
    result.privacy.key_fingerprints = ("a" * 32, "b" * 32)  # run 1 reuses release 0's key
    with pytest.raises(ValueError, match=r"releases 0 .* and 2 .* drew the same noise"):
        ledger.add_result(result, algorithm="dp_fedavg", path="out/a")
    assert len(ledger.releases) == 1
    plain = release([everyone(BIG)], seed=9, unit=None, relation=None, epsilon=math.inf)
    assert ledger.add(plain) == 1  # checked by nothing, yet it must not keep stale lookups
    assert ledger.add(release([everyone(BIG)], seed=1, randomness=_keyed("a" * 32))) == 2
    with pytest.raises(ValueError, match=r"releases 2 .* and 3 .* drew the same noise"):
        ledger.add(release([everyone(BIG)], seed=2, randomness=_keyed("a" * 32)))
    with pytest.raises(ValueError, match="differs from release 0's"):
        ledger.add(release([everyone(BIG)], seed=3, relation="another relation"))
    with pytest.raises(ValueError, match="beside release 0's None"):
        ledger.add(release([everyone(BIG)], seed=3, data="a dataset"))
    assert list(ledger.composed()) == ["record"]
    assert ledger.composed()["record"].releases == (0, 2)


def test_composed_equals_dp_accounting_rdp(tmp_path):
    ledger = Ledger(tmp_path, "exp", accountant="rdp")
    for seed, e in enumerate([SMALL, BIG]):
        ledger.add(release([everyone(e)], seed=seed))
    assert ledger.composed()["record"].epsilon == pytest.approx(
        rdp_reference([SMALL, BIG]), rel=1e-9
    )


@pytest.mark.parametrize(
    ("events", "delta"),
    [
        ([ev(0.01, 1.1, 200)], 1e-5),
        ([ev(0.2, 2.0, 10), ev(1.0, 5.0, 3)], 1e-6),
        ([ev(0.05, 0.9, 30)] * 3, 1e-3),
    ],
)
@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_never_below_an_independent_accountant(tmp_path, events, delta, accountant):
    ledger = Ledger(tmp_path, "exp", delta=delta, accountant=accountant)
    for seed, e in enumerate(events):
        ledger.add(release([everyone(e)], seed=seed))
    reference = fine_pld_reference(tuple(events), delta)
    assert ledger.composed()["record"].epsilon >= reference - 1e-9


def test_per_client_composition_takes_the_max_over_clients(tmp_path):
    ledger = Ledger(tmp_path, "exp")
    ledger.add(release([((0, 1), BIG, 0.0), ((2, 3), SMALL, 0.0)], seed=0))
    ledger.add(release([((0,), SMALL, 0.0), ((1, 2, 3), BIG, 0.0)], seed=1))
    ledger.add(release([everyone(OTHER)], seed=2))
    got = ledger.composed()["record"].epsilon
    # Client 1 is the worst: BIG twice, plus OTHER (which covers everyone).
    assert got == pytest.approx(pld_reference([BIG, BIG, OTHER]), rel=1e-9)
    assert got < pld_reference([BIG, SMALL, SMALL, BIG, OTHER]) - 1e-3


def test_disjoint_clients_compose_in_parallel(tmp_path):
    ledger = Ledger(tmp_path, "exp")
    ledger.add(release([((0, 1), BIG, 0.0)], seed=0))
    ledger.add(release([((2, 3), BIG, 0.0)], seed=1))
    assert ledger.composed()["record"].epsilon == pytest.approx(
        acc.event_epsilon(BIG, DELTA), rel=1e-12
    )


def test_overflow_is_summed_over_the_releases_of_a_client(tmp_path):
    ledger = Ledger(tmp_path, "exp")
    ledger.add(release([everyone(SMALL, 2e-7)], seed=0))
    ledger.add(release([((0,), BIG, 3e-7), ((1,), BIG, 0.0)], seed=1))
    expected = acc.event_epsilon(dp_accounting.ComposedDpEvent([SMALL, BIG]), DELTA, overflow=5e-7)
    assert ledger.composed()["record"].epsilon == pytest.approx(expected, rel=1e-9)
    assert expected > acc.event_epsilon(dp_accounting.ComposedDpEvent([SMALL, BIG]), DELTA)


def test_ten_thousand_clients_cost_one_accounting_per_distinct_class(tmp_path, monkeypatch):
    calls = []
    real = ledger_mod.event_epsilon
    monkeypatch.setattr(
        ledger_mod, "event_epsilon", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    ids = np.arange(10_000)
    ledger = Ledger(tmp_path, "exp")
    ledger.add(release([(ids[::2], SMALL, 0.0), (ids[1::2], BIG, 0.0)], seed=0))
    ledger.add(release([everyone(OTHER)], seed=1))
    ledger.add(release([(ids[:5000], BIG, 0.0), (ids[5000:], SMALL, 0.0)], seed=2))
    start = time.perf_counter()
    got = ledger.composed()["record"].epsilon
    assert time.perf_counter() - start < 10.0
    # Classes: {SMALL, BIG} x {BIG, SMALL} halves, plus the unnamed-client class.
    assert len(calls) <= 4
    assert got == pytest.approx(pld_reference([BIG, OTHER, BIG]), rel=1e-9)


def test_units_are_composed_separately(tmp_path):
    ledger = Ledger(tmp_path, "exp", delta=DELTA)
    ledger.add(release([everyone(BIG)], unit="record"))
    ledger.add(release([everyone(SMALL)], unit="client", delta=1e-3))
    out = ledger.composed()
    assert set(out) == {"record", "client"}
    assert out["record"].epsilon == pytest.approx(acc.event_epsilon(BIG, DELTA), rel=1e-12)
    assert out["client"].epsilon == pytest.approx(acc.event_epsilon(SMALL, DELTA), rel=1e-12)
    assert out["client"].relation == CLIENT and out["record"].releases == (0,)


def test_non_private_event_gives_inf_with_reason(tmp_path):
    ledger = Ledger(tmp_path, "exp")
    ledger.add(release([everyone(BIG)], seed=0))
    ledger.add(release([everyone(ev(0.1, 0.0, 5))], seed=1))
    got = ledger.composed()["record"]
    assert math.isinf(got.epsilon) and "non-private" in got.reason


# --------------------------------------------------------------------- results, records


def test_releases_from_a_result(tmp_path):
    ledger = Ledger(tmp_path, "exp")
    assert ledger.add_result(fake_result(), algorithm="dp_fedavg", path="out/a") == [0, 1]
    first, second = ledger.releases
    assert (first.seed, second.seed) == (0, 1)
    assert first.variant == {"epsilon_target": 2.0}
    assert isinstance(first.variant["epsilon_target"], float)
    assert (first.epsilon, second.epsilon) == (2.5, 5.5)  # max over clients
    assert first.groups[0][0] == (0, 1) and first.groups[1][2] == 1e-9
    assert first.randomness is None and first.relation == RECORD
    with pytest.raises(ValueError, match="run must be an int in"):
        Release.from_result(fake_result(), 2, algorithm="x", path="p")


def test_shared_randomness_has_no_finite_epsilon(tmp_path):
    ledger = Ledger(tmp_path, "exp")
    ledger.add_result(fake_result(shares=True), algorithm="dp_fedavg", path="out/crn")
    assert ledger.releases[0].randomness == ledger.releases[1].randomness == "crn:dp_fedavg@out/crn"
    got = ledger.composed()["record"]
    assert math.isinf(got.epsilon)
    assert "common random numbers" in got.reason and "[0, 1]" in got.reason
    # One run with a tag shares noise with nothing else in the ledger: finite.
    alone = Ledger(tmp_path / "alone", "exp")
    alone.add(ledger.releases[0])
    alone.add(release([everyone(BIG)], seed=7))
    assert math.isfinite(alone.composed()["record"].epsilon)


def test_non_dp_release_is_listed_and_not_composed(tmp_path):
    ledger = Ledger(tmp_path, "exp")
    ledger.add(release([everyone(BIG)]))
    ledger.add_result(fake_result(unit=None, runs=1), algorithm="fedavg", path="out/plain")
    plain = ledger.releases[1]
    assert not plain.private and math.isinf(plain.epsilon) and plain.groups == ()
    assert ledger.non_private == (1,)
    assert ledger.composed()["record"].releases == (0,)
    data = json.loads(ledger.write().read_text())
    assert data["non_private_releases"]["releases"] == [1]
    assert data["releases"][1]["epsilon"] == "inf"
    assert "not private releases" in (tmp_path / MARKDOWN_NAME).read_text()


# ------------------------------------------------------------------------- selections


def test_public_selection_is_recorded_without_charge(tmp_path):
    ledger = Ledger(tmp_path, "exp")
    ledger.add(release([everyone(SMALL)], seed=0))
    ledger.add(release([everyone(BIG)], seed=1))
    before = ledger.composed()["record"].epsilon
    chosen = ledger.select("best sigma", [0, 1], score="public")
    assert chosen.event is None and chosen.unit is None
    assert ledger.composed()["record"].epsilon == before
    assert ledger.composed()["record"].selections == ()


def test_private_selection_is_charged_by_composition(tmp_path):
    ledger = Ledger(tmp_path, "exp")
    ledger.add(release([everyone(SMALL)], seed=0))
    ledger.add(release([everyone(BIG)], seed=1))
    score = dp_accounting.LaplaceDpEvent(2.0)
    ledger.select("best lr", [0, 1], score="private", event=score)
    got = ledger.composed()["record"]
    # Every candidate stays in the composition, plus the noised score.
    assert got.epsilon == pytest.approx(pld_reference([SMALL, BIG, score]), rel=1e-9)
    assert got.selections == ("best lr",)


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (("s", [0, 1]), {"score": "private"}, "score='private' needs event="),
        (("s", [0, 1]), {"score": "validation"}, "unknown selection score"),
        (("s", [0, 5]), {"score": "public"}, r"selection candidates .* in \[0, 3\)"),
        (("s", [0, 0]), {"score": "public"}, "must be distinct"),
        (("s", [0, 2]), {"score": "private", "event": SMALL}, "DP releases of one unit"),
        (("s", [0]), {"score": "public", "event": SMALL}, "apply to score='private' only"),
        (("", [0]), {"score": "public"}, "selection name must be a non-empty string"),
    ],
)
def test_bad_selection_is_refused(tmp_path, args, kwargs, match):
    ledger = Ledger(tmp_path, "exp")
    ledger.add(release([everyone(SMALL)], seed=0))
    ledger.add(release([everyone(BIG)], seed=1))
    ledger.add(release([], unit=None))
    with pytest.raises(ValueError, match=match):
        ledger.select(*args, **kwargs)
    assert ledger.selections == ()


def test_duplicate_selection_name_is_refused(tmp_path):
    ledger = Ledger(tmp_path, "exp")
    ledger.add(release([everyone(SMALL)]))
    ledger.select("best", [0], score="public")
    with pytest.raises(ValueError, match="'best' is already in the ledger"):
        ledger.select("best", [0], score="public")


# ------------------------------------------------------------------------- bad input


def test_folder_under_a_file_is_refused_before_anything_is_written(tmp_path):
    blocker = tmp_path / "results.csv"
    blocker.write_text("x")
    for folder in (blocker, blocker / "ledger", blocker / "a" / "b"):
        with pytest.raises(ValueError, match=r"^ledger folder .* cannot be created and written"):
            Ledger(folder, "exp")
    assert sorted(os.listdir(tmp_path)) == ["results.csv"]


def test_read_only_folder_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root ignores the mode
            pytest.skip("running as a user that can write to a read-only folder")
        with pytest.raises(ValueError, match="ledger folder"):
            Ledger(locked / "new", "exp")
        assert os.listdir(locked) == []
    finally:
        locked.chmod(0o700)


def test_new_folder_is_created_and_left_empty(tmp_path):
    Ledger(tmp_path / "a" / "b", "exp")
    assert os.listdir(tmp_path / "a" / "b") == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"accountant": "moments"}, "unknown accountant 'moments'; choose one of 'pld', 'rdp'"),
        ({"delta": 0.0}, r"ledger delta must be in \(0.0, 1.0\)"),
        ({"delta": 1.5}, r"ledger delta must be in \(0.0, 1.0\)"),
        ({"experiment": ""}, "ledger experiment must be a non-empty string"),
    ],
)
def test_bad_options_are_refused_before_the_folder_is_made(tmp_path, kwargs, match):
    args = {"experiment": "exp", **kwargs}
    with pytest.raises(ValueError, match=match):
        Ledger(tmp_path / "new", args.pop("experiment"), **args)
    assert not (tmp_path / "new").exists()


def test_releases_of_a_unit_must_share_delta_or_the_ledger_names_one(tmp_path):
    ledger = Ledger(tmp_path, "exp")
    ledger.add(release([everyone(SMALL)], delta=1e-5))
    with pytest.raises(ValueError, match=r"ledger delta is None but release delta 0\.001"):
        ledger.add(release([everyone(BIG)], delta=1e-3))
    fixed = Ledger(tmp_path, "exp", delta=1e-4)
    fixed.add(release([everyone(SMALL)], delta=1e-5))
    fixed.add(release([everyone(BIG)], delta=1e-3))
    assert fixed.composed()["record"].epsilon == pytest.approx(
        pld_reference([SMALL, BIG], 1e-4), rel=1e-9
    )


def test_releases_of_a_unit_must_share_their_relation(tmp_path):
    ledger = Ledger(tmp_path, "exp")
    ledger.add(release([everyone(SMALL)]))
    with pytest.raises(ValueError, match="release relation 'replace-one' differs"):
        ledger.add(release([everyone(BIG)], relation="replace-one"))


def test_a_ledger_of_the_former_client_relation_refuses_new_runs_and_names_the_way_out(
    tmp_path,
):
    """A ledger written while the client-level relation read add/remove takes no release of
    the zero-out relation: one line that quotes both and says what to do instead."""
    from swarmjax.privacy.plan import RELATIONS, PrivacyPlan

    old = "client-level, add/remove: neighbouring datasets differ in one whole client"
    written = Ledger(tmp_path / "old", "exp")
    written.add(release([everyone(SMALL)], unit="client", relation=old))
    written.write()
    loaded = Ledger.load(tmp_path / "old")
    poisson = PrivacyPlan("client", 100, 0.1, 20, DELTA, noise_multiplier=1.0)
    new = release([everyone(poisson.event)], unit="client", seed=1, relation=RELATIONS["client"])
    with pytest.raises(ValueError) as err:
        loaded.add(new)
    message = str(err.value)
    assert "\n" not in message and f"differs from release 0's {old!r}" in message
    assert "write the new runs to a new ledger, or recompute the old ones" in message
    # under the one zero-out relation a new ledger composes Poisson DP-FedAvg with DP-FTRL
    ftrl = PrivacyPlan.min_separation_cohorts("client", 100, 10, 20, 5, None, DELTA)
    ftrl = dataclasses.replace(ftrl, noise_multiplier=3.0)
    ledger = Ledger(tmp_path / "new", "exp")
    ledger.add(new)
    ledger.add(release([everyone(ftrl.event)], unit="client", seed=2, relation=RELATIONS["client"]))
    both = ledger.composed()["client"]
    assert both.releases == (0, 1) and both.relation == RELATIONS["client"]
    assert both.epsilon > max(poisson.epsilon(), ftrl.epsilon())
    assert both.epsilon == pytest.approx(pld_reference([poisson.event, ftrl.event]), rel=1e-9)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"unit": "example"}, "unknown release unit 'example'"),
        ({"delta": 0.0}, "release delta must be in"),
        ({"epsilon": float("nan")}, "release epsilon must not be NaN"),
        ({"accountant": "gdp"}, "unknown accountant 'gdp'"),
        ({"groups": [((0, 0), SMALL, 0.0)]}, "group clients must be distinct"),
        ({"groups": [((0,), "gaussian", 0.0)]}, "group's event must be a dp_accounting"),
        ({"groups": [((0,), SMALL, -1.0)]}, "group overflow must be in"),
        ({"seed": 1.5}, "release seed must be an int or None"),
    ],
)
def test_bad_release_is_refused(kwargs, match):
    args = {"groups": [everyone(SMALL)], **kwargs}
    with pytest.raises(ValueError, match=match):
        release(args.pop("groups"), **args)


# -------------------------------------------------------------------------- the file


def _full_ledger(folder) -> Ledger:
    ledger = Ledger(folder, "exp 35")
    ledger.add(release([((0, 1), BIG, 1e-9), ((2,), SMALL, 0.0)], seed=0))
    ledger.add(release([everyone(acc.PureDpEvent(0.5))], seed=1, variant={"target": math.inf}))
    ledger.add(release([], unit=None, algorithm="fedavg"))
    ledger.add(release([everyone(OTHER)], unit="client", delta=1e-3))
    ledger.select("best", [0, 1], score="private", event=dp_accounting.LaplaceDpEvent(1.0))
    ledger.select("shown", [0, 1, 2], score="public")
    ledger.mark_not_released("results/checkpoints", "orbax checkpoints: client states")
    return ledger


def _refuse_constant(name):
    raise AssertionError(f"non-strict JSON constant {name}")


def test_write_load_round_trip(tmp_path):
    ledger = _full_ledger(tmp_path)
    path = ledger.write()
    assert path == tmp_path / JSON_NAME
    assert sorted(os.listdir(tmp_path)) == [JSON_NAME, MARKDOWN_NAME]  # no temp files left
    text = path.read_text()
    data = json.loads(text, parse_constant=_refuse_constant)
    keys = "format experiment written accountant delta releases non_private_releases"
    assert set(data) == {*keys.split(), "selections", "not_released", "composed"}
    assert data["releases"][1]["variant"] == {"target": "inf"}
    assert data["not_released"] == [
        {"folder": "results/checkpoints", "why": "orbax checkpoints: client states"}
    ]
    loaded = Ledger.load(path)
    assert loaded.releases == ledger.releases
    assert loaded.selections == ledger.selections
    assert loaded.not_released == ledger.not_released
    again = loaded.composed()
    for unit, stored in data["composed"].items():
        assert again[unit].epsilon == pytest.approx(float(stored["epsilon"]), rel=1e-12)
    assert Ledger.load(tmp_path).experiment == "exp 35"  # the folder works too


def test_file_alone_reproduces_the_composition_with_dp_accounting(tmp_path):
    ledger = Ledger(tmp_path, "exp")
    ledger.add(release([everyone(SMALL)], seed=0))
    ledger.add(release([everyone(BIG)], seed=1))
    data = json.loads(ledger.write().read_text())
    events = [acc.event_from_dict(r["groups"][0]["event"]) for r in data["releases"]]
    stored = data["composed"]["record"]["epsilon"]
    assert stored == pytest.approx(pld_reference(events, data["composed"]["record"]["delta"]))


def test_statement_and_markdown_name_the_composed_epsilon(tmp_path):
    ledger = Ledger(tmp_path, "exp")
    ledger.add(release([everyone(SMALL)], seed=0))
    ledger.add(release([everyone(BIG)], seed=1))
    ledger.write()
    eps = ledger.composed()["record"].epsilon
    shown = f"{math.ceil(eps * 100) / 100:.2f}"  # rounded up, never down
    data = json.loads((tmp_path / JSON_NAME).read_text())
    short = data["composed"]["record"]["short_statement"]
    assert short == f"({shown}, 1e-05)-DP, record-level zero-out (test relation), PLD accountant"
    statement = data["composed"]["record"]["statement"]
    assert statement.startswith(f"{short}: all 2 record-level DP releases of experiment 'exp'")
    assert f"under {RECORD}, by PLD composition" in statement
    # records built without keys: the statement says their noise's source is not stated
    assert "Releases [0, 1] do not state where their noise came from" in statement
    markdown = (tmp_path / MARKDOWN_NAME).read_text()
    assert short in markdown and f"{eps:.6g}" in markdown and "| dp_fedavg |" in markdown


def test_load_refuses_a_non_strict_or_foreign_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "swarmjax.privacy_ledger/1", "delta": NaN}')
    with pytest.raises(ValueError, match="non-JSON constant NaN"):
        Ledger.load(bad)
    bad.write_text('{"format": "other"}')
    with pytest.raises(ValueError, match=r"is not a swarmjax\.privacy_ledger/1 file"):
        Ledger.load(bad)
    with pytest.raises(ValueError, match="cannot be read"):
        Ledger.load(tmp_path / "missing.json")


def test_write_replaces_the_previous_file(tmp_path):
    ledger = Ledger(tmp_path, "exp")
    ledger.add(release([everyone(SMALL)]))
    ledger.write()
    ledger.add(release([everyone(BIG)], seed=1))
    data = json.loads(Path(ledger.write()).read_text())
    assert len(data["releases"]) == 2


def test_client_ids_stay_on_one_line(tmp_path):
    ledger = Ledger(tmp_path, "exp")
    ledger.add(release([(np.arange(10_000), SMALL, 0.0)]))
    text = ledger.write().read_text()
    assert len(text.splitlines()) < 100
    clients = json.loads(text)["releases"][0]["groups"][0]["clients"]
    assert clients == list(range(10_000))
