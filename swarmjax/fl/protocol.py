"""The federated protocol: an algorithm is pure functions of ONE client and of the server,
talking only through explicit message pytrees.

A run is ``setup`` exchanges once, then ``rounds`` rounds of ``exchanges``. One exchange:

1. the server decides who takes part, ``select(server, key, num_clients) -> Bool[N]``
   (public: it uses the server's state and key only);
2. the server builds ONE request for all of them, ``request(server) -> Request``;
3. every selected client runs ``client(state, data, request, key, hyper) -> (state, Reply)``
   on its own data; its state (swarm, optimiser state, privacy spend) never leaves it;
4. the server folds the replies in, ``aggregate(server, replies, slots, key, hyper) ->
   server`` (``key``: :func:`aggregate_key`, for server-side noise). ``replies`` are stacked
   over ``S`` reply slots (all ``N`` clients, or an exchange's ``max_selected`` cohort
   slots: a round costs the cohort, not the federation); :class:`Slots` says which client
   each slot holds (``ids``) and which slots replied (``mask``). The other slots may hold
   anything (zeros, garbage, NaN), so aggregates must combine with
   ``jnp.where(slots.mask, ...)`` and never multiply by a 0/1 mask.

Privacy follows the messages: every exchange declares, per Reply field, how that field is
protected (:class:`Protection`). The run's privacy record is derived from those
declarations and the clients' :class:`Spend` (what their accountant counted), never written
by hand per algorithm (:func:`coverage`).

Keys: every random number of a run comes from ``run_key = jax.random.key(seed)`` through
:func:`server_key` and :func:`client_key` (``fold_in`` only, never a split across clients),
so a simulator and a deployment where each client derives its own keys from the run seed,
its id and the round/exchange index the server sends draw identical numbers. Round ``0``
is the setup; rounds ``1..T`` are the training rounds.

The contract, in one place: a runtime calls only the members of :class:`Algorithm` (every
host-side one has a default here), builds the variant axis with :meth:`Variants.grid` and
the run keys with :func:`run_keys`, and reads a call's rounds, delta and seeds from one
:class:`RunSpec`. Runtimes: :mod:`swarmjax.fl.runtime.simulator` (one process, everything
vmapped) and the Flower runtime (:mod:`swarmjax.fl.runtime.flower`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray, PyTree

from swarmjax.fl.data.cohort import fixed_cohort

__all__ = [
    "ACCOUNTED",
    "PUBLIC",
    "UNPROTECTED",
    "Algorithm",
    "Exchange",
    "Protection",
    "RunSpec",
    "Slots",
    "Spend",
    "UniformCohort",
    "Variants",
    "aggregate_key",
    "client_init_key",
    "client_key",
    "coverage",
    "everyone",
    "noised",
    "run_keys",
    "server_init_key",
    "server_key",
    "where_selected",
]

ServerState = PyTree
ClientState = PyTree
Request = PyTree
Reply = PyTree
Hyper = PyTree

# Domain tags: server and client keys of the same round never coincide.
_SERVER_INIT, _CLIENT_INIT, _SERVER, _CLIENT = 0, 1, 2, 3


# ----------------------------------------------------------------------------------- keys


def server_init_key(run_key: PRNGKeyArray) -> PRNGKeyArray:
    """Key of ``server_init``."""
    return jax.random.fold_in(run_key, _SERVER_INIT)


def client_init_key(run_key: PRNGKeyArray, client_id: Int[Array, ""] | int) -> PRNGKeyArray:
    """Key of ``client_init`` for client ``client_id``."""
    return jax.random.fold_in(jax.random.fold_in(run_key, _CLIENT_INIT), client_id)


def server_key(
    run_key: PRNGKeyArray, round_index: Int[Array, ""] | int, exchange_index: int
) -> PRNGKeyArray:
    """Key of the server's ``select`` in exchange ``exchange_index`` of round ``round_index``
    (round 0 is the setup)."""
    k = jax.random.fold_in(jax.random.fold_in(run_key, _SERVER), round_index)
    return jax.random.fold_in(k, exchange_index)


def aggregate_key(
    run_key: PRNGKeyArray, round_index: Int[Array, ""] | int, exchange_index: int
) -> PRNGKeyArray:
    """Key of the server's ``aggregate`` (e.g. its Gaussian noise) in that exchange."""
    return jax.random.fold_in(server_key(run_key, round_index, exchange_index), 1)


def client_key(
    run_key: PRNGKeyArray,
    round_index: Int[Array, ""] | int,
    exchange_index: int,
    client_id: Int[Array, ""] | int,
) -> PRNGKeyArray:
    """Key of client ``client_id``'s ``client`` call in that exchange of that round."""
    k = jax.random.fold_in(jax.random.fold_in(run_key, _CLIENT), round_index)
    return jax.random.fold_in(jax.random.fold_in(k, exchange_index), client_id)


# ------------------------------------------------------------------------------ privacy


@dataclass(frozen=True)
class Protection:
    """How one Reply field computed by a client is protected.

    Attributes:
        kind: ``"accounted"``: produced by DP steps the client's accountant counts (its
            :class:`Spend`), or, with ``unit="client"``, released only through the server's
            accounted client-level mechanism; ``"noised"``: a noised release whose epsilon
            the client adds to ``Spend.extra_epsilon``; ``"public"``: not computed from
            private data; ``"unprotected"``: an exact private statistic (a paper-faithful
            mode), never covered by any epsilon.
        unit: the privacy unit: ``"record"`` (one example of a client) or ``"client"``
            (a whole client); ``None`` for public and unprotected fields.
        note: one line saying what the protection is.
    """

    kind: Literal["accounted", "noised", "public", "unprotected"]
    unit: Literal["record", "client"] | None = "record"
    note: str = ""


ACCOUNTED = Protection("accounted", "record", "DP steps counted by the client's accountant")
PUBLIC = Protection("public", None, "not computed from private data")
UNPROTECTED = Protection("unprotected", None, "exact statistic of private data")


def noised(note: str, unit: Literal["record", "client"] = "record") -> Protection:
    """A noised release (its epsilon is added to the client's ``Spend.extra_epsilon``)."""
    return Protection("noised", unit, note)


@flax.struct.dataclass
class Spend:
    """What a client's privacy accountant has counted so far (one client; stacked over
    clients, seeds and rounds by the simulator).

    Attributes:
        sample_rate: Poisson rate ``q`` of the accounted steps (records per client for
            record-level DP, clients for client-level DP).
        noise_multiplier: ``sigma`` of the accounted steps (0: no noise, epsilon = inf).
        steps: accounted steps taken so far.
        extra_epsilon: epsilon of other noised releases, added by basic composition.
    """

    sample_rate: Float[Array, ""]
    noise_multiplier: Float[Array, ""]
    steps: Int[Array, ""]
    extra_epsilon: Float[Array, ""]

    @classmethod
    def none(cls) -> Spend:
        """Nothing accounted (a non-private algorithm)."""
        z = jnp.zeros((), jnp.float32)
        return cls(
            sample_rate=z, noise_multiplier=z, steps=jnp.zeros((), jnp.int32), extra_epsilon=z
        )


def coverage(exchanges: tuple[Exchange, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(covered, not_covered)``: one line per Reply field of ``exchanges`` saying how it is
    protected; ``not_covered`` lists the ``unprotected`` fields (exact private statistics
    that no epsilon covers)."""
    covered, uncovered = [], []
    for ex in exchanges:
        for name, p in ex.protection.items():
            line = f"{ex.name}.{name}: {p.kind}" + (f" ({p.unit}-level)" if p.unit else "")
            line += f": {p.note}" if p.note else ""
            (uncovered if p.kind == "unprotected" else covered).append(line)
    return tuple(dict.fromkeys(covered)), tuple(dict.fromkeys(uncovered))


# ----------------------------------------------------------------------------- exchanges


@flax.struct.dataclass
class Slots:
    """The reply slots of one exchange: slot ``s`` holds client ``ids[s]``'s reply iff
    ``mask[s]`` (an unused slot has ``mask`` False and any id, e.g. ``num_clients``).

    Attributes:
        mask: ``(S,)`` bool, True where the slot holds a reply.
        ids: ``(S,)`` int32 client ids.
        num_clients: ``N``, the client slots of the federation (static).
    """

    mask: Bool[Array, " S"]
    ids: Int[Array, " S"]
    num_clients: int = flax.struct.field(pytree_node=False)

    @classmethod
    def everyone(cls, mask: Bool[Array, " N"]) -> Slots:
        """One slot per client, in client order."""
        n = mask.shape[0]
        return cls(mask=mask, ids=jnp.arange(n, dtype=jnp.int32), num_clients=n)

    def scatter(self, values: Array, fill: ArrayLike) -> Array:
        """``(N, ...)``: each replying slot's value at its client id, ``fill`` elsewhere."""
        mask = self.mask.reshape((-1,) + (1,) * (values.ndim - 1))
        out = jnp.full((self.num_clients, *values.shape[1:]), fill, values.dtype)
        return out.at[self.ids].set(jnp.where(mask, values, fill), mode="drop")

    def update(self, per_client: PyTree, values: PyTree) -> PyTree:
        """``per_client`` (leading axis ``N``) with each replying slot's value written at its
        client id; other clients keep theirs (a ``jnp.where``: unused slots never leak)."""

        def one(old: Array, new: Array) -> Array:
            safe = jnp.minimum(self.ids, self.num_clients - 1)
            mask = self.mask.reshape((-1,) + (1,) * (new.ndim - 1))
            return old.at[self.ids].set(jnp.where(mask, new, old[safe]), mode="drop")

        return jax.tree.map(one, per_client, values)


def where_selected(mask: Bool[Array, " N"], new: PyTree, old: PyTree) -> PyTree:
    """Per client slot (leading axis of every leaf): ``new`` where ``mask`` else ``old``.
    A ``jnp.where``, so whatever an unselected slot of ``new`` holds (NaN, inf) is dropped,
    never multiplied by 0."""

    def pick(a: Array, b: Array) -> Array:
        return jnp.where(mask.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)

    return jax.tree.map(pick, new, old)


def everyone(server: ServerState, key: PRNGKeyArray, num_clients: int) -> Bool[Array, " N"]:
    """``select`` that takes every client."""
    del server, key
    return jnp.ones((num_clients,), bool)


@dataclass(frozen=True)
class UniformCohort:
    """``select`` that draws ``min(size, N)`` clients uniformly without replacement
    (public: the server's key only; :func:`~swarmjax.fl.data.cohort.fixed_cohort`, whose
    cost is O(size), not O(N)). Use it with ``max_selected=size``: a round then runs and
    aggregates only the cohort."""

    size: int

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"cohort size must be an integer >= 1; got {self.size!r}")

    def __call__(self, server: ServerState, key: PRNGKeyArray, num_clients: int) -> Array:
        del server
        ids = fixed_cohort(key, num_clients, min(self.size, num_clients))
        return jnp.zeros((num_clients,), bool).at[ids].set(True)


@dataclass(frozen=True)
class Exchange:
    """One server -> clients -> server exchange (all functions pure; see the module docs).

    Attributes:
        name: short name (used in the privacy record and byte counts).
        select: ``(server, key, num_clients) -> Bool[num_clients]``.
        request: ``server -> Request`` (sent to every selected client).
        client: ``(client_state, data, request, key, hyper) -> (client_state, Reply)``.
        aggregate: ``(server, replies, slots, key, hyper) -> server``; ``replies`` stacked
            over the :class:`Slots`, unused slots arbitrary (combine with ``jnp.where``).
        protection: Reply field name -> :class:`Protection`, one entry per Reply field.
        max_selected: a static bound on how many clients ``select`` can pick (``None``: all);
            a runtime then runs only that many client calls and ``aggregate`` gets that
            many slots.
        expected_selected: ``None`` when the selection is public (released byte counts use
            the realised number of clients). Set it, ``(hyper, num_clients) -> expected
            number``, when the selection is part of a DP mechanism (secret Poisson sampling
            of clients): the realised count would leak, so released byte counts use this
            expectation and the realised count is only a private diagnostic.
    """

    name: str
    select: Callable[[ServerState, PRNGKeyArray, int], Bool[Array, " N"]]
    request: Callable[[ServerState], Request]
    client: Callable[..., tuple[ClientState, Reply]]
    aggregate: Callable[[ServerState, Reply, Slots, PRNGKeyArray, Hyper], ServerState]
    protection: Mapping[str, Protection] = field(default_factory=dict)
    max_selected: int | None = None
    expected_selected: Callable[[Hyper, int], Array] | None = None

    def __hash__(self) -> int:
        return hash(
            (
                self.name,
                self.select,
                self.request,
                self.client,
                self.aggregate,
                tuple(sorted(self.protection.items())),
                self.max_selected,
                self.expected_selected,
            )
        )


class Algorithm:
    """Base class of every federated algorithm: what a runtime may call, with defaults.

    Subclasses are frozen dataclasses (hashable: a jit static argument; equal algorithms
    compile once). Device-side members, written for ONE client or the server:

    * ``server_init(key, hyper) -> ServerState`` and
      ``client_init(key, data, hyper, client_id) -> ClientState`` (``data``: one client's
      slice of :meth:`client_data`), both required;
    * ``setup`` (exchanges run once before round 1) and ``exchanges`` (one round);
    * ``evaluate(server, test) -> dict[str, Array]``: public metrics on the public test set
      (the history's columns), required;
    * ``spend(server, client_state) -> Spend``: what that client's accountant counted;
    * ``private_diagnostics(client_state)``: statistics of private data, collected only on
      request, never released.

    Host-side members (called before any work, never traced): :meth:`client_data`,
    :meth:`check`, :meth:`default_hyper`, :meth:`resolve` and :meth:`sampling_overflow`.
    ``privacy_unit`` is ``"record"``, ``"client"`` or ``None`` (no DP).
    """

    setup: ClassVar[tuple[Exchange, ...]] = ()
    exchanges: ClassVar[tuple[Exchange, ...]] = ()
    privacy_unit: ClassVar[Literal["record", "client"] | None] = None

    # ------------------------------------------------------------------ device side

    def server_init(self, key: PRNGKeyArray, hyper: Hyper) -> ServerState:
        raise NotImplementedError

    def client_init(
        self, key: PRNGKeyArray, data: Any, hyper: Hyper, client_id: Int[Array, ""]
    ) -> ClientState:
        raise NotImplementedError

    def evaluate(self, server: ServerState, test: tuple[Array, Array]) -> dict[str, Array]:
        raise NotImplementedError

    def spend(self, server: ServerState, client_state: ClientState) -> Spend:
        """What the client's accountant counted (default: nothing, a non-private algorithm)."""
        del server, client_state
        return Spend.none()

    def private_diagnostics(self, client_state: ClientState) -> dict[str, Array]:
        """Statistics of a client's private data for debugging (default: none)."""
        del client_state
        return {}

    # -------------------------------------------------------------------- host side

    def client_data(self, clients: Any) -> PyTree:
        """What each client holds, stacked over clients, from stacked
        :class:`~swarmjax.fl.data.clients.ClientData` (default: the data itself)."""
        return clients

    def check(self, clients: Any, test: tuple[Array, Array] | None = None) -> None:
        """``ValueError`` naming the setting unless the algorithm fits ``clients`` (stacked
        ``ClientData``) and the public ``test`` set (``None``: not checked); default: no
        check. :meth:`Variants.grid` and the runtimes call it before any work."""
        del clients, test

    def default_hyper(self, clients: Any, spec: RunSpec) -> Hyper:
        """The hyper pytree of one variant (no variant axis) before :meth:`resolve`."""
        raise NotImplementedError

    def resolve(
        self, hyper: Hyper, clients: Any, spec: RunSpec, epsilon_target: float | None
    ) -> Hyper:
        """One variant's final hyper-parameters: derived values filled in (e.g. the noise
        calibrated to ``epsilon_target``), every value checked (``ValueError`` naming it).
        Default: an algorithm without DP accepts no finite ``epsilon_target``."""
        del clients, spec
        if epsilon_target is not None and math.isfinite(epsilon_target):
            raise ValueError(
                f"{type(self).__name__} makes no DP claim here: epsilon_target must be inf; "
                f"got {epsilon_target}"
            )
        return hyper

    def sampling_overflow(
        self,
        spend: Spend,
        num_clients: int,
        sizes: np.ndarray | None = None,
        padded: int | None = None,
    ) -> np.ndarray | None:
        """Per-step chance that a static-size Poisson draw the privacy rests on overflowed
        (charged to delta by the privacy record), broadcastable to the spend's
        ``(runs, rounds, clients)``; ``sizes``/``padded``: the clients' real and padded row
        counts, ``None`` in a deployment (the server holds no data). Default: nothing can
        overflow."""
        del spend, num_clients, sizes, padded
        return None


# ---------------------------------------------------------------------------- variants


@dataclass(frozen=True)
class RunSpec:
    """What every run of one call shares, stated once: ``rounds`` (training rounds
    ``T >= 1``), ``delta`` (of every epsilon the call reports) and ``seeds`` (runs are
    (variant, seed) pairs)."""

    rounds: int
    delta: float
    seeds: tuple[int, ...] = (0,)

    def __post_init__(self) -> None:
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int | np.integer):
            raise ValueError(f"rounds must be an integer >= 1; got {self.rounds!r}")
        if self.rounds < 1:
            raise ValueError(f"rounds must be an integer >= 1; got {self.rounds!r}")
        if not (isinstance(self.delta, int | float) and 0.0 < self.delta < 1.0):
            raise ValueError(f"delta must be in (0, 1); got {self.delta!r}")
        seeds = (self.seeds,) if isinstance(self.seeds, int | np.integer) else self.seeds
        seeds = tuple(int(s) for s in seeds)
        if not seeds or min(seeds) < 0:
            raise ValueError(f"seeds must be one or more integers >= 0; got {self.seeds!r}")
        object.__setattr__(self, "rounds", int(self.rounds))
        object.__setattr__(self, "delta", float(self.delta))
        object.__setattr__(self, "seeds", seeds)


@dataclass(frozen=True)
class Variants:
    """Numeric variants of one algorithm run side by side, and the call's :class:`RunSpec`.

    Attributes:
        hyper: the algorithm's hyper pytree with a leading variant axis ``V`` on every leaf.
        labels: history columns naming each variant (``V`` values each), e.g.
            ``{"epsilon_target": [1.0, 8.0]}``; rows with equal labels must be equal rows.
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
        alg.check(clients)
        base = alg.default_hyper(clients, spec)
        names = {f.name for f in dataclasses.fields(base)}
        for name in values:
            if name not in names:
                raise ValueError(
                    f"{type(alg).__name__} has no hyper-parameter {name!r}; it has {sorted(names)}"
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
        base = base.replace(**fixed) if fixed else base
        rows = []
        combos = list(itertools.product(*axes.values())) if axes else [()]
        for combo in combos:
            row = dict(zip(axes, combo, strict=True))
            eps = row.pop("epsilon_target", None)
            hyper = base.replace(**row) if row else base
            rows.append(alg.resolve(hyper, clients, spec, None if eps is None else float(eps)))
        hyper = jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *rows)
        labels = {name: [combo[i] for combo in combos] for i, name in enumerate(axes)}
        return cls(hyper=hyper, labels=labels, spec=spec)

    def take(self, index: int) -> Variants:
        """Variant ``index`` alone (a variant axis of 1; labels kept)."""
        hyper = jax.tree.map(lambda a: a[index : index + 1], self.hyper)
        labels = {k: [v[index]] for k, v in self.labels.items()}
        return Variants(hyper=hyper, labels=labels, spec=self.spec)


def _axis(name: str, values: float | Iterable[Any]) -> list[Any]:
    out = list(values) if isinstance(values, list | tuple) else [values]
    out = [v.item() if isinstance(v, np.generic) else v for v in out]
    if not out:
        raise ValueError(f"{name} must not be empty")
    if len(set(map(repr, out))) != len(out):
        raise ValueError(f"{name} has repeated values: {out}")
    return out


def _label_tag(labels: Mapping[str, Any]) -> int:
    return zlib.crc32(repr(sorted((k, repr(v)) for k, v in labels.items())).encode())


def run_keys(
    seeds: Sequence[int], labels: Sequence[Mapping[str, Any]], common_random_numbers: bool
) -> PRNGKeyArray:
    """One key per (variant, seed), variant-major: the root of every random number a run
    draws (:func:`server_key`, :func:`client_key`, ...).

    Args:
        seeds: the seeds (each ``>= 0``).
        labels: one mapping per variant (its history labels).
        common_random_numbers: give every variant ``key(seed)`` (shared draws).

    Returns:
        ``(variants * seeds,)`` typed PRNG keys, variant-major.

    Independent by default: run ``(v, s)`` uses ``fold_in(key(s), crc32(labels of v))``, so
    variants draw independent noise and a run's numbers do not depend on what else is in
    the batch. Two variants with equal labels would share every draw (two releases with
    the same noise), so labels must tell the variants apart (``ValueError`` otherwise).
    ``common_random_numbers=True`` gives every variant ``key(s)``: the variants then share
    every draw on purpose (paired comparisons; not independent samples).
    """
    tags = [_label_tag(lab) for lab in labels]
    if not common_random_numbers and len(set(tags)) != len(tags):
        raise ValueError(
            "variants must have labels that tell every row apart (rows with equal labels "
            f"would draw the same noise); got labels {list(labels)}"
        )
    keys = []
    for tag in tags:
        for s in seeds:
            k = jax.random.key(np.uint32(s))
            keys.append(k if common_random_numbers else jax.random.fold_in(k, tag))
    return jnp.stack(keys)
