"""Old import paths of modules that moved when ``swarmjax.fl`` was cut by role (data/,
client/, algorithms/, runtime/). Kept for one release: importing an old path gives the
module at its new path (the same module object) and a ``DeprecationWarning``."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType

MOVED = {
    "swarmjax.fl.clients": "swarmjax.fl.data.clients",
    "swarmjax.fl.partition": "swarmjax.fl.data.partition",
    "swarmjax.fl.client_training": "swarmjax.fl.client.training",
    "swarmjax.fl.local": "swarmjax.fl.client.local",
    "swarmjax.fl.dp_local": "swarmjax.fl.client.record_dp",
    "swarmjax.fl.combined": "swarmjax.fl.algorithms.combined",
    "swarmjax.fl.cl_models": "swarmjax.fl.algorithms.combined_models",
    "swarmjax.flower": "swarmjax.fl.runtime.flower",
}


def new_name(old: str) -> str | None:
    """The current module path of ``old`` (also for submodules of a moved package)."""
    for prefix, target in MOVED.items():
        if old == prefix or old.startswith(prefix + "."):
            return target + old[len(prefix) :]
    return None


class _Loader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.target}; the old path goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self.target)
        sys.modules[spec.name] = module
        return module

    def exec_module(self, module: ModuleType) -> None:
        del module  # already executed under its new name


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None, target: object = None):
        del path, target
        new = new_name(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _Loader(new))


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
