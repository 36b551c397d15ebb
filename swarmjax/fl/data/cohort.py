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
  truncated. Conditioning on "fits" is charged to delta by the run's privacy plan
  (:class:`swarmjax.privacy.plan.PrivacyPlan`: it sizes the buffer and states the charge,
  counted for one client more than the federation's, an upper bound for both zero-out
  neighbours).

Under the client-level zero-out relation (:data:`swarmjax.privacy.plan.RELATIONS`) a
neighbouring federation has the same ``num_clients``, so both samplers draw from the same
ids on both sides: a null client keeps its slots and only its data differs.

Both samplers are pure and jit-able (``num_clients``, ``size`` and ``capacity`` static) and
return client ids for :func:`swarmjax.fl.data.store.gather`; an unused Poisson slot holds
id ``-1`` with mask False, which ``gather`` turns into an all-masked client.

:func:`subset_rows` draws, by the same algorithm, the rows a client larger than a per-round
cap trains on (``LocalTraining.max_examples``; :meth:`ClientStore.with_cap
<swarmjax.fl.data.store.ClientStore.with_cap>`).
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Int, PRNGKeyArray

from swarmjax._validation import check_int, check_range
from swarmjax.privacy.sampling import fixed_cohort, floyd_draw, poisson_sample

__all__ = ["fixed_cohort", "poisson_cohort", "subset_rows"]


def subset_rows(key: PRNGKeyArray, n: Int[ArrayLike, ""], size: int) -> Int[Array, " size"]:
    """Row positions of one client's round under a cap of ``size`` rows (pure, jit-able).

    A client of ``n <= size`` rows keeps them all: ``arange(size)`` (its first ``n``
    positions are its rows, the rest padding). A larger client gets ``size`` distinct
    positions of ``[0, n)``, every ``size``-subset equally likely (Floyd's algorithm with
    the traced ``n``: ``O(size^2)`` cheap operations, nothing of size ``n``), increasing.
    """
    size = check_int("size", size, 1)
    n = jnp.asarray(n, jnp.int32)
    every = jnp.arange(size, dtype=jnp.int32)
    drawn = jnp.sort(floyd_draw(key, jnp.maximum(n, size), size))
    return jnp.where(n > size, drawn, every)


def poisson_cohort(
    key: PRNGKeyArray, num_clients: int, rate: ArrayLike, capacity: int
) -> tuple[Int[Array, " capacity"], Bool[Array, " capacity"]]:
    """Every client joins with probability ``rate``, in a buffer of ``capacity`` slots.

    Returns ``(ids, mask)``: ``ids (capacity,)`` int32 client ids in increasing order in
    the slots where ``mask`` is True, ``-1`` elsewhere. A draw with more than ``capacity``
    clients is redrawn (:func:`swarmjax.privacy.sampling.poisson_sample`); size the buffer
    with the run's plan (:meth:`~swarmjax.privacy.plan.PrivacyPlan.sized`, as
    ``Poisson.for_run`` does) and charge its
    :attr:`~swarmjax.privacy.plan.PrivacyPlan.overflow_prob` per round to delta.
    ``rate`` may be traced.
    """
    num_clients = check_int("num_clients", num_clients, 1)
    capacity = check_int("capacity", capacity, 1)
    check_range("rate", rate, 0.0, 1.0, low_open=True)
    ids, mask, _ = poisson_sample(key, rate, jnp.ones(num_clients, bool), capacity)
    return jnp.where(mask, ids, -1), mask
