"""The broken-mechanism drill shared by the in-client record-level audit tests: two runs of
one compiled call, one with the real Gaussian mechanism and one whose noise is scaled down
tenfold while its privacy record still claims the calibrated epsilon; and the federation,
privacy settings and report checks those tests share.

4 clients of 50 random records, B 40 (Poisson rate 0.8, 2 steps a round), 10 rounds: 20
DP steps per client at claimed epsilon 2; 128 Dirac canaries per client, pooled (512). The
clip (1000) is large against the records' gradients, so the drill measures the noise
alone."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.fl import simulate, stack_clients
from swarmjax.fl.client.training import RecordDP
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.models import mlp
from swarmjax.privacy import dpsgd
from swarmjax.privacy.canaries import CanaryAudit, CanaryReport
from swarmjax.privacy.ledger import releases_from_result

CLIENTS, ROWS, B, ROUNDS, DELTA, CLIP, EPSILON = 4, 50, 40, 10, 1e-5, 1000.0, 2.0
BROKEN = 2.5  # the run claiming this epsilon gets a tenth of its noise
MODEL = mlp((16,), 10, (4, 5, 1))  # 506 parameters
AUDIT = CanaryAudit(128, score="gradient")


def drill_federation() -> tuple[Any, tuple[np.ndarray, np.ndarray]]:
    """``(clients, test)``: :data:`CLIENTS` clients of :data:`ROWS` random records."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(CLIENTS * ROWS, 4, 5, 1)).astype(np.float32)
    y = rng.integers(0, 10, CLIENTS * ROWS)
    parts = [np.arange(i * ROWS, (i + 1) * ROWS) for i in range(CLIENTS)]
    return stack_clients(x, y, parts), (x[:20], y[:20])


def drill_record_dp(clients: Any, epsilons: list[float]) -> RecordDP:
    """Record-level DP for the drill's run: batch :data:`B`, :data:`ROUNDS` rounds at
    :data:`DELTA`, clip :data:`CLIP`, its Poisson buffer sized for ``epsilons``."""
    return RecordDP.for_run(
        [clients.sizes], B, rounds=ROUNDS, epsilons=epsilons, delta=DELTA, clip_norm=CLIP
    )


def drill_runs(make_alg: Any, federation: Any) -> tuple[Any, Any]:
    """``(alg, result)``: ONE compiled call of two runs of ``make_alg(clients)`` on the
    drill's ``federation`` over :data:`ROUNDS` rounds: target :data:`EPSILON` with the real
    mechanism, and target :data:`BROKEN` whose Gaussian noise is scaled down tenfold
    (:func:`tenfold_drill`; the record still claims it)."""
    clients, test = federation
    alg = make_alg(clients)
    spec = RunSpec(ROUNDS, DELTA, (0,))
    return alg, tenfold_drill(alg, clients, test, spec, EPSILON, BROKEN)


def check_real_report(alg: Any, res: Any, algorithm: str) -> CanaryReport:
    """The real run's report (run 0 of :func:`drill_runs`): pooled over every client's
    canaries, at the run's largest client epsilon, its bound below it; every client's
    canaries scored; the report in ``Result.audit``, the privacy record and the ledger's
    release (as ``algorithm``)."""
    report = alg.audit_reports(res)[0]
    assert res.runs["epsilon_target"].tolist() == [EPSILON, BROKEN]
    assert report.unit == "record" and report.score == "gradient"
    assert report.canaries == CLIENTS * AUDIT.canaries
    assert report.epsilon == pytest.approx(float(np.max(res.privacy.final_epsilon[0])))
    assert report.epsilon == pytest.approx(EPSILON, abs=0.01)
    assert 0.0 <= report.epsilon_lower < EPSILON and not report.exceeds
    assert report.verdict in ("ok", "cannot tell") and report.power_epsilon is not None
    # every client's canaries saw its own 20 steps: no client's scores are all zero
    assert np.all(np.abs(np.asarray(res.clients.canaries.scores)).sum(axis=-1) > 0)
    # simulate's finish put the reports in (the algorithm's audited): Result, record, ledger
    assert res.audit[0] == report and res.privacy.audit[0] == report.to_dict()
    release = releases_from_result(res, algorithm=algorithm, path="-")[0]
    assert release.audit["epsilon_lower"] == report.epsilon_lower
    return report


def check_caught(alg: Any, res: Any) -> None:
    """The broken run (run 1 of :func:`drill_runs`) exceeds the epsilon it claims."""
    report = alg.audit_reports(res)[1]
    assert report.epsilon == pytest.approx(BROKEN, abs=0.01)  # the record still claims it
    assert report.epsilon_lower > BROKEN and report.exceeds
    assert report.verdict == "violation"
    assert report.tpr_at_fpr > 0.9


def tenfold_drill(
    alg: Any, clients: Any, test: Any, spec: RunSpec, epsilon: float, broken: float
) -> Any:
    """``simulate`` of ``alg`` at target ``epsilon`` (the real mechanism) and ``broken``
    (``> epsilon``; its Gaussian noise scaled down tenfold, picked by its smaller noise
    multiplier so both runs share one program; the record still claims ``broken``), at
    learning rate 1e-4. No program compiled with the weakened mechanism is kept."""
    variants = Variants.grid(
        alg, clients, spec, epsilon_target=[epsilon, broken], learning_rate=[1e-4]
    )
    sigma = np.asarray(variants.hyper.noise_multiplier)
    cut = float(sigma[1].max() + sigma[0].min()) / 2  # between the two runs' multipliers
    assert sigma[1].max() < cut < sigma[0].min()
    real = dpsgd.gaussian_mechanism

    def weak(key, value, *, l2_sensitivity, noise_multiplier):
        scaled = jnp.where(noise_multiplier < cut, noise_multiplier / 10, noise_multiplier)
        return real(key, value, l2_sensitivity=l2_sensitivity, noise_multiplier=scaled)

    jax.clear_caches()  # no program compiled with the real mechanism is reused, nor kept
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dpsgd, "gaussian_mechanism", weak)
        res = simulate(alg, clients, test, variants)
    jax.clear_caches()
    return res
