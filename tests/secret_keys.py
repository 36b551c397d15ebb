"""Checks that an experiment's secret keys stayed secret, shared by the experiment tests.

* :class:`MadeKeys` records the words of every key a :class:`Secret` makes while a test
  runs, then searches every program compiled since (the suite's persistent compilation
  cache, ``tests/conftest.py``) for them: a program that closes over a key holds it as a
  constant, and the cache writes it to disk (docs/privacy.md).
* :func:`check_randomness_stated`: every private release of a ledger states the secret
  its noise came from and its key's fingerprint, and no composed statement has releases
  of unstated randomness.
"""

from __future__ import annotations

import glob
import os
import time

import jax
import numpy as np
import pytest

from swarmjax.privacy.secret import Secret
from tests.reproducible import OTHER, SECRET


def _varint(n: int) -> bytes:
    """``n`` as a protobuf varint (how an HLO proto stores an integer constant)."""
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


class MadeKeys:
    """The keys made by every :class:`Secret` from now until the test ends (``monkeypatch``
    undoes the recording), except the suite's two fixed secrets (``tests.reproducible``),
    whose keys other modules' test programs close over on purpose while this test runs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.words: list[list[int]] = []
        self.started = time.time() - 1.0  # wall clock, for the cache's new files
        real = Secret.key

        def key(secret: Secret):
            made = real(secret)
            if secret not in (SECRET, OTHER):
                with jax.ensure_compile_time_eval():  # concrete words even inside a trace
                    words = np.asarray(jax.random.key_data(real(secret)))
                self.words.append([int(w) for w in words])
            return made

        monkeypatch.setattr(Secret, "key", key)

    def assert_not_compiled(self) -> None:
        """No program compiled since the recording began holds one of the keys: every new
        file of the suite's persistent compilation cache is searched for each key's first
        two words, raw and as the HLO proto's varints (a program closing over a key is
        never a cache hit: its constants are part of the cache key). Fails when no key was
        made (nothing would be searched); nothing to search without the suite's cache."""
        from jax._src import compilation_cache

        assert self.words, "no secret key was made while recording: the search would be empty"
        folder = os.environ.get("JAX_COMPILATION_CACHE_DIR")
        if not folder:
            return
        needles = set()
        for words in self.words:
            needles.add(_varint(words[0]) + _varint(words[1]))
            needles.add(np.asarray(words[:2], "<u4").tobytes())
        for path in glob.glob(os.path.join(folder, "*-cache")):
            if os.path.getmtime(path) < self.started:
                continue
            with open(path, "rb") as f:
                program = compilation_cache.decompress_executable(f.read())
            assert not any(n in program for n in needles), f"a secret key is compiled into {path}"


def check_randomness_stated(ledger: dict) -> None:
    """Every private release of ``ledger`` (a ``privacy_ledger.json`` read as JSON) states
    the secret its noise came from and its key's 32-hex fingerprint, so no composed
    statement has releases of unstated randomness."""
    for r in ledger["releases"]:
        if r["private"]:
            assert r["randomness"]["secret"] in ("entropy", "supplied"), r["algorithm"]
            assert len(r["randomness"]["fingerprint"]) == 32, r["algorithm"]
    assert not any(c["randomness"]["unstated"] for c in ledger["composed"].values())
