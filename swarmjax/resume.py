"""Finished pieces of a long experiment kept on disk, so that a rerun resumes where it stopped.

An experiment made of several long calls (e.g. one per dataset x partition x epsilon group)
gives each call a key and runs it through :meth:`CallStore.fetch_or_run`.  The call's table
(``<key>.csv``, read back with its column dtypes, so float32 columns return bit for bit) and
its JSON payload (``<key>.json``) are written, each to a temporary name
and renamed, as soon as it returns; the payload is written last and marks the call finished.
A rerun with the same settings loads finished calls instead of running them again, so an
interrupted experiment loses at most the call in progress.

Settings that change a call's result (hyper-parameters, ...) and the code that computes it
pick the folder, ``root/<settings id>/``: a rerun with other settings never reuses a result
made with different ones, and neither does a rerun after the code changed, because the
store adds :func:`code_fingerprint` (a hash of every ``.py`` file of the installed
``swarmjax`` package and of the modules passed as ``code``, e.g. the experiment script) to
the settings.  Settings must be JSON-serialisable (``str`` is used for anything else).

Secrets: :meth:`CallStore.secret` gives each call its own secret
(:class:`~swarmjax.privacy.secret.Secret`, operating-system entropy), saved under
``<folder>/secret/`` (:data:`SECRET_FOLDER`; the experiment's ledger lists it as not
released) so that a rerun resuming an unfinished call draws the same noise, while a call run
anew (``restart``, other settings or code: another folder) draws a fresh one.  With a
supplied secret (reproducible mode) each call's secret is derived from it by the folder's
settings id and the call key.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from swarmjax.privacy.secret import Secret

__all__ = [
    "SECRET_FOLDER",
    "CallStore",
    "Fetched",
    "OutputConflict",
    "code_fingerprint",
    "settings_id",
    "write_atomic",
]

SECRET_FOLDER = "secret"
"""Sub-folder of a store's folder holding its calls' secrets (never released)."""

_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=+-]*$")


class OutputConflict(ValueError):
    """An output folder holds something this run cannot use: a corrupt saved call, or a run
    with other settings. The message is one line naming the file or folder and the way out
    (``--restart``, another folder); experiments print it without a traceback."""


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` then rename ``tmp`` to ``path``: readers never see a partial file."""
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def _plain(value: Any) -> Any:
    """NumPy scalars and arrays as Python numbers and lists, for :func:`json.dumps`."""
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot save a {type(value).__name__} in a call's JSON payload")


def _settings_text(settings: Mapping[str, Any]) -> str:
    return json.dumps(dict(settings), sort_keys=True, default=str, indent=1)


def _source_hash(paths: tuple[Path, ...]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def code_fingerprint(*code: ModuleType | str | os.PathLike[str]) -> str:
    """A 16-hex-digit hash of the ``swarmjax`` package's source and of ``code``.

    ``code``: extra modules (or source files) whose text a result depends on.  Any edit to
    any ``.py`` file of the package, or to those, gives another fingerprint.
    """
    package = Path(__file__).resolve().parent
    paths = sorted(package.rglob("*.py"))
    for item in code:
        where = getattr(item, "__file__", None) if isinstance(item, ModuleType) else item
        if where is None:
            raise ValueError(f"code: {item!r} has no source file to fingerprint")
        paths.append(Path(where).resolve())
    return _source_hash(tuple(paths))


def settings_id(settings: Mapping[str, Any]) -> str:
    """A 12-hex-digit id of ``settings`` (order of keys does not matter)."""
    return hashlib.sha256(_settings_text(settings).encode()).hexdigest()[:12]


class Fetched(NamedTuple):
    """What :meth:`CallStore.fetch_or_run` returns."""

    table: pd.DataFrame
    payload: Any
    reused: bool  # loaded from disk (True) or computed by this call (False)


class CallStore:
    """Results of the finished calls of one experiment under ``root/<settings id>/``.

    Args:
        root: folder holding one sub-folder per distinct ``settings``.
        settings: everything, besides the call key, that a call's result depends on; saved
            beside the results as ``settings.json``.
        restart: ignore (and overwrite) finished calls instead of reusing them.
        code: modules (or source files) besides the ``swarmjax`` package whose source the
            results depend on; their fingerprint joins ``settings`` as ``"code"``.
        secret: a supplied secret (reproducible mode): every call's secret is derived from
            it; ``None`` (default): each call draws its own from operating-system entropy.

    Attributes:
        folder: where this store reads and writes.
        reused: keys loaded from disk by :meth:`fetch_or_run`, in call order.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        settings: Mapping[str, Any],
        *,
        restart: bool = False,
        code: Sequence[ModuleType | str | os.PathLike[str]] = (),
        secret: Secret | None = None,
    ) -> None:
        if "code" in settings:
            raise ValueError("settings must not have a 'code' key: the store sets it")
        settings = {**settings, "code": code_fingerprint(*code)}
        self.folder = Path(root) / settings_id(settings)
        self.folder.mkdir(parents=True, exist_ok=True)
        text = _settings_text(settings)
        write_atomic(self.folder / "settings.json", lambda p: p.write_text(text))
        self.restart = restart
        self.reused: list[str] = []
        self.supplied = secret
        self._secrets: dict[str, Secret] = {}

    def _paths(self, key: str) -> tuple[Path, Path]:
        if not isinstance(key, str) or not _KEY.match(key):
            raise ValueError(
                f"key must start with a letter or digit and use only letters, digits and "
                f"'_.=+-'; got {key!r}"
            )
        return self.folder / f"{key}.csv", self.folder / f"{key}.json"

    def finished(self, key: str) -> bool:
        """Whether ``key`` has a saved result (``restart`` ignored)."""
        table, payload = self._paths(key)
        return payload.exists() and table.exists()

    def fetch_or_run(
        self,
        key: str,
        run: Callable[..., tuple[pd.DataFrame, Any]],
        *,
        with_secret: bool = False,
    ) -> Fetched:
        """The saved ``(table, payload)`` of ``key``, or ``run()``'s, saved before returning.

        ``with_secret``: call ``run(secret=self.secret(key))`` (a private call's noise from
        its own secret, :meth:`secret`) instead of ``run()``.

        ``payload`` is anything :func:`json.dumps` accepts, plus NumPy scalars and arrays;
        it is returned as decoded from its JSON (NumPy values as Python numbers and lists,
        tuples as lists) whether computed now or loaded, so both paths see the same types.
        ``inf`` and ``NaN`` round-trip.
        """
        table_path, payload_path = self._paths(key)
        if not self.restart and self.finished(key):
            self.reused.append(key)
            try:
                saved = json.loads(payload_path.read_text())
                table = pd.read_csv(table_path).astype(saved["dtypes"])
            except (ValueError, KeyError, TypeError, OSError, pd.errors.ParserError) as err:
                why = (str(err).splitlines() or [""])[0][:120]
                raise OutputConflict(
                    f"the saved call {str(payload_path)!r} (or its table) cannot be read "
                    f"({type(err).__name__}: {why}); rerun with --restart to recompute every "
                    "call, or delete that file"
                ) from None
            return Fetched(table, saved["payload"], True)
        table, payload = run(secret=self.secret(key)) if with_secret else run()
        dtypes = {str(col): str(dtype) for col, dtype in table.dtypes.items()}
        text = json.dumps({"payload": payload, "dtypes": dtypes}, default=_plain)
        write_atomic(table_path, lambda p: table.to_csv(p, index=False))
        write_atomic(payload_path, lambda p: p.write_text(text))
        return Fetched(table, json.loads(text)["payload"], False)  # as a rerun will see it

    @property
    def secret_folder(self) -> Path:
        """Where the calls' secrets are kept (list it as not released)."""
        return self.folder / SECRET_FOLDER

    def secret(self, key: str) -> Secret:
        """The secret of call ``key``: the one saved for it when it is resumed, else a fresh
        one (saved before it is returned, so an interrupted call resumes with it).

        With ``restart`` a call draws a fresh secret once per store (the same one for every
        request of ``key`` in this process).  With a supplied secret it is
        ``supplied.derive("<settings id>/<key>")`` and nothing is saved.
        """
        self._paths(key)  # checks the key
        if key in self._secrets:
            return self._secrets[key]
        if self.supplied is not None:
            made = self.supplied.derive(f"{self.folder.name}/{key}")
        else:
            made = Secret.kept_in(self.secret_folder / f"{key}.key", fresh=self.restart)
        self._secrets[key] = made
        return made

    def fetch_or_run_table(self, key: str, run: Callable[[], pd.DataFrame]) -> pd.DataFrame:
        """:meth:`fetch_or_run` for a call whose whole result is one table."""
        return self.fetch_or_run(key, lambda: (run(), None)).table
