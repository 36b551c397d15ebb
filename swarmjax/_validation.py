"""Argument checks for every public entry point.

Each check raises ``ValueError`` naming the parameter and its allowed range, so bad input
fails before anything is traced or compiled.  Checks accept Python scalars and array-likes
(every element is checked, which is what a vmapped hyper-parameter axis needs) and pass
JAX tracers through untouched: values only known at trace time cannot be checked here.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "check_bool",
    "check_choice",
    "check_finite",
    "check_folder",
    "check_int",
    "check_nonnegative",
    "check_positive",
    "check_probability",
    "check_range",
    "check_stored",
    "choice_hint",
    "did_you_mean",
    "stored",
]


def _as_float_array(name: str, value: Any) -> np.ndarray | None:
    jax = sys.modules.get("jax")  # not imported: no value is a tracer (swarmjax.data runs without)
    if jax is not None and isinstance(value, jax.core.Tracer):
        return None
    try:
        dtype = getattr(value, "dtype", None)  # an array's own: no copy of it to look
        if dtype is None:  # (a dtype is falsy: its len() counts its fields)
            dtype = np.asarray(value).dtype
        if isinstance(value, str | bytes) or np.dtype(dtype).kind in "USV":
            raise TypeError("text")  # "0.1" is no number, though NumPy would parse it
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be numeric; got {value!r}") from None
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty")
    if np.isnan(arr).any():
        raise ValueError(f"{name} must not be NaN; got {value!r}")
    return arr


def _fmt(value: Any) -> str:
    arr = np.asarray(value)
    if arr.ndim == 0:
        return repr(arr.item())
    return f"array with min {arr.min()!r} and max {arr.max()!r}"


def check_range(
    name: str,
    value: Any,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> Any:
    """Check ``low <= value <= high`` elementwise (open ends with ``*_open``); return value."""
    arr = _as_float_array(name, value)
    if arr is None:
        return value
    lo_ok = arr > low if low_open else arr >= low
    hi_ok = arr < high if high_open else arr <= high
    if not (np.all(lo_ok) and np.all(hi_ok)):
        left = "(" if low_open else "["
        right = ")" if high_open else "]"
        raise ValueError(f"{name} must be in {left}{low}, {high}{right}; got {_fmt(arr)}")
    return value


def stored(value: Any) -> Any:
    """``value`` as the device holds it: rounded to float32, with float32 subnormals flushed
    to 0 as XLA does; a float (or a float64 array). Privacy parameters are checked on this,
    not on the float64 value given (0.50000001 is 0.5 on the device)."""
    arr = np.asarray(value, np.float64).astype(np.float32).astype(np.float64)
    arr = np.where(np.abs(arr) < np.finfo(np.float32).tiny, 0.0, arr)
    return float(arr) if arr.ndim == 0 else arr


def check_stored(
    name: str,
    value: Any,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> Any:
    """:func:`check_range` on :func:`stored` ``(value)`` (the error says "as float32");
    returns ``value``. Use it for every privacy parameter the device holds in float32
    (noise multipliers, clip norms, epsilons, rates)."""
    if _as_float_array(name, value) is None:
        return value
    check_range(
        f"{name} (as float32)",
        stored(value),
        low,
        high,
        low_open=low_open,
        high_open=high_open,
    )
    return value


def check_positive(name: str, value: Any, *, finite: bool = False) -> Any:
    """Check ``value > 0`` elementwise (``inf`` allowed, unless ``finite``: e.g. a learning
    rate, where ``inf`` would only turn the model into NaN; a finite value is also checked
    as the device stores it, :func:`check_stored`: ``1e-320`` is 0 in float32, ``1e39``
    inf)."""
    check_range(name, value, 0.0, math.inf, low_open=True, high_open=finite)
    if finite:
        check_stored(name, value, 0.0, math.inf, low_open=True, high_open=True)
    return value


def check_nonnegative(name: str, value: Any) -> Any:
    """Check ``value >= 0`` elementwise (``inf`` allowed)."""
    return check_range(name, value, 0.0, math.inf)


def check_probability(name: str, value: Any, *, low_open: bool = False) -> Any:
    """Check ``0 <= value <= 1`` (or ``0 < value`` with ``low_open``) elementwise."""
    return check_range(name, value, 0.0, 1.0, low_open=low_open)


def check_finite(name: str, value: Any) -> Any:
    """Check every element is finite (no NaN, no inf)."""
    arr = _as_float_array(name, value)
    if arr is not None and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite; got {_fmt(arr)}")
    return value


def check_int(name: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    """Check ``value`` is an integer (not bool) ``>= minimum`` (and ``<= maximum``: then
    the message states the range, ``must be an integer in [minimum, maximum]``); return it
    as ``int``."""
    bad = isinstance(value, bool) or not isinstance(value, int | np.integer)
    if maximum is not None:
        low = -math.inf if minimum is None else minimum
        if bad or not low <= value <= maximum:
            raise ValueError(f"{name} must be an integer in [{low}, {maximum}]; got {value!r}")
        return int(value)
    if bad:
        raise ValueError(f"{name} must be an integer; got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value!r}")
    return int(value)


def check_bool(name: str, value: Any, *, allow_none: bool = False) -> bool | None:
    """Check ``value`` is ``True`` or ``False`` (a NumPy bool too; not ``0``/``1``), or
    ``None`` when ``allow_none``; return it as a Python ``bool`` (or ``None``)."""
    if allow_none and value is None:
        return None
    if not isinstance(value, bool | np.bool_):
        allowed = "True, False or None" if allow_none else "True or False"
        raise ValueError(f"{name} must be {allowed}; got {value!r}")
    return bool(value)


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """Check ``value`` is one of ``choices``."""
    options = tuple(choices)
    if value not in options:
        raise ValueError(
            f"unknown {name} {value!r}{did_you_mean(value, options)}; choose one of "
            f"{', '.join(map(repr, options))}"
        )
    return value


def did_you_mean(value: Any, choices: Iterable[Any]) -> str:
    """``" (did you mean 'mnist'?)"``: the choice nearest to a mistyped ``value`` (case
    ignored), or ``""`` when none is near or ``value`` is no text."""
    if not isinstance(value, str):
        return ""
    options = {str(c).lower(): c for c in choices if isinstance(c, str)}
    near = difflib.get_close_matches(value.lower(), list(options), n=1, cutoff=0.75)
    return f" (did you mean {options[near[0]]!r}?)" if near else ""


_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")


def choice_hint(message: str) -> str:
    """An argparse error ``message`` with the nearest valid name added to an "invalid
    choice" (:func:`did_you_mean`); other messages unchanged."""
    found = _INVALID_CHOICE.search(message)
    if found is None:
        return message
    choices = re.findall(r"'([^']*)'", found.group(2)) or found.group(2).split(", ")
    hint = did_you_mean(found.group(1), choices)
    return message[: found.end()] + hint + message[found.end() :] if hint else message


def check_folder(name: str, value: str | os.PathLike[str]) -> Path:
    """Check ``value`` names a folder (``~`` expanded): not the empty string (which would
    silently mean the current folder) nor an existing file; it need not exist yet.
    Returns it as a :class:`~pathlib.Path`."""
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise ValueError(
            f"{name} must name a folder (an empty one is the current folder); got {value!r}"
        )
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{name} {str(path)!r} exists and is not a folder; give a folder")
    return path
