"""Edges of the experiments' command line (issue 50): each is one line, before any work.

Options given twice, list options naming a value twice, a supplied secret file that is too
short or unreadable, a second run into an --out folder in use, a corrupt saved call (it
names the file and --restart), a folder holding another run, and Ctrl-C (a resume hint,
exit 130, no traceback).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from experiments import _cli, cross_device, dp_fedavg
from swarmjax.resume import CallStore, OutputConflict
from tests.argv import refused

REPO = Path(__file__).resolve().parents[1]


def _no_work(*args, **kwargs):
    raise AssertionError("work started before the arguments were checked")


@pytest.fixture(autouse=True)
def _forbid_work(monkeypatch):
    for module, name in [(cross_device, "simulate"), (cross_device, "partition")]:
        monkeypatch.setattr(module, name, _no_work)
    monkeypatch.setattr(dp_fedavg, "simulate", _no_work)
    monkeypatch.setattr(dp_fedavg, "make_clients", _no_work)


_refused = refused


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--epsilons", "4", "--epsilons", "8"], "--epsilons is given twice"),
        (["--epsilons", "4", "--epsilons=8"], "--epsilons is given twice"),
        (["--rounds", "3", "--rounds", "5"], "--rounds is given twice"),
        (["--epsilons", "5", "5"], "--epsilons lists 5 more than once"),
        (["--algorithms", "fedavg", "fedavg"], "--algorithms lists fedavg more than once"),
        (["--epsilons", "1e9"], "--epsilons: must be at most 700"),
    ],
)
def test_an_option_twice_or_a_value_twice_is_one_line(argv, named, tmp_path, capsys):
    err = _refused(cross_device.main, ["--quick", "--out", str(tmp_path), *argv], capsys)
    assert named in err


def test_a_short_or_unreadable_secret_file_is_one_line(tmp_path, capsys):
    short = tmp_path / "short.key"
    short.write_bytes(b"0123456789")  # 80 bits
    err = _refused(
        cross_device.main, ["--quick", "--out", str(tmp_path), "--secret-file", str(short)], capsys
    )
    assert "--secret-file" in err and "too short" in err and "16 bytes" in err
    err = _refused(
        cross_device.main,
        ["--quick", "--out", str(tmp_path), "--secret-file", str(tmp_path / "missing.key")],
        capsys,
    )
    assert "--secret-file" in err and "cannot be read" in err


def test_a_second_run_into_a_folder_in_use_is_refused(tmp_path):
    """A separate process holds --out (as a running experiment does); this one is refused."""
    holder = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from experiments import _cli
        import argparse
        _cli.out_dir(argparse.Namespace(out={str(tmp_path)!r}))
        print("held", flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(_cli.UserError, match="in use by another run \\(pid"):
            _cli.out_dir(_ns(tmp_path))
    finally:
        proc.kill()
        proc.wait()
    assert _cli.out_dir(_ns(tmp_path)) == tmp_path  # free again once the holder is gone
    _cli.release_out_dir(tmp_path)


def _ns(out: Path):
    import argparse

    return argparse.Namespace(out=out)


def test_a_corrupt_saved_call_names_the_file_and_restart(tmp_path):
    store = CallStore(tmp_path, {"a": 1})
    store.fetch_or_run("one", lambda: (pd.DataFrame({"x": [1.0]}), {"v": 1}))
    payload = store.folder / "one.json"
    payload.write_text(payload.read_text()[:10])  # a truncated write
    again = CallStore(tmp_path, {"a": 1})
    with pytest.raises(OutputConflict) as info:
        again.fetch_or_run("one", lambda: (pd.DataFrame({"x": [2.0]}), {"v": 2}))
    message = str(info.value)
    assert str(payload) in message and "--restart" in message and "\n" not in message
    restarted = CallStore(tmp_path, {"a": 1}, restart=True)
    assert restarted.fetch_or_run("one", lambda: (pd.DataFrame({"x": [2.0]}), 2)).payload == 2
    json.loads(payload.read_text())  # rewritten whole


def test_entry_point_turns_conflicts_and_ctrl_c_into_one_line(capsys):
    @_cli.entry_point
    def conflict(argv=None):
        raise OutputConflict("out_dir 'x' holds results of a different sweep")

    @_cli.entry_point
    def interrupted(argv=None):
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as info:
        conflict([])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("holds results of a different sweep") and len(err.splitlines()) == 1
    with pytest.raises(SystemExit) as info:
        interrupted([])
    assert info.value.code == 130
    err = capsys.readouterr().err.strip()
    assert "interrupted" in err and "rerun the same command to resume" in err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


def test_client_inputs_on_another_scale_than_the_test_set_are_warned_about():
    """Raw 0-255 pixels in the clients beside a test set in [0, 1]: one warning line;
    matching scales: none."""
    import numpy as np

    from swarmjax.fl.data.clients import stack_clients
    from swarmjax.fl.runtime.simulator import warn_input_mismatch

    x = np.random.default_rng(0).integers(0, 256, (40, 4, 4, 1)).astype(np.float32)
    y = np.zeros(40, np.int32)
    clients = stack_clients(x, y, [np.arange(20), np.arange(20, 40)])
    with pytest.warns(UserWarning, match="differ in kind or scale"):
        warn_input_mismatch(clients, (x / 255, y))
    assert warn_input_mismatch(clients, (x, y)) is None
    # a flat store keeps uint8 codes and their float values: compared by value, no warning
    from swarmjax.fl.data import ClientStore

    pixels = np.random.default_rng(1).integers(0, 256, (40, 4, 4, 1)).astype(np.uint8)
    store = ClientStore.build(
        pixels.astype(np.float32) / 255, y, [np.arange(20), np.arange(20, 40)]
    )
    assert warn_input_mismatch(store, (pixels.astype(np.float32) / 255, y)) is None
    with pytest.warns(UserWarning, match="differ in kind or scale"):
        warn_input_mismatch(store, (pixels.astype(np.float32), y))


def test_a_dirichlet_refusal_summarises_the_client_sizes():
    import numpy as np

    from swarmjax.fl.data.partition import dirichlet_partition

    y = np.random.default_rng(0).integers(0, 10, 20000)
    with pytest.raises(ValueError) as info:
        dirichlet_partition(y, 1500, 0.05, min_partition_size=10, max_attempts=1)
    message = str(info.value)
    assert len(message) < 400 and "clients below 10" in message and "median" in message


@pytest.mark.parametrize(
    ("main", "argv", "named"),
    [
        (cross_device.main, ["--epsilon", "4"], "--epsilon is now --epsilons"),
        (cross_device.main, ["--dataset", "digits"], "--dataset is now --datasets"),
        (cross_device.main, ["--algorithm=fedavg"], "--algorithm is now --algorithms"),
        (dp_fedavg.main, ["--epsilon", "4"], "--epsilon is now --epsilons"),
    ],
)
def test_a_former_option_name_names_the_new_one(main, argv, named, tmp_path, capsys):
    """One name for one thing (issue 50 item 5): a former name is refused, never read as an
    abbreviation of the new one."""
    assert named in _refused(main, ["--quick", "--out", str(tmp_path), *argv], capsys)


def test_fed_dp_pso_former_lr_names_learning_rate(tmp_path, capsys):
    from experiments import fed_dp_pso

    err = _refused(fed_dp_pso.main, ["--quick", "--out", str(tmp_path), "--lr", "0.1"], capsys)
    assert "--lr is now --learning-rate" in err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--datasets", "mnist", "digits"], "runs one dataset per call"),
        (["--max-examples", "5", "--batch-size", "10"], "--max-examples 5 must be at least"),
        (["--max-examples", "5"], "at least the batch size of 10 (the profile's"),
        (["--model", "resnet"], "--model: invalid choice"),
        (["--model", "lenet5", "--datasets", "digits"], "--model lenet5 needs 28x28 examples"),
        (["--learning-rate", "0"], "--learning-rate"),
    ],
)
def test_cross_device_training_options_are_checked_first(argv, named, tmp_path, capsys):
    """The model and training options (issue 50 item 3) are checked before any work."""
    err = _refused(cross_device.main, ["--quick", "--out", str(tmp_path), *argv], capsys)
    assert named in err


def test_cross_device_training_options_reach_the_run():
    """--model, --batch-size, --epochs, --learning-rate, --server-lr, --clip and
    --max-examples set the registry's run and the memory estimate."""
    argv = ["--quick", "--model", "mlp", "--batch-size", "5", "--epochs", "2"]
    argv += ["--learning-rate", "0.05", "--server-lr", "0.5", "--clip", "1.5"]
    argv += ["--max-examples", "20"]
    args = cross_device._parser().parse_args(argv)
    prof = cross_device.profile(args)
    run = cross_device.cross_device_run(prof, "dp-fedavg", 8.0)
    assert run.model.name == "mlp_784-256-256-10"
    assert (run.training.batch_size, run.training.epochs, run.training.max_examples) == (5, 2, 20)
    assert (run.learning_rate, run.server_lr, run.clip) == (0.05, 0.5, 1.5)
    capped = cross_device.memory_estimate(prof)
    whole = cross_device.memory_estimate(dataclasses.replace(prof, max_examples=None))
    cnn = cross_device.memory_estimate(dataclasses.replace(prof, model="simple_cnn"))
    assert capped < whole < cnn  # 20 of 50 rows per slot; the MLP has 4.5x fewer parameters


def test_pace_prints_the_time_left_once_and_warns_past_an_hour(capsys):
    """After the second round it sees: one compiled round's seconds times the rounds left
    (this run's and the later runs'), plus each later run's compilation; a warning line with
    the options that shorten it past an hour."""
    ticks = iter([0.0, 30.0, 32.0, 99.0])  # start, round 1 (compiles), round 2, later rounds
    pace = _cli.Pace(10, later_rounds=20, later_runs=2, clock=lambda: next(ticks))
    pace(1, {}, None)
    assert capsys.readouterr().out == ""
    pace(2, {}, None)
    line = capsys.readouterr().out.strip()
    # 2 s a round x (8 + 20) rounds + 2 x (30 - 2) s of compilation = 112 s
    assert "2 s a round" in line and "30 s the first" in line and "about 2 min left" in line
    assert "(28 rounds)" in line and "GiB peak memory" in line and "warning" not in line
    pace(3, {}, None)  # printed once
    assert capsys.readouterr().out == ""
    ticks = iter([0.0, 10.0, 20.0])
    slow = _cli.Pace(400, shorten="--rounds", clock=lambda: next(ticks))
    slow(1, {}, None)
    slow(2, {}, None)
    line = capsys.readouterr().out.strip()
    assert line.startswith("warning:") and "1.1 hours" in line and "--rounds shorten it" in line


def _exchanges(*summed: bool):
    """A stand-in algorithm: only its exchanges' ``aggregate_sum`` and ``max_selected``
    (what :func:`experiments._cli.layout` reads)."""
    from types import SimpleNamespace

    exchanges = [
        SimpleNamespace(aggregate_sum=(sum if s else None), max_selected=4) for s in summed
    ]
    return SimpleNamespace(exchanges=exchanges)


def test_devices_is_parsed_and_laid_out():
    """``--devices`` parses to an int (absent: ``None``, every device present); one device
    is no mesh (the one-device program), and the layout line says so."""
    p = _cli._Parser(prog="x")
    _cli.add_devices(p)
    assert p.parse_args(["--devices", "1"]).devices == 1
    assert p.parse_args([]).devices is None
    assert _cli.devices(p.parse_args([])) == _cli.devices(p.parse_args(["--devices", "1"])) == 1
    mesh, line = _cli.layout(_exchanges(True), 10, "fedavg", 1, asked=True)
    assert mesh is None and line == "one device: the cohort's 4 slots on cpu:0"


def test_an_unsummed_exchange_runs_on_one_device_or_is_refused():
    """An algorithm whose exchange is not summed: by default on one device, said in the
    layout line; with ``--devices`` > 1 asked, one line naming the option."""
    mesh, line = _cli.layout(_exchanges(True, False), 10, "local-only", 2, asked=False)
    assert mesh is None and "local-only's exchange is not summed: one device, not 2" in line
    with pytest.raises(_cli.UserError, match=r"^--devices 2: local-only's round exchange"):
        _cli.layout(_exchanges(True, False), 10, "local-only", 2, asked=True)
