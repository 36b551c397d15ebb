"""docs/quickstart.md runs: its python code blocks, in order, in one namespace (a module
registered under a name of its own, so the Flower task factory it names can be imported)."""

from __future__ import annotations

import importlib
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from swarmjax.fl.protocol import UNDECLARED

PAGE = Path(__file__).resolve().parents[1] / "docs" / "quickstart.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def code_blocks(text: str) -> list[str]:
    """The page's ```python blocks, in order."""
    return [m.group(1) for m in BLOCK.finditer(text)]


@pytest.fixture(scope="module")
def page():
    """The namespace the page's code leaves behind (run once for this module's tests)."""
    pytest.importorskip("flwr", reason="the quickstart's last step runs the Flower runtime")
    name = "swarmjax_quickstart_page"
    module = types.ModuleType(name)
    module.__file__ = str(PAGE)
    sys.modules[name] = module
    try:
        for i, block in enumerate(code_blocks(PAGE.read_text())):
            exec(compile(block, f"{PAGE}:block{i + 1}", "exec"), module.__dict__)
        yield module.__dict__
    finally:
        del sys.modules[name]


def test_the_page_has_its_seven_steps_in_code():
    blocks = code_blocks(PAGE.read_text())
    assert len(blocks) == 8
    joined = "\n".join(blocks)
    for needed in (
        "power_law",
        "from_nnx",
        "for_run",
        "Ledger",
        "class FedAvgM(Algorithm)",
        "private(FedAvgM(",
        "LoopbackGrid",
    ):
        assert needed in joined, needed


def test_the_quickstart_runs_end_to_end(page):
    res = page["res"]
    assert page["dp_alg"].plan.participation.capacity is not None  # sized for the run
    assert res.privacy.unit == "client" and res.privacy.final_epsilon.max() <= 3.0 + 1e-6
    assert (page["out"] / "privacy_ledger.json").exists()
    # FedAvgM declares no protection: its uploads are counted as exact private statistics
    assert page["res_m"].privacy.not_covered == (f"train: unprotected: {UNDECLARED}",)
    dp = page["res_dp"].privacy  # the same algorithm under a plan: user-level, end to end
    assert dp.unit == "client" and dp.end_to_end and dp.final_epsilon.max() <= 3.0 + 1e-6
    assert page["gap"] < 1e-5


def test_results_print_short_and_without_arrays(page):
    for res in (page["res"], page["res_m"]):
        text = repr(res)
        assert len(text.splitlines()) <= 7 and len(text) < 1200, text
        assert "Array(" not in text and "array(" not in text and "[[" not in text
        assert f"{len(res.runs)} runs x {int(res.history['round'].max())} rounds" in text
        for column in ("test_accuracy", "test_loss"):
            assert f"{column}=" in text
    dp = repr(page["res"])
    eps = page["res"].privacy.final_epsilon
    assert "client-level" in dp and f"{eps.min():.4g}" in dp
    assert "no DP" in repr(page["res_m"])
    assert "\n" not in repr(page["res"].privacy) and "PrivacyRecord(client-level" in repr(
        page["res"].privacy
    )
    assert np.isfinite(eps).all()


def test_help_swarmjax_names_front_doors_that_import():
    """Every ``from X import a, b`` and ``swarmjax.x.y`` that ``help(swarmjax)`` shows exists."""
    import swarmjax

    doc = swarmjax.__doc__
    imports = re.findall(r"``from (swarmjax[\w.]*) import ([\w, ]+)``", doc)
    assert len(imports) >= 7
    for module, names in imports:
        loaded = importlib.import_module(module)
        for name in names.split(","):
            assert hasattr(loaded, name.strip()), (module, name)
    for dotted in re.findall(r"``(swarmjax(?:\.\w+)+)``", doc):
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
            break
    assert "docs/quickstart.md" in doc
