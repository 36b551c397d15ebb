"""FedAvg (McMahan et al. 2017), optionally with record-level DP local training
(FedAvg + DP-SGD / DP-Adam), and combined learning through its ``combine`` rule.

One exchange per round, every client: the server broadcasts the global model, each client
trains ``E`` local epochs (:class:`~swarmjax.fl.client.training.LocalTraining`) and uploads
its model with its weight ``|D_i|``; the server combines the uploaded models with
``combine`` (default :func:`~swarmjax.fl.algorithms.common.weighted_average`; combined
learning plugs in :class:`~swarmjax.fl.algorithms.combined.CombinedAggregator`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float, Int, PRNGKeyArray, PyTree

from swarmjax._validation import check_choice, check_int, check_positive
from swarmjax.fl.algorithms.common import (
    Aggregator,
    ModelReply,
    ModelServer,
    Trainer,
    check_model_inputs,
    keep_if,
    masked,
    public_metrics,
    record_level_noise,
    record_sampling_overflow,
    weighted_average,
)
from swarmjax.fl.client.training import LocalTraining, sample_rate
from swarmjax.fl.data.clients import ClientData
from swarmjax.fl.protocol import (
    ACCOUNTED,
    UNPROTECTED,
    Algorithm,
    Exchange,
    Protection,
    RunSpec,
    Slots,
    Spend,
    UniformCohort,
    everyone,
)
from swarmjax.models import Model

__all__ = ["FedAvg", "FedAvgHyper"]


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


@dataclass(frozen=True)
class FedAvg(Algorithm):
    """FedAvg as a protocol algorithm (static settings; hashable).

    Attributes:
        model: the ``(init, apply)`` pair.
        training: local training (epochs, batch size, optimiser, record-level DP or not).
        combine: ``(client_params, weights) -> params`` over the uploaded models (stacked);
            unselected slots are zeroed with weight 0 before it is called.
        eval_batch_size: chunk size of the test evaluation (None: one pass).
        cohort: clients per round, drawn uniformly without replacement (public); a round
            runs and aggregates only them (``None``: every client, every round).
        server_optimizer: ``None`` (the new global model is the combination, McMahan et
            al.), or ``"sgd"``, ``"adam"`` (FedAdam), ``"yogi"`` (FedYogi; Reddi et al.
            2021) applied at ``server_lr`` to the pseudo-gradient ``w_t - combination``.
    """

    model: Model
    training: LocalTraining = field(default_factory=LocalTraining)
    combine: Aggregator = weighted_average
    eval_batch_size: int | None = None
    cohort: int | None = None
    server_optimizer: Literal["sgd", "adam", "yogi"] | None = None

    @property
    def privacy_unit(self) -> str | None:
        return "record" if self.training.record_dp is not None else None

    @property
    def exchanges(self) -> tuple[Exchange, ...]:
        params = ACCOUNTED if self.training.record_dp is not None else UNPROTECTED
        weight = Protection("public", None, "|D_i|, public (as q_i = B/|D_i| assumes)")
        return (
            Exchange(
                "train",
                everyone if self.cohort is None else UniformCohort(self.cohort),
                self.request,
                self.client,
                self.aggregate,
                {"params": params, "weight": weight},
                max_selected=self.cohort,
            ),
        )

    # ------------------------------------------------------------------ protocol members

    def server_init(self, key: PRNGKeyArray, hyper: FedAvgHyper) -> ModelServer:
        params = self.model.init(key)
        opt = self._server_opt(hyper)
        return ModelServer(params=params, opt_state=() if opt is None else opt.init(params))

    def _server_opt(self, hyper: FedAvgHyper) -> optax.GradientTransformation | None:
        if self.server_optimizer is None:
            return None
        make = {"sgd": optax.sgd, "adam": optax.adam, "yogi": optax.yogi}
        return make[self.server_optimizer](hyper.server_lr)

    def client_init(
        self, key: PRNGKeyArray, data: ClientData, hyper: FedAvgHyper, client_id: Int[Array, ""]
    ) -> Trainer:
        del key
        dp = self.training.record_dp is not None
        spend = Spend.none()
        if dp:
            spend = spend.replace(
                sample_rate=sample_rate(data.sizes, self.training.batch_size),
                noise_multiplier=hyper.noise_multiplier[client_id],
            )
        return Trainer(spend=spend, loss=jnp.zeros((), jnp.float32))

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
        res = self.training.train(
            self.model,
            params,
            data,
            key,
            hyper.learning_rate,
            state.spend.noise_multiplier,
            gradient_transform=self.gradient_transform(hyper),
        )
        spend = state.spend.replace(steps=state.spend.steps + res.steps)
        weight = self.training.examples(data.sizes).astype(jnp.float32)
        reply = ModelReply(params=res.params, weight=weight)
        return Trainer(spend=spend, loss=res.loss), reply

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
        del key
        r = masked(replies, slots.mask)
        new = self.combine(r.params, r.weight)
        opt = self._server_opt(hyper)
        opt_state = server.opt_state
        if opt is not None:  # a step along the pseudo-gradient w_t - combination
            grads = jax.tree.map(jnp.subtract, server.params, new)
            updates, opt_state = opt.update(grads, server.opt_state, server.params)
            new = optax.apply_updates(server.params, updates)
        replied = jnp.sum(r.weight) > 0
        return ModelServer(
            params=keep_if(replied, new, server.params),
            opt_state=keep_if(replied, opt_state, server.opt_state),
        )

    def evaluate(self, server: ModelServer, test: tuple[Array, Array]) -> dict[str, Array]:
        return public_metrics(self.model, server.params, test, self.eval_batch_size)

    def spend(self, server: ModelServer, state: Trainer) -> Spend:
        del server
        return state.spend

    def private_diagnostics(self, state: Trainer) -> dict[str, Array]:
        return {"local_train_loss": state.loss}

    # ------------------------------------------------------------------------ host side

    def client_data(self, clients: ClientData) -> ClientData:
        """The clients under ``training.max_examples`` (a flat store gathers the cap)."""
        return self.training.client_data(clients)

    def check(self, clients: ClientData, test: tuple[Array, Array] | None = None) -> None:
        self.training.check(clients.sizes)
        check_choice("server_optimizer", self.server_optimizer, (None, "sgd", "adam", "yogi"))
        if self.cohort is not None:
            cohort = check_int("cohort", self.cohort, 1)
            if cohort > clients.num_clients:
                raise ValueError(
                    f"cohort must be <= the {clients.num_clients} clients; got {cohort}"
                )
        check_model_inputs(self.model, clients, test)

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
        check_positive("learning_rate", float(hyper.learning_rate))
        check_positive("server_lr", float(hyper.server_lr))
        sigma = record_level_noise(self.training, clients.sizes, spec, epsilon_target)
        return hyper.replace(noise_multiplier=jnp.asarray(sigma))

    def sampling_overflow(self, spend, num_clients, sizes=None, padded=None):
        del num_clients
        return record_sampling_overflow(self.training, spend, sizes, padded)
