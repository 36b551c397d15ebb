"""Combined learning (CL, seed 004, algorithms.md section 6): a non-convex elementwise combination.

Clients ``h = 1..K`` with relevances ``r_h = |D_h| / |D|`` and a parameter ``c`` ("conv")
combine every leaf ``a`` of their parameter pytrees (stacked: ``a_h = a[h]``) elementwise::

    a'_h      = r_h a_h                                           (scaled copies)
    spread    = sqrt( sum_{h<l} (a'_h - a'_l)^2 )                 (elementwise)
    threshold = sqrt( sum_elements sum_{h<l} (a_h - a_l)^2 ) / numel(a)   (scalar, UNscaled)
    mix       = sum_h exp(c r_h) a'_h
    new       = mix + spread  where spread <= threshold,  else mix.

The thesis's printed listing (Programa B.3) computes spread and mix on the unscaled ``a_h``;
the authors' code (``coln.py`` of melloguel/tcc-coln) multiplies every layer by ``r_h``
after the threshold and before spread and mix. The spec follows the code: that is
``variant="code"`` (default); ``variant="listing"`` reproduces the printed listing.
The authors ran ``c = 0.01`` (the default here).

FedAvg is the same loop with ``new = sum_h r_h a_h``
(:func:`swarmjax.fl.algorithms.common.weighted_average`). :class:`CombinedAggregator` has
FedAvg's ``combine(client_params, weights)`` signature, so CL is
``FedAvg(model, training, combine=CombinedAggregator(conv))`` run by
:func:`swarmjax.fl.runtime.simulate` (clients train E epochs, the server combines, every
client restarts from the combination).

Pairwise sums. ``sum_{h<l} (x_h - x_l)^2 = K sum_h x_h^2 - (sum_h x_h)^2`` is exact in real
arithmetic but cancels catastrophically in float32 when the clients are close (the usual
case: they all start each round from the same model), and can even go negative. We use the
equal, centred form ``K sum_h (x_h - mean_h x)^2`` instead: a sum of squares (never
negative, so no clamp is needed before the square root), O(K) work and memory per element
like the raw identity, and no O(K^2) pairwise tensor.

The "each client alone" baseline is :class:`swarmjax.fl.algorithms.local_only.LocalOnly`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PyTree

from swarmjax._validation import check_choice, check_finite

__all__ = [
    "VARIANTS",
    "CombinedAggregator",
    "combine",
    "combine_leaf",
    "pairwise_sq_sum",
    "relevance",
]

VARIANTS = ("code", "listing")
Variant = Literal["code", "listing"]


def relevance(sizes: ArrayLike) -> Float[Array, " clients"]:
    """``r_h = |D_h| / sum_l |D_l|`` from client sizes ``(K,)``."""
    sizes = jnp.asarray(sizes, jnp.float32)
    return sizes / jnp.sum(sizes)


def pairwise_sq_sum(x: Float[Array, " clients *shape"]) -> Float[Array, "*shape"]:
    """Elementwise ``sum_{h<l} (x_h - x_l)^2`` over the leading client axis (always >= 0).

    Computed as ``K sum_h (x_h - mean x)^2`` (see the module docstring for why not
    ``K sum x^2 - (sum x)^2``).
    """
    centred = x - jnp.mean(x, axis=0, keepdims=True)
    return x.shape[0] * jnp.sum(centred * centred, axis=0)


def combine_leaf(
    a: Float[Array, " clients *shape"],
    r: Float[Array, " clients"],
    conv: float | Float[Array, ""] = 0.01,
    *,
    variant: Variant = "code",
) -> Float[Array, "*shape"]:
    """Combine one stacked leaf ``a`` (client axis first) with relevances ``r`` (spec 6).

    Arithmetic is float32 (float64 for float64 leaves); the result has ``a``'s dtype.
    """
    dtype = jnp.result_type(a.dtype, jnp.float32)
    a32 = a.astype(dtype)
    r = r.astype(dtype)
    threshold = jnp.sqrt(jnp.sum(pairwise_sq_sum(a32))) / a32[0].size
    scaled = a32 * r.reshape((-1,) + (1,) * (a.ndim - 1)) if variant == "code" else a32
    spread = jnp.sqrt(pairwise_sq_sum(scaled))
    mix = jnp.tensordot(jnp.exp(conv * r), scaled, axes=1)
    return jnp.where(spread <= threshold, mix + spread, mix).astype(a.dtype)


def _check_relevance(r: ArrayLike) -> None:
    if isinstance(r, jax.core.Tracer):
        return
    arr = np.asarray(r, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"relevance must be a non-empty vector (clients,); got shape {arr.shape}")
    check_finite("relevance", arr)
    if (arr < 0).any():
        raise ValueError(f"relevance must be >= 0; got min {arr.min()!r}")


def combine(
    client_params: PyTree,
    relevance: Float[Array, " clients"],
    conv: float | Float[Array, ""] = 0.01,
    *,
    variant: Variant = "code",
) -> PyTree:
    """Combined-learning combination of every leaf of ``client_params`` (algorithms.md section 6).

    Args:
        client_params: pytree whose leaves have a leading client axis ``K`` (any shapes).
        relevance: ``(K,)`` ``r_h``, normally ``|D_h| / |D|`` (:func:`relevance`); used as
            given (the authors assert they sum to 1; unnormalised values are not rescaled).
        conv: ``c``, the exponent's factor (the authors used 0.01).
        variant: ``"code"`` (the authors' code, spec) or ``"listing"`` (printed listing).

    Returns:
        one combined pytree without the client axis.
    """
    check_choice("variant", variant, VARIANTS)
    check_finite("conv", conv)
    _check_relevance(relevance)
    r = jnp.asarray(relevance)
    k = r.shape[0]
    for path, leaf in jax.tree_util.tree_leaves_with_path(client_params):
        if leaf.ndim == 0 or leaf.shape[0] != k:
            raise ValueError(
                f"client_params leaf {jax.tree_util.keystr(path)} has shape {leaf.shape}; "
                f"it needs a leading client axis of length {k} (len(relevance))"
            )
    return jax.tree.map(lambda a: combine_leaf(a, r, conv, variant=variant), client_params)


@dataclass(frozen=True)
class CombinedAggregator:
    """CL as a FedAvg ``aggregate(client_params, weights)``; ``weights`` are ``|D_h|``.

    Hashable (a static field of :class:`~swarmjax.fl.algorithms.fedavg.FedAvg`), so equal
    settings share one compilation.
    """

    conv: float = 0.01
    variant: Variant = "code"

    def __post_init__(self) -> None:
        check_finite("conv", self.conv)
        check_choice("variant", self.variant, VARIANTS)

    def __call__(self, client_params: PyTree, weights: Float[Array, " clients"]) -> PyTree:
        return combine(client_params, relevance(weights), self.conv, variant=self.variant)
