"""benchmarks.fed_round's vectorised round runs as the benchmark times it: the registry's
Fed-DP-PSO (AdamW, its DP-Adam buffer sized for the run) through the simulator's compiled
call of one round (its signature once changed under the benchmark unseen)."""

from __future__ import annotations

import jax
import numpy as np

from benchmarks import fed_round
from swarmjax.fl.algorithms.fed_dp_pso import FedDPPSO
from swarmjax.fl.protocol import release_identity, run_keys
from swarmjax.fl.runtime import simulator
from swarmjax.privacy.secret import Secret


def test_the_vectorised_round_runs_one_round_of_every_client():
    alg, hypers, hyper, clients, test = fed_round._setup(1)
    assert type(alg) is FedDPPSO and alg.training.optimizer == "adamw"
    assert alg.training.record_dp is not None and alg.particles == fed_round.S
    data = alg.client_data(clients)
    keys = run_keys(Secret.generate(), [0], [release_identity(alg, hyper, {})], False)
    carry = simulator.init_runs(alg, keys, hypers, data, "vmap")
    call = fed_round.simulator.Rounds(alg, 1, "vmap")
    (_, states, done), outs = simulator.run_rounds(call, carry, keys, hypers, data, test)
    assert int(np.asarray(done)[0]) == 1
    assert np.isfinite(np.asarray(outs["metrics"]["test_accuracy"])).all()
    assert jax.tree.leaves(states)
