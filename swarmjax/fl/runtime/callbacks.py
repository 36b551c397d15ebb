"""Per-round callbacks: watch a simulation while it runs (TensorBoard, CSV, JSON lines).

A callback is any callable ``callback(round, metrics, runs)`` called once per finished round,
in round order:

- ``round``: the round just finished (``1 .. spec.rounds``);
- ``metrics``: ``{name: (runs,) array}``, that round's public metrics of every run (the
  algorithm's test-set metrics, e.g. ``test_accuracy``, and ``selected``, the clients that
  took part when the exchange makes that count public);
- ``runs``: a ``pandas.DataFrame`` with one row per run (its variant's labels and its
  seed), the same rows as ``Result.runs``.

:func:`~swarmjax.fl.runtime.simulator.simulate` takes
``execution=Execution(callbacks=(...))``; a loop of your own over
:func:`~swarmjax.fl.runtime.simulator.advance` calls :func:`notify` with what ``advance``
returned.  Ready adapters: :class:`JsonLines` and :class:`CsvRows` (a line per
(round, run), flushed every round, so ``tail -f`` follows a run) and :class:`TensorBoard`
(event files through ``tensorboardX``'s writer, one scalar series per metric and run;
``tensorboard --logdir DIR`` shows them).  Metrics are public values (test-set scores); the
callbacks never see client states or private diagnostics.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["CsvRows", "JsonLines", "RoundCallback", "TensorBoard", "notify"]

RoundCallback = Callable[[int, Mapping[str, np.ndarray], pd.DataFrame], None]
"""``callback(round, {name: (runs,) values}, runs frame) -> None``."""


def notify(
    callbacks: Iterable[RoundCallback],
    first_round: int,
    metrics: Mapping[str, Any],
    runs: pd.DataFrame,
) -> None:
    """Call every callback once per round of ``metrics`` (``{name: (runs, rounds)}``, as
    :func:`~swarmjax.fl.runtime.simulator.advance` returns them), rounds numbered from
    ``first_round``."""
    callbacks = tuple(callbacks)
    if not callbacks or not metrics:
        return
    arrays = {k: np.asarray(v) for k, v in metrics.items() if np.ndim(v) == 2}
    rounds = next(iter(arrays.values())).shape[1] if arrays else 0
    for t in range(rounds):
        row = {k: v[:, t] for k, v in arrays.items()}
        for callback in callbacks:
            callback(first_round + t, row, runs)


def _label(runs: pd.DataFrame, r: int) -> str:
    """A run's name from its labels, e.g. ``epsilon_target=8,seed=1``."""
    parts = []
    for col in runs.columns:
        value = runs[col].iloc[r]
        parts.append(f"{col}={value:g}" if isinstance(value, float) else f"{col}={value}")
    return ",".join(parts) or f"run{r}"


def _rows(
    round: int, metrics: Mapping[str, np.ndarray], runs: pd.DataFrame
) -> Iterable[dict[str, Any]]:
    """One plain dict per run: ``round``, the run's labels, its metrics (non-finite as
    ``None``)."""
    for r in range(len(runs)):
        row = {"round": int(round)}
        row |= {str(k): _plain(v) for k, v in runs.iloc[r].items()}
        row |= {k: _plain(np.asarray(v)[r]) for k, v in metrics.items()}
        yield row


def _plain(value: Any) -> Any:
    value = value.item() if isinstance(value, np.generic) else value
    if isinstance(value, float) and not math.isfinite(value):
        return None  # strict JSON: NaN and inf as null
    return value


class _AppendedFile:
    """A text file opened for appending (its folder created), closed by :meth:`close` or
    when the object is collected."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", newline="", encoding="utf-8")

    def close(self) -> None:
        """Close the file."""
        self._file.close()

    def __del__(self) -> None:
        if not self._file.closed:
            self._file.close()


class JsonLines(_AppendedFile):
    """One JSON object per (round, run) appended to ``path``: ``{"round", <labels>,
    <metrics>}`` (non-finite numbers as ``null``), flushed after every round."""

    def __call__(self, round: int, metrics: Mapping[str, np.ndarray], runs: pd.DataFrame) -> None:
        for line in _rows(round, metrics, runs):
            self._file.write(json.dumps(line, allow_nan=False) + "\n")
        self._file.flush()


class CsvRows(_AppendedFile):
    """One CSV row per (round, run) appended to ``path`` (header from the first round: round,
    the runs' labels, the metrics), flushed after every round."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self._writer: csv.DictWriter | None = None

    def __call__(self, round: int, metrics: Mapping[str, np.ndarray], runs: pd.DataFrame) -> None:
        for row in _rows(round, metrics, runs):
            if self._writer is None:
                self._writer = csv.DictWriter(self._file, fieldnames=list(row))
                if self._file.tell() == 0:
                    self._writer.writeheader()
            self._writer.writerow(row)
        self._file.flush()


class TensorBoard:
    """TensorBoard event files in ``logdir``: scalar ``<metric>/<run label>`` at step
    ``round`` for every metric and run, written by ``tensorboardX``'s ``SummaryWriter``
    (``pip install tensorboardX``; it needs no TensorFlow).  Flushed every round."""

    def __init__(self, logdir: str | os.PathLike[str]) -> None:
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise ImportError(
                "TensorBoard logging writes event files with tensorboardX: pip install "
                "tensorboardX (or swarmjax[tensorboard])"
            ) from None
        self.logdir = Path(logdir)
        self._writer = SummaryWriter(str(self.logdir))

    def __call__(self, round: int, metrics: Mapping[str, np.ndarray], runs: pd.DataFrame) -> None:
        for r in range(len(runs)):
            label = _label(runs, r)
            for name, values in metrics.items():
                value = float(np.asarray(values)[r])
                if math.isfinite(value):
                    self._writer.add_scalar(f"{name}/{label}", value, int(round))
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()
