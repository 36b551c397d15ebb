"""Client-level canaries in a simulation: one object per call, :class:`CanaryCall`, that the
simulator holds beside its runs and asks at three points only.

* :meth:`CanaryCall.start` (host, before any round): the audit checked against the
  algorithm (one ``ValueError`` line naming the option), the algorithm's hook taken from its
  accounting (:meth:`~swarmjax.fl.protocol.Accounting.canary_hook`), the canaries'
  directions for the released model and the slots ``K`` a round gives them.
* in each compiled call of rounds (traced): a :class:`CanaryRound` (the hook, the audit,
  the directions and the slots), whose :meth:`CanaryRound.join` puts the canaries taking
  part beside the real replies of the hook's exchange, after the clients' sum and before
  the plan's noise.
* :meth:`CanaryCall.reports` (host, when the run finishes): each run's
  :class:`~swarmjax.privacy.canaries.CanaryReport` from its initial and final server
  states, against the accounted epsilon.

The mathematics (directions, inclusion coins, scores, the empirical bound) lives in
:mod:`swarmjax.privacy.canaries`; docs/audits.md explains the audit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, PRNGKeyArray, PyTree

from swarmjax.fl.protocol import Algorithm, Slots, Variants, privacy_unit, slot_sum
from swarmjax.privacy.canaries import (
    CanaryAudit,
    CanaryHook,
    CanaryReport,
    accounted_curve,
    audit_scores,
    canary_capacity,
    canary_directions,
    canary_key,
    cosine_scores,
    dirac_directions,
    direction_rows,
    inclusion,
    participation_key,
)

__all__ = ["CanaryCall", "CanaryRound", "canary_hook"]

_RATE_DRAWS = 64  # public draws of the participation rule per run that size the slots
_RATE_DOMAIN = 0x52415445  # "RATE": those draws' keys, apart from every draw of the run


def canary_hook(alg: Algorithm) -> CanaryHook | None:
    """How ``alg`` takes client-level canaries (its accounting's ``canary_hook()``), or
    ``None``."""
    accounting = alg.accounting()
    return None if accounting is None else accounting.canary_hook()


@dataclass(frozen=True)
class CanaryRound:
    """An audit's canaries inside one traced round: the algorithm's hook, the audit, the
    canaries' directions (shared by every run) and the round's canary slots ``K``."""

    hook: CanaryHook
    audit: CanaryAudit
    directions: PyTree
    slots: int

    def join(
        self,
        run: tuple[PRNGKeyArray, PyTree],
        sent: tuple[PyTree, PyTree],
        when: tuple[Int[Array, ""], int],
        replies: PyTree,
        slots: Slots,
        summed: bool = False,
    ) -> tuple[PyTree, Slots, Int[Array, ""]]:
        """``replies`` (``(S, ...)``) and ``slots`` with ``K`` canary slots appended
        (``(S + K, ...)``; slot ids in ``N..N+M-1``, which no client update writes), and how
        many canaries taking part sat out.  ``run``: the run's key and hyper-parameters;
        ``sent``: the server state and the exchange's request; ``when``: the round and the
        exchange index.  Only the canaries taking part this round (in, and drawn by the
        hook's rule) get a slot and a reply, lowest index first: ``O(K d)`` per round, not
        ``O(M d)``.  Past ``K`` (chance at most :attr:`CanaryReport.overflow` over the run)
        the rest sit the round out, counted: that only weakens their signal.  ``summed``:
        ``replies`` is the real slots' reply sum and the canaries' replies are added to it
        after them, in slot order (what :func:`~swarmjax.fl.protocol.slot_sum` of the
        appended stack gives)."""
        hook, audit, k = self.hook, self.audit, self.slots
        run_key, hyper = run
        server, request = sent
        round_index, index = when
        m = audit.canaries
        key = canary_key(run_key)
        included = inclusion(key, m)
        taking_part = included & hook.participate(
            server, participation_key(key, round_index, index), round_index, included
        )
        idx = jnp.nonzero(taking_part, size=k, fill_value=m)[0].astype(jnp.int32)
        valid = idx < m
        safe = jnp.minimum(idx, m - 1)
        rows = direction_rows(self.directions, hook.params(server), safe)
        scaled = jax.tree.map(lambda d: d * audit.norm, rows)
        extra = jax.vmap(lambda d: hook.reply(request, d, hyper))(scaled)
        if summed:
            joined = slot_sum(extra, valid, start=replies)
        else:
            joined = jax.tree.map(
                lambda a, b: jnp.concatenate([a, b.astype(a.dtype)]), replies, extra
            )
        dropped = (jnp.sum(taking_part) - jnp.sum(valid)).astype(jnp.int32)
        return (
            joined,
            Slots(
                mask=jnp.concatenate([slots.mask, valid]),
                ids=jnp.concatenate([slots.ids.astype(jnp.int32), slots.num_clients + safe]),
                num_clients=slots.num_clients,
            ),
            dropped,
        )


@dataclass(frozen=True)
class CanaryCall:
    """One call's client-level audit: what :func:`~swarmjax.fl.runtime.simulate` keeps
    between its rounds (build it with :meth:`start`).

    Attributes:
        audit: the :class:`~swarmjax.privacy.canaries.CanaryAudit`.
        hook: the algorithm's :class:`~swarmjax.privacy.canaries.CanaryHook`.
        initial: the runs' server states at the start (leading run axis): the reference
            model the canaries are scored against.
        directions: the canaries' directions (shared by the runs).
        slots: ``K``, canary slots per round.
        overflow: the run's chance that a round's canaries overflow ``K``.
    """

    audit: CanaryAudit
    hook: CanaryHook
    initial: PyTree
    directions: PyTree
    slots: int
    overflow: float

    @staticmethod
    def check(alg: Algorithm, variants: Variants, audit: Any) -> CanaryHook:
        """The algorithm's canary hook once ``audit`` can run on this call, else one
        ``ValueError`` line naming the option (before any work: shapes only)."""
        if not isinstance(audit, CanaryAudit):
            raise ValueError(f"audit must be a CanaryAudit or None; got {type(audit).__name__}")
        name = type(alg).__name__
        if privacy_unit(alg.accounting()) is None:
            raise ValueError(
                f"audit needs a private run: {name} has no privacy unit (no epsilon to audit)"
            )
        noise = getattr(variants.hyper, "noise_multiplier", None)
        if noise is not None and np.any(np.asarray(noise) <= 0):
            raise ValueError(
                f"audit needs a private run: noise_multiplier is 0 in variant(s) "
                f"{np.flatnonzero(np.asarray(noise).reshape(-1) <= 0).tolist()} (epsilon inf)"
            )
        hook = canary_hook(alg)
        if hook is None:
            raise ValueError(
                f"audit needs client-level canaries, which {name} does not take (no "
                "canary_hook); audit record-level DP-SGD with "
                "swarmjax.privacy.canaries.GradientCanaries, or record-level clients by the "
                "algorithm's own audit= (e.g. FedDPPSO)"
            )
        row = jax.tree.map(lambda a: jnp.asarray(a)[0], variants.hyper)
        like = jax.eval_shape(lambda h: hook.params(alg.server_init(jax.random.key(0), h)), row)
        audit.check_for(hook.unit, sum(int(np.prod(a.shape)) for a in jax.tree.leaves(like)))
        return hook

    @classmethod
    def start(
        cls,
        hook: CanaryHook,
        audit: CanaryAudit,
        initial: PyTree,
        keys: PRNGKeyArray,
        rounds: int,
    ) -> CanaryCall:
        """The call's audit from its checked ``hook`` (:meth:`check`), the runs' initial
        server states and keys, for ``rounds`` rounds: the directions and the slots."""
        slots, overflow = _slots(hook, audit, initial, keys, rounds)
        return cls(audit, hook, initial, _directions(hook, audit, initial), slots, overflow)

    def reports(
        self, alg: Algorithm, keys: PRNGKeyArray, final: PyTree, record: Any, dropped: Any
    ) -> tuple[CanaryReport, ...]:
        """Each run's :class:`~swarmjax.privacy.canaries.CanaryReport` from its ``final``
        server state (leading run axis), against its largest accounted epsilon in the
        privacy ``record``; ``dropped``: each run's canary participations that sat out over
        the slots."""
        scores, included = _scores(alg, self.audit, keys, self.initial, final, self.directions)
        scores, included = np.asarray(scores), np.asarray(included)
        return tuple(
            audit_scores(
                scores[r],
                included[r],
                audit=self.audit,
                epsilon=float(np.max(record.final_epsilon[r])),
                delta=record.delta,
                unit=self.hook.unit,
                dropped=int(dropped[r]),
                overflow=self.overflow,
                accounted=accounted_curve(record, r),
            )
            for r in range(scores.shape[0])
        )


def _directions(hook: CanaryHook, audit: CanaryAudit, servers: PyTree) -> PyTree:
    """The call's canary directions (shared by its runs) for a model like the released
    model of the first run's server state (``servers``: leading run axis): a
    :class:`~swarmjax.privacy.canaries.DiracDirections` (``audit.directions == "dirac"``)
    or a Haar frame (``"haar"``)."""
    like = hook.params(jax.tree.map(lambda a: a[0], servers))
    key = jax.random.key(audit.seed)
    if audit.directions == "dirac":
        d = sum(int(np.size(a)) for a in jax.tree.leaves(like))
        make = jax.jit(dirac_directions, static_argnums=(1, 2))
        return make(key, d, audit.canaries)
    make = jax.jit(canary_directions, static_argnums=2)
    return make(key, like, audit.canaries)


def _slots(
    hook: CanaryHook, audit: CanaryAudit, servers: PyTree, keys: PRNGKeyArray, rounds: int
) -> tuple[int, float]:
    """``(K, overflow chance)``: the canary slots per round and the run's chance that a
    round has more canaries taking part (:func:`~swarmjax.privacy.canaries.canary_capacity`).

    ``audit.slots`` set: ``K`` is it, and the chance is ``0`` at ``K = M`` (else that of
    the rule's rate).  The rate is the hook's own rule applied with every canary in, on
    each run's initial server state, at 64 public keys (a domain apart from the run's
    draws): its largest per-run mean count over ``M``, plus 6 standard errors of that
    mean, as each canary's chance of taking part in a round.  Exact for a fixed Poisson
    rate (DP-FedAvg) up to those 6 errors; for DP-FTRL's schedule the first round's
    cohort is its largest, so the figure bounds every round's.  Host side, once per call."""
    m = audit.canaries
    if audit.slots == m:
        return m, 0.0
    every = jnp.ones((m,), bool)

    def counts(server, key):
        ks = jax.random.split(jax.random.fold_in(canary_key(key), _RATE_DOMAIN), _RATE_DRAWS)
        one = jnp.ones((), jnp.int32)
        return jax.vmap(lambda k: jnp.sum(hook.participate(server, k, one, every)))(ks)

    drawn = np.asarray(jax.jit(jax.vmap(counts))(servers, keys), np.float64)
    n = _RATE_DRAWS * m
    rate = float(np.max(drawn.mean(axis=1))) / m
    rate = min(1.0, rate + 6.0 * math.sqrt(rate * (1.0 - rate) / n) + 1.0 / n)
    return canary_capacity(rate, m, rounds, slots=audit.slots)


@partial(jax.jit, static_argnames=("alg", "audit"))
def _scores(
    alg: Algorithm,
    audit: CanaryAudit,
    keys: PRNGKeyArray,
    initial: PyTree,
    final: PyTree,
    directions: PyTree,
) -> tuple[Array, Array]:
    """Jitted: ``(runs, M)`` canary scores (``cos(w_T - w_0, u_i)``) and ``(runs, M)`` coins
    of every run from its initial and final server states (leading run axis)."""
    hook = canary_hook(alg)

    def one(key, s0, s1):
        change = jax.tree.map(
            lambda a, b: jnp.asarray(b, jnp.float32) - a, hook.params(s0), hook.params(s1)
        )
        return cosine_scores(directions, change), inclusion(canary_key(key), audit.canaries)

    return jax.vmap(one)(keys, initial, final)
