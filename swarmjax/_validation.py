"""Argument checks for every public entry point.

Each check raises ``ValueError`` naming the parameter and its allowed range, so bad input
fails before anything is traced or compiled.  Checks accept Python scalars and array-likes
(every element is checked, which is what a vmapped hyper-parameter axis needs) and pass
JAX tracers through untouched: values only known at trace time cannot be checked here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import jax
import numpy as np

__all__ = [
    "check_bool",
    "check_choice",
    "check_finite",
    "check_int",
    "check_nonnegative",
    "check_positive",
    "check_probability",
    "check_range",
    "check_stored",
    "stored",
]


def _as_float_array(name: str, value: Any) -> np.ndarray | None:
    if isinstance(value, jax.core.Tracer):
        return None
    try:
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


def check_positive(name: str, value: Any) -> Any:
    """Check ``value > 0`` elementwise (``inf`` allowed)."""
    return check_range(name, value, 0.0, math.inf, low_open=True)


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
        raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(map(repr, options))}")
    return value
