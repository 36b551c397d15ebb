"""The federated protocol: an algorithm is pure functions of ONE client and of the server,
talking only through explicit message pytrees.

A run is ``setup`` exchanges once, then ``rounds`` rounds of ``exchanges``. One exchange:

1. the server decides who takes part, ``select(server, key, num_clients) -> Bool[N]``
   (public: it uses the server's state and key only);
2. the server builds ONE request for all of them, ``request(server) -> Request``;
3. every selected client runs ``client(state, data, request, key, hyper) -> (state, Reply)``
   on its own data; its state (swarm, optimiser state, privacy spend) never leaves it;
4. the server folds the replies in, ``aggregate(server, replies, mask, key, hyper) -> server``
   (``key``: :func:`aggregate_key`, for server-side noise).
   ``replies`` are stacked over ALL ``N`` client slots, ``mask`` marks the slots that
   replied; the other slots may hold anything (zeros, garbage, NaN), so aggregates must
   combine with ``jnp.where(mask, ...)`` and never multiply by a 0/1 mask.

Privacy follows the messages: every exchange declares, per Reply field, how that field is
protected (:class:`Protection`). The run's privacy record is derived from those
declarations and the clients' :class:`Spend` (what their accountant counted), never written
by hand per algorithm (:func:`coverage`).

Keys: every random number of a run comes from ``run_key = jax.random.key(seed)`` through
:func:`server_key` and :func:`client_key` (``fold_in`` only, never a split across clients),
so a simulator and a deployment where each client derives its own keys from the run seed,
its id and the round/exchange index the server sends draw identical numbers. Round ``0``
is the setup; rounds ``1..T`` are the training rounds.

Changed (after the first version): ``client_init`` takes the ``client_id`` (per-client
hyper-parameters such as a calibrated noise multiplier are picked by id); ``spend`` takes the
server state too (client-level DP is accounted by the server); ``Exchange.expected_selected``
and ``Algorithm.private_diagnostics`` added; ``aggregate`` takes a key
(``aggregate(server, replies, mask, key, hyper)``, key from :func:`aggregate_key`).

Runtimes: :mod:`swarmjax.fl.runtime.simulator` (one process, everything vmapped) and the
Flower runtime (``swarmjax.fl.runtime.flower``) execute any :class:`Algorithm` unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import flax.struct
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree

__all__ = [
    "ACCOUNTED",
    "PUBLIC",
    "UNPROTECTED",
    "Algorithm",
    "Exchange",
    "Protection",
    "Spend",
    "aggregate_key",
    "client_init_key",
    "client_key",
    "coverage",
    "everyone",
    "noised",
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
class Exchange:
    """One server -> clients -> server exchange (all functions pure; see the module docs).

    Attributes:
        name: short name (used in the privacy record and byte counts).
        select: ``(server, key, num_clients) -> Bool[num_clients]``.
        request: ``server -> Request`` (sent to every selected client).
        client: ``(client_state, data, request, key, hyper) -> (client_state, Reply)``.
        aggregate: ``(server, replies, mask, key, hyper) -> server``; ``replies`` stacked
            over all slots, unselected slots arbitrary (combine with ``jnp.where``).
        protection: Reply field name -> :class:`Protection`, one entry per Reply field.
        max_selected: a static bound on how many clients ``select`` can pick (``None``: all);
            a runtime may then run only that many client calls.
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
    aggregate: Callable[[ServerState, Reply, Bool[Array, " N"], PRNGKeyArray, Hyper], ServerState]
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


@runtime_checkable
class Algorithm(Protocol):
    """A federated algorithm: a frozen, hashable dataclass (a jit static argument; equal
    algorithms compile once) with these members.

    * ``server_init(key, hyper) -> ServerState``;
    * ``client_init(key, data, hyper, client_id) -> ClientState`` for ONE client (``data``:
      its padded :class:`~swarmjax.fl.data.ClientData` without a client axis);
    * ``setup``: exchanges run once before round 1 (round index 0);
    * ``exchanges``: one round is these exchanges in order;
    * ``evaluate(server, test) -> dict[str, Array]``: public metrics of the server state
      on the public test set ``(x, y)`` (the history's columns);
    * ``spend(server, client_state) -> Spend``: what that client's accountant has counted
      (record-level DP: the client's own steps; client-level DP: the server's accounted
      aggregates, the same for every client);
    * ``privacy_unit``: ``"record"``, ``"client"`` or ``None`` (no DP);
    * ``private_diagnostics(client_state) -> dict[str, Array]``: statistics of a client's
      private data for debugging (collected only on request, never released, not covered).
    """

    setup: tuple[Exchange, ...]
    exchanges: tuple[Exchange, ...]
    privacy_unit: Literal["record", "client"] | None

    def server_init(self, key: PRNGKeyArray, hyper: Hyper) -> ServerState: ...

    def client_init(
        self, key: PRNGKeyArray, data: Any, hyper: Hyper, client_id: Int[Array, ""]
    ) -> ClientState: ...

    def evaluate(self, server: ServerState, test: tuple[Array, Array]) -> dict[str, Array]: ...

    def spend(self, server: ServerState, client_state: ClientState) -> Spend: ...

    def private_diagnostics(self, client_state: ClientState) -> dict[str, Array]: ...
