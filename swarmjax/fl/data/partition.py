"""Split a labelled dataset across clients: IID, Dirichlet over labels, pathological.

Every partitioner returns a :class:`Partition`: disjoint per-client index arrays (each
sorted), the scheme, and a class-histogram summary (:meth:`Partition.histogram`, a pandas
DataFrame) that :meth:`Partition.plot` draws as a stacked-bar figure.

* ``iid``: a random permutation cut into ``N`` near-equal parts (``stratify=True`` deals
  every class round-robin instead: equal class counts up to one, the "uniform" split of
  seed 004).
* ``dirichlet``: Flower's ``DirichletPartitioner`` (flwr-datasets), draw for draw: for each
  class present, in sorted order, draw proportions ``p ~ Dir(alpha)`` over the clients and
  cut that class's examples, in dataset order, at ``cumsum(p)``; optional self-balancing (a
  client already above ``n / N`` examples gets no more); the whole draw is repeated until
  every client has ``min_partition_size`` examples, at most ``max_attempts`` times, then a
  ``ValueError`` says what to change. Same seed and same row order: the same clients as
  Flower's (a test checks recorded Flower partitions).
* :func:`flower_partition`: Flower's usual pipeline, ``FederatedDataset(shuffle=True,
  seed)`` (the rows shuffled as a Hugging Face ``Dataset.shuffle(seed)``) followed by its
  ``IidPartitioner`` (contiguous shards) or ``DirichletPartitioner(seed)``; indices refer to
  the unshuffled rows.
* ``pathological`` (alias ``arbitrary``): each client gets ALL examples of a disjoint set
  of classes (seed 004's "arbitrary" split, e.g. 2 digits each for 5 clients).

Schemes for many clients (cross-device, :doc:`docs/cross_device.md`):

* ``shards``: McMahan et al.'s pathological non-IID split: rows sorted by label (ties in a
  seeded random order), cut into ``N * shards_per_client`` equal shards, each client gets
  ``shards_per_client`` random shards (so mostly that many labels).
* ``power_law``: a natural-style split: client sizes from a Pareto (power-law) tail,
  ``P(size > s) ~ s^-exponent``, plus ``min_size`` each, scaled to use every row; labels
  IID, or per client from ``Dir(alpha)`` proportions when ``alpha`` is given.
* ``consecutive``: a seeded shuffle cut into consecutive chunks of ``size`` rows (default
  ``n // N``; leftover rows unused): the vs-pfl split, 1,200 users of 50 MNIST rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from jaxtyping import ArrayLike

from swarmjax._validation import check_choice, check_int, check_positive

if TYPE_CHECKING:  # matplotlib is imported when a plot is drawn (not in every ClientApp process)
    from matplotlib.figure import Figure

__all__ = [
    "SCHEMES",
    "Partition",
    "consecutive_partition",
    "dirichlet_partition",
    "flower_partition",
    "iid_partition",
    "label_skew",
    "partition",
    "pathological_partition",
    "power_law_partition",
    "power_law_sizes",
    "shards_partition",
]

SCHEMES = ("iid", "dirichlet", "pathological", "arbitrary", "shards", "power_law", "consecutive")


@dataclass(frozen=True)
class Partition:
    """Per-client example indices into the partitioned arrays.

    Attributes:
        indices: one sorted int64 index array per client; disjoint.
        labels: ``(n,)`` the labels that were partitioned (for the summaries).
        num_classes: ``C``.
        scheme: e.g. ``"dirichlet(alpha=0.3)"``.
    """

    indices: tuple[np.ndarray, ...]
    labels: np.ndarray
    num_classes: int
    scheme: str

    @property
    def num_clients(self) -> int:
        return len(self.indices)

    @property
    def sizes(self) -> np.ndarray:
        """``(N,)`` examples per client."""
        return np.array([len(i) for i in self.indices], dtype=np.int64)

    def histogram(self) -> pd.DataFrame:
        """Examples per (client, class): rows ``client 0..N-1``, columns ``0..C-1``, ``total``."""
        counts = np.stack(
            [np.bincount(self.labels[i], minlength=self.num_classes) for i in self.indices]
        )
        frame = pd.DataFrame(counts, columns=list(range(self.num_classes)))
        frame.index.name = "client"
        frame.columns.name = "class"
        frame["total"] = counts.sum(axis=1)
        return frame

    def plot(self, path: str | Path | None = None, *, title: str | None = None) -> Figure:
        """Stacked bars of class counts per client; saved as PNG when ``path`` is given."""
        counts = self.histogram().drop(columns="total").to_numpy()
        from matplotlib.figure import Figure

        fig = Figure(figsize=(1.0 + 0.6 * self.num_clients, 3.5), layout="constrained")
        ax = fig.add_subplot()
        bottom = np.zeros(self.num_clients)
        colors = [_color(c, self.num_classes) for c in range(self.num_classes)]
        for c in range(self.num_classes):
            ax.bar(
                range(self.num_clients), counts[:, c], bottom=bottom, color=colors[c], label=str(c)
            )
            bottom += counts[:, c]
        ax.set_xlabel("client")
        ax.set_ylabel("examples")
        ax.set_xticks(range(self.num_clients))
        ax.set_title(title or self.scheme)
        ax.legend(
            title="class", fontsize="small", ncols=2, loc="center left", bbox_to_anchor=(1, 0.5)
        )
        if path is not None:
            fig.savefig(path, dpi=120)
        return fig


def _color(c: int, n: int) -> tuple[float, ...]:
    from matplotlib import colormaps

    return colormaps["tab10" if n <= 10 else "tab20"](c % 20)


def _labels(labels: ArrayLike, num_classes: int | None) -> tuple[np.ndarray, int]:
    y = np.asarray(labels)
    if y.ndim != 1 or y.size == 0:
        raise ValueError(f"labels must be a non-empty 1-D array; got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer) or y.min() < 0:
        raise ValueError("labels must be non-negative integers")
    c = int(y.max()) + 1 if num_classes is None else check_int("num_classes", num_classes, 1)
    if y.max() >= c:
        raise ValueError(f"labels must be < num_classes={c}; got max {int(y.max())}")
    return y.astype(np.int64), c


def _check_clients(num_clients: int, n: int) -> int:
    num_clients = check_int("num_clients", num_clients, 1)
    if num_clients > n:
        raise ValueError(f"num_clients must be <= the number of examples ({n}); got {num_clients}")
    return num_clients


def _finish(parts: list[np.ndarray], y: np.ndarray, c: int, scheme: str) -> Partition:
    return Partition(
        indices=tuple(np.sort(np.asarray(p, dtype=np.int64)) for p in parts),
        labels=y,
        num_classes=c,
        scheme=scheme,
    )


def iid_partition(
    labels: ArrayLike,
    num_clients: int,
    *,
    seed: int = 0,
    stratify: bool = False,
    num_classes: int | None = None,
) -> Partition:
    """IID split into ``num_clients`` near-equal parts (sizes differ by at most one)."""
    y, c = _labels(labels, num_classes)
    num_clients = _check_clients(num_clients, y.size)
    rng = np.random.default_rng(seed)
    if not stratify:
        return _finish(np.array_split(rng.permutation(y.size), num_clients), y, c, "iid")
    # Deal a class-sorted, within-class shuffled order round-robin: every client gets each
    # class's count divided by N, up to one.
    order = np.concatenate([rng.permutation(np.flatnonzero(y == k)) for k in range(c)])
    parts = [order[i::num_clients] for i in range(num_clients)]
    return _finish(parts, y, c, "iid(stratified)")


def _size_summary(sizes: np.ndarray, below: int) -> str:
    """Client sizes in a few words, however many clients: smallest, median, largest and how
    many fall short of ``below`` (a refusal stays one readable line)."""
    short = int(np.sum(sizes < below))
    return (
        f"{short} of {sizes.size} clients below {below}; sizes {int(sizes.min())} to "
        f"{int(sizes.max())}, median {float(np.median(sizes)):g}"
    )


def dirichlet_partition(
    labels: ArrayLike,
    num_clients: int,
    alpha: float | ArrayLike,
    *,
    seed: int = 42,
    min_partition_size: int = 10,
    self_balancing: bool = False,
    max_attempts: int = 11,
    num_classes: int | None = None,
) -> Partition:
    """Dirichlet label skew, as Flower's ``DirichletPartitioner`` (same defaults, same draws).

    Args:
        alpha: concentration > 0, one value (symmetric) or one per client.
        seed: seeds ``numpy.random.default_rng``; with the same seed and row order the
            clients are exactly Flower's.
        min_partition_size: every client must end with at least this many examples.
        self_balancing: give no more examples to a client above the mean size ``n / N``.
        max_attempts: draws allowed before failing with ``ValueError`` (Flower: 11).
    """
    y, c = _labels(labels, num_classes)
    num_clients = _check_clients(num_clients, y.size)
    alpha_vec = np.broadcast_to(np.asarray(alpha, dtype=np.float64), (num_clients,)).copy()
    check_positive("alpha", alpha_vec)
    min_size = check_int("min_partition_size", min_partition_size, 0)
    max_attempts = check_int("max_attempts", max_attempts, 1)
    if min_size * num_clients > y.size:
        raise ValueError(
            f"min_partition_size * num_clients = {min_size * num_clients} exceeds the "
            f"{y.size} examples"
        )
    rng = np.random.default_rng(seed)
    mean_size = y.size / num_clients
    sizes = np.zeros(num_clients, dtype=np.int64)
    for _ in range(max_attempts):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients, dtype=np.int64)
        # Flower's order of draws: one Dirichlet draw per class present, classes sorted.
        for k in np.unique(y):
            rows = np.flatnonzero(y == k)
            p = rng.dirichlet(alpha_vec)
            if self_balancing:
                p = np.where(sizes > mean_size, 0.0, p)
                p = p / p.sum()
            cuts = (np.cumsum(p) * rows.size).astype(np.int64)[:-1]
            for i, chunk in enumerate(np.split(rows, cuts)):
                parts[i].append(chunk)
                sizes[i] += chunk.size
        if sizes.min() >= min_size:
            merged = [np.concatenate(p) for p in parts]
            return _finish(merged, y, c, f"dirichlet(alpha={_fmt_alpha(alpha_vec)})")
    raise ValueError(
        f"dirichlet_partition: no draw in {max_attempts} attempts gave every one of the "
        f"{num_clients} clients >= min_partition_size={min_size} examples (last draw: "
        f"{_size_summary(sizes, min_size)}); lower min_partition_size or num_clients, raise "
        "alpha or max_attempts, or use self_balancing=True"
    )


def _require_alpha(kwargs: dict) -> None:
    if "alpha" not in kwargs:
        raise ValueError("scheme 'dirichlet' needs alpha (> 0)")


def flower_partition(
    labels: ArrayLike, num_clients: int, scheme: str = "iid", *, seed: int = 42, **kwargs
) -> Partition:
    """The clients of Flower's ``FederatedDataset(shuffle=True, seed=seed)`` with its
    ``IidPartitioner`` (``scheme="iid"``) or ``DirichletPartitioner(seed=seed, ...)``
    (``scheme="dirichlet"``, ``kwargs`` as :func:`dirichlet_partition`), for rows given in
    the dataset's published order. Indices refer to the unshuffled rows.

    ``FederatedDataset`` first shuffles the rows (``Dataset.shuffle(seed)``: the permutation
    ``numpy.random.default_rng(seed).permutation(n)``); ``IidPartitioner`` then cuts
    contiguous shards, which is :func:`iid_partition` with the same seed.
    """
    check_choice("scheme", scheme, ("iid", "dirichlet"))
    y, c = _labels(labels, kwargs.pop("num_classes", None))
    if scheme == "iid":
        if kwargs:
            raise ValueError(f"flower_partition(scheme='iid') takes no options; got {kwargs}")
        return iid_partition(y, num_clients, seed=seed, num_classes=c)
    _require_alpha(kwargs)
    order = np.random.default_rng(seed).permutation(y.size)
    shuffled = dirichlet_partition(y[order], num_clients, seed=seed, num_classes=c, **kwargs)
    return _finish([order[i] for i in shuffled.indices], y, c, shuffled.scheme)


def _fmt_alpha(alpha: np.ndarray) -> str:
    return f"{alpha[0]:g}" if np.all(alpha == alpha[0]) else "vector"


def pathological_partition(
    labels: ArrayLike,
    num_clients: int,
    classes_per_client: int | None = None,
    *,
    seed: int = 0,
    shuffle_classes: bool = True,
    num_classes: int | None = None,
) -> Partition:
    """Each client gets every example of its own disjoint set of classes.

    ``classes_per_client=None`` splits all ``C`` classes as evenly as possible (complete
    partition); an integer ``k`` gives exactly ``k`` classes each (needs ``N * k <= C``) and
    leaves the remaining ``C - N * k`` classes unused. Classes are assigned in a seeded
    random order unless ``shuffle_classes=False`` (then client 0 gets 0..k-1, ...).
    """
    y, c = _labels(labels, num_classes)
    present = np.unique(y)
    num_clients = check_int("num_clients", num_clients, 1)
    if num_clients > present.size:
        raise ValueError(
            f"num_clients must be <= the number of classes present ({present.size}) for a "
            f"pathological split; got {num_clients}"
        )
    rng = np.random.default_rng(seed)
    order = rng.permutation(present) if shuffle_classes else present
    if classes_per_client is None:
        groups = np.array_split(order, num_clients)
        scheme = "pathological"
    else:
        k = check_int("classes_per_client", classes_per_client, 1)
        if num_clients * k > present.size:
            raise ValueError(
                f"classes_per_client * num_clients = {num_clients * k} exceeds the "
                f"{present.size} classes present"
            )
        groups = [order[i * k : (i + 1) * k] for i in range(num_clients)]
        scheme = f"pathological(k={k})"
    parts = [np.flatnonzero(np.isin(y, g)) for g in groups]
    return _finish(parts, y, c, scheme)


def shards_partition(
    labels: ArrayLike,
    num_clients: int,
    shards_per_client: int = 2,
    *,
    seed: int = 0,
    num_classes: int | None = None,
) -> Partition:
    """McMahan et al.'s pathological non-IID split: sort by label, cut ``N * s`` equal
    shards of ``n // (N * s)`` rows (the last ``n mod (N * s)`` rows of the sorted order
    are unused), give each client ``s = shards_per_client`` shards at random."""
    y, c = _labels(labels, num_classes)
    num_clients = check_int("num_clients", num_clients, 1)
    s = check_int("shards_per_client", shards_per_client, 1)
    shards = num_clients * s
    if shards > y.size:
        raise ValueError(
            f"num_clients * shards_per_client = {shards} exceeds the {y.size} examples"
        )
    rng = np.random.default_rng(seed)
    order = rng.permutation(y.size)
    order = order[np.argsort(y[order], kind="stable")]  # by label, ties in random order
    width = y.size // shards
    owner = rng.permutation(shards).reshape(num_clients, s)
    parts = [np.concatenate([order[k * width : (k + 1) * width] for k in row]) for row in owner]
    return _finish(parts, y, c, f"shards(s={s})")


def power_law_sizes(
    n: int, num_clients: int, *, exponent: float = 1.5, min_size: int = 10, seed: int = 0
) -> np.ndarray:
    """``(N,)`` client sizes summing to ``n``: ``min_size`` each plus the rest shared in
    proportion to Pareto(``exponent``) draws (a power-law tail; smaller ``exponent``,
    heavier tail)."""
    num_clients = check_int("num_clients", num_clients, 1)
    min_size = check_int("min_size", min_size, 1)
    check_positive("exponent", exponent)
    if num_clients * min_size > n:
        raise ValueError(
            f"min_size * num_clients = {min_size * num_clients} exceeds the {n} examples"
        )
    weights = np.random.default_rng(seed).pareto(exponent, num_clients) + 1.0
    share = weights / weights.sum() * (n - num_clients * min_size)
    extra = np.floor(share).astype(np.int64)
    rest = n - num_clients * min_size - int(extra.sum())  # largest remainders get one more
    extra[np.argsort(share - extra)[::-1][:rest]] += 1
    return min_size + extra


def power_law_partition(
    labels: ArrayLike,
    num_clients: int,
    *,
    exponent: float = 1.5,
    min_size: int = 10,
    alpha: float | None = None,
    seed: int = 0,
    num_classes: int | None = None,
) -> Partition:
    """Natural-style split: sizes from :func:`power_law_sizes` (every row used), labels
    IID (``alpha=None``) or each client's from ``Dir(alpha)`` class proportions (drawn
    without replacement; a class that runs out is replaced by the others in proportion)."""
    y, c = _labels(labels, num_classes)
    sizes = power_law_sizes(y.size, num_clients, exponent=exponent, min_size=min_size, seed=seed)
    rng = np.random.default_rng([seed, 1])
    if alpha is None:
        cuts = np.cumsum(sizes)[:-1]
        return _finish(np.split(rng.permutation(y.size), cuts), y, c, f"power_law(a={exponent:g})")
    check_positive("alpha", alpha)
    pools = [rng.permutation(np.flatnonzero(y == k)) for k in range(c)]
    left = np.array([p.size for p in pools], dtype=np.int64)
    parts = []
    for size in sizes:
        p = rng.dirichlet(np.full(c, float(alpha)))
        take = np.zeros(c, dtype=np.int64)
        need = int(size)
        while need > 0:  # draw, capped by what each class has left, until the client is full
            avail = left - take
            w = np.where(avail > 0, p, 0.0)
            w = w / w.sum() if w.sum() > 0 else (avail > 0) / (avail > 0).sum()
            got = np.minimum(rng.multinomial(need, w), avail)
            take += got
            need -= int(got.sum())
        parts.append(np.concatenate([pools[k][left[k] - take[k] : left[k]] for k in range(c)]))
        left -= take
    return _finish(parts, y, c, f"power_law(a={exponent:g}, alpha={float(alpha):g})")


def consecutive_partition(
    labels: ArrayLike,
    num_clients: int,
    size: int | None = None,
    *,
    seed: int = 0,
    num_classes: int | None = None,
) -> Partition:
    """A seeded shuffle (``default_rng(seed).permutation(n)``) cut into ``N`` consecutive
    chunks of ``size`` rows (default ``n // N``); rows past ``N * size`` are unused."""
    y, c = _labels(labels, num_classes)
    num_clients = _check_clients(num_clients, y.size)
    size = y.size // num_clients if size is None else check_int("size", size, 1)
    if num_clients * size > y.size:
        raise ValueError(f"size * num_clients = {num_clients * size} exceeds the {y.size} examples")
    order = np.random.default_rng(seed).permutation(y.size)[: num_clients * size]
    return _finish(list(order.reshape(num_clients, size)), y, c, f"consecutive(size={size})")


_MANY_CLIENTS = {
    "shards": shards_partition,
    "power_law": power_law_partition,
    "consecutive": consecutive_partition,
}


def partition(
    labels: ArrayLike, num_clients: int, scheme: str = "iid", *, seed: int = 0, **kwargs
) -> Partition:
    """Dispatch on ``scheme`` in :data:`SCHEMES`; ``kwargs`` go to the partitioner
    (``alpha=...`` for ``dirichlet``, ``classes_per_client=...`` for ``pathological``,
    ``shards_per_client=...`` for ``shards``, ``exponent=``/``min_size=``/``alpha=`` for
    ``power_law``, ``size=...`` for ``consecutive``)."""
    check_choice("scheme", scheme, SCHEMES)
    if scheme == "iid":
        return iid_partition(labels, num_clients, seed=seed, **kwargs)
    if scheme == "dirichlet":
        _require_alpha(kwargs)
        return dirichlet_partition(labels, num_clients, seed=seed, **kwargs)
    if scheme in _MANY_CLIENTS:
        return _MANY_CLIENTS[scheme](labels, num_clients, seed=seed, **kwargs)
    return pathological_partition(labels, num_clients, seed=seed, **kwargs)


def label_skew(part: Partition) -> float:
    """Mean over clients of the total-variation distance between the client's label
    distribution and the global one (0 = IID, up to 1 - 1/C-ish for one class each)."""
    counts = part.histogram().drop(columns="total").to_numpy().astype(np.float64)
    glob = counts.sum(axis=0) / counts.sum()
    local = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1.0)
    return float(np.mean(0.5 * np.abs(local - glob).sum(axis=1)))
