"""Old module paths (before swarmjax.fl was cut by role) still import, for one release, as
the very same module objects, with a DeprecationWarning."""

import importlib
import sys

import pytest

from swarmjax import _moved


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_old_path_is_the_new_module(old):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match="moved to"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(_moved.MOVED[old])


def test_submodule_of_a_moved_package():
    sys.modules.pop("swarmjax.flower.records", None)
    with pytest.warns(DeprecationWarning):
        old = importlib.import_module("swarmjax.flower.records")
    assert old is importlib.import_module("swarmjax.fl.runtime.flower.records")
    assert _moved.new_name("swarmjax.fl.protocol") is None
