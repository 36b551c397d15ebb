"""Helpers of the command-line tests: a refusal read as one line, and option overrides."""

from __future__ import annotations

from collections.abc import Callable

import pytest


def refused(main: Callable, argv: list[str], capsys) -> str:
    """``main(argv)`` exits 2 with one line on stderr (returned), no traceback."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def override(base: list[str], extra: list[str]) -> list[str]:
    """``base`` with each option ``extra`` gives replaced (an option given twice is refused)."""
    given = {a for a in extra if a.startswith("--")}
    out, skip = [], False
    for a in base:
        if a.startswith("--"):
            skip = a in given
        if not skip:
            out.append(a)
    return [*out, *extra]
