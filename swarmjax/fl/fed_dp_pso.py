"""Fed-DP-PSO (seed 000; ALGORITHMS.md section 2): a swarm per client, DP-Adam, random top-3.

Every client ``i`` holds a swarm of ``S`` particles (full models; :mod:`swarmjax.swarm`,
leaves ``(clients, S, ...)``: all clients and particles run under one vmap). Per round:

1. (Algorithm 1, every client) PSO move toward the personal bests and the server's gbest
   (``swarm.move(..., social_target=gbest)``); evaluate every particle on ``D_i`` (masked);
   update pbest; refine the best particle with DP-Adam for ``E`` epochs of Poisson batches
   (``q_i = B / |D_i|``; :mod:`swarmjax.fl.dp_local`); re-evaluate, update its pbest; report
   ``min_j pbest_loss_j`` (one float).
2. (Algorithm 2, server) sort the ``N`` reports, pick ``k`` uniformly among the top
   ``min(top_k, N)`` (``top_k = 3``), ``gbest <- `` client ``k``'s best pbest; broadcast.

Privacy (be honest): with ``private_selection=False`` (the paper's algorithm) the accountant
covers the DP-Adam steps only; the reported losses and the pbest/argmin selections use
exact losses on private data and are NOT covered. With ``private_selection=True`` every loss
a client computes on its data (the ``S`` evaluations after each move, the re-evaluation of
the refined particle and the initial ``S``) is the mean of per-example losses clipped to
``[0, loss_bound]`` plus ``Laplace(loss_bound / (|D_i| eps_1))`` (sensitivity
``loss_bound / |D_i|`` under replace-one adjacency with ``|D_i|`` public, as ``q_i`` already
assumes); all decisions use only these noisy values, so by basic composition the
client's end-to-end guarantee is ``(eps_DP-Adam + n_releases eps_1, delta)``.

Not implemented: the paper's eq. 12 variant (a gradient step for every particle inside the
move); the default, Algorithm 1, refines only the best particle.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray, PyTree

from swarmjax import swarm
from swarmjax._validation import check_choice, check_int, check_positive
from swarmjax.fl import comm
from swarmjax.fl._runner import history_frame, run_chunked, seed_keys
from swarmjax.fl.clients import ClientData, poisson_rates
from swarmjax.fl.dp_local import (
    DELTA,
    calibrate_sigmas,
    dp_grad_fn,
    epsilon_history,
    poisson_sampler,
    sampler_capacity,
    steps_per_round,
)
from swarmjax.fl.fedavg import check_federated_inputs
from swarmjax.fl.local import LocalResult, local_train
from swarmjax.models import Model, cross_entropy, evaluate

__all__ = [
    "COVERAGE_PAPER",
    "COVERAGE_PRIVATE_SELECTION",
    "FedDPPSOConfig",
    "FedDPPSOHyper",
    "FedDPPSOResult",
    "FedDPPSOState",
    "client_round",
    "fed_dp_pso_init",
    "fed_dp_pso_round",
    "fed_dp_pso_rounds",
    "make_optimizer",
    "particle_losses",
    "refine",
    "run_fed_dp_pso",
    "selection_releases",
    "server_select",
]

TestSet = tuple[Array, Array]

COVERAGE_PAPER = (
    "epsilon covers the DP-Adam refinement steps only (Poisson rate q_i, noise sigma_i, "
    "RDP accountant); it does NOT cover the exact reported losses or the pbest/argmin "
    "selections, which use exact losses on private data"
)
COVERAGE_PRIVATE_SELECTION = (
    "epsilon is end-to-end per client: DP-Adam steps (RDP, delta) + every loss released or "
    "used for a selection (clipped mean loss + Laplace noise), by basic composition"
)


@dataclass(frozen=True)
class FedDPPSOConfig:
    """Static settings (hashable; a jit static argument).

    Attributes:
        model: the ``(init, apply)`` pair.
        particles: ``S``, particles per client.
        local_epochs: ``E``, DP-Adam epochs per round on the best particle.
        batch_size: ``B``, expected Poisson batch size (``q_i = B / |D_i|``).
        dp: True: DP-Adam (clip, noise, Poisson batches); False: plain optimiser on shuffled
            batches, no clipping, no noise (epsilon = inf). The runner sets it.
        clip_norm: ``C``, per-example L2 clipping norm.
        optimizer: ``"adam"`` (AdamW with ``weight_decay``) or ``"sgd"``.
        weight_decay: ``lambda`` of the paper's eq. 10.
        top_k: the server picks uniformly among the best ``min(top_k, N)`` clients.
        pso_options: ``swarm.PSOOptions`` (``coefficients="element"`` for elementwise r1, r2).
        private_selection: privatise every loss evaluation (see module docs).
        loss_bound: ``L_max``, per-example loss clip for ``private_selection`` (nats).
        capacity: Poisson buffer size (None: the runner sets it from the client sizes).
        eval_batch_size: chunk size of the global test evaluation (None: one pass).
    """

    model: Model
    particles: int = 5
    local_epochs: int = 1
    batch_size: int = 64
    dp: bool = True
    clip_norm: float = 1.0
    optimizer: str = "adam"
    weight_decay: float = 1e-4
    top_k: int = 3
    pso_options: swarm.PSOOptions = field(default_factory=swarm.PSOOptions)
    private_selection: bool = False
    loss_bound: float = 10.0
    capacity: int | None = None
    eval_batch_size: int | None = None


@flax.struct.dataclass
class FedDPPSOHyper:
    """Numeric hyper-parameters (array leaves).

    Attributes:
        pso: inertia ``w``, ``c1``, ``c2`` (``swarm.PSOHyperParams``).
        learning_rate: ``eta`` of the local optimiser.
        noise_multiplier: ``(clients,)`` ``sigma_i`` (ignored unless ``config.dp``).
        selection_scale: ``(clients,)`` Laplace scale of each loss evaluation (nats;
            used only with ``config.private_selection``).
    """

    pso: swarm.PSOHyperParams
    learning_rate: Float[Array, ""]
    noise_multiplier: Float[Array, " clients"]
    selection_scale: Float[Array, " clients"]


@flax.struct.dataclass
class FedDPPSOState:
    """Swarms ``(clients, S, ...)``, the server's gbest (one model), rounds done."""

    swarms: swarm.SwarmState
    gbest: PyTree
    round: Int[Array, ""]


def make_optimizer(
    config: FedDPPSOConfig, learning_rate: ArrayLike
) -> optax.GradientTransformation:
    """The local optimiser: AdamW(eta, lambda) or SGD(eta)."""
    if config.optimizer == "sgd":
        return optax.sgd(learning_rate)
    return optax.adamw(learning_rate, weight_decay=config.weight_decay)


def particle_losses(
    config: FedDPPSOConfig,
    positions: PyTree,
    data: ClientData,
    key: PRNGKeyArray,
    scale: Float[Array, ""],
) -> Float[Array, " S"]:
    """Mean cross-entropy (nats) of each particle (leaves ``(S, ...)``) on one client's data.

    With ``private_selection``: per-example losses clipped to ``[0, loss_bound]``, plus
    ``Laplace(scale)`` per particle (key ``fold_in(key, j)``).
    """
    bound = config.loss_bound if config.private_selection else jnp.inf
    x = jnp.where(data.mask.reshape((-1,) + (1,) * (data.x.ndim - 1)), data.x, 0.0)
    n = jnp.maximum(jnp.sum(data.mask), 1)

    def one(p: PyTree) -> Float[Array, ""]:
        per = jnp.minimum(cross_entropy(config.model.apply(p, x), data.y), bound)
        return jnp.sum(jnp.where(data.mask, per, 0.0)) / n

    losses = jax.vmap(one)(positions)
    if not config.private_selection:
        return losses
    ids = jnp.arange(losses.shape[0])
    noise = jax.vmap(lambda j: jax.random.laplace(jax.random.fold_in(key, j)))(ids)
    return losses + scale * noise


def refine(
    params: PyTree,
    data: ClientData,
    key: PRNGKeyArray,
    noise_multiplier: Float[Array, ""],
    learning_rate: Float[Array, ""],
    config: FedDPPSOConfig,
) -> LocalResult:
    """DP-Adam (or plain Adam when ``not config.dp``) for ``E`` epochs on one client."""
    grad_fn = sampler = None
    if config.dp:
        if config.capacity is None:
            raise ValueError("config.capacity must be set for dp=True (run_fed_dp_pso sets it)")
        grad_fn = dp_grad_fn(
            config.model.apply,
            clip_norm=config.clip_norm,
            noise_multiplier=noise_multiplier,
            expected_batch_size=float(config.batch_size),
        )
        sampler = poisson_sampler(config.batch_size, config.capacity)
    return local_train(
        params,
        data,
        key,
        apply_fn=config.model.apply,
        optimizer=make_optimizer(config, learning_rate),
        epochs=config.local_epochs,
        batch_size=config.batch_size,
        grad_fn=grad_fn,
        sampler=sampler,
    )


def _take(tree: PyTree, index: Int[Array, ""]) -> PyTree:
    return jax.tree.map(lambda leaf: leaf[index], tree)


def client_round(
    state: swarm.SwarmState,
    gbest: PyTree,
    data: ClientData,
    key: PRNGKeyArray,
    noise_multiplier: Float[Array, ""],
    selection_scale: Float[Array, ""],
    hyper: FedDPPSOHyper,
    config: FedDPPSOConfig,
) -> tuple[swarm.SwarmState, Float[Array, ""], PyTree, LocalResult]:
    """Algorithm 1 for ONE client: move, evaluate, refine the best, re-evaluate, report.

    Returns ``(swarm, reported_loss, best_particle, refine_result)``; ``best_particle`` is
    the pbest with the lowest (reported) loss, sent only if the server picks this client.
    """
    k_eval, k_train, k_reeval = jax.random.split(key, 3)
    state = swarm.move(state, hyper.pso, config.pso_options, social_target=gbest)
    losses = particle_losses(config, state.position, data, k_eval, selection_scale)
    state = swarm.observe_personal(state, losses)
    j = jnp.argmin(jnp.where(jnp.isfinite(losses), losses, jnp.inf))
    result = refine(
        _take(state.position, j), data, k_train, noise_multiplier, hyper.learning_rate, config
    )
    refined = jax.tree.map(lambda leaf: leaf[None], result.params)
    new_loss = particle_losses(config, refined, data, k_reeval, selection_scale)[0]
    position = jax.tree.map(lambda all_, r: all_.at[j].set(r), state.position, result.params)
    state = swarm.observe_personal(state.replace(position=position), losses.at[j].set(new_loss))
    best = jnp.argmin(state.best_loss)
    return state, state.best_loss[best], _take(state.best_position, best), result


def server_select(key: PRNGKeyArray, losses: Float[Array, " N"], top_k: int = 3) -> Int[Array, ""]:
    """Algorithm 2: index of a client drawn uniformly from the ``min(top_k, N)`` lowest losses."""
    k = min(check_int("top_k", top_k, 1), losses.shape[0])
    order = jnp.argsort(jnp.where(jnp.isnan(losses), jnp.inf, losses))
    return order[jax.random.randint(key, (), 0, k)]


def fed_dp_pso_init(
    key: PRNGKeyArray, hyper: FedDPPSOHyper, clients: ClientData, *, config: FedDPPSOConfig
) -> FedDPPSOState:
    """Round 0: ``S`` independent inits per client, evaluated; gbest by the server rule."""
    k_clients, k_server = jax.random.split(key)
    ids = jnp.arange(clients.num_clients)

    def one(
        data: ClientData, i: Int[Array, ""], scale: Float[Array, ""]
    ) -> tuple[swarm.SwarmState, Array]:
        ki = jax.random.fold_in(k_clients, i)
        k_init, k_eval, k_swarm = jax.random.split(ki, 3)
        inits = jax.vmap(lambda j: config.model.init(jax.random.fold_in(k_init, j)))
        positions = inits(jnp.arange(config.particles))
        losses = particle_losses(config, positions, data, k_eval, scale)
        s = swarm.init(k_swarm, positions, losses)
        return s, jnp.min(s.best_loss)

    swarms, reports = jax.vmap(one)(clients, ids, hyper.selection_scale)
    k = server_select(k_server, reports, config.top_k)
    best = jax.vmap(lambda s: _take(s.best_position, jnp.argmin(s.best_loss)))(swarms)
    return FedDPPSOState(swarms=swarms, gbest=_take(best, k), round=jnp.zeros((), jnp.int32))


def fed_dp_pso_round(
    state: FedDPPSOState,
    key: PRNGKeyArray,
    hyper: FedDPPSOHyper,
    clients: ClientData,
    test: TestSet,
    *,
    config: FedDPPSOConfig,
) -> tuple[FedDPPSOState, dict[str, Array]]:
    """One round (all clients under vmap, then the server). Metrics: ``test_loss`` (nats),
    ``test_accuracy`` of the new gbest, ``leader`` (picked client), ``reported_loss``
    ``(clients,)``, ``train_loss`` (mean local loss) and ``client_steps`` ``(clients,)``."""
    k_clients, k_server = jax.random.split(key)
    ids = jnp.arange(clients.num_clients)

    def one(s, data, i, sigma, scale):
        ki = jax.random.fold_in(k_clients, i)
        return client_round(s, state.gbest, data, ki, sigma, scale, hyper, config)

    swarms, reports, best, local = jax.vmap(one)(
        state.swarms, clients, ids, hyper.noise_multiplier, hyper.selection_scale
    )
    leader = server_select(k_server, reports, config.top_k)
    gbest = _take(best, leader)
    test_loss, test_acc = evaluate(config.model.apply, gbest, *test, config.eval_batch_size)
    metrics = {
        "test_loss": test_loss,
        "test_accuracy": test_acc,
        "leader": leader,
        "train_loss": jnp.mean(local.loss),
        "reported_loss": reports,
        "client_steps": local.steps,
    }
    return FedDPPSOState(swarms=swarms, gbest=gbest, round=state.round + 1), metrics


def fed_dp_pso_rounds(
    state: FedDPPSOState,
    key: PRNGKeyArray,
    hyper: FedDPPSOHyper,
    clients: ClientData,
    test: TestSet,
    *,
    config: FedDPPSOConfig,
    rounds: int,
) -> tuple[FedDPPSOState, dict[str, Array]]:
    """Scan ``rounds`` rounds; round ``t`` (from ``state.round``) uses ``fold_in(key, t)``."""

    def body(s: FedDPPSOState, _: None) -> tuple[FedDPPSOState, dict[str, Array]]:
        k = jax.random.fold_in(key, s.round)
        return fed_dp_pso_round(s, k, hyper, clients, test, config=config)

    return jax.lax.scan(body, state, None, length=rounds)


@partial(jax.jit, static_argnames=("config",))
def _init_over_seeds(keys, hyper, clients, config):
    return jax.vmap(lambda k: fed_dp_pso_init(k, hyper, clients, config=config))(keys)


@partial(jax.jit, static_argnames=("config", "rounds"))
def _rounds_over_seeds(states, keys, hyper, clients, test, config, rounds):
    def one(s, k):
        return fed_dp_pso_rounds(s, k, hyper, clients, test, config=config, rounds=rounds)

    return jax.vmap(one)(states, keys)


@dataclass(frozen=True)
class FedDPPSOResult:
    """Runner output: final state (leading seed axis), history, seeds and privacy record.

    ``privacy`` holds ``q``, ``sigma``, ``steps_per_round`` (per client), ``delta``,
    ``target_epsilon``, ``selection_epsilon``, ``covers`` (what the epsilon covers) and
    ``epsilon`` ``(rounds, clients)`` (end-to-end where ``private_selection``).
    """

    state: FedDPPSOState
    history: pd.DataFrame
    seeds: list[int]
    privacy: dict


def selection_releases(particles: int, rounds: int) -> int:
    """Loss evaluations per client over a run: ``S`` at init + ``S + 1`` per round."""
    return particles + rounds * (particles + 1)


def _validate(config: FedDPPSOConfig, clients: ClientData, rounds: int) -> None:
    check_int("particles", config.particles, 1)
    check_int("local_epochs", config.local_epochs, 1)
    check_int("batch_size", config.batch_size, 1)
    check_int("top_k", config.top_k, 1)
    check_positive("clip_norm", config.clip_norm)
    check_positive("loss_bound", config.loss_bound)
    check_choice("optimizer", config.optimizer, ("adam", "sgd"))
    check_int("rounds", rounds, 1)
    poisson_rates(np.asarray(clients.sizes), config.batch_size)


def run_fed_dp_pso(
    config: FedDPPSOConfig,
    clients: ClientData,
    test: tuple[ArrayLike, ArrayLike],
    *,
    rounds: int,
    target_epsilon: float = math.inf,
    learning_rate: float = 0.005,
    pso: swarm.PSOHyperParams | None = None,
    selection_epsilon: float = 1.0,
    delta: float = DELTA,
    seeds: int | Sequence[int] = 0,
    num_classes: int | None = None,
    rounds_per_call: int | None = None,
    progress: bool = False,
) -> FedDPPSOResult:
    """Validate, calibrate ``sigma_i`` per client, run every seed at once (vmap), account.

    ``target_epsilon = inf`` gives plain Adam (no clipping, no noise). ``sigma_i`` makes
    client ``i`` reach ``target_epsilon`` at ``delta`` after ``rounds * E * ceil(|D_i|/B)``
    steps. With ``config.private_selection`` the loss releases get ``selection_epsilon`` in
    total per client, added to the reported epsilon. History columns: ``seed, round,
    test_loss, test_accuracy, leader, train_loss, epsilon_max, epsilon_client_<i>, bytes_*``.
    """
    _validate(config, clients, rounds)
    check_positive("target_epsilon", target_epsilon)
    check_positive("learning_rate", learning_rate)
    pso = (swarm.PSOHyperParams() if pso is None else pso).validate()
    test = (jnp.asarray(test[0], jnp.float32), jnp.asarray(test[1], jnp.int32))
    check_federated_inputs(config.model, clients, test, num_classes)
    sizes = np.asarray(clients.sizes)
    dp = not math.isinf(target_epsilon)
    sigmas = (
        calibrate_sigmas(
            target_epsilon,
            sizes,
            config.batch_size,
            rounds=rounds,
            epochs=config.local_epochs,
            delta=delta,
        )
        if dp
        else np.zeros(len(sizes))
    )
    config = _with(config, dp=dp, capacity=sampler_capacity(sizes, config.batch_size))
    releases = selection_releases(config.particles, rounds)
    eps_each = 0.0
    scales = np.zeros(len(sizes))
    if config.private_selection:
        check_positive("selection_epsilon", selection_epsilon)
        eps_each = selection_epsilon / releases
        scales = config.loss_bound / (sizes * eps_each)
    hyper = FedDPPSOHyper(
        pso=jax.tree.map(lambda v: jnp.asarray(v, jnp.float32), pso),
        learning_rate=jnp.asarray(learning_rate, jnp.float32),
        noise_multiplier=jnp.asarray(sigmas, jnp.float32),
        selection_scale=jnp.asarray(scales, jnp.float32),
    )
    keys, seed_list = seed_keys(seeds)
    split = jax.vmap(jax.random.split)(keys)
    states = _init_over_seeds(split[:, 0], hyper, clients, config)

    def chunk(s: FedDPPSOState, n: int):
        return _rounds_over_seeds(s, split[:, 1], hyper, clients, test, config, n)

    states, metrics = run_chunked(
        chunk,
        states,
        rounds,
        rounds_per_call=rounds_per_call,
        progress=progress,
        desc="Fed-DP-PSO",
    )
    eps = epsilon_history(
        sizes, config.batch_size, sigmas, rounds=rounds, epochs=config.local_epochs, delta=delta
    )
    if config.private_selection:
        used = config.particles + np.arange(1, rounds + 1) * (config.particles + 1)
        eps = eps + (used * eps_each)[:, None]
    extra = {f"epsilon_client_{i}": eps[:, i] for i in range(len(sizes))}
    extra["epsilon_max"] = eps.max(axis=1)
    params_shape = jax.eval_shape(config.model.init, jax.random.key(0))
    extra.update(comm.per_round_table(comm.pso_bytes(params_shape, len(sizes)), rounds))
    history = history_frame(seed_list, metrics, extra, "round")
    privacy = {
        "q": (config.batch_size / sizes).tolist(),
        "sigma": sigmas.tolist(),
        "steps_per_round": steps_per_round(sizes, config.batch_size, config.local_epochs).tolist(),
        "rounds": rounds,
        "delta": delta,
        "target_epsilon": target_epsilon,
        "clip_norm": config.clip_norm,
        "private_selection": config.private_selection,
        "selection_epsilon": selection_epsilon if config.private_selection else None,
        "selection_releases": releases if config.private_selection else 0,
        "epsilon": eps,
        "covers": COVERAGE_PRIVATE_SELECTION if config.private_selection else COVERAGE_PAPER,
    }
    return FedDPPSOResult(state=states, history=history, seeds=seed_list, privacy=privacy)


def _with(config: FedDPPSOConfig, **changes) -> FedDPPSOConfig:
    from dataclasses import replace

    return replace(config, **changes)
