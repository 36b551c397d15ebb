"""Shared fixtures: where the offline datasets are, and a skip when they are not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path | None:
    """``$SWARMJAX_DATA`` if set, else ``../shared/data`` beside the checkout, if present."""
    env = os.environ.get("SWARMJAX_DATA")
    candidates = [Path(env)] if env else []
    candidates.append(REPO.parent / "shared" / "data")
    for path in candidates:
        if path.is_dir():
            return path
    return None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The offline data folder; tests that need it skip with a reason when it is absent."""
    path = shared_data_dir()
    if path is None:
        pytest.skip("offline datasets not found: set SWARMJAX_DATA or place ../shared/data")
    return path
