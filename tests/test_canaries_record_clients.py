"""Record-level canaries inside federated clients (swarmjax.privacy.canaries.ClientCanaries
through LocalTraining.train_audited): Fed-DP-PSO's DP-Adam clients audited against their
record-level epsilon.  The broken-mechanism drill (noise scaled down tenfold from the
test, never by a production flag: one run of the same compiled call), the one-run bound
of the real mechanism below its accounted epsilon, the report in the privacy record and
the ledger, and bad input.

The federation, its DP settings and the report checks are tests/drills.py's (shared with
the other in-client audit's tests).
"""

from __future__ import annotations

import numpy as np
import pytest

from swarmjax.fl.algorithms.fed_dp_pso import FedDPPSO
from swarmjax.fl.client.training import LocalTraining
from swarmjax.privacy.canaries import CanaryAudit
from tests.drills import (
    AUDIT,
    EPSILON,
    MODEL,
    B,
    check_caught,
    check_real_report,
    drill_federation,
    drill_record_dp,
    drill_runs,
)


def _alg(clients, audit=AUDIT, record_dp=True) -> FedDPPSO:
    dp = drill_record_dp(clients, [EPSILON]) if record_dp else None
    training = LocalTraining(batch_size=B, optimizer="adam", weight_decay=1e-4, record_dp=dp)
    return FedDPPSO(MODEL, training, particles=2, audit=audit)


@pytest.fixture(scope="module")
def federation():
    return drill_federation()


@pytest.fixture(scope="module")
def runs(federation):
    return drill_runs(_alg, federation)


def test_real_dp_adam_clients_stay_below_their_epsilon(runs):
    check_real_report(*runs, "fed_dp_pso")


def test_tenfold_less_noise_is_caught(runs):
    check_caught(*runs)


def test_bad_input_names_the_option(federation):
    clients, _ = federation
    with pytest.raises(ValueError, match=r"^audit needs a private run: training.record_dp"):
        _alg(clients, record_dp=False).client_data(clients)
    with pytest.raises(ValueError, match=r"^audit canaries must be <= 506 "):
        _alg(clients, audit=CanaryAudit(507, score="gradient")).client_data(clients)
    with pytest.raises(ValueError, match=r"^audit score 'cosine' is not available for in-client"):
        _alg(clients, audit=CanaryAudit(8)).client_data(clients)
    with pytest.raises(ValueError, match=r"^audit_reports needs an audited algorithm"):
        _alg(clients, audit=None).audit_reports(None)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--epsilons", "inf", "--audit", "8"], "--audit needs a private run: every --epsilons"),
        (["--audit", "2411"], "--audit 2411 exceeds digits's model's 2410 parameters"),
        (["--audit", "1"], "--audit"),
        (["--runtime", "flower", "--epsilons", "5", "--audit", "8"], "--audit"),
    ],
)
def test_experiment_refuses_a_bad_audit_before_any_work(argv, message, tmp_path, capsys):
    from experiments import fed_dp_pso

    with pytest.raises(SystemExit) as exit_:
        fed_dp_pso.main(["--quick", *argv, "--out", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not any(tmp_path.iterdir())  # nothing written: refused before any work


def test_the_inf_target_is_not_audited():
    """The registry's builds drop the audit with the DP (an infinite target: plain local
    training, no epsilon to audit) and keep it otherwise, for Fed-DP-PSO and for FedAvg
    with DP-Adam. ``experiments.fed_dp_pso --audit`` end to end (the bound beside the
    epsilon, in the ledger and the cells) is checked on the quick run of
    tests/test_experiment_fed_dp_pso.py, which runs with ``--audit 16``."""
    from swarmjax.fl.algorithms import registry
    from swarmjax.fl.protocol import RunSpec

    sizes = np.full(4, 50)
    training = LocalTraining(batch_size=B, optimizer="adam")
    base = registry.Base(MODEL, training, RunSpec(2, 1e-5), 4, sizes=sizes, audit=AUDIT)
    for name, setting in (("fed-dp-pso", "target_epsilon"), ("fedavg", "record_epsilon")):
        private, _ = registry.build(name, base, registry.settings(name, **{setting: 5.0}))
        plain, grid = registry.build(name, base, registry.settings(name, **{setting: np.inf}))
        assert private.audit == AUDIT and private.training.record_dp is not None, name
        assert plain.audit is None and plain.training.record_dp is None, name
        assert grid["epsilon_target"] == [np.inf]
