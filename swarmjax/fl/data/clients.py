"""Stacked clients: clients of unequal size padded to one shape, so one vmap runs them all.

:class:`ClientData` holds one client (``x: (n, ...)``) or, with a leading client axis,
all of them (``x: (clients, n, ...)``); ``jax.vmap`` over a stacked ``ClientData`` hands
each client's slice to a function written for one client. Row ``j`` of client ``i`` is
real data iff ``mask[i, j]``; real rows come first (``mask[i, j] == (j < sizes[i])``).
Padded rows hold ``pad_value`` and a label 0; every loss and gradient in swarmjax masks
them out (see :func:`swarmjax.models.loss`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from swarmjax._validation import check_finite, check_int
from swarmjax.models import Model, check_model

__all__ = [
    "ClientData",
    "as_test_set",
    "check_federated_inputs",
    "client",
    "poisson_rates",
    "stack_clients",
]


@flax.struct.dataclass
class ClientData:
    """Padded client data (a pytree). Shapes for the stacked form; drop ``clients`` for one.

    Attributes:
        x: ``(clients, max_n, *example_shape)`` float inputs.
        y: ``(clients, max_n)`` int32 labels (0 in padded rows).
        mask: ``(clients, max_n)`` bool, True on real rows.
        sizes: ``(clients,)`` int32, ``|D_i|`` = number of real rows.
    """

    x: Float[Array, "clients max_n ..."]
    y: Int[Array, "clients max_n"]
    mask: Bool[Array, "clients max_n"]
    sizes: Int[Array, " clients"]

    @property
    def num_clients(self) -> int:
        """Leading (client) axis length of a stacked ``ClientData``."""
        return int(self.sizes.shape[0])

    @property
    def max_size(self) -> int:
        """``max_n``, the padded number of rows per client."""
        return int(self.y.shape[-1])


def stack_clients(
    x: ArrayLike,
    y: ArrayLike,
    indices: Sequence[ArrayLike],
    *,
    pad_to: int | None = None,
    pad_value: float = 0.0,
) -> ClientData:
    """Gather each client's rows and pad them into one stacked :class:`ClientData`.

    Args:
        x: ``(n, ...)`` all examples; y: ``(n,)`` integer labels.
        indices: one index array per client (e.g. ``Partition.indices``), none empty.
        pad_to: rows per client (default: the largest client); must be >= every size.
        pad_value: value written into padded rows of ``x`` (tests use NaN to prove that
            padded rows never reach a loss or a gradient).
    """
    x = np.asarray(x)
    y = np.asarray(y)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y must have the same length; got {x.shape[0]} and {y.shape[0]}")
    if len(indices) == 0:
        raise ValueError("indices must hold at least one client")
    if not np.isfinite(x).all():
        raise ValueError("x must be finite (no NaN or inf)")
    idx = [np.asarray(i, dtype=np.int64).reshape(-1) for i in indices]
    sizes = np.array([len(i) for i in idx], dtype=np.int32)
    if (sizes == 0).any():
        raise ValueError(
            f"every client needs at least one example; {_ids_text(np.flatnonzero(sizes == 0))} "
            "are empty"
        )
    for i in idx:
        if i.min() < 0 or i.max() >= x.shape[0]:
            raise ValueError(f"indices must be in [0, {x.shape[0] - 1}]")
    max_n = int(sizes.max()) if pad_to is None else check_int("pad_to", pad_to, int(sizes.max()))
    xs = np.full((len(idx), max_n, *x.shape[1:]), pad_value, dtype=np.float32)
    ys = np.zeros((len(idx), max_n), dtype=np.int32)
    for c, rows in enumerate(idx):  # host-side gather, once per experiment
        xs[c, : len(rows)] = x[rows]
        ys[c, : len(rows)] = y[rows]
    mask = np.arange(max_n)[None, :] < sizes[:, None]
    return ClientData(
        # placed, not jnp.asarray'd: that compiles a copy program per shape
        **jax.device_put({"x": xs, "y": ys, "mask": mask, "sizes": sizes})
    )


def client(data: ClientData, i: int) -> ClientData:
    """Client ``i`` of a stacked :class:`ClientData`, still padded to ``max_n`` rows."""
    return ClientData(x=data.x[i], y=data.y[i], mask=data.mask[i], sizes=data.sizes[i])


def poisson_rates(sizes: ArrayLike, batch_size: float) -> np.ndarray:
    """Per-client Poisson sampling rate ``q_i = B / |D_i|`` (float64, one per client).

    Raises ``ValueError`` unless ``0 < B <= min |D_i|`` (a rate must be a probability).
    """
    sizes = np.asarray(sizes, dtype=np.float64).reshape(-1)
    check_finite("batch_size", batch_size)
    if not batch_size > 0:
        raise ValueError(f"batch_size must be > 0; got {batch_size!r}")
    if (sizes <= 0).any():
        raise ValueError("every client size must be >= 1")
    if batch_size > sizes.min():
        raise ValueError(
            f"batch_size must be <= the smallest client size {int(sizes.min())} so that "
            f"q_i = B / |D_i| <= 1; got {batch_size!r}"
        )
    return batch_size / sizes


def as_test_set(test: tuple[ArrayLike, ArrayLike]) -> tuple[Array, Array]:
    """``(x float32, y int32)`` device arrays."""
    return jnp.asarray(test[0], jnp.float32), jnp.asarray(test[1], jnp.int32)


def check_federated_inputs(
    model: Model,
    clients: ClientData | Any,
    test: tuple[Array, Array] | None,
    num_classes: int | None = None,
) -> None:
    """Raise ``ValueError`` (before any compilation) on mismatched model and data.

    Checks the example shape of clients and test set (``None``: the clients only) against
    ``model.input_shape``, the model's output size against ``num_classes`` (when given),
    and every label against the model's output size.
    """
    flat = not isinstance(clients, ClientData)  # a ClientStore: rows back to back
    example_shape = tuple(clients.x.shape[1:] if flat else clients.x.shape[2:])
    if test is not None and tuple(test[0].shape[1:]) != example_shape:
        raise ValueError(
            f"test examples have shape {tuple(test[0].shape[1:])}, clients {example_shape}"
        )
    check_model(model, model.num_classes if num_classes is None else num_classes, example_shape)
    labels = [np.asarray(clients.y) if flat else np.asarray(clients.y)[np.asarray(clients.mask)]]
    if test is not None:
        labels.append(np.asarray(test[1]))
    labels = np.concatenate(labels)
    if labels.min() < 0 or labels.max() >= model.num_classes:
        raise ValueError(
            f"labels must be in [0, {model.num_classes - 1}] for model {model.name!r} with "
            f"{model.num_classes} outputs; got [{labels.min()}, {labels.max()}]"
        )


def _ids_text(ids: np.ndarray, shown: int = 8) -> str:
    """``clients 3, 7, 9`` or ``412 clients (3, 7, 9, ... 1203)``: a list of any length in
    a few words."""
    ids = [int(i) for i in ids]
    if len(ids) <= shown:
        return "clients " + ", ".join(map(str, ids))
    return f"{len(ids)} clients ({', '.join(map(str, ids[: shown - 1]))}, ... {ids[-1]})"
