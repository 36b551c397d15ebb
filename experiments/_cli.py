"""One command-line contract for every ``experiments/`` script.

Every script builds its parser with :func:`parser` and wraps ``main`` in :func:`entry_point`:

* Profiles: ``--quick`` (CI smoke run), no flag (the default slice), ``--full`` (the paper's
  grid); they are mutually exclusive.
* ``--seeds N`` is a COUNT everywhere: the runs use seeds ``0 .. N-1`` (``N >= 1``).
* ``--data-dir DIR``: the folder holding the datasets.  Looked up as ``--data-dir``, else
  ``$SWARMJAX_DATA``, else the user's cache folder (``~/.cache/swarmjax/data``, see
  :mod:`swarmjax.data`), where ``python -m swarmjax.data fetch NAME`` stages them.  A named
  folder must exist (a missing one is an error, never a fallback to the next); the default
  may be absent until the first fetch.  The folder is exported as ``$SWARMJAX_DATA`` so that
  no loader looks anywhere else.  Every message about missing or unreadable data names the
  fetch command.
* ``--out DIR``: results go to ``<repository>/results/<experiment>/`` unless ``--out`` says
  otherwise (never relative to the current directory).  Finished calls are kept under
  ``<out>/calls/<settings id>/`` (:class:`swarmjax.resume.CallStore`); the settings id
  includes a fingerprint of the package's and the experiment's source, so changed code
  never reuses a stale result.  ``--restart`` recomputes them.
* DP experiments (``privacy=True``) take ``--accountant pld|rdp`` (default ``pld``: it
  calibrates the noise and composes the records) and ``--delta`` (default: the one default
  of :func:`swarmjax.privacy.plan.default_delta`, ``min(1e-5, 0.1 / units)``), and write a privacy
  ledger (:mod:`swarmjax.privacy.ledger`) beside their results.  Their noise comes from a
  fresh 256-bit secret per call (operating-system entropy, kept under the call store's
  ``secret/`` folder, which the ledger lists as not released); ``--secret-file`` supplies
  one instead (reproducible mode, :func:`supplied_secret`).
* One name for one thing: an option that takes a list is plural (``--epsilons``,
  ``--datasets``, ``--algorithms``, ``--seeds``), a learning rate is ``--learning-rate``; the
  former names (:data:`RENAMED_OPTIONS`) are refused in one line naming the new one.
* Every argument is checked before any work starts.  A user error prints one line
  ``<prog>: error: <what>`` on stderr and exits with status 2 (no traceback).  Options that
  select nothing to run (no dataset found, no model for the chosen datasets) are user
  errors too: a script never exits 0 having run nothing.  The classes checked, each by one
  function here: the output folder (:func:`out_dir`), the data folder and the datasets in it
  (:func:`data_dir`, :func:`load_dataset`), options that do not apply to the chosen run
  (:func:`given`, :func:`refuse_unused`, or :func:`warn_unused` where ignoring them is
  harmless), and the memory a run is about to allocate against
  the machine's (:func:`check_memory`, with :func:`array_bytes` for the estimates).  A message
  names only options the user gave; a value that came from the profile is named as such,
  with the option that changes it (:func:`setting`).
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import struct
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from swarmjax._validation import check_folder, choice_hint
from swarmjax.device import COMPILATION_CACHE, use_compilation_cache
from swarmjax.privacy.secret import Secret
from swarmjax.resume import CallStore, OutputConflict

__all__ = [
    "RENAMED_OPTIONS",
    "REPO",
    "RESULTS",
    "SECRET_NOT_RELEASED",
    "UNREADABLE",
    "Pace",
    "UserError",
    "array_bytes",
    "call_store",
    "check_memory",
    "count",
    "data_dir",
    "data_source",
    "delta",
    "entry_point",
    "epsilon_target",
    "given",
    "load_dataset",
    "memory_line",
    "option_named",
    "out_dir",
    "out_file",
    "parser",
    "physical_memory",
    "positive_float",
    "probability",
    "process_options",
    "profile_name",
    "progress_bars",
    "refuse_unused",
    "release_out_dir",
    "seeds",
    "setting",
    "supplied_secret",
    "unreadable",
    "warn_unused",
]

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"

T = TypeVar("T")


class UserError(Exception):
    """Bad command-line input: reported as one line, exit status 2."""


RENAMED_OPTIONS: dict[str, str] = {
    "--epsilon": "--epsilons",
    "--dataset": "--datasets",
    "--algorithm": "--algorithms",
    "--lr": "--learning-rate",
}
"""Former option names and the name each now has (refused, never read as an abbreviation)."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors that records which options the command line gave."""

    def error(self, message: str) -> None:  # one line, no usage block; a near miss named
        self.exit(2, f"{self.prog}: error: {choice_hint(message)} (see --help)\n")

    def parse_known_args(
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """argparse's parse, then the same command line again with every default suppressed:
        the options left are the ones given (kept for :func:`given`)."""
        self._refuse_renamed(list(sys.argv[1:] if args is None else args))
        parsed, rest = super().parse_known_args(args, namespace)
        self._refuse_repeats(list(sys.argv[1:] if args is None else args), parsed)
        saved = [(a, a.default) for a in self._actions]
        defaults, self._defaults = self._defaults, {}
        try:
            for action, _ in saved:
                action.default = argparse.SUPPRESS
            bare, _ = super().parse_known_args(args, None)
        finally:
            for action, default in saved:
                action.default = default
            self._defaults = defaults
        setattr(parsed, _GIVEN, frozenset(vars(bare)))
        return parsed, rest

    def _refuse_renamed(self, argv: list[str]) -> None:
        """One line for a former option name (:data:`RENAMED_OPTIONS`) that this parser
        has under its new name (argparse would otherwise read ``--epsilon`` as an
        abbreviation of ``--epsilons``, or refuse ``--lr`` without naming the new one)."""
        for token in argv:
            if token == "--":
                break
            old = token.split("=", 1)[0]
            new = RENAMED_OPTIONS.get(old)
            if new in self._option_string_actions and old not in self._option_string_actions:
                self.error(f"{old} is now {new} (one name across the experiments)")

    def _action_of(self, token: str) -> argparse.Action | None:
        """The action an option token (``--name`` or ``--name=value``, or a unique prefix
        of a long option, as argparse accepts) stands for; ``None`` for a value."""
        if not token.startswith("-") or token == "-" or token == "--":
            return None
        name = token.split("=", 1)[0]
        if name in self._option_string_actions:
            return self._option_string_actions[name]
        found = {a for o, a in self._option_string_actions.items() if o.startswith(name)}
        return found.pop() if len(found) == 1 else None

    def _refuse_repeats(self, argv: list[str], parsed: argparse.Namespace) -> None:
        """One line for an option given twice (argparse keeps the last silently) and for a
        list option that names one value twice (e.g. ``--epsilons 5 5``)."""
        seen: dict[argparse.Action, str] = {}
        for token in argv:
            if token == "--":
                break
            action = self._action_of(token)
            if action is None or isinstance(action, argparse._HelpAction):
                continue
            if isinstance(action, argparse._AppendAction | argparse._CountAction):
                continue
            if action in seen:
                several = action.nargs in ("+", "*") or isinstance(action.nargs, int)
                hint = " with all its values after one flag" if several else ""
                self.error(f"{action.option_strings[-1]} is given twice; give it once{hint}")
            seen[action] = token
        for action in seen:
            value = getattr(parsed, action.dest, None)
            if action.nargs in ("+", "*") and isinstance(value, list):
                repeated = sorted(
                    {
                        f"{v:g}" if isinstance(v, float) else str(v)
                        for v in value
                        if value.count(v) > 1
                    }
                )
                if repeated:
                    self.error(
                        f"{action.option_strings[-1]} lists {', '.join(repeated)} more than "
                        "once; give each value once"
                    )


_GIVEN = "_options_given"


def given(args: argparse.Namespace) -> frozenset[str]:
    """The ``dest`` names of the options the command line gave (not their defaults); every
    option counts as given for a namespace not made by :func:`parser`'s parser."""
    found = getattr(args, _GIVEN, None)
    return frozenset(k for k in vars(args) if k != _GIVEN) if found is None else found


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def setting(args: argparse.Namespace, dest: str, value: object, what: str) -> str:
    """How a message names a value: ``"--cohort 50"`` when the command line gave it, else
    ``"the cohort of 50 (the profile's; --cohort changes it)"``: never as if the user had
    given an option they did not."""
    if dest in given(args):
        return f"{_flag(dest)} {value}"
    return f"the {what} of {value} (the profile's; {_flag(dest)} changes it)"


def warn_unused(args: argparse.Namespace, dests: Iterable[str], why: str) -> list[str]:
    """One warning line on stderr per option of ``dests`` the command line gave that this
    run ignores (``why``), for options harmless to ignore; returns the options named."""
    named = [_flag(d) for d in dests if d in given(args)]
    for option in named:
        print(f"warning: {option} does not apply: {why}; it is ignored", file=sys.stderr)
    return named


def refuse_unused(args: argparse.Namespace, dests: Iterable[str], why: str) -> None:
    """A :class:`UserError` naming the first of ``dests`` the command line gave: it does not
    apply to this run (``why`` says why and what does)."""
    used = [d for d in dests if d in given(args)]
    if used:
        raise UserError(f"{_flag(used[0])} does not apply: {why}")


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
        type=_nonempty_path,
        default=RESULTS / experiment,
        help=f"output folder (default: results/{experiment}/ in the repository)",
    )
    p.add_argument(
        "--restart",
        action="store_true",
        help="recompute every call; by default finished calls saved under <out>/calls/ with "
        "the same settings and code are reused",
    )
    p.add_argument(
        "--jax-cache",
        default="",
        metavar="DIR",
        help="keep compiled programs in DIR across runs (JAX's persistent compilation "
        f"cache, e.g. {COMPILATION_CACHE}: a rerun, a resumed run or another experiment "
        "with the same programs loads them instead of compiling). Default: none, or "
        "$JAX_COMPILATION_CACHE_DIR when set. A compiled program holds the constants it "
        "was traced with: keep DIR as private as the run's secrets (created owner-only)",
    )
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="draw no progress bars (they go to stderr; the same as TQDM_DISABLE=1)",
    )
    if data is not None:
        p.add_argument(
            "--data-dir",
            help=f"folder with {data} (default: $SWARMJAX_DATA, else ~/.cache/swarmjax/data; "
            "python -m swarmjax.data fetch NAME stages them)",
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
            help=f"delta of every epsilon (default min(1e-5, 0.1 / {privacy}), swarmjax's one "
            "default)",
        )
        p.add_argument(
            "--secret-file",
            type=_secret_file,
            help="reproducible mode: draw every call's noise from this secret (a file of at "
            "least 16 bytes of secret randomness, e.g. `head -c 32 /dev/urandom > key`); the "
            "guarantee then holds only while the file is kept secret. Default: each call draws "
            "a fresh 256-bit secret from the operating system, kept under "
            "<out>/calls/<id>/secret/ (not released) so an interrupted run resumes",
        )
    return p


def _nonempty_path(text: str) -> Path:
    """argparse ``type`` of a path option: ``""`` (an unset shell variable) is refused, not
    read as the current folder."""
    if not text:
        raise argparse.ArgumentTypeError(
            "is empty; give a path (an empty one is the current folder)"
        )
    return Path(text).expanduser()


def _secret_file(text: str) -> Secret:
    """argparse ``type`` of ``--secret-file``: the file read now, before any work."""
    try:
        return Secret.from_file(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def supplied_secret(args: argparse.Namespace) -> Secret | None:
    """``--secret-file``'s secret (reproducible mode), else ``None`` (fresh secrets)."""
    return getattr(args, "secret_file", None)


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


EPSILON_LIMIT = 700.0
"""The largest epsilon target the library calibrates a run for (its Poisson buffers are
sized through ``e^epsilon``, which float64 holds up to about 709)."""


def epsilon_target(name: str, *, allow_inf: bool = False) -> Callable[[str], float]:
    """argparse ``type`` of an epsilon target: a number in ``(0, EPSILON_LIMIT]`` (``inf``
    too with ``allow_inf``: no DP), checked when the command line is read."""
    number = positive_float(name, allow_inf=allow_inf)

    def parse(text: str) -> float:
        value = number(text)
        if math.isfinite(value) and value > EPSILON_LIMIT:
            raise argparse.ArgumentTypeError(
                f"must be at most {EPSILON_LIMIT:g} (the largest target swarmjax calibrates; "
                f"beyond it no noise is added in any meaningful sense); got {text}"
            )
        return value

    parse.__name__ = name
    return parse


def profile_name(args: argparse.Namespace) -> str:
    """``"quick"``, ``"full"`` or ``"default"``."""
    return "quick" if args.quick else "full" if args.full else "default"


def add_devices(p: argparse.ArgumentParser) -> None:
    """``--devices N``: the devices one run's cohort is split over (docs/scaling.md)."""
    p.add_argument(
        "--devices",
        type=count("--devices"),
        help="devices one run's cohort is split over (default: all present; with one, the "
        "one-device program; docs/scaling.md)",
    )


def devices(args: argparse.Namespace) -> int:
    """The device count of ``--devices`` (default: every device present), checked before
    any work: more than present is one :class:`UserError` line naming how many there are."""
    import jax

    present = jax.device_count()
    if args.devices is not None and args.devices > present:
        raise UserError(
            f"--devices {args.devices}: {present} {jax.default_backend()} device(s) present "
            f"(on a CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N gives N)"
        )
    return present if args.devices is None else args.devices


def layout(algorithm: Any, clients: Any, name: str, count: int, asked: bool) -> tuple[Any, str]:
    """``(mesh or None, one line)``: how a run of ``algorithm`` (``name`` in messages) over
    ``clients`` (the federation's data, or before it is loaded its number of clients: the
    line then does not say whether its data is split) is laid out on ``count`` devices
    (:func:`devices`; ``asked``: the command line gave ``--devices``). One device: no mesh
    (the one-device program). An algorithm whose round exchange is not summed runs on one
    device: said in the line by default, one :class:`UserError` line when ``--devices`` > 1
    was asked."""
    from swarmjax.fl.runtime.mesh import clients_mesh, describe
    from swarmjax.fl.runtime.simulator import num_clients, slot_buffer, splits_data

    n, note = count, ""
    if n > 1 and any(ex.aggregate_sum is None for ex in algorithm.exchanges):
        if asked:
            raise UserError(
                f"--devices {n}: {name}'s round exchange aggregates stacked replies (not a "
                "sum), so its cohort is not split over devices; pass --devices 1"
            )
        n, note = 1, f" ({name}'s exchange is not summed: one device, not {n})"
    mesh = None if n == 1 else clients_mesh(n)
    counted = isinstance(clients, int)  # only the number: whether the data splits is unknown
    total = clients if counted else num_clients(clients)
    split = not counted and splits_data(clients)
    return mesh, describe(mesh, slot_buffer(algorithm, total), total, data_split=split) + note


def seeds(args: argparse.Namespace, default: int) -> list[int]:
    """Seeds ``0 .. N-1`` with ``N`` from ``--seeds`` or ``default``."""
    return list(range(args.seeds if args.seeds is not None else default))


def data_dir(given: str | os.PathLike[str] | None, needs: Iterable[str] = ()) -> Path:
    """The data folder (see the module docs); ``needs``: paths it must contain.

    Raises :class:`UserError` naming where the folder came from when it is missing or lacks
    a needed file (with the command that fetches it).  The default folder may not exist yet
    (nothing fetched): then every dataset is "not staged" there, and the loaders' messages
    name the fetch command.  The result is exported as ``$SWARMJAX_DATA``.
    """
    from swarmjax.data import default_data_dir, fetch_command

    env = os.environ.get("SWARMJAX_DATA")
    needs = list(needs)
    if given is not None:
        source, path = "--data-dir", _folder("--data-dir", given)
    elif env:
        source, path = "$SWARMJAX_DATA", Path(env)
    else:  # the fetch cache: absent until the first fetch, so the datasets' checks speak
        source, path = "default data folder", default_data_dir()
    if source != "default data folder" and not path.is_dir():
        raise UserError(f"{source} {str(path)!r} is not a folder")
    missing = [n for n in needs if not (path / n).exists()]
    if missing:
        folder = path if source == "--data-dir" else None
        raise UserError(
            f"{source} {str(path)!r} lacks {', '.join(missing)} (stage it with "
            f"`{fetch_command(' '.join(_fetch_names(missing)) or 'NAME', folder)}`)"
        )
    if path.is_dir():  # an unfetched default stays unexported: the loaders default to it too
        os.environ["SWARMJAX_DATA"] = str(path.resolve())
    return path


def _fetch_names(paths: Iterable[str]) -> list[str]:
    """The ``python -m swarmjax.data`` names that stage the data-folder ``paths`` (e.g.
    ``"tabular"`` or ``"mnist/"``)."""
    from swarmjax.data import SOURCES

    folders = {s.folder: s.name for s in SOURCES.values()}
    names = []
    for path in paths:
        name = folders.get(Path(path).parts[0]) if Path(path).parts else None
        if name is not None and name not in names:
            names.append(name)
    return names


# how each dataset is staged (one line; the loaders' own message lists every folder looked in)
_STAGE = {
    "mnist": "the four MNIST IDX files (train-images-idx3-ubyte.gz, ...) in <dir>/mnist/",
    "fashion_mnist": "the four Fashion-MNIST IDX files in <dir>/fashion_mnist/",
    "cifar10": "cifar-10-batches-py/ or cifar10.npz in <dir>/cifar10/",
}


def load_dataset(name: str, folder: Path | None, source: str = "--data-dir", **kw: Any) -> Any:
    """:func:`swarmjax.fl.data.load_dataset` without downloading, its failures as one-line
    :class:`UserError` s: a dataset not staged says where it looked and how to stage it; a
    file that cannot be read (truncated, wrong format) says which dataset is incomplete."""
    from swarmjax.data import SOURCES, fetch_command
    from swarmjax.fl.data import DatasetNotFoundError
    from swarmjax.fl.data import load_dataset as load

    where = f"{source} {str(folder)!r}" if folder is not None else "the data folder"
    how = _STAGE.get(name, f"{name}.npz (the medmnist package's file) in <dir>/medmnist/")
    try:
        return load(name, folder, download=False, **kw)
    except DatasetNotFoundError:
        if name in SOURCES:
            named = folder if source == "--data-dir" else None
            get = f"fetch it with `{fetch_command(name, named)}` (or put {how})"
        else:
            get = f"put {how}"
        raise UserError(
            f"dataset {name!r} is not staged in {where}: {get}, or choose another dataset"
        ) from None
    except UNREADABLE as err:
        named = folder if source == "--data-dir" else None
        raise unreadable(f"dataset {name!r} in {where}", err, how, name, named) from None


# what reading a truncated, empty or malformed data file raises
UNREADABLE = (OSError, ValueError, EOFError, KeyError, IndexError, struct.error)


def unreadable(
    what: str,
    err: BaseException,
    how: str,
    dataset: str | None = None,
    folder: Path | None = None,
) -> UserError:
    """The one-line error of a data file that cannot be read: ``what`` is incomplete or
    unreadable (the first line of ``err``); stage it again (``how``), with the fetch command
    of ``dataset`` (default: the dataset whose folder ``how`` names) into ``folder`` (default:
    the data folder), which checks every file against its pinned checksum."""
    from swarmjax.data import SOURCES, fetch_command

    first = str(err).splitlines()[0] if str(err) else type(err).__name__
    names = (
        [dataset] if dataset in SOURCES else _fetch_names(how.replace("<data dir>/", "").split())
    )
    again = (
        f"`{fetch_command(names[0], folder)} --force`"
        if names
        else "`python -m swarmjax.data list`"
    )
    return UserError(
        f"{what} is incomplete or unreadable ({first}): stage it again with {again} (or {how})"
    )


def option_named(args: argparse.Namespace, dests: Sequence[str]) -> str:
    """The flag a refusal names: the first of ``dests`` the command line gave, else the
    first of ``dests`` (the option that changes the value)."""
    return _flag(next((d for d in dests if d in given(args)), dests[0]))


def data_source(args: argparse.Namespace) -> str:
    """How a message names the data folder: ``"--data-dir"`` when the command line gave it,
    else ``"the data folder"`` (it came from ``$SWARMJAX_DATA`` or the default)."""
    return "--data-dir" if "data_dir" in given(args) else "the data folder"


def physical_memory() -> int:
    """Bytes of physical memory of this machine (``os.sysconf`` pages x page size)."""
    return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))


def array_bytes(*shapes: Sequence[int] | int, itemsize: int = 4) -> int:
    """Bytes of float32 (``itemsize``) arrays of ``shapes`` (an int is a flat length): the
    unit of every script's memory estimate."""
    return sum(math.prod((s,) if isinstance(s, int) else s) * itemsize for s in shapes)


MEMORY_SHARE = 0.8  # a run may use this share of the machine's memory


def check_memory(need: int, option: str, what: str) -> None:
    """Refuse (:class:`UserError`) a run whose estimated allocation ``need`` (bytes, from
    :func:`array_bytes`) exceeds :data:`MEMORY_SHARE` of :func:`physical_memory`, naming the
    estimate, ``what`` it holds and ``option``, the option to lower."""
    have = physical_memory()
    if need > MEMORY_SHARE * have:
        raise UserError(
            f"{option}: the run would allocate about {need / 2**30:.3g} GiB ({what}), more than "
            f"{MEMORY_SHARE:.0%} of this machine's {have / 2**30:.3g} GiB; lower {option}"
        )


class Pace:
    """A per-round callback (``simulate(callbacks=...)``) that prints, once, how long the
    experiment will take and the memory it holds: after the second round it sees (the first
    compiles), the seconds of one compiled round times the rounds still to run, in this run
    and in the runs after it, plus one compilation per later run (the first round's excess),
    and the process's peak memory so far (the compiled round's buffers included). Above
    the simulator's :data:`~swarmjax.fl.runtime.simulator.LONG_RUN_SECONDS` (an hour) the
    line is a warning with the options that shorten it.

    Args:
        run_rounds: this run's rounds (a resumed run's finished ones are not counted again).
        later_rounds: the rounds of the runs after this one.
        later_runs: how many runs come after this one (each compiles its first round).
        shorten: the options that shorten the experiment, for the warning.
        clock: seconds (``time.perf_counter``; tests pass a fake one).
    """

    def __init__(
        self,
        run_rounds: int,
        later_rounds: int = 0,
        later_runs: int = 0,
        shorten: str = "--rounds",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.run_rounds, self.later_rounds, self.later_runs = run_rounds, later_rounds, later_runs
        self.shorten, self.clock = shorten, clock
        self.started = clock()
        self.marks: list[tuple[int, float]] = []
        self.line: str | None = None

    def __call__(self, round: int, metrics: Mapping[str, Any], runs: Any) -> None:
        """Note that ``round`` finished; at the second round seen, print the estimate."""
        if self.line is not None:
            return
        self.marks.append((round, self.clock()))
        if len(self.marks) < 2:
            return
        (r0, t0), (r1, t1) = self.marks
        per_round = (t1 - t0) / (r1 - r0)
        first = t0 - self.started  # the first round seen, compilation included
        rounds = self.run_rounds - r1 + self.later_rounds
        left = per_round * rounds + max(first - per_round, 0.0) * self.later_runs
        from experiments._report import peak_memory_gib  # lazily: matplotlib, JAX
        from swarmjax.fl.runtime.simulator import LONG_RUN_SECONDS

        self.line = (
            f"pace: {per_round:.3g} s a round after compilation ({first:.3g} s the first), "
            f"{peak_memory_gib():.2g} GiB peak memory; about {_duration(left)} left on this "
            f"machine ({rounds} rounds)"
        )
        if left > LONG_RUN_SECONDS:
            self.line = (
                f"warning: {self.line}; Ctrl-C stops it (the same command resumes), "
                f"{self.shorten} shorten it"
            )
        print(self.line, flush=True)


def _duration(seconds: float) -> str:
    """``"42 s"``, ``"7 min"`` or ``"2.4 hours"``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} hours"


def memory_line(need: int) -> str:
    """The estimate ``need`` (bytes) beside this machine's memory, for a run's first line."""
    have = physical_memory() / 2**30
    return f"memory: about {need / 2**30:.2g} GiB of this machine's {have:.3g} GiB"


def out_file(args: argparse.Namespace, dest: str = "out") -> Path:
    """The file option ``dest`` (e.g. a benchmark's ``--out results/x.json``): its folder
    created and checked writable now, before any work; else a :class:`UserError`."""
    flag = _flag(dest)
    if not os.fspath(getattr(args, dest)):
        raise UserError(f"{flag} is empty; give {flag} a file name")
    path = Path(getattr(args, dest)).expanduser()
    name = f"{flag} {str(path)!r}" if dest in given(args) else f"the default {flag} {str(path)!r}"
    if path.is_dir():
        raise UserError(f"{name} is a folder; give {flag} a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = path.parent / ".write-probe"
        probe.write_text("")
        probe.unlink()
    except (OSError, ValueError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise UserError(f"{name}: its folder is not writable ({reason})") from None
    return path


def process_options(args: argparse.Namespace) -> None:
    """Apply the options that set up this process; call it right after parsing.

    * ``--no-progress``: no progress bars, from the experiment or the simulator: recorded
      as ``TQDM_DISABLE=1`` in the environment (tqdm's own switch, inherited by the
      processes the experiment starts), which :func:`progress_bars` reads.
    * ``--jax-cache``: every compiled program is kept in that folder (owner-only) and
      loaded by later runs (``experiments.cross_device --quick``: 36 programs, 1.1 MB);
      ``''`` keeps none. Without the option nothing is changed: no cache, unless
      ``$JAX_COMPILATION_CACHE_DIR`` (read by JAX itself) names one. Opt-in because a
      compiled program keeps the constants it was traced with, and a program that closed
      over a key would write it there (docs/privacy.md). JAX decides at a process's first
      compilation whether it uses the cache, and never again.
    """
    if getattr(args, "no_progress", False):
        os.environ["TQDM_DISABLE"] = "1"
    import jax

    if "jax_cache" not in given(args):
        return
    if not args.jax_cache:
        jax.config.update("jax_compilation_cache_dir", None)
        return
    try:
        use_compilation_cache(args.jax_cache)
    except OSError as err:
        raise UserError(
            f"--jax-cache {args.jax_cache!r} is not a folder this user can create: "
            f"{err.strerror or err}; give another, or '' to keep no compiled programs"
        ) from None


def progress_bars() -> bool:
    """Whether this process draws progress bars: not after ``--no-progress``
    (:func:`process_options`) or with ``$TQDM_DISABLE`` set true. The experiments pass it
    to the simulator (``Execution(progress=...)``), which otherwise draws them only on a
    terminal."""
    return os.environ.get("TQDM_DISABLE", "").lower() not in ("1", "true", "yes")


def out_dir(args: argparse.Namespace) -> Path:
    """``--out`` (default ``results/<experiment>/`` in the repository), created and checked
    writable (results and the privacy ledger go there); else a :class:`UserError`."""
    out = _folder("--out", args.out)
    name = f"--out {str(out)!r}" if "out" in given(args) else f"the default --out {str(out)!r}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-probe"
        probe.write_text("")
        probe.unlink()
    except (OSError, ValueError) as err:  # ValueError: e.g. a NUL byte in the path
        reason = getattr(err, "strerror", None) or str(err)
        raise UserError(
            f"{name} is not a writable folder (results and the privacy ledger go there): "
            f"{reason}; give --out a folder you can write"
        ) from None
    _lock(out, name)
    return out


def _folder(flag: str, value: str | os.PathLike[str]) -> Path:
    """``value`` of the folder option ``flag`` (:func:`swarmjax._validation.check_folder`:
    ``~`` expanded; an empty one, which would mean the current folder, or a file refused
    as a :class:`UserError`)."""
    try:
        return check_folder(flag, value)
    except ValueError as err:
        raise UserError(str(err)) from None


_LOCKS: dict[Path, Any] = {}  # --out folders this process holds, kept open until it exits


def _lock(out: Path, name: str) -> None:
    """Hold ``<out>/.lock`` (an exclusive ``flock``) for the rest of the process, so that a
    second run into the same folder is refused in one line instead of mixing results."""
    import fcntl

    folder = out.resolve()
    if folder in _LOCKS:
        return
    handle = open(folder / ".lock", "a+")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise UserError(
            f"{name} is in use by another run ({holder}); wait for it to finish, or give "
            "--out another folder"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    handle.flush()
    _LOCKS[folder] = handle


def release_out_dir(out: str | os.PathLike[str]) -> None:
    """Let go of ``out``'s lock before the process ends (a long-lived caller that runs one
    experiment after another into the same folder need not)."""
    handle = _LOCKS.pop(Path(out).resolve(), None)
    if handle is not None:
        handle.close()


def call_store(
    out: Path,
    settings: Mapping[str, Any],
    experiment: ModuleType | str,
    args: argparse.Namespace,
    *,
    parts: Sequence[ModuleType] = (),
    ledger: Any = None,
) -> CallStore:
    """The saved-calls store ``<out>/calls/``, keyed by ``settings`` and the source of the
    package, of ``experiment`` (a module or its name) and of its helper modules ``parts``.

    From ``args``: ``--restart`` (recompute every call) and ``--secret-file``
    (:func:`supplied_secret`: every call's secret derived from it; without it each call
    draws its own, :meth:`~swarmjax.resume.CallStore.secret`). ``ledger``: the
    experiment's :class:`~swarmjax.privacy.ledger.Ledger`, told that the store's folder
    (its cache and, under ``secret/``, the calls' secrets) is not released."""
    module = sys.modules[experiment] if isinstance(experiment, str) else experiment
    store = CallStore(
        out / "calls",
        settings,
        restart=bool(getattr(args, "restart", False)),
        code=(module, *parts),
        secret=supplied_secret(args),
    )
    if ledger is not None:
        ledger.mark_not_released(store.folder, SECRET_NOT_RELEASED)
    return store


SECRET_NOT_RELEASED = (
    "the experiment's cache of finished calls (raw payloads, which may hold statistics of "
    "private data that no epsilon covers) and, under secret/, the calls' secrets: the 256-bit "
    "roots of every random number of their runs (noise, cohorts, batches); whoever holds "
    "one can regenerate that call's noise and subtract it, so never publish, share or "
    "commit this folder"
)
"""Why a call store's folder is never released."""


def entry_point(main: Callable[..., T]) -> Callable[..., T]:
    """Wrap ``main(argv)``: a :class:`UserError` or an output folder that cannot be used
    (:class:`~swarmjax.resume.OutputConflict`: a corrupt saved call, a folder holding
    another run) prints one line on stderr and exits 2; Ctrl-C prints one line saying how
    to resume and exits 130 (no traceback)."""

    @functools.wraps(main)
    def wrapped(argv: Sequence[str] | None = None) -> T:
        spec = getattr(sys.modules.get(main.__module__), "__spec__", None)
        prog = f"python -m {spec.name if spec else main.__module__}"
        try:
            return main(argv)
        except (UserError, OutputConflict) as exc:
            print(f"{prog}: error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        except KeyboardInterrupt:
            print(
                f"\n{prog}: interrupted. Finished calls and checkpoints are kept in the --out "
                "folder: rerun the same command to resume from them (--restart starts over).",
                file=sys.stderr,
            )
            raise SystemExit(130) from None

    return wrapped
