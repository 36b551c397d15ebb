"""Every file an experiment writes is accounted for by its privacy ledger (issue 45, item 3):
a DP release, public, or listed as not covered / not released; and no released file holds
a saved secret.

:func:`check_released_files` walks every file under an experiment's ``--out`` and sorts it:

* inside a folder (or file) the ledger lists under ``not_released`` (the call store with its
  ``secret/`` folder, checkpoints with their ``secret.key``, ``private/``): kept back;
* the ledger itself (``privacy_ledger.json``, ``.md``);
* a release's path (a DP release, or a release listed as not private: a baseline without
  noise, a statistic no epsilon covers), or a file inside a release's folder;
* a file the experiment declares in its ``PUBLIC_FILES`` (``{pattern: why}``: settings, and
  tables and figures computed only from the releases and public data; a declared PNG
  figure covers the PDF of it that ``_report.save`` writes beside it), or the ``--out``
  folder's lock (:data:`COMMON_FILES`);

anything else fails, naming the file.  Then every saved secret (a file starting with the
secret header: ``calls/<id>/secret/<call>.key``, ``checkpoints/<run>/secret.key``) must lie
in a not-released folder, and neither its hex nor its raw bytes may appear in any other file.

The experiments run in the tests that already run them at their smallest settings (their
runs reused, no extra run here: ``test_experiment_dp_fedavg``, ``test_experiment_cross_device``,
``test_experiment_shakespeare`` and ``test_experiment_ledgers``' apdim, combined_learning,
fed_dp_pso and fed_dp_pso_study tests call :func:`check_released_files` after their last
run).  This file tests the check itself on folders built by hand, and the declarations.
"""

from __future__ import annotations

import fnmatch
import json
import math
from pathlib import Path, PurePosixPath
from types import ModuleType, SimpleNamespace

import pytest

from experiments import (
    _report,
    apdim,
    combined_learning,
    cross_device,
    dp_fedavg,
    fed_dp_pso,
    fed_dp_pso_study,
    shakespeare,
)
from swarmjax.privacy.ledger import JSON_NAME, MARKDOWN_NAME, Ledger, Release
from swarmjax.privacy.secret import Secret

EXPERIMENTS = (
    apdim,
    combined_learning,
    cross_device,
    dp_fedavg,
    fed_dp_pso,
    fed_dp_pso_study,
    shakespeare,
)
COMMON_FILES = {
    ".lock": "the --out folder's lock (experiments._cli.out_dir): the pid and start time of "
    "the process that held it",
}
SECRET_HEADER = b"swarmjax-secret/"  # the first line of every saved secret (Secret.save)


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _declared(rel: PurePosixPath, public: dict[str, str]) -> str | None:
    """The pattern of ``public`` that names ``rel`` (same depth, ``fnmatch``), if any; a
    figure's other formats (``_report.FORMATS``: the PDF that ``_report.save`` writes beside
    each PNG, the same figure) are named by the pattern of its PNG."""
    for pattern in public:
        depth = len(PurePosixPath(pattern).parts)
        if depth == len(rel.parts) and fnmatch.fnmatchcase(str(rel), pattern):
            return pattern
    first, *others = _report.FORMATS
    if rel.suffix in others and (pattern := _declared(rel.with_suffix(first), public)):
        return f"{pattern}, its {rel.suffix[1:].upper()} twin"
    return None


def _secrets(out: Path) -> dict[Path, tuple[str, bytes]]:
    """Every saved secret under ``out``: its path -> (hex, raw bytes)."""
    found = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        with path.open("rb") as f:
            if f.read(len(SECRET_HEADER)) != SECRET_HEADER:
                continue
        Secret.load(path)  # a well-formed secret file
        digits = path.read_text().splitlines()[2].strip().lower()
        found[path] = (digits, bytes.fromhex(digits))
    return found


def check_released_files(
    out: Path | str, module: ModuleType | SimpleNamespace, *, secrets: bool = True
) -> dict[str, str]:
    """Check every file under ``out`` (an experiment's ``--out`` after its run) against the
    ledger there and ``module.PUBLIC_FILES``; ``secrets``: the run saved at least one secret
    (every experiment with a private or keyed run).  Returns ``{file: what it is}``."""
    out = Path(out).resolve()
    ledger = json.loads((out / JSON_NAME).read_text())

    def resolve(path: str) -> Path:
        p = Path(path)
        return (p if p.is_absolute() else out / p).resolve()

    kept = [resolve(n["folder"]) for n in ledger["not_released"]]
    released: dict[Path, set[bool]] = {}  # path -> whether its releases are DP
    for r in ledger["releases"]:
        released.setdefault(resolve(r["path"]), set()).add(bool(r["private"]))
    kinds = {
        frozenset({True}): "DP release",
        frozenset({False}): "listed as not private",
        frozenset({True, False}): "DP releases and releases listed as not private",
    }
    public = {**COMMON_FILES, **module.PUBLIC_FILES}
    seen: dict[str, str] = {}
    unlisted = []
    for path in sorted(p for p in out.rglob("*") if not p.is_dir()):
        rel = PurePosixPath(path.relative_to(out).as_posix())
        if any(_inside(path, k) for k in kept):
            seen[str(rel)] = "not released"
        elif path.parent == out and path.name in (JSON_NAME, MARKDOWN_NAME):
            seen[str(rel)] = "the ledger"
        elif owners := [r for r in released if _inside(path, r)]:
            seen[str(rel)] = kinds[frozenset().union(*(released[r] for r in owners))]
        elif (pattern := _declared(rel, public)) is not None:
            seen[str(rel)] = f"public ({pattern})"
        else:
            unlisted.append(str(rel))
    assert not unlisted, (
        f"{module.__name__} wrote files that are no release of its ledger, not in a "
        f"not-released folder and not declared public (PUBLIC_FILES): {unlisted}"
    )
    saved = _secrets(out)
    assert not secrets or saved, f"{module.__name__}: no saved secret found under {out}"
    for path in saved:
        assert any(_inside(path, k) for k in kept), f"secret {path} is not in a kept folder"
    for rel, what in seen.items():
        if what == "not released":
            continue
        data = (out / rel).read_bytes()
        low = data.lower()
        for path, (digits, raw) in saved.items():
            assert digits.encode() not in low and raw not in data, (
                f"{rel} ({what}) holds the secret saved at {path.relative_to(out)}"
            )
    return seen


# ------------------------------------------------------------------------------ the check


FAKE = SimpleNamespace(__name__="fake", PUBLIC_FILES={"summary.json": "settings", "fig_*.png": "f"})


def _folder(out: Path) -> tuple[Ledger, Secret]:
    """An experiment's folder by hand: a DP-less release at ``runs.csv``, a call store
    with a saved secret (not released), a summary and a figure (declared), the lock."""
    ledger = Ledger(out, "fake")
    ledger.add(Release("x", {}, 0, None, None, 1e-5, math.inf, "pld", str(out / "runs.csv")))
    (out / "runs.csv").write_text("seed,accuracy\n0,0.5\n")
    secret = Secret.generate()
    secret.save(out / "calls" / "abc" / "secret" / "run.key")
    ledger.mark_not_released(out / "calls" / "abc", "cache and secrets")
    (out / "summary.json").write_text('{"rounds": 2}\n')
    (out / "fig_accuracy.png").write_bytes(b"\x89PNG")
    (out / ".lock").write_text("pid 1\n")
    return ledger, secret


def test_releases_declared_files_and_kept_folders_pass(tmp_path):
    ledger, _ = _folder(tmp_path)
    _report.not_covered(ledger, "timing", tmp_path / "timing.csv", "wall time of the runs")
    (tmp_path / "timing.csv").write_text("seconds\n1.0\n")
    ledger.write()
    seen = check_released_files(tmp_path, FAKE)
    assert seen == {
        ".lock": "public (.lock)",
        "calls/abc/secret/run.key": "not released",
        "fig_accuracy.png": "public (fig_*.png)",
        JSON_NAME: "the ledger",
        MARKDOWN_NAME: "the ledger",
        "runs.csv": "listed as not private",
        "summary.json": "public (summary.json)",
        "timing.csv": "listed as not private",
    }
    timing = Ledger.load(tmp_path / JSON_NAME).releases[-1]
    assert not timing.private and timing.variant["not_covered"] == "wall time of the runs"


def test_an_unlisted_file_is_named(tmp_path):
    ledger, _ = _folder(tmp_path)
    ledger.write()
    (tmp_path / "private_stats.csv").write_text("mia\n0.1\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "fig_a.png").write_bytes(b"")  # a pattern names its own depth only
    with pytest.raises(AssertionError, match=r"\['private_stats.csv', 'sub/fig_a.png'\]"):
        check_released_files(tmp_path, FAKE)


def test_a_figures_pdf_is_declared_by_its_png_only(tmp_path):
    """``_report.save`` writes each figure as PNG and PDF: the PDF beside a declared PNG is
    that figure; a PDF without a declared PNG is named like any unlisted file."""
    ledger, _ = _folder(tmp_path)
    ledger.write()
    (tmp_path / "fig_accuracy.pdf").write_bytes(b"%PDF")
    seen = check_released_files(tmp_path, FAKE)
    assert seen["fig_accuracy.pdf"] == "public (fig_*.png, its PDF twin)"
    (tmp_path / "table.pdf").write_bytes(b"%PDF")
    with pytest.raises(AssertionError, match=r"\['table.pdf'\]"):
        check_released_files(tmp_path, FAKE)


@pytest.mark.parametrize("form", ["hex", "HEX", "raw"])
def test_a_released_file_holding_a_secret_fails(tmp_path, form):
    ledger, _ = _folder(tmp_path)
    ledger.write()
    saved = tmp_path / "calls" / "abc" / "secret" / "run.key"
    digits = saved.read_text().splitlines()[2].strip()
    leak = {"hex": digits.encode(), "HEX": digits.upper().encode(), "raw": bytes.fromhex(digits)}
    (tmp_path / "summary.json").write_bytes(b'{"key": "' + leak[form] + b'"}')
    with pytest.raises(AssertionError, match=r"summary\.json .* holds the secret saved at calls"):
        check_released_files(tmp_path, FAKE)


def test_a_secret_outside_the_kept_folders_fails(tmp_path):
    ledger, secret = _folder(tmp_path)
    ledger.write()
    secret.save(tmp_path / "fig_key.png")  # declared public, but a secret
    with pytest.raises(AssertionError, match=r"fig_key\.png is not in a kept folder"):
        check_released_files(tmp_path, FAKE)
    (tmp_path / "fig_key.png").unlink()
    for p in (tmp_path / "calls").rglob("*.key"):
        p.unlink()
    with pytest.raises(AssertionError, match="no saved secret"):
        check_released_files(tmp_path, FAKE)
    check_released_files(tmp_path, FAKE, secrets=False)


@pytest.mark.parametrize("module", EXPERIMENTS, ids=lambda m: m.__name__.split(".")[-1])
def test_every_experiment_declares_why_each_other_file_is_public(module):
    """Relative patterns with a reason each; none names the ledger, a call store or a
    not-released folder (those are the ledger's to list)."""
    assert module.PUBLIC_FILES
    for pattern, why in module.PUBLIC_FILES.items():
        assert isinstance(why, str) and len(why) > 10, pattern
        rel = PurePosixPath(pattern)
        assert not rel.is_absolute() and ".." not in rel.parts, pattern
        assert rel.parts[0] not in ("calls", "checkpoints", "private", "secret"), pattern
        assert pattern not in (JSON_NAME, MARKDOWN_NAME), pattern
