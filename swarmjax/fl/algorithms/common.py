"""Pieces several algorithms share: the model messages, the masked weighted average (and
:func:`~swarmjax.fl.protocol.slot_sum`, re-exported), the trainer's client state, the
public test metrics, and record-level DP's calibration, buffer-overflow charge and
accounting (:class:`RecordLevel`)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PyTree

from swarmjax._validation import check_positive
from swarmjax.fl.client.training import LocalTraining, sample_rate
from swarmjax.fl.data.clients import ClientData, as_test_set, check_federated_inputs
from swarmjax.fl.data.store import ClientStore
from swarmjax.fl.protocol import Accounting, RunSpec, slot_sum, where_selected
from swarmjax.models import Model, evaluate
from swarmjax.privacy.accounting import Rates

__all__ = [
    "Aggregator",
    "ModelReply",
    "ModelServer",
    "RecordLevel",
    "Trainer",
    "check_model_inputs",
    "keep_if",
    "masked",
    "public_metrics",
    "record_level_noise",
    "slot_sum",
    "weighted_average",
]

Aggregator = Callable[[PyTree, Float[Array, " clients"]], PyTree]


@flax.struct.dataclass
class ModelServer:
    """Server state of the model-averaging algorithms: the global model and, with a server
    optimiser, its state."""

    params: PyTree
    opt_state: PyTree = ()


@flax.struct.dataclass
class ModelReply:
    """A client's model and its aggregation weight ``|D_i|`` (public, as ``q_i`` assumes)."""

    params: PyTree
    weight: Float[Array, ""]


@flax.struct.dataclass
class Trainer:
    """Client state of the model-averaging algorithms.

    Attributes:
        steps: ``()`` int32, the local (DP) steps taken so far: what the client's
            accountant counts (:meth:`RecordLevel.steps`).
        noise_multiplier: ``()`` float32 ``sigma_i`` of its DP steps (0 without
            record-level DP).
        loss: ``()`` mean loss of its last local training (nats), for the private
            diagnostics only.
    """

    steps: Int[Array, ""]
    noise_multiplier: Float[Array, ""]
    loss: Float[Array, ""]


def keep_if(cond: Bool[Array, ""], new: PyTree, old: PyTree) -> PyTree:
    """``new`` where ``cond`` else ``old``, leaf by leaf (e.g. keep the model when nobody
    replied)."""
    return jax.tree.map(lambda a, b: jnp.where(cond, a, b), new, old)


def masked(tree: PyTree, mask: Bool[Array, " N"]) -> PyTree:
    """Zero every unselected slot (leading client axis) with ``jnp.where``: whatever such a
    slot holds (NaN, inf) never reaches an arithmetic operation."""

    return where_selected(mask, tree, jax.tree.map(jnp.zeros_like, tree))


def weighted_average(client_params: PyTree, weights: Float[Array, " clients"]) -> PyTree:
    """FedAvg's server rule ``sum_i w_i theta_i / sum_i w_i`` leaf by leaf (client axis 0):
    the sum of ``w_i theta_i`` slot by slot (:func:`~swarmjax.fl.protocol.slot_sum`, the
    sum FedAvg's summed exchange folds) over the sum of the weights.

    A slot of weight 0 contributes nothing, whatever it holds (NaN included): the slots of
    positive weight are selected before any arithmetic, so a caller need not zero the
    unselected slots' models first (no masked copy of the stack)."""
    total = slot_sum(client_params, weights > 0, weights)
    w = jnp.sum(weights.astype(jnp.float32))
    return jax.tree.map(lambda t, leaf: (t / w).astype(leaf.dtype), total, client_params)


def public_metrics(
    model: Model, params: PyTree, test: tuple[Array, Array], eval_batch_size: int | None
) -> dict[str, Array]:
    """``test_loss`` (nats) and ``test_accuracy`` of ``params`` on the public test set."""
    loss, acc = evaluate(model.apply, params, *test, eval_batch_size)
    return {"test_loss": loss, "test_accuracy": acc}


def record_level_noise(
    training: LocalTraining, sizes: ArrayLike, spec: RunSpec, epsilon_target: float | None
) -> np.ndarray:
    """Record-level noise multipliers of a run: each client's plan
    (:meth:`~swarmjax.fl.client.training.LocalTraining.plans`) calibrated to the target.

    Args:
        training: the clients' local training (batch size ``B``, epochs ``E``, buffer).
        sizes: ``(clients,)`` rows per client ``|D_i|``.
        spec: the run's rounds, delta and accountant.
        epsilon_target: the epsilon each client may spend (``None`` or ``inf``: no noise);
            a finite target needs ``training.record_dp``.

    Returns:
        ``(clients,)`` float32 noise multipliers: client ``i`` spends ``epsilon_target``
        at ``spec.delta`` after ``spec.rounds`` rounds of ``E ceil(|D_i| / B)`` steps at
        ``q_i = B / |D_i|`` by ``spec.accountant``, the Poisson buffer's overflow charged
        to delta as the privacy record does; rounded UP to float32 (never less noise than
        calibrated). Equal client sizes share one calibration.
    """
    sizes = np.asarray(sizes)
    if epsilon_target is None or math.isinf(epsilon_target):
        return np.zeros(len(sizes), np.float32)
    check_positive("epsilon_target", epsilon_target)
    if training.record_dp is None:
        raise ValueError(
            f"epsilon_target must be inf without training.record_dp; got {epsilon_target}"
        )
    plans = training.plans(
        sizes, int(np.max(sizes)), rounds=spec.rounds, delta=spec.delta, accountant=spec.accountant
    )
    sigma = {}
    for n, plan in plans.items():
        tuned = plan.calibrate(epsilon_target)
        sigma[n] = tuned.noise_multiplier
        if plan.overflow_prob > 0 and tuned.epsilon() < 0.9 * epsilon_target:
            warnings.warn(
                f"target_epsilon={epsilon_target} is out of reach for a client of {n} rows: "
                f"the Poisson buffer's overflow ({plan.overflow_prob:.1e} per step, charged "
                "with its e^epsilon factor) caps epsilon lower, so the noise is larger than "
                "needed; size the buffer for the run with RecordDP.for_run",
                stacklevel=2,
            )
    s = np.asarray([sigma[int(n)] for n in sizes], np.float64)
    s32 = s.astype(np.float32)
    return np.where(s32 < s, np.nextafter(s32, np.float32(np.inf)), s32).astype(np.float32)


def check_model_inputs(model: Model, clients: Any, test: tuple[Array, Array] | None) -> None:
    """Model, client data (stacked ``ClientData`` or a flat ``ClientStore``) and test set
    (``None``: not checked) against each other: shapes, classes, labels."""
    if isinstance(clients, ClientData | ClientStore):
        check_federated_inputs(model, clients, None if test is None else as_test_set(test))


def check_in_client_audit(audit: Any, training: LocalTraining, model: Model, no_dp: str) -> None:
    """One ``ValueError`` line naming the option unless an algorithm's own record-level
    ``audit`` can run: a :class:`~swarmjax.privacy.canaries.CanaryAudit`, a record-level
    private run (``training.record_dp``; ``no_dp`` says what the run is without it), score
    ``"gradient"`` and at most the model's parameter count of canaries (shapes only: no
    work)."""
    from swarmjax.privacy.canaries import CanaryAudit

    if not isinstance(audit, CanaryAudit):
        raise ValueError(f"audit must be a CanaryAudit or None; got {type(audit).__name__}")
    if training.record_dp is None:
        raise ValueError(f"audit needs a private run: training.record_dp is None ({no_dp})")
    like = jax.eval_shape(model.init, jax.random.key(0))
    audit.check_for("in-client record", sum(int(np.prod(a.shape)) for a in jax.tree.leaves(like)))


def in_client_audit_reports(audit: Any, result: Any) -> tuple[Any, ...]:
    """Each run's :class:`~swarmjax.privacy.canaries.CanaryReport` of a finished
    :func:`~swarmjax.fl.runtime.simulate` call (``result``) whose clients carried record-level
    canaries (``result.clients.canaries``: a
    :class:`~swarmjax.privacy.canaries.ClientCanaries` with ``(runs, clients, M)`` scores):
    every client's ``M`` scores over its public noise scale ``sigma_i sqrt(T_i)`` (its noise
    multiplier and accounted steps ``T_i``, from the privacy record), pooled (``N M``
    canaries), against the run's largest client epsilon
    (:func:`~swarmjax.privacy.canaries.pooled_record_report`)."""
    from swarmjax.privacy.canaries import accounted_curve, pooled_record_report

    if audit is None:
        raise ValueError("audit_reports needs an audited algorithm (audit=CanaryAudit(...))")
    c = result.clients.canaries
    scores, included = np.asarray(c.scores), np.asarray(c.included)
    record = result.privacy
    steps = np.asarray(record.steps)[:, -1]
    scale = np.asarray(record.noise_multiplier) * np.sqrt(np.maximum(steps, 1))
    return tuple(
        pooled_record_report(
            scores[r],
            included[r],
            scale[r],
            audit=audit,
            epsilon=float(np.max(record.final_epsilon[r])),
            delta=float(record.delta),
            accounted=accounted_curve(record, r),
        )
        for r in range(scores.shape[0])
    )


def with_audit_reports(result: Any, reports: tuple[Any, ...]) -> Any:
    """``result`` (a :class:`~swarmjax.fl.runtime.result.Result`) with ``reports`` in
    ``Result.audit`` and their dicts in the privacy record's ``audit`` (so the ledger's
    releases carry them, as a client-level ``simulate(audit=...)`` does)."""
    import dataclasses

    record = dataclasses.replace(result.privacy, audit=tuple(r.to_dict() for r in reports))
    return dataclasses.replace(result, privacy=record, audit=reports)


@dataclass(frozen=True)
class RecordLevel(Accounting):
    """The accounting of local training (FedAvg, Fed-DP-PSO): each client counts its own
    DP steps (``client_state.steps``); their ``q_i = B / |D_i|`` and ``sigma_i`` (the
    variant's ``noise_multiplier``) are the plan's, read on the host (:meth:`rates`).
    With ``training.record_dp`` (DP-SGD/DP-Adam) the unit is the record, its Poisson batch
    buffer's overflow is charged to delta and canaries the clients carry (``audit``) are
    scored when the run finishes; without it the unit is ``None``: the steps are counted
    and stated, no claim is made.

    Attributes:
        training: the clients' :class:`~swarmjax.fl.client.training.LocalTraining` (its
            ``record_dp`` set).
        audit: the in-client :class:`~swarmjax.privacy.canaries.CanaryAudit`, or ``None``.
        releases: ``(a, b)``: each client makes ``a`` other noised releases when it starts
            and ``b`` a round, each at the variant's ``score_epsilon`` (Fed-DP-PSO's
            scores); ``(0, 0)``: none.
    """

    training: LocalTraining
    audit: Any = None
    releases: tuple[int, int] = (0, 0)

    @property
    def unit(self) -> str | None:  # type: ignore[override]
        return "record" if self.training.record_dp is not None else None

    def steps(self, server: PyTree, client_state: Any) -> Int[Array, ""]:
        del server
        return client_state.steps

    def rates(
        self, hyper: Any, rounds: int, num_clients: int, sizes: np.ndarray | None = None
    ) -> Rates:
        """``q_i = B / |D_i|`` (float32, as the clients' DP steps draw their batches) and
        ``sigma_i`` ``(R, N)``, the ``(N,)`` overflow chance of each client's Poisson batch
        buffer (:meth:`~swarmjax.fl.client.training.LocalTraining.sampler_overflow`; a
        buffer of the padded length never overflows) and the other releases' epsilon
        ``(R, T, 1)``; ``q = sigma = 0`` and no overflow without ``training.record_dp``."""
        del num_clients
        extra = None
        if self.releases != (0, 0):  # summed in float32, release by release, round by round
            eps = np.asarray(hyper.score_epsilon, np.float32).reshape(-1, 1, 1)
            done = np.float32(self.releases[0]) * eps
            per_round = np.float32(self.releases[1]) * eps
            extra = np.concatenate([done := done + per_round for _ in range(rounds)], axis=1)
        sigma = np.asarray(hyper.noise_multiplier)
        if self.training.record_dp is None:
            return Rates(np.zeros_like(sigma), np.zeros_like(sigma), None, extra)
        if sizes is None:
            raise ValueError("sizes: record-level accounting needs the clients' row counts")
        sizes = np.asarray(sizes, np.int64).reshape(-1)
        q = np.asarray(sample_rate(jnp.asarray(sizes), self.training.batch_size), np.float32)
        over = self.training.sampler_overflow(sizes, int(sizes.max()))
        return Rates(np.broadcast_to(q, sigma.shape), sigma, over, extra)

    def audited(self, result: Any) -> Any:
        """``result`` with each run's pooled record-level canary report
        (:func:`in_client_audit_reports`) in ``Result.audit`` and the privacy record."""
        if self.audit is None:  # not audited: the result as it is
            return result
        return with_audit_reports(result, in_client_audit_reports(self.audit, result))
