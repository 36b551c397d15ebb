"""Record-level canaries inside FedAvg's DP-SGD clients (``FedAvg(audit=CanaryAudit(M,
score="gradient"))``: swarmjax.privacy.canaries.ClientCanaries through
LocalTraining.train_audited, carried in each client's AuditedTrainer across rounds),
audited against the clients' record-level epsilon.  The broken-mechanism drill (noise
scaled down tenfold from the test, never by a production flag: one run of the same
compiled call), the one-run bound of the real mechanism below its accounted epsilon, the
report in Result.audit, the privacy record and the ledger, FedProx sharing the route, and
bad input refused before any work.

4 clients of 50 random records, B 40 (Poisson rate 0.8, 2 steps a round), 10 rounds: 20
DP-SGD steps per client at claimed epsilon 2; 128 Dirac canaries per client, pooled (512).
The clip (1000) is large against the records' gradients, so the drill measures the noise
alone, as tests/test_canaries_record_clients.py's.
"""

from __future__ import annotations

import numpy as np
import pytest

from swarmjax.fl import simulate, stack_clients
from swarmjax.fl.algorithms.fedavg import AuditedTrainer, FedAvg
from swarmjax.fl.algorithms.fedprox import FedProx
from swarmjax.fl.client.training import LocalTraining, RecordDP
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.models import mlp
from swarmjax.privacy.canaries import CanaryAudit
from swarmjax.privacy.ledger import releases_from_result
from tests.drills import tenfold_drill

CLIENTS, ROWS, B, ROUNDS, DELTA, CLIP, EPSILON = 4, 50, 40, 10, 1e-5, 1000.0, 2.0
MODEL = mlp((16,), 10, (4, 5, 1))  # 506 parameters
AUDIT = CanaryAudit(128, score="gradient")
BROKEN = 2.5  # the run claiming this epsilon gets a tenth of its noise


@pytest.fixture(scope="module")
def federation():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(CLIENTS * ROWS, 4, 5, 1)).astype(np.float32)
    y = rng.integers(0, 10, CLIENTS * ROWS)
    parts = [np.arange(i * ROWS, (i + 1) * ROWS) for i in range(CLIENTS)]
    return stack_clients(x, y, parts), (x[:20], y[:20])


def _alg(clients, audit=AUDIT, record_dp=True, cls=FedAvg) -> FedAvg:
    dp = None
    if record_dp:
        dp = RecordDP.for_run(
            [clients.sizes], B, rounds=ROUNDS, epsilons=[EPSILON, BROKEN], delta=DELTA,
            clip_norm=CLIP,
        )  # fmt: skip
    return cls(MODEL, LocalTraining(batch_size=B, optimizer="sgd", record_dp=dp), audit=audit)


@pytest.fixture(scope="module")
def runs(federation):
    """ONE compiled call of two runs: target epsilon 2 with the real mechanism, and target
    2.5 whose Gaussian noise the test scales down tenfold (picked by its smaller noise
    multiplier, so both runs share one program; the record still claims 2.5)."""
    clients, test = federation
    alg = _alg(clients)
    spec = RunSpec(ROUNDS, DELTA, (0,))
    return alg, tenfold_drill(alg, clients, test, spec, EPSILON, BROKEN)


def test_real_dp_sgd_clients_stay_below_their_epsilon(runs):
    alg, res = runs
    report = alg.audit_reports(res)[0]
    assert res.runs["epsilon_target"].tolist() == [EPSILON, BROKEN]
    assert report.unit == "record" and report.score == "gradient"
    assert report.canaries == CLIENTS * AUDIT.canaries
    assert report.epsilon == pytest.approx(float(np.max(res.privacy.final_epsilon[0])))
    assert report.epsilon == pytest.approx(EPSILON, abs=0.01)
    assert 0.0 <= report.epsilon_lower < EPSILON and not report.exceeds
    # the canaries rode in the client state across all 10 rounds: 20 steps each
    assert isinstance(res.clients, AuditedTrainer)
    assert np.asarray(res.privacy.steps)[:, -1].tolist() == [[20] * CLIENTS] * 2
    assert np.all(np.abs(np.asarray(res.clients.canaries.scores)).sum(axis=-1) > 0)
    # simulate's finish put the reports in (FedAvg.audited): Result, record and ledger
    assert res.audit[0] == report and res.privacy.audit[0] == report.to_dict()
    release = releases_from_result(res, algorithm="fedavg", path="-")[0]
    assert release.audit["epsilon_lower"] == report.epsilon_lower


def test_tenfold_less_noise_is_caught(runs):
    alg, res = runs
    report = alg.audit_reports(res)[1]
    assert report.epsilon == pytest.approx(BROKEN, abs=0.01)  # the record still claims it
    assert report.epsilon_lower > BROKEN and report.exceeds
    assert report.tpr_at_fpr > 0.9


def test_fedprox_takes_the_same_route(federation):
    """FedProx inherits the audit: at ``mu = 0`` and with common random numbers (the same
    keys for both algorithms) its canaries' scores are FedAvg's, draw for draw."""
    clients, test = federation
    spec = RunSpec(2, DELTA, (0,))
    scores = []
    for cls, mu in ((FedAvg, {}), (FedProx, {"mu": [0.0]})):
        alg = _alg(clients, cls=cls)
        grid = dict(epsilon_target=[EPSILON], learning_rate=[1e-4], **mu)
        res = simulate(
            alg, clients, test, Variants.grid(alg, clients, spec, **grid),
            common_random_numbers=True,
        )  # fmt: skip
        assert res.audit[0].canaries == CLIENTS * AUDIT.canaries
        scores.append(np.asarray(res.clients.canaries.scores))
    assert np.any(scores[0] != 0)
    np.testing.assert_allclose(scores[0], scores[1], rtol=1e-5, atol=1e-3)


def test_bad_input_names_the_option(federation):
    clients, _ = federation
    with pytest.raises(ValueError, match=r"^audit needs a private run: training.record_dp"):
        _alg(clients, record_dp=False).check(clients)
    with pytest.raises(ValueError, match=r"^audit canaries must be <= 506 "):
        _alg(clients, audit=CanaryAudit(507, score="gradient")).check(clients)
    with pytest.raises(ValueError, match=r"^audit score 'cosine' is not available for in-client"):
        _alg(clients, audit=CanaryAudit(8)).check(clients)
    with pytest.raises(ValueError, match=r"^audit must be a CanaryAudit or None; got int"):
        _alg(clients, audit=8).check(clients)
    with pytest.raises(ValueError, match=r"^audit_reports needs an audited algorithm"):
        _alg(clients, audit=None).audit_reports(None)
    # an inf target (no noise) is refused where the noise is calibrated, before any run;
    # there, without record_dp, record_dp is named first
    spec = RunSpec(ROUNDS, DELTA, (0,))
    with pytest.raises(ValueError, match=r"^audit needs a private run: epsilon_target is inf"):
        Variants.grid(_alg(clients), clients, spec, epsilon_target=[EPSILON, np.inf])
    with pytest.raises(ValueError, match=r"^audit needs a private run: training.record_dp"):
        Variants.grid(_alg(clients, record_dp=False), clients, spec, epsilon_target=[np.inf])


def test_a_deployment_refuses_an_audited_algorithm(federation):
    """An in-client audit's report is built by the simulator's ``finish``; a Flower task
    would run the canaries and report nothing, so it is refused in one line."""
    from swarmjax.fl.runtime.flower.task import stacked_task

    clients, test = federation
    alg = _alg(clients)
    variants = Variants.grid(
        alg, clients, RunSpec(ROUNDS, DELTA, (0,)), epsilon_target=[EPSILON], learning_rate=[1e-4]
    )
    with pytest.raises(ValueError, match=r"^audit: FedAvg\(audit=\.\.\.\) runs in the simulator"):
        stacked_task(alg, variants, clients, test)
