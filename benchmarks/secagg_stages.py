"""One simulated secure-aggregation round of ``dp-fedavg-secagg``, stage by stage, at the
benchmark's sizes (issue 47, item 3): each stage a jitted function of the whole cohort,
timed with ``block_until_ready`` after a compiling call, the stages interleaved within
each repeat.

Stages (``S`` clients vmapped as the simulator runs them, ``d`` coordinates, ``lam`` each
client's Skellam share, batched over a variant axis of 1 as ``Variants`` batches it):
``rotate`` (the randomized DCT-II, or Hadamard after padding), ``round`` (conditional
rounding with its retry loop, up to 16 draws), ``skellam``, ``to_residues`` (plus the
share, mod ``2^b``), ``secure_sum`` (:func:`~swarmjax.privacy.secagg.secure_sum`, as the
simulator runs it: the clients' masks, seeds and ChaCha20 keystreams, and the server's
unmasking, the survivors' self masks and the dropouts' pair masks), ``decode`` (centring
and the inverse rotation). Timed beside them, not added to the round: its two halves alone
(``masks``: :func:`~swarmjax.privacy.secagg.masked_uploads`; ``unmask``:
:func:`~swarmjax.privacy.secagg.unmask_sum`), and ``bits``: ``S`` ChaCha20 keystreams of
``d`` words, for scale.

Defaults: MNIST's ``simple_cnn`` (``--d 1,199,882`` parameters, rotated in
:func:`~swarmjax.privacy.discrete.rotation_dim` coordinates: 1,200,000 under the DCT), a
cohort of 10, threshold 8,
degree 4, 16 bits and ``lam = 1.78e6`` (what ``python -m benchmarks.secagg`` derives at
epsilon 8 and 16 bits), one dropout.

Example: ``python -m benchmarks.secagg_stages --repeats 5``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

from swarmjax.privacy import discrete, secagg
from swarmjax.privacy.chacha20 import chacha20


def stages(d: int, cohort: int, bits: int, lam: float, rotation: str) -> dict:
    """``name -> (jitted function, its arguments)`` of one round's stages."""
    key = jax.random.key(1, impl=chacha20)
    keys = jax.random.split(key, cohort)
    dim = discrete.rotation_dim(d, rotation)
    x = jnp.pad(jax.random.normal(jax.random.key(0), (cohort, d)) * 1e-4, ((0, 0), (0, dim - d)))
    signs = discrete.rotation_signs(jax.random.key(3), dim)
    scale = jnp.float32(19270.5)  # gamma at 16 bits, epsilon 8
    bound = discrete.certified_bound(jnp.float32(7728.2), dim)
    lam_b = jnp.full((1,), lam, jnp.float32)  # a variant axis of 1
    rnd = secagg.SecAggRound(
        key=jax.random.fold_in(key, 7),
        ids=jnp.arange(cohort, dtype=jnp.int32) * 3,
        selected=jnp.ones(cohort, bool),
        survived=jnp.arange(cohort) != 4,
        bits=bits,
        threshold=max(1, (4 * cohort + 4) // 5),
        degree=secagg.min_degree(cohort, max(1, (4 * cohort + 4) // 5), 0),
        colluders=0,
    )
    rot = jax.jit(jax.vmap(lambda v: discrete.rotate(v, signs, rotation) * scale))
    rnd_ = jax.jit(jax.vmap(lambda k, v: discrete.conditional_round(k, v, bound, 16)))
    sk = jax.jit(
        lambda ks: jax.vmap(lambda lm: jax.vmap(lambda k: discrete.skellam(k, lm, (dim,)))(ks))(
            lam_b
        )[0]
    )
    res = jax.jit(lambda z, s: discrete.to_residues(z + s, bits))
    dec = jax.jit(
        lambda t: discrete.unrotate(
            discrete.from_residues(t, bits).astype(jnp.float32) / scale, signs, rotation
        )
    )
    bits_ = jax.jit(jax.vmap(lambda k: jax.random.bits(k, (dim,), jnp.uint32)))
    r = rot(x)
    z, _ = rnd_(keys, r)
    s = sk(keys)
    up = res(z, s)
    masked = secagg.masked_uploads(up, rnd)
    total, _ = secagg.unmask_sum(masked, rnd)
    return {
        "rotate": (rot, (x,)),
        "round": (rnd_, (keys, r)),
        "skellam": (sk, (keys,)),
        "to_residues": (res, (z, s)),
        "secure_sum": (lambda u: secagg.secure_sum(u, rnd), (up,)),
        "decode": (dec, (total,)),
        "  masks alone": (lambda u: secagg.masked_uploads(u, rnd), (up,)),
        "  unmask alone": (lambda m: secagg.unmask_sum(m, rnd), (masked,)),
        "bits (for scale)": (bits_, (keys,)),
    }


PARTS = ("  masks alone", "  unmask alone", "bits (for scale)")
"""Stages timed for attribution only, not added to the round: ``secure_sum`` is the two
first ones as the simulator runs them (:func:`~swarmjax.privacy.secagg.secure_sum`)."""


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.secagg_stages",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--d", type=int, default=1_199_882, help="coordinates (1,199,882)")
    p.add_argument("--cohort", type=int, default=10, help="clients (10)")
    p.add_argument("--bits", type=int, default=16, help="bits per coordinate (16)")
    p.add_argument("--lam", type=float, default=1.77664e6, help="Skellam share (1.78e6)")
    p.add_argument("--rotation", default="dct", choices=discrete.ROTATIONS)
    p.add_argument("--repeats", type=int, default=5, help="timed repeats (5)")
    args = p.parse_args(argv)
    work = stages(args.d, args.cohort, args.bits, args.lam, args.rotation)
    for fn, a in work.values():
        jax.block_until_ready(fn(*a))
    times: dict[str, list[float]] = {name: [] for name in work}
    for _ in range(args.repeats):
        for name, (fn, a) in work.items():
            t = time.perf_counter()
            jax.block_until_ready(fn(*a))
            times[name].append(time.perf_counter() - t)
    total = 0.0
    for name, v in times.items():
        med = statistics.median(v)
        total += 0.0 if name in PARTS else med
        print(f"{name:18s} median {med:7.3f} s  ({min(v):.3f}-{max(v):.3f})")
    print(f"{'round (sum)':18s} median-sum {total:7.3f} s")


if __name__ == "__main__":
    main()
