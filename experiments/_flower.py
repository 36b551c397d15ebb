"""``--runtime flower``: run an experiment's algorithm on a real Flower deployment.

A SuperLink and one SuperNode per client start as separate processes on 127.0.0.1
(:class:`swarmjax.fl.runtime.flower.deployment.LocalDeployment`), the digits task of
:mod:`swarmjax.fl.runtime.flower.tasks` runs over ``flwr run``, and the same task runs in the
simulator beside it: the printout puts the two histories side by side with the largest
difference of the global model, and says what epsilon covers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
import pandas as pd

from experiments._report import write_json
from swarmjax.fl.runtime.flower.deployment import LocalDeployment
from swarmjax.fl.runtime.flower.server import RELEASED, read_run
from swarmjax.fl.runtime.flower.task import Task, load_task, simulate_task
from swarmjax.fl.runtime.result import Result
from swarmjax.privacy.secret import Secret

Runner = Callable[[dict, Task, Path], Result]


def deployed(config: dict, task: Task, out: Path) -> Result:
    """Run ``config`` over a SuperLink + one SuperNode per client on 127.0.0.1."""
    nodes = tuple(range(task.num_clients))
    print(f"Flower: SuperLink + {len(nodes)} SuperNodes on 127.0.0.1, {config}", flush=True)
    run_dir = Path(config["out-dir"])
    with LocalDeployment(partitions=nodes, node_config={"jax-cache-dir": str(out / "jax")}) as d:
        output = d.run(config, timeout=3600)
        if not (run_dir / RELEASED / "privacy.json").exists():
            raise RuntimeError(f"the ServerApp wrote no results:\n{output[-3000:]}\n{d.logs()}")
    return read_run(run_dir, task)


def run_over_flower(config: dict, out: Path, runner: Runner = deployed) -> dict:
    """Run the digits task ``config`` (keys of ``flower_app/pyproject.toml``) on Flower
    (``runner``: a real deployment; tests pass an in-process grid) and in the simulator;
    write ``out/flower/`` and return a summary."""
    out = Path(out)
    run_dir = out / "flower"
    # generous waits: a node compiles the run's functions while joining (minutes on a
    # loaded CPU for Fed-DP-PSO)
    waits = {"join-timeout": 1200.0, "reply-timeout": 600.0}
    config = {
        "task": "swarmjax.fl.runtime.flower.tasks:digits",
        **waits,
        **config,
        "out-dir": str(run_dir),
    }
    if not config.get("secret-file"):
        # the deployment is compared with the simulator draw for draw, so both read one
        # secret (reproducible mode: the record says so), kept with the operator-only
        # outputs, which are never released
        where = run_dir / "operator" / "secret.key"
        Secret.generate().save(where)
        config["secret-file"] = str(where)
    task = load_task(config)
    run = runner(config, task, out)
    sim = simulate_task(task)
    diff = max(
        float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
        for a, b in zip(jax.tree.leaves(run.server), jax.tree.leaves(sim.server), strict=True)
    )
    cols = ["round", "test_accuracy", "test_loss", "bytes_up", "bytes_down"]
    side = run.history[cols].merge(sim.history[cols], on="round", suffixes=("_flower", "_sim"))
    print(side.to_markdown(index=False, floatfmt=".6f"))
    eps = run.privacy.epsilon[0, -1]
    print(f"largest |flower - simulator| over the global model: {diff:.3g}")
    print(f"epsilon per client after round {task.rounds} (delta {task.delta:g}): {eps}")
    print("covers: " + "; ".join(run.privacy.covers))
    print("not covered: " + ("; ".join(run.privacy.not_covered) or "nothing"))
    messages = run.operator.messages  # operator-only: printed here, never in the summary
    left_out = messages[messages["status"] != "ok"]
    if len(left_out):
        print("left out:\n" + pd.DataFrame(left_out).to_markdown(index=False))
    summary = {
        "config": config,
        "max_abs_model_difference": diff,
        "epsilon": eps.tolist(),
        "relation": run.privacy.relation,
        # wall seconds per round track the realised cohort: operator-only, not summarised
        "operator_outputs": str(run_dir / "operator"),
    }
    write_json(out / "flower_summary.json", summary)
    return summary
