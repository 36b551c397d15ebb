"""Client-level DP-FedAvg (McMahan et al. 2018), fixed or adaptive clipping (Andrew et al. 2021).

Each round ``t`` (spec section 4):

1. **Poisson client sampling.** Every one of the ``N`` clients takes part independently with
   probability ``q_c``. Shapes stay static: the sampled ids go into a buffer of
   ``capacity`` slots with a mask (:func:`swarmjax.privacy.sampling.poisson_sample`; the
   capacity makes an overflow less likely than ``1e-9`` and an overflowing draw is redrawn,
   never truncated), and only the buffer's clients are trained.
2. Each sampled client trains locally from ``w_t`` and sends ``Delta_k = w_k - w_t``.
3. The server clips each ``Delta_k`` to L2 norm ``C_t`` (over the whole pytree), sums,
   adds ``N(0, sigma_Delta^2 C_t^2)`` to every coordinate and divides by the *expected*
   number of clients ``q_c N`` (so one client's influence is bounded whatever the draw).
4. The averaged update is applied by a server optimiser (SGD with learning rate
   ``server_lr``, optionally with momentum): ``w_{t+1} = w_t + server_lr * mean``.
5. **Adaptive clipping** (``clip_lr > 0``): ``C_{t+1} = C_t exp(-clip_lr (b_t - gamma))``,
   where ``b_t = (sum_k (1[||Delta_k|| <= C_t] - 1/2) + N(0, sigma_b^2)) / (q_c N) + 1/2``
   is the noised fraction of sampled clients whose update was not clipped. Fixed clipping is
   the case ``clip_lr = 0`` (then no count query is made and nothing is added to the cost).

Privacy (client-level: neighbouring federations differ by adding or removing ONE client
with all of its data). The sum query has L2 sensitivity ``C_t`` and noise multiplier
``sigma_Delta``; the centred count query has sensitivity ``1/2`` and noise ``sigma_b``, i.e.
noise multiplier ``2 sigma_b``. Both run on the same Poisson sample, so the pair is one
Gaussian mechanism on the concatenated (rescaled) vector with noise multiplier

    z = (sigma_Delta^-2 + (2 sigma_b)^-2)^(-1/2)       (:func:`effective_noise_multiplier`)

(Andrew et al. 2021, Thm 1; TFF's ``gaussian_adaptive``). swarmjax takes ``z`` — the
``noise_multiplier`` — as the privacy parameter and derives the sum's noise

    sigma_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)        (:func:`sum_noise_multiplier`),

which needs ``2 sigma_b > z``. The accountant then sees ``rounds`` steps of the
Poisson-subsampled Gaussian mechanism with rate ``q_c`` and multiplier ``z``, for fixed and
adaptive clipping alike: at equal ``z`` both have the same epsilon, the adaptive run pays by a
slightly larger ``sigma_Delta``.

Layers: :func:`dp_fedavg_round` (pure, one round) -> :func:`dp_fedavg_rounds` (scan) ->
:func:`dp_fedavg_run` (init + scan, vmappable over keys and hyper-parameters) ->
:func:`run_dp_fedavg` (validation, one jit, vmap over seeds, epsilon and bytes per round).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray, PyTree

from swarmjax._validation import (
    check_choice,
    check_int,
    check_positive,
    check_range,
)
from swarmjax.fl import comm
from swarmjax.fl._runner import (
    TestSet,
    check_run_inputs,
    history_frame,
    run_from_key,
    run_over_seeds,
    scan_rounds,
)
from swarmjax.fl.clients import ClientData
from swarmjax.fl.local import GradFn, Sampler, local_train
from swarmjax.models import Model, evaluate
from swarmjax.privacy.accounting import PrivacyAccountant
from swarmjax.privacy.mechanisms import gaussian_mechanism
from swarmjax.privacy.sampling import poisson_capacity, poisson_sample

__all__ = [
    "CLIPPING",
    "DPFedAvgConfig",
    "DPFedAvgHyper",
    "DPFedAvgResult",
    "DPFedAvgState",
    "PrivacySpec",
    "adaptive_clip_update",
    "clip_updates",
    "default_count_noise",
    "dp_fedavg_hyper",
    "dp_fedavg_init",
    "dp_fedavg_round",
    "dp_fedavg_rounds",
    "dp_fedavg_run",
    "effective_noise_multiplier",
    "epsilon_per_round",
    "global_norm",
    "rounds_to_target",
    "run_dp_fedavg",
    "sum_noise_multiplier",
]

CLIPPING = ("fixed", "adaptive")


# --------------------------------------------------------------------------- noise algebra


def effective_noise_multiplier(sum_noise: ArrayLike, count_noise: ArrayLike) -> Array:
    """Accounted multiplier ``z = (sigma_Delta^-2 + (2 sigma_b)^-2)^(-1/2)`` of sum + count.

    ``sum_noise`` is the sum query's noise multiplier (noise std / ``C_t``), ``count_noise``
    the std of the noise on the centred clipped count (sensitivity 1/2). ``0`` in either
    gives ``z = 0`` (no privacy).
    """
    s = jnp.asarray(sum_noise, jnp.float32)
    b = 2.0 * jnp.asarray(count_noise, jnp.float32)
    return jnp.where((s > 0) & (b > 0), (s**-2 + b**-2) ** -0.5, 0.0)


def sum_noise_multiplier(noise_multiplier: ArrayLike, count_noise: ArrayLike) -> Array:
    """Sum-query multiplier ``sigma_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)`` for an accounted ``z``.

    Inverse of :func:`effective_noise_multiplier`; needs ``2 sigma_b > z`` (NaN otherwise,
    which :func:`dp_fedavg_hyper` rejects). ``z = 0`` gives ``0``.
    """
    z = jnp.asarray(noise_multiplier, jnp.float32)
    b = 2.0 * jnp.asarray(count_noise, jnp.float32)
    safe_z = jnp.where(z > 0, z, 1.0)
    return jnp.where(z > 0, (safe_z**-2 - b**-2) ** -0.5, 0.0)


def default_count_noise(expected_clients: float, noise_multiplier: float = 0.0) -> float:
    """Count noise ``sigma_b = max(m / 20, z)``, ``m = q_c N`` the expected clients.

    ``m / 20`` is Andrew et al.'s (and TFF's) default; with few clients per round it can be
    below ``z / 2`` (not allowed), so it is raised to ``z``, which costs the sum query
    ``sqrt(4/3) - 1 = 15 %`` more noise.
    """
    check_positive("expected_clients", expected_clients)
    check_range("noise_multiplier", noise_multiplier, 0.0, math.inf, high_open=True)
    return max(0.05 * float(expected_clients), float(noise_multiplier))


# ---------------------------------------------------------------------- clipping primitives


def global_norm(tree: PyTree) -> Float[Array, ""]:
    """L2 norm over every coordinate of every leaf of ``tree``."""
    return jnp.sqrt(
        sum(jnp.sum(jnp.square(leaf.astype(jnp.float32))) for leaf in jax.tree.leaves(tree))
    )


def clip_updates(
    deltas: PyTree, clip: Float[ArrayLike, ""], mask: Bool[Array, " m"]
) -> tuple[PyTree, Float[Array, " m"]]:
    """Clip each client's update to L2 norm ``<= clip`` and zero the masked-out slots.

    Args:
        deltas: updates with a leading client axis ``(m, ...)`` on every leaf.
        clip: ``C_t > 0``.
        mask: ``(m,)`` True for the clients that take part.

    Returns:
        ``(clipped, norms)``: the clipped updates (same shapes; ``Delta_k min(1, C/||Delta_k||)``,
        0 where ``~mask``) and the pre-clipping norms ``(m,)``.
    """
    norms = jax.vmap(global_norm)(deltas)
    scale = jnp.minimum(1.0, clip / jnp.maximum(norms, 1e-12))
    scale = jnp.where(mask, scale, 0.0)

    def apply(leaf: Array) -> Array:
        return (leaf * scale.reshape((-1,) + (1,) * (leaf.ndim - 1))).astype(leaf.dtype)

    return jax.tree.map(apply, deltas), norms


def adaptive_clip_update(
    key: PRNGKeyArray,
    clip: Float[ArrayLike, ""],
    norms: Float[Array, " m"],
    mask: Bool[Array, " m"],
    *,
    expected_clients: Float[ArrayLike, ""],
    count_noise: Float[ArrayLike, ""],
    target_quantile: Float[ArrayLike, ""],
    clip_lr: Float[ArrayLike, ""],
) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """Geometric quantile step of Andrew et al. (2021): ``(C_{t+1}, b_t)``.

    ``b_t = (sum_k mask_k (1[norm_k <= C] - 1/2) + N(0, count_noise^2)) / expected + 1/2``
    estimates the fraction of unclipped updates; ``C_{t+1} = C exp(-clip_lr (b_t - gamma))``.
    ``clip_lr = 0`` keeps ``C`` exactly (fixed clipping).
    """
    centred = jnp.where(mask, (norms <= clip).astype(jnp.float32) - 0.5, 0.0)
    noisy = jnp.sum(centred) + count_noise * jax.random.normal(key, (), jnp.float32)
    below = noisy / expected_clients + 0.5
    return clip * jnp.exp(-clip_lr * (below - target_quantile)), below


# ------------------------------------------------------------------------ state and config


@flax.struct.dataclass
class DPFedAvgState:
    """Global model, server optimiser state, current clip norm ``C_t`` and round counter."""

    params: PyTree
    opt_state: PyTree
    clip: Float[Array, ""]
    round: Int[Array, ""]


@flax.struct.dataclass
class DPFedAvgHyper:
    """Numeric hyper-parameters (array leaves, vmappable); build with :func:`dp_fedavg_hyper`.

    Attributes:
        client_lr: local learning rate (feeds ``config.client_optimizer``).
        server_lr: server learning rate on the averaged update.
        sample_rate: ``q_c``, Poisson client sampling rate in ``(0, 1]``.
        noise_multiplier: ``z``, the accounted multiplier (sum + count query together).
        count_noise: ``sigma_b``, std of the noise on the clipped count (clients).
        initial_clip: ``C_0`` (the fixed ``C`` when ``clip_lr = 0``).
        target_quantile: ``gamma`` in ``(0, 1)``.
        clip_lr: ``eta_C >= 0``; ``0`` is fixed clipping.
    """

    client_lr: Float[Array, ""]
    server_lr: Float[Array, ""]
    sample_rate: Float[Array, ""]
    noise_multiplier: Float[Array, ""]
    count_noise: Float[Array, ""]
    initial_clip: Float[Array, ""]
    target_quantile: Float[Array, ""]
    clip_lr: Float[Array, ""]

    @property
    def adaptive(self) -> Array:
        """True where the clip norm adapts (and the count query is made)."""
        return self.clip_lr > 0

    @property
    def sum_noise(self) -> Array:
        """``sigma_Delta``: ``z`` for fixed clipping, :func:`sum_noise_multiplier` otherwise."""
        adaptive_sigma = sum_noise_multiplier(self.noise_multiplier, self.count_noise)
        return jnp.where(self.adaptive, adaptive_sigma, self.noise_multiplier)


def dp_fedavg_hyper(
    *,
    sample_rate: float,
    noise_multiplier: float,
    clip: float = 0.1,
    clipping: str = "adaptive",
    target_quantile: float = 0.5,
    clip_lr: float = 0.2,
    count_noise: float = 0.0,
    client_lr: float = 0.1,
    server_lr: float = 1.0,
) -> DPFedAvgHyper:
    """Validated :class:`DPFedAvgHyper` (``ValueError`` naming the parameter otherwise).

    ``clipping="fixed"`` sets ``clip_lr = 0`` and ``count_noise = 0`` (no count query).
    For ``"adaptive"`` with ``noise_multiplier > 0``, ``count_noise`` must exceed
    ``noise_multiplier / 2`` (see :func:`sum_noise_multiplier`).
    """
    check_choice("clipping", clipping, CLIPPING)
    check_range("sample_rate", sample_rate, 0.0, 1.0, low_open=True)
    check_range("noise_multiplier", noise_multiplier, 0.0, math.inf, high_open=True)
    check_range("clip", clip, 0.0, math.inf, low_open=True, high_open=True)
    check_range("target_quantile", target_quantile, 0.0, 1.0, low_open=True, high_open=True)
    check_range("clip_lr", clip_lr, 0.0, math.inf, high_open=True)
    check_range("count_noise", count_noise, 0.0, math.inf, high_open=True)
    check_positive("client_lr", client_lr)
    check_positive("server_lr", server_lr)
    if clipping == "fixed":
        clip_lr, count_noise = 0.0, 0.0
    elif np.any(np.asarray(noise_multiplier) > 0) and not np.all(
        2.0 * np.asarray(count_noise) > np.asarray(noise_multiplier)
    ):
        raise ValueError(
            "count_noise must be > noise_multiplier / 2 for adaptive clipping (the count "
            f"query cannot cost more than the whole budget); got count_noise={count_noise!r}, "
            f"noise_multiplier={noise_multiplier!r}"
        )
    f = partial(jnp.asarray, dtype=jnp.float32)
    return DPFedAvgHyper(
        client_lr=f(client_lr),
        server_lr=f(server_lr),
        sample_rate=f(sample_rate),
        noise_multiplier=f(noise_multiplier),
        count_noise=f(count_noise),
        initial_clip=f(clip),
        target_quantile=f(target_quantile),
        clip_lr=f(clip_lr),
    )


@dataclass(frozen=True)
class DPFedAvgConfig:
    """Static settings of DP-FedAvg; hashable (a jit static argument).

    Attributes:
        model: the ``(init, apply)`` pair.
        capacity: client buffer size (static); ``None``: all ``N`` clients (always safe).
            :func:`run_dp_fedavg` sets it from :func:`poisson_capacity`.
        local_epochs, batch_size: local training (E epochs of batches of B).
        client_optimizer: ``client_lr -> optax`` (fresh state each round).
        server_momentum: momentum of the server SGD (0: plain averaging step).
        grad_fn, sampler: local training hooks (see :mod:`swarmjax.fl.local`).
        eval_batch_size: chunk size for test evaluation (None: one pass).
    """

    model: Model
    capacity: int | None = None
    local_epochs: int = 1
    batch_size: int = 10
    client_optimizer: Callable[[Any], optax.GradientTransformation] = optax.sgd
    server_momentum: float = 0.0
    grad_fn: GradFn | None = None
    sampler: Sampler | None = None
    eval_batch_size: int | None = None

    def server_optimizer(self, server_lr: Array) -> optax.GradientTransformation:
        """SGD on ``-mean update`` (so ``lr = 1``, no momentum, adds the mean update)."""
        return optax.sgd(server_lr, momentum=self.server_momentum or None)


# ------------------------------------------------------------------------------ algorithm


def dp_fedavg_init(
    key: PRNGKeyArray, hyper: DPFedAvgHyper, config: DPFedAvgConfig
) -> DPFedAvgState:
    """Fresh model ``config.model.init(key)``, server optimiser state, ``C_0``, round 0."""
    params = config.model.init(key)
    return DPFedAvgState(
        params=params,
        opt_state=config.server_optimizer(hyper.server_lr).init(params),
        clip=jnp.asarray(hyper.initial_clip, jnp.float32),
        round=jnp.zeros((), jnp.int32),
    )


def _train_sampled(
    state: DPFedAvgState,
    key: PRNGKeyArray,
    hyper: DPFedAvgHyper,
    clients: ClientData,
    ids: Int[Array, " m"],
    config: DPFedAvgConfig,
):
    """Local training of the buffered clients ``ids``; client ``i`` uses ``fold_in(key, i)``."""
    sub = jax.tree.map(lambda a: a[ids], clients)

    def one(data: ClientData, cid: Int[Array, ""]):
        return local_train(
            state.params,
            data,
            jax.random.fold_in(key, cid),
            apply_fn=config.model.apply,
            optimizer=config.client_optimizer(hyper.client_lr),
            epochs=config.local_epochs,
            batch_size=config.batch_size,
            grad_fn=config.grad_fn,
            sampler=config.sampler,
        )

    return jax.vmap(one)(sub, ids)


def dp_fedavg_round(
    state: DPFedAvgState,
    key: PRNGKeyArray,
    hyper: DPFedAvgHyper,
    clients: ClientData,
    test: TestSet,
    *,
    config: DPFedAvgConfig,
) -> tuple[DPFedAvgState, dict[str, Array]]:
    """One DP-FedAvg round (pure). ``key`` is this round's key.

    Metrics (scalars): ``test_loss`` (nats), ``test_accuracy``, ``train_loss`` (mean local
    loss of the participants), ``clip_norm`` (``C_t`` used), ``fraction_clipped`` and
    ``median_update_norm`` (of the participants; diagnostics, NOT released under DP),
    ``noisy_unclipped_fraction`` (``b_t``, private), ``participants`` (``m_t``).
    """
    n = clients.sizes.shape[0]
    capacity = n if config.capacity is None else config.capacity
    k_train, k_sample, k_noise, k_count = (jax.random.fold_in(key, i) for i in range(4))
    ids, mask, _ = poisson_sample(k_sample, hyper.sample_rate, jnp.ones(n, bool), capacity)
    local = _train_sampled(state, k_train, hyper, clients, ids, config)

    deltas = jax.tree.map(lambda w, w0: w - w0, local.params, state.params)
    clipped, norms = clip_updates(deltas, state.clip, mask)
    total = jax.tree.map(lambda leaf: jnp.sum(leaf, axis=0), clipped)
    noisy = gaussian_mechanism(
        k_noise, total, l2_sensitivity=state.clip, noise_multiplier=hyper.sum_noise
    )
    expected = hyper.sample_rate * n
    mean_update = jax.tree.map(lambda leaf: leaf / expected, noisy)

    opt = config.server_optimizer(hyper.server_lr)
    neg = jax.tree.map(jnp.negative, mean_update)
    updates, opt_state = opt.update(neg, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new_clip, below = adaptive_clip_update(
        k_count,
        state.clip,
        norms,
        mask,
        expected_clients=expected,
        count_noise=hyper.count_noise,
        target_quantile=hyper.target_quantile,
        clip_lr=hyper.clip_lr,
    )

    m = jnp.sum(mask)
    test_loss, test_acc = evaluate(config.model.apply, params, *test, config.eval_batch_size)
    metrics = {
        "test_loss": test_loss,
        "test_accuracy": test_acc,
        "train_loss": jnp.sum(jnp.where(mask, local.loss, 0.0)) / jnp.maximum(m, 1),
        "clip_norm": state.clip,
        "fraction_clipped": jnp.sum(mask & (norms > state.clip)) / jnp.maximum(m, 1),
        "median_update_norm": jnp.nanmedian(jnp.where(mask, norms, jnp.nan)),
        "noisy_unclipped_fraction": below,
        "participants": m.astype(jnp.int32),
    }
    new_state = DPFedAvgState(
        params=params, opt_state=opt_state, clip=new_clip, round=state.round + 1
    )
    return new_state, metrics


def dp_fedavg_rounds(
    state: DPFedAvgState,
    key: PRNGKeyArray,
    hyper: DPFedAvgHyper,
    clients: ClientData,
    test: TestSet,
    *,
    config: DPFedAvgConfig,
    rounds: int,
) -> tuple[DPFedAvgState, dict[str, Array]]:
    """Scan ``rounds`` rounds; round ``t`` (from ``state.round``) uses ``fold_in(key, t)``."""
    return scan_rounds(
        dp_fedavg_round, state, key, (hyper, clients, test), config=config, rounds=rounds
    )


def dp_fedavg_run(
    key: PRNGKeyArray,
    hyper: DPFedAvgHyper,
    clients: ClientData,
    test: TestSet,
    *,
    config: DPFedAvgConfig,
    rounds: int,
) -> tuple[DPFedAvgState, dict[str, Array]]:
    """A whole run from one key (init, then ``rounds`` rounds); vmap it over keys/hypers.

    The key is split as in :func:`swarmjax.fl.fedavg.fedavg_run`, so a seed starts from the
    same initial model in both.
    """
    args = (hyper, clients, test)
    return run_from_key(
        dp_fedavg_init, dp_fedavg_round, key, (hyper,), args, config=config, rounds=rounds
    )


# --------------------------------------------------------------------------------- runner


@dataclass(frozen=True)
class PrivacySpec:
    """What a run's epsilon covers and the numbers it was computed from."""

    sample_rate: float
    noise_multiplier: float
    sum_noise: float
    count_noise: float
    delta: float
    rounds: int
    clipping: str
    accountant: str = "rdp"
    adjacency: str = "client-level: add/remove one client with all of its examples"


@dataclass(frozen=True)
class DPFedAvgResult:
    """Output of :func:`run_dp_fedavg`: final state (seed axis), history, privacy spec."""

    state: DPFedAvgState
    history: pd.DataFrame
    seeds: list[int]
    privacy: PrivacySpec


def epsilon_per_round(
    sample_rate: float, noise_multiplier: float, rounds: int, delta: float, accountant: str = "rdp"
) -> np.ndarray:
    """Cumulative client-level epsilon after rounds ``1..rounds`` (float64, ``(rounds,)``)."""
    rounds = check_int("rounds", rounds, 1)
    acc = PrivacyAccountant(accountant=accountant)
    out = np.empty(rounds)
    for t in range(rounds):
        acc.step(sample_rate, noise_multiplier)
        out[t] = acc.epsilon(delta)
    return out


def rounds_to_target(
    history: pd.DataFrame, target: float, column: str = "test_accuracy", *, higher: bool = True
) -> pd.Series:
    """First round (per seed) at which ``column`` reaches ``target`` (``>=``; ``<=`` when
    ``higher=False``, e.g. for a loss); NaN for a seed that never does."""

    def first(frame: pd.DataFrame) -> float:
        hit = frame[column] >= target if higher else frame[column] <= target
        rounds = frame.loc[hit, "round"]
        return float(rounds.min()) if len(rounds) else math.nan

    return history.groupby("seed")[["round", column]].apply(first).rename("rounds_to_target")


def run_dp_fedavg(
    config: DPFedAvgConfig,
    clients: ClientData,
    test: tuple[ArrayLike, ArrayLike],
    *,
    rounds: int,
    sample_rate: float,
    noise_multiplier: float,
    clipping: str = "adaptive",
    clip: float = 0.1,
    target_quantile: float = 0.5,
    clip_lr: float = 0.2,
    count_noise: float | None = None,
    client_lr: float = 0.1,
    server_lr: float = 1.0,
    delta: float | None = None,
    seeds: int | Sequence[int] = 0,
    rounds_per_call: int | None = None,
    progress: bool = False,
    overflow_prob: float = 1e-9,
) -> DPFedAvgResult:
    """Run DP-FedAvg for every seed at once (vmap) and return history and privacy spec.

    ``count_noise=None`` uses :func:`default_count_noise` (``max(q_c N / 20, z)``); ``delta=None``
    uses ``N^-1.1`` (below ``1/N``, as the client-level guarantee needs). History columns:
    ``seed, round``, the round metrics, ``epsilon`` (cumulative, client-level),
    ``bytes_up, bytes_down`` (participants x model bytes, + 4 bytes per participant for the
    clipped-count bit of adaptive clipping) and their cumulative sums, and ``bits_volume``
    (``m_t d 32``, the spec's ``T m d bits`` summed so far).
    """
    check_int("rounds", rounds, 1)
    check_int("local_epochs", config.local_epochs, 1)
    check_range("server_momentum", config.server_momentum, 0.0, 1.0, high_open=True)
    check_choice("clipping", clipping, CLIPPING)
    check_range("sample_rate", sample_rate, 0.0, 1.0, low_open=True)
    n = clients.num_clients
    expected = float(sample_rate) * n
    if count_noise is None:
        count_noise = default_count_noise(expected, noise_multiplier)
    delta = n**-1.1 if delta is None else delta
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    hyper = dp_fedavg_hyper(
        sample_rate=sample_rate,
        noise_multiplier=noise_multiplier,
        clip=clip,
        clipping=clipping,
        target_quantile=target_quantile,
        clip_lr=clip_lr,
        count_noise=count_noise,
        client_lr=client_lr,
        server_lr=server_lr,
    )
    rounds, test = check_run_inputs(
        config.model, clients, test, rounds=rounds, batch_size=config.batch_size
    )
    if config.capacity is None:
        config = _with_capacity(config, n, sample_rate, overflow_prob)

    states, metrics, seed_list = run_over_seeds(
        dp_fedavg_init,
        dp_fedavg_round,
        seeds,
        rounds,
        init_args=(hyper,),
        args=(hyper, clients, test),
        config=config,
        rounds_per_call=rounds_per_call,
        progress=progress,
        desc="DP-FedAvg",
    )
    spec = PrivacySpec(
        sample_rate=float(sample_rate),
        noise_multiplier=float(noise_multiplier),
        sum_noise=float(hyper.sum_noise),
        count_noise=float(hyper.count_noise),
        delta=float(delta),
        rounds=rounds,
        clipping=clipping,
    )
    eps = epsilon_per_round(sample_rate, noise_multiplier, rounds, delta)
    history = history_frame(seed_list, metrics, {"epsilon": eps}, "round")
    _add_bytes(history, config.model, count_bit=clipping == "adaptive")
    return DPFedAvgResult(state=states, history=history, seeds=seed_list, privacy=spec)


def _with_capacity(
    config: DPFedAvgConfig, n: int, q: float, overflow_prob: float
) -> DPFedAvgConfig:
    return replace(config, capacity=poisson_capacity(n, q, overflow_prob))


def _add_bytes(history: pd.DataFrame, model: Model, *, count_bit: bool) -> None:
    """Per-round bytes from the realised participants (sampled clients only move models)."""
    shapes = jax.eval_shape(model.init, jax.random.key(0))
    model_bytes = comm.model_bytes(shapes)
    d = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(shapes))
    m = history["participants"].to_numpy(np.int64)
    history["bytes_up"] = m * (model_bytes + (4 if count_bit else 0))
    history["bytes_down"] = m * model_bytes
    by_seed = history.groupby("seed")
    history["cum_bytes_up"] = by_seed["bytes_up"].cumsum()
    history["cum_bytes_down"] = by_seed["bytes_down"].cumsum()
    history["bits_volume"] = m * d * 32
    history["bits_volume"] = history.groupby("seed")["bits_volume"].cumsum()
