"""Each registered algorithm's typed settings (swarmjax.fl.algorithms.settings): a bad or
unknown setting is one ValueError line naming it and what it allows, before any data is
read; a run configuration fills them by key; one build serves the Flower tasks and the
cross-device runs."""

from __future__ import annotations

import math
import tomllib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from swarmjax.fl.algorithms import registry
from swarmjax.fl.algorithms import settings as typed
from swarmjax.fl.client.training import LocalTraining, RecordDP
from swarmjax.fl.protocol import RunSpec
from swarmjax.models import mlp
from swarmjax.privacy.canaries import CanaryAudit
from swarmjax.privacy.participation import Poisson

REPO = Path(__file__).resolve().parents[1]


def _one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


def test_every_entry_has_settings_whose_defaults_hold():
    for name, entry in registry.REGISTRY.items():
        if name == "dp-fedavg-secagg":  # calibrates to a target: none by default
            with pytest.raises(ValueError, match="epsilon must be set"):
                registry.settings(name)
            continue
        assert type(registry.settings(name)) is entry.settings
    assert registry.settings("fedadam").server_optimizer == "adam"  # the entry's own default
    assert registry.settings("dp-fedavg-adaptive").clipping == "adaptive"


@pytest.mark.parametrize(
    ("name", "values", "message"),
    [
        ("fedavg", {"learning_rate": 0.0}, "learning_rate must be in (0.0, inf); got 0.0"),
        (
            "fedavg",
            {"server_optimizer": "sgdm"},
            "unknown server_optimizer 'sgdm' (did you mean 'sgd'?); choose",
        ),
        ("fedavg", {"cohort": 0}, "cohort must be >= 1; got 0"),
        ("fedprox", {"mu": -1.0}, "mu must be in [0.0, inf]; got -1.0"),
        ("dp-fedavg", {"client_rate": 1.5}, "client_rate must be in (0.0, 1.0]; got 1.5"),
        ("dp-fedavg", {"clipping": "flat"}, "unknown clipping 'flat'; choose one of 'fixed'"),
        ("dp-fedavg", {"epsilon": 4.0}, "set one of epsilon and noise_multiplier ("),
        ("dp-ftrl", {"factorization": "lu"}, "unknown factorization 'lu'; choose one of 'blt'"),
        ("dp-ftrl", {"schedule": "daily"}, "unknown schedule 'daily'; choose one of 'cyclic'"),
        ("dp-ftrl", {"min_separation": 0}, "min_separation must be >= 1; got 0"),
        ("dp-fedavg-secagg", {"epsilon": 4.0, "dropout": 2.0}, "dropout must be in"),
        ("fed-dp-pso", {"particles": 0}, "particles must be >= 1; got 0"),
        ("fed-dp-pso", {"buffer_epsilons": (0.0,)}, "buffer_epsilons must be in (0.0, inf"),
        ("fedavg", {"record_epsilon": -1.0}, "record_epsilon must be in (0.0, inf"),
        ("dp-fedavg", {"server_momentum": 1.0}, "server_momentum must be in [0.0, 1.0)"),
        ("dp-fedavg", {"buffer_epsilon": 0.0}, "buffer_epsilon must be in (0.0, inf"),
        ("dp-fedavg", {"noise_multiplier": -1.0}, "noise_multiplier must be in [0.0, inf]"),
        ("combined", {"variant": "paper"}, "unknown variant 'paper'; choose one of 'code'"),
        ("local-only", {"keep_optimizer_state": 1}, "keep_optimizer_state must be true or"),
        (
            "fed-dp-pso",
            {"refine_start": "best"},
            "unknown refine_start 'best' (did you mean 'pbest'?); choose one",
        ),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(name, values, message):
    with pytest.raises(ValueError) as err:
        registry.settings(name, **values)
    assert _one_line(err).startswith(message)


def test_an_unknown_setting_is_one_line_listing_the_settings():
    with pytest.raises(ValueError) as err:
        registry.settings("fedprox", rate=0.1)
    assert (
        _one_line(err) == "fedprox has no setting 'rate'; its settings: learning_rate, mu, cohort"
    )


def test_a_run_configuration_fills_the_settings_by_key():
    config = {"client-rate": "0.5", "noise-multiplier": 2, "clip": 0.2, "mu": 0.3, "rounds": 9}
    s = registry.from_config("dp-fedavg", config)  # mu and rounds are not dp-fedavg's
    assert s == typed.DpFedAvgSettings(client_rate=0.5, noise_multiplier=2.0, clip=0.2)
    # "" makes an optional setting None: the noise calibrated to a target instead
    s = registry.from_config("dp-fedavg", {"epsilon": 4, "noise-multiplier": ""})
    assert (s.epsilon, s.noise_multiplier) == (4.0, None)
    s = registry.from_config("dp-ftrl", {"buffers": "", "bands": "3", "schedule": "random"})
    assert (s.buffers, s.bands, s.schedule, s.clipping) == (None, 3, "random", "adaptive")
    s = registry.from_config("fed-dp-pso", {"reading": "current", "reading-init": "shared"})
    assert (s.reading.refine_update, s.reading.init) == ("if_better", "shared")
    assert s.inputs() is s.reading and typed.FedAvgSettings().inputs() is None
    s = registry.from_config("fed-dp-pso", {"buffer-epsilons": "2, 8"})
    assert s.buffer_epsilons == (2.0, 8.0)
    assert registry.from_config("fed-dp-pso", {"buffer-epsilons": ""}).buffer_epsilons == ()


def test_the_flower_apps_own_configuration_gives_every_flower_algorithm_its_defaults():
    """A deployment's run configuration holds every key of flower_app/pyproject.toml (each
    algorithm's keys with their defaults): each Flower algorithm takes them as they are."""
    app = tomllib.loads((REPO / "flower_app" / "pyproject.toml").read_text())
    config = app["tool"]["flwr"]["app"]["config"]
    # distributed DP has no default epsilon (it always calibrates): the app's user sets one
    needs = {"dp-fedavg-secagg": {"epsilon": 8.0}}
    for name in registry.names(flower=True):
        given = {"noise-multiplier": ""} | needs[name] if name in needs else {}
        assert registry.from_config(name, {**config, "algorithm": name, **given}) == (
            registry.settings(name, **needs.get(name, {}))
        )


@pytest.mark.parametrize(
    ("name", "config", "message"),
    [
        ("dp-fedavg", {"client-rate": "most"}, "client-rate must be a number; got 'most'"),
        ("dp-fedavg", {"clip": ""}, "clip must be a number; got '' (only optional settings"),
        ("dp-ftrl", {"cohort": 2.5}, "cohort must be an integer; got 2.5"),
        ("fed-dp-pso", {"reading-tensor-coefficients": "maybe"}, "reading-tensor-coefficients"),
        ("fed-dp-pso", {"reading": "mine"}, "unknown reading 'mine'; choose one of 'paper'"),
        ("fed-dp-pso", {"buffer-epsilons": "2 x"}, "buffer-epsilons must be a number; got 'x'"),
        # a refused value names its key, as the run configuration spells it
        ("dp-ftrl", {"min-separation": 0}, "min-separation must be >= 1; got 0"),
        (
            "fed-dp-pso",
            {"refine-start": "best"},
            "unknown refine-start 'best' (did you mean 'pbest'?); choose one",
        ),
    ],
)
def test_a_bad_run_configuration_value_is_one_line_naming_its_key(name, config, message):
    with pytest.raises(ValueError) as err:
        registry.from_config(name, config)
    assert _one_line(err).startswith(message)


def test_the_flower_task_refuses_a_bad_setting_before_reading_any_data(monkeypatch):
    from swarmjax.fl.runtime.flower import tasks

    def no_data(*args, **kwargs):
        raise AssertionError("the data was read before the settings were checked")

    monkeypatch.setattr(tasks, "digits_clients", no_data)
    with pytest.raises(ValueError, match=r"^client-rate must be in \(0.0, 1.0\]; got 0"):
        tasks.digits({"algorithm": "dp-fedavg", "client-rate": 0})
    with pytest.raises(ValueError, match=r"^set one of epsilon and noise-multiplier \("):
        tasks.digits({"algorithm": "dp-ftrl", "noise-multiplier": ""})


def _base(num_clients: int = 40) -> registry.Base:
    model = mlp((4,), 10, (8, 8, 1))
    spec = RunSpec(4, 1e-3, (0,))
    return registry.Base(model, LocalTraining(batch_size=5), spec, num_clients)


def test_one_build_for_noise_given_or_calibrated():
    alg, grid = registry.build("dp-fedavg", _base(2000), typed.DpFedAvgSettings(client_rate=0.01))
    assert grid["noise_multiplier"] == [1.0] and "epsilon_target" not in grid
    assert grid["sample_rate"] == 0.01 and alg.plan.adaptive
    assert alg.plan.participation == Poisson()  # no target to size a buffer for
    chosen = typed.DpFedAvgSettings(client_rate=0.01, epsilon=4.0, noise_multiplier=None)
    alg, grid = registry.build("dp-fedavg", _base(2000), chosen)
    assert grid["epsilon_target"] == [4.0] and "noise_multiplier" not in grid
    # the buffer sized for the run's target: 96 slots of 2,000 clients
    assert alg.plan.participation == Poisson(capacity=96)


def test_a_build_refuses_another_algorithms_settings_and_pso_without_sizes():
    with pytest.raises(ValueError) as err:
        registry.build("fedprox", _base(), typed.FedAvgSettings())
    assert _one_line(err) == "fedprox takes FedProxSettings; got FedAvgSettings"
    with pytest.raises(ValueError, match="record-level DP needs the clients' sizes"):
        registry.build("fed-dp-pso", _base(), typed.FedDpPsoSettings())
    with pytest.raises(ValueError, match="record-level DP needs the clients' sizes"):
        registry.build("fedavg", _base(), typed.FedAvgSettings(record_epsilon=4.0))
    sized = replace(_base().training, record_dp=RecordDP(capacity=9))
    with pytest.raises(ValueError) as err:  # one way to size record-level DP: the settings
        registry.build("fedavg", replace(_base(), training=sized))
    assert _one_line(err).startswith("Base.training.record_dp must be None")
    audited = replace(_base(), audit=CanaryAudit(8, score="gradient"))
    with pytest.raises(ValueError) as err:  # user-level runs are audited by simulate
        registry.build("dp-fedavg", audited)
    assert _one_line(err).startswith("Base.audit: dp-fedavg carries no record-level canaries")
    with pytest.raises(ValueError, match=r"^Base\.audit needs record-level DP to audit: set"):
        registry.build("fedavg", audited)  # no target: no DP


def test_the_settings_the_experiments_build_with():
    """What the single-algorithm experiments set through the registry: DP-FedAvg's server
    momentum and a buffer sized for a sweep's largest target, FedAvg's record-level DP,
    Fed-DP-PSO's buffer shared by a sweep, combined learning and clients alone."""
    sizes = np.full(40, 50)
    base = replace(_base(2000), sizes=None)
    chosen = typed.DpFedAvgSettings(client_rate=0.01, server_momentum=0.9, buffer_epsilon=4.0)
    alg, grid = registry.build("dp-fedavg", base, chosen)
    assert alg.algorithm.server_momentum == 0.9 and grid["noise_multiplier"] == [1.0]
    assert alg.plan.participation == Poisson(capacity=96)  # as if calibrated to 4.0
    at_two = replace(chosen, epsilon=2.0, noise_multiplier=None)
    assert registry.build("dp-fedavg", base, at_two)[0] == alg  # one program for both
    assert registry.settings("dp-fedavg", noise_multiplier=0.0).noise_multiplier == 0.0
    base = replace(_base(), sizes=sizes)
    plain, grid = registry.build("fedavg", base)
    assert plain.training.record_dp is None and "epsilon_target" not in grid
    private, grid = registry.build("fedavg", base, typed.FedAvgSettings(record_epsilon=4.0))
    assert private.training.record_dp.capacity > 0 and grid["epsilon_target"] == [4.0]
    assert private.training.batch_size == base.training.batch_size
    lone = typed.FedDpPsoSettings(target_epsilon=2.0)
    swept = replace(lone, buffer_epsilons=(2.0, 8.0))
    alone, _ = registry.build("fed-dp-pso", replace(base, sizes=[sizes, sizes[:20]]), lone)
    shared, _ = registry.build("fed-dp-pso", replace(base, sizes=[sizes]), swept)
    at_eight, _ = registry.build(
        "fed-dp-pso", replace(base, sizes=[sizes]), typed.FedDpPsoSettings(target_epsilon=8.0)
    )
    assert shared.training.record_dp == at_eight.training.record_dp  # sized for the largest
    assert alone.training.record_dp is not None
    combined, grid = registry.build("combined", base, typed.CombinedSettings(conv=0.05))
    assert combined.combine.conv == 0.05 and grid == {"learning_rate": 0.1}
    alone, grid = registry.build(
        "local-only", base, typed.LocalOnlySettings(keep_optimizer_state=True)
    )
    assert alone.keep_optimizer_state and grid == {"learning_rate": 0.1}


def test_a_cross_device_run_becomes_each_algorithms_own_settings():
    run = registry.CrossDeviceRun(
        mlp((4,), 10, (8, 8, 1)),
        40,
        5,
        RunSpec(4, 1e-3, (0,)),
        LocalTraining(batch_size=5),
        epsilon=3.0,
        clip=0.4,
        options={"factorization": "prefix-sum", "noise_cohort": None},
    )
    values = registry.lookup("dp-ftrl").from_run(run)
    s = registry.settings("dp-ftrl", **values)
    assert s == typed.DpFtrlSettings(
        cohort=5,
        factorization="prefix-sum",
        clip=0.4,
        clipping="fixed",
        epsilon=3.0,
        noise_multiplier=None,
    )
    fedadam = registry.settings("fedadam", **registry.lookup("fedadam").from_run(run))
    assert fedadam == typed.FedAvgSettings(server_lr=0.01, server_optimizer="adam", cohort=5)
    prox = registry.settings("fedprox", **registry.lookup("fedprox").from_run(run))
    assert prox == typed.FedProxSettings(cohort=5)
    plain = replace(run, options={})  # DP-FTRL's options are no setting of DP-FedAvg
    rate = registry.settings("dp-fedavg", **registry.lookup("dp-fedavg").from_run(plain))
    assert math.isclose(rate.client_rate, 5 / 40) and rate.clipping == "fixed"
    assert typed.DistributedDpSettings(epsilon=3.0).bits == 16
