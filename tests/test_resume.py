"""``swarmjax.resume``: finished calls are saved, reused by settings, and never half-written."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from swarmjax.resume import CallStore, settings_id


def _call(value: float):
    table = pd.DataFrame(
        {
            "round": [1, 2],
            "accuracy": [0.5, value],
            "accuracy32": np.float32([1 / 3, value]),
            "epsilon": [1.0, math.inf],
            "name": ["a", "b"],
        }
    )
    return table, {
        "epsilon_max": math.inf,
        "std": math.nan,
        "sizes": np.arange(3, 5),
        "x": np.float32(0.5),
    }


def test_a_finished_call_is_reused_with_its_exact_numbers(tmp_path) -> None:
    store = CallStore(tmp_path, {"lr": 0.005})
    table, payload, reused = store.fetch_or_run("mnist_iid_eps5", lambda: _call(0.1 + 0.2))
    assert not reused and payload["sizes"] == [3, 4]  # as a rerun will see it

    def must_not_run():
        raise AssertionError("a finished call ran again")

    again = CallStore(tmp_path, {"lr": 0.005})
    table2, payload2, reused2 = again.fetch_or_run("mnist_iid_eps5", must_not_run)
    assert reused2 and again.reused == ["mnist_iid_eps5"]
    pd.testing.assert_frame_equal(table2, table)  # exact: 0.1 + 0.2, float32 1/3
    assert payload2["epsilon_max"] == math.inf and math.isnan(payload2["std"])
    assert payload2["sizes"] == [3, 4] and payload2["x"] == 0.5


def test_other_settings_or_restart_run_again(tmp_path) -> None:
    CallStore(tmp_path, {"lr": 0.005}).fetch_or_run("k", lambda: _call(0.9))
    assert settings_id({"lr": 0.005, "B": 256}) == settings_id({"B": 256, "lr": 0.005})
    other = CallStore(tmp_path, {"lr": 0.01})
    assert other.folder != CallStore(tmp_path, {"lr": 0.005}).folder
    assert not other.fetch_or_run("k", lambda: _call(0.7)).reused
    restarted = CallStore(tmp_path, {"lr": 0.005}, restart=True)
    table, _, reused = restarted.fetch_or_run("k", lambda: _call(0.3))
    assert not reused and table.accuracy.iloc[1] == 0.3
    # the restarted result replaced the old one
    assert (
        CallStore(tmp_path, {"lr": 0.005}).fetch_or_run("k", lambda: _call(0.0)).table.accuracy[1]
        == 0.3
    )


def test_a_failed_call_leaves_nothing_to_reuse(tmp_path) -> None:
    store = CallStore(tmp_path, {})

    def crash():
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        store.fetch_or_run("k", crash)
    assert not store.finished("k")
    assert sorted(p.name for p in store.folder.iterdir()) == ["settings.json"]


@pytest.mark.parametrize("key", ["", "../escape", "a/b", "with space", "_hidden"])
def test_bad_keys_are_rejected(tmp_path, key) -> None:
    with pytest.raises(ValueError, match="key"):
        CallStore(tmp_path, {}).fetch_or_run(key, lambda: _call(0.0))


def test_a_table_only_call(tmp_path) -> None:
    table = _call(0.25)[0]
    store = CallStore(tmp_path, {"n": 1})
    pd.testing.assert_frame_equal(store.fetch_or_run_table("t", lambda: table), table)
    again = CallStore(tmp_path, {"n": 1}).fetch_or_run_table("t", lambda: 1 / 0)
    pd.testing.assert_frame_equal(again, table)


def test_each_call_gets_its_own_secret_kept_for_a_resume(tmp_path) -> None:
    """``CallStore.secret``: a fresh secret per call (OS entropy), saved owner-only under the
    store's secret folder before it is used, so a rerun resuming the call draws the same
    numbers; another call, other settings or ``restart`` draw a fresh one; a supplied
    secret derives each call's (reproducible mode) and nothing is saved."""
    import stat

    from swarmjax.privacy.secret import Secret
    from tests.reproducible import OTHER, SECRET

    store = CallStore(tmp_path, {"lr": 0.005})
    first = store.secret("a")
    assert first.source == "entropy" and store.secret("a") is first
    saved = store.secret_folder / "a.key"
    assert saved.parent.name == "secret" and saved.parent.parent == store.folder
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert store.secret("b") != first
    resumed = CallStore(tmp_path, {"lr": 0.005}).secret("a")
    assert resumed == first and resumed.source == "entropy"
    assert CallStore(tmp_path, {"lr": 0.01}).secret("a") != first  # another folder
    restarted = CallStore(tmp_path, {"lr": 0.005}, restart=True)
    fresh = restarted.secret("a")
    assert fresh != first and restarted.secret("a") is fresh
    assert Secret.load(saved) == fresh  # the restart's secret replaced the old one
    supplied = CallStore(tmp_path / "r", {"lr": 0.005}, secret=SECRET)
    derived = supplied.secret("a")
    assert derived.source == "supplied" and derived not in (SECRET, supplied.secret("b"))
    assert CallStore(tmp_path / "r", {"lr": 0.005}, secret=SECRET).secret("a") == derived
    assert CallStore(tmp_path / "r", {"lr": 0.005}, secret=OTHER).secret("a") != derived
    assert not supplied.secret_folder.exists()
    with pytest.raises(ValueError, match="key"):
        store.secret("../escape")
