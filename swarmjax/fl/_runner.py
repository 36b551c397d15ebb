"""Shared runner plumbing of the federated runners (FedAvg, DP-FedAvg, centralised, CL).

* :func:`check_run_inputs`: the common validation (before any compilation);
* :func:`seed_keys` / :func:`split_seed_keys`: seeds -> stacked keys (init and loop halves);
* :func:`scan_rounds`: ``lax.scan`` of a round function, round ``t`` keyed by
  ``fold_in(key, t)`` with ``t`` read from the state's counter (so chunking never changes a
  result);
* :func:`init_over_seeds` / :func:`rounds_over_seeds`: the jitted ``vmap`` over seeds;
* :func:`run_over_seeds`: all of it (init, chunked rounds, progress bar) in one call;
* :func:`run_chunked`, :func:`history_frame`: chunked execution and the long history table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from jaxtyping import Array, ArrayLike, PRNGKeyArray, PyTree
from tqdm.auto import tqdm

from swarmjax._validation import check_int, check_positive
from swarmjax.fl.clients import ClientData, as_test_set, check_federated_inputs
from swarmjax.models import Model

__all__ = [
    "TestSet",
    "as_test_set",
    "check_federated_inputs",
    "check_run_inputs",
    "history_frame",
    "init_over_seeds",
    "rounds_over_seeds",
    "run_chunked",
    "run_from_key",
    "run_over_seeds",
    "scan_rounds",
    "seed_keys",
    "split_seed_keys",
]

TestSet = tuple[Array, Array]


def seed_keys(seeds: int | Sequence[int]) -> tuple[PRNGKeyArray, list[int]]:
    """``(keys, seeds)``: one ``jax.random.key(seed)`` per seed, stacked on axis 0."""
    seed_list = [seeds] if isinstance(seeds, int | np.integer) else list(seeds)
    if not seed_list:
        raise ValueError("seeds must not be empty")
    seed_list = [check_int("seed", s, 0) for s in seed_list]
    keys = jax.vmap(jax.random.key)(jnp.asarray(seed_list, dtype=jnp.uint32))
    return keys, seed_list


def split_seed_keys(
    seeds: int | Sequence[int],
) -> tuple[PRNGKeyArray, PRNGKeyArray, list[int]]:
    """``(init_keys, loop_keys, seeds)``: each seed's key split in two (init, then rounds)."""
    keys, seed_list = seed_keys(seeds)
    split = jax.vmap(jax.random.split)(keys)
    return split[:, 0], split[:, 1], seed_list


def check_run_inputs(
    model: Model,
    clients: ClientData,
    test: tuple[ArrayLike, ArrayLike],
    *,
    rounds: int,
    batch_size: int,
    local_epochs: int | None = None,
    learning_rate: float | None = None,
    num_classes: int | None = None,
    rounds_name: str = "rounds",
) -> tuple[int, TestSet]:
    """Validate a runner's inputs (``ValueError`` naming the culprit) before compiling.

    Checks, in this order: ``rounds >= 1`` (reported as ``rounds_name``), ``local_epochs >= 1``
    and ``learning_rate > 0`` (when given), ``batch_size >= 1``, then model vs data
    (:func:`check_federated_inputs`). Returns ``(rounds, test as float32/int32 arrays)``.
    """
    rounds = check_int(rounds_name, rounds, 1)
    if local_epochs is not None:
        check_int("local_epochs", local_epochs, 1)
    check_int("batch_size", batch_size, 1)
    if learning_rate is not None:
        check_positive("learning_rate", learning_rate)
    test = as_test_set(test)
    check_federated_inputs(model, clients, test, num_classes)
    return rounds, test


def scan_rounds(
    round_fn: Callable[..., tuple[Any, Any]],
    state: Any,
    key: PRNGKeyArray,
    args: tuple,
    *,
    config: Any,
    rounds: int,
    counter: str = "round",
) -> tuple[Any, Any]:
    """Scan ``rounds`` calls ``round_fn(state, fold_in(key, t), *args, config=config)``.

    ``t = getattr(state, counter)`` (the rounds done so far), so a run split into chunks
    draws exactly the keys of an unsplit one.
    """

    def body(s: Any, _: None) -> tuple[Any, Any]:
        return round_fn(s, jax.random.fold_in(key, getattr(s, counter)), *args, config=config)

    return jax.lax.scan(body, state, None, length=rounds)


def run_from_key(
    init_fn: Callable[..., Any],
    round_fn: Callable[..., tuple[Any, Any]],
    key: PRNGKeyArray,
    init_args: tuple,
    args: tuple,
    *,
    config: Any,
    rounds: int,
    counter: str = "round",
) -> tuple[Any, Any]:
    """A whole run from one key: ``init_fn(k0, *init_args, config)``, then ``rounds`` rounds
    keyed from ``k1`` (``k0, k1 = split(key)``); pure, so it can be vmapped over keys."""
    init_key, loop_key = jax.random.split(key)
    state = init_fn(init_key, *init_args, config)
    return scan_rounds(
        round_fn, state, loop_key, args, config=config, rounds=rounds, counter=counter
    )


@partial(jax.jit, static_argnames=("init_fn", "config"))
def init_over_seeds(
    init_fn: Callable[..., Any], keys: PRNGKeyArray, args: tuple, config: Any
) -> PyTree:
    """``vmap`` over keys of ``init_fn(key, *args, config)`` (jitted; ``init_fn`` and
    ``config`` static, so pass module-level functions to share compilations)."""
    return jax.vmap(lambda k: init_fn(k, *args, config))(keys)


@partial(jax.jit, static_argnames=("round_fn", "config", "rounds", "counter"))
def rounds_over_seeds(
    round_fn: Callable[..., tuple[Any, Any]],
    states: PyTree,
    keys: PRNGKeyArray,
    args: tuple,
    config: Any,
    rounds: int,
    counter: str = "round",
) -> tuple[Any, Any]:
    """:func:`scan_rounds` under ``vmap`` over (state, loop key) pairs, jitted; ``args`` are
    shared by every seed."""

    def one(s: Any, k: PRNGKeyArray) -> tuple[Any, Any]:
        return scan_rounds(round_fn, s, k, args, config=config, rounds=rounds, counter=counter)

    return jax.vmap(one)(states, keys)


def run_over_seeds(
    init_fn: Callable[..., Any],
    round_fn: Callable[..., tuple[Any, Any]],
    seeds: int | Sequence[int],
    rounds: int,
    *,
    init_args: tuple,
    args: tuple,
    config: Any,
    counter: str = "round",
    rounds_per_call: int | None = None,
    progress: bool = False,
    desc: str = "",
) -> tuple[Any, Any, list[int]]:
    """Init every seed (first half of its key), then run ``rounds`` rounds (second half),
    all seeds under one ``vmap``, in chunks of ``rounds_per_call`` (same result).

    Returns ``(final states, metrics with (seeds, rounds, ...) leaves, seed list)``.
    """
    init_keys, loop_keys, seed_list = split_seed_keys(seeds)
    states = init_over_seeds(init_fn, init_keys, init_args, config)

    def chunk(s: Any, n: int) -> tuple[Any, Any]:
        return rounds_over_seeds(round_fn, s, loop_keys, args, config, n, counter)

    states, metrics = run_chunked(
        chunk, states, rounds, rounds_per_call=rounds_per_call, progress=progress, desc=desc
    )
    return states, metrics, seed_list


def run_chunked(
    chunk_fn: Callable[..., tuple[Any, Any]],
    state: Any,
    rounds: int,
    *,
    rounds_per_call: int | None,
    progress: bool,
    desc: str,
) -> tuple[Any, Any]:
    """Call ``chunk_fn(state, n) -> (state, metrics)`` until ``rounds`` are done.

    ``chunk_fn`` scans ``n`` rounds (metrics with a round axis at position 1, after the seed
    axis); round keys must come from the round counter in ``state`` so that the chunking
    never changes the result. One chunk (one compilation) unless ``rounds_per_call``.
    """
    rounds = check_int("rounds", rounds, 1)
    per_call = (
        rounds if rounds_per_call is None else check_int("rounds_per_call", rounds_per_call, 1)
    )
    parts = []
    with tqdm(total=rounds, desc=desc, disable=not progress, unit="round") as bar:
        done = 0
        while done < rounds:
            n = min(per_call, rounds - done)
            state, metrics = chunk_fn(state, n)
            parts.append(jax.device_get(metrics))
            done += n
            bar.update(n)
    merged = jax.tree.map(lambda *xs: np.concatenate(xs, axis=1), *parts)
    return state, merged


def history_frame(
    seeds: list[int], metrics: dict[str, np.ndarray], extra: dict[str, np.ndarray], index: str
) -> pd.DataFrame:
    """Long table, one row per (seed, round): scalar metrics ``(seeds, rounds)`` + ``extra``.

    ``extra`` columns have one value per round and are repeated for every seed.
    """
    num_rounds = next(iter(metrics.values())).shape[1]
    frame = {
        "seed": np.repeat(np.asarray(seeds), num_rounds),
        index: np.tile(np.arange(1, num_rounds + 1), len(seeds)),
    }
    for name, value in metrics.items():
        value = np.asarray(value)
        if value.ndim == 2:
            frame[name] = value.reshape(-1)
    for name, value in extra.items():
        frame[name] = np.tile(np.asarray(value), len(seeds))
    return pd.DataFrame(frame)
