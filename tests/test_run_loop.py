"""A loop the user owns: ``start`` / ``advance`` / ``finish`` give :func:`simulate`'s numbers,
stop early with a record of the rounds done, and refuse what would break the calibration."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from swarmjax.fl.algorithms.client_level_dp_fedavg import dp_fedavg
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data import load_dataset
from swarmjax.fl.data.clients import stack_clients
from swarmjax.fl.data.partition import iid_partition
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import Execution, Run, advance, finish, simulate, start
from swarmjax.models import mlp
from tests.reproducible import SECRET

ROUNDS = 6
ALG = dp_fedavg(mlp((16,), 10, (8, 8, 1)), training=LocalTraining(epochs=1, batch_size=35))


@pytest.fixture(scope="module")
def call():
    data = load_dataset("digits")
    x, y = data.x_train[:700], data.y_train[:700]
    clients = stack_clients(x, y, iid_partition(y, 10, seed=0).indices)
    spec = RunSpec(ROUNDS, 1e-3, (0, 1))
    kw = dict(sample_rate=0.5, noise_multiplier=[0.8, 1.2], initial_clip=0.2, learning_rate=0.3)
    variants = Variants.grid(ALG, clients, spec, **kw)
    return clients, (data.x_test, data.y_test), variants


def _same(a, b) -> None:
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


def test_a_user_loop_gives_simulates_numbers(call):
    clients, test, variants = call
    # one supplied secret: the loop and simulate draw the same numbers
    whole = simulate(
        ALG, clients, test, variants, secret=SECRET, execution=Execution(rounds_per_call=1)
    )
    run = start(ALG, clients, test, variants, secret=SECRET)
    assert isinstance(run, Run) and run.runs == 4 and run.done == 0 and run.metrics == {}
    seen = []
    for n in (1, 2, 1, 2):  # any split of the rounds; the first compiled call is reused
        run, metrics = advance(run, n)
        assert all(v.shape == (4, n) for v in metrics.values())
        seen.append(metrics["test_accuracy"])
    assert run.done == ROUNDS
    mine = finish(run)
    _same(mine.server.params, whole.server.params)
    np.testing.assert_array_equal(np.concatenate(seen, axis=1), whole.metrics["test_accuracy"])
    np.testing.assert_array_equal(run.metrics["test_accuracy"], whole.metrics["test_accuracy"])
    assert mine.history.equals(whole.history)
    np.testing.assert_array_equal(mine.privacy.epsilon, whole.privacy.epsilon)
    # DP-FedAvg is FedAvg under a plan: the result names the class, Private
    assert mine.algorithm == whole.algorithm == "Private(FedAvg)"


def test_early_stopping_accounts_only_the_rounds_done(call):
    clients, test, variants = call
    run, best, stale = start(ALG, clients, test, variants, secret=SECRET), -1.0, 0
    while run.done < ROUNDS:
        run, metrics = advance(run)
        acc = float(metrics["test_accuracy"].mean())
        best, stale = (acc, 0) if acc > best else (best, stale + 1)
        if stale >= 1 and run.done >= 2:  # stop once a round brings no improvement
            break
    early = finish(run)
    assert early.history["round"].max() == run.done
    # one round per compiled call: the program the loop above ran (same numbers as all
    # rounds in one call, Execution.rounds_per_call; one compilation fewer)
    full = simulate(
        ALG, clients, test, variants, secret=SECRET, execution=Execution(rounds_per_call=1)
    )
    eps_early = early.privacy.final_epsilon.max(axis=1)
    eps_full = full.privacy.final_epsilon.max(axis=1)
    if run.done < ROUNDS:
        assert np.all(eps_early < eps_full)  # fewer rounds released, less spent
    np.testing.assert_allclose(
        early.privacy.epsilon[:, : run.done], full.privacy.epsilon[:, : run.done], rtol=1e-12
    )


def test_the_loop_refuses_what_breaks_its_calibration(call):
    clients, test, variants = call
    run = start(ALG, clients, test, variants)
    with pytest.raises(ValueError, match="finish needs at least one round"):
        finish(run)
    for n in (2, 2, 1):  # ROUNDS - 1 done, in the calls the first test compiled
        run, _ = advance(run, n)
    assert run.done == ROUNDS - 1
    with pytest.raises(ValueError, match=r"rounds must be <= 1, the rounds left"):
        advance(run, 2)
    with pytest.raises(ValueError, match="rounds"):
        advance(run, 0)
