"""Shared helpers for benchmark scripts: machine description, timing, RESULTS.md sections.

Each benchmark owns one section of ``benchmarks/RESULTS.md`` between markers
``<!-- NAME:start -->`` and ``<!-- NAME:end -->``; re-running it replaces only that section.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import time
from collections.abc import Callable
from pathlib import Path

import jax

RESULTS = Path(__file__).with_name("RESULTS.md")
_HEADER = "# Benchmark results\n\nEach section is written by the script named in its title.\n"


def machine() -> str:
    """One line naming the CPU/accelerator, core count, JAX version and date."""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    # platform.processor() runs `uname -p` in a subprocess: only where /proc has no name
    cpu = cpu or platform.processor() or platform.machine()
    devices = ", ".join(sorted({d.device_kind for d in jax.devices()}))
    return (
        f"{cpu}, {os.cpu_count()} cores; JAX {jax.__version__} on {jax.default_backend()} "
        f"({devices}); {_dt.date.today().isoformat()}"
    )


def device_slug() -> str:
    """``<backend>-<device kind>`` of JAX's default device, lower-cased with non-alphanumerics
    as ``-`` (``cpu-cpu``, ``gpu-nvidia-h100-80gb-hbm3``): what a RESULTS.md section adds to
    its name so that each kind of machine keeps its own figures."""
    dev = jax.devices()[0]
    kind = re.sub(r"[^a-z0-9]+", "-", dev.device_kind.lower()).strip("-")
    return f"{dev.platform}-{kind}"


def best_time(fn: Callable[[], object], *, repeats: int = 3, min_time: float = 0.0) -> float:
    """Best wall time in seconds of ``fn()`` over ``repeats`` calls (``fn`` must block)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        if best >= min_time > 0 and repeats > 1:
            repeats -= 1
    return best


def write_section(name: str, markdown: str, path: Path = RESULTS) -> None:
    """Replace (or append) the section ``name`` of RESULTS.md with ``markdown``."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = path.read_text() if path.exists() else _HEADER
    block = f"{start}\n{markdown.rstrip()}\n{end}"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


_SECTION = re.compile(r"<!-- (?P<name>[^ ]+):start -->\n.*?<!-- (?P=name):end -->", re.S)


def sections(text: str) -> dict[str, str]:
    """The sections of a RESULTS.md text: name -> its markdown between the markers."""
    return {m["name"]: m[0].split("\n", 1)[1].rsplit("\n", 1)[0] for m in _SECTION.finditer(text)}


def merge_sections(source: Path, path: Path = RESULTS) -> list[str]:
    """Write into ``path`` every section of the RESULTS.md copy ``source`` that ``path``
    lacks or holds differently (the sections a device run wrote into its own copy); returns
    their names."""
    have, came = sections(path.read_text() if path.exists() else ""), sections(source.read_text())
    new = [name for name, md in came.items() if have.get(name) != md]
    for name in new:
        write_section(name, came[name], path)
    return new


if __name__ == "__main__":  # python -m benchmarks._results merge COPY_OF_RESULTS.md
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "merge" or not Path(sys.argv[2]).is_file():
        sys.exit("usage: python -m benchmarks._results merge COPY_OF_RESULTS.md (an existing file)")
    merged = merge_sections(Path(sys.argv[2]))
    print(f"{len(merged)} section(s) written to {RESULTS}: {', '.join(merged) or 'none'}")
