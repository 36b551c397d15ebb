"""The ServerApp: drives any protocol algorithm over Flower messages.

A run: find the SuperNodes and their partitions (``query.hello``), ``server_init``, the
setup exchanges (round 0), then ``rounds`` rounds of the algorithm's exchanges. One
exchange: ``select`` with the simulator's server key decides which client slots take part,
``request`` builds the one Request, the ServerApp sends it only to the selected clients'
nodes, waits for their replies (at most ``reply-timeout`` seconds), places each valid reply
in its client slot (the other slots: zeros, ``mask`` False) and calls ``aggregate``. A node
that does not answer in time, answers with an error, or answers something that is not the
algorithm's Reply (another structure, shape or dtype, or non-finite numbers) is left out of
that exchange and logged with the reason: the round finishes with the clients that answered.

Accounted steps per client: record-level algorithms report their step count with every
reply (a client that did not reply has released nothing new, so its last report stands);
client-level algorithms are accounted by the server (``algorithm.accounting().steps(server,
.)``). The rest of the record is the plan's (``accounting().rates``), with the task's public
row counts (:attr:`~swarmjax.fl.runtime.flower.task.Task.sizes`) for record-level ``q_i``.

The run's :class:`~swarmjax.fl.runtime.result.Result` is the simulator's, made by the same
:func:`~swarmjax.fl.runtime.result.report`: ``server`` with a leading run axis of 1,
``history`` with the simulator's columns and values, ``metrics`` ``(1, rounds, ...)``,
``privacy``, ``runs`` (one row: the task's labels and seed), ``algorithm``, and
``private_diagnostics["selected"]``, the realised number of clients of every exchange
``(1, rounds, exchanges)`` (operator-only, as the simulator's with ``diagnostics=True``).
``clients`` is ``None``: client states never leave the clients in a deployment.

Outputs (``out-dir`` in the run configuration), split by construction into what may be
released and what only the operator may see:

* ``released/``: ``server.npz`` (``Result.server``, the final server state),
  ``history.csv`` (``Result.history``: public metrics, the released client counts and bytes
  per round: the expected count where the selection is a secret sample; no wall times),
  ``privacy.json`` (``Result.privacy``: epsilon per client after each round, the
  neighbouring relation, what it covers, what it does not, what drew the noise
  (``randomness``: entropy or a supplied secret, and the condition a supplied one puts on
  every epsilon) and the operator files it does NOT cover; made by
  :func:`~swarmjax.fl.runtime.result.run_privacy`, as the simulator's record);
* ``operator/`` (``Result.operator``, an :class:`Operator`; NOT released, NOT covered by
  any epsilon): ``messages.csv`` (one row per message: who was messaged, status, payload
  and wire bytes), ``rounds.csv`` (wall seconds of every round, which track the realised
  cohort, and the realised number of clients of every exchange), ``server.log`` and,
  for an algorithm under a distributed-DP plan, ``secagg.csv`` (who passed each stage of
  secure aggregation, every round's outcome; :mod:`swarmjax.fl.runtime.flower.secagg`).

An algorithm under a :class:`~swarmjax.privacy.distributed.DistributedDP` plan runs its
exchange as real secure aggregation (:mod:`swarmjax.fl.runtime.flower.secagg`: four
stages of messages, the clients' uploads masked, the server unmasks only the survivors'
sum), then the simulator's decode and step.

Publishing anything from ``operator/`` voids the amplification by sampling of a secret
cohort (DP-FedAvg). :func:`read_run` loads both folders into a ``Result``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid
from jaxtyping import PyTree

from swarmjax.device import COMPILATION_CACHE, use_compilation_cache
from swarmjax.fl.private import algorithm_name
from swarmjax.fl.protocol import (
    Exchange,
    Slots,
    aggregate_key,
    server_init_key,
    server_key,
    steps_of,
)
from swarmjax.fl.runtime.flower.records import (
    RecordError,
    from_record,
    load_tree,
    payload_bytes,
    save_tree,
    to_record,
)
from swarmjax.fl.runtime.flower.secagg import (
    check_deployable,
    check_faults,
    check_worker,
    secure_exchange,
    step_function,
    uses_secagg,
)
from swarmjax.fl.runtime.flower.server_app import HELLO, Hello, ServerSettings, send_all
from swarmjax.fl.runtime.flower.task import (
    Task,
    client_level,
    load_task,
)
from swarmjax.fl.runtime.result import (
    SELECTED,
    Disclosure,
    PrivacyRecord,
    PublicRounds,
    Result,
    metric_columns,
    report,
    run_labels,
    run_privacy,
)
from swarmjax.privacy.secret import randomness

__all__ = [
    "NOT_RELEASED",
    "OPERATOR",
    "RELEASED",
    "Operator",
    "ServerSettings",
    "drive",
    "read_run",
    "serve",
    "warm_up",
]

RELEASED, OPERATOR = "released", "operator"  # the two sub-folders of out-dir
NOT_RELEASED = {
    f"{OPERATOR}/messages.csv": "who was messaged in every exchange (realised membership)",
    f"{OPERATOR}/rounds.csv": "wall seconds and realised number of clients per round",
    f"{OPERATOR}/server.log": "the ServerApp's log (names clients left out)",
    f"{OPERATOR}/secagg.csv": "under secure aggregation: who passed each stage, each outcome",
}
"""The operator-only outputs, named in ``privacy.json`` as not released and not covered."""

log = logging.getLogger("swarmjax.fl.runtime.flower")


@dataclass
class Operator:
    """What only the operator sees (NOT released, NOT covered by any epsilon): ``messages``
    (one row per message: who was messaged, status, bytes) and ``rounds`` (``round``,
    ``seconds`` and ``selected_<exchange>``, the realised number of clients); under real
    secure aggregation also ``secagg`` (one row per round: the clients that passed each
    stage, the outcome and the sum's fingerprint;
    :func:`~swarmjax.fl.runtime.flower.secagg.secure_exchange`), else ``None``.

    A deployment's :class:`~swarmjax.fl.runtime.result.Result` holds it as ``operator``,
    beside the other members that are never released (``clients``, ``private_diagnostics``),
    rather than returning it as a second value: every runtime returns the one ``Result``,
    and what is released is chosen by name (``server``, ``history``, ``privacy``: the
    ``released/`` folder), never by taking a whole ``Result``."""

    messages: pd.DataFrame
    rounds: pd.DataFrame
    secagg: pd.DataFrame | None = None


def _realised(rounds: pd.DataFrame) -> dict[str, np.ndarray]:
    """The realised selections of ``operator/rounds.csv`` as the simulator's
    ``Result.private_diagnostics``: ``"selected"`` ``(1, rounds, exchanges)``."""
    cols = [c for c in rounds.columns if c.startswith(SELECTED)]
    return {"selected": rounds[cols].to_numpy(np.int32)[None]}


@dataclass
class _Coordinator:
    grid: Grid
    task: Task
    settings: ServerSettings
    nodes: dict[int, int] = field(default_factory=dict)  # client id -> node id
    seen: set[int] = field(default_factory=set)  # node ids already greeted
    messages: list[dict[str, Any]] = field(default_factory=list)
    secagg: list[dict[str, Any]] = field(default_factory=list)  # a summary per secure round

    # ------------------------------------------------------------------------- transport

    def _send(
        self, contents: dict[int, RecordDict], kind: str, group: str, timeout: float
    ) -> dict[int, Message | str]:
        return send_all(self.grid, contents, kind, group, timeout, self.settings.poll)

    def greet(self, deadline: float, hello: Hello | None = None) -> None:
        """Learn the partition of every new node (``hello``: the replies of a greeting
        already sent); wait until all ``N`` are known or until ``deadline``
        (``time.monotonic()``)."""
        n = self.task.num_clients
        if hello is not None:
            self.seen.update(hello.nodes)
            for node, reply in hello.replies().items():
                self._register(node, reply)
        while len(self.nodes) < n:
            new = [node for node in self.grid.get_node_ids() if node not in self.seen]
            if new:
                self.seen.update(new)
                contents = {node: RecordDict() for node in new}
                timeout = max(self.settings.reply_timeout, deadline - time.monotonic())
                for node, reply in self._send(contents, HELLO, "hello", timeout).items():
                    self._register(node, reply)
            if len(self.nodes) == n or time.monotonic() >= deadline:
                return
            time.sleep(self.settings.poll)

    def _register(self, node: int, reply: Message | str) -> None:
        if isinstance(reply, str) or reply.has_error():
            reason = reply if isinstance(reply, str) else reply.error.reason
            log.warning("node %d did not say its partition: %s", node, reason)
            self.seen.discard(node)  # ask again later
            return
        try:
            hello = reply.content["hello"]
            pid = int(hello["partition-id"])
        except (KeyError, TypeError, ValueError) as err:
            log.warning("node %d rejected: malformed hello reply (%s)", node, err)
            return
        check_worker(self.task.algorithm, hello, node)  # one line: the run cannot work
        if not 0 <= pid < self.task.num_clients or pid in self.nodes:
            log.warning("node %d rejected: partition %d is out of range or taken", node, pid)
            return
        self.nodes[pid] = node
        log.info("node %d holds partition %d", node, pid)

    # -------------------------------------------------------------------------- exchange

    def exchange(
        self, server: PyTree, ex: Exchange, index: int, round_index: int, setup: bool
    ) -> tuple[PyTree, dict[int, PyTree], dict[str, float]]:
        """One exchange: ``(server, steps reported by the clients that replied, release)``;
        ``release``: the selected count and bytes down/up the history publishes."""
        task, n = self.task, self.task.num_clients
        key = server_key(task.run_key, round_index, index)
        selected = np.array(_select(ex, n)(server, key))  # a writable copy
        if ex.max_selected is not None:  # as the simulator: the first max_selected ids only
            selected[np.flatnonzero(selected)[ex.max_selected :]] = False
        request = _jit(ex.request)(server)
        reply_like, steps_like = _reply_like(task, ex, request)
        start = len(self.messages)
        if not setup and uses_secagg(task.algorithm):  # real masks: four stages
            server, rows, summary = secure_exchange(
                self, server, ex, index, round_index, selected, request, reply_like
            )
            self.messages.extend(rows)
            self.secagg.append(summary)
            return server, {}, self._release(ex, selected, request, reply_like, start)
        request_record = to_record(request)
        meta = ConfigRecord({"round": round_index, "exchange": index, "setup": setup})
        targets = {int(c): self.nodes.get(int(c)) for c in np.flatnonzero(selected)}
        contents = {
            node: RecordDict({"request": request_record, "meta": meta})
            for node in targets.values()
            if node is not None
        }
        group = f"{'setup' if setup else 'round'}-{round_index}-{ex.name}"
        replies = self._send(contents, "train.exchange", group, self.settings.reply_timeout)
        slots = jax.tree.map(lambda s: np.zeros((n, *s.shape), s.dtype), _plain(reply_like))
        mask = np.zeros(n, bool)
        counts: dict[int, PyTree] = {}
        for cid, node in targets.items():
            row = {"round": round_index, "setup": setup, "exchange": ex.name, "client": cid}
            row |= {"node": node, "bytes_down": 0, "wire_down": 0, "bytes_up": 0, "wire_up": 0}
            if node is None:
                row["status"] = "no node holds this partition"
            else:
                row |= {"bytes_down": payload_bytes(request)}
                row |= {"wire_down": request_record.count_bytes()}
                reply, status = self._accept(replies[node], reply_like, steps_like, row)
                row["status"] = status
                if reply is not None:
                    value, steps = reply
                    jax.tree.map(lambda buf, v, c=cid: buf.__setitem__(c, v), slots, value)
                    mask[cid] = True
                    if steps is not None:
                        counts[cid] = steps
            if row["status"] != "ok":
                log.warning("%s: client %d left out: %s", group, cid, row["status"])
            self.messages.append(row)
        agg_key = aggregate_key(task.run_key, round_index, index)
        server = _jit(ex.aggregate)(
            server, slots, Slots.everyone(jnp.asarray(mask)), agg_key, task.hyper
        )
        return server, counts, self._release(ex, selected, request, reply_like, start)

    def _release(
        self, ex: Exchange, selected: np.ndarray, request: PyTree, reply_like: PyTree, start: int
    ) -> dict[str, float]:
        """What the history publishes about an exchange: the bytes carried, or, when the
        selection is secret (``expected_selected``: DP client sampling), the expected count
        times the message sizes, as the simulator does; ``realised``: the realised count,
        operator-only (``operator/rounds.csv``, as ``messages.csv``)."""
        realised = int(selected.sum())
        if ex.expected_selected is not None:
            count = float(ex.expected_selected(self.task.hyper, self.task.num_clients))
            down = count * payload_bytes(request)
            up = count * payload_bytes(reply_like)
            return {"selected": count, "down": down, "up": up, "realised": realised}
        rows = self.messages[start:]
        down = sum(r["bytes_down"] for r in rows)
        up = sum(r["bytes_up"] for r in rows)
        return {"selected": realised, "down": down, "up": up, "realised": realised}

    def _accept(
        self, reply: Message | str, reply_like: PyTree, steps_like: PyTree | None, row: dict
    ) -> tuple[tuple[PyTree, PyTree | None] | None, str]:
        if isinstance(reply, str):
            return None, reply
        if reply.has_error():
            return None, f"error reply: {reply.error.reason}"
        try:
            content = reply.content
            record = content["reply"]
            row |= {"wire_up": record.count_bytes()}
            value = from_record(record, reply_like)
            steps = None if steps_like is None else from_record(content["steps"], steps_like)
        except (RecordError, KeyError, TypeError) as err:
            return None, f"rejected: {err}"
        if self.settings.reject_nonfinite and not _finite(value):
            return None, "rejected: non-finite values in the reply"
        row |= {"bytes_up": payload_bytes(value)}
        return (value, steps), "ok"


# ----------------------------------------------------------------------- compiled pieces
# One compilation per function per process; the algorithm is hashable, so these caches
# hold one entry per exchange.

_JITS: dict[Any, Callable] = {}


def _jit(fn: Callable, **kwargs: Any) -> Callable:
    key = (fn, tuple(sorted(kwargs.items())))
    if key not in _JITS:
        _JITS[key] = jax.jit(fn, **kwargs)
    return _JITS[key]


def _select(ex: Exchange, n: int) -> Callable:
    fn = _jit(ex.select, static_argnums=2)
    return lambda server, key: fn(server, key, n)


def _plain(tree: PyTree) -> PyTree:
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype), tree)


def _reply_like(task: Task, ex: Exchange, request: PyTree) -> tuple[PyTree, PyTree | None]:
    """Shapes of the Reply of ``ex`` and of a client's reported step count (``None`` at
    client level)."""
    _, reply = jax.eval_shape(
        ex.client, task.state_like, task.data_like, request, task.run_key, task.hyper
    )
    steps = None if client_level(task.algorithm) else jax.ShapeDtypeStruct((), jnp.int32)
    return reply, steps


def _finite(tree: PyTree) -> bool:
    leaves = [np.asarray(x) for x in jax.tree.leaves(tree)]
    return all(np.isfinite(x).all() for x in leaves if np.issubdtype(x.dtype, np.inexact))


def _steps_row(task: Task, server: PyTree, reported: dict[int, PyTree]) -> np.ndarray:
    """Every client's accounted steps after a round (``(clients,)``)."""
    n = task.num_clients
    if client_level(task.algorithm):
        zero = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), task.state_like)
        one = steps_of(task.algorithm.accounting(), server, zero)
        return np.repeat(np.asarray(one)[None], n, axis=0)
    return np.asarray([np.asarray(reported.get(c, 0)) for c in range(n)], np.int64)


# --------------------------------------------------------------------------------- driver


def drive(grid: Grid, task: Task, settings: ServerSettings, hello: Hello | None = None) -> Result:
    """Run ``task`` over the nodes ``grid`` reaches; its :class:`Result` (the operator-only
    outputs in ``operator``), written to ``settings.out_dir`` when set. ``hello``: a
    greeting already sent (:class:`~swarmjax.fl.runtime.flower.server_app.Hello`), whose
    replies count."""
    handler = _operator_log(settings.out_dir)
    try:
        run = _drive(grid, task, settings, hello)
    finally:
        if handler is not None:
            log.removeHandler(handler)
            handler.close()
    if settings.out_dir is not None:
        _write(run, settings.out_dir)
    return run


def _operator_log(out: Path | None) -> logging.Handler | None:
    """The ServerApp's log, also into ``out/operator/server.log`` (operator-only)."""
    if out is None:
        return None
    (out / OPERATOR).mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(out / OPERATOR / "server.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    return handler


def _drive(grid: Grid, task: Task, settings: ServerSettings, hello: Hello | None) -> Result:
    alg = task.algorithm
    check_deployable(alg)
    co = _Coordinator(grid, task, settings)
    co.greet(time.monotonic() + settings.join_timeout, hello)
    if not co.nodes:
        raise RuntimeError(f"no SuperNode said its partition within {settings.join_timeout} s")
    log.info("starting with partitions %s of %d", sorted(co.nodes), task.num_clients)
    server = _jit(alg.server_init)(server_init_key(task.run_key), task.hyper)
    reported: dict[int, PyTree] = {}
    for e, ex in enumerate(alg.setup):
        server, counts, _ = co.exchange(server, ex, e, 0, setup=True)
        reported |= counts
    releases, steps_rounds, metrics_rounds, operator_rows = [], [], [], []
    for r in range(1, task.rounds + 1):
        co.greet(time.monotonic())  # nodes that joined late take part from this round on
        t0 = time.perf_counter()
        released: dict[str, dict[str, float]] = {}
        for e, ex in enumerate(alg.exchanges):
            server, counts, released[ex.name] = co.exchange(server, ex, e, r, setup=False)
            reported |= counts
        metrics = _jit(alg.evaluate)(server, task.test)
        metrics_rounds.append({k: np.asarray(v) for k, v in metrics.items()})
        # wall time of the round at the server: it tracks the realised cohort (operator-only)
        private = {f"{SELECTED}{name}": x["realised"] for name, x in released.items()}
        operator_rows.append({"round": r, **private, "seconds": time.perf_counter() - t0})
        releases.append(released)
        steps_rounds.append(_steps_row(task, server, reported))
    steps = np.stack(steps_rounds)[None]  # (1, rounds, N)
    # the simulator's record of the same steps (the server holds no data, only the public
    # row counts of record-level q_i = B / |D_i|)
    source = "entropy" if task.secret is None else task.secret.source
    privacy = run_privacy(
        alg,
        steps,
        task.variants.hyper,
        task.variants.spec,
        task.num_clients,
        sizes=task.sizes,
        disclosure=Disclosure(
            randomness=randomness(source, task.variants.spec.common_random_numbers)
        ),
    )
    secagg = pd.DataFrame(co.secagg) if co.secagg else None
    operator = Operator(pd.DataFrame(co.messages), pd.DataFrame(operator_rows), secagg)

    def per_round(name: str) -> dict[str, np.ndarray]:
        """``{exchange: (1, rounds)}``: what the rounds' exchanges released as ``name``."""
        return {ex.name: np.asarray([[x[ex.name][name] for x in releases]]) for ex in alg.exchanges}

    none = np.zeros((1, task.rounds))
    rounds = PublicRounds(
        labels=run_labels(task.variants),
        metrics=jax.tree.map(lambda *xs: np.stack(xs)[None], *metrics_rounds),
        selected=per_round("selected"),
        bytes_down=sum(per_round("down").values(), none),
        bytes_up=sum(per_round("up").values(), none),
    )
    return report(
        rounds,
        privacy,
        server=jax.tree.map(lambda x: x[None], server),  # the one run's axis
        clients=None,  # client states never leave the clients
        algorithm=algorithm_name(alg),
        private_diagnostics=_realised(operator.rounds),
        operator=operator,
    )


def _write(run: Result, out: Path) -> None:
    released, operator = out / RELEASED, out / OPERATOR
    released.mkdir(parents=True, exist_ok=True)
    operator.mkdir(parents=True, exist_ok=True)
    save_tree(released / "server.npz", jax.tree.map(lambda x: x[0], run.server))
    run.history.to_csv(released / "history.csv", index=False)
    if run.operator is not None:
        run.operator.messages.to_csv(operator / "messages.csv", index=False)
        run.operator.rounds.to_csv(operator / "rounds.csv", index=False)
        if run.operator.secagg is not None:
            run.operator.secagg.to_csv(operator / "secagg.csv", index=False)
    p = run.privacy
    record = {
        "unit": p.unit,
        "relation": p.relation,
        "delta": p.delta,
        "accountant": p.accountant,
        "floating_point": p.floating_point,
        "epsilon": p.epsilon[0].tolist(),
        "steps": p.steps[0].tolist(),
        "sample_rate": p.sample_rate[0].tolist(),
        "noise_multiplier": p.noise_multiplier[0].tolist(),
        "covers": list(p.covers),
        "not_covered": list(p.not_covered),
        "randomness": p.randomness,
        "released": [f"{RELEASED}/{name}" for name in RELEASED_FILES],
        "not_released": {  # the operator files this run wrote
            name: why
            for name, why in NOT_RELEASED.items()
            if name != f"{OPERATOR}/secagg.csv" or getattr(run.operator, "secagg", None) is not None
        },
    }
    (released / "privacy.json").write_text(json.dumps(record, indent=1))


RELEASED_FILES = ("server.npz", "history.csv", "privacy.json")


def read_run(out: str | Path, task: Task) -> Result:
    """Load what :func:`drive` wrote into ``out`` (the server state checked against ``task``)
    as its :class:`Result`: ``metrics`` holds the history's scalar metrics only (a vector
    metric is not written); ``operator`` and ``private_diagnostics`` are ``None`` and empty
    when ``out/operator/`` is absent (a released copy)."""
    out = Path(out)
    released, operator = out / RELEASED, out / OPERATOR
    if not (released / "privacy.json").exists():
        raise FileNotFoundError(f"no run results in {released}: did the ServerApp fail? (its log)")
    record = json.loads((released / "privacy.json").read_text())
    steps = np.asarray(record["steps"], np.int64)[None]
    privacy = PrivacyRecord(
        unit=record["unit"],
        delta=record["delta"],
        epsilon=np.asarray(record["epsilon"], np.float64)[None],
        sample_rate=np.asarray(record["sample_rate"], np.float64)[None],
        noise_multiplier=np.asarray(record["noise_multiplier"], np.float64)[None],
        steps=steps,
        covers=tuple(record["covers"]),
        not_covered=tuple(record["not_covered"]),
        relation=record.get("relation"),
        accountant=record.get("accountant", "pld"),
        floating_point=record.get("floating_point"),
        randomness=record.get("randomness"),
    )
    history = pd.read_csv(released / "history.csv")
    labels = run_labels(task.variants)
    kept = None
    if (operator / "messages.csv").exists() and (operator / "rounds.csv").exists():
        secagg = operator / "secagg.csv"
        kept = Operator(
            pd.read_csv(operator / "messages.csv"),
            pd.read_csv(operator / "rounds.csv"),
            pd.read_csv(secagg, dtype=str, keep_default_na=False) if secagg.exists() else None,
        )
    return Result(
        server=jax.tree.map(
            lambda x: x[None], load_tree(released / "server.npz", task.server_like)
        ),
        clients=None,
        history=history,
        metrics={c: history[c].to_numpy()[None] for c in metric_columns(history, list(labels))},
        privacy=privacy,
        runs=pd.DataFrame(labels),
        private_diagnostics={} if kept is None else _realised(kept.rounds),
        algorithm=algorithm_name(task.algorithm),
        operator=kept,
    )


def warm_up(task: Task) -> None:
    """Compile (or load from JAX's persistent cache) every server function of ``task``, as
    :func:`drive` calls them (same shapes, dtypes and placement: one compilation each)."""
    alg, n = task.algorithm, task.num_clients
    server = _jit(alg.server_init)(server_init_key(task.run_key), task.hyper)
    setup = len(alg.setup)
    for e, ex in enumerate(alg.setup + alg.exchanges):
        _select(ex, n)(server, server_key(task.run_key, 0, 0))
        request = _jit(ex.request)(server)
        reply_like, _ = _reply_like(task, ex, request)
        slots = jax.tree.map(lambda s: np.zeros((n, *s.shape), s.dtype), _plain(reply_like))
        mask = Slots.everyone(jnp.asarray(np.zeros(n, bool)))
        agg_key = aggregate_key(task.run_key, 0, 0)
        if uses_secagg(alg) and e >= setup:  # what secure_exchange calls
            total = jnp.zeros(reply_like.shape, reply_like.dtype)
            step_function(alg)(server, mask, total, jnp.asarray(False), agg_key, task.hyper)
            continue
        _jit(ex.aggregate)(server, slots, mask, agg_key, task.hyper)
    jax.block_until_ready(_jit(alg.evaluate)(server, task.test))


def serve(grid: Grid, run_config: dict[str, Any], hello: Hello | None = None) -> Result:
    """The ServerApp's work: the run configuration's task, its server functions compiled
    (into ``jax-cache-dir``, default ``~/.cache/swarmjax/jax``; ``""``: JAX's configuration
    left alone) while ``hello`` is answered, then :func:`drive`."""
    settings = ServerSettings.from_run_config(run_config)
    use_compilation_cache(run_config.get("jax-cache-dir", COMPILATION_CACHE))
    task = load_task(run_config)
    check_faults(run_config, task)  # a bad test-only fault: one line, no work
    check_deployable(task.algorithm)
    warm_up(task)
    return drive(grid, task, settings, hello)
