"""Every experiment script refuses bad command-line input before any work.

One line on stderr naming the option, exit status 2, no traceback; the compute and data
loading functions are replaced by ones that fail, so a refusal that came late would show.
"""

from __future__ import annotations

import os

import pytest

from experiments import _cli, apdim, combined_learning, dp_fedavg, fed_dp_pso, paaso
from swarmjax.resume import CallStore

MISSING = "/nonexistent/swarmjax-data"


def _no_work(*args, **kwargs):
    raise AssertionError("work started before the arguments were checked")


@pytest.fixture(autouse=True)
def _forbid_work(monkeypatch):
    monkeypatch.setattr(_cli, "load_dataset", _no_work)  # dp_fedavg loads through _cli
    monkeypatch.setattr(combined_learning, "load_dataset", _no_work)
    monkeypatch.setattr(apdim, "load_split", _no_work)
    monkeypatch.setattr(fed_dp_pso, "run_dataset", _no_work)
    monkeypatch.setattr(paaso, "_setup_devices", _no_work)


BAD = [
    (dp_fedavg, ["--rounds", "0"], "--rounds"),
    (dp_fedavg, ["--clients", "0"], "--clients"),
    (dp_fedavg, ["--seeds", "0"], "--seeds"),
    (dp_fedavg, ["--seeds", "2", "5"], "unrecognized"),  # a count, not a list
    (dp_fedavg, ["--epsilons", "nan"], "--epsilons"),
    (dp_fedavg, ["--data-dir", MISSING], "--data-dir"),
    (dp_fedavg, ["--accountant", "gdp"], "--accountant"),
    (dp_fedavg, ["--delta", "1.5"], "--delta"),
    (dp_fedavg, ["--delta", "0"], "--delta"),
    (combined_learning, ["--rounds", "0"], "--rounds"),
    (combined_learning, ["--seeds", "0"], "--seeds"),
    (combined_learning, ["--datasets", "mnist", "--data-dir", MISSING], "--data-dir"),
    (combined_learning, ["--datasets", "breast_cancer", "--models", "conv"], "--models"),
    (apdim, ["--seeds", "-3"], "--seeds"),
    (apdim, ["--data-dir", MISSING], "--data-dir"),
    (apdim, ["--accountant", "gdp"], "--accountant"),
    (fed_dp_pso, ["--datasets", "mnist", "foo"], "--datasets"),
    (fed_dp_pso, ["--rounds", "0"], "--rounds"),
    (fed_dp_pso, ["--datasets", "mnist", "--data-dir", MISSING], "--data-dir"),
    (fed_dp_pso, ["--learning-rate", "-1"], "--learning-rate"),
    (fed_dp_pso, ["--delta", "1.5"], "--delta"),
    (paaso, ["--runs", "0"], "--runs"),
    (paaso, ["--quick", "--full"], "--full"),
    (paaso, ["--delta", "0"], "--delta"),
]


@pytest.mark.parametrize(
    ("module", "argv", "named"), BAD, ids=[f"{m.__name__[12:]} {' '.join(a)}" for m, a, _ in BAD]
)
def test_bad_input_exits_2_with_one_line(module, argv, named, capsys, monkeypatch):
    monkeypatch.delenv("SWARMJAX_DATA", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        module.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert named in err


def test_data_dir_never_falls_back(tmp_path, monkeypatch):
    monkeypatch.setenv("SWARMJAX_DATA", str(tmp_path))
    with pytest.raises(_cli.UserError, match="--data-dir"):
        _cli.data_dir(MISSING)  # given but missing: not replaced by $SWARMJAX_DATA
    monkeypatch.setenv("SWARMJAX_DATA", MISSING)
    with pytest.raises(_cli.UserError, match="SWARMJAX_DATA"):
        _cli.data_dir(None)
    assert _cli.data_dir(tmp_path) == tmp_path
    with pytest.raises(_cli.UserError, match="lacks tabular"):
        _cli.data_dir(tmp_path, needs=["tabular"])


def test_results_default_to_the_repository_results_folder():
    for module in (dp_fedavg, combined_learning, apdim, fed_dp_pso, paaso):
        name = module.__name__.split(".")[-1]
        args = module.parse_args([])
        assert args.out == _cli.RESULTS / name


def test_changed_code_never_reuses_a_saved_call(tmp_path):
    script = tmp_path / "experiment.py"
    script.write_text("RATE = 1\n")
    first = CallStore(tmp_path / "calls", {"lr": 0.1}, code=[script])
    assert first.folder == CallStore(tmp_path / "calls", {"lr": 0.1}, code=[script]).folder
    script.write_text("RATE = 2\n")
    assert CallStore(tmp_path / "calls", {"lr": 0.1}, code=[script]).folder != first.folder
    with pytest.raises(ValueError, match="code"):
        CallStore(tmp_path / "calls", {"code": "mine"})


def test_an_unwritable_out_folder_is_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    """Results and the privacy ledger go to --out: a folder that cannot be written (here: its
    parent is a file, which fails even for root) is refused before the data is touched."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SWARMJAX_DATA", str(tmp_path))
    with pytest.raises(SystemExit) as exit_info:
        dp_fedavg.main(["--quick", "--out", str(blocker / "out")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--out" in err and "writable" in err


_DATA_ENV: dict[str, str | None] = {}


def test_a_data_folder_an_experiment_exports_is_undone_after_its_test_1(tmp_path):
    """An experiment exports its --data-dir as $SWARMJAX_DATA (for the processes it
    starts); tests/conftest.py undoes it after the test, also when the variable was unset
    before (as on CI), so a temporary folder never becomes a later test's data folder.
    The second half is the next test (one worker runs a module's tests in order)."""
    _DATA_ENV["before"] = os.environ.get("SWARMJAX_DATA")
    os.environ["SWARMJAX_DATA"] = str(tmp_path)


def test_a_data_folder_an_experiment_exports_is_undone_after_its_test_2():
    assert "before" in _DATA_ENV, "the first half runs first, on this worker"
    assert os.environ.get("SWARMJAX_DATA") == _DATA_ENV["before"]


def test_the_jax_cache_option_keeps_compiled_programs_where_it_says(tmp_path, monkeypatch):
    """``--jax-cache DIR`` points JAX's persistent compilation cache at DIR (created
    owner-only: compiled programs keep their constants) and keeps every program however
    fast it compiled; ``''`` keeps none; without the option nothing changes (no cache, or
    ``$JAX_COMPILATION_CACHE_DIR``, read by JAX itself, as this suite sets it). Nothing
    compiles while the setting is changed, and it is restored after."""
    import stat

    import jax

    saved = jax.config.jax_compilation_cache_dir
    threshold = jax.config.jax_persistent_cache_min_compile_time_secs
    p = _cli.parser("x", "", quick="", full="")
    try:
        _cli.process_options(p.parse_args(["--jax-cache", str(tmp_path / "jit")]))
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "jit")
        assert stat.S_IMODE((tmp_path / "jit").stat().st_mode) == 0o700
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
        _cli.process_options(p.parse_args(["--jax-cache", ""]))
        assert jax.config.jax_compilation_cache_dir is None
        for env in (str(tmp_path / "env"), None):  # the environment's choice, or none, stands
            if env is None:
                monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
            else:
                monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", env)
            _cli.process_options(p.parse_args([]))
            assert jax.config.jax_compilation_cache_dir is None
    finally:
        jax.config.update("jax_compilation_cache_dir", saved)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", threshold)


def test_a_jax_cache_that_cannot_be_made_is_one_line_before_any_work(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    argv = ["--quick", "--out", str(tmp_path / "out"), "--jax-cache", str(blocker / "jit")]
    with pytest.raises(SystemExit) as exit_info:
        paaso.main(argv)  # _setup_devices fails the test if it is reached
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--jax-cache" in err and "Traceback" not in err


ALL_EXPERIMENTS = [
    "apdim",
    "combined_learning",
    "cross_device",
    "dp_fedavg",
    "fed_dp_pso",
    "fed_dp_pso_study",
    "lora",
    "paaso",
    "shakespeare",
]


@pytest.mark.parametrize("name", ALL_EXPERIMENTS)
def test_every_experiment_takes_the_shared_process_options(name, capsys):
    """``--no-progress`` and ``--jax-cache`` are on every experiment's ``--help``."""
    import importlib

    module = importlib.import_module(f"experiments.{name}")
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--help"])
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    assert "--no-progress" in shown and "--jax-cache" in shown


def test_no_progress_turns_off_every_bar_of_the_process(capsys):
    """``--no-progress`` sets ``TQDM_DISABLE`` for the process (and the processes it
    starts): :func:`_cli.progress_bars`, which the experiments hand their own bars and the
    simulator, says no. Undone after the test (tests/conftest.py), as the next test
    checks."""
    from tqdm.auto import tqdm

    p = _cli.parser("x", "", quick="", full="")
    os.environ.pop("TQDM_DISABLE", None)
    _cli.process_options(p.parse_args([]))
    assert _cli.progress_bars()
    _cli.process_options(p.parse_args(["--no-progress"]))
    assert not _cli.progress_bars()
    for _ in tqdm(range(3), desc="a bar that must not show", disable=not _cli.progress_bars()):
        pass
    assert "a bar that must not show" not in capsys.readouterr().err


def test_no_progress_is_undone_after_its_test():
    assert os.environ.get("TQDM_DISABLE") != "1"
    assert _cli.progress_bars()
