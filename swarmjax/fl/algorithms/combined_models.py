"""The combined-learning thesis's models (seed 004) as Flax :class:`~swarmjax.models.Model` s.

Sizes are those of the thesis's text and its authors' code (melloguel/tcc-coln), checked
against the parameter counts the thesis prints:

=============  ==================================================  ==========  ===========
dataset        model                                               thesis      here
=============  ==================================================  ==========  ===========
mnist          smlp 784-100-50-10                                  84,060      84,060
mnist          mmlp 784-200-200-10 (McMahan's 2NN)                 199,210     199,210
mnist          lmlp 784-300-160-120-80-50-10 (tanh before last)    317,220     317,220
mnist          conv: conv3x3 32, conv3x3 64, pool 2, 9216-128-10   1,199,882   1,199,882
mnist          lstm: 2-layer LSTM(128) over the 28 rows, 128-10    214,282     213,258
breast_cancer  smlp 30-64-64-32-16-2                               8,786       8,786
breast_cancer  mmlp 30-128-64-32-16-2                              14,866      14,866
breast_cancer  lmlp 30-256-128-64-32-2 (authors' code)             (not given) 51,234
breast_cancer  lstm: 2-layer LSTM(128), one step of 30 features    214,274     213,250
cifar10        smlp 3072-1000-500-200-10                           3,675,710   3,675,710
cifar10        conv: 3 conv (64,128,64) + pool, 1024-512-128-64-10 666,890     666,890
=============  ==================================================  ==========  ===========

Differences: Flax's LSTM cell has one bias per gate where PyTorch has two (``4 H`` fewer
parameters per layer); dropout layers of the authors' lmlp/wisconsin models are left out
(the :class:`Model` protocol is deterministic). The thesis's CIFAR-10 mmlp and rnn are not
specified precisely enough to rebuild; ``cifar10`` offers smlp, conv and an LSTM over rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache

import flax.linen as nn
from jaxtyping import Array

from swarmjax._validation import check_choice
from swarmjax.models import Model, SliceConv, from_flax, mlp, simple_cnn, unbatched_orthogonal

__all__ = ["THESIS_MODELS", "thesis_model"]


class _Stack(nn.Module):
    """Dense layers with a given activation after each hidden layer (flattens examples)."""

    widths: tuple[int, ...]
    activations: tuple[str, ...]
    num_classes: int
    input_ndim: int

    @nn.compact
    def __call__(self, x: Array) -> Array:
        x = x.reshape((*x.shape[: x.ndim - self.input_ndim], -1))
        for width, act in zip(self.widths, self.activations, strict=True):
            x = getattr(nn, act)(nn.Dense(width)(x))
        return nn.Dense(self.num_classes)(x)


class _CifarConv(nn.Module):
    """32x32x3 -> conv3 64 / conv2 128 / conv2 64 (padding 1), each + pool 2 -> 1024 -> C."""

    num_classes: int

    @nn.compact
    def __call__(self, x: Array) -> Array:
        unbatched = x.ndim == 3
        x = x[None] if unbatched else x
        for i, (ch, k) in enumerate(((64, 3), (128, 2), (64, 2))):
            x = nn.relu(SliceConv(ch, (k, k), ((1, 1), (1, 1)), name=f"Conv_{i}")(x))
            x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))
        for width in (512, 128, 64):
            x = nn.relu(nn.Dense(width)(x))
        x = nn.Dense(self.num_classes)(x)
        return x[0] if unbatched else x


class _RowLSTM(nn.Module):
    """Stacked LSTM over an example read as ``(steps, features)`` (image rows: steps = H);
    logits from the last step's output. Works with or without a batch axis."""

    steps: int
    hidden: int
    layers: int
    num_classes: int
    example_ndim: int

    @nn.compact
    def __call__(self, x: Array) -> Array:
        batch = x.shape[: x.ndim - self.example_ndim]
        features = math.prod(x.shape[x.ndim - self.example_ndim :]) // self.steps
        seq = x.reshape((-1, self.steps, features))
        for _ in range(self.layers):
            cell = nn.OptimizedLSTMCell(self.hidden, recurrent_kernel_init=unbatched_orthogonal())
            seq = nn.RNN(cell)(seq)
        out = nn.Dense(self.num_classes)(seq[:, -1])
        return out.reshape((*batch, self.num_classes))


def _stack(widths: tuple[int, ...], acts: tuple[str, ...], shape: tuple[int, ...], c: int):
    return lambda name: from_flax(
        _Stack(widths=widths, activations=acts, num_classes=c, input_ndim=len(shape)),
        shape,
        c,
        name,
    )


_MNIST = (28, 28, 1)
_CIFAR = (32, 32, 3)
_BC = (30,)

THESIS_MODELS: dict[str, dict[str, Callable[[str], Model]]] = {
    "mnist": {
        "smlp": lambda name: mlp((100, 50), 10, _MNIST, name),
        "mmlp": lambda name: mlp((200, 200), 10, _MNIST, name),
        "lmlp": _stack((300, 160, 120, 80, 50), ("relu",) * 4 + ("tanh",), _MNIST, 10),
        "conv": lambda name: simple_cnn(10, _MNIST, name),
        "lstm": lambda name: from_flax(_RowLSTM(28, 128, 2, 10, 3), _MNIST, 10, name),
    },
    "breast_cancer": {
        "smlp": lambda name: mlp((64, 64, 32, 16), 2, _BC, name),
        "mmlp": lambda name: mlp((128, 64, 32, 16), 2, _BC, name),
        "lmlp": lambda name: mlp((256, 128, 64, 32), 2, _BC, name),
        "lstm": lambda name: from_flax(_RowLSTM(1, 128, 2, 2, 1), _BC, 2, name),
    },
    "cifar10": {
        "smlp": lambda name: mlp((1000, 500, 200), 10, _CIFAR, name),
        "conv": lambda name: from_flax(_CifarConv(10), _CIFAR, 10, name),
        "lstm": lambda name: from_flax(_RowLSTM(32, 128, 2, 10, 3), _CIFAR, 10, name),
    },
}
# Fashion-MNIST has MNIST's shapes: the same models apply.
THESIS_MODELS["fashion_mnist"] = THESIS_MODELS["mnist"]


@cache
def thesis_model(dataset: str, name: str) -> Model:
    """The thesis's model ``name`` (smlp, mmlp, lmlp, conv, lstm) for ``dataset``.

    Cached: the same object for the same arguments, so configs holding it hash equal and
    jitted runners compile once per model.
    """
    check_choice("dataset", dataset, tuple(THESIS_MODELS))
    check_choice(f"model for {dataset}", name, tuple(THESIS_MODELS[dataset]))
    return THESIS_MODELS[dataset][name](f"{dataset}_{name}")
