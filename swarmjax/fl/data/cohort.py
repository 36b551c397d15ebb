"""Cohort samplers for one round: which clients of the federation train this round.

* :func:`fixed_cohort`: ``size`` distinct clients drawn uniformly without replacement
  (every ``size``-subset equally likely, in uniformly random order). Robert Floyd's
  algorithm: ``size`` draws and an ``O(size)`` membership test each, so a round costs
  ``O(size^2)`` cheap operations, whatever the number of clients (``jax.random.choice(...,
  replace=False)`` permutes all ``N``: a sort of ``N`` per round).
* :func:`poisson_cohort`: every client joins independently with probability ``rate`` (the
  sampling that user-level DP accounting assumes), into a static buffer of ``capacity``
  slots. It is :func:`swarmjax.privacy.sampling.poisson_sample` over the clients: geometric
  gaps, ``O(capacity)`` random numbers, and the whole draw repeated on overflow, never
  truncated. Conditioning on "fits" is charged to delta: :func:`cohort_capacity` sizes the
  buffer so the charge over the run is at most ``share * delta``, and
  :func:`cohort_overflow` is the per-round probability to report. The charge is for the
  add/remove neighbour with one more client, ``P(Binomial(N + 1, rate) > capacity)``.

Both samplers are pure and jit-able (``num_clients``, ``size`` and ``capacity`` static) and
return client ids for :func:`swarmjax.fl.data.store.gather`; an unused Poisson slot holds
id ``-1`` with mask False, which ``gather`` turns into an all-masked client.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Int, PRNGKeyArray

from swarmjax._validation import check_int, check_range
from swarmjax.privacy.sampling import (
    overflow_probability,
    poisson_capacity,
    poisson_sample,
    run_capacity,
    sampler_delta,
)

__all__ = [
    "check_cohort_capacity",
    "cohort_capacity",
    "cohort_overflow",
    "fixed_cohort",
    "poisson_cohort",
]


def fixed_cohort(key: PRNGKeyArray, num_clients: int, size: int) -> Int[Array, " size"]:
    """``size`` distinct client ids in ``[0, num_clients)``, uniform without replacement.

    Floyd's algorithm (``size`` steps, each an ``O(size)`` membership test) followed by a
    uniform shuffle of the ``size`` ids. Raises ``ValueError`` if ``size > num_clients``.
    """
    num_clients = check_int("num_clients", num_clients, 1)
    size = check_int("cohort_size", size, 1)
    if size > num_clients:
        raise ValueError(
            f"cohort_size must be <= num_clients ({num_clients}); got {size}: lower "
            "cohort_size or add clients"
        )
    if num_clients >= 2**31:
        raise ValueError(f"num_clients must be < 2**31; got {num_clients}")
    return _floyd(key, num_clients, size)


def _floyd(key: PRNGKeyArray, n: int, size: int) -> Array:
    draw_key, shuffle_key = jax.random.split(key)
    slots = jnp.arange(size, dtype=jnp.int32)

    def step(i: Array, chosen: Array) -> Array:
        j = n - size + i  # draw t uniform in [0, j]; take j instead if t is already chosen
        t = jax.random.randint(jax.random.fold_in(draw_key, i), (), 0, j + 1, jnp.int32)
        taken = jnp.any((chosen == t) & (slots < i))
        return chosen.at[i].set(jnp.where(taken, j, t))

    chosen = jax.lax.fori_loop(0, size, step, jnp.zeros(size, jnp.int32))
    return jax.random.permutation(shuffle_key, chosen)


def poisson_cohort(
    key: PRNGKeyArray, num_clients: int, rate: ArrayLike, capacity: int
) -> tuple[Int[Array, " capacity"], Bool[Array, " capacity"]]:
    """Every client joins with probability ``rate``, in a buffer of ``capacity`` slots.

    Returns ``(ids, mask)``: ``ids (capacity,)`` int32 client ids in increasing order in
    the slots where ``mask`` is True, ``-1`` elsewhere. A draw with more than ``capacity``
    clients is redrawn (:func:`swarmjax.privacy.sampling.poisson_sample`); size the buffer
    with :func:`cohort_capacity` and charge :func:`cohort_overflow` per round to delta.
    ``rate`` may be traced.
    """
    num_clients = check_int("num_clients", num_clients, 1)
    capacity = check_int("capacity", capacity, 1)
    check_range("rate", rate, 0.0, 1.0, low_open=True)
    ids, mask, _ = poisson_sample(key, rate, jnp.ones(num_clients, bool), capacity)
    return jnp.where(mask, ids, -1), mask


def cohort_overflow(num_clients: int, rate: float, capacity: int) -> float:
    """One round's overflow probability to charge: ``P(Binomial(N + 1, rate) > capacity)``
    (the add/remove neighbour with one more client)."""
    num_clients = check_int("num_clients", num_clients, 1)
    check_range("rate", rate, 0.0, 1.0, low_open=True)
    return overflow_probability(num_clients, rate, check_int("capacity", capacity, 1), add_one=True)


def cohort_capacity(
    num_clients: int,
    rate: float,
    rounds: int,
    delta: float,
    epsilon: float,
    *,
    share: float = 1e-3,
) -> int:
    """Smallest Poisson cohort buffer whose overflow over ``rounds`` rounds adds at most
    ``share * delta`` to an ``(epsilon, delta)`` guarantee (``epsilon``: an upper bound on
    the run's epsilon): :func:`swarmjax.privacy.sampling.run_capacity` for ``N + 1`` clients,
    and never below the per-round floor (overflow under 1e-9,
    :func:`~swarmjax.privacy.sampling.poisson_capacity`) that user-level DP-FedAvg requires.

    Example: 1,200 clients at rate 50/1200, 100 rounds, delta 1/1200, epsilon 2 -> 97.
    """
    num_clients = check_int("num_clients", num_clients, 1)
    check_range("rate", rate, 0.0, 1.0, low_open=True)
    rounds = check_int("rounds", rounds, 1)
    run = run_capacity(
        num_clients, rate, steps=rounds, delta=delta, epsilon=epsilon, share=share, add_one=True
    )
    return max(run, poisson_capacity(num_clients, rate, add_one=True))


def check_cohort_capacity(
    num_clients: int,
    rate: float,
    capacity: int,
    rounds: int,
    delta: float,
    epsilon: float,
    *,
    share: float = 1e-3,
) -> None:
    """One-line ``ValueError`` naming ``capacity`` if it is below :func:`cohort_capacity`:
    its overflow over the run would add more than ``share * delta``, or a round's exceeds
    1e-9 (call before any work)."""
    capacity = check_int("capacity", capacity, 1)
    added = sampler_delta(cohort_overflow(num_clients, rate, capacity), rounds, epsilon)
    need = cohort_capacity(num_clients, rate, rounds, delta, epsilon, share=share)
    if capacity < need:
        raise ValueError(
            f"capacity={capacity} is too small for rate={rate:g} over rounds={rounds}: "
            f"overflow adds {added:.3g} to delta (allowed {share:g} * delta = "
            f"{share * delta:.3g}); use capacity >= {need} (cohort_capacity)"
        )
