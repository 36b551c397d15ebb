"""The "noise shared between two releases" drill for DP-FedAvg: two releases of one
federation at different noise multipliers (client-level epsilon 1.0 and 1.5), forced by the
test to draw the same noise (``run_keys`` monkeypatched to give both variants the seed's
key, as ``common_random_numbers=True`` does, while the run records independent keys: the
historical "noise shared across variants" bug), audited on their combined release against
what the ledger claims for publishing both.  (Honest common random numbers are refused by
the ledger: it composes such a pair to infinity, so there is nothing to catch.)

With server SGD, fixed clipping and a shared key, run ``v``'s final change is
``d_v = (1 / qN) sum_t (x_t^v + z_v C n_t)`` with the same ``n_t`` in both runs, so
``z_B d_A - z_A d_B = (1 / qN) sum_t (z_B x_t^A - z_A x_t^B)``: the noise cancels and every
in canary's ``(z_B - z_A) C`` per participation stands alone (the real clients' local
steps are tiny, so ``x^A ~ x^B``; scored with the sign of ``z_B - z_A``, so that in
canaries score high).  The default snapped release (a power-of-two grid) leaves the
cancellation nearly exact: bound 3.23, TPR 0.88 with the default Dirac directions (3.36
and 0.92 with the Haar frame, whose float releases gave 4.11 and 1.0).
The score ``cos(+-(z_B d_A - z_A d_B), u_i)`` is a post-processing of the two published
models (``z_A, z_B`` are public), so the one-run bound applies to the pair, whose claimed
epsilon is the ledger's composition of the two releases.  The same pair drawn with
independent keys (the default) stays below it.

Setting as tests/test_canaries.py: 40 clients of 20 digits, q = 0.8, 20 rounds, 512
canaries on a 1,210-parameter model.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from swarmjax.fl.algorithms.client_level_dp_fedavg import dp_fedavg
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.protocol import (
    RunSpec,
    Variants,
    run_keys,
    server_init_key,
    variant_identities,
)
from swarmjax.fl.runtime import simulate, simulator
from swarmjax.privacy.canaries import (
    CanaryAudit,
    audit_scores,
    canary_directions,
    canary_key,
    cosine_scores,
    dirac_directions,
    inclusion,
)
from swarmjax.privacy.ledger import Ledger, releases_from_result
from swarmjax.privacy.participation import Poisson
from tests import test_canaries as _canaries
from tests.reproducible import SECRET
from tests.test_canaries import MODEL, NUM_CLIENTS, PER_CLIENT

Q = 0.8
EPSILONS, DELTA = (1.0, 1.5), 1e-5
SPEC = RunSpec(20, DELTA, (0,))
AUDIT = CanaryAudit(512)
TRAINING = LocalTraining(epochs=1, batch_size=PER_CLIENT)
federation = _canaries.federation  # the fixture: 40 clients of 20 digits


def _directions(audit: CanaryAudit, like):
    """The directions ``simulate`` draws for ``audit`` on a model like ``like``."""
    key = jax.random.key(audit.seed)
    if audit.directions == "dirac":
        d = sum(int(np.size(a)) for a in jax.tree.leaves(like))
        return dirac_directions(key, d, audit.canaries)
    return canary_directions(key, like, audit.canaries)


def _pair(federation, tmp_path, shared: bool, monkeypatch, audit: CanaryAudit = AUDIT):
    """The two releases (one variant each, keys shared or independent), the ledger's claim
    for publishing both, and the audit of the pair on run A's canary coins."""
    clients, test = federation
    poisson = Poisson.for_run(
        NUM_CLIENTS, Q, SPEC.rounds, SPEC.delta, max(EPSILONS), SPEC.accountant
    )
    alg = dp_fedavg(MODEL, participation=poisson, training=TRAINING, clipping="fixed")
    plan = alg.plan.privacy_plan(NUM_CLIENTS, Q, SPEC)
    za, zb = (plan.calibrate(e).noise_multiplier for e in EPSILONS)
    variants = Variants.grid(
        alg,
        clients,
        SPEC,
        sample_rate=Q,
        initial_clip=1.0,
        learning_rate=0.01,
        server_lr=1.0,
        noise_multiplier=[za, zb],
    )
    if shared:  # test-only break: one key for both variants, recorded as independent

        def one_key(secret, seeds, identities, common_random_numbers):
            return run_keys(secret, seeds, identities, True)

        monkeypatch.setattr(simulator, "run_keys", one_key)
    result = simulate(alg, clients, test, variants, audit=audit, secret=SECRET)
    releases = releases_from_result(result, algorithm="dp-fedavg", path="runs.csv")
    if shared:
        # the ledger sees the pair's equal key fingerprints and refuses to compose it ...
        with pytest.raises(ValueError, match="drew the same noise"):
            refusing = Ledger(tmp_path / "refusing", "shared-noise")
            for release in releases:
                refusing.add(release)
        # ... so the audit is checked against a ledger that cannot tell (no fingerprints)
        releases = [dataclasses.replace(r, randomness=None) for r in releases]
    ledger = Ledger(tmp_path, "shared-noise")
    for release in releases:
        ledger.add(release)
    claimed = ledger.composed()["client"]
    # what simulate drew: each run's key, initial model and canary coins; the directions
    keys = run_keys(SECRET, SPEC.seeds, variant_identities(alg, variants), shared)
    starts = [MODEL.init(server_init_key(k)) for k in keys]
    coins = [inclusion(canary_key(k), audit.canaries) for k in keys]
    directions = _directions(audit, starts[0])
    wa, wb = (jax.tree.map(lambda a, r=r: a[r], result.server.params) for r in range(2))
    # sign(z_B - z_A) (z_B d_A - z_A d_B): a shared noise cancels, each in canary keeps
    # |z_B - z_A| C a round along its direction (z_A > z_B here: epsilon 1.0 before 1.5)
    sign = float(np.sign(zb - za))
    combined = jax.tree.map(
        lambda a, a0, b, b0: sign * (zb * (a - a0) - za * (b - b0)), wa, starts[0], wb, starts[1]
    )
    report = audit_scores(
        cosine_scores(directions, combined),
        coins[0],
        audit=audit,
        epsilon=claimed.epsilon,
        delta=claimed.delta,
        unit="client",
        # both releases' canary slots: participations that sat out, and the union bound
        # on either run overflowing (the pair's delta takes it)
        dropped=sum(r.dropped for r in result.audit),
        overflow=sum(r.overflow for r in result.audit),
    )
    return result, claimed, report, coins


def test_shared_noise_is_caught_on_the_combined_release(federation, tmp_path, monkeypatch):
    result, claimed, report, coins = _pair(federation, tmp_path, True, monkeypatch)
    np.testing.assert_array_equal(coins[0], coins[1])  # one key: the same draws
    # each release alone passes its own audit: the bug is only in the pair
    assert all(not r.exceeds for r in result.audit)
    assert EPSILONS[1] - 0.01 < claimed.epsilon < 2 * EPSILONS[1]  # composed: about 2
    assert claimed.delta == pytest.approx(DELTA)
    assert report.epsilon_lower > claimed.epsilon
    assert report.exceeds and report.tpr_at_fpr > 0.8  # 0.880 (snapped release)


def test_independent_noise_stays_below_the_composed_epsilon(federation, tmp_path, monkeypatch):
    _, claimed, report, coins = _pair(federation, tmp_path, False, monkeypatch)
    assert not np.array_equal(coins[0], coins[1])  # independent keys: independent coins
    assert 0.0 <= report.epsilon_lower < claimed.epsilon
    assert not report.exceeds
