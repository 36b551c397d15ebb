"""Client-side training shared by every algorithm: local steps with an optional record-level
DP (DP-SGD / DP-Adam) and the one optimiser convention.

:class:`LocalTraining` says how a client trains (epochs ``E``, batch size ``B``, optimiser
name, record-level DP or not); :meth:`LocalTraining.train` runs it on ONE client's padded
data (:func:`swarmjax.fl.client.local.local_train` with the DP ``grad_fn`` and Poisson sampler of
:mod:`swarmjax.fl.client.record_dp` when ``record_dp`` is set) and returns the trained model with
the number of accounted steps. The Poisson rate is defined once, :func:`sample_rate`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray, PyTree

from swarmjax._validation import (
    check_choice,
    check_int,
    check_nonnegative,
    check_positive,
    check_stored,
)
from swarmjax.fl.client.local import LocalResult, local_train
from swarmjax.fl.client.record_dp import (
    canary_observer,
    dp_grad_fn,
    poisson_sampler,
    record_plan,
    sampler_capacity,
)
from swarmjax.fl.data.clients import ClientData, poisson_rates
from swarmjax.fl.data.cohort import subset_rows
from swarmjax.models import Model
from swarmjax.privacy.accounting import DEFAULT_ACCOUNTANT
from swarmjax.privacy.canaries import ClientCanaries
from swarmjax.privacy.clipping import clip_update  # re-exported: the one whole-update clip
from swarmjax.privacy.plan import PrivacyPlan, draw_overflow

__all__ = [
    "OPTIMIZERS",
    "LocalTraining",
    "OptimizerName",
    "RecordDP",
    "clip_update",
    "make_optimizer",
    "sample_rate",
]

OptimizerName = Literal["sgd", "adam", "adamw"]
_CAP_STREAM = 0x63617020  # fold_in constant of the capped-rows draw (apart from training's)
OPTIMIZERS = ("sgd", "adam", "adamw")


def make_optimizer(
    name: OptimizerName, learning_rate: ArrayLike, weight_decay: float = 0.0, momentum: float = 0.0
) -> optax.GradientTransformation:
    """The optimiser convention: ``"sgd"`` (with ``momentum`` when > 0), ``"adam"`` (with
    ``weight_decay`` > 0: coupled L2, ``weight_decay * params`` added to the gradient before
    Adam, as PyTorch's ``Adam(weight_decay=...)``) or ``"adamw"`` (decoupled
    ``weight_decay``) at ``learning_rate`` (may be traced)."""
    if name == "sgd":
        return optax.sgd(learning_rate, momentum=momentum or None)
    if name == "adam":
        if weight_decay:
            return optax.chain(optax.add_decayed_weights(weight_decay), optax.adam(learning_rate))
        return optax.adam(learning_rate)
    return optax.adamw(learning_rate, weight_decay=weight_decay)


def sample_rate(size: Int[Array, ""], batch_size: int) -> Float[Array, ""]:
    """Poisson rate of record-level DP: ``q_i = B / |D_i|`` (capped at 1), on device.
    The host-side check that ``B <= min |D_i|`` is
    :func:`swarmjax.fl.data.clients.poisson_rates`."""
    return jnp.minimum(batch_size / jnp.maximum(size, 1).astype(jnp.float32), 1.0)


@dataclass(frozen=True)
class RecordDP:
    """Record-level DP of local training (DP-SGD / DP-Adam): per-example clipping to
    ``clip_norm``, Gaussian noise ``sigma_i clip_norm``, Poisson batches of rate
    ``B / |D_i|`` in a buffer of ``capacity`` rows (:meth:`for_sizes`: the smallest safe
    one; ``None``: the padded client length, which never overflows but costs more)."""

    clip_norm: float = 1.0
    capacity: int | None = None

    @classmethod
    def for_sizes(
        cls,
        sizes: ArrayLike,
        batch_size: int,
        clip_norm: float = 1.0,
        *,
        steps: int | None = None,
        delta: float | None = None,
        epsilon: float | None = None,
    ) -> RecordDP:
        """The smallest capacity for clients of ``sizes``: per-step overflow below 1e-9, or,
        given the run's ``steps`` (per client), ``delta`` and an upper bound ``epsilon`` on
        its epsilon, the one whose overflow over the whole run adds at most ``1e-3 delta``
        (:meth:`~swarmjax.privacy.plan.PrivacyPlan.sized`). Either way the privacy record
        accounts the overflow exactly (:meth:`LocalTraining.sampler_overflow`)."""
        check_positive("clip_norm", clip_norm)
        if steps is None:
            return cls(clip_norm=float(clip_norm), capacity=sampler_capacity(sizes, batch_size))
        if delta is None or epsilon is None:
            raise ValueError("RecordDP.for_sizes: steps needs delta and epsilon too")
        capacity = max(
            PrivacyPlan("record", n, min(1.0, batch_size / n), int(steps), delta)
            .sized(epsilon)
            .capacity
            for n in {int(n) for n in np.asarray(sizes).reshape(-1)}
        )
        return cls(clip_norm=float(clip_norm), capacity=capacity)

    @classmethod
    def for_run(
        cls,
        sizes: Sequence[ArrayLike],
        batch_size: int,
        *,
        rounds: int,
        epsilons: Sequence[float],
        delta: float,
        epochs: int = 1,
        clip_norm: float = 1.0,
    ) -> RecordDP:
        """ONE capacity for every client set of ``sizes`` (e.g. several partitions of one
        dataset, so that one compiled program serves them all) and every target of
        ``epsilons``: :meth:`for_sizes` with each set's steps over ``rounds`` rounds of
        ``epochs`` epochs at the largest finite target, the largest capacity of all; the
        per-step 1e-9 buffer when no target is finite.

        The per-step buffer is not enough for a finite target: the accountant charges the
        overflow as ``P (1 + e^eps)`` out of delta, which caps the reachable epsilon (about
        4-6 at tens of steps), so targets 8 and 10 would be silently met at ~5."""
        finite = [float(e) for e in epsilons if math.isfinite(e)]
        if not finite:
            caps = [sampler_capacity(s, batch_size) for s in sizes]
            return cls(clip_norm=float(clip_norm), capacity=max(caps))
        caps = []
        for s in sizes:
            steps = rounds * epochs * math.ceil(int(np.max(s)) / batch_size)
            dp = cls.for_sizes(
                s, batch_size, clip_norm, steps=steps, delta=delta, epsilon=max(finite)
            )
            caps.append(int(dp.capacity))
        return cls(clip_norm=float(clip_norm), capacity=max(caps))


@dataclass(frozen=True)
class LocalTraining:
    """How a client trains in a round (static, hashable).

    Attributes:
        epochs: ``E`` local epochs.
        batch_size: ``B`` (the expected Poisson batch under record-level DP).
        optimizer: ``"sgd"``, ``"adam"`` or ``"adamw"`` (fresh state every round).
        weight_decay: ``lambda`` of ``"adamw"`` (decoupled) or ``"adam"`` (coupled L2).
        momentum: momentum of ``"sgd"`` (0: none).
        record_dp: record-level DP, or ``None`` (shuffled batches, exact gradients).
        max_examples: per-round cap on each client's work, in examples (rows): a client
            with more rows trains its ``E`` epochs of a round on ``max_examples`` of them,
            a uniformly random subset drawn afresh each round (so at most
            ``E ceil(max_examples / B)`` steps), and counts as ``max_examples`` rows in the
            server's weighted average. Default ``None``: no cap (every row, the algorithm
            as published). A cap changes the algorithm for clients above it (cross-device
            practice: TFF's and pfl's per-client example caps); at or above the largest
            client it changes nothing. It must be at least one batch (``batch_size``), and
            is not combined with ``record_dp`` (the record-level accountant assumes Poisson
            batches over all of a client's rows). A flat
            :class:`~swarmjax.fl.data.store.ClientStore` then gathers ``cohort x
            min(max_examples, largest client)`` rows per round (:meth:`client_data`).
    """

    epochs: int = 1
    batch_size: int = 32
    optimizer: OptimizerName = "sgd"
    weight_decay: float = 0.0
    momentum: float = 0.0
    record_dp: RecordDP | None = None
    max_examples: int | None = None

    def check(self, sizes: ArrayLike) -> None:
        """``ValueError`` naming the field unless valid for clients of ``sizes``."""
        check_int("local_epochs", self.epochs, 1)
        check_int("batch_size", self.batch_size, 1)
        if self.max_examples is not None:
            check_int("max_examples", self.max_examples, 1)
            if self.max_examples < self.batch_size:
                raise ValueError(
                    f"max_examples must be >= batch_size ({self.batch_size}), at least one "
                    f"batch per round; got {self.max_examples}"
                )
            if self.record_dp is not None:
                raise ValueError(
                    "max_examples must be None with record_dp: the record-level accountant "
                    "assumes Poisson batches over all of a client's rows"
                )
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_nonnegative("weight_decay", self.weight_decay)
        check_nonnegative("momentum", self.momentum)
        if self.record_dp is not None:
            check_stored("clip_norm", self.record_dp.clip_norm, 0.0, math.inf, low_open=True)
            poisson_rates(np.asarray(sizes), self.batch_size)
            needed = sampler_capacity(sizes, self.batch_size)
            capacity = self.record_dp.capacity
            if capacity is not None and capacity < needed:
                raise ValueError(
                    f"record_dp.capacity must be >= {needed} (Poisson overflow below 1e-9 for "
                    f"these clients); got {self.record_dp.capacity}: use RecordDP.for_sizes"
                )

    def plans(
        self,
        sizes: ArrayLike,
        padded: int,
        *,
        rounds: int,
        delta: float,
        accountant: str = DEFAULT_ACCOUNTANT,
    ) -> dict[int, PrivacyPlan]:
        """Client size -> its record-level :class:`~swarmjax.privacy.plan.PrivacyPlan` over
        ``rounds`` rounds (clients padded to ``padded`` rows: the buffer when
        ``record_dp.capacity`` is ``None``); requires ``record_dp``."""
        if self.record_dp is None:
            raise ValueError("record-level plans need training.record_dp")
        capacity = self.record_dp.capacity or int(padded)
        return {
            n: record_plan(
                n,
                self.batch_size,
                rounds=rounds,
                epochs=self.epochs,
                delta=delta,
                accountant=accountant,
                capacity=capacity,
            )
            for n in sorted({int(n) for n in np.asarray(sizes, np.int64).reshape(-1)})
        }

    def sampler_overflow(self, sizes: ArrayLike, padded: int) -> np.ndarray:
        """``(clients,)`` probability that one step's Poisson batch overflows the buffer
        (0 without record-level DP, or when the buffer holds the whole client), for clients
        of ``sizes`` padded to ``padded`` rows: :func:`~swarmjax.privacy.plan.draw_overflow`
        (what the record-level plans charge), what the accountant adds
        to delta per step. Record-level DP's relation is zero-out (a record replaced by a
        null record), so both neighbours have ``|D_i|`` rows: no add-one candidate."""
        sizes = np.asarray(sizes, np.int64).reshape(-1)
        if self.record_dp is None:
            return np.zeros(sizes.shape, np.float64)
        capacity = self.record_dp.capacity or int(padded)
        probs = {
            n: draw_overflow("record", n, min(1.0, self.batch_size / n), capacity)
            for n in {int(n) for n in sizes}
        }
        return np.asarray([probs[int(n)] for n in sizes], np.float64)

    def client_data(self, clients: Any) -> Any:
        """The clients as a round sees them under :attr:`max_examples`: a flat
        :class:`~swarmjax.fl.data.store.ClientStore` gathers ``min(max_examples, largest)``
        rows per client (:meth:`~swarmjax.fl.data.store.ClientStore.with_cap`); other client
        data is returned as it is (:meth:`train` draws the capped rows). Without a cap a
        store keeps its :attr:`~swarmjax.fl.data.store.ClientStore.read` (``"step"`` for
        unequal clients: each step reads its batch from the store, :meth:`train` takes the
        :class:`~swarmjax.fl.data.store.StoreClient`)."""
        with_cap = getattr(clients, "with_cap", None)
        return with_cap(self.max_examples) if callable(with_cap) else clients

    def examples(self, sizes: Int[ArrayLike, "..."]) -> Int[Array, "..."]:
        """Rows a client of ``sizes`` trains on in a round: ``min(size, max_examples)``."""
        sizes = jnp.asarray(sizes)
        return sizes if self.max_examples is None else jnp.minimum(sizes, self.max_examples)

    def capped(self, data: ClientData, key: PRNGKeyArray) -> ClientData:
        """ONE client's padded ``data`` under :attr:`max_examples`: unchanged when its
        buffer holds at most the cap (no client above it, or a store's capped gather);
        else a buffer of ``max_examples`` rows holding a uniformly random subset of its
        rows (all of them when it has no more than the cap)."""
        cap = self.max_examples
        if cap is None or data.mask.shape[0] <= cap:
            return data
        if callable(getattr(data, "batch", None)):  # a StoreClient: its rows are never gathered
            raise ValueError(
                f"max_examples={cap} is below a step-reading store's largest client: pass "
                "the store through LocalTraining.client_data (with_cap reads a buffer)"
            )
        pos = subset_rows(jax.random.fold_in(key, _CAP_STREAM), data.sizes, cap)
        n = jnp.minimum(data.sizes, cap)
        mask = jnp.arange(cap) < n
        return ClientData(
            x=jnp.where(
                mask.reshape(-1, *([1] * (data.x.ndim - 1))),
                data.x[pos],
                jnp.zeros((), data.x.dtype),
            ),
            y=jnp.where(mask, data.y[pos], 0),
            mask=mask,
            sizes=n,
        )

    def optimizer_for(self, learning_rate: ArrayLike) -> optax.GradientTransformation:
        """This training's optimiser at ``learning_rate``."""
        return make_optimizer(self.optimizer, learning_rate, self.weight_decay, self.momentum)

    def train(
        self,
        model: Model,
        params: PyTree,
        data: ClientData,
        key: PRNGKeyArray,
        learning_rate: Float[Array, ""],
        noise_multiplier: Float[Array, ""],
        opt_state: PyTree | None = None,
        gradient_transform: optax.GradientTransformation | None = None,
    ) -> LocalResult:
        """``E`` epochs on ONE client from ``params`` (the optimiser state starts fresh unless
        ``opt_state``); ``steps`` are the accounted steps (``E ceil(|D_i| / B)``) when
        ``record_dp`` is set. ``gradient_transform`` (e.g. FedProx's proximal term) is
        applied to the (DP) gradient before the optimiser; it must not read the data (it
        then post-processes the DP release and costs no privacy)."""
        res, _ = self._train(
            model, params, data, key, learning_rate, noise_multiplier, opt_state,
            gradient_transform, None,
        )  # fmt: skip
        return res

    def train_audited(
        self,
        model: Model,
        params: PyTree,
        data: ClientData,
        key: PRNGKeyArray,
        learning_rate: Float[Array, ""],
        noise_multiplier: Float[Array, ""],
        canaries: ClientCanaries | None,
        opt_state: PyTree | None = None,
        gradient_transform: optax.GradientTransformation | None = None,
    ) -> tuple[LocalResult, ClientCanaries | None]:
        """:meth:`train` with the client's record-level ``canaries`` (requires
        ``record_dp``): each DP step draws the in ones at the client's Poisson rate
        (:func:`sample_rate`) into its clipped sum, and every released noised gradient is
        added to their scores (:func:`~swarmjax.fl.client.record_dp.canary_observer`,
        before ``gradient_transform`` and the optimiser). Returns the result (its
        ``opt_state`` the optimiser's own, as :meth:`train`'s) and the updated canaries;
        ``canaries=None`` is :meth:`train` (and ``None`` back), so an algorithm whose audit
        is optional makes one call either way."""
        if canaries is not None and self.record_dp is None:
            raise ValueError("audit needs a private run: record-level canaries need record_dp")
        res, seen = self._train(
            model, params, data, key, learning_rate, noise_multiplier, opt_state,
            gradient_transform, canaries,
        )  # fmt: skip
        return res, seen

    def _train(
        self,
        model: Model,
        params: PyTree,
        data: ClientData,
        key: PRNGKeyArray,
        learning_rate: Float[Array, ""],
        noise_multiplier: Float[Array, ""],
        opt_state: PyTree | None,
        gradient_transform: optax.GradientTransformation | None,
        canaries: ClientCanaries | None,
    ) -> tuple[LocalResult, ClientCanaries | None]:
        data = self.capped(data, key)
        optimizer = self.optimizer_for(learning_rate)
        if gradient_transform is not None:
            optimizer = optax.chain(gradient_transform, optimizer)
        grad_fn = sampler = None
        if self.record_dp is not None:
            grad_fn = dp_grad_fn(
                model.apply,
                clip_norm=self.record_dp.clip_norm,
                noise_multiplier=noise_multiplier,
                expected_batch_size=float(self.batch_size),
                canaries=canaries,
                canary_rate=None if canaries is None else sample_rate(data.sizes, self.batch_size),
            )
            capacity = self.record_dp.capacity or data.mask.shape[0]
            sampler = poisson_sampler(self.batch_size, capacity)
        if canaries is not None:  # the observer's state rides first in the chain's state
            optimizer = optax.chain(canary_observer(canaries), optimizer)
            opt_state = None if opt_state is None else (canaries, opt_state)
        res = local_train(
            params,
            data,
            key,
            apply_fn=model.apply,
            optimizer=optimizer,
            epochs=self.epochs,
            batch_size=self.batch_size,
            grad_fn=grad_fn,
            sampler=sampler,
            opt_state=opt_state,
        )
        if canaries is None:
            return res, None
        seen, inner = res.opt_state
        return res.replace(opt_state=inner), seen
