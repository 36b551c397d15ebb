"""Download, verify and stage one dataset (see :mod:`swarmjax.data`).

A fetch works in a hidden folder beside the dataset's (``<data dir>/.<folder>.partial-*``):
every file is downloaded (or extracted from the dataset's archive) there and checked
against its pin; only when all of them pass are they moved into ``<data dir>/<folder>/``
(one rename when that folder does not exist yet, else one atomic replace per file).  Any
failure, Ctrl-C included, removes the hidden folder, so a dataset is never half-staged.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from swarmjax.data._sources import Pin, Source

__all__ = ["FetchError", "fetch", "staged", "verify"]

_CHUNK = 1 << 20
_TIMEOUT_S = 60.0
# what a failed download raises (no connection, HTTP error, reset, timeout, bad URL)
_NETWORK = (urllib.error.URLError, OSError, TimeoutError, ValueError)


class FetchError(Exception):
    """A dataset could not be fetched or verified (one line: which file, from where, why)."""


class _Mismatch(FetchError):
    """A downloaded file's size or checksum differs from its pin."""


def _log_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _mb(size: int | None) -> str:
    if size is None:
        return "size not pinned"
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size / 1e3:.1f} kB"


def _digest(path: Path, algorithm: str) -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _check(path: Path, pin: Pin, what: str) -> None:
    """Raise :class:`_Mismatch` unless ``path`` has ``pin``'s size and digest."""
    size = path.stat().st_size
    if pin.size is not None and size != pin.size:
        raise _Mismatch(f"{what} has {size:,} bytes, not the pinned {pin.size:,}")
    got = _digest(path, pin.algorithm)
    if got != pin.digest:
        raise _Mismatch(
            f"{what} has {pin.algorithm} {got[:16]}..., not the pinned {pin.digest[:16]}..."
        )


def _download(url: str, dest: Path, pin: Pin | None, what: str) -> None:
    """Stream ``url`` into ``dest`` and check it against ``pin`` (a file larger than the
    pinned size is cut off as soon as it passes it)."""
    request = urllib.request.Request(url, headers={"User-Agent": "swarmjax-data"})
    written = 0
    with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response, open(dest, "wb") as out:
        while chunk := response.read(_CHUNK):
            written += len(chunk)
            if pin is not None and pin.size is not None and written > pin.size:
                raise _Mismatch(f"{what} is larger than the pinned {pin.size:,} bytes")
            out.write(chunk)
    if pin is not None:
        _check(dest, pin, what)


def _download_any(urls: list[str], dest: Path, pin: Pin | None, what: str, log) -> str:
    """Try ``urls`` in order; the first that gives a verified file wins (its URL returned).
    A checksum mismatch is reported before a network failure: it is the one to act on."""
    failures: list[str] = []
    mismatch: str | None = None
    for url in urls:
        try:
            _download(url, dest, pin, f"{what} from {url}")
            return url
        except _Mismatch as err:
            mismatch = mismatch or str(err)
            log(f"  {err}")
        except _NETWORK as err:
            reason = getattr(err, "reason", None) or err
            failures.append(f"{url}: {type(err).__name__}: {reason}")
            log(f"  {what}: {failures[-1]}")
    if mismatch is not None:
        raise FetchError(f"refused: {mismatch}; nothing was staged")
    raise FetchError(
        f"could not download {what} ({'; '.join(failures)}); nothing was staged "
        "(offline? fetch from a copy with --mirror URL)"
    )


def _urls(source: Source, name: str, mirror: str | None) -> list[str]:
    if mirror is not None:
        return [f"{mirror.rstrip('/')}/{source.folder}/{name}"]
    return [u.format(name=name) for u in source.urls]


def _from_archive(source: Source, work: Path, mirror: str | None, log) -> None:
    archive = source.archive
    assert archive is not None
    path = work / f".{archive.name}"
    if mirror is not None:
        urls = [f"{mirror.rstrip('/')}/{source.folder}/{archive.name}"]
    else:
        urls = list(archive.urls)
    url = _download_any(urls, path, archive.pin, f"{source.name}: {archive.name}", log)
    log(f"  {archive.name}: {_mb(path.stat().st_size)}, {archive.pin.algorithm} ok ({url})")
    with tarfile.open(path, "r:*") as tar:
        for name in source.files:  # only the named members, written by name: no path tricks
            member = f"{archive.prefix}{name}"
            try:
                info = tar.getmember(member)
            except KeyError:
                raise FetchError(
                    f"{source.name}: {archive.name} lacks {member}; nothing was staged"
                ) from None
            data = tar.extractfile(info) if info.isfile() else None
            if data is None:
                raise FetchError(f"{source.name}: {member} in {archive.name} is not a file")
            dest = work / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            with data, open(dest, "wb") as out:
                shutil.copyfileobj(data, out, _CHUNK)
    path.unlink()


def _install(work: Path, target: Path, names: list[str]) -> None:
    """Move the verified files of ``work`` to ``target``."""
    if not target.exists():
        os.chmod(work, 0o755)  # mkdtemp made it private; a data folder is not
        os.rename(work, target)  # one step: the folder appears complete or not at all
        return
    for name in names:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(work / name, target / name)


def staged(source: Source, root: Path) -> bool:
    """Whether every file of ``source`` is in ``root/<folder>/`` with its pinned size (a
    quick look; :func:`verify` checks the contents)."""
    folder = root / source.folder
    for name, pin in source.files.items():
        path = folder / name
        if not path.is_file():
            return False
        if pin is not None and pin.size is not None and path.stat().st_size != pin.size:
            return False
    return True


def verify(source: Source, root: Path) -> list[str]:
    """The problems of ``root/<folder>/`` against the pins (empty: every file present and,
    where pinned, with its checksum)."""
    problems = []
    for name, pin in source.files.items():
        path = root / source.folder / name
        if not path.is_file():
            problems.append(f"{source.folder}/{name} is missing")
            continue
        if pin is None:
            continue
        try:
            _check(path, pin, f"{source.folder}/{name}")
        except _Mismatch as err:
            problems.append(str(err))
    return problems


def fetch(
    source: Source,
    root: Path,
    *,
    mirror: str | None = None,
    force: bool = False,
    log: Callable[[str], None] = _log_stderr,
) -> Path:
    """Stage ``source`` in ``root/<folder>/`` and return that folder.

    A dataset already staged with every pinned checksum is left alone unless ``force``.
    ``mirror``: a base URL laid out like a data folder, used instead of the publishers'
    URLs.  Raises :class:`FetchError` (one line) when no URL gives the pinned files; the
    data folder is then as it was.
    """
    target = root / source.folder
    if not force and staged(source, root) and not verify(source, root):
        log(f"{source.name}: already staged in {target} (checksums verified)")
        return target
    root.mkdir(parents=True, exist_ok=True)
    log(f"{source.name}: fetching {_mb(source.size)} into {target}")
    work = Path(tempfile.mkdtemp(prefix=f".{source.folder}.partial-", dir=root))
    try:
        if source.archive is not None and not (mirror is not None and source.fully_pinned):
            _from_archive(source, work, mirror, log)
            for name, pin in source.files.items():  # the extracted files, where pinned
                if pin is not None:
                    _check(work / name, pin, f"{source.folder}/{name} in {source.archive.name}")
        else:
            for name, pin in source.files.items():
                dest = work / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                what = f"{source.folder}/{name}"
                url = _download_any(_urls(source, name, mirror), dest, pin, what, log)
                algorithm = pin.algorithm if pin is not None else "checksum"
                log(f"  {name}: {_mb(dest.stat().st_size)}, {algorithm} ok ({url})")
        _install(work, target, list(source.files))
    except _Mismatch as err:
        raise FetchError(f"refused: {err}; nothing was staged") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"{source.name}: staged in {target}")
    return target
