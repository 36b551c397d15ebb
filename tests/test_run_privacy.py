"""One privacy record for a run of any algorithm (swarmjax.fl.runtime.result.run_privacy),
as the simulator's finish and the Flower ServerApp release it: what the algorithm declares,
its own step events included (distributed DP's Skellam event, not a Gaussian's)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from swarmjax.fl.algorithms import registry
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data.clients import stack_clients
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime.result import privacy_record, run_privacy, step_events
from swarmjax.models import mlp
from swarmjax.privacy.accounting import Rates

ROUNDS, CLIENTS = 4, 40


def _secagg() -> tuple[object, Variants]:
    rng = np.random.default_rng(0)
    x, y = rng.random((200, 8, 8, 1), np.float32), rng.integers(0, 10, 200)
    clients = stack_clients(x, y, np.array_split(np.arange(200), CLIENTS))
    spec = RunSpec(ROUNDS, 1e-3, (0,), accountant="rdp")
    run = registry.CrossDeviceRun(
        mlp((4,), 10, (8, 8, 1)),
        CLIENTS,
        5,
        spec,
        LocalTraining(epochs=1, batch_size=5),
        epsilon=8.0,
        options={"bits": 20, "min_survivors": 4},
    )
    alg, grid = registry.cross_device("dp-fedavg-secagg", run)
    return alg, Variants.grid(alg, clients, spec, **grid)


def _spend(sigma: float) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Every client once, in round 1 (one run, ROUNDS rounds, CLIENTS clients): the steps
    and, as Gaussian steps would have them, ``q = 1`` and ``sigma``."""
    steps = np.ones((1, ROUNDS, CLIENTS), np.int32)
    full = np.ones((1, ROUNDS, CLIENTS), np.float32)
    return steps, {"sample_rate": full, "noise_multiplier": full * sigma}


def _record(alg, spend: tuple, **events) -> object:
    """The record of ``spend`` under ``alg``'s declarations, at the test's delta (rdp)."""
    covers = alg.setup + alg.exchanges
    steps, rates = spend
    return privacy_record(
        steps,
        covers,
        unit=alg.accounting().unit,
        delta=1e-3,
        accountant="rdp",
        rates=Rates(**rates),
        **events,
    )


def test_the_record_uses_the_algorithms_own_step_events():
    alg, variants = _secagg()
    spend = _spend(1.0)
    record = run_privacy(alg, spend[0], variants.hyper, variants.spec, CLIENTS)
    row = jax.tree.map(lambda a: a[0], jax.device_get(variants.hyper))
    by_hand = _record(alg, spend, step_events=[alg.accounting().step_event(row)])
    np.testing.assert_array_equal(record.epsilon, by_hand.epsilon)
    # the Skellam event of the plan's calibration: its epsilon is the target, not what a
    # Gaussian of noise multiplier 1 would give
    assert np.allclose(record.final_epsilon, 8.0, rtol=0.05)
    gaussian = _record(alg, spend)  # what the ServerApp released before: Gaussian steps
    assert not np.allclose(gaussian.final_epsilon, record.final_epsilon, rtol=0.05)
    assert record.covers == by_hand.covers and record.unit == "client"


def test_gaussian_algorithms_ask_for_no_step_events():
    model = mlp((4,), 10, (8, 8, 1))
    base = registry.Base(model, LocalTraining(batch_size=5), RunSpec(2, 1e-3, (0,)), 10)
    alg, _ = registry.build("dp-fedavg", base)
    assert step_events(alg, None, 1) is None


def test_the_flower_record_states_what_the_simulators_does(tmp_path):
    """The ServerApp's record (written to privacy.json and read back) says what drew the
    noise, its accountant and epsilons, as the simulator's record of the same task."""
    pytest.importorskip("flwr", reason="the flower extra is not installed")
    from swarmjax.fl.runtime.flower.server import ServerSettings, drive, read_run
    from swarmjax.fl.runtime.flower.task import load_task
    from tests.test_flower_runtime import _grid, config, simulated

    cfg = config("dp-fedavg")
    settings = ServerSettings(join_timeout=1.0, reply_timeout=1.0, out_dir=tmp_path)
    drive(_grid(cfg), load_task(cfg), settings)
    run, sim = read_run(tmp_path, load_task(cfg)), simulated(cfg)
    assert run.privacy.randomness == sim.privacy.randomness
    assert run.privacy.randomness["secret"] == "supplied"  # the tests' secret file
    assert "supplied secret" in repr(run.privacy)
    assert run.privacy.accountant == sim.privacy.accountant
    assert run.privacy.floating_point == sim.privacy.floating_point
    np.testing.assert_allclose(run.privacy.epsilon, sim.privacy.epsilon)
