"""A simulation compiles the programs it runs and nothing else: its runs' init, its round
and the input check's row reader. Shapes, message bytes, the cohort's memory, the run keys
and the run-repeated hyper values are computed on the host (docs/testing.md, session 30: an
eager slice, stack or ``jnp.asarray`` of a host array compiles one program each, and
``simulate``'s start compiled 40 of them, 0.4 CPU-seconds a call)."""

from __future__ import annotations

import jax
import numpy as np

from swarmjax.fl.algorithms.fedavg import FedAvg
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data import load_dataset
from swarmjax.fl.data.clients import stack_clients
from swarmjax.fl.data.store import ClientStore
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import simulate
from swarmjax.models import mlp
from tests.reproducible import SECRET

LOWERED = "/jax/core/compile/jaxpr_to_mlir_module_duration"
EXPECTED = {"jit(init_runs)", "jit(run_rounds)", "jit(input_rows)"}


def _programs(fn) -> list[str]:
    """The programs lowered while ``fn()`` runs (lowering precedes the persistent cache's
    lookup, so a cached program counts as well)."""
    names: list[str] = []

    def listen(event: str, duration: float, **kw: object) -> None:
        del duration
        if event == LOWERED:
            names.append(str(kw.get("fun_name")))

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        fn()
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    return names


def test_a_simulation_compiles_only_its_init_round_and_input_check():
    """Odd shapes (7 clients of 11 rows, a 5-unit MLP, 3 seeds, 2 variants) nothing else in
    the suite uses, so no program is already in memory; stacked clients and a flat store."""
    data = load_dataset("digits")
    indices = np.split(np.arange(77), 7)
    test = (data.x_test[:97], data.y_test[:97])
    alg = FedAvg(mlp((5,), 10, data.input_shape), LocalTraining(batch_size=11), cohort=3)
    spec = RunSpec(2, 1e-5, (0, 1, 2))
    for clients in (
        stack_clients(data.x_train, data.y_train, indices),
        ClientStore.build(data.x_train, data.y_train, indices),
    ):
        variants = Variants.grid(alg, clients, spec, learning_rate=[0.1, 0.2])
        names = _programs(lambda c=clients, v=variants: simulate(alg, c, test, v, secret=SECRET))
        assert set(names) <= EXPECTED, sorted(set(names) - EXPECTED)
        assert {"jit(init_runs)", "jit(run_rounds)"} <= set(names)
