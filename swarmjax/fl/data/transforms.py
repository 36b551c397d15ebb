"""Input transforms applied to a :class:`~swarmjax.fl.data.datasets.Dataset` before it is
cut into clients, and what each one releases about the clients' data."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from swarmjax._validation import check_choice
from swarmjax.fl.data.datasets import Dataset

__all__ = ["INPUT_SCALINGS", "PIXEL_STD_FLOOR", "SCALING_PRIVACY", "public_mask", "scale_inputs"]

INPUT_SCALINGS = ("channel", "pixel_public", "none")
PIXEL_STD_FLOOR = 0.1  # a pixel nearly constant in the public rows is divided by 0.1 at most
SCALING_PRIVACY = {
    "channel": "inputs scaled by the mean/std of all training pixels (2 numbers of the "
    "clients' pooled data, NOT covered by epsilon)",
    "pixel_public": "inputs scaled by per-pixel statistics of held-out public rows (no cost)",
    "none": "inputs in [0, 1]",
}


def public_mask(n: int, public_rows: int, seed: int = 0) -> np.ndarray:
    """``(n,)`` bool: the ``public_rows`` training rows drawn with ``default_rng(seed)``
    (public randomness) and held out of every client."""
    if not 1 <= public_rows < n:
        raise ValueError(f"public_rows must be in [1, {n - 1}]; got {public_rows}")
    public = np.zeros(n, bool)
    public[np.random.default_rng(seed).choice(n, public_rows, replace=False)] = True
    return public


def scale_inputs(ds: Dataset, how: str, public_rows: int, seed: int = 0) -> Dataset:
    """``ds`` (pixels in ``[0, 1]``) scaled as ``how`` says.

    ``channel``: minus the mean, over the std, of every training pixel per channel (2
    numbers of the clients' pooled data, not accounted: see docs/fed_dp_pso.md);
    ``pixel_public``: per-pixel mean and std (std floored at :data:`PIXEL_STD_FLOOR`) of
    ``public_rows`` training rows drawn with ``default_rng(seed)`` and REMOVED from the
    training split, so no client holds them (public data: costs no privacy); ``none``."""
    check_choice("input_scaling", how, INPUT_SCALINGS)
    if how == "none":
        return ds
    if how == "channel":
        axes = tuple(range(ds.x_train.ndim - 1))
        mean, std = ds.x_train.mean(axis=axes), ds.x_train.std(axis=axes)
        std = np.where(std > 0, std, 1.0)
        x_train = ds.x_train
    else:
        public = public_mask(len(ds.y_train), public_rows, seed)
        mean = ds.x_train[public].mean(axis=0)
        std = np.maximum(ds.x_train[public].std(axis=0), PIXEL_STD_FLOOR)
        x_train, ds = ds.x_train[~public], replace(ds, y_train=ds.y_train[~public])
    mean, std = mean.astype(np.float32), std.astype(np.float32)
    return replace(ds, x_train=(x_train - mean) / std, x_test=(ds.x_test - mean) / std)
