"""How a call of the simulator runs: :class:`Execution`, the options of
:func:`~swarmjax.fl.runtime.simulator.simulate` and
:func:`~swarmjax.fl.runtime.simulator.start` that never change the numbers.

A call's numbers are set by the algorithm, the clients, the variants with their
:class:`~swarmjax.fl.protocol.RunSpec` and the secret. An :class:`Execution` only says how
the same computation is laid out and watched: clients vmapped, in blocks or one at a time
(equal up to float rounding), rounds split over compiled calls (exactly equal), cohorts
split over devices (equal up to float32 rounding: the order of the sum), checkpoints that
make a call resumable, a progress bar, per-round callbacks and the private diagnostics
collected beside the result. What a call publishes is a
:class:`~swarmjax.fl.runtime.result.Publication`.

Options that used to be keyword arguments of ``simulate``, ``start`` and ``finish`` are
refused by :func:`moved_options` with one line naming their new home.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from jax.sharding import Mesh

from swarmjax._validation import check_bool, check_choice, check_folder, check_int
from swarmjax.fl.runtime.callbacks import RoundCallback
from swarmjax.fl.runtime.mesh import check_mesh_options

__all__ = ["MOVED", "ClientMap", "Execution", "moved_options"]

ClientMap = Literal["vmap", "sequential"] | int  # an int: clients per vmapped block


def check_client_map(client_map: Any) -> None:
    """One ``ValueError`` line unless ``client_map`` is ``"vmap"``, ``"sequential"``, an int
    ``>= 1`` or ``None`` (the device's default)."""
    if client_map is None:
        return
    if isinstance(client_map, bool) or not isinstance(client_map, int):
        check_choice("client_map", client_map, ("vmap", "sequential"))
    elif client_map < 1:
        raise ValueError(
            f"client_map must be 'vmap', 'sequential' or an int >= 1; got {client_map}"
        )


@dataclass(frozen=True)
class Execution:
    """How a call runs; none of it changes the numbers (``checkpoint_dir`` only makes the
    call resumable). Every field is checked here, at construction, before any work: a bad
    one is one ``ValueError`` line naming it and what is allowed.

    Attributes:
        client_map: how clients share a vectorised block: ``"vmap"`` (all of them, the
            default), ``"sequential"`` (one at a time, ``lax.map``: each client runs its
            own trip counts) or an int ``k`` (blocks of ``k`` clients); the same result up
            to float rounding. ``None``: :func:`swarmjax.device.default_client_map` (one at
            a time on a CPU, vmap on an accelerator: right for convolutional clients; small
            dense models are faster vmapped on a CPU too, hence the explicit default). On
            the 2-core CPU a CNN cohort ran best in blocks of 2 (docs/cross_device.md). A
            flat store of clients of different sizes runs a vmapped cohort sorted by size
            in blocks of its ``vmap_block``
            (:meth:`~swarmjax.fl.data.store.ClientStore.schedule`).
        rounds_per_call: scan this many rounds per compiled call (``None``: all of them in
            one; the same result for any split).
        mesh: a :class:`jax.sharding.Mesh` with a ``"clients"`` axis (and optionally a
            ``"runs"`` axis; :func:`~swarmjax.fl.runtime.mesh.clients_mesh` builds one,
            across ``jax.distributed`` processes too): every summed exchange's cohort slots
            are split over the ``clients`` axis (padded with unused slots to a multiple of
            it), each device training its share and the partial sums added across devices
            before the server step; the runs are split over ``runs``. On a ``clients``
            axis of 2 or more devices the federation's stacked data and the client
            states are split by client id as well (each device holds a block of clients;
            a flat store's data stays whole), which changes no number. Equal to the run
            without a mesh to float32 rounding (the sum's order; docs/scaling.md). ``None``
            (default): one device. An algorithm with a round exchange that is not summed is
            refused when the call starts.
        clients_per_device: instead of ``mesh``, a ``clients`` mesh over as many devices as
            hold the cohort's slot buffer at this many slots each.
        checkpoint_dir: save the call after every compiled call (``rounds_per_call``
            rounds) into this folder with orbax and resume from its last checkpoint: a
            killed call ends with the numbers of an uninterrupted one
            (:mod:`~swarmjax.fl.runtime.checkpoint`). Without a ``secret``, the call's
            secret is kept there too (a folder never released; a ledger lists it as such).
            :func:`~swarmjax.fl.runtime.simulator.simulate` only (a loop of your own
            saves what it wants).
        progress: show a progress bar (``None``, the default: when stderr is a terminal;
            ``simulate`` only).
        callbacks: called once per finished round with that round's public metrics of
            every run (:mod:`~swarmjax.fl.runtime.callbacks`: ``JsonLines``, ``CsvRows``,
            ``TensorBoard``, or any ``callback(round, metrics, runs)``; ``simulate`` only).
        diagnostics: also collect every numeric scalar of each client's state after each
            round (:func:`~swarmjax.fl.runtime.simulator.state_scalars`: ``(runs, rounds,
            clients)`` by path, e.g. ``"loss"``) and the realised selections (statistics of
            private data, NOT covered by epsilon) into ``Result.private_diagnostics``.
    """

    client_map: ClientMap | None = "vmap"
    rounds_per_call: int | None = None
    mesh: Mesh | None = None
    clients_per_device: int | None = None
    checkpoint_dir: str | os.PathLike | None = None
    progress: bool | None = None
    callbacks: Sequence[RoundCallback] = ()
    diagnostics: bool = False

    def __post_init__(self) -> None:
        check_client_map(self.client_map)
        if self.rounds_per_call is not None:
            check_int("rounds_per_call", self.rounds_per_call, 1)
        check_mesh_options(self.mesh, self.clients_per_device)
        folder = self.checkpoint_dir
        if folder is not None and not isinstance(folder, str | os.PathLike):
            raise ValueError(
                "checkpoint_dir must be a folder (str or os.PathLike) or None; got "
                f"{type(folder).__name__}"
            )
        if folder is not None:  # "" (the current folder) or a file: refused before any work
            check_folder("checkpoint_dir", folder)
        object.__setattr__(self, "progress", check_bool("progress", self.progress, allow_none=True))
        object.__setattr__(self, "diagnostics", check_bool("diagnostics", self.diagnostics))
        if callable(self.callbacks) or not isinstance(self.callbacks, Sequence):
            raise ValueError(
                "callbacks must be a sequence of callback(round, metrics, runs) callables "
                f"(a list or tuple); got {type(self.callbacks).__name__}"
            )
        for i, callback in enumerate(self.callbacks):
            if not callable(callback):
                raise ValueError(
                    f"callbacks[{i}] must be a callable callback(round, metrics, runs); got "
                    f"{type(callback).__name__}"
                )
        object.__setattr__(self, "callbacks", tuple(self.callbacks))


MOVED: dict[str, str] = {
    **{f.name: f"execution=Execution({f.name}=...)" for f in dataclasses.fields(Execution)},
    "ledger": "publication=Publication(ledger=...)",
    "release_path": "publication=Publication(path=...)",
    "data_source": "publication=Publication(data_source=...)",
    "common_random_numbers": "RunSpec(..., common_random_numbers=...) as the variants' spec",
}
"""Former keyword arguments of ``simulate``/``start``/``finish`` -> where each lives now."""

F = TypeVar("F", bound=Callable[..., Any])


def moved_options(fn: F) -> F:
    """``fn`` refusing :data:`MOVED`'s keyword arguments with one ``TypeError`` line naming
    the new home, e.g. ``simulate(progress=...) moved: pass execution=Execution(progress=...)``
    (any other argument goes to ``fn`` untouched)."""

    @functools.wraps(fn)
    def refusing(*args: Any, **kwargs: Any) -> Any:
        for name in kwargs:
            if name in MOVED:
                raise TypeError(f"{fn.__name__}({name}=...) moved: pass {MOVED[name]}")
        return fn(*args, **kwargs)

    return refusing  # type: ignore[return-value]
