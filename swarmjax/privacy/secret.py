"""Secret randomness: the root of every random number a private run draws.

A DP guarantee holds only while the noise is unknown to whoever reads the release.  If the
noise is a function of anything published (the seed, the settings, the data's name), it can
be regenerated and subtracted.  So every private run draws its keys from a
:class:`Secret`: 256 bits from the operating system's entropy (``os.urandom``) by default,
turned into JAX keys of the ChaCha20 generator (:mod:`swarmjax.privacy.chacha20`, 256-bit
keys).  Seeds remain what they are for users: labels of repeated runs, the data split, a
model's initialisation; none of them reaches the noise.

Each (variant, seed) run's key is the secret's ChaCha20 key with the run's release identity
(:func:`swarmjax.fl.protocol.release_identity`, 256 bits) and its seed folded in, so the
runs of one call are independent and a run's numbers do not depend on what else is in the
call, while different calls, each with its own fresh secret, never share a draw.

Reproducible mode (opt-in): the caller supplies the secret (:meth:`Secret.from_file`,
:meth:`Secret.from_bytes`); the same secret then gives the same runs, and the guarantee
holds only while that secret is kept (the privacy record and the ledger say so).  A secret
saved to resume a run (:meth:`Secret.save`) lives in a folder the ledger lists as not
released.  :meth:`Secret.derive` gives independent child secrets by name (one per call of
an experiment).  :func:`fingerprint` is a public 128-bit commitment to a run's key: the
ledger refuses to compose releases whose keys coincide (:func:`joint_fingerprint` for a
release of several runs).  :func:`randomness` is what a release states of its random
numbers.  docs/privacy.md states the threat model.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import jax
import numpy as np
from jaxtyping import PRNGKeyArray

from swarmjax.privacy.chacha20 import chacha20, fold_rows, key_from_bytes

__all__ = [
    "GENERATOR",
    "MIN_SECRET_BYTES",
    "SECRET_BYTES",
    "SUPPLIED_CONDITION",
    "Secret",
    "fingerprint",
    "fingerprints",
    "fold_words",
    "joint_fingerprint",
    "keys_for_runs",
    "randomness",
]

SECRET_BYTES = 32
"""Bytes a secret carries (256 bits: a ChaCha20 key)."""
MIN_SECRET_BYTES = 16
"""The shortest secret file accepted (128 bits)."""
GENERATOR = "ChaCha20 (RFC 8439), 256-bit keys"
"""What draws the noise of a private run (:mod:`swarmjax.privacy.chacha20`)."""

_FILE_HEADER = "swarmjax-secret/1"
_FINGERPRINT = b"swarmjax/key-fingerprint/1\0"
_JOINT = b"swarmjax/joint-fingerprint/1\0"
_DERIVE = b"swarmjax/derive/1\0"
_FROM_FILE = b"swarmjax/secret-file/1\0"

Source = Literal["entropy", "supplied"]

SUPPLIED_CONDITION = (
    "the noise was drawn from a secret the caller supplied (reproducible mode): every "
    "epsilon holds only while that secret is kept from whoever sees the releases"
)
"""The condition a supplied secret puts on every epsilon of its releases."""


def randomness(source: Source, common_random_numbers: bool) -> dict[str, Any]:
    """What drew a release's random numbers, as its privacy record and ledger entry state
    it: the generator (:data:`GENERATOR`), where the secret came from (``"entropy"``:
    operating-system entropy, known to nobody but the run; ``"supplied"``: the caller's,
    reproducible, private only while it is kept, :data:`SUPPLIED_CONDITION`) and whether
    runs share draws (common random numbers). A run's key ``fingerprint`` is added by
    whoever knows the key."""
    return {
        "generator": GENERATOR,
        "secret": source,
        "common_random_numbers": bool(common_random_numbers),
        "condition": SUPPLIED_CONDITION if source == "supplied" else None,
    }


@dataclass(frozen=True)
class Secret:
    """256 secret bits, the root of a call's random numbers.

    Build one with :meth:`generate` (operating-system entropy: the default everywhere),
    :meth:`from_file` or :meth:`from_bytes` (reproducible mode), or :meth:`load` (a secret
    this library saved to resume a run).  ``repr`` never shows the bits.

    Attributes:
        source: ``"entropy"`` (drawn here from ``os.urandom``) or ``"supplied"`` (the
            caller's: reproducible, private only while the caller keeps it).
    """

    _bits: bytes = field(repr=False)
    source: Source = "entropy"

    def __post_init__(self) -> None:
        if not isinstance(self._bits, bytes) or len(self._bits) != SECRET_BYTES:
            raise ValueError(f"a Secret holds {SECRET_BYTES} bytes")
        if self.source not in ("entropy", "supplied"):
            raise ValueError(f"Secret source must be 'entropy' or 'supplied'; got {self.source!r}")

    def __repr__(self) -> str:
        return f"Secret(source={self.source!r}, bits=<hidden>)"

    @classmethod
    def generate(cls) -> Secret:
        """256 bits from the operating system's entropy (``os.urandom``)."""
        return cls(os.urandom(SECRET_BYTES), "entropy")

    @classmethod
    def from_bytes(cls, data: bytes) -> Secret:
        """A supplied secret (reproducible mode) from at least 16 bytes the caller keeps
        secret: exactly 32 bytes are used as they are, other lengths are hashed (SHA-256)."""
        if not isinstance(data, bytes | bytearray):
            raise ValueError(f"secret must be bytes; got {type(data).__name__}")
        data = bytes(data)
        if len(data) < MIN_SECRET_BYTES:
            raise ValueError(
                f"secret: {len(data)} bytes is too short; at least {MIN_SECRET_BYTES} bytes "
                f"(128 bits) of secret randomness, e.g. `head -c 32 /dev/urandom > key`"
            )
        bits = data if len(data) == SECRET_BYTES else hashlib.sha256(_FROM_FILE + data).digest()
        return cls(bits, "supplied")

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Secret:
        """A supplied secret (reproducible mode) read from ``path``: a file written by
        :meth:`save`, or any file of at least 16 bytes of secret randomness (raw bytes)."""
        where = Path(path)
        data = _read(where, "secret file")
        saved = _parse_saved(data)
        if saved is not None:
            return cls(saved, "supplied")
        try:
            return cls.from_bytes(data)
        except ValueError as err:
            raise ValueError(f"secret file {str(where)!r}: {err}") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Secret:
        """A secret that :meth:`save` wrote to resume a run, keeping its ``source``."""
        where = Path(path)
        data = _read(where, "saved secret")
        bits = _parse_saved(data)
        if bits is None:
            raise ValueError(
                f"saved secret {str(where)!r} is not a swarmjax secret file (corrupt?); "
                "delete the folder's results (or pass --restart) to draw a new secret"
            )
        source = data.decode("ascii", "replace").split("\n")[1].strip()
        return cls(bits, source if source in ("entropy", "supplied") else "supplied")

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the secret to ``path`` (readable by its owner only, ``0600``), atomically.
        The folder holding it must never be released: list it in the ledger as not
        released (:meth:`swarmjax.privacy.ledger.Ledger.mark_not_released`)."""
        where = Path(path)
        where.parent.mkdir(parents=True, exist_ok=True)
        tmp = where.with_name(where.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"{_FILE_HEADER}\n{self.source}\n{self._bits.hex()}\n")
        os.replace(tmp, where)
        return where

    @classmethod
    def kept_in(cls, path: str | os.PathLike[str], *, fresh: bool = False) -> Secret:
        """The secret saved at ``path`` (a resume draws the same numbers), else a fresh one
        from operating-system entropy, saved there (owner-only) before it is returned;
        ``fresh=True`` draws and saves a new one whatever is there (a restart)."""
        where = Path(path)
        if where.exists() and not fresh:
            return cls.load(where)
        made = cls.generate()
        made.save(where)
        return made

    @property
    def reproducible(self) -> bool:
        """Whether the caller supplied the secret (and can therefore replay the runs)."""
        return self.source == "supplied"

    def derive(self, label: str) -> Secret:
        """An independent child secret for ``label`` (HMAC-SHA256): one per call of an
        experiment, so calls with one supplied secret never share a draw."""
        if not isinstance(label, str) or not label:
            raise ValueError(f"derive label must be a non-empty string; got {label!r}")
        bits = hmac.new(self._bits, _DERIVE + label.encode(), hashlib.sha256).digest()
        return Secret(bits, self.source)

    def key(self) -> PRNGKeyArray:
        """The secret as one typed ChaCha20 JAX key (for a draw outside a runtime, e.g. a
        DP-SGD loop of your own: fold in the step, never reuse it for two releases)."""
        return key_from_bytes(self._bits)

    def run_keys(
        self, seeds: Sequence[int], identities: Sequence[bytes], common_random_numbers: bool
    ) -> PRNGKeyArray:
        """One ChaCha20 key per (variant, seed), variant-major (:func:`keys_for_runs`)."""
        return keys_for_runs(self.key(), seeds, identities, common_random_numbers)


def _read(where: Path, what: str) -> bytes:
    """The bytes of ``where``, or one ``ValueError`` line naming ``what`` and the file."""
    try:
        return where.read_bytes()
    except OSError as err:
        raise ValueError(f"{what} {str(where)!r} cannot be read ({err.strerror or err})") from None


def _parse_saved(data: bytes) -> bytes | None:
    try:
        lines = data.decode("ascii").split("\n")
    except UnicodeDecodeError:
        return None
    if len(lines) < 3 or lines[0] != _FILE_HEADER:
        return None
    try:
        bits = bytes.fromhex(lines[2].strip())
    except ValueError:
        return None
    return bits if len(bits) == SECRET_BYTES else None


_IDENTITY_WORDS = 8  # a release identity's 256 bits, folded in one 32-bit word at a time


def keys_for_runs(
    root: PRNGKeyArray,
    seeds: Sequence[int],
    identities: Sequence[bytes],
    common_random_numbers: bool,
) -> PRNGKeyArray:
    """One key per (variant, seed), variant-major: ``root`` with the variant's release
    identity (32 bytes, as eight 32-bit words) and then the seed folded in; with
    ``common_random_numbers`` the identity is left out, so every variant of a seed shares
    its draws (paired comparisons; the ledger refuses to compose such runs).

    Args:
        root: a typed key (a :class:`Secret`'s ChaCha20 key).
        seeds: the seeds, each ``>= 0``.
        identities: one 32-byte identity per variant.
        common_random_numbers: share every draw across variants.

    Returns:
        ``(variants * len(seeds),)`` typed keys of ``root``'s implementation.
    """
    seed_list = [int(s) for s in seeds]
    if not seed_list or min(seed_list) < 0 or max(seed_list) >= 2**32:
        raise ValueError(f"seeds must be one or more integers in [0, 2^32); got {list(seeds)!r}")
    ids = list(identities)
    for ident in ids:
        if not isinstance(ident, bytes) or len(ident) < 4 * _IDENTITY_WORDS:
            raise TypeError(
                "run keys take release identities (32 bytes from release_identity or "
                f"variant_identities), not {type(ident).__name__}"
            )
    seed_words = np.tile(np.asarray(seed_list, np.uint32), len(ids))[:, None]
    if common_random_numbers:
        return fold_words(root, seed_words)
    words = np.stack([np.frombuffer(i[: 4 * _IDENTITY_WORDS], "<u4") for i in ids])
    words = np.repeat(words, len(seed_list), axis=0)
    return fold_words(root, np.concatenate([words, seed_words], axis=1))


def fold_words(root: PRNGKeyArray, words: np.ndarray) -> PRNGKeyArray:
    """``(n,)`` keys: ``root`` (one ChaCha20 key) with each row of ``words`` ``(n, w)``
    (uint32) folded in, in order: ``jax.random.fold_in`` once a word, computed on the host
    (:func:`~swarmjax.privacy.chacha20.fold_rows`, the same bits), so no program is
    compiled for it."""
    if jax.random.key_impl(root) != chacha20:
        raise ValueError(f"fold_words folds ChaCha20 keys; got {jax.random.key_impl(root)}")
    words = np.asarray(words, np.uint32)
    root_words = np.asarray(jax.random.key_data(root), np.uint32).reshape(1, -1)
    out = fold_rows(np.repeat(root_words, words.shape[0], axis=0), words)
    return jax.random.wrap_key_data(jax.device_put(out), impl=chacha20)


def fingerprint(key: PRNGKeyArray) -> str:
    """A public 128-bit commitment to one run's key (hex): SHA-256 of a tag and the key's
    words. Equal fingerprints mean equal keys (the same draws); the key cannot be recovered
    from it."""
    data = np.asarray(jax.random.key_data(key), "<u4").tobytes()
    return hashlib.sha256(_FINGERPRINT + data).hexdigest()[:32]


def fingerprints(keys: PRNGKeyArray) -> tuple[str, ...]:
    """:func:`fingerprint` of each key of a ``(runs,)`` key array."""
    data = np.asarray(jax.random.key_data(keys), "<u4")
    return tuple(hashlib.sha256(_FINGERPRINT + row.tobytes()).hexdigest()[:32] for row in data)


def joint_fingerprint(prints: Iterable[str]) -> str:
    """A public 128-bit commitment to a set of runs' keys (hex) from their
    :func:`fingerprints`, for a release that the runs make together (a PAASO configuration
    over its seeds): SHA-256 of a tag and the fingerprints, sorted, so the runs' order does
    not matter. Equal joint fingerprints mean the same keys; no key follows from it."""
    text = "".join(sorted(prints)).encode("ascii")
    return hashlib.sha256(_JOINT + text).hexdigest()[:32]
