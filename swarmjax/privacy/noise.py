"""The noise a user-level plan adds to the sum of clipped updates, as a transform with state.

* :class:`GaussianNoise`: i.i.d. Gaussian noise each round, released ``"snapped"``
  (default: clamped and snapped to a power-of-two grid whose set does not depend on the
  secret, :func:`~swarmjax.privacy.snapping.snapped_gaussian_mechanism`) or ``"float"``
  (plain float32 noise, whose low bits can reveal the secret: Mironov 2012). No state.
* :class:`CorrelatedNoise`: DP-FTRL's matrix-factorization noise ``(C^{-1} z)_t``
  (:mod:`swarmjax.privacy.ftrl`, jax-privacy's strategies); its state is what ``C^{-1}``
  needs (a BLT's buffers, a band's last noises). Released in float32.

Each takes ``(key, total, clip, multiplier, reach, state, strategy)`` and returns the noised
sum and the next state; ``multiplier`` is the std over the clip norm (``sigma_Delta`` times
any ``noise_cohort`` scale) and ``reach`` bounds the secret sum in units of ``clip``
(the reply slots). The count of adaptive clipping is released by :meth:`release_count`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, PRNGKeyArray, PyTree

from swarmjax._validation import check_choice, check_int
from swarmjax.privacy.ftrl import FACTORIZATIONS, Strategy, correlated_noise, noise_state
from swarmjax.privacy.mechanisms import gaussian_mechanism
from swarmjax.privacy.snapping import snapped_gaussian_mechanism

__all__ = [
    "FLOAT_RELEASE",
    "SNAPPED_RELEASE",
    "CorrelatedNoise",
    "GaussianNoise",
    "Noise",
]

SNAPPED_RELEASE = (
    "snapped: the noised sum and count are clamped and snapped to a power-of-two grid "
    "(std/16..std/8), so the set of possible outputs does not depend on the secret; the "
    "epsilon is the ideal Gaussian mechanism's, and the float32 sampler's certified extra "
    "charge grows with the coordinates released (docs/floating_point.md)"
)
FLOAT_RELEASE = (
    "float: plain float32 noise; the exact low bits of a released value can reveal the "
    "secret beyond epsilon (Mironov 2012's attack; docs/floating_point.md)"
)


def _float_release(key: PRNGKeyArray, value: PyTree, scale: Array, multiplier: Array) -> PyTree:
    return gaussian_mechanism(key, value, l2_sensitivity=scale, noise_multiplier=multiplier)


def _snapped_release(
    key: PRNGKeyArray, value: PyTree, scale: Array, multiplier: Array, reach: ArrayLike
) -> PyTree:
    """``value`` plus Gaussian noise of std ``multiplier * scale``, every coordinate
    clamped to ``reach * scale + 12 std`` (``reach * scale`` bounds the secret) and the
    noised value snapped to a power-of-two grid; a zero multiplier (no DP) adds nothing
    and never snaps."""
    bound = scale * (reach + 12.0 * multiplier)

    def snapped(v: PyTree) -> PyTree:
        return snapped_gaussian_mechanism(
            key, v, l2_sensitivity=scale, noise_multiplier=multiplier, bound=bound
        )

    return jax.lax.cond(multiplier > 0, snapped, lambda v: v, value)


@dataclass(frozen=True)
class GaussianNoise:
    """Independent Gaussian noise each round (DP-FedAvg's).

    Attributes:
        release: ``"snapped"`` (default) or ``"float"``.
    """

    release: Literal["snapped", "float"] = "snapped"

    correlated = False

    def __post_init__(self) -> None:
        check_choice("noise_release", self.release, ("snapped", "float"))

    def init(self, strategy: Strategy | None, like: PyTree) -> PyTree:
        """No state."""
        del strategy, like
        return ()

    def add(
        self,
        key: PRNGKeyArray,
        total: PyTree,
        clip: Array,
        multiplier: Array,
        reach: ArrayLike,
        state: PyTree,
        strategy: Strategy | None,
    ) -> tuple[PyTree, PyTree]:
        """``total`` plus ``N(0, (multiplier clip)^2)`` per coordinate, released as
        :attr:`release` says; the state is unchanged (none)."""
        del strategy
        if self.release == "float":
            return _float_release(key, total, clip, multiplier), state
        return _snapped_release(key, total, clip, multiplier, reach), state

    def release_count(
        self, key: PRNGKeyArray, centred: Array, multiplier: Array, reach: ArrayLike
    ) -> Array:
        """The count ``sum (bit - 1/2)`` (sensitivity 1/2, std ``multiplier``), released as
        :attr:`release` says (``reach``: ``|centred| <= reach``)."""
        one = jnp.float32(1.0)
        if self.release == "float":
            return _float_release(key, centred, one, multiplier)
        return _snapped_release(key, centred, one, multiplier, reach)

    def floating_point(self) -> str:
        """What the exact released values reveal beyond epsilon (docs/floating_point.md)."""
        return FLOAT_RELEASE if self.release == "float" else SNAPPED_RELEASE

    def describe(self) -> str:
        """One line for the privacy record."""
        return f"the server adds i.i.d. Gaussian noise to the sum ({self.release} release)"


@dataclass(frozen=True)
class CorrelatedNoise:
    """DP-FTRL's correlated noise: round ``t`` adds ``C_t s (C^{-1} z)_t`` to the sum, with
    ``s = multiplier * sens`` (the strategy's min-separation sensitivity); needs a
    min-separation participation (:class:`~swarmjax.privacy.participation.MinSeparation`).

    Attributes:
        factorization: ``"blt"`` (default), ``"banded"`` or ``"prefix-sum"``
            (:data:`~swarmjax.privacy.ftrl.FACTORIZATIONS`).
        bands: ``"banded"``: bands (``<= b``; ``None``: ``min(b, 32)``).
        buffers: ``"blt"``: buffers (``None``: jax-privacy chooses up to 10).
    """

    factorization: Literal["blt", "banded", "prefix-sum"] = "blt"
    bands: int | None = None
    buffers: int | None = None

    correlated = True

    def __post_init__(self) -> None:
        check_choice("factorization", self.factorization, FACTORIZATIONS)
        if self.bands is not None:
            check_int("bands", self.bands, 1)
        if self.buffers is not None:
            check_int("buffers", self.buffers, 0)

    def init(self, strategy: Strategy, like: PyTree) -> PyTree:
        """The state of ``C^{-1}`` over the coordinates of ``like`` (fixed size)."""
        return noise_state(strategy, like)

    def add(
        self,
        key: PRNGKeyArray,
        total: PyTree,
        clip: Array,
        multiplier: Array,
        reach: ArrayLike,
        state: PyTree,
        strategy: Strategy,
    ) -> tuple[PyTree, PyTree]:
        """``total + clip * (C^{-1} z)_t`` with ``z ~ N(0, (multiplier sens)^2 I)``.

        The mechanism runs on the normalised stream ``x_t / C_t`` (contributions of norm
        ``<= 1``, ``C_t`` public from earlier releases): ``C^{-1}`` acts on noise of
        constant std and the round's noise is scaled back by ``C_t``."""
        del reach
        std = multiplier * strategy.sensitivity
        noise, state = correlated_noise(strategy, state, key, total, std)
        return jax.tree.map(lambda x, e: x + clip * e, total, noise), state

    def release_count(
        self, key: PRNGKeyArray, centred: Array, multiplier: Array, reach: ArrayLike
    ) -> Array:
        """The count with independent float32 noise of std ``multiplier`` each round."""
        del reach
        return _float_release(key, centred, jnp.float32(1.0), multiplier)

    def floating_point(self) -> str:
        """DP-FTRL releases its correlated noise in plain float32 (no snapped release of a
        factorized mechanism exists here yet)."""
        return FLOAT_RELEASE

    def describe(self) -> str:
        """One line for the privacy record."""
        return (
            f"the server adds correlated noise of the {self.factorization!r} matrix "
            "factorization (jax-privacy) to the sum"
        )


Noise = GaussianNoise | CorrelatedNoise
