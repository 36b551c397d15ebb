"""The datasets the experiments read: where they live, and how to get them.

From a shell::

    python -m swarmjax.data list              # each dataset, its size, who reads it, staged?
    python -m swarmjax.data fetch mnist       # download, verify (SHA-256), stage
    python -m swarmjax.data fetch all
    python -m swarmjax.data verify all        # re-check what is staged

The data folder is ``--data-dir`` (``data_dir=`` in Python), else ``$SWARMJAX_DATA``, else
:func:`default_data_dir` (``$XDG_CACHE_HOME/swarmjax/data``, normally
``~/.cache/swarmjax/data``).  Each dataset is staged in its own folder there (``mnist/``,
``fashion_mnist/``, ``tabular/``, ``shakespeare/``, ``medmnist/``, ``cifar10/``), the layout
:func:`swarmjax.fl.load_dataset`, :func:`swarmjax.fl.data.shakespeare.load_shakespeare` and
the experiments read.  A download is checked against the checksums pinned in this package
before anything is put in place, and a failed or refused download leaves the data folder as
it was.  ``--mirror URL`` (or ``$SWARMJAX_DATA_MIRROR``) fetches from a copy laid out like a
data folder (``<URL>/mnist/train-images-idx3-ubyte.gz``, ...; ``file://`` works too)
instead of the publishers' servers.  docs/data.md: each dataset's origin and licence.
"""

from __future__ import annotations

import os
from pathlib import Path

from swarmjax._validation import check_folder, did_you_mean
from swarmjax.data._fetch import FetchError, fetch, staged, verify
from swarmjax.data._sources import ALIASES, SOURCES, Archive, Pin, Source

__all__ = [
    "DATA_ENV",
    "MIRROR_ENV",
    "SOURCES",
    "Archive",
    "FetchError",
    "Pin",
    "Source",
    "data_dir",
    "default_data_dir",
    "fetch",
    "fetch_command",
    "search_folders",
    "source",
    "staged",
    "verify",
]

DATA_ENV = "SWARMJAX_DATA"
MIRROR_ENV = "SWARMJAX_DATA_MIRROR"


def default_data_dir() -> Path:
    """``$XDG_CACHE_HOME/swarmjax/data`` (an absolute ``XDG_CACHE_HOME`` only, as the XDG
    specification asks), else ``~/.cache/swarmjax/data``.  Not created here."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    cache = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return cache / "swarmjax" / "data"


def data_dir(given: str | os.PathLike[str] | None = None) -> Path:
    """The data folder: ``given``, else ``$SWARMJAX_DATA``, else :func:`default_data_dir`."""
    if given is not None:
        return check_folder("data_dir", given)  # "" is no folder; nor is a file
    env = os.environ.get(DATA_ENV)
    return Path(env).expanduser() if env else default_data_dir()


def search_folders(given: str | os.PathLike[str] | None = None) -> list[Path]:
    """Where the library's loaders look, in order: ``given``, then ``$SWARMJAX_DATA``; the
    default folder only when neither is set (a named folder never falls back to it)."""
    folders = [Path(given).expanduser()] if given is not None else []
    env = os.environ.get(DATA_ENV)
    if env and Path(env).expanduser() not in folders:
        folders.append(Path(env).expanduser())
    return folders or [default_data_dir()]


def source(name: str) -> Source:
    """The :class:`Source` of ``name`` (or one of its aliases, e.g. ``apdim``).

    Raises:
        FetchError: an unknown name (the message lists the names).
    """
    key = ALIASES.get(name, name)
    if key not in SOURCES:
        raise FetchError(
            f"unknown dataset {name!r}{did_you_mean(name, [*SOURCES, *ALIASES])}; the names "
            f"are: {', '.join(SOURCES)} (or all)"
        )
    return SOURCES[key]


def fetch_command(name: str | None = None, folder: str | os.PathLike[str] | None = None) -> str:
    """The shell command that stages ``name`` (``NAME`` when ``None``), with ``--data-dir``
    when ``folder`` is given: what every "not staged" message tells a user to run."""
    command = f"python -m swarmjax.data fetch {name or 'NAME'}"
    return f"{command} --data-dir {folder}" if folder is not None else command
