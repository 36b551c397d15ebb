"""``simulate``/``start``/``finish`` take at most 8 parameters (issue 46): how a call runs is
one :class:`Execution`, what it publishes one :class:`Publication`, and
``common_random_numbers`` lives in the call's :class:`RunSpec`. The former keyword
arguments are refused with one line naming their new home; a bad option is refused when
its :class:`Execution` is built, before any work. None of these tests compiles anything."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest
from jax.sharding import Mesh

from swarmjax.fl.protocol import RunSpec
from swarmjax.fl.runtime import Execution, Publication, finish, simulate, start
from swarmjax.fl.runtime.execution import MOVED

EXECUTION = {f.name for f in dataclasses.fields(Execution)}


def test_the_entry_points_take_at_most_eight_parameters():
    for fn in (simulate, start, finish):
        assert len(inspect.signature(fn).parameters) <= 8, fn.__name__
    assert list(inspect.signature(simulate).parameters)[4:] == [
        "secret",
        "audit",
        "publication",
        "execution",
    ]


@pytest.mark.parametrize("name", sorted(MOVED))
def test_every_former_keyword_is_refused_with_its_new_home(name):
    """Refused before the arguments are looked at (``None`` everywhere): one line that
    names the option and where it lives now."""
    for fn, args in ((simulate, (None,) * 4), (start, (None,) * 4), (finish, (None,))):
        with pytest.raises(TypeError) as err:
            fn(*args, **{name: None})
        line = str(err.value)
        assert "\n" not in line
        assert line.startswith(f"{fn.__name__}({name}=...) moved: pass ")
    if name in EXECUTION:
        assert line.endswith(f"execution=Execution({name}=...)")
    elif name == "common_random_numbers":
        assert "RunSpec(" in line
    else:
        assert "publication=Publication(" in line


def test_the_moved_table_covers_the_former_signature():
    former = {
        *("client_map", "rounds_per_call", "mesh", "clients_per_device", "checkpoint_dir"),
        *("progress", "callbacks", "diagnostics", "ledger", "release_path", "data_source"),
        "common_random_numbers",
    }
    assert set(MOVED) == former and EXECUTION < former
    assert str(_refusal(simulate, "release_path")) == (
        "simulate(release_path=...) moved: pass publication=Publication(path=...)"
    )


def _refusal(fn, name):
    with pytest.raises(TypeError) as err:
        fn(None, None, None, None, **{name: 1})
    return err.value


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"client_map": "loop"}, r"^unknown client_map 'loop'; choose one of 'vmap', 'sequential'"),
        ({"client_map": 0}, r"^client_map must be 'vmap', 'sequential' or an int >= 1; got 0"),
        ({"client_map": True}, r"^unknown client_map True"),
        ({"rounds_per_call": 0}, r"^rounds_per_call must be >= 1; got 0"),
        ({"rounds_per_call": 1.5}, r"^rounds_per_call must be an integer"),
        ({"clients_per_device": 0}, r"^clients_per_device must be an int >= 1; got 0"),
        ({"mesh": "cpu"}, r"^mesh must be a jax.sharding.Mesh or None; got str"),
        ({"mesh": object(), "clients_per_device": 2}, r"^pass mesh= or clients_per_device="),
        ({"checkpoint_dir": 3}, r"^checkpoint_dir must be a folder .*; got int"),
        ({"progress": "yes"}, r"^progress must be True, False or None; got 'yes'"),
        ({"diagnostics": None}, r"^diagnostics must be True or False; got None"),
        ({"callbacks": print}, r"^callbacks must be a sequence of callback"),
        ({"callbacks": [print, 3]}, r"^callbacks\[1\] must be a callable"),
    ],
)
def test_a_bad_execution_field_is_refused_at_construction(fields, message):
    with pytest.raises(ValueError, match=message) as err:
        Execution(**fields)
    assert "\n" not in str(err.value)


def test_flags_take_numpy_bools_as_python_bools_in_both_checks():
    """One check (``_validation.check_bool``) serves Execution's flags and RunSpec's."""
    import numpy as np

    run = Execution(progress=np.bool_(False), diagnostics=np.bool_(True))
    assert run.progress is False and run.diagnostics is True
    assert RunSpec(2, 1e-5, common_random_numbers=np.bool_(True)).common_random_numbers is True
    assert Execution(progress=None).progress is None


def test_a_mesh_without_a_clients_axis_is_refused_at_construction():
    import jax
    import numpy as np

    with pytest.raises(ValueError, match=r"^mesh must have a 'clients' axis"):
        Execution(mesh=Mesh(np.asarray(jax.devices()[:1]), ("data",)))


def test_the_defaults_and_what_is_kept():
    default = Execution()
    assert default.client_map == "vmap" and default.rounds_per_call is None
    assert default.mesh is None and default.clients_per_device is None
    assert default.checkpoint_dir is None and default.progress is None
    assert default.callbacks == () and default.diagnostics is False
    assert Execution(callbacks=[print]).callbacks == (print,)  # a tuple: the call's own
    assert Execution(client_map=None).client_map is None  # the device's choice, at start
    assert Publication() == Publication(None, None, None)
    assert RunSpec(2, 1e-5).common_random_numbers is False
    assert RunSpec(2, 1e-5, common_random_numbers=True).common_random_numbers is True


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"ledger": "ledger.json"}, r"^ledger must be a swarmjax.privacy.ledger.Ledger or None"),
        ({"path": 3}, r"^path must be a str or os.PathLike or None; got int"),
        ({"data_source": 3}, r"^data_source must be a str or None; got int"),
    ],
)
def test_a_bad_release_field_is_refused_at_construction(fields, message):
    with pytest.raises(ValueError, match=message):
        Publication(**fields)


def test_options_of_the_wrong_kind_and_a_bad_spec_are_refused():
    with pytest.raises(
        ValueError, match=r"^execution must be Execution\(\.\.\.\) or None; got dict"
    ):
        simulate(None, None, None, None, execution={"progress": False})
    with pytest.raises(
        ValueError, match=r"^publication must be Publication\(\.\.\.\) or None; got str"
    ):
        simulate(None, None, None, None, publication="runs.csv")
    with pytest.raises(ValueError, match=r"^common_random_numbers must be True or False"):
        RunSpec(2, 1e-5, common_random_numbers=1)


@pytest.mark.parametrize(
    ("seeds", "message"),
    [
        ("12", "seeds must be one or more integers >= 0; got '12'"),  # not seeds 1 and 2
        ((1.5,), "seeds must be an integer; got 1.5"),  # not seed 1
        (True, "seeds must be an integer; got True"),
        (3.0, "seeds must be one or more integers >= 0; got 3.0"),
        (None, "seeds must be one or more integers >= 0; got None"),
        ((0, 0), "seeds has repeated values"),  # the same run twice
        ((0, -1), "seeds must be >= 0; got -1"),
    ],
)
def test_run_spec_seeds_are_distinct_integers(seeds, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        RunSpec(2, 1e-5, seeds=seeds)


def test_run_spec_takes_numpy_numbers_and_names_a_near_miss_accountant():
    import numpy as np

    spec = RunSpec(np.int64(2), np.float32(1e-5), seeds=np.arange(2))
    assert spec.rounds == 2 and spec.seeds == (0, 1) and 0 < spec.delta < 1
    with pytest.raises(ValueError, match=r"delta must be a number in \(0, 1\); got True"):
        RunSpec(2, True)
    with pytest.raises(ValueError, match=r"'PLD' \(did you mean 'pld'\?\)"):
        RunSpec(2, 1e-5, accountant="PLD")


def test_a_checkpoint_dir_that_is_empty_or_a_file_is_refused_at_construction(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="checkpoint_dir must name a folder"):
        Execution(checkpoint_dir="")
    with pytest.raises(ValueError, match=r"checkpoint_dir .* exists and is not a folder"):
        Execution(checkpoint_dir=tmp_path / "file")
    assert Execution(checkpoint_dir=tmp_path / "new").checkpoint_dir == tmp_path / "new"
