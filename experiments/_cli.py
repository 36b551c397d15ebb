"""One command-line contract for every ``experiments/`` script.

Every script builds its parser with :func:`parser` and wraps ``main`` in :func:`entry_point`:

* Profiles: ``--quick`` (CI smoke run), no flag (the default slice), ``--full`` (the paper's
  grid); they are mutually exclusive.
* ``--seeds N`` is a COUNT everywhere: the runs use seeds ``0 .. N-1`` (``N >= 1``).
* ``--data-dir DIR``: the folder holding the offline datasets.  Looked up as ``--data-dir``,
  else ``$SWARMJAX_DATA``, else ``../shared/data`` beside the checkout; whichever is chosen
  must exist (a missing folder is an error, never a fallback to the next), and it is
  exported as ``$SWARMJAX_DATA`` so that no loader looks anywhere else.
* ``--out DIR``: results go to ``<repository>/results/<experiment>/`` unless ``--out`` says
  otherwise (never relative to the current directory).  Finished calls are kept under
  ``<out>/calls/<settings id>/`` (:class:`swarmjax.resume.CallStore`); the settings id
  includes a fingerprint of the package's and the experiment's source, so changed code
  never reuses a stale result.  ``--restart`` recomputes them.
* DP experiments (``privacy=True``) take ``--accountant pld|rdp`` (default ``pld``: it
  calibrates the noise and composes the records) and ``--delta`` (default: the one default
  of :func:`swarmjax.privacy.plan.default_delta`, ``0.1 / units``), and write a privacy
  ledger (:mod:`swarmjax.privacy.ledger`) beside their results.
* Every argument is checked before any work starts.  A user error prints one line
  ``<prog>: error: <what>`` on stderr and exits with status 2 (no traceback).  Options that
  select nothing to run (no dataset found, no model for the chosen datasets) are user
  errors too: a script never exits 0 having run nothing.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from swarmjax.resume import CallStore

__all__ = [
    "REPO",
    "RESULTS",
    "UserError",
    "call_store",
    "count",
    "data_dir",
    "delta",
    "entry_point",
    "out_dir",
    "parser",
    "positive_float",
    "probability",
    "profile_name",
    "seeds",
]

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
_SHARED_DATA = REPO.parent / "shared" / "data"

T = TypeVar("T")


class UserError(Exception):
    """Bad command-line input: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage block
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parser(
    experiment: str,
    description: str,
    *,
    quick: str,
    full: str,
    data: str | None = None,
    seeds: str | None = None,
    privacy: str | None = None,
) -> argparse.ArgumentParser:
    """A parser with the shared options: ``--quick``/``--full``, ``--out``, ``--restart``,
    and ``--data-dir`` (when ``data`` describes what the folder must hold), ``--seeds``
    (when ``seeds`` gives the profiles' defaults) and ``--accountant``/``--delta`` (when
    ``privacy`` names the privacy units the default delta counts, e.g. "clients")."""
    p = _Parser(
        prog=f"python -m experiments.{experiment}",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help=quick)
    mode.add_argument("--full", action="store_true", help=full)
    p.add_argument(
        "--out",
        type=Path,
        default=RESULTS / experiment,
        help=f"output folder (default: results/{experiment}/ in the repository)",
    )
    p.add_argument(
        "--restart",
        action="store_true",
        help="recompute every call; by default finished calls saved under <out>/calls/ with "
        "the same settings and code are reused",
    )
    if data is not None:
        p.add_argument(
            "--data-dir",
            help=f"folder with {data} (default: $SWARMJAX_DATA, else ../shared/data)",
        )
    if seeds is not None:
        p.add_argument(
            "--seeds",
            type=count("--seeds"),
            help=f"number of seeds; runs use seeds 0..N-1 ({seeds})",
        )
    if privacy is not None:
        p.add_argument(
            "--accountant",
            choices=("pld", "rdp"),
            default="pld",
            help="privacy accountant that calibrates the noise and composes every record "
            "and the ledger: pld (default; privacy-loss distributions, tighter) or rdp",
        )
        p.add_argument(
            "--delta",
            type=probability("--delta"),
            help=f"delta of every epsilon (default 0.1 / {privacy}, swarmjax's one default)",
        )
    return p


def probability(name: str) -> Callable[[str], float]:
    """argparse ``type``: a number in ``(0, 1)``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number; got {text!r}") from None
        if not 0 < value < 1:
            raise argparse.ArgumentTypeError(f"must be in (0, 1); got {text}")
        return value

    parse.__name__ = name
    return parse


def delta(args: argparse.Namespace, units: int) -> float:
    """``--delta``, else :func:`swarmjax.privacy.plan.default_delta` of ``units``."""
    from swarmjax.privacy.plan import default_delta

    given = getattr(args, "delta", None)
    return default_delta(units) if given is None else float(given)


def count(name: str, minimum: int = 1) -> Callable[[str], int]:
    """argparse ``type``: an integer ``>= minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer; got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}; got {value}")
        return value

    parse.__name__ = name  # argparse names the type in its messages
    return parse


def positive_float(
    name: str, *, allow_inf: bool = False, allow_zero: bool = False
) -> Callable[[str], float]:
    """argparse ``type``: a finite number ``> 0`` (``inf`` too with ``allow_inf``, ``0`` too
    with ``allow_zero``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number; got {text!r}") from None
        low = value < 0 if allow_zero else value <= 0
        if math.isnan(value) or low or (math.isinf(value) and not allow_inf):
            allowed = ">= 0" if allow_zero else "> 0"
            allowed = f"{allowed} (or inf)" if allow_inf else f"finite and {allowed}"
            raise argparse.ArgumentTypeError(f"must be {allowed}; got {text}")
        return value

    parse.__name__ = name
    return parse


def profile_name(args: argparse.Namespace) -> str:
    """``"quick"``, ``"full"`` or ``"default"``."""
    return "quick" if args.quick else "full" if args.full else "default"


def seeds(args: argparse.Namespace, default: int) -> list[int]:
    """Seeds ``0 .. N-1`` with ``N`` from ``--seeds`` or ``default``."""
    return list(range(args.seeds if args.seeds is not None else default))


def data_dir(given: str | os.PathLike[str] | None, needs: Iterable[str] = ()) -> Path:
    """The data folder (see the module docs); ``needs``: paths it must contain.

    Raises :class:`UserError` naming where the folder came from when it is missing or lacks
    a needed file.  The result is exported as ``$SWARMJAX_DATA``.
    """
    env = os.environ.get("SWARMJAX_DATA")
    if given is not None:
        source, path = "--data-dir", Path(given)
    elif env:
        source, path = "$SWARMJAX_DATA", Path(env)
    else:
        source, path = "default data folder", _SHARED_DATA
        if not path.is_dir():
            raise UserError("no data folder: pass --data-dir DIR or set SWARMJAX_DATA")
    if not path.is_dir():
        raise UserError(f"{source} {str(path)!r} is not a folder")
    missing = [n for n in needs if not (path / n).exists()]
    if missing:
        raise UserError(f"{source} {str(path)!r} lacks {', '.join(missing)}")
    os.environ["SWARMJAX_DATA"] = str(path.resolve())
    return path


def out_dir(args: argparse.Namespace) -> Path:
    """``--out`` (default ``results/<experiment>/`` in the repository), created and checked
    writable (results and the privacy ledger go there); else a :class:`UserError`."""
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {str(out)!r} exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-probe"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise UserError(
            f"--out {str(out)!r} is not a writable folder (results and the privacy ledger go "
            f"there): {err.strerror or err}"
        ) from None
    return out


def call_store(
    out: Path,
    settings: Mapping[str, Any],
    experiment: ModuleType | str,
    *,
    restart: bool,
    parts: Sequence[ModuleType] = (),
) -> CallStore:
    """The saved-calls store ``<out>/calls/``, keyed by ``settings`` and the source of the
    package, of ``experiment`` (a module or its name) and of its helper modules ``parts``."""
    module = sys.modules[experiment] if isinstance(experiment, str) else experiment
    return CallStore(out / "calls", settings, restart=restart, code=(module, *parts))


def entry_point(main: Callable[..., T]) -> Callable[..., T]:
    """Wrap ``main(argv)``: a :class:`UserError` prints one line on stderr and exits 2."""

    @functools.wraps(main)
    def wrapped(argv: Sequence[str] | None = None) -> T:
        spec = getattr(sys.modules.get(main.__module__), "__spec__", None)
        prog = f"python -m {spec.name if spec else main.__module__}"
        try:
            return main(argv)
        except UserError as exc:
            print(f"{prog}: error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None

    return wrapped
