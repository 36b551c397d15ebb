"""The federated protocol: an algorithm is pure functions of ONE client and of the server,
talking only through explicit message pytrees.

A run is ``setup`` exchanges once, then ``rounds`` rounds of ``exchanges``. One exchange:

1. the server decides who takes part, ``select(server, key, num_clients) -> Bool[N]``
   (public: it uses the server's state and key only);
2. the server builds ONE request for all of them, ``request(server) -> Request``;
3. every selected client runs ``client(state, data, request, key, hyper) -> (state, Reply)``
   on its own data; its state (swarm, optimiser state, step count) never leaves it;
4. the server folds the replies in, ``aggregate(server, replies, slots, key, hyper) ->
   server`` (``key``: :func:`aggregate_key`, for server-side noise). ``replies`` are stacked
   over ``S`` reply slots (all ``N`` clients, or an exchange's ``max_selected`` cohort
   slots: a round costs the cohort, not the federation); :class:`Slots` says which client
   each slot holds (``ids``) and which slots replied (``mask``). The other slots may hold
   anything (zeros, garbage, NaN), so aggregates must combine with
   ``jnp.where(slots.mask, ...)`` and never multiply by a 0/1 mask.

Privacy follows the messages: an exchange declares, per Reply field, how that field is
protected (:class:`Protection`); one that declares nothing is counted as sending exact
private statistics. The run's privacy record is derived from those
declarations, the clients' accounted steps and the plan's rates (both asked of the
algorithm's one :class:`Accounting`), never written by hand per algorithm
(:func:`coverage`).

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

The protocol is cut by room: :mod:`~swarmjax.fl.protocol.contract` (what an algorithm
author reads: :class:`Algorithm`, :class:`Exchange`; for a summed exchange
:class:`Update`, for a privacy claim :class:`Protection`),
:mod:`~swarmjax.fl.protocol.accounting` (:class:`Accounting`: what a private algorithm
answers about its privacy), :mod:`~swarmjax.fl.protocol.slots` (reply
slots and their sums),
:mod:`~swarmjax.fl.protocol.variants` (:class:`RunSpec`, :class:`Variants`) and
:mod:`~swarmjax.fl.protocol.keys` (keys and release identity). Every name is importable
from here.
"""

from swarmjax.fl.protocol.accounting import Accounting, privacy_unit, steps_of
from swarmjax.fl.protocol.contract import (
    ACCOUNTED,
    PUBLIC,
    UNDECLARED,
    UNPROTECTED,
    Algorithm,
    ClientState,
    Exchange,
    Hyper,
    Protection,
    Reply,
    Request,
    ServerState,
    SummedAggregate,
    UniformCohort,
    Update,
    coverage,
    everyone,
    noised,
)
from swarmjax.fl.protocol.keys import (
    aggregate_key,
    client_init_key,
    client_key,
    describe,
    release_identity,
    run_keys,
    server_init_key,
    server_key,
    variant_identities,
)
from swarmjax.fl.protocol.slots import (
    Slots,
    add_reply,
    reply_sum_zeros,
    row_shapes,
    slot_sum,
    where_selected,
)
from swarmjax.fl.protocol.slots import (
    _slot_product as _slot_product,  # tested directly
)
from swarmjax.fl.protocol.variants import RENAMED, RunSpec, Variants

__all__ = [
    "ACCOUNTED",
    "PUBLIC",
    "RENAMED",
    "UNDECLARED",
    "UNPROTECTED",
    "Accounting",
    "Algorithm",
    "ClientState",
    "Exchange",
    "Hyper",
    "Protection",
    "Reply",
    "Request",
    "RunSpec",
    "ServerState",
    "Slots",
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
    "privacy_unit",
    "release_identity",
    "reply_sum_zeros",
    "row_shapes",
    "run_keys",
    "server_init_key",
    "server_key",
    "slot_sum",
    "steps_of",
    "variant_identities",
    "where_selected",
]
