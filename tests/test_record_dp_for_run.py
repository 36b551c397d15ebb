"""``RecordDP.for_run``: one Poisson buffer for a whole run (several partitions, several
targets) that lets record-level DP reach its target epsilon."""

from __future__ import annotations

import math

import numpy as np

from swarmjax.fl.algorithms.common import record_level_noise
from swarmjax.fl.client.record_dp import sampler_capacity
from swarmjax.fl.client.training import LocalTraining, RecordDP
from swarmjax.fl.protocol import RunSpec
from swarmjax.privacy.accounting import epsilon


def test_the_run_buffer_lets_dp_reach_its_target():
    """With the per-step 1e-9 buffer the overflow charge P (1 + e^eps) caps epsilon near 6
    here; the run-level buffer reaches the target (within the bisection's tolerance)."""
    sizes = np.array([200, 200, 200])
    dp = RecordDP.for_run([sizes], 32, rounds=3, epsilons=[math.inf, 8.0], delta=1e-5)
    training = LocalTraining(batch_size=32, record_dp=dp)
    overflow = training.sampler_overflow(sizes, 200)
    sigma = record_level_noise(training, sizes, RunSpec(3, 1e-5), 8.0)
    eps = epsilon(32 / 200, float(sigma[0]), steps=21, delta=1e-5, overflow_prob=overflow[0])
    assert 7.9 <= eps <= 8.0
    assert dp.capacity > sampler_capacity(sizes, 32)
    plain = RecordDP.for_run([sizes], 32, rounds=3, epsilons=[math.inf], delta=1e-5)
    assert plain.capacity == sampler_capacity(sizes, 32)


def test_one_buffer_serves_every_partition_and_target():
    """The largest of each partition's run buffer at the largest finite target; equal to
    ``for_sizes`` with that partition's steps when it is the only one."""
    a, b = np.array([150, 250, 200]), np.array([90, 310, 200])
    both = RecordDP.for_run([a, b], 32, rounds=4, epsilons=[5.0, 10.0], delta=1e-5, epochs=2)
    for sizes in (a, b):
        steps = 4 * 2 * math.ceil(int(sizes.max()) / 32)
        alone = RecordDP.for_sizes(sizes, 32, steps=steps, delta=1e-5, epsilon=10.0)
        one = RecordDP.for_run([sizes], 32, rounds=4, epsilons=[10.0, 5.0], delta=1e-5, epochs=2)
        assert one == alone and both.capacity >= alone.capacity
    assert both.capacity == max(
        RecordDP.for_run([s], 32, rounds=4, epsilons=[10.0], delta=1e-5, epochs=2).capacity
        for s in (a, b)
    )
