"""One run's cohort over a device mesh: the slots of a summed exchange split over a
``clients`` mesh axis (and the runs over a ``runs`` axis when the mesh has one).

Each device gathers the data and client states of its share of the cohort's slots (its
slots' ids; the federation's data and states stay replicated), trains those clients,
adds their replies in slot order into its partial sum, and one ``psum`` over the
``clients`` axis gives every device the cohort's sum; the server step then runs once, on
that sum. Written with :func:`jax.shard_map` inside the one compiled program of a call
(docs/scaling.md says why not DrJAX). Per-client randomness is keyed by client id
(:func:`~swarmjax.fl.protocol.client_key`), so a client draws the same numbers on any
device; the sum is added in another order (per device, then across devices), so a
sharded run equals the unsharded one to float32 rounding, not bit for bit (one device:
bit for bit).

The same program runs on one host with several devices and over ``jax.distributed``
processes (every process calls it with the same arguments; :func:`clients_mesh` spans all
processes' devices).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array, Bool, Int, PyTree

from swarmjax.device import memory_stats

__all__ = [
    "CLIENTS",
    "RUNS",
    "CohortMemory",
    "check_memory",
    "check_mesh_options",
    "clients_mesh",
    "describe",
    "mesh_for",
    "peak_memory",
    "replicated",
    "shard_cohort",
]

CLIENTS = "clients"
"""The mesh axis a run's cohort slots are split over."""
RUNS = "runs"
"""The mesh axis a call's runs (seeds, variants) are split over, when the mesh has one."""


def clients_mesh(
    devices: int | None = None, *, runs: int = 1, processes: int | None = None
) -> Mesh:
    """A mesh over the first ``devices`` of :func:`jax.devices` (every process's; default:
    all of them): axis ``("clients",)`` of size ``devices``, or ``("runs", "clients")`` of
    shape ``(runs, devices // runs)`` with ``runs > 1``. ``processes``: the
    ``jax.distributed`` process count the caller expects (``None``: whatever runs).

    Bad input is one ``ValueError`` line, before any work: more devices than present, a
    ``runs`` that does not divide ``devices``, a process count other than
    :func:`jax.process_count`.
    """
    present = jax.devices()
    if processes is not None and processes != jax.process_count():
        raise ValueError(
            f"processes={processes} but jax.distributed runs {jax.process_count()} "
            f"process(es) (jax.process_count()); start each process with "
            f"jax.distributed.initialize(num_processes={processes}, ...) or pass processes=None"
        )
    n = len(present) if devices is None else devices
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"devices must be an int >= 1 or None; got {devices!r}")
    if n > len(present):
        raise ValueError(
            f"devices={n} but {len(present)} present ({jax.default_backend()}, "
            f"{jax.process_count()} process(es)); pass devices <= {len(present)}"
        )
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1 or n % runs:
        raise ValueError(f"runs must be an int >= 1 dividing devices={n}; got {runs!r}")
    chosen = np.asarray(present[:n], dtype=object)
    if runs == 1:
        return Mesh(chosen, (CLIENTS,))
    return Mesh(chosen.reshape(runs, n // runs), (RUNS, CLIENTS))


def check_mesh_options(mesh: Any, clients_per_device: Any) -> None:
    """One ``ValueError`` line unless ``mesh`` is ``None`` or a mesh with a ``clients`` axis
    (and at most a ``runs`` axis), ``clients_per_device`` is ``None`` or an int ``>= 1``,
    and at most one of them is given; what the devices present allow is
    :func:`mesh_for`'s to check."""
    if mesh is not None and clients_per_device is not None:
        raise ValueError("pass mesh= or clients_per_device=, not both")
    k = clients_per_device
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError(f"clients_per_device must be an int >= 1; got {k!r}")
    if mesh is None:
        return
    if not isinstance(mesh, Mesh):
        raise ValueError(f"mesh must be a jax.sharding.Mesh or None; got {type(mesh).__name__}")
    names = tuple(mesh.axis_names)
    if CLIENTS not in names or not set(names) <= {CLIENTS, RUNS}:
        raise ValueError(
            f"mesh must have a {CLIENTS!r} axis and at most a {RUNS!r} axis besides; "
            f"got axes {names} (build one with swarmjax.fl.runtime.mesh.clients_mesh)"
        )


def mesh_for(
    mesh: Mesh | None, clients_per_device: int | None, slots: int, runs: int
) -> Mesh | None:
    """The mesh a call runs on: ``mesh`` checked, or one over as many devices as
    ``clients_per_device`` needs for ``slots`` slots (``None`` and ``None``: no mesh, one
    device, today's program). ``runs``: the call's runs (a ``runs`` axis must divide it).
    One ``ValueError`` line on bad input, before any work."""
    check_mesh_options(mesh, clients_per_device)
    if clients_per_device is not None:
        k = clients_per_device
        need, present = math.ceil(slots / k), jax.device_count()
        if need > present:
            raise ValueError(
                f"clients_per_device={k} needs {need} devices for the cohort's {slots} slots; "
                f"{present} present: pass clients_per_device >= {math.ceil(slots / present)}"
            )
        return clients_mesh(need)
    if mesh is None:
        return None
    if RUNS in mesh.axis_names and runs % mesh.shape[RUNS]:
        raise ValueError(
            f"mesh's {RUNS!r} axis ({mesh.shape[RUNS]} devices) must divide the call's "
            f"{runs} runs (variants x seeds)"
        )
    return mesh


def padded_slots(mesh: Mesh, slots: int) -> int:
    """The slot buffer a cohort of ``slots`` slots runs in over ``mesh``: padded with unused
    slots up to a multiple of the ``clients`` axis (an unused slot adds nothing)."""
    d = int(mesh.shape[CLIENTS])
    return -(-slots // d) * d


def describe(mesh: Mesh | None, slots: int) -> str:
    """One line: how a run's cohort of ``slots`` slots is laid out over ``mesh``."""
    if mesh is None:
        return f"one device: the cohort's {slots} slots on {jax.devices()[0].platform}:0"
    d = int(mesh.shape[CLIENTS])
    per = padded_slots(mesh, slots) // d
    pad = padded_slots(mesh, slots) - slots
    runs = f", runs over {mesh.shape[RUNS]} devices" if RUNS in mesh.axis_names else ""
    procs = len({dev.process_index for dev in mesh.devices.flat})
    return (
        f"cohort of {slots} slots over {d} {mesh.devices.flat[0].platform} devices "
        f"({per} slots each{f', {pad} padding' if pad else ''}){runs}; "
        f"{mesh.devices.size} devices on {procs} process(es)"
    )


def replicated(mesh: Mesh, tree: PyTree) -> PyTree:
    """``tree`` placed whole on every device of ``mesh``. Over ``jax.distributed`` every
    process passes the same values and each places them on its own devices of the mesh
    (PRNG key arrays through their key data)."""
    sharding = NamedSharding(mesh, PartitionSpec())
    if sharding.is_fully_addressable:
        return jax.device_put(tree, sharding)

    def place(x: Any) -> Array:
        if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):
            impl = jax.random.key_impl(x)
            return jax.random.wrap_key_data(place(jax.random.key_data(x)), impl=impl)
        host = np.asarray(x)
        return jax.make_array_from_process_local_data(sharding, host, host.shape)

    return jax.tree.map(place, tree)


def shard_cohort(
    mesh: Mesh,
    local: Callable[[Int[Array, " s"], Bool[Array, " s"], PyTree], tuple[PyTree, PyTree]],
    ids: Int[Array, " S"],
    used: Bool[Array, " S"],
    shared: PyTree,
) -> tuple[PyTree, PyTree]:
    """A summed client map over the ``clients`` axis of ``mesh``, inside a traced program.

    ``local(ids, used, shared)``: ONE device's share, ``(s,)`` slot ids and use bits ->
    ``(client states (s, ...), reply sum of its used slots)``; it gathers its own slots'
    data and states from ``shared`` (arrays every device holds whole: the federation's
    data and client states). ``ids``/``used`` (``(S,)``) are padded with unused slots to a multiple
    of the axis (the padded slots repeat ``ids[0]`` and add nothing). Returns
    ``(states (S, ...), the cohort's reply sum)``: the partial sums added over devices
    (``psum``), the same on every device."""
    s = int(ids.shape[0])
    pad = padded_slots(mesh, s) - s
    if pad:
        ids = jnp.concatenate([ids, jnp.broadcast_to(ids[:1], (pad,))])
        used = jnp.concatenate([used, jnp.zeros((pad,), bool)])

    def per_device(i: Array, u: Array, whole: PyTree) -> tuple[PyTree, PyTree]:
        states, total = local(i, u, whole)
        return states, jax.lax.psum(total, CLIENTS)

    spec, every = PartitionSpec(CLIENTS), PartitionSpec()
    # check_vma off: the client code's loops (lax.scan, fori_loop, cond) start carries from
    # constants that become per-device values, which the varying-axis types would refuse
    states, total = jax.shard_map(
        per_device,
        mesh=mesh,
        in_specs=(spec, spec, every),
        out_specs=(spec, every),
        check_vma=False,
    )(ids, used, shared)
    return (jax.tree.map(lambda a: a[:s], states) if pad else states), total


@dataclass(frozen=True)
class CohortMemory:
    """What a run's cohort holds on a device, in bytes, from shapes alone (a lower bound:
    the clients' training activations are not counted).

    Attributes:
        shared: held whole by every device, for all of its runs: the federation's data
            and every client's state.
        per_slot: one cohort slot of one run: its gathered data, its client state, its new
            state and its reply.
        slots: the cohort's slot buffer ``S`` (the largest of the round exchanges').
        runs: the call's runs (variants x seeds).
    """

    shared: int
    per_slot: int
    slots: int
    runs: int

    def per_device(self, mesh: Mesh | None) -> int:
        """Bytes on one device of ``mesh`` (``None``: one device holds it all): the shared
        part plus its share of the padded slots of its share of the runs."""
        if mesh is None:
            return self.shared + self.per_slot * self.slots * self.runs
        runs = self.runs // (mesh.shape[RUNS] if RUNS in mesh.axis_names else 1)
        slots = padded_slots(mesh, self.slots) // int(mesh.shape[CLIENTS])
        return self.shared + self.per_slot * slots * runs


def check_memory(memory: CohortMemory, mesh: Mesh | None, limit: int) -> None:
    """One ``ValueError`` line when a device of ``mesh`` would hold more than ``limit``
    bytes of the cohort (:meth:`CohortMemory.per_device`), naming the options that spread
    it over more devices; nothing otherwise."""
    need = memory.per_device(mesh)
    if need <= limit:
        return
    devices = 1 if mesh is None else int(mesh.shape[CLIENTS])
    spare = limit - memory.shared
    fits = spare // (memory.per_slot * memory.runs) if spare > 0 else 0
    hint = (
        "spread the cohort over more devices (Execution(mesh=clients_mesh(d)) or "
        f"Execution(clients_per_device<={fits}))"
        if fits
        else "the federation's data and client states alone do not fit: use fewer clients"
    )
    raise ValueError(
        f"mesh: the cohort's {memory.slots} slots on {devices} device(s) need at least "
        f"{need / 2**20:.4g} MiB per device ({memory.shared / 2**20:.4g} MiB shared, "
        f"{memory.per_slot / 2**20:.4g} MiB per slot and run), more than the device's "
        f"{limit / 2**20:.4g} MiB: {hint}"
    )


def peak_memory(mesh: Mesh | None = None) -> dict[str, Any]:
    """Peak bytes in use per addressable device of ``mesh`` (default: this process's
    devices), ``{device: bytes}``, from ``device.memory_stats()["peak_bytes_in_use"]``;
    ``None`` for a device whose runtime reports nothing (the CPU does not)."""
    devices = jax.local_devices() if mesh is None else list(mesh.local_devices)
    return {str(dev): memory_stats(dev).get("peak_bytes_in_use") for dev in devices}
