"""Client-level canaries in the run (swarmjax.privacy.canaries, simulate(audit=...)): the
broken-mechanism drill for DP-FedAvg, canaries outside the released metrics and the
accounting, the report in the Result, the privacy record and the ledger, and bad input.

One small federation (40 clients of 20 digits), fixed clipping, claimed epsilon 2 at
q = 0.8 over 20 rounds; 512 canaries on a 1,210-parameter model.  Local steps are small
(client lr 0.01), so the real clients' updates hardly reach along any canary direction.
"""

from __future__ import annotations

import dataclasses
import json
import math

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.fl.algorithms.client_level_dp_fedavg import dp_fedavg
from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data import load_dataset
from swarmjax.fl.data.clients import stack_clients
from swarmjax.fl.data.partition import iid_partition
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import Publication, simulate
from swarmjax.models import mlp
from swarmjax.privacy.canaries import (
    OVERFLOW_BUDGET,
    CanaryAudit,
    CanaryReport,
    canary_capacity,
    cosine_scores,
    dirac_directions,
    direction_rows,
)
from swarmjax.privacy.ledger import Ledger, Release
from swarmjax.privacy.noise import GaussianNoise
from swarmjax.privacy.secret import Secret

MODEL = mlp((16,), 10, (8, 8, 1))  # 1,210 parameters
NUM_CLIENTS, PER_CLIENT = 40, 20
EPSILON, DELTA = 2.0, 1e-5
SPEC = RunSpec(20, DELTA, (0,))
AUDIT = CanaryAudit(512)
SETTINGS = dict(sample_rate=0.8, initial_clip=1.0, learning_rate=0.01, epsilon_target=EPSILON)
TRAINING = LocalTraining(epochs=1, batch_size=PER_CLIENT)
DPFEDAVG = dp_fedavg(MODEL, training=TRAINING, clipping="fixed")


class TenfoldLessNoise(GaussianNoise):
    """Test-only break: the server releases its sum with a tenth of the noise the
    accountant is told about (the claimed epsilon is the unbroken one's)."""

    def add(self, key, total, clip, multiplier, reach, state, strategy):
        return super().add(key, total, clip, multiplier / 10.0, reach, state, strategy)


def _broken(alg):
    """``alg`` (DP-FedAvg) with its plan's noise replaced by :class:`TenfoldLessNoise`."""
    noise = TenfoldLessNoise(alg.plan.noise.release)
    return dataclasses.replace(alg, plan=dataclasses.replace(alg.plan, noise=noise))


@pytest.fixture(scope="module")
def federation():
    data = load_dataset("digits")
    n = NUM_CLIENTS * PER_CLIENT
    x, y = data.x_train[:n], data.y_train[:n]
    clients = stack_clients(x, y, iid_partition(y, NUM_CLIENTS, seed=0).indices)
    return clients, (data.x_test, data.y_test)


SECRET = Secret.from_bytes(b"test_canaries: one secret, so runs compare draw for draw")


def _run(alg, federation, audit, **kw):
    """One call; every call of this file shares :data:`SECRET` (reproducible mode), so the
    runs it compares draw the same coins and noise."""
    clients, test = federation
    variants = Variants.grid(alg, clients, SPEC, **SETTINGS)
    return simulate(alg, clients, test, variants, audit=audit, secret=SECRET, **kw)


@pytest.fixture(scope="module")
def plain(federation):
    return _run(DPFEDAVG, federation, None)


@pytest.fixture(scope="module")
def audited(federation, tmp_path_factory):
    ledger = Ledger(tmp_path_factory.mktemp("ledger"), "audit")
    result = _run(
        DPFEDAVG, federation, AUDIT, publication=Publication(ledger=ledger, path="runs.csv")
    )
    return result, ledger


def test_real_mechanism_stays_below_the_accounted_epsilon(audited):
    result, _ = audited
    (report,) = result.audit
    assert isinstance(report, CanaryReport)
    assert report.epsilon == pytest.approx(float(result.privacy.final_epsilon.max()))
    assert report.epsilon <= EPSILON
    assert report.canaries == 512 and 0 < report.included < 512
    assert report.confidence == 0.95 and report.delta == DELTA
    assert 0.0 <= report.epsilon_lower < report.epsilon
    assert not report.exceeds
    # never "violation"; "ok" only when it could have seen one; its power always stated
    assert report.verdict in ("ok", "cannot tell")
    assert report.power_epsilon > report.epsilon_lower and report.detectable_noise_factor >= 1
    assert report.audit_delta is not None and report.epsilon_audit_delta is not None
    line = report.line()
    assert "empirical epsilon >=" in line and "power: at most" in line
    assert f": {report.verdict}" in line and "VIOLATION" not in line


@pytest.mark.parametrize(
    "audit",
    [AUDIT, CanaryAudit(512, directions="haar", slots=512)],  # 3.76 and 4.00 (in 1.999)
    ids=["dirac", "haar-every-slot"],
)
def test_tenfold_less_noise_is_caught(federation, audit):
    (report,) = _run(_broken(DPFEDAVG), federation, audit).audit
    assert report.epsilon <= EPSILON  # the accountant still claims the unbroken epsilon
    assert report.epsilon_lower > report.epsilon
    assert report.exceeds and "broken mechanism" in report.line()
    assert report.verdict == "violation"
    assert report.tpr_at_fpr > 0.9
    assert report.dropped == 0


def test_dirac_directions_are_orthonormal_and_score_by_one_gather():
    like = MODEL.init(jax.random.key(0))
    d = sum(int(np.size(a)) for a in jax.tree.leaves(like))
    dirs = dirac_directions(jax.random.key(3), d, 300)
    assert len(set(np.asarray(dirs.coordinates).tolist())) == 300
    assert set(np.asarray(dirs.signs).tolist()) == {-1.0, 1.0}
    rows = direction_rows(dirs, like, jnp.arange(300))
    # each direction's row flattened as ravel_pytree flattens a model: one vmapped program
    # instead of 300 eager slices
    flat = np.asarray(jax.vmap(lambda row: jax.flatten_util.ravel_pytree(row)[0])(rows))
    assert flat.shape == (300, d)
    np.testing.assert_array_equal(flat @ flat.T, np.eye(300))
    change = jax.tree.map(lambda a: jax.random.normal(jax.random.key(1), a.shape), like)
    vec = np.asarray(jax.flatten_util.ravel_pytree(change)[0], np.float64)
    want = flat @ vec / np.linalg.norm(vec)
    np.testing.assert_allclose(np.asarray(cosine_scores(dirs, change)), want, rtol=1e-5)


def test_canary_slots_cover_the_participation_tail():
    # q = 0.8, M = 512, 20 rounds (this file's run): K well under M, chance of overflow
    # within the budget, and the next smaller K over it
    k, overflow = canary_capacity(0.8, 512, 20)
    assert 410 < k < 512 and 0.0 < overflow <= OVERFLOW_BUDGET
    assert canary_capacity(0.8, 512, 20, slots=k - 1)[1] > OVERFLOW_BUDGET
    # benchmarks.audit's cross-device rate: about 21 expected of 500; K = 61, not 500
    k, overflow = canary_capacity(50 / 1200, 500, 25)
    assert k == 62 and overflow <= OVERFLOW_BUDGET
    assert canary_capacity(0.8, 512, 20, slots=512) == (512, 0.0)


def test_bounded_slots_change_nothing_when_no_canary_sits_out(federation, audited):
    every = _run(DPFEDAVG, federation, CanaryAudit(512, slots=512))
    bounded, _ = audited
    (a,), (b,) = every.audit, bounded.audit
    assert (a.dropped, b.dropped, a.overflow) == (0, 0, 0.0) and 0 < b.overflow <= 1e-12
    assert a.included == b.included
    assert b.epsilon_lower == pytest.approx(a.epsilon_lower, abs=1e-3)
    np.testing.assert_allclose(
        every.history["test_loss"], bounded.history["test_loss"], rtol=1e-5, atol=1e-6
    )


def test_canaries_past_the_slots_sit_out_and_are_counted(federation):
    (report,) = _run(DPFEDAVG, federation, CanaryAudit(512, slots=8)).audit
    # about 0.8 * 256 in canaries take part each round, 8 slots: the rest sit out
    assert report.dropped > 20 * 150
    assert report.overflow == 1.0 and report.epsilon_lower == 0.0  # nothing left to bound
    assert report.power_epsilon == 0.0 and report.verdict == "cannot tell"
    assert f"{report.dropped} canary participations" in report.line()


def test_canaries_are_outside_the_released_metrics_and_the_accounting(plain, audited):
    result, _ = audited
    for column in ("epsilon_max", "bytes_up", "bytes_down", "cum_bytes_up"):
        np.testing.assert_array_equal(result.history[column], plain.history[column])
    np.testing.assert_array_equal(result.privacy.epsilon, plain.privacy.epsilon)
    np.testing.assert_array_equal(result.privacy.steps, plain.privacy.steps)
    assert plain.audit == () and plain.privacy.audit == ()
    # the canaries do move the model: that is how they are seen
    assert not np.allclose(result.history["test_loss"], plain.history["test_loss"])


def test_report_is_in_the_privacy_record_and_the_ledger(audited):
    result, ledger = audited
    (report,) = result.audit
    assert result.privacy.audit == (report.to_dict(),)
    assert CanaryReport.from_dict(report.to_dict()) == report
    path = ledger.write()
    saved = json.loads(path.read_text())["releases"][0]["audit"]
    assert saved["epsilon_lower"] == report.epsilon_lower
    assert saved["confidence"] == 0.95 and saved["canaries"] == 512
    assert Ledger.load(path).releases[0].audit == saved
    text = (path.parent / "privacy_ledger.md").read_text()
    assert "Empirical audits" in text and "empirical epsilon >=" in text


def test_ledgers_written_before_audits_still_load(audited, tmp_path):
    _, ledger = audited
    data = json.loads(ledger.write().read_text())
    for release in data["releases"]:
        del release["audit"]
    old = tmp_path / "privacy_ledger.json"
    old.write_text(json.dumps(data))
    loaded = Ledger.load(old)
    assert loaded.releases[0].audit is None
    assert loaded.composed()["client"].epsilon == pytest.approx(ledger.composed()["client"].epsilon)


def test_release_refuses_an_audit_without_its_bound():
    with pytest.raises(ValueError, match="release audit must be None or a dict"):
        Release("a", {}, 0, None, None, 1e-5, math.inf, "pld", "p", audit={"confidence": 0.9})


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: CanaryAudit(1), "audit canaries must be >= 2"),
        (lambda: CanaryAudit(8, score="loss"), "unknown audit score 'loss'"),
        (lambda: CanaryAudit(8, confidence=1.0), r"audit confidence must be in \(0.5, 1.0\)"),
        (lambda: CanaryAudit(8, norm=0.5), r"audit norm must be in \[1.0, inf\)"),
        (lambda: CanaryAudit(8, directions="qr"), "unknown audit directions 'qr'"),
        (lambda: CanaryAudit(8, slots=0), "audit slots must be >= 1"),
        (lambda: CanaryAudit(8, slots=9), "audit slots must be <= canaries=8"),
    ],
)
def test_bad_audit_settings_name_the_option(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def _refused(federation, alg, audit, settings, monkeypatch):
    """The ValueError of a call that must fail before any work (nothing is compiled)."""
    import swarmjax.fl.runtime.simulator as sim

    def never(*args, **kwargs):
        raise AssertionError("work started before the audit was checked")

    monkeypatch.setattr(sim, "init_runs", never)
    monkeypatch.setattr(sim, "run_rounds", never)
    clients, test = federation
    variants = Variants.grid(alg, clients, SPEC, **settings)
    with pytest.raises(ValueError) as err:
        simulate(alg, clients, test, variants, audit=audit)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_more_canaries_than_the_model_holds(federation, monkeypatch):
    text = _refused(federation, DPFEDAVG, CanaryAudit(1211), SETTINGS, monkeypatch)
    assert text.startswith("audit canaries must be <= 1210")


def test_an_audit_of_a_non_private_run(federation, monkeypatch):
    no_noise = {k: v for k, v in SETTINGS.items() if k != "epsilon_target"}
    no_noise["noise_multiplier"] = 0.0
    text = _refused(federation, DPFEDAVG, AUDIT, no_noise, monkeypatch)
    assert text.startswith("audit needs a private run: noise_multiplier is 0")
    fedavg = FedAvg(MODEL, TRAINING)
    text = _refused(federation, fedavg, AUDIT, {}, monkeypatch)
    assert text.startswith("audit needs a private run: FedAvg has no privacy unit")


def test_an_unknown_score_for_client_canaries(federation, monkeypatch):
    text = _refused(federation, DPFEDAVG, CanaryAudit(8, score="gradient"), SETTINGS, monkeypatch)
    assert text.startswith("audit score 'gradient' is not available for client-level canaries")


def test_audit_must_be_a_canary_audit(federation, monkeypatch):
    text = _refused(federation, DPFEDAVG, 8, SETTINGS, monkeypatch)
    assert text == "audit must be a CanaryAudit or None; got int"
