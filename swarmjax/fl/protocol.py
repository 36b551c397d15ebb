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

Keys: every random number of a run comes from its run key through :func:`server_key`,
:func:`aggregate_key` and :func:`client_key` (``fold_in`` only, never a split across
clients), so a simulator and a deployment where each client derives its own keys from the
run key, its id and the round/exchange index the server sends draw identical numbers. Round
``0`` is the setup; rounds ``1..T`` are the training rounds. Each purpose has its own
domain tag folded into the run key first (server init, client init, select, client,
aggregate), so no key of one purpose is a ``fold_in``/``split`` descendant of another's: in
particular the aggregate's noise keys are never among the redraw keys
``fold_in(select_key, attempt)`` of a Poisson selection (in this JAX,
``split(k)[i] == fold_in(k, i)``, so that holds for split children too).

A run key is the call's secret (:class:`~swarmjax.privacy.secret.Secret`: 256 bits of
operating-system entropy unless the caller supplies them) with the run's release identity
(:func:`release_identity`: the algorithm's type and static settings, every hyper-parameter
value of the variant and its labels) and its seed folded in (:func:`run_keys`), as a
256-bit ChaCha20 key: nothing published (seed, settings, data) determines any draw; two
variants of a call never share a draw; two calls share one only if the caller gave both the
same secret, and the ledger refuses to compose runs whose keys coincide (public key
fingerprints); the same secret, configuration and seed give the same key (exact resumes,
a deployment that matches the simulator).

The contract, in one place: a runtime calls only the members of :class:`Algorithm` (every
host-side one has a default here), builds the variant axis with :meth:`Variants.grid` and
the run keys with :func:`run_keys`, and reads a call's rounds, delta and seeds from one
:class:`RunSpec`. Runtimes: :mod:`swarmjax.fl.runtime.simulator` (one process, everything
vmapped) and the Flower runtime (:mod:`swarmjax.fl.runtime.flower`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import math
import re
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray, PyTree

from swarmjax.fl.data.cohort import fixed_cohort
from swarmjax.privacy.secret import Secret

if TYPE_CHECKING:
    from swarmjax.privacy.canaries import CanaryHook

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
    "SummedAggregate",
    "UniformCohort",
    "Update",
    "Variants",
    "add_reply",
    "aggregate_key",
    "client_init_key",
    "client_key",
    "coverage",
    "describe",
    "everyone",
    "noised",
    "release_identity",
    "reply_sum_zeros",
    "run_keys",
    "server_init_key",
    "server_key",
    "slot_sum",
    "variant_identities",
    "where_selected",
]

ServerState = PyTree
ClientState = PyTree
Request = PyTree
Reply = PyTree
Hyper = PyTree

# Domain tags, one per purpose, folded into the run key first: keys of different purposes
# (e.g. a select key's redraws and the aggregate's noise) are never descendants of each other.
_SERVER_INIT, _CLIENT_INIT, _SERVER, _CLIENT, _AGGREGATE = 0, 1, 2, 3, 4


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
    """Key of the server's ``aggregate`` (e.g. its Gaussian noise) in that exchange.

    Its own domain (``_AGGREGATE``), not a child of :func:`server_key`: a Poisson ``select``
    redraws with ``fold_in(select_key, attempt)``, ``attempt = 1, 2, ...``, so a child of the
    select key would be a redraw key and the noise would correlate with the selection on
    rounds whose first draw overflows.
    """
    k = jax.random.fold_in(jax.random.fold_in(run_key, _AGGREGATE), round_index)
    return jax.random.fold_in(k, exchange_index)


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


@flax.struct.dataclass
class Update:
    """A client's reply in a summed model exchange: its model update ``delta`` (a pytree,
    e.g. ``theta_i - w_t``) times its public ``weight``, and that weight; the server sees
    ``Update(sum_i w_i delta_i, sum_i w_i)``. A user-level privacy plan
    (:func:`swarmjax.fl.private.private`) clips ``delta`` as sent, sums with weight 1 and
    hands the server ``Update(noised sum, public denominator)``.

    Attributes:
        delta: the (weighted) update, a pytree; float32 or wider once summed.
        weight: ``()`` the client's weight (1 under a privacy plan).
    """

    delta: PyTree
    weight: Float[Array, ""]


def where_selected(mask: Bool[Array, " N"], new: PyTree, old: PyTree) -> PyTree:
    """Per client slot (leading axis of every leaf): ``new`` where ``mask`` else ``old``.
    A ``jnp.where``, so whatever an unselected slot of ``new`` holds (NaN, inf) is dropped,
    never multiplied by 0."""

    def pick(a: Array, b: Array) -> Array:
        return jnp.where(mask.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)

    return jax.tree.map(pick, new, old)


def add_reply(total: PyTree, reply: PyTree, used: Bool[Array, ""]) -> PyTree:
    """``total + reply`` leaf by leaf where ``used``, else ``total``: one slot of a reply sum
    (``total`` float32 or wider). The slot is chosen with ``jnp.where`` before the add, so
    NaN or inf in an unused slot never reaches it. The one definition of adding a slot:
    :func:`slot_sum` on a CPU and the simulator's fold of a summed exchange both use it, so
    the two give the same bits."""
    return jax.tree.map(
        lambda t, r: t + jnp.where(used, r.astype(t.dtype), jnp.zeros((), t.dtype)), total, reply
    )


def reply_sum_zeros(like: PyTree) -> PyTree:
    """The empty sum of replies shaped like ``like`` (one reply, or its shape structure):
    zeros, float32 or wider."""
    return jax.tree.map(lambda r: jnp.zeros(r.shape, jnp.promote_types(r.dtype, jnp.float32)), like)


def slot_sum(
    tree: PyTree,
    mask: Bool[Array, " S"],
    weights: Float[Array, " S"] | None = None,
    *,
    start: PyTree | None = None,
) -> PyTree:
    """``start + sum_s [mask_s] w_s x_s`` over the leading slot axis, leaf by leaf, float32
    or wider (``weights`` ``w``: ``None`` for 1, finite; ``start``: ``None`` for zeros).
    Every slot is chosen with ``jnp.where`` on its mask bit before any arithmetic: NaN or
    inf in an unselected slot never reaches it.

    How it sums is the platform's choice, measured: on a CPU a loop over the ``S`` slots in
    slot order (:func:`add_reply`; the simulator's fold of a summed exchange gives the same
    bits), with no masked copy of the ``(S, ...)`` stack: 9 ms for 97 slots of the
    1.2 M-parameter CNN on the 2-core CPU, against 159 ms for a masked copy and a product
    with a ones vector, and ~0.7 s for XLA's reduction over the leading axis
    (docs/cross_device.md). On an accelerator, where a loop step is a kernel launch and the
    copy is cheap, the masked stack times the (weight) vector: one product."""
    if start is None:  # from the shapes alone (no slot need exist)
        like = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape[1:], leaf.dtype), tree)
        start = reply_sum_zeros(like)
    if mask.shape[0] == 0:
        return start

    if jax.default_backend() != "cpu":
        return _slot_product(tree, mask, weights, start)

    def add(s: Int[Array, ""], total: PyTree) -> PyTree:
        x = jax.tree.map(lambda leaf: leaf[s], tree)
        if weights is not None:
            x = jax.tree.map(lambda v: jnp.where(mask[s], _wide(v), 0) * weights[s], x)
        return add_reply(total, x, mask[s])

    return jax.lax.fori_loop(0, mask.shape[0], add, start)


def _wide(v: Array) -> Array:
    return v.astype(jnp.promote_types(v.dtype, jnp.float32))


def _slot_product(
    tree: PyTree, mask: Bool[Array, " S"], weights: Float[Array, " S"] | None, start: PyTree
) -> PyTree:
    """:func:`slot_sum` on an accelerator: the stack with its unselected slots zeroed
    (``jnp.where``) times the weight vector, one product a leaf."""
    w = jnp.ones(mask.shape, jnp.float32) if weights is None else weights
    w = jnp.where(mask, w, 0)

    def product(t: Array, leaf: Array) -> Array:
        chosen = jnp.where(mask.reshape((-1,) + (1,) * (leaf.ndim - 1)), _wide(leaf), 0)
        return t + jnp.tensordot(w.astype(t.dtype), chosen.astype(t.dtype), axes=1)

    return jax.tree.map(product, start, tree)


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
        aggregate_sum: ``None``, or ``aggregate`` through the replies' sum alone:
            ``aggregate(server, replies, slots, key, hyper) == aggregate_sum(server,
            slot_sum(replies, slots.mask), slots, key, hyper)`` (:func:`slot_sum`: the
            selected slots added in slot order, float32 or wider). Set it when the server
            needs only the sum of the selected replies (as secure aggregation would give
            it): a runtime may then add each reply into the sum as it comes
            (:func:`add_reply`) instead of holding the ``S`` replies. The simulator does
            under one-at-a-time and blocked client maps: no ``(S, ...)`` stack of replies
            (466 MB for 97 slots of a 1.2 M-parameter model), the same bits on a CPU.
    """

    name: str
    select: Callable[[ServerState, PRNGKeyArray, int], Bool[Array, " N"]]
    request: Callable[[ServerState], Request]
    client: Callable[..., tuple[ClientState, Reply]]
    aggregate: Callable[[ServerState, Reply, Slots, PRNGKeyArray, Hyper], ServerState]
    protection: Mapping[str, Protection] = field(default_factory=dict)
    max_selected: int | None = None
    expected_selected: Callable[[Hyper, int], Array] | None = None
    aggregate_sum: (
        Callable[[ServerState, Reply, Slots, PRNGKeyArray, Hyper], ServerState] | None
    ) = None

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
                self.aggregate_sum,
            )
        )


class SummedAggregate:
    """Mixin of an algorithm whose server needs only the sum of the selected replies: it
    defines ``aggregate_sum(server, total, slots, key, hyper)`` (set it as its exchange's
    ``aggregate_sum``), and ``aggregate`` on stacked replies is that of their
    :func:`slot_sum` (the contract of :attr:`Exchange.aggregate_sum`)."""

    def aggregate(
        self, server: ServerState, replies: Reply, slots: Slots, key: PRNGKeyArray, hyper: Hyper
    ) -> ServerState:
        """The server's step from the stacked replies: ``aggregate_sum`` of their sum over
        the selected slots."""
        return self.aggregate_sum(server, slot_sum(replies, slots.mask), slots, key, hyper)

    def aggregate_sum(
        self, server: ServerState, total: Reply, slots: Slots, key: PRNGKeyArray, hyper: Hyper
    ) -> ServerState:
        raise NotImplementedError


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

    def floating_point(self) -> str | None:
        """What the exact released float values reveal beyond epsilon (the privacy record
        states it; docs/floating_point.md). Default: ``None`` without DP; with DP, plain
        float32 noise (whose low bits can reveal the secret, Mironov 2012) unless the
        algorithm releases its noised values snapped to a grid."""
        if self.privacy_unit is None:
            return None
        return (
            "float: noise is added in float32 (inside the clients' DP steps or by the server); "
            "the exact low bits of a released value can reveal the secret beyond epsilon "
            "(Mironov 2012; docs/floating_point.md)"
        )

    def canary_hook(self) -> CanaryHook | None:
        """How the algorithm takes client-level canaries for ``simulate(audit=...)``
        (:class:`~swarmjax.privacy.canaries.CanaryHook`), or ``None`` (default: it takes
        none; a privacy plan's :class:`~swarmjax.fl.private.Private` does)."""
        return None

    # -------------------------------------------------------------------- host side

    def audited(self, result: Any) -> Any:
        """A finished run's result with the algorithm's own audit added (record-level
        canaries it carries in its clients; default: ``result`` unchanged)."""
        return result

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
    ``T >= 1``), ``delta`` (of every epsilon the call reports), ``seeds`` (runs are
    (variant, seed) pairs) and ``accountant`` (``"pld"``, the default, or ``"rdp"``: what
    calibrates the noise and what the privacy record composes with)."""

    rounds: int
    delta: float
    seeds: tuple[int, ...] = (0,)
    accountant: str = "pld"

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
        if self.accountant not in ("pld", "rdp"):
            raise ValueError(f"unknown accountant {self.accountant!r}; choose one of 'pld', 'rdp'")
        object.__setattr__(self, "rounds", int(self.rounds))
        object.__setattr__(self, "delta", float(self.delta))
        object.__setattr__(self, "seeds", seeds)


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
        alg.check(clients)
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
        hyper = jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *rows)
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


# ---------------------------------------------------------------------------- identity

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_IDENTITY_VERSION = b"swarmjax.release_identity/1"
_IDENTITY_WORDS = 8  # 32-bit words of the digest folded into a run key (all 256 bits)


def describe(value: Any) -> Any:
    """A deterministic, JSON-able description of a static setting (an algorithm, its
    model, its training options, ...): the same in every process that builds the same
    objects, so a digest of it names the setting.

    Dataclasses give their type name and every field; ``functools.partial`` its function,
    arguments and keywords; plain functions their module-qualified name with the values
    they close over and their defaults; other callables their qualified name; arrays their
    shape, dtype and a sha256 of their bytes; tuples, lists, sets (sorted) and mappings
    their items; anything else its ``repr`` with memory addresses (``at 0x...``) removed,
    which differ between processes. A reference cycle (a function closing over itself) is
    ``"<cycle>"``.
    """
    return _describe(value, frozenset())


def _describe(value: Any, path: frozenset[int]) -> Any:
    """:func:`describe`; ``path``: ids of the objects being described (cycle guard)."""
    if id(value) in path:
        return "<cycle>"
    sub = functools.partial(_describe, path=path | {id(value)})
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: sub(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"type": type(value).__qualname__, **fields}
    if isinstance(value, functools.partial):
        return {
            "partial": sub(value.func),
            "args": [sub(a) for a in value.args],
            "keywords": {str(k): sub(v) for k, v in value.keywords.items()},
        }
    if isinstance(value, np.ndarray | np.generic | jax.Array):
        a = _host_array(value)
        digest = hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
        return {"array": [list(a.shape), a.dtype.name, a.dtype.str], "sha256": digest}
    if isinstance(value, types.FunctionType):
        out: dict[str, Any] = {"function": f"{value.__module__}.{value.__qualname__}"}
        cells = value.__closure__ or ()
        if cells:
            out["closure"] = [sub(_cell(c)) for c in cells]
        if value.__defaults__:
            out["defaults"] = [sub(d) for d in value.__defaults__]
        if value.__kwdefaults__:
            out["kwdefaults"] = {k: sub(v) for k, v in value.__kwdefaults__.items()}
        return out
    if callable(value):
        return getattr(value, "__qualname__", type(value).__qualname__)
    if isinstance(value, tuple | list):
        return [sub(v) for v in value]
    if isinstance(value, set | frozenset):  # iteration order varies with the hash seed
        return {"set": sorted((sub(v) for v in value), key=lambda d: json.dumps(d, sort_keys=True))}
    if isinstance(value, Mapping):
        return {str(k): sub(v) for k, v in value.items()}
    return _ADDRESS.sub("", repr(value))


def _cell(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a closure variable not bound yet
        return "<empty cell>"


def _host_array(value: Any) -> np.ndarray:
    """``value`` as a host NumPy array (typed PRNG keys as their ``uint32`` key data)."""
    if isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
        value = jax.random.key_data(value)
    return np.asarray(value)


def _plain_label(value: Any) -> Any:
    """A label value with NumPy scalars and arrays as Python numbers and lists."""
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    return value


def _static_text(alg: Algorithm) -> bytes:
    """The algorithm's class (module-qualified) and :func:`describe` of its settings."""
    cls = type(alg)
    text = json.dumps(describe(alg), sort_keys=True)
    return f"{cls.__module__}.{cls.__qualname__}\n{text}".encode()


def _identity(static: bytes, hyper_row: Hyper, labels: Mapping[str, Any]) -> bytes:
    """sha256 of the version tag, ``static`` (:func:`_static_text`), every leaf of
    ``hyper_row`` (path, shape, dtype, bytes) and the labels, each part length-prefixed."""
    h = hashlib.sha256()

    def part(data: bytes) -> None:  # length-prefixed: no two sequences of parts collide
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)

    part(_IDENTITY_VERSION)
    part(static)
    leaves = jax.tree_util.tree_flatten_with_path(hyper_row)[0]
    part(f"{type(hyper_row).__qualname__}:{len(leaves)}".encode())
    for path, leaf in leaves:
        a = _host_array(leaf)
        part(f"{jax.tree_util.keystr(path)}|{a.shape}|{a.dtype.name}|{a.dtype.str}".encode())
        part(np.ascontiguousarray(a).tobytes())
    text = {str(k): describe(_plain_label(v)) for k, v in labels.items()}
    part(json.dumps(text, sort_keys=True).encode())
    return h.digest()


def release_identity(alg: Algorithm, hyper_row: Hyper, labels: Mapping[str, Any]) -> bytes:
    """What one variant releases, as a 32-byte sha256 digest (the seed aside).

    Args:
        alg: the algorithm: its module-qualified class and every static setting
            (:func:`describe`: fields, model, training options, functions by name).
        hyper_row: ONE variant's hyper pytree (no variant axis): every leaf's path, shape,
            dtype and bytes, so two rows differing in one value (to the last bit) differ.
        labels: the variant's history labels (name -> value).

    Returns:
        ``sha256`` digest (32 bytes). Equal for equal configurations in any process that
        builds the same objects (same code and library versions, hence bit-equal resolved
        hyper values); :func:`run_keys` folds it into the seed's key. The client data and
        the :class:`RunSpec` are not part of it: a deployment's server never holds the data,
        and rounds/delta reach the numbers only through the hyper values (calibrated
        noise), which are part of it.
    """
    return _identity(_static_text(alg), hyper_row, labels)


def variant_identities(alg: Algorithm, variants: Variants) -> tuple[bytes, ...]:
    """:func:`release_identity` of every variant of ``variants`` (``V`` digests, in
    variant order): what a runtime passes to :func:`run_keys`."""
    static = _static_text(alg)
    host = jax.tree.map(_host_array, variants.hyper)
    return tuple(
        _identity(static, jax.tree.map(lambda a, v=v: a[v], host), labels)
        for v, labels in enumerate(variants.row_labels())
    )


def run_keys(
    secret: Secret,
    seeds: Sequence[int],
    identities: Sequence[bytes],
    common_random_numbers: bool,
) -> PRNGKeyArray:
    """One key per (variant, seed), variant-major: the root of every random number a run
    draws (:func:`server_key`, :func:`client_key`, ...).

    Args:
        secret: the call's :class:`~swarmjax.privacy.secret.Secret` (256 secret bits;
            :meth:`~swarmjax.privacy.secret.Secret.generate` draws them from the operating
            system). Nothing published (seed, settings, data) determines a key without it.
        seeds: the seeds (each ``>= 0``): labels of repeated runs.
        identities: one :func:`release_identity` per variant (:func:`variant_identities`),
            32 bytes each.
        common_random_numbers: give every variant of a seed the same key (shared draws).

    Returns:
        ``(variants * seeds,)`` typed ChaCha20 keys, variant-major
        (:func:`~swarmjax.privacy.secret.keys_for_runs`).

    Independent by default: run ``(v, s)`` folds identity ``v`` and seed ``s`` into the
    secret's key, so the runs of a call differ in every draw, a run's numbers do not depend
    on what else is in the call, and calls with different secrets share nothing. Two
    variants with equal identity (the same run twice) would release the same noise twice:
    ``ValueError``. ``common_random_numbers=True`` gives every variant of a seed one key:
    the variants then share every draw on purpose (paired comparisons; the ledger refuses
    to compose them).
    """
    if not isinstance(secret, Secret):
        raise TypeError(
            f"run_keys takes a swarmjax.privacy.secret.Secret first; got {type(secret).__name__}"
        )
    ids = list(identities)
    if not ids:
        raise ValueError("run_keys needs at least one identity (one per variant)")
    for ident in ids:
        if not isinstance(ident, bytes) or len(ident) < 4 * _IDENTITY_WORDS:
            raise TypeError(
                "run_keys takes release identities (bytes from release_identity or "
                f"variant_identities), not {type(ident).__name__}"
            )
    if not common_random_numbers and len(set(ids)) != len(ids):
        first = {}
        for v, ident in enumerate(ids):
            if ident in first:
                raise ValueError(
                    f"variants {first[ident]} and {v} are the same run (equal algorithm, "
                    "hyper-parameter values and labels) and would draw the same noise; drop "
                    "one, or pass common_random_numbers=True"
                )
            first[ident] = v
    seed_list = [int(s) for s in seeds]
    if not seed_list or min(seed_list) < 0:
        raise ValueError(f"seeds must be one or more integers >= 0; got {list(seeds)!r}")
    return secret.run_keys(seed_list, ids, common_random_numbers)
