"""The contract between algorithms and runtimes: :class:`Algorithm` (every member a
runtime may call, with defaults), :class:`Exchange` (one server -> clients -> server
exchange), how each reply field is protected (:class:`Protection`) and the reply of a
summed model exchange (:class:`Update`). A private algorithm's accounting is one more
object (:mod:`swarmjax.fl.protocol.accounting`). The overview is :mod:`swarmjax.fl.protocol`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree

from swarmjax._validation import check_int
from swarmjax.fl.data.cohort import fixed_cohort
from swarmjax.fl.protocol.accounting import Accounting
from swarmjax.fl.protocol.slots import Slots, slot_sum
from swarmjax.models import param_bytes
from swarmjax.privacy.bitpack import packed_size

if TYPE_CHECKING:
    from swarmjax.fl.protocol.variants import RunSpec

__all__ = [
    "ACCOUNTED",
    "PUBLIC",
    "UNDECLARED",
    "UNPROTECTED",
    "Algorithm",
    "Exchange",
    "Protection",
    "SummedAggregate",
    "UniformCohort",
    "Update",
    "coverage",
    "everyone",
    "noised",
]

ServerState = PyTree
ClientState = PyTree
Request = PyTree
Reply = PyTree
Hyper = PyTree


@dataclass(frozen=True)
class Protection:
    """How one Reply field computed by a client is protected.

    Attributes:
        kind: ``"accounted"``: produced by DP steps the client's accountant counts
            (:meth:`~swarmjax.fl.protocol.accounting.Accounting.steps`), or, with
            ``unit="client"``, released only through the server's accounted client-level
            mechanism; ``"noised"``: a noised release whose epsilon the accounting adds
            (its ``rates``' ``extra_epsilon``); ``"public"``: not computed from
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


UNDECLARED = "no protection declared, so counted as exact private statistics"


def noised(note: str, unit: Literal["record", "client"] = "record") -> Protection:
    """A noised release (its epsilon is added by the accounting's
    :meth:`~swarmjax.fl.protocol.accounting.Accounting.rates`, ``extra_epsilon``)."""
    return Protection("noised", unit, note)


def coverage(exchanges: tuple[Exchange, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(covered, not_covered)``: one line per Reply field of ``exchanges`` saying how it is
    protected; ``not_covered`` lists the ``unprotected`` fields (exact private statistics
    that no epsilon covers) and, as one line each, the exchanges that declare no
    protection (:attr:`Exchange.protection` ``None``)."""
    covered, uncovered = [], []
    for ex in exchanges:
        if ex.protection is None:  # undeclared: counted as what it may be, exact
            uncovered.append(f"{ex.name}: unprotected: {UNDECLARED}")
            continue
        for name, p in ex.protection.items():
            line = f"{ex.name}.{name}: {p.kind}" + (f" ({p.unit}-level)" if p.unit else "")
            line += f": {p.note}" if p.note else ""
            (uncovered if p.kind == "unprotected" else covered).append(line)
    return tuple(dict.fromkeys(covered)), tuple(dict.fromkeys(uncovered))


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
        protection: Reply field name -> :class:`Protection`, one entry per Reply field
            (``{}``: the reply has no fields, nothing is sent). ``None`` (default): not
            declared; the privacy record then counts the exchange's replies as exact
            private statistics (one ``not_covered`` line), so an algorithm that makes no
            privacy claim need not declare anything, and one that does cannot leave a
            field out unnoticed by omitting the mapping.
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
        reply_bits: ``None`` (default): every Reply leaf goes on the wire at its dtype's
            full width. An integer ``b`` in ``[1, 32]``: each word of an unsigned-integer
            Reply leaf carries only its low ``b`` bits, packed ``b`` bits a word
            (:mod:`swarmjax.privacy.bitpack`: ``ceil(k b / 8)`` bytes for ``k`` words, as
            secure aggregation's residues modulo ``2^b`` travel); leaves of any other dtype
            (floats, signed integers, bools) still count their full width. The released
            byte counts (the history's ``bytes_up``) are :meth:`reply_bytes`.
    """

    name: str
    select: Callable[[ServerState, PRNGKeyArray, int], Bool[Array, " N"]]
    request: Callable[[ServerState], Request]
    client: Callable[..., tuple[ClientState, Reply]]
    aggregate: Callable[[ServerState, Reply, Slots, PRNGKeyArray, Hyper], ServerState]
    protection: Mapping[str, Protection] | None = None
    max_selected: int | None = None
    expected_selected: Callable[[Hyper, int], Array] | None = None
    aggregate_sum: (
        Callable[[ServerState, Reply, Slots, PRNGKeyArray, Hyper], ServerState] | None
    ) = None
    reply_bits: int | None = None

    def __post_init__(self) -> None:
        if self.reply_bits is not None:
            check_int("reply_bits", self.reply_bits, 1, 32)

    def reply_bytes(self, reply: Reply) -> int:
        """Bytes one client's ``reply`` (arrays or ``jax.ShapeDtypeStruct`` shapes) puts on
        the wire: each leaf's size times its dtype's width, but ``packed_size(k,
        reply_bits)`` for an unsigned-integer leaf of ``k`` words when :attr:`reply_bits`
        is set (one-line ``ValueError`` for such a leaf narrower than ``reply_bits``)."""
        bits, total = self.reply_bits, 0
        for a in jax.tree.leaves(reply):
            if bits is None or not jnp.issubdtype(getattr(a, "dtype", None), np.unsignedinteger):
                total += param_bytes(a)
            elif 8 * a.dtype.itemsize < bits:
                raise ValueError(
                    f"exchange {self.name!r}: reply_bits={bits} exceeds its {a.dtype} reply leaf"
                )
            else:
                total += packed_size(int(np.prod(a.shape)), bits)
        return total

    def __hash__(self) -> int:
        return hash(
            (
                self.name,
                self.select,
                self.request,
                self.client,
                self.aggregate,
                None if self.protection is None else tuple(sorted(self.protection.items())),
                self.max_selected,
                self.expected_selected,
                self.aggregate_sum,
                self.reply_bits,
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
      (the history's columns), required.

    Host-side members (called before any work, never traced): :meth:`client_data` and
    :meth:`resolve`, which also validate (the data and the public test set; every setting
    and hyper value), and :meth:`default_hyper`. A private algorithm's whole
    privacy (its unit, each client's steps, rates and overflow charges, non-Gaussian events,
    audits)
    is one object, :meth:`accounting`; ``None`` (the default) makes no claim.
    """

    setup: ClassVar[tuple[Exchange, ...]] = ()
    exchanges: ClassVar[tuple[Exchange, ...]] = ()

    # ------------------------------------------------------------------ device side

    def server_init(self, key: PRNGKeyArray, hyper: Hyper) -> ServerState:
        raise NotImplementedError

    def client_init(
        self, key: PRNGKeyArray, data: Any, hyper: Hyper, client_id: Int[Array, ""]
    ) -> ClientState:
        raise NotImplementedError

    def evaluate(self, server: ServerState, test: tuple[Array, Array]) -> dict[str, Array]:
        raise NotImplementedError

    # -------------------------------------------------------------------- host side

    def accounting(self) -> Accounting | None:
        """How this algorithm's privacy is accounted
        (:class:`~swarmjax.fl.protocol.accounting.Accounting`: unit, steps, rates,
        events, floating point, audit hooks), or ``None`` (default): no DP claim, every
        epsilon infinite."""
        return None

    def client_data(self, clients: Any, test: tuple[Array, Array] | None = None) -> PyTree:
        """What each client holds, stacked over clients, from stacked
        :class:`~swarmjax.fl.data.clients.ClientData`, after a ``ValueError`` naming the
        setting unless the algorithm fits ``clients`` and the public ``test`` set
        (``None``: not checked). The runtimes call it before any work. Default: the data
        itself, unchecked."""
        del test
        return clients

    def default_hyper(self, clients: Any, spec: RunSpec) -> Hyper:
        """The hyper pytree of one variant (no variant axis) before :meth:`resolve`."""
        raise NotImplementedError

    def resolve(
        self, hyper: Hyper, clients: Any, spec: RunSpec, epsilon_target: float | None
    ) -> Hyper:
        """One variant's final hyper-parameters: derived values filled in (e.g. the noise
        calibrated to ``epsilon_target``), every setting and value checked against
        ``clients`` (``ValueError`` naming it; :meth:`Variants.grid` calls it for every row
        before any work). Default: an algorithm without DP accepts no finite
        ``epsilon_target``."""
        del clients, spec
        if epsilon_target is not None and math.isfinite(epsilon_target):
            raise ValueError(
                f"{type(self).__name__} makes no DP claim here: epsilon_target must be inf; "
                f"got {epsilon_target}"
            )
        return hyper
