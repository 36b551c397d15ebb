"""What a call runs: :class:`RunSpec` (rounds, delta, seeds, accountant, stated once) and
:class:`Variants` (the hyper-parameter rows run side by side, built and checked by
:meth:`Variants.grid`). The overview is :mod:`swarmjax.fl.protocol`.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from jaxtyping import PyTree

from swarmjax._validation import check_bool, check_choice, check_int

if TYPE_CHECKING:
    from swarmjax.fl.protocol.contract import Algorithm

__all__ = ["RENAMED", "RunSpec", "Variants"]

Hyper = PyTree


@dataclass(frozen=True)
class RunSpec:
    """What every run of one call shares, stated once: ``rounds`` (training rounds
    ``T >= 1``), ``delta`` (of every epsilon the call reports), ``seeds`` (runs are
    (variant, seed) pairs), ``accountant`` (``"pld"``, the default, or ``"rdp"``: what
    calibrates the noise and what the privacy record composes with) and
    ``common_random_numbers`` (``True``: every variant of a seed gets the same run key, so
    the variants share every draw on purpose, for paired comparisons; the privacy record
    says so and a ledger refuses to compose them; see
    :func:`~swarmjax.fl.protocol.run_keys`)."""

    rounds: int
    delta: float
    seeds: tuple[int, ...] = (0,)
    accountant: str = "pld"
    common_random_numbers: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int | np.integer):
            raise ValueError(f"rounds must be an integer >= 1; got {self.rounds!r}")
        if self.rounds < 1:
            raise ValueError(f"rounds must be an integer >= 1; got {self.rounds!r}")
        real = isinstance(self.delta, int | float | np.floating | np.integer)
        if isinstance(self.delta, bool) or not (real and 0.0 < self.delta < 1.0):
            raise ValueError(f"delta must be a number in (0, 1); got {self.delta!r}")
        seeds = (self.seeds,) if isinstance(self.seeds, int | np.integer) else self.seeds
        if isinstance(seeds, str | bytes) or not isinstance(seeds, Iterable):
            raise ValueError(f"seeds must be one or more integers >= 0; got {self.seeds!r}")
        seeds = tuple(check_int("seeds", s, 0) for s in seeds)
        if not seeds:
            raise ValueError(f"seeds must be one or more integers >= 0; got {self.seeds!r}")
        if len(set(seeds)) < len(seeds):  # two runs of one seed: the same run twice
            raise ValueError(f"seeds has repeated values; give each seed once; got {seeds}")
        check_choice("accountant", self.accountant, ("pld", "rdp"))
        crn = check_bool("common_random_numbers", self.common_random_numbers)
        object.__setattr__(self, "rounds", int(self.rounds))
        object.__setattr__(self, "delta", float(self.delta))
        object.__setattr__(self, "seeds", seeds)
        object.__setattr__(self, "common_random_numbers", crn)


@dataclass(frozen=True)
class Variants:
    """Numeric variants of one algorithm run side by side, and the call's :class:`RunSpec`.

    Attributes:
        hyper: the algorithm's hyper pytree with a leading variant axis ``V`` on every leaf.
        labels: history columns naming each variant (``V`` values each), e.g.
            ``{"epsilon_target": [1.0, 8.0]}``; with the algorithm and the row's hyper
            values they make each run's :func:`release_identity` (two identical rows are
            an error of :func:`run_keys`).
        spec: rounds, delta and seeds of the call.
    """

    hyper: PyTree
    labels: Mapping[str, Sequence[Any]]
    spec: RunSpec

    @property
    def size(self) -> int:
        """``V``, the number of variants."""
        return int(jax.tree.leaves(self.hyper)[0].shape[0])

    def row_labels(self) -> list[dict[str, Any]]:
        """The labels of each variant, ``V`` dicts."""
        return [{k: v[i] for k, v in self.labels.items()} for i in range(self.size)]

    @classmethod
    def grid(
        cls,
        alg: Algorithm,
        clients: Any,
        spec: RunSpec,
        *,
        epsilon_target: float | Sequence[float] | None = None,
        **values: Any,
    ) -> Variants:
        """The variants of ``alg`` over a grid, validated before any work.

        Args:
            alg: the algorithm (:meth:`Algorithm.default_hyper` gives the starting values,
                :meth:`Algorithm.resolve` calibrates and checks each row).
            clients: stacked client data (e.g. its sizes calibrate record-level noise).
            spec: rounds, delta and seeds of the call.
            epsilon_target: target epsilon(s) the noise is calibrated to (``inf``: no DP).
            **values: hyper fields by name (e.g. ``learning_rate=0.1``); a list or tuple
                is an axis of the grid, anything else one value for every row.

        Axes (given as lists) become labels, in the order given with ``epsilon_target``
        first; rows are their product, the first axis outermost.
        """
        base = alg.default_hyper(clients, spec)
        names = _hyper_names(base)
        for name in values:
            if name not in names:
                raise ValueError(
                    f"{type(alg).__name__} has no hyper-parameter {name!r}"
                    + _renamed(name, names)
                    + f"; it has {sorted(names)}"
                )
        axes: dict[str, list[Any]] = {}
        if epsilon_target is not None:
            axes["epsilon_target"] = _axis("epsilon_target", epsilon_target)
        fixed = {}
        for name, v in values.items():
            if isinstance(v, list | tuple):
                axes[name] = _axis(name, v)
            else:
                fixed[name] = v
        base = _with_values(base, fixed) if fixed else base
        rows = []
        combos = list(itertools.product(*axes.values())) if axes else [()]
        for combo in combos:
            row = dict(zip(axes, combo, strict=True))
            eps = row.pop("epsilon_target", None)
            hyper = _with_values(base, row) if row else base
            rows.append(alg.resolve(hyper, clients, spec, None if eps is None else float(eps)))
        # stacked on the host, then placed: an eager stack compiles a program a leaf
        hyper = jax.tree.map(
            lambda *xs: jax.device_put(np.stack([np.asarray(x) for x in xs])), *rows
        )
        labels = {name: [combo[i] for combo in combos] for i, name in enumerate(axes)}
        return cls(hyper=hyper, labels=labels, spec=spec)

    def take(self, index: int) -> Variants:
        """Variant ``index`` alone (a variant axis of 1; labels kept)."""
        hyper = jax.tree.map(lambda a: a[index : index + 1], self.hyper)
        labels = {k: [v[index]] for k, v in self.labels.items()}
        return Variants(hyper=hyper, labels=labels, spec=self.spec)


RENAMED: dict[str, str] = {"client_lr": "learning_rate"}
"""Hyper-parameter names that changed, old -> new (refused with the new name)."""


def _renamed(name: str, names: set[str]) -> str:
    new = RENAMED.get(name)
    return f" (renamed: it is now {new!r})" if new in names else ""


def _hyper_names(hyper: Hyper) -> set[str]:
    """Every name a grid may set: the dataclass's fields, or ``hyper.names()`` for a
    composite hyper (a privacy plan's and its algorithm's)."""
    if callable(getattr(hyper, "names", None)):
        return set(hyper.names())
    return {f.name for f in dataclasses.fields(hyper)}


def _with_values(hyper: Hyper, values: Mapping[str, Any]) -> Hyper:
    if callable(getattr(hyper, "with_values", None)):
        return hyper.with_values(**values)
    return hyper.replace(**values)


def _axis(name: str, values: float | Iterable[Any]) -> list[Any]:
    out = list(values) if isinstance(values, list | tuple) else [values]
    out = [v.item() if isinstance(v, np.generic) else v for v in out]
    if not out:
        raise ValueError(f"{name} must not be empty")
    if len(set(map(repr, out))) != len(out):
        raise ValueError(f"{name} has repeated values: {out}")
    return out
