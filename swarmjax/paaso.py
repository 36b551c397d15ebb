"""PAASO: privacy-aware agent swarm optimisation (seed 001) on the swarm core.

Five strategies, from least to most private (docs/algorithms.md section 1.2):

* ``pso``   positions shared; ``v_i <- w v_i + phi_p r_p (p_i - x_i) + phi_g r_g (g - x_i)``.
* ``fl``    only directions shared; a public centre ``pG`` moves by ``wG`` times the mean
            agent velocity.  Agent rule::

                v_i <- w v_i + phi_g r_g (pG - p_i)   if f(pG) < f(p_i)
                v_i <- w v_i + phi_p r_p (p_i - pG)   otherwise   (fl_rule="direction")
                v_i <- w v_i + phi_p r_p (p_i - x_i)  otherwise   (fl_rule="cognitive")

            The paper writes ``(b_i - p_i)`` in the second branch and never defines ``b_i``.
            The project spec reads it as the cognitive pull ``p_i - x_i``
            (``fl_rule="cognitive"``).  With that reading the shared directions carry no
            information about where pG should go and pG random-walks to the domain walls:
            on f4 (20 runs, 1000 iterations, w=0.005, phi=2, wG=0.01) mean f(pG) rises
            from ~490 to ~830 for FL and ~2000-2100 for the voting strategies.  The paper's
            section 3.2 says each agent supplies "the direction d_i = p_i - g"; reading the
            second branch as ``p_i - pG`` (``fl_rule="direction"``, the default) makes the
            two branches consistent (better agents pull pG toward them, worse agents push
            it away) and reproduces the paper's findings (same setting: FL 16.1, aDRD 8.4,
            bDRD 3.9, PbDRD 15.7 at iteration 1000 (heavy-tailed over runs), FL worse than
            the voting strategies as the paper's Fig. 4 reports).
* ``adrd``  as FL, but each agent (with probability ``p_c``) votes for the nearest of
            ``k_alpha`` directions ``2 pi k / k_alpha``; DP random dictatorship picks one
            and ``pG <- pG + wG * speed * (cos, sin)``.
* ``bdrd``  as aDRD, voting only when ``f(p_i) < f(pG)``.
* ``pbdrd`` as bDRD, each vote first masked by PRAM with keep-probability ``p_m``.

Reported objective per iteration: ``f(g)`` for PSO, ``f(pG)`` for the others.  Positions
(agents' and ``pG``) are clipped to the domain and velocities to +/- ``vmax_factor`` times
the domain width (the paper's Fig. 1 uses w = 4, which diverges unclamped); ``vmax_factor =
inf`` and ``clip_positions=False`` turn the clamps off.

FL moves ``pG`` by ``wG`` times the agents' mean velocity (the paper's l5.2-l5.3,
``fl_step="mean"``); ``fl_step="unit"`` (not the paper's) moves it by the voted
strategies' step ``wG * speed`` in that direction, FL as noiseless voting.

The paper sets neither the clamp nor the voted step's length; :data:`READINGS` names the
two sets of values the experiments use (``"spec"``: docs/algorithms.md's defaults, which are
:class:`PAASOHyper`'s; ``"stable"``: the values under which the paper's Figs. 1-2 findings
reproduce best; docs/paaso.md has the study).

Privacy per run (what the numbers cover):

* DRD: each iteration's outcome is ``ln(2n/(n+1))``-DP with respect to adding or removing
  one voter, ``n`` = voters + ``k_alpha`` dummies.  We report the realised value per
  iteration (the paper's) and the data-independent bound with ``n = s + k_alpha`` (the
  realised ``n`` depends on private data, so only the bound composes honestly).
* PRAM: each cast vote is ``ln(p_m (k-1)/(1-p_m))``-local-DP; an agent that votes in every
  iteration spends ``T`` times that (basic composition).
* Not covered: FL and PSO share directions or positions in the clear (no DP); ``pG`` and
  ``f(pG)`` are public by design.

Randomness: swarm coefficients come from the hash generator of :mod:`swarmjax.random`;
vote casting, PRAM and the dictatorship draw use ``jax.random`` (Threefry-2x32, 20 rounds)
from the run's key.  Per iteration a voting run draws ``s`` casting uniforms (none when
``p_c = 1`` is declared with ``draw_casts=False``), one for the dictator's position in the
pool of ballots (casters in agent order, then one dummy per direction) and, for PbDRD, two
for the PRAM mask of the dictator's ballot only: the outcome has the law of masking every
ballot (``mechanisms.random_dictatorship_pram_probs``).  Only the dictator's vote is binned,
with a diamond angle instead of ``atan2``.  Together these took the voting strategies from
~0.18x to 0.72-0.88x of PSO's speed at p_c = 1 (docs/paaso_speed.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

from swarmjax import swarm
from swarmjax._validation import (
    check_choice,
    check_int,
    check_nonnegative,
    check_positive,
    check_probability,
    check_range,
)
from swarmjax.objectives import OBJECTIVES, Objective, get_objective
from swarmjax.privacy.accounting import advanced_composition
from swarmjax.privacy.mechanisms import (
    random_dictatorship_epsilon,
    randomized_response_epsilon,
    randomized_response_from_uniform,
)

__all__ = [
    "FUNCTIONS",
    "READINGS",
    "STRATEGIES",
    "PAASOConfig",
    "PAASOHyper",
    "PAASOState",
    "init",
    "privacy_summary",
    "run",
    "step",
]

Strategy = Literal["pso", "fl", "adrd", "bdrd", "pbdrd"]
STRATEGIES: tuple[str, ...] = ("pso", "fl", "adrd", "bdrd", "pbdrd")
VOTING = ("adrd", "bdrd", "pbdrd")
ANY_VOTING = "voting"
"""``PAASOConfig(strategy=ANY_VOTING)``: one of :data:`VOTING`, given per call as an index."""
FL_RULES = ("direction", "cognitive")
FL_STEPS = ("mean", "unit")
FUNCTIONS: tuple[str, ...] = tuple(OBJECTIVES)
"""Benchmark functions by index, for ``PAASOConfig(function=None)`` (the function as data)."""

# Named readings of the numerics the paper leaves open (PAASOHyper fields).
READINGS: dict[str, dict[str, float]] = {
    # docs/algorithms.md: velocities clamped to one domain width, the voted step wG long.
    "spec": {"vmax_factor": 1.0, "speed": 1.0},
    # The usual PSO clamp (a tenth of the domain) and a voted step of 5 wG.
    "stable": {"vmax_factor": 0.1, "speed": 5.0},
}


@struct.dataclass
class PAASOHyper:
    """Numeric hyper-parameters (array leaves: vmap over them).

    ``w`` inertia, ``phi_p``/``phi_g`` cognitive/social weights, ``w_g`` centre step,
    ``p_c`` vote probability, ``p_m`` PRAM keep-probability, ``speed`` length of a voted
    direction, ``vmax_factor`` velocity clamp in domain widths (``inf``: none).
    """

    w: Float[ArrayLike, ""] = 0.7
    phi_p: Float[ArrayLike, ""] = 1.4
    phi_g: Float[ArrayLike, ""] = 1.4
    w_g: Float[ArrayLike, ""] = 0.1
    p_c: Float[ArrayLike, ""] = 1.0
    p_m: Float[ArrayLike, ""] = 0.9
    speed: Float[ArrayLike, ""] = 1.0
    vmax_factor: Float[ArrayLike, ""] = 1.0

    def validate(self) -> PAASOHyper:
        """Raise ValueError naming the first out-of-range field (concrete values only)."""
        check_range("w", self.w)
        check_nonnegative("phi_p", self.phi_p)
        check_nonnegative("phi_g", self.phi_g)
        check_nonnegative("w_g", self.w_g)
        check_probability("p_c", self.p_c)
        check_probability("p_m", self.p_m)
        check_nonnegative("speed", self.speed)
        check_positive("vmax_factor", self.vmax_factor)
        return self


@struct.dataclass
class PAASOConfig:
    """Static settings: they fix array shapes or the compiled program.

    ``draw_casts=False`` declares ``p_c = 1`` (every agent casts its vote, as in all the
    paper's figures): a Bernoulli(1) needs no randomness, so the ``num_agents`` casting
    uniforms per iteration are not drawn, and ``hyper.p_c`` is not read.  The sweep task
    sets it from the grid's ``p_c``.

    ``function=None`` makes the benchmark function data: :func:`init`, :func:`step` and
    :func:`run` then take ``function``, an int32 index into :data:`FUNCTIONS` (traced is
    fine), and one compiled program serves all eight (a ``lax.switch`` per evaluation).
    Likewise ``strategy="voting"`` (:data:`ANY_VOTING`) takes ``voting``, an index into
    :data:`VOTING`: aDRD, bDRD and PbDRD differ only in who casts and whether the
    dictator's ballot is masked, both selected per run at no measurable cost.  And
    ``k_alpha=None`` takes ``k_alpha`` per call, an int in ``[2, MAX_DATA_K_ALPHA]``: only
    the dictator's ballot is binned, against a row of a table of bin edges.
    """

    strategy: str = struct.field(pytree_node=False, default="pso")
    function: str | None = struct.field(pytree_node=False, default="f4")
    num_agents: int = struct.field(pytree_node=False, default=50)
    dim: int = struct.field(pytree_node=False, default=2)
    k_alpha: int | None = struct.field(pytree_node=False, default=8)
    iterations: int = struct.field(pytree_node=False, default=1000)
    clip_positions: bool = struct.field(pytree_node=False, default=True)
    init_velocity: str = struct.field(pytree_node=False, default="zero")
    fl_rule: str = struct.field(pytree_node=False, default="direction")
    fl_step: str = struct.field(pytree_node=False, default="mean")
    draw_casts: bool = struct.field(pytree_node=False, default=True)
    options: swarm.PSOOptions = struct.field(pytree_node=False, default=swarm.PSOOptions())

    def __post_init__(self) -> None:
        check_choice("strategy", self.strategy, (*STRATEGIES, ANY_VOTING))
        if self.function is not None:
            get_objective(self.function)
        check_int("num_agents", self.num_agents, minimum=1)
        check_int("dim", self.dim, minimum=1)
        if self.k_alpha is not None:
            check_int("k_alpha", self.k_alpha, minimum=2)
        check_int("iterations", self.iterations, minimum=1)
        check_choice("init_velocity", self.init_velocity, ("zero", "uniform"))
        check_choice("fl_rule", self.fl_rule, FL_RULES)
        check_choice("fl_step", self.fl_step, FL_STEPS)
        if self.voting and self.dim != 2:
            raise ValueError(
                f"dim must be 2 for the voting strategy {self.strategy!r} (directions are "
                f"angles in the plane); got {self.dim}"
            )

    @property
    def voting(self) -> bool:
        """Whether the strategy votes (one of :data:`VOTING`, or any of them)."""
        return self.strategy in (*VOTING, ANY_VOTING)

    @property
    def objective(self) -> Objective:
        """The benchmark function being minimised (not with ``function=None``)."""
        if self.function is None:
            raise ValueError("function is None (given per call as an index into FUNCTIONS)")
        return get_objective(self.function)


class _Problem(NamedTuple):
    """The objective of a run: ``fn`` maps ``(d, *batch)`` to ``batch``; box ``[low, high]``
    and ``width`` (Python floats, or traced scalars when the function is data)."""

    fn: Callable[[Array], Array]
    low: Float[ArrayLike, ""]
    high: Float[ArrayLike, ""]
    width: Float[ArrayLike, ""]


_TABLE = [OBJECTIVES[name] for name in FUNCTIONS]
_LOWS = np.asarray([o.low for o in _TABLE], np.float32)
_HIGHS = np.asarray([o.high for o in _TABLE], np.float32)
_WIDTHS = np.asarray([o.width for o in _TABLE], np.float32)


def _problem(cfg: PAASOConfig, function: Int[ArrayLike, ""] | None) -> _Problem:
    """The static objective ``cfg.function``, or the one ``function`` indexes in FUNCTIONS."""
    if cfg.function is not None:
        if function is not None:
            raise ValueError(
                f"function: give it in PAASOConfig ({cfg.function!r}) or per call, not both"
            )
        obj = cfg.objective
        return _Problem(obj.fn, obj.low, obj.high, obj.width)
    if function is None:
        raise ValueError(
            "function: PAASOConfig(function=None) needs function=<index into paaso.FUNCTIONS>"
        )
    index = _index("function", function, FUNCTIONS)
    fns = [o.fn for o in _TABLE]

    def fn(x: Array) -> Array:
        return jax.lax.switch(index, fns, x)

    low, high, width = (jnp.asarray(table)[index] for table in (_LOWS, _HIGHS, _WIDTHS))
    return _Problem(fn, low, high, width)


def _int_data(name: str, value: ArrayLike, low: int, high: int, what: str) -> Int[Array, ""]:
    """``value``, an integer given per call, as an int32 scalar; unless traced, checked to
    be one in ``[low, high]`` (else ``"<name> must be <what>"``)."""
    if not isinstance(value, jax.core.Tracer):
        v = np.asarray(value)
        if v.shape or v.dtype.kind not in "iu" or not low <= v <= high:
            raise ValueError(f"{name} must be {what}; got {value!r}")
    return jnp.asarray(value, jnp.int32)


def _index(name: str, value: ArrayLike, choices: tuple[str, ...]) -> Int[Array, ""]:
    """``value`` as an int32 index into ``choices`` (checked unless traced)."""
    n = len(choices)
    return _int_data(name, value, 0, n - 1, f"an integer index in [0, {n}) into {choices}")


class _Rule(NamedTuple):
    """Who votes and how: ``better_only`` (only agents whose best beats pG: bDRD, PbDRD),
    ``pram`` (the dictator's ballot masked: PbDRD) and the ``k_alpha`` directions; Python
    values, or traced scalars when the voting strategy or ``k_alpha`` is data."""

    better_only: bool | Bool[Array, ""]
    pram: bool | Bool[Array, ""]
    k_alpha: int | Int[Array, ""]


def _rule(
    cfg: PAASOConfig, voting: Int[ArrayLike, ""] | None, k_alpha: Int[ArrayLike, ""] | None
) -> _Rule:
    """The voting rule of ``cfg.strategy``, or of ``VOTING[voting]`` for ``"voting"``, with
    ``cfg.k_alpha`` directions (``k_alpha`` when that is None)."""
    k = _k_alpha(cfg, k_alpha)
    if cfg.strategy != ANY_VOTING:
        if voting is not None:
            raise ValueError(
                f"voting: only with strategy={ANY_VOTING!r}; this config's is {cfg.strategy!r}"
            )
        return _Rule(cfg.strategy in ("bdrd", "pbdrd"), cfg.strategy == "pbdrd", k)
    if voting is None:
        raise ValueError(
            f"voting: PAASOConfig(strategy={ANY_VOTING!r}) needs voting=<index into paaso.VOTING>"
        )
    index = _index("voting", voting, VOTING)
    return _Rule(index >= VOTING.index("bdrd"), index == VOTING.index("pbdrd"), k)


Coords = tuple[Float[Array, " s"], ...]


@struct.dataclass
class PAASOState:
    """One PAASO run: the agents' swarm, the public centre ``pG`` ``(d,)`` and the voting key.

    The swarm's particle is a tuple of ``d`` scalars, so every swarm leaf is one coordinate
    of all agents, ``(s,)`` (structure of arrays).  Under ``vmap`` over runs the leaves are
    ``(runs, s)``: no length-``d`` axis sits in the vectorised minor position and the
    per-particle ``r1``/``r2`` multiply each coordinate array without a broadcast.  On the
    2-core CPU this layout runs PSO about 1.5-2x faster than ``(s, d)`` particles.
    """

    agents: swarm.SwarmState
    center: Float[Array, " d"]
    center_loss: Float[Array, ""]
    key: PRNGKeyArray


def _pso_hyper(cfg: PAASOConfig, hyper: PAASOHyper, obj: _Problem) -> swarm.PSOHyperParams:
    low, high = (obj.low, obj.high) if cfg.clip_positions else (-math.inf, math.inf)
    return swarm.PSOHyperParams(
        inertia=hyper.w,
        cognitive=hyper.phi_p,
        social=hyper.phi_g,
        velocity_clamp=hyper.vmax_factor * obj.width,
        position_low=low,
        position_high=high,
    )


def _evaluate(obj: _Problem, coords: Coords) -> Float[Array, " s"]:
    """Objective of every agent; ``coords`` holds the ``d`` coordinate arrays ``(s,)``."""
    return obj.fn(jnp.stack(coords))


def init(
    key: PRNGKeyArray, cfg: PAASOConfig, function: Int[ArrayLike, ""] | None = None
) -> PAASOState:
    """Uniform agents in the domain, zero (or +/-10%-width uniform) velocities, uniform pG.

    ``function``: index into :data:`FUNCTIONS`, only with ``cfg.function=None``.
    """
    return _init(key, cfg, _problem(cfg, function))


def _init(key: PRNGKeyArray, cfg: PAASOConfig, obj: _Problem) -> PAASOState:
    k_pos, k_vel, k_center, k_swarm, k_vote = jax.random.split(key, 5)
    shape = (cfg.dim, cfg.num_agents)
    position = tuple(jax.random.uniform(k_pos, shape, minval=obj.low, maxval=obj.high))
    velocity = None
    if cfg.init_velocity == "uniform":
        span = 0.1 * obj.width
        velocity = tuple(jax.random.uniform(k_vel, shape, minval=-span, maxval=span))
    agents = swarm.init(k_swarm, position, _evaluate(obj, position), velocity)
    center = jax.random.uniform(k_center, (cfg.dim,), minval=obj.low, maxval=obj.high)
    return PAASOState(agents, center, obj.fn(center), k_vote)


def _fl_velocity(
    cfg: PAASOConfig,
    hyper: PAASOHyper,
    clamp: Float[ArrayLike, ""],
    state: PAASOState,
    coeffs: tuple[Coords, Coords],
) -> Coords:
    """The FL agent rule: toward pG when it beats the agent's best, else ``fl_rule``."""
    a = state.agents
    r_p, r_g = coeffs
    use_center = state.center_loss < a.best_loss

    def coordinate(v, x, p, c, rp, rg):
        toward_center = hyper.w * v + hyper.phi_g * rg * (c - p)
        origin = c if cfg.fl_rule == "direction" else x
        toward_own = hyper.w * v + hyper.phi_p * rp * (p - origin)
        return jnp.clip(jnp.where(use_center, toward_center, toward_own), -clamp, clamp)

    center = tuple(state.center)
    return tuple(map(coordinate, a.velocity, a.position, a.best_position, center, r_p, r_g))


def _k_alpha(cfg: PAASOConfig, k_alpha: Int[ArrayLike, ""] | None) -> int | Int[Array, ""]:
    """The static ``cfg.k_alpha``, or the ``k_alpha`` given per call when it is None."""
    if cfg.k_alpha is not None:
        if k_alpha is not None:
            raise ValueError(
                f"k_alpha: give it in PAASOConfig ({cfg.k_alpha}) or per call, not both"
            )
        return cfg.k_alpha
    if k_alpha is None:
        raise ValueError("k_alpha: PAASOConfig(k_alpha=None) needs k_alpha=<int> per call")
    what = f"an integer in [2, {MAX_DATA_K_ALPHA}] when given per call"
    return _int_data("k_alpha", k_alpha, 2, MAX_DATA_K_ALPHA, what)


def _diamond_angle(vx: Float[Array, " s"], vy: Float[Array, " s"]) -> Float[Array, " s"]:
    """A strictly increasing function of the angle ``atan2(vy, vx)`` in ``[0, 2 pi)``, with
    values in ``[0, 4)``: arithmetic and selects only (``atan2`` is a scalar library call on
    the CPU backend and made a voting step ~3x slower than a PSO step).  Zero: 0."""
    norm = jnp.abs(vx) + jnp.abs(vy)
    p = jnp.where(norm > 0, vy / jnp.where(norm > 0, norm, 1.0), 0.0)
    return jnp.where(vx >= 0, jnp.where(vy >= 0, p, 4.0 + p), 2.0 - p)


def _bin_edges(k_alpha: int) -> list[float]:
    """Diamond angles of the edges ``(2j + 1) pi / k_alpha`` between directions j and j+1."""
    edges = []
    for j in range(k_alpha):
        angle = (2 * j + 1) * math.pi / k_alpha
        c, s = math.cos(angle), math.sin(angle)
        p = s / (abs(c) + abs(s))
        edges.append((p if s >= 0 else 4.0 + p) if c >= 0 else 2.0 - p)
    return edges


MAX_DATA_K_ALPHA = 64
"""Largest ``k_alpha`` that can be given per call (``PAASOConfig(k_alpha=None)``)."""

# Row k: the float32 edges of k_alpha = k, then +inf (never below a diamond angle).
_EDGE_TABLE = np.full((MAX_DATA_K_ALPHA + 1, MAX_DATA_K_ALPHA), np.inf, np.float32)
for _k in range(2, MAX_DATA_K_ALPHA + 1):
    _EDGE_TABLE[_k, :_k] = _bin_edges(_k)


def _vote_directions(velocity: Coords, k_alpha: int | Int[Array, ""]) -> Int[Array, " s"]:
    """Index of the direction ``2 pi k / k_alpha`` nearest to each velocity's angle.

    The number of bin edges below the velocity's diamond angle, mod ``k_alpha``: the bins of
    ``round(atan2(vy, vx) k_alpha / 2 pi) mod k_alpha`` (up to float rounding at the edges;
    a zero or non-finite velocity votes 0).  A traced ``k_alpha`` reads its edges from a
    table row (the same float32 edges, so the same bins as the static count).
    """
    dia = _diamond_angle(*velocity)
    if isinstance(k_alpha, int):
        above = sum((dia > e).astype(jnp.int32) for e in _bin_edges(k_alpha))
    else:
        edges = jnp.asarray(_EDGE_TABLE)[k_alpha]
        above = jnp.sum(dia[..., None] > edges, axis=-1, dtype=jnp.int32)
    return above % k_alpha


TRIANGLE_MAX = 1024
"""Largest ballot pool whose casters are ranked by a product with an ``s x s`` triangular
matrix (4 MiB at 1,024); larger pools use ``cumsum``."""


def _dictator(
    u: Float[Array, ""], cast: Bool[Array, " s"], k_alpha: int | Int[Array, ""]
) -> tuple[Int[Array, ""], Bool[Array, ""], Int[Array, ""]]:
    """DP random dictatorship's ballot drawn from one uniform, without counting votes.

    The pool is the casting agents' ballots in agent order, then one dummy per direction;
    ballot ``floor(u n)`` of the ``n = voters + k_alpha`` is drawn, so direction ``a`` wins
    with probability ``(votes for a + 1) / n`` (the mechanism's law; the order of the pool
    does not matter).  Returns ``(who, real, voters)``: ``who`` is the dictator's agent index
    if ``real``, else the dummy's direction.  Casters' ranks come from a product with a
    triangular matrix of ones (exact: integers below 2^24), on the CPU backend cheaper than
    ``cumsum``, and much cheaper than binning and counting every agent's vote; that matrix
    holds ``s^2`` numbers, so pools above :data:`TRIANGLE_MAX` agents count with ``cumsum``
    instead (the same integers, memory linear in the pool).
    """
    s = cast.shape[-1]
    if s > TRIANGLE_MAX:
        rank = jnp.cumsum(cast.astype(jnp.int32), axis=-1)
    else:
        upper = np.triu(np.ones((s, s), np.float32))  # upper[i, j] = [i <= j]
        rank = jnp.dot(cast.astype(jnp.float32), upper).astype(jnp.int32)  # casters in 0..j
    voters = rank[-1]
    pool = voters + k_alpha
    position = jnp.minimum(jnp.floor(u * pool).astype(jnp.int32), pool - 1)
    agent = jnp.sum(rank <= position, dtype=jnp.int32)  # the (position + 1)-th caster
    real = position < voters
    return jnp.where(real, agent, position - voters), real, voters


def _privacy_uniform_count(cfg: PAASOConfig) -> int:
    """Uniforms per iteration: one cast decision per agent (unless ``draw_casts`` is off),
    the dictator, (PbDRD) the PRAM mask of the dictator's ballot."""
    casts = cfg.num_agents if cfg.draw_casts else 0
    return casts + (3 if cfg.strategy in ("pbdrd", ANY_VOTING) else 1)


def _privacy_uniforms(
    cfg: PAASOConfig, key: PRNGKeyArray, iteration: Int[ArrayLike, ""]
) -> Float[Array, " m"]:
    """The privacy randomness of iteration ``iteration``: one ``jax.random`` draw.

    ``(s + 1,)`` uniforms (``s + 3`` for PbDRD or any voting strategy; ``s`` fewer
    without ``draw_casts``) from ``fold_in(key, iteration)``; empty for the strategies that
    do not vote.  ``jax.random`` draws are prefixes of each other (Threefry in its
    partitionable mode), so drawing ``s + 3`` for aDRD leaves its first ``s + 1`` as they are.
    """
    if not cfg.voting:
        return jnp.zeros((0,), jnp.float32)
    return jax.random.uniform(jax.random.fold_in(key, iteration), (_privacy_uniform_count(cfg),))


def _vote(
    cfg: PAASOConfig, hyper: PAASOHyper, rule: _Rule, state: PAASOState, u: Float[Array, " m"]
) -> tuple[Float[Array, " 2"], Int[Array, ""]]:
    """Cast votes, run DP random dictatorship; return the centre's move and voter count.

    ``u``: this iteration's privacy uniforms (:func:`_privacy_uniforms`): ``s`` for casting
    (if drawn), then one for the dictator (:func:`_dictator`) and (PbDRD) two for the PRAM
    mask of the dictator's ballot if it is real: only that ballot reaches the outcome and
    the masks are independent, so the outcome has the law of masking every ballot
    (``mechanisms.random_dictatorship_pram_probs``).  Only the dictator's vote is binned.
    """
    a = state.agents
    s = cfg.num_agents if cfg.draw_casts else 0
    cast = u[:s] < hyper.p_c if cfg.draw_casts else jnp.ones(cfg.num_agents, bool)
    better = a.best_loss < state.center_loss
    if rule.better_only is True:
        cast = cast & better
    elif rule.better_only is not False:  # traced: the voting strategy is data
        cast = cast & (better | ~rule.better_only)
    k_alpha = rule.k_alpha
    who, real, voters = _dictator(u[s], cast, k_alpha)
    agent = jnp.minimum(who, cfg.num_agents - 1)  # any agent when ``who`` is a direction
    ballot = _vote_directions(tuple(v[agent][None] for v in a.velocity), k_alpha)[0]
    outcome = jnp.where(real, ballot, who)
    if rule.pram is not False:  # keep-probability 1 (aDRD, bDRD as data) keeps the ballot
        keep = hyper.p_m if rule.pram is True else jnp.where(rule.pram, hyper.p_m, 1.0)
        masked = randomized_response_from_uniform(u[s + 1 : s + 3], outcome, k_alpha, keep)
        outcome = jnp.where(real, masked, outcome)
    angle = 2.0 * jnp.pi * outcome / k_alpha
    direction = hyper.speed * jnp.stack([jnp.cos(angle), jnp.sin(angle)])
    return direction, voters


def _coefficients(cfg: PAASOConfig, agents: swarm.SwarmState) -> tuple[Coords, Coords]:
    return swarm.coefficients(agents.seed, agents.iteration, agents.position, cfg.options)


Draws = tuple[tuple[Coords, Coords], Float[Array, " m"]]


def _draws(cfg: PAASOConfig, state: PAASOState) -> Draws:
    """All randomness of the state's next iteration: swarm coefficients, privacy uniforms."""
    a = state.agents
    return _coefficients(cfg, a), _privacy_uniforms(cfg, state.key, a.iteration + 1)


def step(
    state: PAASOState,
    cfg: PAASOConfig,
    hyper: PAASOHyper,
    draws: Draws | None = None,
    function: Int[ArrayLike, ""] | None = None,
    voting: Int[ArrayLike, ""] | None = None,
    k_alpha: Int[ArrayLike, ""] | None = None,
) -> tuple[PAASOState, dict[str, Array]]:
    """One iteration of the configured strategy.

    ``draws``: this iteration's randomness if already drawn (``run`` draws it one iteration
    ahead, see :func:`_draws`); drawn here by default.  ``function``: index into
    :data:`FUNCTIONS`, only with ``cfg.function=None``; ``voting``: index into
    :data:`VOTING`, only with ``cfg.strategy="voting"``; ``k_alpha``: only with
    ``cfg.k_alpha=None``.  Metrics: ``objective`` (f(g) for PSO, f(pG) otherwise),
    ``voters`` (0 unless voting).
    """
    rule = _rule(cfg, voting, k_alpha)
    return _step(state, cfg, hyper, _problem(cfg, function), rule, draws)


def _step(
    state: PAASOState,
    cfg: PAASOConfig,
    hyper: PAASOHyper,
    obj: _Problem,
    rule: _Rule,
    draws: Draws | None,
) -> tuple[PAASOState, dict[str, Array]]:
    pso_hyper = _pso_hyper(cfg, hyper, obj)
    a = state.agents
    coeffs, privacy_u = _draws(cfg, state) if draws is None else draws
    if cfg.strategy == "pso":
        a = swarm.move(a, pso_hyper, cfg.options, coeffs=coeffs)
        a = swarm.observe(a, _evaluate(obj, a.position))
        state = state.replace(agents=a)
        return state, {"objective": a.global_best_loss, "voters": jnp.zeros((), jnp.int32)}

    velocity = _fl_velocity(cfg, hyper, pso_hyper.velocity_clamp, state, coeffs)
    low, high = pso_hyper.position_low, pso_hyper.position_high
    position = tuple(jnp.clip(x + v, low, high) for x, v in zip(a.position, velocity, strict=True))
    a = swarm.observe_personal(
        a.replace(position=position, velocity=velocity), _evaluate(obj, position)
    )
    state = state.replace(agents=a)
    if cfg.strategy == "fl":
        mean_velocity = jnp.stack([jnp.mean(v) for v in velocity])
        if cfg.fl_step == "unit":  # the voted step's length, in the mean's direction
            norm = jnp.linalg.norm(mean_velocity)
            mean_velocity = hyper.speed * mean_velocity / jnp.where(norm > 0, norm, 1.0)
        move_by, voters = hyper.w_g * mean_velocity, jnp.zeros((), jnp.int32)
    else:
        direction, voters = _vote(cfg, hyper, rule, state, privacy_u)
        move_by = hyper.w_g * direction
    center = jnp.clip(state.center + move_by, low, high)
    center_loss = obj.fn(center)
    state = state.replace(center=center, center_loss=center_loss)
    return state, {"objective": center_loss, "voters": voters}


def run(
    key: PRNGKeyArray,
    cfg: PAASOConfig,
    hyper: PAASOHyper,
    function: Int[ArrayLike, ""] | None = None,
    voting: Int[ArrayLike, ""] | None = None,
    k_alpha: Int[ArrayLike, ""] | None = None,
) -> dict[str, Array]:
    """Run ``cfg.iterations`` iterations (scan); vmap over keys and hyper-parameters.

    ``function``: index into :data:`FUNCTIONS`, only with ``cfg.function=None`` (leave it
    unbatched under ``vmap``: a batched index would evaluate every function); ``voting``:
    index into :data:`VOTING`, only with ``cfg.strategy="voting"`` (batched is fine);
    ``k_alpha``: only with ``cfg.k_alpha=None`` (batched is fine).  Returns ``objective``
    ``(T,)``, ``voters`` ``(T,)``, ``final_position`` ``(d,)`` (``g`` for PSO, ``pG``
    otherwise), ``final_objective`` and ``nonfinite`` count.
    """
    obj, rule = _problem(cfg, function), _rule(cfg, voting, k_alpha)
    state = _init(key, cfg, obj)

    # The randomness of iteration t+1 is drawn at the end of iteration t and carried: a
    # loop-carried array is computed once, whereas drawn inside the step XLA's CPU fusion
    # copies the generator into every consumer (seven copies of the coefficient hash per
    # iteration, about half the step time).  The numbers are the same either way: a pure
    # function of (key, iteration).
    def body(carry, _: None):
        s, draws = carry
        s, metrics = _step(s, cfg, hyper, obj, rule, draws)
        return (s, _draws(cfg, s)), metrics

    carry = (state, _draws(cfg, state))
    (state, _), traj = jax.lax.scan(body, carry, None, length=cfg.iterations)
    final = jnp.stack(state.agents.global_best) if cfg.strategy == "pso" else state.center
    return {
        **traj,
        "final_position": final,
        "final_objective": traj["objective"][-1],
        "nonfinite": state.agents.nonfinite,
    }


def privacy_summary(
    cfg: PAASOConfig, hyper_p_m: ArrayLike, voters: Int[ArrayLike, "*runs T"], delta: float = 1e-5
) -> dict[str, np.ndarray]:
    """Epsilon spent by voting strategies, per run (numpy, after the run).

    Returns per-run arrays: ``drd_eps_mean`` (mean realised per-iteration DRD epsilon),
    ``drd_eps_bound`` (data-independent per-iteration bound, n = s + k_alpha),
    ``drd_eps_basic`` (T times the bound), ``drd_eps_advanced`` (advanced composition of the
    bound at ``delta``), ``pram_eps_vote`` (per vote) and ``pram_eps_basic`` (T times it, an
    agent voting every iteration).  Non-voting strategies get ``inf``: no DP guarantee.
    """
    if cfg.strategy == ANY_VOTING:
        raise ValueError(f"strategy: privacy_summary needs the run's own, not {ANY_VOTING!r}")
    if cfg.k_alpha is None:
        raise ValueError("k_alpha: privacy_summary needs the run's own, not None")
    voters = np.asarray(voters)
    batch = voters.shape[:-1]
    steps = cfg.iterations
    inf = np.full(batch, np.inf)
    if cfg.strategy not in VOTING:
        return {
            k: inf
            for k in (
                "drd_eps_mean",
                "drd_eps_bound",
                "drd_eps_basic",
                "drd_eps_advanced",
                "pram_eps_vote",
                "pram_eps_basic",
            )
        }
    if voters.size and not 0 <= voters.min() <= voters.max() <= cfg.num_agents:
        raise ValueError(f"voters must be in [0, {cfg.num_agents}]")
    # the epsilon of every possible pool, looked up: a log per iteration and run took most
    # of the --full sweep's Python time
    per_pool = random_dictatorship_epsilon(np.arange(cfg.num_agents + 1) + cfg.k_alpha)
    realised = per_pool[voters]
    bound = float(per_pool[-1])
    advanced, _ = advanced_composition(bound, steps, delta)
    if cfg.strategy == "pbdrd":
        pram = np.broadcast_to(randomized_response_epsilon(hyper_p_m, cfg.k_alpha), batch)
    else:
        pram = inf
    return {
        "drd_eps_mean": realised.mean(axis=-1),
        "drd_eps_bound": np.full(batch, bound),
        "drd_eps_basic": np.full(batch, steps * bound),
        "drd_eps_advanced": np.full(batch, min(advanced, steps * bound)),
        "pram_eps_vote": np.asarray(pram, dtype=float),
        "pram_eps_basic": np.asarray(pram, dtype=float) * steps,
    }
