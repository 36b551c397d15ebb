"""Shared runner plumbing: seeds -> keys, chunked scans with a progress bar, history frames."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from jaxtyping import PRNGKeyArray
from tqdm.auto import tqdm

from swarmjax._validation import check_int

__all__ = ["history_frame", "run_chunked", "seed_keys"]


def seed_keys(seeds: int | Sequence[int]) -> tuple[PRNGKeyArray, list[int]]:
    """``(keys, seeds)``: one ``jax.random.key(seed)`` per seed, stacked on axis 0."""
    seed_list = [seeds] if isinstance(seeds, int | np.integer) else list(seeds)
    if not seed_list:
        raise ValueError("seeds must not be empty")
    seed_list = [check_int("seed", s, 0) for s in seed_list]
    keys = jax.vmap(jax.random.key)(jnp.asarray(seed_list, dtype=jnp.uint32))
    return keys, seed_list


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
