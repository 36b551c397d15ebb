"""Record-level canaries inside FedAvg's DP-SGD clients (``FedAvg(audit=CanaryAudit(M,
score="gradient"))``: swarmjax.privacy.canaries.ClientCanaries through
LocalTraining.train_audited, carried in each client's AuditedTrainer across rounds),
audited against the clients' record-level epsilon.  The broken-mechanism drill (noise
scaled down tenfold from the test, never by a production flag: one run of the same
compiled call), the one-run bound of the real mechanism below its accounted epsilon, the
report in Result.audit, the privacy record and the ledger, FedProx sharing the route, and
bad input refused before any work.

The federation, its DP settings and the report checks are tests/drills.py's (shared with
the other in-client audit's tests).
"""

from __future__ import annotations

import numpy as np
import pytest

from swarmjax.fl import simulate
from swarmjax.fl.algorithms.fedavg import AuditedTrainer, FedAvg
from swarmjax.fl.algorithms.fedprox import FedProx
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.privacy.canaries import CanaryAudit
from swarmjax.privacy.secret import Secret
from tests.drills import (
    AUDIT,
    BROKEN,
    CLIENTS,
    DELTA,
    EPSILON,
    MODEL,
    ROUNDS,
    B,
    check_caught,
    check_real_report,
    drill_federation,
    drill_record_dp,
    drill_runs,
)


def _alg(clients, audit=AUDIT, record_dp=True, cls=FedAvg) -> FedAvg:
    dp = drill_record_dp(clients, [EPSILON, BROKEN]) if record_dp else None
    return cls(MODEL, LocalTraining(batch_size=B, optimizer="sgd", record_dp=dp), audit=audit)


@pytest.fixture(scope="module")
def federation():
    return drill_federation()


@pytest.fixture(scope="module")
def runs(federation):
    return drill_runs(_alg, federation)


def test_real_dp_sgd_clients_stay_below_their_epsilon(runs):
    alg, res = runs
    check_real_report(alg, res, "fedavg")
    # the canaries rode in the client state across all 10 rounds: 20 steps each
    assert isinstance(res.clients, AuditedTrainer)
    assert np.asarray(res.privacy.steps)[:, -1].tolist() == [[20] * CLIENTS] * 2


def test_tenfold_less_noise_is_caught(runs):
    check_caught(*runs)


def test_fedprox_takes_the_same_route(federation):
    """FedProx inherits the audit: at ``mu = 0`` and with common random numbers (the same
    keys for both algorithms, from one supplied secret: each call would otherwise draw its
    own) its canaries' scores are FedAvg's, draw for draw."""
    clients, test = federation
    secret = Secret.from_bytes(b"fedprox takes fedavg's route, draw for draw")
    spec = RunSpec(2, DELTA, (0,), common_random_numbers=True)
    scores = []
    for cls, mu in ((FedAvg, {}), (FedProx, {"mu": [0.0]})):
        alg = _alg(clients, cls=cls)
        grid = dict(epsilon_target=[EPSILON], learning_rate=[1e-4], **mu)
        res = simulate(
            alg, clients, test, Variants.grid(alg, clients, spec, **grid), secret=secret,
        )  # fmt: skip
        assert res.audit[0].canaries == CLIENTS * AUDIT.canaries
        scores.append(np.asarray(res.clients.canaries.scores))
    assert np.any(scores[0] != 0)
    np.testing.assert_allclose(scores[0], scores[1], rtol=1e-5, atol=1e-3)


def test_bad_input_names_the_option(federation):
    clients, _ = federation
    with pytest.raises(ValueError, match=r"^audit needs a private run: training.record_dp"):
        _alg(clients, record_dp=False).client_data(clients)
    with pytest.raises(ValueError, match=r"^audit canaries must be <= 506 "):
        _alg(clients, audit=CanaryAudit(507, score="gradient")).client_data(clients)
    with pytest.raises(ValueError, match=r"^audit score 'cosine' is not available for in-client"):
        _alg(clients, audit=CanaryAudit(8)).client_data(clients)
    with pytest.raises(ValueError, match=r"^audit must be a CanaryAudit or None; got int"):
        _alg(clients, audit=8).client_data(clients)
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


def test_a_deployment_refuses_canaries_carried_in_the_clients_in_one_line(federation):
    """The canaries ride in the clients' states, which a deployment never gathers: the
    Flower task refuses the algorithm before any message, asking its declared accounting
    (no attribute looked up on the algorithm); without an audit it is accepted."""
    from swarmjax.fl.runtime.flower.task import stacked_task

    clients, test = federation
    for audit in (AUDIT, None):
        alg = _alg(clients, audit=audit)
        grid = Variants.grid(alg, clients, RunSpec(2, 1e-5), epsilon_target=[EPSILON])
        if audit is None:
            assert stacked_task(alg, grid, clients, test).algorithm is alg
            continue
        with pytest.raises(ValueError) as err:
            stacked_task(alg, grid, clients, test)
        assert str(err.value).startswith("audit: FedAvg(audit=...) runs in the simulator only")
        assert "\n" not in str(err.value)
