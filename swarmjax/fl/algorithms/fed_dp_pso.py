"""Fed-DP-PSO (seed 000; docs/algorithms.md section 2) and FedPSO on the protocol.

Every client holds a swarm of ``S`` particles (full models) in its own state. A round is
two exchanges:

1. ``train`` (every client): the server broadcasts ``gbest``; the client moves its swarm
   toward its personal bests and ``gbest``, scores every particle on its data, refines its
   best particle ``theta_{i,best}`` with ``E`` epochs of DP-Adam (record-level DP,
   :class:`~swarmjax.fl.client.training.LocalTraining`), re-scores it and reports ONE number,
   its lowest personal-best score;
2. ``upload`` (one client): the server picks a client uniformly among the ``top_k`` lowest
   reports; only that client uploads its best personal best, the new ``gbest``.

The setup (round 0) is the same two exchanges without training: every client reports the
best of its ``S`` initial particles and the chosen one uploads it. Only one model goes up
per round, so the upload saving over FedAvg is real, not simulated.

Privacy: with ``private_selection=False`` (the paper) the reported scores and the client's
pbest/argmin choices are exact statistics of private data (``unprotected``: listed in the
privacy record's ``not_covered``); the epsilon covers the DP-Adam steps. With
``private_selection=True`` every score a client computes is a clipped mean plus Laplace
noise (``selection_epsilon`` per client in total, added by basic composition), end to end.
The debate about the paper (which model is refined, loss vs error scoring) is in
``docs/fed_dp_pso.md``.

The authors' design choices (their DP notebooks) are named options, each keeping the
accounting above: ``init="shared"`` (every particle = one public initial model + noise,
initial ``gbest`` = that model, broadcast at setup), ``refine_update="always"`` (the refined
model replaces the client's best), ``optimizer_state="persistent"`` (one optimiser state per
client, kept in the client's state), ``tensor_coefficients`` (``r1, r2`` per parameter
tensor); the velocity clamp is ``PSOHyperParams.velocity_clamp``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree

from swarmjax import swarm
from swarmjax._validation import (
    check_choice,
    check_int,
    check_positive,
    check_range,
    check_stored,
)
from swarmjax.fl.algorithms.common import (
    RecordLevel,
    check_in_client_audit,
    check_model_inputs,
    in_client_audit_reports,
    keep_if,
    public_metrics,
    record_level_noise,
    slot_sum,
)
from swarmjax.fl.client.training import LocalTraining, RecordDP
from swarmjax.fl.data.clients import ClientData
from swarmjax.fl.protocol import (
    ACCOUNTED,
    UNPROTECTED,
    Algorithm,
    Exchange,
    Protection,
    RunSpec,
    Slots,
    everyone,
    noised,
)
from swarmjax.models import Model, cross_entropy, lenet5, mlp, paper_mlp
from swarmjax.privacy.canaries import (
    CanaryAudit,
    CanaryReport,
    ClientCanaries,
)
from swarmjax.privacy.mechanisms import bounded

__all__ = [
    "DEFAULT_READING",
    "READINGS",
    "FedDPPSO",
    "FedDPPSOHyper",
    "PSOClient",
    "PSOData",
    "PSOServer",
    "Reading",
    "evaluation_subset",
    "fed_dp_pso",
    "fedpso",
    "paper_model",
    "reading_hyper",
    "selection_releases",
    "server_select",
]


@flax.struct.dataclass
class PSOData:
    """One client's data: ``train`` (DP-Adam samples it) and ``score`` (the particles are
    scored on it: ``train`` itself, or a fixed public-randomness subset, spec 2.2)."""

    train: ClientData
    score: ClientData


@flax.struct.dataclass
class FedDPPSOHyper:
    """Numeric hyper-parameters (vmappable leaves).

    Attributes:
        pso: inertia ``w``, ``c1``, ``c2``.
        learning_rate: ``eta`` of the local optimiser.
        noise_multiplier: ``(clients,)`` ``sigma_i`` of DP-Adam (unused without record DP).
        score_epsilon: epsilon of ONE noised score (``private_selection``; 0 otherwise).
    """

    pso: swarm.PSOHyperParams
    learning_rate: Float[Array, ""]
    noise_multiplier: Float[Array, " clients"]
    score_epsilon: Float[Array, ""]


@flax.struct.dataclass
class PSOClient:
    """A client's swarm ``(S, ...)``, its DP-Adam steps so far and their noise multiplier
    ``sigma_i`` (what its accountant keeps), the Laplace scale of its scores
    (nats), its optimiser state (``optimizer_state="persistent"``; ``()`` otherwise), its
    record-level canaries (with ``audit``; ``()`` otherwise: they never leave the client
    in a deployment, the simulation reads their scores after the run) and, for the
    private diagnostics only, its last DP-Adam loss and step count."""

    swarm: swarm.SwarmState
    steps: Int[Array, ""]
    noise_multiplier: Float[Array, ""]
    score_scale: Float[Array, ""]
    refine_loss: Float[Array, ""]
    refine_steps: Int[Array, ""]
    opt_state: PyTree = ()
    canaries: PyTree = ()


@flax.struct.dataclass
class PSOServer:
    """``gbest`` (one model), the last reports ``(N,)`` and the client picked (``leader``)."""

    gbest: PyTree
    reports: Float[Array, " N"]
    leader: Int[Array, ""]


def server_select(key: PRNGKeyArray, losses: Float[Array, " N"], top_k: int = 3) -> Int[Array, ""]:
    """Algorithm 2: a client drawn uniformly among the ``min(top_k, N)`` lowest reports."""
    k = min(check_int("top_k", top_k, 1), losses.shape[0])
    order = jnp.argsort(jnp.where(jnp.isnan(losses), jnp.inf, losses))
    return order[jax.random.randint(key, (), 0, k)]


def selection_releases(particles: int, rounds: int) -> int:
    """Scores a client computes over a run: ``S`` at setup + ``S + 1`` per round."""
    return particles + rounds * (particles + 1)


def evaluation_subset(clients: ClientData, size: int, seed: int = 0) -> ClientData:
    """A fixed random subset of at most ``size`` real rows per client, drawn on the host from
    ``numpy.random.default_rng(seed)`` independently of the data (costs no privacy)."""
    size = check_int("eval_subset", size, 1)
    sizes = np.asarray(clients.sizes)
    m = int(min(size, clients.max_size))
    rng = np.random.default_rng(seed)
    rows = np.zeros((len(sizes), m), np.int64)
    kept = np.minimum(sizes, m)
    for i, n in enumerate(sizes):  # host-side, once per experiment
        rows[i, : kept[i]] = np.sort(rng.choice(int(n), size=int(kept[i]), replace=False))
    take = jax.vmap(lambda a, r: a[r])
    idx = jnp.asarray(rows)
    mask = jnp.arange(m)[None, :] < jnp.asarray(kept)[:, None]
    return ClientData(
        x=take(clients.x, idx), y=take(clients.y, idx), mask=mask, sizes=jnp.asarray(kept)
    )


def _take(tree: PyTree, index: Int[Array, ""]) -> PyTree:
    return jax.tree.map(lambda leaf: leaf[index], tree)


@dataclass(frozen=True)
class FedDPPSO(Algorithm):
    """Fed-DP-PSO (static settings; hashable). FedPSO is :func:`fedpso`.

    Attributes:
        model: the ``(init, apply)`` pair.
        training: the refinement of the best particle (default DP-Adam with eq. 10's
            coupled L2, ``weight_decay`` 1e-4; ``record_dp=None`` gives plain Adam, epsilon
            inf; ``optimizer="adamw"``: decoupled decay).
        particles: ``S`` per client.
        refine_start: ``"pbest"`` (refine the best personal best, the model the client
            would send; default) or ``"position"`` (the best moved position).
        top_k: the server picks uniformly among the ``min(top_k, N)`` lowest reports.
        pso_options: ``swarm.PSOOptions``.
        private_selection: noise every score (clipped mean + Laplace); see module docs.
        selection_epsilon: the epsilon of all of a client's noised scores over a run
            (split evenly over :func:`selection_releases`), with ``private_selection``.
        loss_bound: per-example clip of a score under ``private_selection`` (nats).
        selection_metric: ``"loss"`` (the paper) or ``"error"`` (error rate; an option).
        eval_batch_size: chunk size of the test evaluation.
        eval_subset: score particles on at most this many rows per client (None: all).
        init: ``"independent"`` (every particle its own ``model.init`` draw; default) or
            ``"shared"`` (the authors' notebooks: the server's initial model ``theta_0``,
            public randomness, is broadcast at setup; particle ``j`` of every client starts
            at ``theta_0 + init_scale * N(0, 1)``; the initial ``gbest`` is ``theta_0``,
            no upload at setup).
        init_scale: standard deviation of the shared initialisation's noise.
        refine_update: ``"always"`` (default; Algorithm 1 lines 27-32 and the authors'
            notebooks: the refined model replaces the refined slot's personal best
            unconditionally) or ``"if_better"`` (only if its score is lower: the
            ``current`` reading).
        optimizer_state: ``"fresh"`` (the optimiser restarts every round; default) or
            ``"persistent"`` (one state per client, kept in its :class:`PSOClient` across
            rounds, as the DP notebooks' one Adam per client).
        tensor_coefficients: draw ``r1, r2`` once per (particle, parameter tensor), as the
            notebooks, instead of as ``pso_options.coefficients`` says.
        audit: an empirical audit of the DP-Adam steps (``None``: none; docs/audits.md):
            every client holds ``audit.canaries`` record-level Dirac gradient canaries
            (:class:`~swarmjax.privacy.canaries.ClientCanaries`, score ``"gradient"``),
            each in by a secret fair coin and drawn into the client's Poisson batches at its
            rate ``q_i``; the accounting's ``audited`` (which ``simulate`` calls at the end) turns
            a finished run's canaries into its :class:`~swarmjax.privacy.canaries.CanaryReport`
            s, in ``Result.audit``, the privacy record and the ledger. The canaries move the
            refined models (that is how they are seen), never the scores' data nor the
            accounting. Requires ``training.record_dp``.
    """

    model: Model
    training: LocalTraining = field(
        default_factory=lambda: LocalTraining(
            batch_size=64, optimizer="adam", weight_decay=1e-4, record_dp=RecordDP()
        )
    )
    particles: int = 5
    refine_start: Literal["pbest", "position"] = "pbest"
    top_k: int = 3
    pso_options: swarm.PSOOptions = field(default_factory=swarm.PSOOptions)
    private_selection: bool = False
    selection_epsilon: float = 1.0
    loss_bound: float = 10.0
    selection_metric: Literal["loss", "error"] = "loss"
    eval_batch_size: int | None = None
    eval_subset: int | None = None
    init: Literal["independent", "shared"] = "independent"
    init_scale: float = 0.01
    refine_update: Literal["if_better", "always"] = "always"
    optimizer_state: Literal["fresh", "persistent"] = "fresh"
    tensor_coefficients: bool = False
    audit: CanaryAudit | None = None

    def accounting(self) -> RecordLevel:
        """The clients' own accountants (:class:`~swarmjax.fl.algorithms.common.RecordLevel`,
        with :attr:`audit`'s canaries and the noised scores: ``S`` at the start, ``S + 1``
        a round, :func:`selection_releases`): record-level DP when ``training.record_dp``
        is set, else steps counted and no claim (unit ``None``)."""
        return RecordLevel(self.training, self.audit, (self.particles, self.particles + 1))

    # ------------------------------------------------------------------------ exchanges

    def _score_protection(self) -> Protection:
        if self.private_selection:
            return noised("clipped mean score + Laplace; its epsilon added by basic composition")
        return UNPROTECTED

    def _report(self) -> Exchange:
        return Exchange(
            "report",
            everyone,
            _nothing,
            self.report,
            self.store_reports,
            {"score": self._score_protection()},
        )

    def _upload(self) -> Exchange:
        if self.training.record_dp is None:
            model = UNPROTECTED
        else:
            note = "DP-Adam steps" + (
                "" if self.private_selection else "; chosen by exact scores (not covered)"
            )
            model = Protection(ACCOUNTED.kind, "record", note)
        return Exchange(
            "upload",
            self.select_leader,
            _nothing,
            self.upload,
            self.take_gbest,
            {"model": model},
            max_selected=1,
        )

    @property
    def setup(self) -> tuple[Exchange, ...]:
        if self.init == "shared":  # theta_0 down, nothing up: gbest stays theta_0
            return (Exchange("init", everyone, self.request_gbest, self.start_swarm, _keep, {}),)
        return (self._report(), self._upload())

    @property
    def exchanges(self) -> tuple[Exchange, ...]:
        train = Exchange(
            "train",
            everyone,
            self.request_gbest,
            self.train,
            self.store_reports,
            {"score": self._score_protection()},
        )
        return (train, self._upload())

    # -------------------------------------------------------------------------- scoring

    def score_bound(self) -> float:
        """Per-example bound of a noised score: ``loss_bound`` (nats), 1 for the error."""
        return self.loss_bound if self.selection_metric == "loss" else min(self.loss_bound, 1.0)

    def scores(
        self, positions: PyTree, data: ClientData, key: PRNGKeyArray, scale: Float[Array, ""]
    ) -> Float[Array, " S"]:
        """Score of each particle (leaves ``(S, ...)``) on one client's data: mean
        cross-entropy (nats) or error rate; with ``private_selection`` per-example values
        clipped to ``[0, score_bound]`` (a non-finite value counts as ``score_bound``:
        :func:`~swarmjax.privacy.mechanisms.bounded`), summed in float32, plus
        ``Laplace(scale)`` (key ``fold_in(key, j)``)."""
        bound = self.score_bound()
        x = jnp.where(data.mask.reshape((-1,) + (1,) * (data.x.ndim - 1)), data.x, 0.0)
        n = jnp.maximum(jnp.sum(data.mask), 1)

        def one(p: PyTree) -> Float[Array, ""]:
            logits = self.model.apply(p, x)
            if self.selection_metric == "error":
                per = (jnp.argmax(logits, axis=-1) != data.y).astype(logits.dtype)
            else:
                per = cross_entropy(logits, data.y)
            per = per.astype(jnp.float32)
            per = bounded(per, 0.0, bound) if self.private_selection else per
            return jnp.sum(jnp.where(data.mask, per, 0.0)) / n

        values = jax.vmap(one)(positions)
        if not self.private_selection:
            return values
        ids = jnp.arange(values.shape[0])
        noise = jax.vmap(lambda j: jax.random.laplace(jax.random.fold_in(key, j)))(ids)
        return values + scale * noise

    # ------------------------------------------------------------------- server / client

    def server_init(self, key: PRNGKeyArray, hyper: FedDPPSOHyper) -> PSOServer:
        n = hyper.noise_multiplier.shape[0]
        return PSOServer(
            gbest=self.model.init(key),
            reports=jnp.full((n,), jnp.inf, jnp.float32),
            leader=jnp.zeros((), jnp.int32),
        )

    def client_init(
        self, key: PRNGKeyArray, data: PSOData, hyper: FedDPPSOHyper, client_id: Int[Array, ""]
    ) -> PSOClient:
        k_init, k_score, k_swarm = jax.random.split(key, 3)
        eps1 = hyper.score_epsilon
        safe = jnp.where(eps1 > 0, eps1, 1.0)  # no floor: the scale is bound / (m eps1)
        scale = jnp.where(eps1 > 0, self.score_bound() / (data.score.sizes * safe), 0.0)
        inits = jax.vmap(lambda j: self.model.init(jax.random.fold_in(k_init, j)))
        positions = inits(jnp.arange(self.particles))
        if self.init == "shared":  # placeholders: the setup's "init" exchange starts the swarm
            losses = jnp.full((self.particles,), jnp.inf, jnp.float32)
        else:
            losses = self.scores(positions, data.score, k_score, scale)
        state = swarm.init(k_swarm, positions, losses)
        # The S initial scores are counted here in both modes ("shared": scored at setup).
        zero = jnp.zeros((), jnp.float32)
        sigma = zero if self.training.record_dp is None else hyper.noise_multiplier[client_id]
        opt_state = ()
        if self.optimizer_state == "persistent":
            template = _take(positions, 0)
            opt_state = self.training.optimizer_for(hyper.learning_rate).init(template)
        canaries = ()
        if self.audit is not None:  # the client's own coins and coordinates (secret key)
            d = sum(int(np.size(leaf)) for leaf in jax.tree.leaves(_take(positions, 0)))
            canaries = ClientCanaries.create(key, self.audit.canaries, d)
        steps = jnp.zeros((), jnp.int32)
        return PSOClient(state, steps, sigma, scale, zero, steps, opt_state, canaries)

    def start_swarm(
        self,
        state: PSOClient,
        data: PSOData,
        theta0: PyTree,
        key: PRNGKeyArray,
        hyper: FedDPPSOHyper,
    ) -> tuple[PSOClient, tuple]:
        """``init="shared"`` setup: particle ``j`` = ``theta0 + init_scale * N(0, 1)``
        (keys ``fold_in(key, j)``), scored; nothing is sent back."""
        del hyper
        k_noise, k_score = jax.random.split(key)
        leaves, treedef = jax.tree.flatten(theta0)

        def one(j: Int[Array, ""]) -> PyTree:
            ks = jax.random.split(jax.random.fold_in(k_noise, j), len(leaves))
            noisy = [
                leaf + self.init_scale * jax.random.normal(k, leaf.shape, leaf.dtype)
                for leaf, k in zip(leaves, ks, strict=True)
            ]
            return treedef.unflatten(noisy)

        positions = jax.vmap(one)(jnp.arange(self.particles))
        losses = self.scores(positions, data.score, k_score, state.score_scale)
        s = state.swarm
        fresh = swarm.init(jax.random.key(0), positions, losses)
        return state.replace(swarm=fresh.replace(seed=s.seed)), ()

    def request_gbest(self, server: PSOServer) -> PyTree:
        return server.gbest

    def report(
        self,
        state: PSOClient,
        data: PSOData,
        request: tuple,
        key: PRNGKeyArray,
        hyper: FedDPPSOHyper,
    ) -> tuple[PSOClient, Float[Array, ""]]:
        """Setup: report the best initial score (already counted at init)."""
        del data, request, key, hyper
        return state, jnp.min(state.swarm.best_loss)

    def train(
        self,
        state: PSOClient,
        data: PSOData,
        gbest: PyTree,
        key: PRNGKeyArray,
        hyper: FedDPPSOHyper,
    ) -> tuple[PSOClient, Float[Array, ""]]:
        """Algorithm 1 for ONE client: move, score, refine the best, re-score, report."""
        k_score, k_train, k_rescore = jax.random.split(key, 3)
        coeffs = self.tensor_coeffs(state.swarm) if self.tensor_coefficients else None
        s = swarm.move(state.swarm, hyper.pso, self.pso_options, social_target=gbest, coeffs=coeffs)
        scores = self.scores(s.position, data.score, k_score, state.score_scale)
        s = swarm.observe_personal(s, scores)
        if self.refine_start == "pbest":
            j = jnp.argmin(s.best_loss)
            start = _take(s.best_position, j)
        else:
            j = jnp.argmin(jnp.where(jnp.isfinite(scores), scores, jnp.inf))
            start = _take(s.position, j)
        persistent = self.optimizer_state == "persistent"
        res, canaries = self.training.train_audited(
            self.model,
            start,
            data.train,
            k_train,
            hyper.learning_rate,
            state.noise_multiplier,
            None if self.audit is None else state.canaries,
            opt_state=state.opt_state if persistent else None,
        )
        canaries = state.canaries if canaries is None else canaries  # () without an audit
        refined = jax.tree.map(lambda leaf: leaf[None], res.params)
        new = self.scores(refined, data.score, k_rescore, state.score_scale)[0]
        position = jax.tree.map(lambda all_, r: all_.at[j].set(r), s.position, res.params)
        # The refined particle's pbest update is part of this round's one observation: the
        # iteration advances once and only the new score can add a non-finite count.
        after = swarm.observe_personal(s.replace(position=position), scores.at[j].set(new))
        if self.refine_update == "always":  # slot j's pbest := the refined model, any score
            after = after.replace(
                best_position=jax.tree.map(
                    lambda all_, r: all_.at[j].set(r), after.best_position, res.params
                ),
                best_loss=after.best_loss.at[j].set(jnp.where(jnp.isfinite(new), new, jnp.inf)),
            )
        s = after.replace(
            iteration=s.iteration, nonfinite=s.nonfinite + (~jnp.isfinite(new)).astype(jnp.int32)
        )
        new_state = state.replace(
            swarm=s,
            steps=state.steps + res.steps,
            refine_loss=res.loss,
            refine_steps=res.steps,
            opt_state=res.opt_state if persistent else state.opt_state,
            canaries=canaries,
        )
        return new_state, jnp.min(s.best_loss)

    def tensor_coeffs(self, s: swarm.SwarmState) -> tuple[PyTree, PyTree]:
        """``(r1, r2)`` ~ U(0, 1), one pair per (particle, parameter tensor), from the swarm's
        own stream (leaves ``(S, 1, ..., 1)``)."""
        leaves, treedef = jax.tree.flatten(s.position)
        grid = jnp.zeros((self.particles, len(leaves)), jnp.float32)
        opts = swarm.PSOOptions(rng=self.pso_options.rng, coefficients="element")
        r1, r2 = swarm.coefficients(s.seed, s.iteration, grid, opts)

        def per_leaf(r: Array) -> PyTree:
            shaped = [
                r[:, i].reshape((-1,) + (1,) * (leaf.ndim - 1)) for i, leaf in enumerate(leaves)
            ]
            return treedef.unflatten(shaped)

        return per_leaf(r1), per_leaf(r2)

    def store_reports(
        self,
        server: PSOServer,
        reports: Float[Array, " S"],
        slots: Slots,
        key: PRNGKeyArray,
        hyper: FedDPPSOHyper,
    ) -> PSOServer:
        del key, hyper
        return server.replace(reports=slots.scatter(reports, jnp.inf))

    def select_leader(self, server: PSOServer, key: PRNGKeyArray, n: int) -> Bool[Array, " N"]:
        return jnp.zeros(n, bool).at[server_select(key, server.reports, self.top_k)].set(True)

    def upload(
        self,
        state: PSOClient,
        data: PSOData,
        request: tuple,
        key: PRNGKeyArray,
        hyper: FedDPPSOHyper,
    ) -> tuple[PSOClient, PyTree]:
        """The chosen client sends its best personal best."""
        del data, request, key, hyper
        return state, _take(state.swarm.best_position, jnp.argmin(state.swarm.best_loss))

    def take_gbest(
        self,
        server: PSOServer,
        models: PyTree,
        slots: Slots,
        key: PRNGKeyArray,
        hyper: FedDPPSOHyper,
    ) -> PSOServer:
        del key, hyper
        gbest = jax.tree.map(
            lambda g, m: g.astype(m.dtype), slot_sum(models, slots.mask), server.gbest
        )
        uploaded = jnp.any(slots.mask)
        return server.replace(
            gbest=keep_if(uploaded, gbest, server.gbest),
            leader=jnp.where(uploaded, slots.ids[jnp.argmax(slots.mask)], server.leader),
        )

    def evaluate(self, server: PSOServer, test: tuple[Array, Array]) -> dict[str, Array]:
        out = public_metrics(self.model, server.gbest, test, self.eval_batch_size)
        out["leader"] = server.leader
        out["reported_score"] = server.reports
        return out

    # ------------------------------------------------------------------------ host side

    def fits(self, clients: ClientData, test: tuple[Array, Array] | None = None) -> None:
        """One ``ValueError`` line naming the field unless the settings fit ``clients`` and
        the public ``test`` set (``None``: not checked)."""
        check_int("particles", self.particles, 1)
        check_int("top_k", self.top_k, 1)
        check_stored("loss_bound", self.loss_bound, 0.0, math.inf, low_open=True)
        check_stored("selection_epsilon", self.selection_epsilon, 0.0, math.inf, low_open=True)
        check_choice("refine_start", self.refine_start, ("pbest", "position"))
        check_choice("selection_metric", self.selection_metric, ("loss", "error"))
        check_choice("init", self.init, ("independent", "shared"))
        check_positive("init_scale", self.init_scale)
        check_choice("refine_update", self.refine_update, ("if_better", "always"))
        check_choice("optimizer_state", self.optimizer_state, ("fresh", "persistent"))
        if self.eval_subset is not None:
            check_int("eval_subset", self.eval_subset, 1)
        self.training.check(clients.sizes)
        check_model_inputs(self.model, clients, test)
        if self.audit is not None:
            self.check_audit()

    def check_audit(self) -> None:
        """One ``ValueError`` line naming the option unless :attr:`audit` can run: a
        ``CanaryAudit``, a private run (``training.record_dp``), score ``"gradient"`` and
        at most the model's parameter count of canaries (shapes only: no work)."""
        check_in_client_audit(self.audit, self.training, self.model, "plain Adam, epsilon inf")

    def audit_reports(self, result: Any) -> tuple[CanaryReport, ...]:
        """Each run's :class:`~swarmjax.privacy.canaries.CanaryReport` of a finished
        :func:`~swarmjax.fl.runtime.simulate` call of this algorithm (``result``): every
        client's canary scores over its public noise scale ``sigma_i sqrt(T_i)`` (its
        noise multiplier and accounted steps, from the privacy record), pooled, against the
        run's largest client epsilon (:func:`~swarmjax.privacy.canaries.pooled_record_report`).

        The canaries are records of the DP-Adam steps only; the particles' scores read the
        clients' real rows, never a canary, so with exact scores (``private_selection``
        False: not covered by epsilon) the whole run is still ``(eps_i, delta)``-DP with
        respect to each canary, and the bound is stated against the epsilon of the covered
        steps."""
        return in_client_audit_reports(self.audit, result)

    def client_data(self, clients: ClientData, test: tuple[Array, Array] | None = None) -> PSOData:
        """Stacked :class:`PSOData` (the scoring subset drawn once, public randomness), once
        the settings fit ``clients`` and ``test`` (:meth:`fits`)."""
        self.fits(clients, test)
        score = (
            clients if self.eval_subset is None else evaluation_subset(clients, self.eval_subset)
        )
        return PSOData(train=clients, score=score)

    def default_hyper(self, clients: ClientData, spec: RunSpec) -> FedDPPSOHyper:
        """The paper's ``w = 0.7``, ``c1 = c2 = 1.4`` (``swarm.PSOHyperParams()``),
        ``eta = 0.005``, no noise."""
        del spec
        return FedDPPSOHyper(
            pso=jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), swarm.PSOHyperParams()),
            learning_rate=jnp.asarray(0.005, jnp.float32),
            noise_multiplier=jnp.zeros((clients.num_clients,), jnp.float32),
            score_epsilon=jnp.zeros((), jnp.float32),
        )

    def resolve(
        self,
        hyper: FedDPPSOHyper,
        clients: ClientData,
        spec: RunSpec,
        epsilon_target: float | None,
    ) -> FedDPPSOHyper:
        """``sigma_i`` calibrated per client to ``epsilon_target`` (which must be inf exactly
        when ``training.record_dp`` is None); with ``private_selection`` each score gets
        ``selection_epsilon /`` :func:`selection_releases`."""
        self.fits(clients)
        target = math.inf if epsilon_target is None else epsilon_target
        if (self.training.record_dp is None) != math.isinf(target):
            raise ValueError(
                "epsilon_target must be inf exactly when training.record_dp is None; got "
                f"{target} with record_dp={self.training.record_dp}"
            )
        check_positive("learning_rate", float(hyper.learning_rate), finite=True)
        pso = hyper.pso.validate()
        eps1 = (
            self.selection_epsilon / selection_releases(self.particles, spec.rounds)
            if self.private_selection
            else 0.0
        )
        if self.private_selection:  # one score's epsilon as the device holds it
            check_stored("selection_epsilon / releases", eps1, 0.0, math.inf, low_open=True)
        sigma = record_level_noise(self.training, clients.sizes, spec, target)
        return hyper.replace(
            pso=jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), pso),
            noise_multiplier=jnp.asarray(sigma),
            score_epsilon=jnp.asarray(eps1, jnp.float32),
        )


def _nothing(server: PyTree) -> tuple:
    """An empty request (0 bytes): the exchange needs nothing from the server."""
    del server
    return ()


def _keep(server: PSOServer, replies: tuple, slots: Slots, key, hyper) -> PSOServer:
    """An aggregate that keeps the server as it is (the exchange sends nothing back)."""
    del replies, slots, key, hyper
    return server


@dataclass(frozen=True)
class Reading:
    """A named set of the design choices the paper leaves open (docs/fed_dp_pso.md, "The
    authors' code and the readings"): the algorithm's options, the velocity clamp (a hyper
    value), the weight decay and the input scaling (a data transform,
    :func:`swarmjax.fl.data.transforms.scale_inputs`)."""

    init: Literal["independent", "shared"] = "independent"
    init_scale: float = 0.01
    refine_update: Literal["if_better", "always"] = "always"
    optimizer_state: Literal["fresh", "persistent"] = "fresh"
    tensor_coefficients: bool = False
    velocity_clamp: float = math.inf
    weight_decay: Literal["coupled", "decoupled"] = "coupled"
    decay: float = 1e-4
    input_scaling: Literal["channel", "pixel_public", "none"] = "channel"
    public_rows: int = 1000
    about: str = ""

    def check(self) -> Reading:
        """``ValueError`` naming the field unless every choice is valid; returns self."""
        check_choice("init", self.init, ("independent", "shared"))
        check_positive("init_scale", self.init_scale)
        check_choice("refine_update", self.refine_update, ("if_better", "always"))
        check_choice("optimizer_state", self.optimizer_state, ("fresh", "persistent"))
        check_positive("velocity_clamp", self.velocity_clamp)
        check_choice("weight_decay", self.weight_decay, ("coupled", "decoupled"))
        check_range("decay", self.decay, 0.0, math.inf, high_open=True)
        check_choice("input_scaling", self.input_scaling, ("channel", "pixel_public", "none"))
        check_int("public_rows", self.public_rows, 1)
        return self


READINGS = {
    "paper": Reading(
        about="default: Algorithm 1's text (refined model always kept) and eq. 10 (coupled "
        "L2); independent inits, fresh Adam, r1/r2 per particle, no clamp"
    ),
    "current": Reading(
        refine_update="if_better",
        weight_decay="decoupled",
        about="the published tables' first reading: pbest kept only if better, AdamW",
    ),
    "authors": Reading(
        init="shared",
        optimizer_state="persistent",
        tensor_coefficients=True,
        velocity_clamp=0.1,
        input_scaling="pixel_public",
        about="the DP notebooks' choices (shared init, refined model always kept, one Adam "
        "per client, r1/r2 per tensor, clamp 0.1, coupled L2, per-pixel scaling)",
    ),
}
DEFAULT_READING = "paper"


def fed_dp_pso(
    model: Model,
    reading: Reading,
    *,
    batch_size: int,
    record_dp: RecordDP | None,
    particles: int = 5,
    **options: object,
) -> FedDPPSO:
    """Fed-DP-PSO under a named reading: the one factory the experiments and the Flower
    tasks share, so a deployment runs the reading an experiment asked for.

    Args:
        model: the ``(init, apply)`` pair.
        reading: the design choices (:data:`READINGS`, or one with fields replaced).
        batch_size: ``B`` of the (DP-)Adam refinement.
        record_dp: DP-Adam's clipping and buffer; ``None``: plain Adam, epsilon inf.
        particles: ``S`` per client.
        **options: other :class:`FedDPPSO` fields (e.g. ``eval_subset``).

    Returns:
        The :class:`FedDPPSO`; the reading's velocity clamp is a hyper value,
        :func:`reading_hyper`.
    """
    reading.check()
    training = LocalTraining(
        batch_size=batch_size,
        optimizer="adamw" if reading.weight_decay == "decoupled" else "adam",
        weight_decay=reading.decay,
        record_dp=record_dp,
    )
    return FedDPPSO(
        model=model,
        training=training,
        particles=particles,
        init=reading.init,
        init_scale=reading.init_scale,
        refine_update=reading.refine_update,
        optimizer_state=reading.optimizer_state,
        tensor_coefficients=reading.tensor_coefficients,
        **options,
    )


def paper_model(
    dataset: str, num_classes: int, input_shape: tuple[int, ...]
) -> tuple[Model, float]:
    """The paper's model and DP-Adam step ``eta`` for ``dataset`` (spec 2.5): the LeNet-5
    variant at 0.001 for colour images (PathMNIST), the MLP 784-256-256-C at 0.005 for
    grey-scale ones; a small MLP 64-32-C at 0.005 for scikit-learn's bundled ``digits``."""
    if dataset == "digits":
        return mlp((32,), num_classes, input_shape), 0.005
    if input_shape[-1] == 3:
        return lenet5(num_classes, input_shape), 0.001
    return paper_mlp(num_classes, input_shape), 0.005


def reading_hyper(reading: Reading) -> dict[str, swarm.PSOHyperParams]:
    """The hyper values of ``reading`` for :meth:`~swarmjax.fl.protocol.Variants.grid`."""
    return {"pso": swarm.PSOHyperParams(velocity_clamp=reading.velocity_clamp)}


def fedpso(
    model: Model, *, local_epochs: int = 1, batch_size: int = 32, eval_batch_size: int | None = None
) -> FedDPPSO:
    """FedPSO (Park et al. 2021) as Fed-DP-PSO's settings: ``S = 1``, plain SGD, the best
    report wins (``top_k = 1``), the trained model kept only if better, no DP."""
    return FedDPPSO(
        model=model,
        training=LocalTraining(epochs=local_epochs, batch_size=batch_size, optimizer="sgd"),
        particles=1,
        top_k=1,
        refine_update="if_better",
        eval_batch_size=eval_batch_size,
    )
