"""Runtimes that execute any protocol algorithm: the in-process simulator (the Flower
runtime, ``swarmjax.fl.runtime.flower``, sits beside it). Names are imported on first
access, so a light submodule (the Flower relay ClientApp) does not pull in JAX.

``simulate`` runs a whole call; ``start`` / ``advance`` / ``finish`` are the same loop for a
user who owns it (own schedule, logging, early stopping). ``Execution`` says how a call
runs (client map, rounds per compiled call, mesh, checkpoints, progress, callbacks,
diagnostics: none of it changes the numbers) and ``Publication`` what it publishes (ledger,
path, data source)."""

import importlib

_LAZY = {
    "Execution": "execution",
    "PrivacyRecord": "result",
    "Publication": "result",
    "Result": "result",
    "Run": "simulator",
    "advance": "simulator",
    "finish": "simulator",
    "simulate": "simulator",
    "start": "simulator",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"swarmjax.fl.runtime.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'swarmjax.fl.runtime' has no attribute {name!r}")


__all__ = sorted(_LAZY)
