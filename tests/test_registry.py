"""The one registry of algorithm names (swarmjax.fl.algorithms.registry): its names are the
experiment's, the benchmark's and the Flower tasks', each builds its class, unknown names
and misplaced options are one line, and FedProx is everywhere."""

from __future__ import annotations

import math

import numpy as np
import pytest

from swarmjax.fl.algorithms import registry
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data.clients import stack_clients
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.models import mlp

CROSS_DEVICE = ("fedavg", "fedprox", "fedadam", "fedyogi", "dp-fedavg", "dp-fedavg-adaptive")


def _run(**kw) -> registry.CrossDeviceRun:
    return registry.CrossDeviceRun(
        mlp((4,), 10, (8, 8, 1)),
        40,
        5,
        RunSpec(4, 1e-3, (0,)),
        LocalTraining(epochs=1, batch_size=5),
        **kw,
    )


def test_the_names_every_consumer_takes():
    from experiments import cross_device
    from swarmjax.fl.runtime.flower import tasks

    assert registry.names(cross_device=True) == (*CROSS_DEVICE, "dp-ftrl", "dp-fedavg-secagg")
    assert cross_device.ALGORITHMS == registry.names(cross_device=True)
    assert set(cross_device.DP_ALGORITHMS) == {
        "dp-fedavg",
        "dp-fedavg-adaptive",
        "dp-ftrl",
        "dp-fedavg-secagg",
    }
    assert tasks.ALGORITHMS == (
        "fedavg",
        "fedprox",
        "dp-fedavg",
        "dp-ftrl",
        "dp-fedavg-secagg",
        "fed-dp-pso",
    )
    assert set(registry.names()) == set(registry.REGISTRY)
    for entry in registry.REGISTRY.values():  # a one-line description each
        assert entry.description and "\n" not in entry.description


def test_an_unknown_name_is_one_line_listing_the_allowed_ones():
    with pytest.raises(ValueError) as err:
        registry.lookup("fedsgd")
    assert str(err.value) == (
        "unknown algorithm 'fedsgd'; allowed: fedavg, fedprox, fedadam, fedyogi, dp-fedavg, "
        "dp-fedavg-adaptive, dp-ftrl, dp-fedavg-secagg, combined, local-only, fed-dp-pso"
    )
    with pytest.raises(ValueError, match="allowed: fedavg, fedprox, fedadam"):
        registry.cross_device("fed-dp-pso", _run())  # registered, not a cross-device one


def test_a_near_miss_name_suggests_the_nearest():
    with pytest.raises(
        ValueError, match=r"^unknown algorithm 'FedAvg' \(did you mean 'fedavg'\?\); allowed"
    ):
        registry.lookup("FedAvg")
    with pytest.raises(ValueError, match=r"'dpfedavg' \(did you mean 'dp-fedavg'\?\)"):
        registry.lookup("dpfedavg")


@pytest.mark.parametrize(
    ("name", "values", "message"),
    [
        ("fedavg", {"learning_rate": math.inf}, r"learning_rate must be in \(0.0, inf\); got inf"),
        ("fedavg", {"server_lr": math.inf}, r"server_lr must be in \(0.0, inf\)"),
        ("dp-fedavg", {"clip": math.inf}, r"clip must be in \(0.0, inf\)"),
        ("fedavg", {"learning_rate": 1e-320}, r"learning_rate \(as float32\) must be in"),
        ("fedavg", {"server_lr": 1e39}, r"server_lr \(as float32\) must be in"),
        ("fedavg", {"learning_rate": "0.1"}, r"learning_rate must be numeric; got '0.1'"),
    ],
)
def test_an_infinite_rate_or_clip_and_a_number_as_text_are_refused(name, values, message):
    """inf would only turn the model into NaN (or the noise infinite), and so would a
    finite value float32 cannot hold (it stores 0 or inf); text is no number."""
    with pytest.raises(ValueError, match=message):
        registry.settings(name, **values).check()


@pytest.mark.parametrize("name", [*CROSS_DEVICE, "dp-ftrl"])
def test_each_name_builds_its_class_and_a_grid_the_algorithm_takes(name):
    rng = np.random.default_rng(0)
    x, y = rng.random((200, 8, 8, 1), np.float32), rng.integers(0, 10, 200)
    clients = stack_clients(x, y, np.array_split(np.arange(200), 40))
    # DP-FTRL with the factorization that needs no optimisation (the default BLT's takes
    # 20-30 s here; tests/test_experiment_cross_device_ftrl.py runs it)
    options = {"factorization": "prefix-sum"} if name == "dp-ftrl" else {}
    alg, grid = registry.cross_device(name, _run(epsilon=4.0, options=options))
    assert type(alg) is registry.lookup(name).algorithm
    variants = Variants.grid(alg, clients, _run().spec, **grid)
    assert variants.size == 1
    if name in ("fedadam", "fedyogi"):
        assert alg.server_optimizer == name[3:] and grid["server_lr"] == 0.01
    if registry.lookup(name).user_dp:
        assert grid["epsilon_target"] == [4.0]
    if name == "dp-ftrl":  # for_run made the scheme explicit: b = 40 // 5 = 8 > 4 rounds
        p = alg.plan.participation
        assert (p.min_separation, p.max_participations, alg.plan.adaptive) == (4, 1, False)
        assert alg.plan.noise.factorization == "prefix-sum"


def test_misplaced_options_and_a_missing_epsilon_are_one_line():
    with pytest.raises(ValueError) as err:
        registry.cross_device("fedavg", _run(options={"factorization": "blt"}))
    assert str(err.value) == "factorization does not apply to fedavg; it applies to: dp-ftrl"
    with pytest.raises(ValueError, match="epsilon must be set for dp-ftrl"):
        registry.cross_device("dp-ftrl", _run())
    with pytest.raises(ValueError, match="min_separation must be <= rounds"):
        registry.cross_device("dp-ftrl", _run(epsilon=2.0, options={"min_separation": 9}))


def test_fedprox_in_the_namespace_and_on_flower():
    import swarmjax.fl
    from swarmjax.fl.algorithms.fedprox import FedProx
    from swarmjax.fl.runtime.flower.tasks import digits

    assert swarmjax.fl.FedProx is FedProx and "FedProx" in dir(swarmjax.fl)
    task = digits({"algorithm": "fedprox", "mu": 0.5, "train-size": 60, "hidden": 4})
    assert type(task.algorithm) is FedProx
    assert float(task.variants.hyper.mu[0]) == 0.5
    with pytest.raises(ValueError, match="unknown algorithm 'fedadam'; allowed: fedavg, fedprox"):
        digits({"algorithm": "fedadam"})  # registered, not run by the Flower tasks


def test_the_benchmark_builds_through_the_registry():
    from benchmarks import vs_pfl
    from swarmjax.fl.algorithms.fedavg import FedAvg
    from swarmjax.fl.private import Private

    alg, grid = vs_pfl.algorithm(None)
    assert type(alg) is FedAvg and alg.cohort == vs_pfl.COHORT
    assert grid == {"learning_rate": 0.1, "server_lr": 1.0}
    alg, grid = vs_pfl.algorithm(vs_pfl.dp_config(10))
    assert type(alg) is Private and type(alg.algorithm) is FedAvg and not alg.plan.adaptive
    assert grid["sample_rate"] == vs_pfl.COHORT / vs_pfl.USERS
    assert grid["initial_clip"] == vs_pfl.CLIP and grid["epsilon_target"] == [vs_pfl.EPSILON]
    assert math.isfinite(grid["epsilon_target"][0])


def test_fedprox_on_flower_gives_the_simulator_numbers():
    pytest.importorskip("flwr", reason="the flower extra is not installed")
    import jax

    from swarmjax.fl.runtime.flower.client import make_client_app
    from swarmjax.fl.runtime.flower.loopback import LoopbackGrid
    from swarmjax.fl.runtime.flower.server import ServerSettings, drive
    from swarmjax.fl.runtime.flower.task import load_task, simulate_task
    from tests.reproducible import secret_file

    cfg = {
        "task": "swarmjax.fl.runtime.flower.tasks:digits",
        "algorithm": "fedprox",
        "mu": 0.5,
        "rounds": 2,
        "train-size": 150,
        "hidden": 8,
        "secret-file": secret_file(),  # every process and the simulator: the same draws
    }
    grid = LoopbackGrid.with_partitions(make_client_app(), cfg, (0, 1, 2))
    run = drive(grid, load_task(cfg), ServerSettings(join_timeout=1.0, reply_timeout=1.0))
    sim = simulate_task(load_task(cfg))
    for a, b in zip(jax.tree.leaves(run.server), jax.tree.leaves(sim.server), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)
    np.testing.assert_allclose(run.history["test_accuracy"], sim.history["test_accuracy"])


def test_secagg_builds_distributed_dp_on_min_separation_cohorts():
    from swarmjax.fl.distributed import Distributed

    rng = np.random.default_rng(0)
    x, y = rng.random((200, 8, 8, 1), np.float32), rng.integers(0, 10, 200)
    clients = stack_clients(x, y, np.array_split(np.arange(200), 40))
    run = _run(epsilon=8.0, options={"bits": 20, "min_survivors": 4, "max_colluders": None})
    alg, grid = registry.cross_device("dp-fedavg-secagg", run)
    assert type(alg) is Distributed and alg.plan.bits == 20 and alg.plan.threshold == 4
    p = alg.plan.participation
    assert (p.cohort, p.min_separation, p.max_participations) == (5, 4, 1)  # b = min(8, 4)
    spec = RunSpec(4, 1e-3, (0,), accountant="rdp")
    variants = Variants.grid(alg, clients, spec, **grid)
    assert float(np.asarray(variants.hyper.plan.noise)[0]) > 0
    with pytest.raises(ValueError, match="accountant must be 'rdp'"):
        Variants.grid(alg, clients, _run().spec, **grid)


def _algorithm_makers() -> set[str]:
    """Every name that makes an algorithm outside the registry: each
    :class:`~swarmjax.fl.protocol.Algorithm` subclass of the library and each function of
    the library's algorithm modules that returns one."""
    import importlib
    import inspect
    import pkgutil
    import re

    import swarmjax.fl.algorithms as algorithms
    from swarmjax.fl.protocol import Algorithm

    names = ["swarmjax.fl.private", "swarmjax.fl.distributed"]
    names += [f"{algorithms.__name__}.{m.name}" for m in pkgutil.iter_modules(algorithms.__path__)]
    modules = [
        importlib.import_module(n) for n in names if not n.endswith((".registry", ".settings"))
    ]
    classes = {
        c
        for m in modules
        for c in vars(m).values()
        if inspect.isclass(c) and issubclass(c, Algorithm)
    }
    makers = {c.__name__ for c in classes} - {"Algorithm"}
    for m in modules:
        for name, f in vars(m).items():
            returns = (
                getattr(f, "__annotations__", {}).get("return") if inspect.isfunction(f) else None
            )
            words = set(re.findall(r"\w+", returns)) if isinstance(returns, str) else set()
            if words & (makers | {"Algorithm"}):
                makers.add(name)
    return makers


def test_no_experiment_or_benchmark_builds_an_algorithm_outside_the_registry():
    """Issue 46, item 3: the experiments and benchmarks build every algorithm through the
    registry (:func:`registry.build`): none calls an algorithm's class or factory."""
    import ast
    from pathlib import Path

    makers = _algorithm_makers()
    assert {"FedAvg", "FedProx", "FedDPPSO", "LocalOnly", "Private", "dp_fedavg"} <= makers
    assert {"dp_ftrl", "fed_dp_pso", "fedpso", "private"} <= makers
    repo = Path(__file__).resolve().parents[1]
    found = []
    for folder in ("experiments", "benchmarks"):
        for path in sorted((repo / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            local = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
                if name in makers and not (isinstance(f, ast.Name) and name in local):
                    found.append(f"{path.relative_to(repo)}:{node.lineno} {name}(")
    assert not found, found
