"""Runtimes that execute any protocol algorithm: the in-process simulator (the Flower
runtime, ``swarmjax.fl.runtime.flower``, sits beside it)."""

from swarmjax.fl.runtime.result import PrivacyRecord, Result
from swarmjax.fl.runtime.simulator import simulate

__all__ = ["PrivacyRecord", "Result", "simulate"]
