"""Flower's Simulation Runtime: ``flwr run flower_app`` against a local simulation federation
(the ClientApps in Ray actors, which stay alive between messages) runs swarmjax's app with
the simulator's numbers. Skipped, with the reason, where Ray is not installed: it is
Flower's ``simulation`` extra (``pip install -e ".[simulation]"``), not a test dependency
(~70 MB). Measured seconds per round: benchmarks/RESULTS.md (``flower_round``)."""

import pytest

pytest.importorskip("flwr", reason="the flower extra is not installed")
pytest.importorskip(
    "ray", reason='Flower\'s Simulation Runtime needs Ray: pip install -e ".[simulation]"'
)

from swarmjax.fl.runtime.flower.deployment import run_simulation
from swarmjax.fl.runtime.flower.server import read_run
from swarmjax.fl.runtime.flower.task import load_task
from tests.test_flower_runtime import assert_same_run, config, simulated

pytestmark = pytest.mark.slow


def test_the_simulation_runtime_gives_the_simulators_numbers(tmp_path):
    cfg = config("fedavg")
    out = tmp_path / "sim"
    log = run_simulation({**cfg, "out-dir": str(out)}, num_supernodes=3, timeout=600)
    run = read_run(out, load_task(cfg))
    assert len(run.operator.rounds) == cfg["rounds"], log[-2000:]
    assert (run.operator.messages["status"] == "ok").all()
    assert_same_run(run, simulated(cfg))
