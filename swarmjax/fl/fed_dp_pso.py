"""Fed-DP-PSO (seed 000; ALGORITHMS.md section 2): a swarm per client, DP-Adam, random top-3.

Every client ``i`` holds a swarm of ``S`` particles (full models; :mod:`swarmjax.swarm`,
leaves ``(clients, S, ...)``: all clients and particles run under one vmap). Per round:

1. (Algorithm 1, every client) PSO move toward the personal bests and the server's gbest
   (``swarm.move(..., social_target=gbest)``); evaluate every particle on ``D_i`` (masked);
   update pbest; refine the client's best particle ``theta_{i,best}`` with DP-Adam for ``E``
   epochs of Poisson batches (``q_i = B / |D_i|``; :mod:`swarmjax.fl.dp_local`); the
   refined model becomes that particle's position; re-evaluate, update its pbest; report
   ``min_j pbest_loss_j`` (one float).

   Which model is ``theta_{i,best}``: the paper uses that one symbol for the model a client
   reports and sends (its lowest-loss personal best) and for the model DP-Adam refines, so
   by default (``refine_start="pbest"``) the refinement starts from the client's best
   personal best, the model it would send. ``refine_start="position"`` starts from the
   particle whose position after the move has the lowest loss (the two differ only when no
   moved particle beats the best personal best).
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
client's end-to-end guarantee is ``(eps_DP-Adam + n_releases eps_1, delta)``. With
``selection_metric="error"`` the per-example value is 0 or 1, so the bound is
``min(loss_bound, 1)``.

Scoring (``selection_metric``): the paper scores particles by their loss, the default. The
option ``"error"`` scores them by error rate instead (not the paper's algorithm). Under
DP-Adam a client's cross-entropy rises from the second epoch on while its accuracy still
improves, so the lowest-loss pbest stays behind the most accurate model.

Not implemented: the paper's eq. 12 variant (a gradient step for every particle inside the
move); the default, Algorithm 1, refines only the best particle.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
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
from swarmjax.fl import comm, dp_local
from swarmjax.fl._runner import (
    as_test_set,
    check_federated_inputs,
    history_frame,
    run_chunked,
    scan_rounds,
    seed_keys,
)
from swarmjax.fl.clients import ClientData, poisson_rates
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
    "evaluation_subset",
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
        refine_start: ``"pbest"`` (refine the client's best personal best, the model it
            reports; default) or ``"position"`` (the best position after the move); see the
            module docs.
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
        selection_metric: what the particles are scored by (pbest updates, the best particle,
            the reported value): ``"loss"`` (mean cross-entropy, the paper's
            ``L(D_i, theta)``; default) or ``"error"`` (error rate, the 0-1 loss; an option,
            not the paper's algorithm: under DP-Adam cross-entropy rises while accuracy
            still improves, so scoring by loss stalls; see ``docs/fed_dp_pso.md``).
        capacity: Poisson buffer size (None: the runner sets the smallest with overflow
            probability below 1e-9; a larger value is kept, e.g. to share one compiled
            program between partitions).
        eval_batch_size: chunk size of the global test evaluation (None: one pass).
        eval_subset: evaluate particles on a fixed random subset of at most this many rows
            of each client (spec 2.2's speed option; None: all local rows). DP-Adam still
            samples from all rows; the subset is drawn once per run from public randomness.
        client_map: ``"vmap"`` (all clients as one batch axis; default) or ``"sequential"``
            (``lax.map``, one client after another, seeds and particles still batched).
            Same results; under vmap every client runs as many DP-Adam steps as the largest
            one (the small clients' extra steps are masked but computed), mapped each runs
            its own ``ceil(|D_i| / B)``, which is faster for unequal clients when the seed
            batch already fills the machine.
    """

    model: Model
    particles: int = 5
    local_epochs: int = 1
    refine_start: str = "pbest"
    batch_size: int = 64
    dp: bool = True
    clip_norm: float = 1.0
    optimizer: str = "adam"
    weight_decay: float = 1e-4
    top_k: int = 3
    pso_options: swarm.PSOOptions = field(default_factory=swarm.PSOOptions)
    private_selection: bool = False
    loss_bound: float = 10.0
    selection_metric: str = "loss"
    capacity: int | None = None
    eval_batch_size: int | None = None
    eval_subset: int | None = None
    client_map: str = "vmap"


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


def selection_bound(config: FedDPPSOConfig) -> float:
    """Per-example bound of the scored value: ``loss_bound`` (nats), or 1 for the error rate."""
    return config.loss_bound if config.selection_metric == "loss" else min(config.loss_bound, 1.0)


def _per_example_score(config: FedDPPSOConfig, logits: Array, y: Array) -> Array:
    if config.selection_metric == "error":
        return (jnp.argmax(logits, axis=-1) != y).astype(logits.dtype)
    return cross_entropy(logits, y)


def particle_losses(
    config: FedDPPSOConfig,
    positions: PyTree,
    data: ClientData,
    key: PRNGKeyArray,
    scale: Float[Array, ""],
) -> Float[Array, " S"]:
    """Score of each particle (leaves ``(S, ...)``) on one client's data: mean cross-entropy
    (nats) or, with ``selection_metric="error"``, the error rate.

    With ``private_selection``: per-example values clipped to ``[0, selection_bound]``, plus
    ``Laplace(scale)`` per particle (key ``fold_in(key, j)``).
    """
    bound = selection_bound(config) if config.private_selection else jnp.inf
    x = jnp.where(data.mask.reshape((-1,) + (1,) * (data.x.ndim - 1)), data.x, 0.0)
    n = jnp.maximum(jnp.sum(data.mask), 1)

    def one(p: PyTree) -> Float[Array, ""]:
        per = jnp.minimum(_per_example_score(config, config.model.apply(p, x), data.y), bound)
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
        grad_fn = dp_local.dp_grad_fn(
            config.model.apply,
            clip_norm=config.clip_norm,
            noise_multiplier=noise_multiplier,
            expected_batch_size=float(config.batch_size),
        )
        sampler = dp_local.poisson_sampler(config.batch_size, config.capacity)
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
    eval_data: ClientData,
    key: PRNGKeyArray,
    noise_multiplier: Float[Array, ""],
    selection_scale: Float[Array, ""],
    hyper: FedDPPSOHyper,
    config: FedDPPSOConfig,
) -> tuple[swarm.SwarmState, Float[Array, ""], PyTree, LocalResult]:
    """Algorithm 1 for ONE client: move, evaluate, refine the best, re-evaluate, report.

    Particles are evaluated on ``eval_data`` (``data`` itself unless ``config.eval_subset``);
    DP-Adam trains on ``data``. Returns ``(swarm, reported_loss, best_particle,
    refine_result)``; ``best_particle`` is the pbest with the lowest (reported) loss, sent
    only if the server picks this client.
    """
    k_eval, k_train, k_reeval = jax.random.split(key, 3)
    state = swarm.move(state, hyper.pso, config.pso_options, social_target=gbest)
    losses = particle_losses(config, state.position, eval_data, k_eval, selection_scale)
    state = swarm.observe_personal(state, losses)
    if config.refine_start == "pbest":
        j = jnp.argmin(state.best_loss)
        start = _take(state.best_position, j)
    else:
        j = jnp.argmin(jnp.where(jnp.isfinite(losses), losses, jnp.inf))
        start = _take(state.position, j)
    result = refine(start, data, k_train, noise_multiplier, hyper.learning_rate, config)
    refined = jax.tree.map(lambda leaf: leaf[None], result.params)
    new_loss = particle_losses(config, refined, eval_data, k_reeval, selection_scale)[0]
    position = jax.tree.map(lambda all_, r: all_.at[j].set(r), state.position, result.params)
    state = swarm.observe_personal(state.replace(position=position), losses.at[j].set(new_loss))
    best = jnp.argmin(state.best_loss)
    return state, state.best_loss[best], _take(state.best_position, best), result


def server_select(key: PRNGKeyArray, losses: Float[Array, " N"], top_k: int = 3) -> Int[Array, ""]:
    """Algorithm 2: index of a client drawn uniformly from the ``min(top_k, N)`` lowest losses."""
    k = min(check_int("top_k", top_k, 1), losses.shape[0])
    order = jnp.argsort(jnp.where(jnp.isnan(losses), jnp.inf, losses))
    return order[jax.random.randint(key, (), 0, k)]


def _over_clients(
    fn: Callable,
    key: PRNGKeyArray,
    hyper: FedDPPSOHyper,
    clients: ClientData,
    eval_clients: ClientData | None,
    config: FedDPPSOConfig,
    *stacked: PyTree,
):
    """``fn(client_key, data, eval_data, sigma_i, scale_i, *stacked_i)`` for every client
    (``vmap``, or ``lax.map`` when ``config.client_map == "sequential"``); client ``i``
    gets ``fold_in(key, i)``."""
    eval_clients = clients if eval_clients is None else eval_clients

    def one(i, data, ev, sigma, scale, *rest):
        return fn(jax.random.fold_in(key, i), data, ev, sigma, scale, *rest)

    ids = jnp.arange(clients.num_clients)
    args = (ids, clients, eval_clients, hyper.noise_multiplier, hyper.selection_scale, *stacked)
    if config.client_map == "sequential":
        return jax.lax.map(lambda a: one(*a), args)
    return jax.vmap(one)(*args)


def fed_dp_pso_init(
    key: PRNGKeyArray,
    hyper: FedDPPSOHyper,
    clients: ClientData,
    *,
    config: FedDPPSOConfig,
    eval_clients: ClientData | None = None,
) -> FedDPPSOState:
    """Round 0: ``S`` independent inits per client, evaluated; gbest by the server rule."""
    k_clients, k_server = jax.random.split(key)

    def one(ki, data, ev, sigma, scale):
        del data, sigma
        k_init, k_eval, k_swarm = jax.random.split(ki, 3)
        inits = jax.vmap(lambda j: config.model.init(jax.random.fold_in(k_init, j)))
        positions = inits(jnp.arange(config.particles))
        s = swarm.init(k_swarm, positions, particle_losses(config, positions, ev, k_eval, scale))
        return s, jnp.min(s.best_loss)

    swarms, reports = _over_clients(one, k_clients, hyper, clients, eval_clients, config)
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
    eval_clients: ClientData | None = None,
) -> tuple[FedDPPSOState, dict[str, Array]]:
    """One round (all clients under vmap, then the server). Metrics: ``test_loss`` (nats),
    ``test_accuracy`` of the new gbest, ``leader`` (picked client), ``reported_loss``
    ``(clients,)``, ``train_loss`` (mean local loss) and ``client_steps`` ``(clients,)``."""
    k_clients, k_server = jax.random.split(key)

    def one(ki, data, ev, sigma, scale, s):
        return client_round(s, state.gbest, data, ev, ki, sigma, scale, hyper, config)

    swarms, reports, best, local = _over_clients(
        one, k_clients, hyper, clients, eval_clients, config, state.swarms
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
    eval_clients: ClientData | None = None,
) -> tuple[FedDPPSOState, dict[str, Array]]:
    """Scan ``rounds`` rounds (:func:`swarmjax.fl._runner.scan_rounds`); round ``t`` (from
    ``state.round``) uses ``fold_in(key, t)``, so chunking never changes a result."""
    round_fn = partial(fed_dp_pso_round, eval_clients=eval_clients)
    return scan_rounds(round_fn, state, key, (hyper, clients, test), config=config, rounds=rounds)


@partial(jax.jit, static_argnames=("config",))
def _init_batch(keys, hypers, clients, eval_clients, config):
    def one(k, h):
        return fed_dp_pso_init(k, h, clients, config=config, eval_clients=eval_clients)

    return jax.vmap(one)(keys, hypers)


@partial(jax.jit, static_argnames=("config", "rounds"))
def _rounds_batch(states, keys, hypers, clients, eval_clients, test, config, rounds):
    def one(s, k, h):
        return fed_dp_pso_rounds(
            s, k, h, clients, test, config=config, rounds=rounds, eval_clients=eval_clients
        )

    return jax.vmap(one)(states, keys, hypers)


def evaluation_subset(clients: ClientData, size: int, seed: int = 0) -> ClientData:
    """A fixed random subset of at most ``size`` real rows per client (spec 2.2 option).

    Drawn on the host from ``numpy.random.default_rng(seed)``, independent of the data's
    values, so it costs no privacy; client ``i`` keeps ``min(size, |D_i|)`` rows.
    """
    size = check_int("eval_subset", size, 1)
    sizes = np.asarray(clients.sizes)
    m = int(min(size, clients.max_size))
    rng = np.random.default_rng(seed)
    rows = np.zeros((len(sizes), m), np.int64)
    kept = np.minimum(sizes, m)
    for i, n in enumerate(sizes):
        rows[i, : kept[i]] = np.sort(rng.choice(int(n), size=int(kept[i]), replace=False))
    take = jax.vmap(lambda a, r: a[r])
    idx = jnp.asarray(rows)
    mask = jnp.arange(m)[None, :] < jnp.asarray(kept)[:, None]
    return ClientData(
        x=take(clients.x, idx), y=take(clients.y, idx), mask=mask, sizes=jnp.asarray(kept)
    )


@dataclass(frozen=True)
class FedDPPSOResult:
    """Runner output.

    Attributes:
        state: final state with a leading batch axis of ``len(targets) * len(seeds)``
            (target-major: batch row ``e * len(seeds) + s`` is target ``e``, seed ``s``).
        history: one row per (target epsilon, seed, round); ``epsilon_target`` column.
        seeds: the seeds.
        privacy: the privacy record of the first (or only) target epsilon: ``q``, ``sigma``,
            ``steps_per_round`` (per client), ``delta``, ``target_epsilon``,
            ``selection_epsilon``, ``covers`` and ``epsilon`` ``(rounds, clients)``
            (end-to-end where ``private_selection``).
        privacy_by_epsilon: the record of every target epsilon, keyed by it.
    """

    state: FedDPPSOState
    history: pd.DataFrame
    seeds: list[int]
    privacy: dict
    privacy_by_epsilon: dict = field(default_factory=dict)


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
    check_choice("refine_start", config.refine_start, ("pbest", "position"))
    check_choice("selection_metric", config.selection_metric, ("loss", "error"))
    check_choice("client_map", config.client_map, ("vmap", "sequential"))
    if config.eval_subset is not None:
        check_int("eval_subset", config.eval_subset, 1)
    check_int("rounds", rounds, 1)
    poisson_rates(np.asarray(clients.sizes), config.batch_size)


def _targets(target_epsilon: float | Sequence[float]) -> list[float]:
    targets = (
        [target_epsilon]
        if isinstance(target_epsilon, int | float | np.number)
        else [float(e) for e in target_epsilon]
    )
    if not targets:
        raise ValueError("target_epsilon must not be empty")
    for e in targets:
        check_positive("target_epsilon", e)
    if len({math.isinf(e) for e in targets}) > 1:
        raise ValueError(
            "target_epsilon must be all finite (DP-Adam) or all inf (plain Adam) in one call; "
            f"got {targets}: run the inf target separately"
        )
    return [float(e) for e in targets]


def run_fed_dp_pso(
    config: FedDPPSOConfig,
    clients: ClientData,
    test: tuple[ArrayLike, ArrayLike],
    *,
    rounds: int,
    target_epsilon: float | Sequence[float] = math.inf,
    learning_rate: float = 0.005,
    pso: swarm.PSOHyperParams | None = None,
    selection_epsilon: float = 1.0,
    delta: float = dp_local.DELTA,
    seeds: int | Sequence[int] = 0,
    num_classes: int | None = None,
    rounds_per_call: int | None = None,
    progress: bool = False,
) -> FedDPPSOResult:
    """Validate, calibrate ``sigma_i`` per client, run every (target, seed) at once, account.

    ``target_epsilon`` may be a list: epsilon only changes the noise multipliers (array
    leaves), so all targets and seeds run as one batch axis of ONE compiled call (all
    targets finite, or all ``inf``). ``inf`` gives plain Adam (no clipping, no noise).
    ``sigma_i`` makes client ``i`` reach the target at ``delta`` after
    ``rounds * E * ceil(|D_i|/B)`` steps. With ``config.private_selection`` the loss releases
    get ``selection_epsilon`` in total per client, added to the reported epsilon. History
    columns: ``epsilon_target, seed, round, test_loss, test_accuracy, leader, train_loss,
    epsilon_client_<i>, epsilon_max, bytes_*``.
    """
    _validate(config, clients, rounds)
    targets = _targets(target_epsilon)
    check_positive("learning_rate", learning_rate)
    pso = (swarm.PSOHyperParams() if pso is None else pso).validate()
    test = as_test_set(test)
    check_federated_inputs(config.model, clients, test, num_classes)
    if config.private_selection:
        check_positive("selection_epsilon", selection_epsilon)
    sizes = np.asarray(clients.sizes)
    dp = not math.isinf(targets[0])
    sigmas = np.stack(
        [
            dp_local.calibrate_sigmas(
                e,
                sizes,
                config.batch_size,
                rounds=rounds,
                epochs=config.local_epochs,
                delta=delta,
            )
            if dp
            else np.zeros(len(sizes))
            for e in targets
        ]
    )
    needed = dp_local.sampler_capacity(sizes, config.batch_size)
    if config.capacity is not None and config.capacity < needed:
        raise ValueError(
            f"capacity must be >= {needed} (Poisson overflow below 1e-9 for these clients); "
            f"got {config.capacity}"
        )
    config = replace(config, dp=dp, capacity=config.capacity or needed)
    eval_clients = (
        None if config.eval_subset is None else evaluation_subset(clients, config.eval_subset)
    )
    eval_sizes = sizes if eval_clients is None else np.asarray(eval_clients.sizes)
    releases = selection_releases(config.particles, rounds)
    eps_each = selection_epsilon / releases if config.private_selection else 0.0
    scales = selection_bound(config) / (eval_sizes * eps_each) if eps_each else np.zeros(len(sizes))
    keys, seed_list = seed_keys(seeds)
    n_seeds = len(seed_list)
    batch = len(targets) * n_seeds
    hypers = FedDPPSOHyper(
        pso=jax.tree.map(lambda v: jnp.full((batch,), v, jnp.float32), pso),
        learning_rate=jnp.full((batch,), learning_rate, jnp.float32),
        noise_multiplier=jnp.asarray(np.repeat(sigmas, n_seeds, axis=0), jnp.float32),
        selection_scale=jnp.asarray(np.tile(scales, (batch, 1)), jnp.float32),
    )
    split = jax.vmap(jax.random.split)(jnp.concatenate([keys] * len(targets)))
    states = _init_batch(split[:, 0], hypers, clients, eval_clients, config)

    def chunk(s: FedDPPSOState, n: int):
        return _rounds_batch(s, split[:, 1], hypers, clients, eval_clients, test, config, n)

    states, metrics = run_chunked(
        chunk,
        states,
        rounds,
        rounds_per_call=rounds_per_call,
        progress=progress,
        desc="Fed-DP-PSO",
    )
    params_shape = jax.eval_shape(config.model.init, jax.random.key(0))
    comm_cols = comm.per_round_table(comm.pso_bytes(params_shape, len(sizes)), rounds)
    used = config.particles + np.arange(1, rounds + 1) * (config.particles + 1)
    frames, by_eps = [], {}
    for e, target in enumerate(targets):
        record = dp_local.privacy_record(
            sizes,
            config.batch_size,
            sigmas[e],
            rounds=rounds,
            epochs=config.local_epochs,
            delta=delta,
            target_epsilon=target,
            clip_norm=config.clip_norm,
        )
        if config.private_selection:
            record["epsilon"] = record["epsilon"] + (used * eps_each)[:, None]
        record.update(
            private_selection=config.private_selection,
            selection_epsilon=selection_epsilon if config.private_selection else None,
            selection_releases=releases if config.private_selection else 0,
            covers=COVERAGE_PRIVATE_SELECTION if config.private_selection else COVERAGE_PAPER,
        )
        by_eps[target] = record
        rows = slice(e * n_seeds, (e + 1) * n_seeds)
        part = jax.tree.map(lambda m, r=rows: m[r], metrics)
        extra = {**dp_local.epsilon_columns(record["epsilon"]), **comm_cols}
        frame = history_frame(seed_list, part, extra, "round")
        frame.insert(0, "epsilon_target", target)
        frames.append(frame)
    history = pd.concat(frames, ignore_index=True)
    return FedDPPSOResult(
        state=states,
        history=history,
        seeds=seed_list,
        privacy=by_eps[targets[0]],
        privacy_by_epsilon=by_eps,
    )
