"""Edges of the experiments' command line (issue 50): each is one line, before any work.

Options given twice, list options naming a value twice, a supplied secret file that is too
short or unreadable, a second run into an --out folder in use, a corrupt saved call (it
names the file and --restart), a folder holding another run, and Ctrl-C (a resume hint,
exit 130, no traceback).
"""

from __future__ import annotations

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
        (["--epsilon", "4", "--epsilon", "8"], "--epsilon is given twice"),
        (["--epsilon", "4", "--epsilon=8"], "--epsilon is given twice"),
        (["--rounds", "3", "--rounds", "5"], "--rounds is given twice"),
        (["--epsilon", "5", "5"], "--epsilon lists 5 more than once"),
        (["--algorithm", "fedavg", "fedavg"], "--algorithm lists fedavg more than once"),
        (["--epsilon", "1e9"], "--epsilon: must be at most 700"),
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
