"""Peak memory of a federated LoRA round against full fine-tuning and against training the
base model on one client (issue 49).

``python -m benchmarks.lora_memory [--write]`` builds the default transformer of
``experiments.lora`` (:class:`swarmjax.lora.TransformerConfig`; ``--d-model`` / ``--layers``
/ ``--mlp`` scale it), a federation of ``--clients`` synthetic clients of ``--windows``
windows each (memory does not depend on the characters), and compiles one round of
user-level DP-FedAvg (the registry's build, fixed clipping; a secret Poisson cohort of
expected size ``cohort``, its buffer sized by the plan) for:

* LoRA adapters of rank 4 and 16 on the query and value projections (``--layers-adapted``),
  the base frozen and shared, at cohorts 50 and 200;
* full fine-tuning (every weight trained, clipped, noised) at the same cohorts;
* the reference: ONE client training the whole base model locally (the same local
  training: 1 epoch of SGD at batch 10 over its windows), no federation.

Memory is XLA's buffer assignment of the compiled program (``compiled.memory_analysis()``):
arguments (the model or adapters, the client store, the test set) + outputs + temporaries
- aliased bytes: the peak the program holds on its device, measured without running it, the
same way on a CPU or a GPU. A round also evaluates the server's model on the test set (in
batches of the training batch, so evaluation needs no more than a training step). The
clients of a round run one at a time (``sequential``, the CPU default) and, for the
cohort-50 rows, all vmapped at once (``vmap``, the accelerator default). ``--write`` appends
the section ``lora_memory-<device>`` to ``benchmarks/RESULTS.md`` with the machine and date.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import _cli as bcli
from benchmarks import _results
from experiments import _cli
from swarmjax import lora
from swarmjax.fl.algorithms import registry
from swarmjax.fl.client.training import LocalTraining
from swarmjax.fl.data.store import ClientStore
from swarmjax.fl.protocol import RunSpec, Variants
from swarmjax.fl.runtime import Execution, start
from swarmjax.fl.runtime.simulator import Rounds, run_rounds
from swarmjax.privacy.secret import Secret

MiB = 2**20


@dataclasses.dataclass(frozen=True)
class Row:
    """One measured program."""

    what: str
    trainable: str
    rank: int | None
    cohort: int
    client_map: str
    trained_params: int
    arguments: int
    outputs: int
    temporaries: int
    total: int
    compile_s: float


def _bytes(compiled) -> tuple[int, int, int, int]:
    """``(arguments, outputs, temporaries, total)`` bytes of a compiled program (total: the
    three less the bytes outputs alias from arguments)."""
    m = compiled.memory_analysis()
    args, out, temp = m.argument_size_in_bytes, m.output_size_in_bytes, m.temp_size_in_bytes
    return args, out, temp, args + out + temp - m.alias_size_in_bytes


def federation(config: lora.TransformerConfig, clients: int, windows: int) -> tuple:
    """``clients`` clients of ``windows`` random windows each, and 100 test windows."""
    rng = np.random.default_rng(0)
    n = clients * windows
    x = rng.integers(0, config.vocab_size, (n + 100, config.sequence_length)).astype(np.float32)
    y = rng.integers(0, config.vocab_size, n + 100).astype(np.int32)
    store = ClientStore.build(x[:n], y[:n], np.split(np.arange(n), clients))
    return store, (jnp.asarray(x[n:]), jnp.asarray(y[n:]))


def one_client(config, base, store, training) -> Row:
    """One client training the whole base model on its windows (the reference)."""
    model = lora.full_transformer(config, base)
    params = model.init(jax.random.key(0))
    data = jax.tree.map(lambda a: a[0], store.take(jnp.asarray([0])))
    fn = jax.jit(lambda p, d, k: training.train(model, p, d, k, jnp.float32(0.1), jnp.float32(0)))
    t0 = time.perf_counter()
    compiled = fn.lower(params, data, jax.random.key(1)).compile()
    args, out, temp, total = _bytes(compiled)
    n = sum(int(np.size(a)) for a in jax.tree.leaves(params))
    return Row(
        "one client, base model",
        "full",
        None,
        1,
        "-",
        n,
        args,
        out,
        temp,
        total,
        time.perf_counter() - t0,
    )


def dp_round(config, base, store, test, training, trainable, rank, cohort, cmap, layers) -> Row:
    """One compiled DP-FedAvg round (every run argument as ``simulate`` passes it)."""
    if trainable == "lora":
        model = lora.lora_transformer(config, base, rank, layers)
    else:
        model = lora.full_transformer(config, base)
    spec = RunSpec(rounds=10, delta=1e-5, accountant="rdp")
    run = registry.CrossDeviceRun(
        model,
        store.num_clients,
        cohort,
        spec,
        training,
        epsilon=8.0,
        learning_rate=0.1,
        clip=0.1,
        eval_batch_size=training.batch_size,  # the round's evaluation: one batch at a time
    )
    alg, grid = registry.cross_device("dp-fedavg", run)
    variants = Variants.grid(alg, store, spec, **grid)
    state = start(
        alg, store, test, variants, secret=Secret.generate(), execution=Execution(client_map=cmap)
    )
    t0 = time.perf_counter()
    call = Rounds(alg, 1, cmap)  # one round, no private diagnostics
    compiled = run_rounds.lower(
        call, state.carry, state.keys, state.hyper, state.data, state.test
    ).compile()
    args, out, temp, total = _bytes(compiled)
    n = sum(int(np.size(a)) for a in jax.tree.leaves(model.init(jax.random.key(0))))
    what = f"LoRA r{rank} round" if trainable == "lora" else "full fine-tuning round"
    return Row(
        what, trainable, rank, cohort, cmap, n, args, out, temp, total, time.perf_counter() - t0
    )


def table(rows: list[Row], ref: Row) -> str:
    """The markdown table, every program's total beside the one-client reference."""
    head = (
        "| program | trained params | cohort | clients run | arguments MiB | temporaries MiB "
        "| total MiB | total / one-client base training |\n|---|---:|---:|---|---:|---:|---:|---:|"
    )
    lines = [head]
    for r in [ref, *rows]:
        lines.append(
            f"| {r.what} | {r.trained_params:,} | {r.cohort} | {r.client_map} | "
            f"{r.arguments / MiB:.2f} | {r.temporaries / MiB:.2f} | {r.total / MiB:.2f} | "
            f"{r.total / ref.total:.2f}x |"
        )
    return "\n".join(lines)


@_cli.entry_point
def main(argv: list[str] | None = None) -> None:
    p = bcli.parser("lora_memory", __doc__, writes="lora_memory-<device>")
    p.add_argument("--d-model", type=_cli.count("--d-model"), default=64)
    p.add_argument("--layers", type=_cli.count("--layers"), default=2)
    p.add_argument("--mlp", type=_cli.count("--mlp"), default=256)
    p.add_argument("--heads", type=_cli.count("--heads"), default=4)
    p.add_argument(
        "--clients",
        type=_cli.count("--clients", 200),
        default=400,
        help="clients in the federation (>= 200: the largest cohort)",
    )
    p.add_argument(
        "--windows",
        type=_cli.count("--windows"),
        default=20,
        help="training windows per client (default 20, the experiment's)",
    )
    p.add_argument("--layers-adapted", nargs="+", default=["q", "v"], metavar="LAYER")
    args = p.parse_args(argv)
    try:
        config = lora.TransformerConfig(80, 64, args.d_model, args.heads, args.layers, args.mlp)
    except ValueError as err:
        raise _cli.UserError(f"--d-model {args.d_model}, --heads {args.heads}: {err}") from None
    try:
        lora.adapter_layers(config, args.layers_adapted)
    except ValueError as err:
        raise _cli.UserError(f"--layers-adapted: {err}") from None
    try:
        for rank in (4, 16):  # the ranks timed; the names are checked above
            lora.check_lora(config, rank, args.layers_adapted)
    except ValueError as err:
        raise _cli.UserError(
            f"--layers-adapted: {err}; raise --d-model or --mlp (ranks 4 and 16 are timed)"
        ) from None
    base = jax.tree.map(np.asarray, lora.full_transformer(config).init(jax.random.key(0)))
    store, test = federation(config, args.clients, args.windows)
    training = LocalTraining(epochs=1, batch_size=10)
    ref = one_client(config, base, store, training)
    print(f"one client, base model: {ref.total / MiB:.2f} MiB", flush=True)
    plan = [("lora", r, c, "sequential") for r in (4, 16) for c in (50, 200)]
    plan += [("full", None, c, "sequential") for c in (50, 200)]
    plan += [("lora", 4, 50, "vmap"), ("lora", 16, 50, "vmap"), ("full", None, 50, "vmap")]
    rows = []
    for trainable, rank, cohort, cmap in plan:
        row = dp_round(
            config,
            base,
            store,
            test,
            training,
            trainable,
            rank,
            cohort,
            cmap,
            args.layers_adapted,
        )
        rows.append(row)
        print(
            f"{row.what}, cohort {cohort}, {cmap}: {row.total / MiB:.2f} MiB "
            f"({row.total / ref.total:.2f}x; compiled in {row.compile_s:.1f} s)",
            flush=True,
        )
    md = table(rows, ref)
    print(md)
    if args.write:
        sizes = lora.describe(config, 4, args.layers_adapted)
        text = (
            f"## lora_memory-{_results.device_slug()} (`python -m benchmarks.lora_memory`)\n\n"
            f"{_results.machine()}. One compiled round of user-level DP-FedAvg (fixed "
            f"clipping, expected cohort as listed, Poisson buffer from the plan) on "
            f"{args.clients} clients of {args.windows} windows of 64 characters; transformer "
            f"d_model {args.d_model}, {args.layers} blocks, MLP {args.mlp} "
            f"({sizes['base_params']:,} parameters); LoRA on {' '.join(args.layers_adapted)}. "
            "Memory: XLA's buffer assignment of the compiled program (arguments + outputs + "
            "temporaries - aliases), not run. Reference: one client training the whole base "
            "model (1 epoch, batch 10).\n\n" + md
        )
        _results.write_section(f"lora_memory-{_results.device_slug()}", text)
        print(f"written to {_results.RESULTS}")


if __name__ == "__main__":
    main()
