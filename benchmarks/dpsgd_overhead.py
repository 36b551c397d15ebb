"""DP-SGD overhead: steps/s of the private and non-private step, JAX vs Opacus.

Models (seed 000): the MLP 784-256-256-10 and the LeNet-5 variant (28x28x3 -> 9), at batch
64 and 256, float32, Adam.  For each: the non-private JAX step, the JAX DP step on the fast
path (ghost norms / book-keeping, :mod:`swarmjax.privacy.dpsgd`) and on the naive
``vmap(grad)`` path, and, when PyTorch and Opacus are installed, the PyTorch non-private
step and Opacus's DP step in hook mode and with ghost clipping.  Ratios are against the
non-private step of the same framework, measured in the same run.

    python -m benchmarks.dpsgd_overhead            # full table, printed with its header
    python -m benchmarks.dpsgd_overhead --write    # ... and written to benchmarks/RESULTS.md
    python -m benchmarks.dpsgd_overhead --quick    # batch 64 only, fewer repeats
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import _cli as _bcli
from benchmarks._results import best_time, machine, write_section
from experiments import _cli
from swarmjax import models
from swarmjax.privacy import dpsgd

CLIP, SIGMA, LR = 1.0, 1.0, 1e-3


def _jax_steps(model: models.Model, batch: int) -> dict[str, Callable[[], object]]:
    params = jax.jit(model.init)(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (batch, *model.input_shape))
    y = jnp.arange(batch) % model.num_classes
    mask = jnp.ones(batch, bool)
    tx = optax.adam(LR)
    state = tx.init(params)

    @jax.jit
    def plain(params, state, x, y):
        grads = jax.grad(lambda p: models.loss(model.apply, p, x, y))(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    def private(method: str):
        return jax.jit(
            lambda key, params, state, x, y, mask: dpsgd.dp_step(
                key,
                params,
                state,
                x,
                y,
                mask,
                optimizer=tx,
                apply_fn=model.apply,
                loss_fn=models.cross_entropy,
                clip_norm=CLIP,
                noise_multiplier=SIGMA,
                expected_batch_size=float(batch),
                method=method,
            )
        )

    fast, naive = private("fast"), private("generic")
    key = jax.random.key(2)
    return {
        "jax": lambda: jax.block_until_ready(plain(params, state, x, y)),
        "jax_dp_fast": lambda: jax.block_until_ready(fast(key, params, state, x, y, mask)),
        "jax_dp_naive": lambda: jax.block_until_ready(naive(key, params, state, x, y, mask)),
    }


def _torch_models():
    from torch import nn

    mlp = lambda: nn.Sequential(
        nn.Flatten(),
        nn.Linear(784, 256),
        nn.ReLU(),
        nn.Linear(256, 256),
        nn.ReLU(),
        nn.Linear(256, 10),
    )
    lenet = lambda: nn.Sequential(
        nn.Conv2d(3, 6, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(256, 120),
        nn.ReLU(),
        nn.Linear(120, 84),
        nn.ReLU(),
        nn.Linear(84, 9),
    )
    return {"mlp": (mlp, (1, 28, 28), 10), "lenet5": (lenet, (3, 28, 28), 9)}


def torch_device() -> str:
    """Where the PyTorch/Opacus steps run: ``"cuda"`` when PyTorch sees a GPU, else
    ``"cpu"`` (``"not installed"`` without PyTorch)."""
    try:
        import torch
    except ImportError:
        return "not installed"
    return "cuda" if torch.cuda.is_available() else "cpu"


def _torch_steps(name: str, batch: int) -> dict[str, Callable[[], object]]:
    try:
        import torch
        from opacus import PrivacyEngine
    except ImportError:
        return {}
    where = torch_device()
    sync = torch.cuda.synchronize if where == "cuda" else lambda: None
    make, shape, classes = _torch_models()[name]
    x = torch.randn(batch, *shape, device=where)
    y = torch.arange(batch, device=where) % classes
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch)
    steps: dict[str, Callable[[], object]] = {}

    def plain_step(model, optimizer, criterion):
        def step():
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
            sync()

        return step

    model = make().to(where)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    steps["torch"] = plain_step(model, opt, torch.nn.CrossEntropyLoss())
    for mode, label in (("hooks", "opacus_hooks"), ("ghost", "opacus_ghost")):
        model = make().to(where)
        opt = torch.optim.Adam(model.parameters(), lr=LR)
        criterion = torch.nn.CrossEntropyLoss()
        out = PrivacyEngine().make_private(
            module=model,
            optimizer=opt,
            data_loader=loader,
            noise_multiplier=SIGMA,
            max_grad_norm=CLIP,
            grad_sample_mode=mode,
            criterion=criterion,
            poisson_sampling=False,
        )
        if mode == "ghost":
            model, opt, criterion, _ = out
        else:
            model, opt, _ = out
        steps[label] = plain_step(model, opt, criterion)
    return steps


def _measure(steps: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    out = {}
    for label, step in steps.items():
        step()  # compile / warm up
        out[label] = best_time(step, repeats=repeats)
    return out


def _row(model: str, batch: int, t: dict[str, float]) -> str:
    ms = lambda k: f"{1e3 * t[k]:.2f}" if k in t else "n/a"
    ratio = lambda k, base: f"{t[k] / t[base]:.2f}x" if k in t and base in t else "n/a"
    return (
        f"| {model} | {batch} | {ms('jax')} | {ms('jax_dp_fast')} ({ratio('jax_dp_fast', 'jax')})"
        f" | {ms('jax_dp_naive')} ({ratio('jax_dp_naive', 'jax')}) | {ms('torch')}"
        f" | {ms('opacus_hooks')} ({ratio('opacus_hooks', 'torch')})"
        f" | {ms('opacus_ghost')} ({ratio('opacus_ghost', 'torch')}) |"
    )


HEADER = (
    "| model | batch | JAX non-DP ms | JAX DP fast ms (x) | JAX DP naive vmap(grad) ms (x) "
    "| torch non-DP ms | Opacus hooks ms (x) | Opacus ghost ms (x) |\n"
    "|---|---|---|---|---|---|---|---|"
)


def benchmark_models() -> dict[str, models.Model]:
    """The models timed: seed 000's MLP 784-256-256-10 and LeNet-5 (28x28x3 -> 9)."""
    return {"mlp": models.paper_mlp(), "lenet5": models.lenet5()}


def measure(
    batches: tuple[int, ...], repeats: int, *, opacus: bool = True, naive: bool = True
) -> list[tuple[str, int, dict[str, float]]]:
    """Seconds per step of every variant, for each of :func:`benchmark_models` at each
    batch size: ``(model, batch, {variant: seconds})``; Opacus's only when ``opacus`` and
    installed, the naive ``vmap(grad)`` DP step only when ``naive``. Prints the table's
    header, then each row as it is measured."""
    rows = []
    print(HEADER, flush=True)
    for name, model in benchmark_models().items():
        for batch in batches:
            steps = _jax_steps(model, batch)
            if not naive:
                del steps["jax_dp_naive"]
            if opacus:
                steps |= _torch_steps(name, batch)
            times = _measure(steps, repeats)
            rows.append((name, batch, times))
            print(_row(name, batch, times), flush=True)
    return rows


@_cli.entry_point
def main(argv: list[str] | None = None) -> str:
    parser = _bcli.parser("dpsgd_overhead", __doc__.split("\n\n")[0], writes="dpsgd_overhead")
    parser.add_argument("--quick", action="store_true", help="batch 64 only, 3 repeats")
    parser.add_argument(
        "--repeats", type=_cli.count("--repeats"), default=None, help="timing repeats (best of)"
    )
    parser.add_argument("--no-opacus", action="store_true", help="skip PyTorch/Opacus")
    args = parser.parse_args(argv)
    batches = (64,) if args.quick else (64, 256)
    repeats = args.repeats or (3 if args.quick else 10)
    rows = [_row(*r) for r in measure(batches, repeats, opacus=not args.no_opacus)]
    text = (
        "## DP-SGD overhead (`python -m benchmarks.dpsgd_overhead"
        + (" --quick" if args.quick else "")
        + "`)\n\n"
        + f"Machine: {machine()}.\n\n"
        + f"One Adam step, float32, clip {CLIP}, noise multiplier {SIGMA}; best of {repeats}. "
        + "Ratios: JAX columns against the JAX non-DP step, Opacus columns against the "
        + "PyTorch non-DP step. 'n/a': PyTorch/Opacus not installed.\n\n"
        + HEADER
        + "\n"
        + "\n".join(rows)
        + "\n"
    )
    if args.write:
        write_section("dpsgd_overhead", text)
        print("wrote the dpsgd_overhead section of benchmarks/RESULTS.md")
    else:
        print("(printed only; --write records it in benchmarks/RESULTS.md)")
    return text


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
