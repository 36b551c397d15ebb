"""References without federation: every client trains alone on its own data.

* "clients alone" (the CL experiment's baseline): every client starts from the server's one
  initial model and trains ``E`` epochs per round on its own data, never combining (a fresh
  optimiser state each round, as in FedAvg);
* the centralised ceiling: ONE client holding the union of all training data
  (:func:`centralised_clients`), one epoch per round, the optimiser state kept across
  rounds (``keep_optimizer_state=True``).

A setup exchange broadcasts the initial model; each round every client uploads its model so
that the server can evaluate it on the public test set (per-client metrics ``(N,)``; scalar
when there is one client).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PRNGKeyArray, PyTree

from swarmjax._validation import check_positive
from swarmjax.fl.algorithms.common import check_model_inputs, public_metrics
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data.clients import ClientData, stack_clients
from swarmjax.fl.protocol import (
    UNPROTECTED,
    Algorithm,
    Exchange,
    RunSpec,
    Slots,
    everyone,
)
from swarmjax.models import Model

__all__ = ["LocalHyper", "LocalOnly", "LocalServer", "centralised_clients"]


@flax.struct.dataclass
class LocalHyper:
    """The local learning rate (vmappable)."""

    learning_rate: Float[Array, ""]


@flax.struct.dataclass
class LocalServer:
    """The initial model and the last uploaded model of every client ``(N, ...)``."""

    init: PyTree
    models: PyTree


@flax.struct.dataclass
class LocalClient:
    """A client's own model, optimiser state and (diagnostics only) last local loss."""

    params: PyTree
    opt_state: PyTree
    loss: Float[Array, ""]


def centralised_clients(clients: ClientData) -> ClientData:
    """ONE client holding every real row of ``clients`` (for the centralised ceiling)."""
    x = np.asarray(clients.x)[np.asarray(clients.mask)]
    y = np.asarray(clients.y)[np.asarray(clients.mask)]
    return stack_clients(x, y, [np.arange(len(y))])


@dataclass(frozen=True)
class LocalOnly(Algorithm):
    """Clients training alone (static settings; hashable). No DP: epsilon is inf.

    Attributes:
        model: the ``(init, apply)`` pair.
        training: local training (``record_dp`` must be None).
        keep_optimizer_state: carry the optimiser state across rounds (the centralised
            ceiling) instead of a fresh state every round.
        eval_batch_size: chunk size of the test evaluation.
    """

    model: Model
    training: LocalTraining = field(default_factory=LocalTraining)
    keep_optimizer_state: bool = False
    eval_batch_size: int | None = None

    @property
    def setup(self) -> tuple[Exchange, ...]:
        return (Exchange("start", everyone, _initial, self.start, _unchanged, {}),)

    @property
    def exchanges(self) -> tuple[Exchange, ...]:
        return (
            Exchange("train", everyone, _nothing, self.client, _store, {"params": UNPROTECTED}),
        )

    def server_init(self, key: PRNGKeyArray, hyper: LocalHyper) -> LocalServer:
        del hyper
        return LocalServer(init=self.model.init(key), models=None)

    def client_init(
        self, key: PRNGKeyArray, data: ClientData, hyper: LocalHyper, client_id: Int[Array, ""]
    ) -> LocalClient:
        del data, client_id
        params = self.model.init(key)  # replaced by the server's model in the setup
        opt = self.training.optimizer_for(hyper.learning_rate)
        return LocalClient(
            params=params, opt_state=opt.init(params), loss=jnp.zeros((), jnp.float32)
        )

    def start(
        self,
        state: LocalClient,
        data: ClientData,
        init: PyTree,
        key: PRNGKeyArray,
        hyper: LocalHyper,
    ) -> tuple[LocalClient, tuple]:
        del data, key, hyper
        return state.replace(params=init), ()

    def client(
        self,
        state: LocalClient,
        data: ClientData,
        request: tuple,
        key: PRNGKeyArray,
        hyper: LocalHyper,
    ) -> tuple[LocalClient, PyTree]:
        del request
        opt_state = state.opt_state if self.keep_optimizer_state else None
        res = self.training.train(
            self.model,
            state.params,
            data,
            key,
            hyper.learning_rate,
            jnp.zeros((), jnp.float32),
            opt_state=opt_state,
        )
        new = LocalClient(params=res.params, opt_state=res.opt_state, loss=res.loss)
        return new, res.params

    def evaluate(self, server: LocalServer, test: tuple[Array, Array]) -> dict[str, Array]:
        out = jax.vmap(lambda p: public_metrics(self.model, p, test, self.eval_batch_size))(
            server.models
        )
        if jax.tree.leaves(server.models)[0].shape[0] == 1:
            out = {k: v[0] for k, v in out.items()}
        return out

    def client_data(
        self, clients: ClientData, test: tuple[Array, Array] | None = None
    ) -> ClientData:
        """The clients as they are, once the settings fit them and ``test`` (:meth:`fits`)."""
        self.fits(clients, test)
        return clients

    def fits(self, clients: ClientData, test: tuple[Array, Array] | None = None) -> None:
        """One ``ValueError`` line naming the setting unless it fits ``clients`` and the
        public ``test`` set (``None``: not checked)."""
        self.training.check(clients.sizes)
        if self.training.record_dp is not None:
            raise ValueError("training.record_dp must be None for the local-only references")
        check_model_inputs(self.model, clients, test)

    def default_hyper(self, clients: ClientData, spec: RunSpec) -> LocalHyper:
        """Learning rate 0.1."""
        del clients, spec
        return LocalHyper(learning_rate=jnp.asarray(0.1, jnp.float32))

    def resolve(
        self, hyper: LocalHyper, clients: ClientData, spec: RunSpec, epsilon_target: float | None
    ) -> LocalHyper:
        self.fits(clients)
        check_positive("learning_rate", float(hyper.learning_rate), finite=True)
        return super().resolve(hyper, clients, spec, epsilon_target)


def _initial(server: LocalServer) -> PyTree:
    return server.init


def _nothing(server: LocalServer) -> tuple:
    del server
    return ()


def _unchanged(
    server: LocalServer,
    replies: tuple,
    slots: Slots,
    key: PRNGKeyArray,
    hyper: LocalHyper,
) -> LocalServer:
    del key, hyper
    n = slots.num_clients
    return server.replace(models=jax.tree.map(lambda a: jnp.repeat(a[None], n, 0), server.init))


def _store(
    server: LocalServer,
    models: PyTree,
    slots: Slots,
    key: PRNGKeyArray,
    hyper: LocalHyper,
) -> LocalServer:
    del key, hyper
    return server.replace(models=slots.update(server.models, models))
