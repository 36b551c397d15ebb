"""pfl 0.6 (PyTorch backend) side of ``python -m benchmarks.vs_pfl``; runs in pfl's own venv.

Standalone on purpose: it imports pfl and torch only (never swarmjax), so it can run under
another interpreter (``--pfl-python``). It reads the users and test set that the benchmark
wrote (``data.npz``: ``x (rows, 28, 28, 1)``, ``y``, ``offsets``, ``sizes``, ``x_test``,
``y_test``) and prints one JSON line with per-round times, accuracy and epsilon.

``--serve`` (``vs_pfl --alternate``): the same run, paused between blocks of rounds so that
swarmjax's blocks can be timed in turn. After the first round it prints one JSON line
``{"round_times": [s], "round_cpu_times": [s]}`` (wall and CPU seconds of that round) and
waits on stdin; each ``run K`` line runs the next K rounds of the same pfl loop and answers
with the same line for those K rounds (each round timed from the command's arrival, so the
wait is in none of them); ``stop`` or the end of stdin ends the loop, after which the usual
summary line follows. A bad command is answered ``{"error": "..."}`` and ends the loop.
While serving, stdout holds only these lines (anything else printed goes to stderr).

Workload (issue #31, point 5): FedAvg of deltas, cohort 50 drawn uniformly by pfl's
``"random"`` user sampler, 1 local epoch of SGD (lr 0.1, batch 10), central SGD lr 1.0,
pfl's ``simple_cnn`` architecture; with ``--dp``: user-level clip 0.4 and pfl's Gaussian
mechanism applied centrally (``CentrallyAppliedPrivacyMechanism``) with noise from its PLD
accountant for (epsilon, delta) over the rounds at sampling rate cohort / users.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TextIO

import numpy as np
import torch
from pfl.aggregate.simulate import SimulatedBackend
from pfl.algorithm.base import NNAlgorithmParams
from pfl.algorithm.federated_averaging import FederatedAveraging
from pfl.callback.base import TrainingProcessCallback
from pfl.data.dataset import Dataset
from pfl.data.federated_dataset import FederatedDataset
from pfl.data.sampling import get_user_sampler
from pfl.hyperparam.base import NNEvalHyperParams, NNTrainHyperParams
from pfl.metrics import Weighted
from pfl.model.pytorch import PyTorchModel
from pfl.privacy.ftrl_mechanism import BandedMatrixFactorizationMechanism
from pfl.privacy.gaussian_mechanism import GaussianMechanism
from pfl.privacy.privacy_accountant import PLDPrivacyAccountant
from pfl.privacy.privacy_mechanism import CentrallyAppliedPrivacyMechanism


class SimpleCNN(torch.nn.Module):
    """pfl-research's ``simple_cnn`` for 28x28x1 inputs: 1,199,882 parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(1, 32, 3),
            torch.nn.ReLU(),
            torch.nn.Conv2d(32, 64, 3),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2, 2),
            torch.nn.Flatten(),
            torch.nn.Linear(12 * 12 * 64, 128),
            torch.nn.ReLU(),
            torch.nn.Linear(128, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.permute(0, 3, 1, 2))  # NHWC (as stored) -> NCHW

    def loss(self, x, y, eval=False):
        self.eval() if eval else self.train()
        return torch.nn.functional.cross_entropy(self(x), y.long())

    @torch.no_grad()
    def metrics(self, x, y, eval=True):
        self.eval() if eval else self.train()
        logits = self(x)
        loss = torch.nn.functional.cross_entropy(logits, y.long(), reduction="sum").item()
        correct = (logits.argmax(-1) == y.long()).sum().item()
        return {"loss": Weighted(loss, len(x)), "accuracy": Weighted(correct, len(x))}


class RoundTimer(TrainingProcessCallback):
    """Wall and CPU seconds of every central iteration (pfl calls this after each one).

    ``serve``: the stream of ``--serve``'s answers; the first round is a block of its own,
    then each block is as long as its ``run K`` command asks (at most the ``rounds`` left).
    """

    def __init__(self, rounds: int, serve: TextIO | None = None) -> None:
        self.times: list[float] = []
        self.cpu: list[float] = []
        self.rounds = rounds
        self.serve = serve
        self._left = 1  # rounds left in the block being run (serving)
        self._block = 0  # index of the block's first round
        self._last = time.perf_counter()
        self._cpu = time.process_time()

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
        now, cpu = time.perf_counter(), time.process_time()
        self.times.append(now - self._last)
        self.cpu.append(cpu - self._cpu)
        self._last, self._cpu = now, cpu
        stop = False
        if self.serve is not None:
            self._left -= 1
            if self._left == 0:
                self._answer(
                    {
                        "round_times": self.times[self._block :],
                        "round_cpu_times": self.cpu[self._block :],
                    }
                )
                self._block = len(self.times)
                stop = self._command(sys.stdin.readline())
                self._last, self._cpu = time.perf_counter(), time.process_time()
        return stop, type(aggregate_metrics)()

    def _answer(self, reply: dict) -> None:
        assert self.serve is not None
        print(json.dumps(reply), file=self.serve, flush=True)

    def _command(self, line: str) -> bool:
        """Reads one ``run K`` / ``stop`` line (``""``: stdin ended); True: end the loop."""
        words = line.split()
        if not words or words == ["stop"]:
            return True
        left = self.rounds - len(self.times)
        if len(words) == 2 and words[0] == "run" and words[1].isdigit():
            k = int(words[1])
            if 1 <= k <= left:
                self._left = k
                return False
        self._answer({"error": f"expected 'run K' with 1 <= K <= {left} or 'stop'; got {line!r}"})
        return True


def accuracy(model: SimpleCNN, x: np.ndarray, y: np.ndarray) -> float:
    model.eval()
    device = next(model.parameters()).device  # pfl puts the model on its default device
    correct = 0
    with torch.no_grad():
        for s in range(0, len(x), 1000):
            logits = model(torch.from_numpy(x[s : s + 1000]).to(device))
            correct += int((logits.argmax(-1).cpu().numpy() == y[s : s + 1000]).sum())
    return correct / len(x)


class _Parser(argparse.ArgumentParser):
    """One-line errors (exit 2), as every script of the repository (this one runs under
    pfl's own interpreter, which cannot import ``experiments._cli``)."""

    def error(self, message: str) -> None:
        self.exit(2, f"{self.prog}: error: {message}\n")


def main() -> None:
    p = _Parser(prog="benchmarks/pfl_run.py")
    p.add_argument("--data", required=True)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--cohort", type=int, default=50)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dp", action="store_true")
    p.add_argument("--clip", type=float, default=0.4)
    p.add_argument("--epsilon", type=float, default=2.0)
    p.add_argument("--delta", type=float, default=None)
    p.add_argument("--accounting-rounds", type=int, default=None)
    p.add_argument(
        "--mechanism",
        choices=("gaussian", "banded_mf"),
        default="gaussian",
        help="gaussian: DP-FedAvg, Poisson-amplified PLD; banded_mf: pfl's DP-FTRL with banded "
        "matrix-factorization noise, users in a fixed cycle (pfl's 'minimize_reuse' sampler)",
    )
    p.add_argument(
        "--serve",
        action="store_true",
        help="pause after the first round and after each block; run blocks of rounds as stdin "
        "asks ('run K'), one JSON line of their times each (vs_pfl --alternate)",
    )
    a = p.parse_args()
    for name in ("rounds", "cohort", "threads"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1; got {getattr(a, name)}")
    if a.accounting_rounds is not None and a.accounting_rounds < a.rounds:
        p.error(f"--accounting-rounds must be >= the rounds {a.rounds}; got {a.accounting_rounds}")
    if not (a.clip > 0 and a.epsilon > 0 and (a.delta is None or 0 < a.delta < 1)):
        p.error("--clip and --epsilon must be > 0, --delta in (0, 1)")
    if not a.dp:
        for name in ("clip", "epsilon", "delta", "accounting_rounds", "mechanism"):
            flag = f"--{name.replace('_', '-')}"
            if any(arg.split("=")[0] == flag for arg in sys.argv[1:]):
                p.error(f"--{name.replace('_', '-')} does not apply without --dp")
    if not os.path.isfile(a.data):
        p.error(f"--data {a.data!r} is not a file")
    answers = None
    if a.serve:  # stdout holds the protocol's lines only
        answers, sys.stdout = sys.stdout, sys.stderr
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    np.random.seed(a.seed)  # noqa: NPY002 (pfl's "random" user sampler draws from it)
    d = np.load(a.data)
    x, y = d["x"].astype(np.float32), d["y"].astype(np.int64)
    offsets, sizes = d["offsets"], d["sizes"]
    users = list(range(len(sizes)))

    def make_dataset(uid: int) -> Dataset:
        rows = slice(int(offsets[uid]), int(offsets[uid] + sizes[uid]))
        return Dataset(raw_data=[torch.from_numpy(x[rows]), torch.from_numpy(y[rows])])

    banded = a.dp and a.mechanism == "banded_mf"
    # DP-FTRL's guarantee rests on the schedule, not on sampling: users come in a fixed cycle,
    # so each one participates every len(users) / cohort rounds (pfl's min_separation)
    sampler = get_user_sampler("minimize_reuse" if banded else "random", users)
    train = FederatedDataset(make_dataset, sampler)
    cnn = SimpleCNN()
    model = PyTorchModel(
        model=cnn,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(cnn.parameters(), lr=1.0),
    )
    postprocessors, epsilon, noise, schedule = [], None, None, {}
    if banded:
        delta = a.delta if a.delta is not None else 1.0 / len(users)
        separation = len(users) // a.cohort
        made: list[PLDPrivacyAccountant] = []

        def make_accountant(participations: int) -> PLDPrivacyAccountant:
            # no amplification: each of a user's participations is one Gaussian release
            made.append(
                PLDPrivacyAccountant(
                    num_compositions=participations,
                    sampling_probability=1.0,
                    mechanism="gaussian",
                    epsilon=a.epsilon,
                    delta=delta,
                )
            )
            return made[-1]

        mechanism = BandedMatrixFactorizationMechanism(
            a.clip, a.rounds, separation, make_accountant
        )
        postprocessors = [CentrallyAppliedPrivacyMechanism(mechanism)]
        epsilon, noise = made[-1].epsilon, made[-1].cohort_noise_parameter
        schedule = {"min_separation": separation, "participations": made[-1].num_compositions}
    elif a.dp:
        delta = a.delta if a.delta is not None else 1.0 / len(users)
        accountant = PLDPrivacyAccountant(
            num_compositions=a.accounting_rounds or a.rounds,
            sampling_probability=a.cohort / len(users),
            mechanism="gaussian",
            epsilon=a.epsilon,
            delta=delta,
        )
        mechanism = GaussianMechanism.from_privacy_accountant(accountant, a.clip)
        postprocessors = [CentrallyAppliedPrivacyMechanism(mechanism)]
        epsilon, noise = accountant.epsilon, accountant.cohort_noise_parameter
    backend = SimulatedBackend(training_data=train, val_data=None, postprocessors=postprocessors)
    timer = RoundTimer(a.rounds, answers)
    params = NNAlgorithmParams(
        central_num_iterations=a.rounds,
        evaluation_frequency=10**9,
        train_cohort_size=a.cohort,
        val_cohort_size=0,
    )
    train_params = NNTrainHyperParams(
        local_batch_size=10, local_num_epochs=1, local_learning_rate=0.1
    )
    start = time.perf_counter()
    FederatedAveraging().run(
        algorithm_params=params,
        backend=backend,
        model=model,
        model_train_params=train_params,
        model_eval_params=NNEvalHyperParams(local_batch_size=1000),
        callbacks=[timer],
    )
    total = time.perf_counter() - start
    if banded:  # what the mechanism holds between rounds: C and the last noises it solved
        held = mechanism._C_inv_noise._previous_solved
        schedule["noise_state_bytes"] = int(mechanism.query_matrix.nbytes) + (
            0 if held is None else int(held.numel() * held.element_size())
        )
    acc = accuracy(cnn, d["x_test"].astype(np.float32), d["y_test"].astype(np.int64))
    print(
        json.dumps(
            {
                "system": "pfl",
                "dp": a.dp,
                "mechanism": a.mechanism if a.dp else None,
                **schedule,
                "rounds": a.rounds,
                "round_times": timer.times,
                "round_cpu_times": timer.cpu,
                "total_s": total,
                "accuracy": acc,
                "epsilon": epsilon,
                "noise_multiplier": noise,
                "params": sum(p.numel() for p in cnn.parameters()),
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "device": str(next(cnn.parameters()).device),
            }
        ),
        file=answers or sys.stdout,
        flush=True,
    )


if __name__ == "__main__":
    main()
