"""Empirical privacy audits inside the run: canaries beside the accounted epsilon.

An accountant proves what the code was meant to do; an audit measures what it does.  This
module inserts *canaries* into one private run and turns how visible they are in its
released outputs into a **lower bound** on the run's epsilon, with a confidence level
(docs/audits.md):

* **client level** (DP-FedAvg; DP-FTRL by its cohort schedule): ``M`` canary clients whose
  update is a fixed random direction ``u_i`` (unit L2 norm over the whole model) times
  ``norm * C_t`` (``norm >= 1``: at least the clip, so the clip leaves a canary of norm
  exactly ``C_t``).  Each canary is *in* with probability 1/2 (a secret coin); an in canary
  takes part in each round by the run's own participation rule (the algorithm's
  :class:`CanaryHook`: Poisson rate ``q`` for DP-FedAvg), an out canary never does.  Score:
  ``cos(w_T - w_0, u_i)``, the cosine of the final model's change with the canary's
  direction (Andrew et al. 2024, arXiv 2302.03098).  ``simulate(..., audit=CanaryAudit(N))``.
  The directions are Dirac by default (:class:`DiracDirections`: a signed unit vector on
  each canary's own coordinate; the score is one gather) or a Haar frame
  (:func:`canary_directions`, ``directions="haar"``); each round only the canaries taking
  part get a reply, in :attr:`CanaryAudit.slots` slots (:func:`canary_capacity`).
* **record level** (DP-SGD / DP-Adam): ``M`` gradient canaries, records whose clipped
  gradient is ``C u_i`` whatever the model (Steinke, Nasr & Jagielski 2023's "Dirac"
  canaries), each in with probability 1/2 and, when in, drawn into each step's Poisson batch
  at rate ``q`` like any record.  Score ``"gradient"``: ``sum_t <g~_t, u_i>`` over the
  released noised gradients (white box: every noised gradient is released), or
  ``"cosine"``: ``cos(theta_0 - theta_T, u_i)`` (black box, the final model only).
  :class:`GradientCanaries`, with :func:`swarmjax.privacy.dpsgd.dp_grad`'s ``canary_sum``.
* **record level inside federated clients** (record-level DP FedAvg's and Fed-DP-PSO's
  DP-SGD / DP-Adam clients): every client holds ``M`` Dirac gradient canaries of its own
  (:class:`ClientCanaries`: clipped gradient ``C e_j`` at ``M`` distinct coordinates ``j``
  of the model, drawn from the client's key), each in with probability 1/2 and drawn into
  the client's own Poisson batches at its rate ``q_i = B / |D_i|``.  Score ``"gradient"``:
  ``sum_t g~_t[j]`` over the client's released noised gradients, divided by its public
  noise scale ``sigma_i sqrt(T_i)``; every client's canaries are pooled into one audit
  against the run's largest record-level epsilon (:func:`pooled_record_report`).

The scores of in against out canaries go to jax-privacy's
``jax_privacy.auditing.CanaryScoreAuditor``: ``epsilon_one_run`` (Steinke, Nasr & Jagielski
2023: the one-run bound, valid because the canaries' coins are independent fair coins and
the mechanism is (epsilon, delta)-DP with respect to each canary), with the true positive
rate at a false positive rate and the attack's AUROC.  :func:`audit_scores` returns a
:class:`CanaryReport`; a bound above the accounted epsilon means the mechanism is broken,
with the stated confidence.

Canaries are never counted in released metrics (selected counts, bytes) nor in the real
clients' or records' accounting; they do move the model (that is how they are seen).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import flax.struct
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
from jax_privacy.auditing import CanaryScoreAuditor
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray, PyTree

from swarmjax._validation import check_choice, check_int, check_range

__all__ = [
    "AUDIT_DELTAS",
    "CLIENT_RECORD_SCORES",
    "CLIENT_SCORES",
    "DEFAULT_AUDIT_DELTA",
    "DEFAULT_CANARIES",
    "DETECT_FACTOR",
    "DIRECTIONS",
    "GDP_METHOD",
    "MAX_NOISE_FACTOR",
    "METHOD",
    "RECORD_SCORES",
    "SCORES",
    "VERDICTS",
    "CanaryAudit",
    "CanaryHook",
    "CanaryReport",
    "ClientCanaries",
    "DiracDirections",
    "GradientCanaries",
    "accounted_curve",
    "audit_scores",
    "canary_capacity",
    "canary_directions",
    "canary_dots",
    "canary_key",
    "choose_audit_delta",
    "cosine_scores",
    "detectable_noise_factor",
    "dirac_directions",
    "direction_rows",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "inclusion",
    "participation_key",
    "pooled_record_report",
    "power_epsilon",
    "power_gdp_mu",
]

SCORES: tuple[str, ...] = ("cosine", "gradient")
"""Canary scores: ``"cosine"`` (the final model's change against each canary direction;
client and record level) and ``"gradient"`` (record level only: the sum over steps of each
released noised gradient's component along the canary direction)."""
CLIENT_SCORES: tuple[str, ...] = ("cosine",)
"""Scores a client-level audit (``simulate(..., audit=...)``) can compute."""
RECORD_SCORES: tuple[str, ...] = ("cosine", "gradient")
"""Scores a record-level audit (:class:`GradientCanaries`) can compute."""
CLIENT_RECORD_SCORES: tuple[str, ...] = ("gradient",)
"""Scores a record-level audit inside federated clients (:class:`ClientCanaries`) can
compute: a client's released noised gradients only (its final model is not released)."""
_UNIT_SCORES = {
    "client": CLIENT_SCORES,
    "record": RECORD_SCORES,
    "in-client record": CLIENT_RECORD_SCORES,
}
METHOD = (
    "one-run audit (Steinke, Nasr & Jagielski 2023) of canary scores by jax-privacy's "
    "CanaryScoreAuditor.epsilon_one_run (Bonferroni over thresholds)"
)
"""How every :class:`CanaryReport`'s bound is computed."""

DIRECTIONS: tuple[str, ...] = ("dirac", "haar")
"""Client-level canary frames: ``"dirac"`` (each canary a signed unit vector on its own
coordinate of the flattened model: ``2 M`` numbers, no QR; the default) and ``"haar"`` (a
uniformly random orthonormal frame: a QR of a Gaussian ``(d, M)`` matrix, ``M d`` floats)."""
OVERFLOW_BUDGET = 1e-12
"""Largest chance, over a whole run, that more canaries take part in a round than the
round's canary slots hold (:func:`canary_capacity`); it is added to the audit's delta."""

_CANARY_DOMAIN = 0x43414E59  # "CANY": canary keys never coincide with the protocol's domains
_INCLUSION, _PARTICIPATION, _DIRECTION = 0, 1, 2
_STEP = 0x53544550  # "STEP": a client step's canary draw, apart from its noise key
_TAIL = 6.0  # a block holds the mean drawn count + 6 standard deviations (then loops)


# ------------------------------------------------------------------------------ settings


@dataclass(frozen=True)
class CanaryAudit:
    """What to audit a private run with (immutable; hashable: a static jit argument).

    Attributes:
        canaries: ``M >= 2`` canaries (clients at client level, gradient records at record
            level); each is in with probability 1/2.  At most the model's parameter count
            (that many directions can be linearly independent): checked by the run.
        score: ``"cosine"`` or ``"gradient"`` (:data:`SCORES`; record level only).
        confidence: the bound holds with at least this probability, in ``(0.5, 1)``.
        norm: a canary's update (client level) as a multiple of the clip, ``>= 1``: the
            clip then leaves every canary at exactly the clip norm (record-level gradient
            canaries are always exactly ``C``).
        fpr: false positive rate at which :attr:`CanaryReport.tpr_at_fpr` is read, in
            ``(0, 1)``.
        seed: seed of the client-level canary directions, shared by every run of a call
            (public: the bound needs only the in/out coins secret, and those come from each
            run's own key).
        directions: client-level frame (:data:`DIRECTIONS`): ``"dirac"`` (default: signed
            unit vectors on ``M`` distinct coordinates, no stored frame, score one gather)
            or ``"haar"`` (a Haar-random orthonormal frame by QR: ``O(d M^2)`` once per
            call and ``M d`` floats).  Both are exactly orthonormal.  Record-level
            :class:`GradientCanaries` always use the Haar frame, :class:`ClientCanaries`
            always Dirac canaries.
        slots: client level: canary slots per round, ``K``, the most canaries one round's
            aggregate takes (each a dense reply).  ``None`` (default): sized by
            :func:`canary_capacity` from the participation rule, so that more than ``K``
            take part in some round with chance at most :data:`OVERFLOW_BUDGET` over the
            run; ``M``: every canary's slot every round (never overflows; ``M`` dense
            replies per round).  Canaries past ``K`` in a round sit it out (counted:
            :attr:`CanaryReport.dropped`).
        delta: the audit's OWN delta, at which the one-run bound is computed and compared
            with the accounted epsilon at that same delta (never the run's delta by
            default: the bound collapses when ``delta * canaries`` is large).  ``None``
            (default, :data:`DEFAULT_AUDIT_DELTA`): chosen per run by
            :func:`choose_audit_delta`, the candidate of :data:`AUDIT_DELTAS` (at most the
            run's delta) where the most the canaries could certify exceeds the accounted
            epsilon there by the most.  Needs the run's accounted epsilon as a function of
            delta (``accounted=`` of :func:`audit_scores`); without it the run's delta is
            used and the report says so (:attr:`CanaryReport.accounted_curve`).
    """

    canaries: int
    score: str = "cosine"
    confidence: float = 0.95
    norm: float = 1.0
    fpr: float = 0.05
    seed: int = 0
    directions: str = "dirac"
    slots: int | None = None
    delta: float | None = None

    def __post_init__(self) -> None:
        check_int("audit canaries", self.canaries, 2)
        check_choice("audit score", self.score, SCORES)
        check_range("audit confidence", self.confidence, 0.5, 1.0, low_open=True, high_open=True)
        check_range("audit norm", self.norm, 1.0, math.inf, high_open=True)
        check_range("audit fpr", self.fpr, 0.0, 1.0, low_open=True, high_open=True)
        check_int("audit seed", self.seed, 0)
        check_choice("audit directions", self.directions, DIRECTIONS)
        if self.slots is not None:
            check_int("audit slots", self.slots, 1)
            if self.slots > self.canaries:
                raise ValueError(
                    f"audit slots must be <= canaries={self.canaries} (one slot per canary "
                    f"at most); got {self.slots}"
                )
        if self.delta is not None:
            check_range("audit delta", self.delta, 0.0, 1.0, low_open=True, high_open=True)
            object.__setattr__(self, "delta", float(self.delta))
        object.__setattr__(self, "confidence", float(self.confidence))
        object.__setattr__(self, "norm", float(self.norm))
        object.__setattr__(self, "fpr", float(self.fpr))

    def check_for(self, unit: str, parameters: int) -> None:
        """One-line ``ValueError`` naming the option when this audit cannot run on a
        ``unit``-level run of a model of ``parameters``: ``"client"``, ``"record"``
        (centralised DP-SGD) or ``"in-client record"`` (:class:`ClientCanaries`)."""
        scores = _UNIT_SCORES[unit]
        if self.score not in scores:
            raise ValueError(
                f"audit score {self.score!r} is not available for {unit}-level canaries; "
                f"choose one of {', '.join(map(repr, scores))}"
            )
        if self.canaries > parameters:
            raise ValueError(
                f"audit canaries must be <= {parameters} (the model's parameters: no more "
                f"canary directions can be independent); got {self.canaries}"
            )


@dataclass(frozen=True)
class CanaryHook:
    """How an algorithm takes client-level canaries (its ``canary_hook()`` returns one).

    Attributes:
        exchange: index (in ``alg.exchanges``) of the exchange that carries canaries.
        participate: ``(server, key, round_index, included (M,) bool) -> (M,) bool``: which
            canaries take part in this round, by the run's participation rule (DP-FedAvg:
            Poisson at the accounted rate; DP-FTRL: its cohort schedule); only ``included``
            ones may.
        reply: ``(request, direction, hyper) -> reply``: one canary's reply to the
            exchange's request, as a real client would send it, for a canary whose raw
            update is ``direction`` times the request's clip (``direction``: a pytree like
            the model, L2 norm ``audit.norm``).
        params: ``server -> params``: the released model the canaries are scored on.
        unit: the privacy unit canaries stand for (``"client"``).
    """

    exchange: int
    participate: Callable[[Any, PRNGKeyArray, Int[Array, ""], Bool[Array, " M"]], Array]
    reply: Callable[[Any, PyTree, Any], PyTree]
    params: Callable[[Any], PyTree]
    unit: str = "client"


# ------------------------------------------------------------------------------ keys, directions


def canary_key(run_key: PRNGKeyArray) -> PRNGKeyArray:
    """The canaries' own key of a run (a domain no protocol key shares)."""
    return jax.random.fold_in(run_key, _CANARY_DOMAIN)


def inclusion(key: PRNGKeyArray, canaries: int) -> Bool[Array, " M"]:
    """``(M,)`` secret fair coins: which canaries are in (``key``: :func:`canary_key`)."""
    return jax.random.bernoulli(jax.random.fold_in(key, _INCLUSION), 0.5, (canaries,))


def participation_key(
    key: PRNGKeyArray, round_index: Int[Array, ""] | int, exchange: int
) -> PRNGKeyArray:
    """Key of the canaries' participation draw in that exchange of that round."""
    k = jax.random.fold_in(jax.random.fold_in(key, _PARTICIPATION), round_index)
    return jax.random.fold_in(k, exchange)


def canary_directions(key: PRNGKeyArray, like: PyTree, canaries: int) -> PyTree:
    """``M`` orthonormal canary directions: a pytree like ``like`` (float32) with a leading
    ``M`` axis; each canary's whole-pytree L2 norm is 1 and any two are orthogonal, so no
    canary's score carries another's signal (random directions would: with the same in
    canaries in every step, ``<sum_j u_j, u_i>`` adds up coherently, ``~ sqrt(M / d)`` of the
    signal).  A uniformly random orthonormal frame (QR of a Gaussian ``(d, M)`` matrix),
    so ``M <= d`` (the model's parameter count ``d``: :meth:`CanaryAudit.check_for`).
    Cost: ``O(d M^2)`` once per run, memory ``M d`` floats."""
    leaves, tree = jax.tree.flatten(like)
    shapes = [tuple(np.shape(leaf)) for leaf in leaves]
    sizes = [math.prod(shape) for shape in shapes]
    gauss = jax.random.normal(
        jax.random.fold_in(key, _DIRECTION), (sum(sizes), canaries), jnp.float32
    )
    q, r = jnp.linalg.qr(gauss)
    rows = (q * jnp.where(jnp.diagonal(r) < 0, -1.0, 1.0)).T  # (M, d); signs: Haar frame
    parts = jnp.split(rows, np.cumsum(sizes)[:-1].tolist(), axis=1)
    return jax.tree.unflatten(
        tree, [p.reshape((canaries, *shape)) for p, shape in zip(parts, shapes, strict=True)]
    )


@flax.struct.dataclass
class DiracDirections:
    """``M`` client-level Dirac canary directions (a pytree: jit, vmap): canary ``i`` is
    ``signs[i] e_{coordinates[i]}``, a signed unit vector on one coordinate of the
    flattened model (``ravel_pytree`` order).  The coordinates are distinct, so the frame
    is exactly orthonormal, like :func:`canary_directions`' Haar frame, at ``2 M`` numbers
    instead of ``M d`` floats and no QR.  Public (drawn from :attr:`CanaryAudit.seed`).

    Attributes:
        coordinates: ``(M,)`` int32 distinct coordinates in ``[0, d)``.
        signs: ``(M,)`` float32, each ``+1`` or ``-1``.
    """

    coordinates: Int[Array, " M"]
    signs: Float[Array, " M"]

    @property
    def canaries(self) -> int:
        """``M``."""
        return int(self.coordinates.shape[-1])


def dirac_directions(key: PRNGKeyArray, parameters: int, canaries: int) -> DiracDirections:
    """``M = canaries`` Dirac directions on a model of ``parameters`` coordinates (``M <=
    d``: :meth:`CanaryAudit.check_for`): ``M`` distinct coordinates drawn uniformly without
    replacement and ``M`` fair signs, both from ``key``.  Cost ``O(d)`` once (the draw
    without replacement); jit with ``parameters`` and ``canaries`` static."""
    k_coord, k_sign = jax.random.split(jax.random.fold_in(key, _DIRECTION))
    coords = jax.random.choice(k_coord, parameters, (canaries,), replace=False)
    signs = jnp.where(jax.random.bernoulli(k_sign, 0.5, (canaries,)), 1.0, -1.0)
    return DiracDirections(coordinates=coords.astype(jnp.int32), signs=signs.astype(jnp.float32))


def direction_rows(
    directions: PyTree | DiracDirections, like: PyTree, index: Int[Array, " K"]
) -> PyTree:
    """The unit directions of canaries ``index`` (``(K,)`` in ``[0, M)``): a pytree like
    ``like`` (float32) with a leading ``K`` axis (``directions``: a :class:`DiracDirections`
    or a Haar frame of :func:`canary_directions`).  Cost ``O(K d)``: only those ``K``
    rows are built (Dirac: a scatter of ``K`` signs into ``K`` zero rows)."""
    if isinstance(directions, DiracDirections):
        flat, unravel = jax.flatten_util.ravel_pytree(
            jax.tree.map(lambda p: jnp.zeros(np.shape(p), jnp.float32), like)
        )
        k = index.shape[0]
        rows = jnp.zeros((k, flat.shape[0]), jnp.float32)
        rows = rows.at[jnp.arange(k), directions.coordinates[index]].set(directions.signs[index])
        return jax.vmap(unravel)(rows)
    return jax.tree.map(lambda d: d[index], directions)


def canary_capacity(
    rate: float,
    canaries: int,
    rounds: int,
    budget: float = OVERFLOW_BUDGET,
    slots: int | None = None,
) -> tuple[int, float]:
    """Canary slots per round ``K`` and the run's overflow chance (host side, scipy).

    Each of ``M = canaries`` canaries takes part in a round with chance at most ``rate``
    (in canaries by the run's rule, out canaries never), independently, so a round's count
    is at most ``Binomial(M, rate)`` in distribution.  ``K`` is ``slots`` when given, else
    the least count with ``rounds * P[Binomial(M, rate) > K] <= budget`` (``M`` at most);
    the returned chance, ``min(1, rounds * P[Binomial(M, rate) > K])`` (a union bound over
    rounds; ``0`` at ``K = M``), bounds the chance that any round has more than ``K``
    taking part."""
    from scipy.stats import binom

    check_int("canaries", canaries, 1)
    check_int("rounds", rounds, 1)
    p = check_range("rate", rate, 0.0, 1.0)
    tail = rounds * binom.sf(np.arange(canaries + 1), canaries, p)  # tail[k] = P[count > k]
    tail[canaries] = 0.0
    if slots is None:
        k = int(np.argmax(tail <= budget))  # tail is non-increasing and tail[M] = 0
    else:
        k = min(check_int("audit slots", slots, 1), canaries)
    return k, float(min(1.0, tail[k]))


def canary_dots(directions: PyTree, vector: PyTree) -> Float[Array, " M"]:
    """``(M,)``: ``<vector, u_i>`` for every canary (``directions``: leading ``M`` axis, or
    a :class:`DiracDirections`: then one gather, ``O(d + M)``)."""
    if isinstance(directions, DiracDirections):
        flat, _ = jax.flatten_util.ravel_pytree(
            jax.tree.map(lambda v: jnp.asarray(v, jnp.float32), vector)
        )
        return directions.signs * flat[directions.coordinates]
    pairs = zip(jax.tree.leaves(directions), jax.tree.leaves(vector), strict=True)
    return sum(jnp.tensordot(d, jnp.asarray(v, jnp.float32), axes=jnp.ndim(v)) for d, v in pairs)


def cosine_scores(directions: PyTree, change: PyTree) -> Float[Array, " M"]:
    """``(M,)``: ``cos(change, u_i)`` for every canary (``change``: the final model minus the
    initial one at client level, initial minus final at record level; a zero change scores
    0)."""
    leaves = jax.tree.leaves(change)
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(jnp.asarray(v, jnp.float32))) for v in leaves))
    return canary_dots(directions, change) / jnp.maximum(norm, jnp.finfo(jnp.float32).tiny)


# ------------------------------------------------------------------------------ record level


@flax.struct.dataclass
class GradientCanaries:
    """Record-level gradient canaries of one DP-SGD / DP-Adam run (a pytree: jit, vmap).

    Attributes:
        directions: ``M`` orthonormal directions ``u_i`` (a pytree like the model with a
            leading ``M`` axis: :func:`canary_directions`).
        included: ``(M,)`` the secret fair coins (in canaries may be drawn).
        released: ``sum_t g~_t``, the sum of the noised gradients observed so far (a pytree
            like the model, float32; units of the gradient).  The ``"gradient"`` score is
            ``<released, u_i>`` (:attr:`scores`): one ``O(M d)`` product after the run
            instead of one per step.
        clip_norm: ``C``: every canary's clipped gradient is ``C u_i``.
        block: static; how many drawn canaries one pass of :meth:`gradient_sum` gathers
            (``M``: the dense sum over every canary).  Any value gives the same sum: more
            drawn canaries than ``block`` take more passes.
    """

    directions: PyTree
    included: Bool[Array, " M"]
    released: PyTree
    clip_norm: Float[Array, ""]
    block: int = flax.struct.field(pytree_node=False, default=0)

    @classmethod
    def create(
        cls,
        key: PRNGKeyArray,
        audit: CanaryAudit,
        params: PyTree,
        clip_norm: ArrayLike,
        sample_rate: float | None = None,
    ) -> GradientCanaries:
        """Canaries of ``audit`` for a model like ``params`` (checked: one line naming the
        option when the audit cannot run on it), clipped at ``clip_norm``.  ``sample_rate``:
        the run's Poisson rate ``q`` when known on the host; it sizes :attr:`block` to the
        drawn count's mean ``q M`` plus six standard deviations (``None``: ``M``)."""
        audit.check_for("record", sum(int(np.size(p)) for p in jax.tree.leaves(params)))
        check_range("clip_norm", clip_norm, 0.0, math.inf, low_open=True, high_open=True)
        m = audit.canaries
        block = m
        if sample_rate is not None:
            q = check_range("sample_rate", sample_rate, 0.0, 1.0, low_open=True)
            block = min(m, max(1, math.ceil(q * m + _TAIL * math.sqrt(q * (1 - q) * m) + 1)))
        key = canary_key(key)
        return cls(
            directions=canary_directions(key, params, m),
            included=inclusion(key, m),
            released=jax.tree.map(lambda p: jnp.zeros(np.shape(p), jnp.float32), params),
            clip_norm=jnp.asarray(clip_norm, jnp.float32),
            block=block,
        )

    @property
    def canaries(self) -> int:
        """``M``."""
        return int(self.included.shape[-1])

    @property
    def scores(self) -> Float[Array, " M"]:
        """``(M,)`` ``sum_t <g~_t, u_i>`` over the noised gradients observed so far (score
        ``"gradient"``; units of the gradient)."""
        return canary_dots(self.directions, self.released)

    def gradient_sum(
        self, key: PRNGKeyArray, sample_rate: ArrayLike
    ) -> tuple[PyTree, Bool[Array, " M"]]:
        """This step's canary contribution to the clipped sum: ``C sum_i drawn_i u_i`` (a
        pytree like the model, float32), each in canary drawn at Poisson rate
        ``sample_rate`` (``key``: the step's own, e.g. ``dpsgd.noise_key(k, t)``), and the
        ``(M,)`` draw.  Pass it as ``dp_grad(..., canary_sum=...)``.

        Cost ``O(block d)`` per pass, one pass while at most :attr:`block` canaries are
        drawn (``q M`` on average): the drawn directions are gathered, never all ``M``."""
        m = self.canaries
        coins = jax.random.bernoulli(key, sample_rate, self.included.shape)
        drawn = coins & self.included
        if self.block <= 0 or self.block >= m:
            weights = jnp.where(drawn, self.clip_norm, 0.0)
            total = jax.tree.map(lambda d: jnp.tensordot(weights, d, axes=1), self.directions)
            return total, drawn

        def one_pass(carry: tuple[PyTree, Array]) -> tuple[PyTree, Array]:
            total, left = carry
            idx = jnp.nonzero(left, size=self.block, fill_value=m)[0]
            weights = jnp.where(idx < m, self.clip_norm, 0.0)
            safe = jnp.minimum(idx, m - 1)
            total = jax.tree.map(
                lambda t, d: t + jnp.tensordot(weights, d[safe], axes=1), total, self.directions
            )
            return total, left.at[idx].set(False, mode="drop")

        zero = jax.tree.map(lambda d: jnp.zeros(d.shape[1:], jnp.float32), self.directions)
        total, _ = jax.lax.while_loop(lambda c: jnp.any(c[1]), one_pass, (zero, drawn))
        return total, drawn

    def observe(self, noisy_grad: PyTree) -> GradientCanaries:
        """Add a released noised gradient to :attr:`released` (``O(d)``)."""
        released = jax.tree.map(
            lambda s, g: s + jnp.asarray(g, jnp.float32), self.released, noisy_grad
        )
        return self.replace(released=released)

    def final_scores(self, score: str, initial: PyTree, final: PyTree) -> Float[Array, " M"]:
        """``(M,)`` scores of ``score``: ``"gradient"`` (the observed sum) or ``"cosine"``
        (``cos(initial - final, u_i)``: descent moves against a canary's gradient)."""
        check_choice("audit score", score, RECORD_SCORES)
        if score == "gradient":
            return self.scores
        change = jax.tree.map(lambda a, b: jnp.asarray(a, jnp.float32) - b, initial, final)
        return cosine_scores(self.directions, change)

    def report(
        self,
        audit: CanaryAudit,
        *,
        epsilon: float,
        delta: float,
        initial: PyTree | None = None,
        final: PyTree | None = None,
        accounted: Callable[[float], float] | None = None,
    ) -> CanaryReport:
        """The :class:`CanaryReport` of the run against its accounted ``(epsilon, delta)``
        (``initial`` and ``final`` params: needed by score ``"cosine"`` only;
        ``accounted``: the run's epsilon at any delta, as :func:`audit_scores` takes it)."""
        if audit.score == "cosine" and (initial is None or final is None):
            raise ValueError("audit score 'cosine' needs initial= and final= params")
        scores = self.final_scores(audit.score, initial, final)
        return audit_scores(
            scores,
            self.included,
            audit=audit,
            epsilon=epsilon,
            delta=delta,
            unit="record",
            accounted=accounted,
        )


@flax.struct.dataclass
class ClientCanaries:
    """Record-level gradient canaries of ONE federated client (a pytree; the runtime vmaps
    it over clients and runs, inside the client's state).

    Dirac canaries (Steinke, Nasr & Jagielski 2023): canary ``i`` is a record whose clipped
    gradient is ``C e_{j_i}``, the clip times the unit vector of one coordinate ``j_i`` of
    the flattened model, whatever the model.  The ``M`` coordinates are distinct, so the
    canaries are orthonormal like :func:`canary_directions`' frame, but cost ``M`` integers
    instead of ``M d`` floats: every client of every run holds its own.  An in canary is
    drawn into each of the client's DP steps at the client's Poisson rate, its gradient
    joins the clipped sum before the noise (the zero-out relation: an out canary is a null
    record, its client's size and expected batch unchanged).

    Attributes:
        coordinates: ``(M,)`` distinct coordinates of the flattened model (``ravel_pytree``
            order), drawn with the coins from the client's key, independently of them.
        included: ``(M,)`` the secret fair coins.
        scores: ``(M,)`` ``sum_t g~_t[j_i]`` over the client's noised gradients so far
            (units of the gradient).
    """

    coordinates: Int[Array, " M"]
    included: Bool[Array, " M"]
    scores: Float[Array, " M"]

    @classmethod
    def create(cls, key: PRNGKeyArray, canaries: int, parameters: int) -> ClientCanaries:
        """``canaries`` canaries for a model of ``parameters`` coordinates (jit-able;
        ``canaries <= parameters``: :meth:`CanaryAudit.check_for` with unit
        ``"in-client record"``); ``key``: the client's own (secret) key."""
        key = canary_key(key)
        coords = jax.random.choice(
            jax.random.fold_in(key, _DIRECTION), parameters, (canaries,), replace=False
        )
        return cls(
            coordinates=coords.astype(jnp.int32),
            included=inclusion(key, canaries),
            scores=jnp.zeros((canaries,), jnp.float32),
        )

    def gradient_sum(
        self, key: PRNGKeyArray, sample_rate: ArrayLike, clip_norm: ArrayLike, like: PyTree
    ) -> tuple[PyTree, Bool[Array, " M"]]:
        """One step's canary gradients, ``C sum_i drawn_i e_{j_i}`` (a pytree like ``like``,
        float32; ``O(d)``), each in canary drawn at ``sample_rate`` (``key``: the step's key;
        its own stream is folded in), and the ``(M,)`` draw."""
        coins = jax.random.bernoulli(
            jax.random.fold_in(key, _STEP), sample_rate, self.included.shape
        )
        drawn = coins & self.included
        flat, unravel = jax.flatten_util.ravel_pytree(
            jax.tree.map(lambda p: jnp.zeros(np.shape(p), jnp.float32), like)
        )
        flat = flat.at[self.coordinates].add(jnp.where(drawn, clip_norm, 0.0).astype(flat.dtype))
        return unravel(flat), drawn

    def observe(self, noisy_grad: PyTree) -> ClientCanaries:
        """Add each canary's coordinate of a released noised gradient to its score."""
        flat, _ = jax.flatten_util.ravel_pytree(
            jax.tree.map(lambda g: jnp.asarray(g, jnp.float32), noisy_grad)
        )
        return self.replace(scores=self.scores + flat[self.coordinates])


def pooled_record_report(
    scores: Float[ArrayLike, "N M"],
    included: Bool[ArrayLike, "N M"],
    noise_scale: Float[ArrayLike, " N"],
    *,
    audit: CanaryAudit,
    epsilon: float,
    delta: float,
    accounted: Callable[[float], float] | None = None,
) -> CanaryReport:
    """One run's record-level audit inside its ``N`` clients: every client's ``M`` canary
    scores divided by its public noise scale ``noise_scale`` (e.g. ``sigma_i sqrt(T_i)``,
    so that clients of different noise and step counts score alike: post-processing of
    public values), pooled into one :func:`audit_scores` of ``N M`` canaries.

    Valid against ``epsilon``, the run's LARGEST record-level epsilon over clients: each
    canary is a record of one client, for which the whole run is ``(eps_i, delta)``-DP with
    ``eps_i <= epsilon``, and the coins are independent fair coins.  A client with
    ``noise_scale <= 0`` (no noise: no epsilon) is refused.  ``accounted``: the run's
    largest client epsilon at any delta (:func:`accounted_curve`), for the audit's own
    delta and the Gaussian comparisons (:func:`audit_scores`)."""
    s = np.asarray(scores, np.float64)
    scale = np.asarray(noise_scale, np.float64).reshape(-1, 1)
    if np.any(~(scale > 0)):
        raise ValueError(
            "audit needs a private run: a client's noise scale is not > 0 (no noise, no epsilon)"
        )
    return audit_scores(
        (s / scale).reshape(-1),
        np.asarray(included, bool).reshape(-1),
        audit=audit,
        epsilon=epsilon,
        delta=delta,
        unit="record",
        accounted=accounted,
    )


# ------------------------------------------------------------------------------ power


DEFAULT_CANARIES = 2000
"""Canaries an experiment's ``--audit`` should default to (docs/audits.md, "Power").  With
an ideal canary (:func:`detectable_noise_factor`) and the audit delta chosen per run, 2,000
canaries show the noise multiplier divided by about :data:`DETECT_FACTOR` (3.5 to 4.0x by
the one-run bound, 2.9 to 3.9x by the GDP estimate) at the shipped epsilon-2 and
epsilon-0.5 profiles.  At epsilon 4 and above no feasible count can: the one-run bound
grows like ``log M`` (7.1 at 10,000 canaries) while the accounted epsilon at a small delta
is 9.6 to 20 there, so those runs say "cannot tell"."""
DEFAULT_AUDIT_DELTA: float | None = None
"""The audit's own delta by default: ``None``, chosen per run by :func:`choose_audit_delta`
among :data:`AUDIT_DELTAS` (a float fixes it for every run)."""
AUDIT_DELTAS: tuple[float, ...] = (1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 1e-10, 1e-12)
"""Candidate audit deltas below the run's own (which is always a candidate)."""
ENVELOPE_DELTAS: tuple[float, ...] = (0.5, 0.3, 0.1, 0.03, 1e-2, 1e-3, *AUDIT_DELTAS)
"""Deltas at which the accounted privacy profile is read to find the Gaussian curve that
covers it (:attr:`CanaryReport.gdp_mu_accounted`): from the centre of the tradeoff curve
(large delta: what the AUROC sees) to its tails; deltas where the accounted epsilon is
infinite (an overflow charge eating the delta) are skipped."""
DETECT_FACTOR = 4.0
"""The noise error (noise multiplier divided by this) the default sizes are meant to see."""
MAX_NOISE_FACTOR = 1000.0
"""Largest noise factor :func:`detectable_noise_factor` searches; beyond it: ``inf``."""
VERDICTS: tuple[str, ...] = ("ok", "cannot tell", "suspect", "violation")
"""A report's verdicts, strongest first when several apply: ``"violation"`` (the certified
one-run bound exceeds the accounted epsilon at the audit delta); ``"suspect"`` (not
certified, but the scores reject the Gaussian curve covering the accounted guarantee: the
f-DP estimate, or the AUROC's lower confidence bound above the largest AUROC that curve
allows); ``"ok"`` (the audit could have certified a violation, :attr:`CanaryReport.sees`,
an ideal canary would show the noise divided by :data:`DETECT_FACTOR`, and nothing was
seen); ``"cannot tell"`` (otherwise: silence means nothing)."""
GDP_METHOD = (
    "one-run f-DP audit (Mahloujifar et al. 2024) of the same scores by jax-privacy's "
    "CanaryScoreAuditor.epsilon_one_run_fdp (Bonferroni over thresholds): the largest "
    "Gaussian tradeoff curve (mu-GDP) the scores reject; ASSUMES the mechanism's tradeoff "
    "curve is Gaussian, so it is compared with the Gaussian curve covering the accounted "
    "privacy profile"
)
"""How every :class:`CanaryReport`'s second estimate (``epsilon_gdp``) is computed."""


def gdp_delta(epsilon: float, mu: float) -> float:
    """The delta at which ``mu``-GDP is ``(epsilon, delta)``-DP (Dong, Roth & Su 2022,
    Corollary 2.13): ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``; both unitless."""
    from scipy.stats import norm

    if mu <= 0.0:
        return 0.0
    a = norm.logcdf(-epsilon / mu + mu / 2)
    b = epsilon + norm.logcdf(-epsilon / mu - mu / 2)
    return float(math.exp(a) * -math.expm1(b - a)) if b < a else 0.0


def gdp_mu(epsilon: float, delta: float) -> float:
    """The ``mu`` whose Gaussian-DP privacy profile passes through ``(epsilon, delta)``:
    the Gaussian tradeoff curve that makes exactly that claim (``inf`` for an infinite
    epsilon; ``0`` for a zero one).  Bisection on :func:`gdp_delta`, increasing in mu."""
    from scipy.optimize import brentq

    if not math.isfinite(epsilon):
        return math.inf
    if epsilon <= 0.0 and delta >= 1.0:
        return 0.0
    hi = 1.0
    while gdp_delta(epsilon, hi) < delta:
        hi *= 2.0
        if hi > 1e4:
            return math.inf
    return float(brentq(lambda m: gdp_delta(epsilon, m) - delta, 1e-9, hi, xtol=1e-10))


def gdp_epsilon(mu: float, delta: float) -> float:
    """Epsilon of ``mu``-GDP at ``delta`` (``0`` when ``mu``-GDP is already
    ``(0, delta)``-DP; ``inf`` for an infinite mu)."""
    from scipy.optimize import brentq

    if not math.isfinite(mu):
        return math.inf
    if gdp_delta(0.0, mu) <= delta:
        return 0.0
    hi = 1.0
    while gdp_delta(hi, mu) > delta:
        hi *= 2.0
    return float(brentq(lambda e: gdp_delta(e, mu) - delta, 0.0, hi, xtol=1e-10))


def _auditor_bound(ins: np.ndarray, outs: np.ndarray, significance: float, delta: float) -> float:
    """jax-privacy's one-run bound of these scores (``0`` when ``delta`` leaves nothing)."""
    if delta >= 1.0 or ins.size == 0 or outs.size == 0:
        return 0.0
    return float(CanaryScoreAuditor(ins, outs).epsilon_one_run(significance, delta))


def _gdp_mu_estimate(ins: np.ndarray, outs: np.ndarray, significance: float, delta: float) -> float:
    """The largest Gaussian ``mu`` these scores reject at ``1 - significance``: jax-privacy's
    ``epsilon_one_run_fdp`` at ``delta`` (the epsilon at ``delta`` of that Gaussian curve),
    mapped back to its mu (``0``: none rejected)."""
    if ins.size == 0 or outs.size == 0:
        return 0.0
    eps = float(CanaryScoreAuditor(ins, outs).epsilon_one_run_fdp(significance, delta))
    return 0.0 if eps <= 0.0 else gdp_mu(eps, delta)


def _separated(included: int, excluded: int) -> tuple[np.ndarray, np.ndarray]:
    """Perfectly separated distinct scores: every in canary above every out canary."""
    return np.arange(included, dtype=np.float64) + excluded, np.arange(excluded, dtype=np.float64)


def _ideal(mu: float, included: int, excluded: int) -> tuple[np.ndarray, np.ndarray]:
    """Typical scores of an ideal canary at Gaussian separation ``mu``: the mid-quantiles
    of ``N(mu, 1)`` (in) and ``N(0, 1)`` (out), deterministic."""
    from scipy.stats import norm

    ins = mu + norm.ppf((np.arange(included) + 0.5) / max(included, 1))
    outs = norm.ppf((np.arange(excluded) + 0.5) / max(excluded, 1))
    return ins, outs


@functools.lru_cache(maxsize=4096)
def power_epsilon(included: int, excluded: int, delta: float, confidence: float = 0.95) -> float:
    """The largest one-run bound ``included`` in and ``excluded`` out canaries can give at
    ``delta`` and ``confidence``: jax-privacy's bound of perfectly separated scores (every
    in canary scored above every out canary, all distinct, so the Bonferroni correction
    over thresholds is the one real scores get).  About ``log(M / 2) - log log(M / alpha)``
    once ``delta * M`` is small; it collapses towards 0 as ``delta * M`` grows."""
    ins, outs = _separated(included, excluded)
    return _auditor_bound(ins, outs, 1.0 - confidence, delta)


@functools.lru_cache(maxsize=4096)
def power_gdp_mu(included: int, excluded: int, delta: float, confidence: float = 0.95) -> float:
    """The largest Gaussian ``mu`` the GDP estimate can give with these canaries
    (perfectly separated scores; :data:`GDP_METHOD`)."""
    ins, outs = _separated(included, excluded)
    return _gdp_mu_estimate(ins, outs, 1.0 - confidence, delta)


@functools.lru_cache(maxsize=65536)
def _ideal_bound(mu: float, included: int, excluded: int, delta: float, confidence: float) -> float:
    return _auditor_bound(*_ideal(mu, included, excluded), 1.0 - confidence, delta)


@functools.lru_cache(maxsize=65536)
def _ideal_gdp(mu: float, included: int, excluded: int, delta: float, confidence: float) -> float:
    return _gdp_mu_estimate(*_ideal(mu, included, excluded), 1.0 - confidence, delta)


def _smallest_factor(seen: Callable[[float], bool]) -> float:
    """Smallest ``f`` in ``[1, MAX_NOISE_FACTOR]`` with ``seen(f)`` (assumed monotone), to 2 %
    (``inf`` when even the largest is not seen)."""
    if seen(1.0):
        return 1.0
    lo, hi = 1.0, MAX_NOISE_FACTOR
    if not seen(hi):
        return math.inf
    while hi / lo > 1.02:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if seen(mid) else (mid, hi)
    return float(hi)


def detectable_noise_factor(
    mu: float,
    target: float,
    *,
    canaries: int,
    delta: float,
    confidence: float = 0.95,
    estimate: str = "one-run",
) -> float:
    """The factor by which the noise would have to be too small for the audit to see it.

    Model (docs/audits.md, "Power"): the correct mechanism is ``mu``-GDP towards each
    canary (``mu``: :func:`gdp_mu` of its accounted ``(epsilon, delta)``).  Dividing the
    noise multiplier by ``f`` makes a Gaussian mechanism (and its compositions) ``f mu``-GDP,
    and a Poisson-subsampled one at least that (``mu = q sqrt(T (e^{1/sigma^2} - 1))`` grows
    faster than ``1 / sigma``), so ``f mu`` understates the broken mechanism.  An *ideal*
    canary's scores are then ``N(f mu, 1)`` in and ``N(0, 1)`` out; with half of
    ``canaries`` in, their typical (mid-quantile) scores give a typical estimate.  The
    result is the least ``f`` whose typical estimate exceeds ``target``:

    * ``estimate="one-run"``: the one-run bound at ``delta`` against ``target``, the
      accounted epsilon at that delta;
    * ``estimate="gdp"``: the GDP estimate's ``mu`` (at ``delta``) against ``target``, the
      accounted ``mu``.

    Real scores separate in from out canaries less than the ideal canary's (other clients'
    updates, a final-model score), so this is the best the audit could do; the drills
    measure what it does.  Returns ``1`` when even the correct noise would show, ``inf``
    when no factor up to :data:`MAX_NOISE_FACTOR` would (or ``mu`` is 0 or ``target`` inf).
    """
    check_choice("estimate", estimate, ("one-run", "gdp"))
    if not (mu > 0.0 and math.isfinite(mu) and math.isfinite(target)):
        return math.inf
    half = canaries // 2
    args = (half, canaries - half, float(delta), float(confidence))
    if estimate == "one-run":
        if power_epsilon(*args) <= target:
            return math.inf
        return _smallest_factor(lambda f: _ideal_bound(float(f * mu), *args) > target)
    if power_gdp_mu(*args) <= target:
        return math.inf
    return _smallest_factor(lambda f: _ideal_gdp(float(f * mu), *args) > target)


def _candidates(run_delta: float) -> list[float]:
    """The run's delta, then every :data:`AUDIT_DELTAS` below it."""
    return [float(run_delta)] + [d for d in AUDIT_DELTAS if d < run_delta]


def _shifted(delta: float, epsilon: float, overflow: float) -> float:
    """``delta + (1 + e^epsilon) overflow``: the delta of the mechanism with canary slots."""
    if overflow <= 0.0:
        return float(delta)
    return float(delta) + (1.0 + math.exp(min(float(epsilon), 700.0))) * float(overflow)


def choose_audit_delta(
    accounted: Callable[[float], float],
    run_delta: float,
    canaries: int,
    *,
    confidence: float = 0.95,
    overflow: float = 0.0,
) -> float:
    """The audit delta of a run, among the run's delta and :data:`AUDIT_DELTAS` below it.

    A smaller delta lifts the one-run bound's ceiling (its ``delta * M`` term) but also the
    accounted epsilon it must beat (``accounted(delta)``).  This picks the candidate with
    the smallest :func:`detectable_noise_factor` (half of ``canaries`` in, the correct
    mechanism's mu from the run's own ``(epsilon, delta)``); when no candidate can see any
    factor, the one where :func:`power_epsilon` exceeds the accounted epsilon by the most.
    Settings only, never the scores or the coins, so the bound at the chosen delta keeps
    its confidence."""
    half = canaries // 2
    mu = gdp_mu(float(accounted(run_delta)), run_delta)
    best, key = float(run_delta), (math.inf, math.inf)
    for d in _candidates(run_delta):
        eps = float(accounted(d))
        if not math.isfinite(eps):
            continue
        shifted = _shifted(d, eps, overflow)
        margin = power_epsilon(half, canaries - half, shifted, confidence) - eps
        factor = detectable_noise_factor(
            mu, eps, canaries=canaries, delta=shifted, confidence=confidence
        )
        if (factor, -margin) < key:
            best, key = d, (factor, -margin)
    return best


def accounted_curve(record: Any, run: int) -> Callable[[float], float]:
    """``delta -> epsilon``: run ``run``'s accounted epsilon at any delta, by the record's
    own accountant on its clients' whole-run events (the worst client, each group's
    sampler overflow charged as the record does).  ``record``: a
    :class:`~swarmjax.fl.runtime.PrivacyRecord` (``run_events``, ``accountant``).  Pass it
    as :func:`audit_scores`' ``accounted=``.  Cached per delta."""
    from swarmjax.privacy.accounting import event_epsilon

    groups = tuple(record.run_events(run))
    accountant = record.accountant

    @functools.lru_cache(maxsize=64)
    def at(delta: float) -> float:
        return max(
            (event_epsilon(ev, delta, accountant=accountant, overflow=p) for _, ev, p in groups),
            default=0.0,
        )

    return at


# ------------------------------------------------------------------------------ report


@dataclass(frozen=True)
class CanaryReport:
    """One run's audit: the empirical lower bound beside the accounted epsilon, with the
    audit's power and a verdict that says "cannot tell" when the audit could not see.

    Attributes:
        epsilon_lower: with probability ``>= confidence`` the run's true epsilon at
            ``audit_delta`` is at least this (``0``: nothing detected).  A lower bound, not
            an estimate: a correct mechanism usually shows far less than its epsilon.
        confidence: the bound's confidence level.
        epsilon: the accounted epsilon at ``delta`` (the run's largest over clients).
        delta: the run's delta, at which ``epsilon`` is stated.
        canaries: canaries inserted (in and out); included: how many were in.
        unit: ``"client"`` or ``"record"``; score: how canaries were scored.
        tpr_at_fpr: the best threshold attack's true positive rate at false positive rate
            ``fpr`` (in against out canaries); auroc: its area under the ROC curve.
        method: how the bound was computed (:data:`METHOD`).
        dropped: client level: canary participations that sat their round out because
            more canaries took part than the round's slots hold (:attr:`CanaryAudit.slots`;
            ``0`` expected: that chance is at most ``overflow``).  Sitting out only weakens
            a canary's signal.
        overflow: the chance, over the run, that any round had more canaries taking part
            than its slots (:func:`canary_capacity`); the mechanism with slots is then
            ``(eps, delta' + (1 + e^eps) overflow)``-DP per canary at every ``delta'``, so
            the bound is computed at that shifted delta.
        audit_delta: the audit's own delta (:attr:`CanaryAudit.delta`): ``epsilon_lower``
            and ``power_epsilon`` hold at it (shifted by the overflow as above).
        epsilon_audit_delta: the accounted epsilon at ``audit_delta``, what
            ``epsilon_lower`` is compared with (``epsilon`` when ``audit_delta == delta``).
        accounted_curve: whether the accountant was asked for the epsilon at
            ``audit_delta`` (``False``: no ``accounted=`` was given, so ``audit_delta`` is
            the run's delta).
        power_epsilon: the largest bound these canaries could certify at ``audit_delta``
            (perfectly separated scores: :func:`power_epsilon`).
        detectable_noise_factor: the least factor by which the noise multiplier would have
            to be too small for an ideal canary's typical bound to exceed
            ``epsilon_audit_delta`` (:func:`detectable_noise_factor`; ``inf``: none).
        verdict: :data:`VERDICTS`: ``"violation"`` when ``epsilon_lower >
            epsilon_audit_delta``; else ``"suspect"`` when ``gdp_verdict`` is a violation
            or ``auroc_lower > auroc_accounted``; else ``"ok"`` when ``power_epsilon >
            epsilon_audit_delta`` and ``detectable_noise_factor <= DETECT_FACTOR``; else
            ``"cannot tell"``.
        epsilon_gdp: the second estimate from the same scores (:data:`GDP_METHOD`):
            epsilon at ``delta`` of the Gaussian tradeoff curve the scores show, at
            ``confidence``.  An estimate under an assumption, not a bound.
        gdp_mu: that curve's ``mu`` (lower confidence); gdp_mu_accounted: the ``mu`` of the
            accounted guarantee (the largest :func:`gdp_mu` over the candidate deltas: the
            Gaussian curve that covers the accounted privacy profile there);
            gdp_power_mu: the largest ``mu`` these canaries can show;
            gdp_detectable_noise_factor: as above, for ``gdp_mu`` against
            ``gdp_mu_accounted``; gdp_verdict: :data:`VERDICTS` for ``gdp_mu`` against
            ``gdp_mu_accounted`` and ``gdp_power_mu``; gdp_method: :data:`GDP_METHOD`.
        auroc_lower: the AUROC's lower confidence bound at ``confidence`` (Hoeffding's for
            a two-sample U-statistic: ``auroc - sqrt(ln(1 / (1 - confidence)) / (2 min(in,
            out)))``; assumes independent scores); auroc_accounted: the largest AUROC a
            mechanism with the accounted Gaussian curve allows, ``Phi(gdp_mu_accounted /
            sqrt 2)`` (any test of a ``mu``-GDP mechanism has AUROC at most that).
        Reports written before these fields load with them ``None``.
    """

    epsilon_lower: float
    confidence: float
    epsilon: float
    delta: float
    canaries: int
    included: int
    unit: str
    score: str
    tpr_at_fpr: float
    fpr: float
    auroc: float
    method: str = METHOD
    dropped: int = 0
    overflow: float = 0.0
    audit_delta: float | None = None
    epsilon_audit_delta: float | None = None
    accounted_curve: bool | None = None
    power_epsilon: float | None = None
    detectable_noise_factor: float | None = None
    verdict: str | None = None
    epsilon_gdp: float | None = None
    gdp_mu: float | None = None
    gdp_mu_accounted: float | None = None
    gdp_power_mu: float | None = None
    gdp_detectable_noise_factor: float | None = None
    gdp_verdict: str | None = None
    gdp_method: str | None = None
    auroc_lower: float | None = None
    auroc_accounted: float | None = None

    @property
    def exceeds(self) -> bool:
        """True when the lower bound is above the accounted epsilon at the audit's delta:
        the mechanism is broken (with probability ``>= confidence``)."""
        against = self.epsilon if self.epsilon_audit_delta is None else self.epsilon_audit_delta
        return self.epsilon_lower > against

    @property
    def sees(self) -> bool:
        """True when the audit could have certified a violation (``power_epsilon`` above
        the accounted epsilon at the audit's delta): only then does silence mean "ok"."""
        if self.power_epsilon is None:
            return False
        against = self.epsilon if self.epsilon_audit_delta is None else self.epsilon_audit_delta
        return self.power_epsilon > against

    def line(self) -> str:
        """One line to print beside the accounted epsilon: the bound, the power, the
        verdict, and the GDP estimate."""
        verdict = self.verdict or ("violation" if self.exceeds else "cannot tell")
        word = {
            "violation": "VIOLATION: EXCEEDS the accounted epsilon: broken mechanism",
            "cannot tell": "cannot tell (the audit is too weak to see a violation here)",
            "suspect": "SUSPECT: the scores reject the accounted Gaussian curve (not certified)",
            "ok": "ok",
        }[verdict]
        if self.dropped:
            word += f" ({self.dropped} canary participations over the round slots sat out)"
        a_delta = self.delta if self.audit_delta is None else self.audit_delta
        a_eps = self.epsilon if self.epsilon_audit_delta is None else self.epsilon_audit_delta
        text = (
            f"empirical epsilon >= {self.epsilon_lower:.3f} at {self.confidence:.0%} "
            f"confidence, audit delta {a_delta:g} ({self.unit}-level, {self.included}/"
            f"{self.canaries} canaries in, {self.score} score; TPR {self.tpr_at_fpr:.3f} at "
            f"FPR {self.fpr:g}, AUROC {self.auroc:.3f}) vs accounted ({self.epsilon:.3f}, "
            f"{self.delta:g})"
        )
        if a_delta != self.delta:
            text += f" = ({a_eps:.3f}, {a_delta:g})"
        if self.power_epsilon is not None:
            text += (
                f"; power: at most {self.power_epsilon:.3f} certifiable, sees noise divided "
                f"by {_factor(self.detectable_noise_factor)}"
            )
        text += f": {word}"
        if self.epsilon_gdp is not None:
            text += (
                "; GDP estimate (assumes a Gaussian tradeoff curve): epsilon "
                f"{self.epsilon_gdp:.3f}, mu {self.gdp_mu:.3f}"
            )
            if self.gdp_mu_accounted is not None:
                text += (
                    f" vs accounted mu {self.gdp_mu_accounted:.3f} (at most "
                    f"{self.gdp_power_mu:.3f} visible, sees noise divided by "
                    f"{_factor(self.gdp_detectable_noise_factor)}): {self.gdp_verdict}"
                    f"; AUROC >= {self.auroc_lower:.3f} vs at most "
                    f"{self.auroc_accounted:.3f} under the accounted Gaussian curve"
                )
            else:
                text += " (no accounted curve given: not compared)"
        return text

    def to_dict(self) -> dict[str, Any]:
        """JSON-able fields (the privacy record's and the ledger's ``audit``): every
        attribute by name (``inf`` stays a float; the ledger writes it as ``"inf"``)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CanaryReport:
        """The report :meth:`to_dict` described (``"inf"`` text read back as a float;
        fields it lacks, from reports written before them, are ``None``)."""

        def value(v: Any) -> Any:
            return float(v) if v in ("inf", "-inf") else v

        return cls(**{k: value(data[k]) for k in cls.__dataclass_fields__ if k in data})


def _factor(value: float | None) -> str:
    """A noise factor for a line: ``"4.2x"``, or ``"no factor up to 1000x"``."""
    if value is None:
        return "?"
    return f"{value:.1f}x" if math.isfinite(value) else f"no factor up to {MAX_NOISE_FACTOR:g}x"


def _verdict(estimate: float, against: float, power: float, factor: float = 1.0) -> str:
    """:data:`VERDICTS` of one estimate against the accounted value, its power and the
    noise factor it could detect."""
    if estimate > against:
        return "violation"
    return "ok" if power > against and factor <= DETECT_FACTOR else "cannot tell"


def audit_scores(
    scores: Float[ArrayLike, " M"],
    included: Bool[ArrayLike, " M"],
    *,
    audit: CanaryAudit,
    epsilon: float,
    delta: float,
    unit: str,
    dropped: int = 0,
    overflow: float = 0.0,
    accounted: Callable[[float], float] | None = None,
) -> CanaryReport:
    """The one-run lower bound of in against out canary scores, its power, its verdict and
    the GDP estimate (host side, numpy).

    Args:
        scores: ``(M,)`` canary scores, higher for canaries more visible in the output; a
            non-finite score (a diverged model) counts as the lowest possible.
        included: ``(M,)`` the secret coins (True: in).
        audit: the audit's settings (confidence, fpr, its own delta).
        epsilon, delta: the run's accounted guarantee.
        unit: ``"client"`` or ``"record"``.
        dropped, overflow: client level: canary participations that sat out over the
            round slots, and the run's chance of any (:class:`CanaryReport`); every delta
            the bound is computed at is shifted by ``(1 + e^eps) overflow``.
        accounted: ``delta -> epsilon``, the run's accounted epsilon at any delta
            (:func:`accounted_curve` of its privacy record).  Needed for an audit delta
            other than the run's (:attr:`CanaryAudit.delta`, :func:`choose_audit_delta`);
            without it the run's delta is used and ``accounted_curve`` is ``False``.

    Returns:
        The :class:`CanaryReport`; with no in or no out canary (chance ``2^(1 - M)``)
        nothing can be detected: ``epsilon_lower = 0``, ``tpr_at_fpr = 0``, ``auroc = 0.5``,
        power 0, verdict ``"cannot tell"``.
    """
    s = np.asarray(scores, np.float64).reshape(-1)
    inc = np.asarray(included, bool).reshape(-1)
    s = np.where(np.isfinite(s), s, np.finfo(np.float64).min)
    ins, outs = s[inc], s[~inc]
    epsilon, delta, overflow = float(epsilon), float(delta), float(overflow)
    significance = 1.0 - audit.confidence
    m = int(s.size)
    # the audit's delta and the accounted epsilon there (settings only, never the scores)
    if accounted is None:
        a_delta, a_eps, candidates = delta, epsilon, []
    else:
        a_delta = audit.delta
        if a_delta is None:
            a_delta = choose_audit_delta(
                accounted, delta, m, confidence=audit.confidence, overflow=overflow
            )
        a_eps = epsilon if a_delta == delta else float(accounted(a_delta))
        candidates = sorted({*ENVELOPE_DELTAS, *_candidates(delta), a_delta}, reverse=True)

    def curve(d: float) -> float:
        return epsilon if d == delta else a_eps if d == a_delta else float(accounted(d))

    bound_delta = _shifted(a_delta, a_eps, overflow)
    # the correct mechanism's Gaussian mu (at the run's delta: the smallest fit, so the
    # noise factor is not flattered), and the Gaussian curve covering the accounted profile
    mu_run = gdp_mu(epsilon, delta)
    # without the accountant's curve only one point of the profile is known: no Gaussian
    # curve can be said to cover it, so the GDP and AUROC comparisons are not made
    known = accounted is not None
    # (deltas where the accountant's epsilon is infinite, e.g. a sampler's overflow charge
    # eating a tiny delta, are skipped: no Gaussian curve covers them)
    fits = [gdp_mu(e, d) for d in candidates if math.isfinite(e := float(curve(d)))]
    mu_accounted = max(fits) if known and fits else None
    power = power_epsilon(int(ins.size), int(outs.size), bound_delta, audit.confidence)
    gdp_power = power_gdp_mu(int(ins.size), int(outs.size), delta, audit.confidence)
    common = dict(
        confidence=audit.confidence,
        epsilon=epsilon,
        delta=delta,
        canaries=m,
        included=int(ins.size),
        unit=unit,
        score=audit.score,
        fpr=audit.fpr,
        dropped=int(dropped),
        overflow=overflow,
        audit_delta=float(a_delta),
        epsilon_audit_delta=float(a_eps),
        accounted_curve=accounted is not None,
        power_epsilon=power,
        detectable_noise_factor=detectable_noise_factor(
            mu_run, a_eps, canaries=m, delta=bound_delta, confidence=audit.confidence
        ),
        gdp_mu_accounted=mu_accounted,
        gdp_power_mu=gdp_power,
        gdp_detectable_noise_factor=None
        if mu_accounted is None
        else detectable_noise_factor(
            mu_run,
            mu_accounted,
            canaries=m,
            delta=delta,
            confidence=audit.confidence,
            estimate="gdp",
        ),
        gdp_method=GDP_METHOD,
        auroc_accounted=None if mu_accounted is None else _auroc_of(mu_accounted),
    )
    if ins.size == 0 or outs.size == 0:
        return CanaryReport(
            epsilon_lower=0.0,
            tpr_at_fpr=0.0,
            auroc=0.5,
            verdict="cannot tell",
            epsilon_gdp=0.0,
            gdp_mu=0.0,
            gdp_verdict="cannot tell",
            auroc_lower=0.0,
            **common,
        )
    auditor = CanaryScoreAuditor(ins, outs)
    lower = _auditor_bound(ins, outs, significance, bound_delta)
    mu_hat = _gdp_mu_estimate(ins, outs, significance, delta)
    auroc = float(auditor.attack_auroc())
    auroc_lower = auroc - math.sqrt(math.log(1.0 / significance) / (2 * min(ins.size, outs.size)))
    gdp_verdict = "cannot tell"  # without the accounted curve: nothing to compare with
    verdict = _verdict(lower, a_eps, power, common["detectable_noise_factor"])
    if mu_accounted is not None:
        gdp_verdict = _verdict(
            mu_hat, mu_accounted, gdp_power, common["gdp_detectable_noise_factor"]
        )
        rejected = gdp_verdict == "violation" or auroc_lower > common["auroc_accounted"]
        if verdict != "violation" and rejected:
            verdict = "suspect"
    return CanaryReport(
        epsilon_lower=lower,
        tpr_at_fpr=float(auditor.tpr_at_given_fpr(audit.fpr)),
        auroc=auroc,
        verdict=verdict,
        epsilon_gdp=gdp_epsilon(mu_hat, delta),
        gdp_mu=float(mu_hat),
        gdp_verdict=gdp_verdict,
        auroc_lower=float(auroc_lower),
        **common,
    )


def _auroc_of(mu: float) -> float:
    """``Phi(mu / sqrt 2)``: the AUROC of ``N(mu, 1)`` against ``N(0, 1)``, the largest any
    test of a ``mu``-GDP mechanism reaches."""
    from scipy.stats import norm

    return 1.0 if not math.isfinite(mu) else float(norm.cdf(mu / math.sqrt(2.0)))
