"""``python -m swarmjax.data list | fetch NAME... | verify NAME...`` (see :mod:`swarmjax.data`).

Exit status: 0 done; 1 a download failed or was refused (one line each); 2 bad input (one
line); 130 interrupted (nothing half-staged).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from swarmjax._validation import check_folder, choice_hint
from swarmjax.data import (
    DATA_ENV,
    MIRROR_ENV,
    SOURCES,
    FetchError,
    data_dir,
    default_data_dir,
    fetch,
    source,
    staged,
    verify,
)

PROG = "python -m swarmjax.data"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage block
        self.exit(2, f"{self.prog}: error: {choice_hint(message)} (see --help)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="Download, verify (pinned checksums) and stage the datasets the "
        "experiments read.",
        epilog=f"The data folder: --data-dir, else ${DATA_ENV}, else {default_data_dir()}. "
        "Names: " + ", ".join(SOURCES) + ".",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    folder = argparse.ArgumentParser(add_help=False)
    folder.add_argument("--data-dir", help=f"data folder (default: ${DATA_ENV}, else the cache)")
    sub.add_parser("list", parents=[folder], help="each dataset: size, who reads it, staged?")
    f = sub.add_parser("fetch", parents=[folder], help="download, verify and stage datasets")
    f.add_argument("names", nargs="+", metavar="NAME", help="dataset names, or all")
    f.add_argument(
        "--mirror",
        help=f"base URL of a copy laid out like a data folder (http(s):// or file://; "
        f"default ${MIRROR_ENV}, else the publishers' servers)",
    )
    f.add_argument("--force", action="store_true", help="download again even if staged")
    v = sub.add_parser("verify", parents=[folder], help="check staged files against the pins")
    v.add_argument("names", nargs="+", metavar="NAME", help="dataset names, or all")
    return p


def _names(given: Sequence[str]) -> list[str]:
    if "all" in given:
        return list(SOURCES)
    names: list[str] = []
    for name in given:
        key = source(name).name  # FetchError for an unknown name
        if key not in names:
            names.append(key)
    return names


def _list(root) -> int:
    print(f"data folder: {root}")
    for s in SOURCES.values():
        state = "staged" if staged(s, root) else "not staged"
        print(f"\n{s.name:14s} [{state}]  {s.title}")
        print(f"{'':14s} in {s.folder}/; read by {', '.join(s.used_by)}")
    print(f"\nfetch one: {PROG} fetch NAME; all of them: {PROG} fetch all")
    return 0


def _fetch(root, names: list[str], mirror: str | None, force: bool) -> int:
    failed = []
    for name in names:
        try:
            fetch(SOURCES[name], root, mirror=mirror, force=force)
        except FetchError as err:
            print(f"{PROG}: error: {name}: {err}", file=sys.stderr)
            failed.append(name)
    if failed and len(names) > 1:
        print(f"{PROG}: not staged: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def _verify(root, names: list[str]) -> int:
    bad = 0
    for name in names:
        s = SOURCES[name]
        problems = verify(s, root)
        if not problems:
            print(f"{name}: ok ({root / s.folder})")
            continue
        bad += 1
        if len(problems) == len(s.files) and not (root / s.folder).exists():
            print(f"{name}: not staged in {root} (run: {PROG} fetch {name})")
            continue
        more = f"; {len(problems) - 3} more" if len(problems) > 3 else ""
        print(f"{name}: {'; '.join(problems[:3])}{more} (run: {PROG} fetch {name} --force)")
    return 1 if bad else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:  # before any download: "" (the current folder) or a file is no data folder
        given = args.data_dir
        root = data_dir() if given is None else check_folder("--data-dir", given)
    except ValueError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    try:
        if args.command == "list":
            return _list(root)
        names = _names(args.names)
        if args.command == "verify":
            return _verify(root, names)
        mirror = args.mirror or os.environ.get(MIRROR_ENV) or None
        return _fetch(root, names, mirror, args.force)
    except FetchError as err:  # an unknown name
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; nothing was half-staged (rerun to continue)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
