"""FedAvg (McMahan et al. 2017), optionally with record-level DP local training
(FedAvg + DP-SGD / DP-Adam), and combined learning through its ``combine`` rule.

One exchange per round, every client: the server broadcasts the global model, each client
trains ``E`` local epochs (:class:`~swarmjax.fl.client.training.LocalTraining`) and uploads
its model with its weight ``|D_i|``; the server combines the uploaded models with
``combine`` (default :func:`~swarmjax.fl.algorithms.common.weighted_average`; combined
learning plugs in :class:`~swarmjax.fl.algorithms.combined.CombinedAggregator`).

Under the default combination the server needs only two sums, ``sum_i w_i (theta_i - w_t)``
and ``sum_i w_i`` (``w_i = |D_i|``, or 1 with ``weighting="uniform"``): each client uploads
its update already times its weight (:class:`~swarmjax.fl.protocol.Update`), the exchange is
summed (``Exchange.aggregate_sum``; the simulator adds each reply into the sum as it comes,
without a stack of the cohort's models, as secure aggregation would allow) and the server
steps along the mean update. That summed exchange is what a user-level privacy plan wraps
(:func:`swarmjax.fl.private.private`): central DP-FedAvg and DP-FTRL are FedAvg plus a plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Float, Int, PRNGKeyArray, PyTree

from swarmjax._validation import check_choice, check_int, check_positive, check_range
from swarmjax.fl.algorithms.common import (
    Aggregator,
    ModelReply,
    ModelServer,
    RecordLevel,
    Trainer,
    check_in_client_audit,
    check_model_inputs,
    in_client_audit_reports,
    keep_if,
    masked,
    public_metrics,
    record_level_noise,
    slot_sum,
    weighted_average,
)
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data.clients import ClientData
from swarmjax.fl.protocol import (
    ACCOUNTED,
    UNPROTECTED,
    Algorithm,
    Exchange,
    Protection,
    RunSpec,
    Slots,
    UniformCohort,
    Update,
    everyone,
)
from swarmjax.models import Model
from swarmjax.privacy.canaries import (
    CanaryAudit,
    CanaryReport,
    ClientCanaries,
)

__all__ = ["AuditedTrainer", "FedAvg", "FedAvgHyper"]


@flax.struct.dataclass
class FedAvgHyper:
    """Numeric hyper-parameters (vmappable leaves).

    Attributes:
        learning_rate: local learning rate.
        noise_multiplier: ``(clients,)`` ``sigma_i`` of record-level DP (unused without).
        server_lr: the server optimiser's learning rate (unused without one).
    """

    learning_rate: Float[Array, ""]
    noise_multiplier: Float[Array, " clients"]
    server_lr: Float[Array, ""]


@flax.struct.dataclass
class AuditedTrainer(Trainer):
    """:class:`~swarmjax.fl.algorithms.common.Trainer` of an audited run
    (``FedAvg(audit=...)``): also the client's record-level canaries, carried across rounds
    (``M`` coordinates, coins and scores; they never leave the client in a deployment, the
    simulation reads their scores after the run)."""

    canaries: ClientCanaries


@dataclass(frozen=True)
class FedAvg(Algorithm):
    """FedAvg as a protocol algorithm (static settings; hashable).

    Attributes:
        model: the ``(init, apply)`` pair.
        training: local training (epochs, batch size, optimiser, record-level DP or not).
        combine: ``(client_params, weights) -> params`` over the uploaded models (stacked);
            unselected slots are zeroed with weight 0 before it is called. The default,
            :func:`~swarmjax.fl.algorithms.common.weighted_average`, is computed from sums
            alone: clients then upload ``|D_i| theta_i`` and the exchange is summed.
        eval_batch_size: chunk size of the test evaluation (None: one pass).
        cohort: clients per round, drawn uniformly without replacement (public); a round
            runs and aggregates only them (``None``: every client, every round).
        server_optimizer: ``None`` (the new global model is the combination, McMahan et
            al.), or ``"sgd"``, ``"adam"`` (FedAdam), ``"yogi"`` (FedYogi; Reddi et al.
            2021) applied at ``server_lr`` to the pseudo-gradient ``w_t - combination``
            (minus the mean update).
        audit: an empirical audit of the record-level DP-SGD / DP-Adam steps (``None``:
            none; docs/audits.md): every client holds ``audit.canaries`` record-level Dirac
            gradient canaries (:class:`~swarmjax.privacy.canaries.ClientCanaries`, score
            ``"gradient"``) in its :class:`AuditedTrainer`, each in by a secret fair coin
            and drawn into the client's Poisson batches at its rate ``q_i``;
            the accounting's ``audited`` (which ``simulate`` calls at the end) turns a finished
            run's canaries into its :class:`~swarmjax.privacy.canaries.CanaryReport` s, in
            ``Result.audit``, the privacy record and the ledger. The canaries move the
            uploaded models (that is how they are seen), never the weights ``|D_i|`` nor
            the accounting. Requires ``training.record_dp`` and a finite ``epsilon_target``.
        server_momentum: momentum of the server SGD (``server_optimizer="sgd"`` only; 0: a
            plain step).
        weighting: each client's weight in the mean update: ``"examples"`` (default,
            ``|D_i|``, McMahan et al.) or ``"uniform"`` (1 each: what user-level DP needs,
            since a client's size is private at the client level).
    """

    model: Model
    training: LocalTraining = field(default_factory=LocalTraining)
    combine: Aggregator = weighted_average
    eval_batch_size: int | None = None
    cohort: int | None = None
    server_optimizer: Literal["sgd", "adam", "yogi"] | None = None
    audit: CanaryAudit | None = None
    server_momentum: float = 0.0
    weighting: Literal["examples", "uniform"] = "examples"

    def accounting(self) -> RecordLevel:
        """The clients' own accountants (:class:`~swarmjax.fl.algorithms.common.RecordLevel`,
        with :attr:`audit`'s canaries): record-level DP when ``training.record_dp`` is set,
        else steps counted and no claim (unit ``None``)."""
        return RecordLevel(self.training, self.audit)

    @property
    def exchanges(self) -> tuple[Exchange, ...]:
        params = ACCOUNTED if self.training.record_dp is not None else UNPROTECTED
        weight = Protection("public", None, "|D_i|, public (as q_i = B/|D_i| assumes)")
        if self.weighting == "uniform":
            weight = Protection("public", None, "1 for every client")
        return (
            Exchange(
                "train",
                everyone if self.cohort is None else UniformCohort(self.cohort),
                self.request,
                self.client,
                self.aggregate,
                {"delta" if self._summed else "params": params, "weight": weight},
                max_selected=self.cohort,
                aggregate_sum=self.aggregate_sum if self._summed else None,
            ),
        )

    @property
    def _summed(self) -> bool:
        """The default combination (:func:`weighted_average`) needs only the sums of
        ``w_i (theta_i - w_t)`` and ``w_i``: the client sends its update times its weight
        and the exchange is summed."""
        return self.combine is weighted_average

    # ------------------------------------------------------------------ protocol members

    def server_init(self, key: PRNGKeyArray, hyper: FedAvgHyper) -> ModelServer:
        params = self.model.init(key)
        opt = self._server_opt(hyper)
        return ModelServer(params=params, opt_state=() if opt is None else opt.init(params))

    def _server_opt(self, hyper: FedAvgHyper) -> optax.GradientTransformation | None:
        if self.server_optimizer is None:
            return None
        if self.server_optimizer == "sgd":
            return optax.sgd(hyper.server_lr, momentum=self.server_momentum or None)
        make = {"adam": optax.adam, "yogi": optax.yogi}
        return make[self.server_optimizer](hyper.server_lr)

    def client_init(
        self, key: PRNGKeyArray, data: ClientData, hyper: FedAvgHyper, client_id: Int[Array, ""]
    ) -> Trainer:
        del data
        zero = jnp.zeros((), jnp.float32)
        sigma = zero if self.training.record_dp is None else hyper.noise_multiplier[client_id]
        state = Trainer(steps=jnp.zeros((), jnp.int32), noise_multiplier=sigma, loss=zero)
        if self.audit is None:
            return state
        # the client's own coins and coordinates (its secret key)
        canaries = ClientCanaries.create(key, self.audit.canaries, self._parameters())
        return AuditedTrainer(state.steps, state.noise_multiplier, state.loss, canaries)

    def _parameters(self) -> int:
        """The model's parameter count (shapes only: no work)."""
        like = jax.eval_shape(self.model.init, jax.random.key(0))
        return sum(int(np.prod(a.shape)) for a in jax.tree.leaves(like))

    def request(self, server: ModelServer) -> PyTree:
        return server.params

    def client(
        self,
        state: Trainer,
        data: ClientData,
        params: PyTree,
        key: PRNGKeyArray,
        hyper: FedAvgHyper,
    ) -> tuple[Trainer, ModelReply]:
        args = (self.model, params, data, key, hyper.learning_rate, state.noise_multiplier)
        transform = self.gradient_transform(hyper)
        res, canaries = self.training.train_audited(  # canaries None without an audit
            *args, getattr(state, "canaries", None), gradient_transform=transform
        )
        weight = self.training.examples(data.sizes).astype(jnp.float32)
        if self.weighting == "uniform":
            weight = jnp.ones((), jnp.float32)
        if self._summed:  # w_i (theta_i - w_t): the server adds the replies and divides
            delta = jax.tree.map(jnp.subtract, res.params, params)
            if self.weighting != "uniform":
                delta = jax.tree.map(lambda d: (d * weight).astype(d.dtype), delta)
            reply = Update(delta=delta, weight=weight)
        else:
            reply = ModelReply(params=res.params, weight=weight)
        state = state.replace(steps=state.steps + res.steps, loss=res.loss)
        if self.audit is None:
            return state, reply
        return state.replace(canaries=canaries), reply

    def gradient_transform(self, hyper: FedAvgHyper) -> optax.GradientTransformation | None:
        """A transform of the local gradient before the optimiser (FedAvg: none; FedProx
        adds its proximal term here)."""
        del hyper
        return None

    def aggregate(
        self,
        server: ModelServer,
        replies: ModelReply,
        slots: Slots,
        key: PRNGKeyArray,
        hyper: FedAvgHyper,
    ) -> ModelServer:
        if self._summed:
            return self.aggregate_sum(server, slot_sum(replies, slots.mask), slots, key, hyper)
        r = masked(replies, slots.mask)
        new = self.combine(r.params, r.weight)
        grads = jax.tree.map(jnp.subtract, server.params, new)  # w_t - combination
        return self._step(server, new, grads, jnp.sum(r.weight) > 0, hyper)

    def aggregate_sum(
        self,
        server: ModelServer,
        total: Update,
        slots: Slots,
        key: PRNGKeyArray,
        hyper: FedAvgHyper,
    ) -> ModelServer:
        """The server's step from ``total``, the selected replies' sum under the default
        combination: the mean update ``sum_i w_i delta_i / sum_i w_i`` (under a privacy
        plan: the noised sum over the public denominator)."""
        del slots, key
        mean = jax.tree.map(
            lambda t, p: (t / total.weight).astype(p.dtype), total.delta, server.params
        )
        new = jax.tree.map(jnp.add, server.params, mean)
        return self._step(server, new, jax.tree.map(jnp.negative, mean), total.weight > 0, hyper)

    def _step(
        self, server: ModelServer, new: PyTree, grads: PyTree, replied: Array, hyper: FedAvgHyper
    ) -> ModelServer:
        """The server after a round whose clients' combination is ``new`` (pseudo-gradient
        ``grads = w_t - new``, minus the mean update): ``new`` itself, or a server
        optimiser's step along ``grads``; unchanged when nobody replied."""
        opt = self._server_opt(hyper)
        opt_state = server.opt_state
        if opt is not None:  # a step along the pseudo-gradient
            updates, opt_state = opt.update(grads, server.opt_state, server.params)
            new = optax.apply_updates(server.params, updates)
        return ModelServer(
            params=keep_if(replied, new, server.params),
            opt_state=keep_if(replied, opt_state, server.opt_state),
        )

    def evaluate(self, server: ModelServer, test: tuple[Array, Array]) -> dict[str, Array]:
        return public_metrics(self.model, server.params, test, self.eval_batch_size)

    # ------------------------------------------------------------------------ host side

    def client_data(
        self, clients: ClientData, test: tuple[Array, Array] | None = None
    ) -> ClientData:
        """The clients under ``training.max_examples`` (a flat store gathers the cap), once
        the settings fit them and ``test`` (:meth:`fits`)."""
        self.fits(clients, test)
        return self.training.client_data(clients)

    def fits(self, clients: ClientData, test: tuple[Array, Array] | None = None) -> None:
        """One ``ValueError`` line naming the setting unless it fits ``clients`` and the
        public ``test`` set (``None``: not checked)."""
        self.training.check(clients.sizes)
        check_choice("server_optimizer", self.server_optimizer, (None, "sgd", "adam", "yogi"))
        check_choice("weighting", self.weighting, ("examples", "uniform"))
        check_range("server_momentum", self.server_momentum, 0.0, 1.0, high_open=True)
        if self.server_momentum and self.server_optimizer != "sgd":
            raise ValueError(
                "server_momentum applies to server_optimizer='sgd' only; got "
                f"server_optimizer={self.server_optimizer!r}"
            )
        if self.cohort is not None:
            cohort = check_int("cohort", self.cohort, 1)
            if cohort > clients.num_clients:
                raise ValueError(
                    f"cohort must be <= the {clients.num_clients} clients; got {cohort}"
                )
        check_model_inputs(self.model, clients, test)
        if self.audit is not None:
            self.check_audit()

    def check_audit(self) -> None:
        """One ``ValueError`` line naming the option unless :attr:`audit` can run: a
        ``CanaryAudit``, a record-level private run (``training.record_dp``; a no-DP or
        client-level run has no record-level epsilon to audit), score ``"gradient"`` and
        at most the model's parameter count of canaries (shapes only: no work)."""
        check_in_client_audit(
            self.audit,
            self.training,
            self.model,
            "no record-level DP, epsilon inf; client-level runs take simulate(audit=...)",
        )

    def audit_reports(self, result: Any) -> tuple[CanaryReport, ...]:
        """Each run's :class:`~swarmjax.privacy.canaries.CanaryReport` of a finished
        :func:`~swarmjax.fl.runtime.simulate` call of this algorithm (``result``): every
        client's ``M`` canary scores over its public noise scale ``sigma_i sqrt(T_i)``
        (its noise multiplier and accounted steps ``T_i``, from the privacy record),
        pooled (``N M`` canaries), against the run's largest client epsilon
        (:func:`~swarmjax.privacy.canaries.pooled_record_report`). The canaries are
        records of the local DP steps, the only steps that read the clients' records, so
        the whole run is ``(eps_i, delta)``-DP with respect to each of them."""
        return in_client_audit_reports(self.audit, result)

    def default_hyper(self, clients: ClientData, spec: RunSpec) -> FedAvgHyper:
        """Learning rate 0.1, no noise, server learning rate 1."""
        del spec
        return FedAvgHyper(
            learning_rate=jnp.asarray(0.1, jnp.float32),
            noise_multiplier=jnp.zeros((clients.num_clients,), jnp.float32),
            server_lr=jnp.asarray(1.0, jnp.float32),
        )

    def resolve(
        self, hyper: FedAvgHyper, clients: ClientData, spec: RunSpec, epsilon_target: float | None
    ) -> FedAvgHyper:
        """``sigma_i`` calibrated per client to ``epsilon_target``
        (:func:`~swarmjax.fl.algorithms.common.record_level_noise`)."""
        self.fits(clients)
        check_positive("learning_rate", float(hyper.learning_rate), finite=True)
        check_positive("server_lr", float(hyper.server_lr), finite=True)
        if self.audit is not None:
            self.check_audit()  # record_dp first: the inf check below would hide it
        if self.audit is not None and (epsilon_target is None or math.isinf(epsilon_target)):
            raise ValueError(
                "audit needs a private run: epsilon_target is inf (no noise, no epsilon to "
                "audit); give a finite epsilon_target"
            )
        sigma = record_level_noise(self.training, clients.sizes, spec, epsilon_target)
        return hyper.replace(noise_multiplier=jnp.asarray(sigma))
