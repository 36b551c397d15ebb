"""The broken-mechanism drill shared by the in-client record-level audit tests: two runs of
one compiled call, one with the real Gaussian mechanism and one whose noise is scaled down
tenfold while its privacy record still claims the calibrated epsilon."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.fl import simulate
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.privacy import dpsgd


def tenfold_drill(
    alg: Any, clients: Any, test: Any, spec: RunSpec, epsilon: float, broken: float
) -> Any:
    """``simulate`` of ``alg`` at target ``epsilon`` (the real mechanism) and ``broken``
    (``> epsilon``; its Gaussian noise scaled down tenfold, picked by its smaller noise
    multiplier so both runs share one program; the record still claims ``broken``), at
    learning rate 1e-4. No program compiled with the weakened mechanism is kept."""
    variants = Variants.grid(
        alg, clients, spec, epsilon_target=[epsilon, broken], learning_rate=[1e-4]
    )
    sigma = np.asarray(variants.hyper.noise_multiplier)
    cut = float(sigma[1].max() + sigma[0].min()) / 2  # between the two runs' multipliers
    assert sigma[1].max() < cut < sigma[0].min()
    real = dpsgd.gaussian_mechanism

    def weak(key, value, *, l2_sensitivity, noise_multiplier):
        scaled = jnp.where(noise_multiplier < cut, noise_multiplier / 10, noise_multiplier)
        return real(key, value, l2_sensitivity=l2_sensitivity, noise_multiplier=scaled)

    jax.clear_caches()  # no program compiled with the real mechanism is reused, nor kept
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dpsgd, "gaussian_mechanism", weak)
        res = simulate(alg, clients, test, variants)
    jax.clear_caches()
    return res
