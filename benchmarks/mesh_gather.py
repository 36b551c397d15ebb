"""How a device on a split federation receives its cohort slots' rows: the ring of
``ppermute``s the simulator uses (:func:`swarmjax.fl.runtime.mesh.gather_slots`) against one
``psum_scatter`` of a whole cohort's buffer (owned rows as integers, zeros elsewhere) and
one ``all_to_all`` (docs/scaling.md, "Which collective").

Random float32 rows of ``--clients`` clients split over ``--devices`` CPU virtual devices
(set before JAX starts), ``--slots`` distinct clients drawn as the cohort; every method's
rows are checked against the direct gather (bit for bit), then timed alternately, the
median of ``--repeats`` calls each.

``python -m benchmarks.mesh_gather [--devices 4] [--clients 1200] [--slots 96] [--row 39200]``
"""

from __future__ import annotations

import os
import statistics
import time

from benchmarks import _cli as _bcli
from experiments import _cli


def _methods(mesh, block: int, share: int) -> dict:
    import jax
    import jax.numpy as jnp

    from swarmjax.fl.runtime.mesh import CLIENTS, block_rows, gather_slots

    d = int(mesh.shape[CLIENTS])

    def ring(rows, ids):
        return gather_slots(mesh, block_rows(rows), block, ids, share)

    def owned(rows, ids):  # this device's rows of every slot, and which slots it owns
        me = jax.lax.axis_index(CLIENTS)
        return rows[jnp.clip(ids - me * block, 0, block - 1)], ids // block == me

    def psum_scatter(rows, ids):
        mine, own = owned(rows, ids)
        bits = jnp.where(own[:, None], jax.lax.bitcast_convert_type(mine, jnp.uint32), 0)
        got = jax.lax.psum_scatter(bits, CLIENTS, scatter_dimension=0, tiled=True)
        return jax.lax.bitcast_convert_type(got, jnp.float32)

    def all_to_all(rows, ids):
        mine, _ = owned(rows, ids)
        got = jax.lax.all_to_all(mine.reshape(d, share, -1), CLIENTS, 0, 0, tiled=False)
        me = jax.lax.axis_index(CLIENTS)
        source = jax.lax.dynamic_slice_in_dim(ids, me * share, share) // block
        return jnp.take_along_axis(got, source[None, :, None], axis=0)[0]

    return {"ring (ppermute)": ring, "psum_scatter": psum_scatter, "all_to_all": all_to_all}


def main(argv: list[str] | None = None) -> None:
    p = _bcli.parser("mesh_gather", __doc__.split("\n\n")[0])
    p.add_argument("--devices", type=_cli.count("--devices", 2), default=4, help="CPU devices (4)")
    p.add_argument("--clients", type=_cli.count("--clients"), default=1200, help="(1200)")
    p.add_argument(
        "--slots", type=_cli.count("--slots"), default=96, help="a multiple of --devices (96)"
    )
    p.add_argument(
        "--row", type=_cli.count("--row"), default=39200, help="float32 values per client"
    )
    p.add_argument("--repeats", type=_cli.count("--repeats"), default=21, help="(21)")
    args = p.parse_args(argv)
    if args.slots % args.devices or args.clients % args.devices or args.slots > args.clients:
        p.error("--devices must divide --slots and --clients, and --slots <= --clients")
    flag = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()

    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    from swarmjax.fl.runtime.mesh import CLIENTS, clients_mesh

    jax.config.update("jax_platforms", "cpu")
    mesh = clients_mesh(args.devices)
    rng = np.random.default_rng(0)
    host = rng.random((args.clients, args.row), dtype=np.float32)
    cohort = rng.permutation(args.clients)[: args.slots].astype(np.int32)
    rows = jax.device_put(host, NamedSharding(mesh, PartitionSpec(CLIENTS)))
    ids = jax.device_put(cohort, NamedSharding(mesh, PartitionSpec()))
    split, whole = PartitionSpec(CLIENTS), PartitionSpec()
    block, share = args.clients // args.devices, args.slots // args.devices
    calls = {}
    for name, fn in _methods(mesh, block, share).items():
        calls[name] = jax.jit(
            jax.shard_map(fn, mesh=mesh, in_specs=(split, whole), out_specs=split, check_vma=False)
        )
        exact = np.array_equal(np.asarray(calls[name](rows, ids)), host[cohort])
        if not exact:
            raise SystemExit(f"{name}: rows differ from the direct gather")
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.repeats):
        for name, call in calls.items():
            started = time.perf_counter()
            call(rows, ids).block_until_ready()
            times[name].append(time.perf_counter() - started)
    mib = args.slots * args.row * 4 / 2**20
    print(
        f"{args.slots} slots of {args.clients} clients ({mib:.3g} MiB of rows) over "
        f"{args.devices} cpu devices, median of {args.repeats}, every method bit for bit:"
    )
    for name, ts in times.items():
        print(f"  {name}: {statistics.median(ts) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
