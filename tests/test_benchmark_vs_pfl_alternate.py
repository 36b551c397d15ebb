"""``benchmarks.vs_pfl --alternate``: swarmjax's and pfl's blocks in turn, paired, and the
median of the pairs' ratios; pfl's side (``pfl_run.py --serve``) replaced by a fake that
speaks the same stdin/stdout protocol, so no pfl (nor any training) is needed: seconds."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import pytest

from benchmarks import vs_pfl
from benchmarks.vs_pfl import Block, PflError, PflServer, alternate
from experiments import _cli

# pfl_run.py --serve's protocol: one JSON line after the first round, then one per 'run K';
# the summary line at the end of stdin. argv: log file, behaviour, wall seconds per block
FAKE = """
import json, sys, time
log, how, walls = sys.argv[1], sys.argv[2], [float(w) for w in sys.argv[3:]]
def say(obj):
    print(json.dumps(obj) if not isinstance(obj, str) else obj, flush=True)
def note(what):
    with open(log, "a") as f:
        f.write(what + "\\n")
say({"round_times": [9.0], "round_cpu_times": [9.0]})
block = 0
for line in sys.stdin:
    k = int(line.split()[1])
    note(f"pfl {k}")
    if how == "die":
        print("torch: out of memory", file=sys.stderr)
        sys.exit(3)
    if how == "garbage":
        say("Round 1 of 5 done")
        continue
    if how == "hang":
        time.sleep(120)
    if how == "short":
        k -= 1
    w = walls[block]
    say({"round_times": [w] * k, "round_cpu_times": [2 * w] * k})
    block += 1
note("pfl end")
say({"system": "pfl", "noise_multiplier": 0.6})
"""


def _server(tmp_path: Path, how: str, walls: list[float], timeout_s: float = 10.0) -> PflServer:
    script = tmp_path / "fake_pfl.py"
    script.write_text(FAKE)
    cmd = [sys.executable, str(script), str(tmp_path / "log"), how, *map(str, walls)]
    return PflServer(cmd, tmp_path, timeout_s)


def test_blocks_alternate_pair_up_and_give_the_median_ratio(tmp_path):
    pfl_walls = [1.2, 3.0, 1.5, 1.6, 1.3]  # the second pair in a slow phase on pfl's side
    ours_walls = iter([1.0, 1.0, 1.0, 2.0, 1.0])  # the fourth on swarmjax's
    log = tmp_path / "log"

    def ours(k: int) -> Block:
        with log.open("a") as f:
            f.write(f"swarmjax {k}\n")
        w = next(ours_walls)
        return Block([w] * k, [w] * k, [40] * k)  # a Poisson cohort of 40 each round

    # others' share of the CPU during each block (swarmjax's, pfl's, ...): the second pair
    # is loaded during pfl's block, the fourth during swarmjax's; own CPU: the blocks' sums
    shares = [0.0, 0.05, 0.0, 0.5, 0.1, 0.0, 0.3, 0.0, 0.02, 0.02]
    own = [
        x for s, p in zip([1.0, 1.0, 1.0, 2.0, 1.0], pfl_walls, strict=True) for x in (3 * s, 6 * p)
    ]
    readings = iter(
        [r for o, sh in zip(own, shares, strict=True) for r in ((0.0, 0.0), (o + 100 * sh, 100))]
    )
    with _server(tmp_path, "ok", pfl_walls) as pfl:
        assert pfl.ready().wall == [9.0]
        said: list[str] = []
        turns = alternate(
            ours, pfl, pairs=5, rounds=3, machine_cpu=lambda: next(readings), say=said.append
        )
        assert pfl.close()["noise_multiplier"] == 0.6
    assert log.read_text().split("\n")[:-1] == ["swarmjax 3", "pfl 3"] * 5 + ["pfl end"]
    assert turns["pair_ratios"]["wall"] == pytest.approx([1.2, 3.0, 1.5, 0.8, 1.3])
    assert turns["wall_ratio_median"] == pytest.approx(1.3)  # not the mean (1.56)
    assert (turns["wall_ratio_min"], turns["wall_ratio_max"]) == pytest.approx((0.8, 3.0))
    assert turns["cpu_ratio_median"] == pytest.approx(2.6)
    # per trained client: pfl's 50 a round against swarmjax's 40
    assert turns["wall_per_client_ratio_median"] == pytest.approx(1.3 * 40 / 50)
    assert [len(b["wall"]) for b in turns["blocks"]["pfl"]] == [3] * 5
    assert turns["others_share"]["pfl"] == pytest.approx([0.05, 0.5, 0.0, 0.0, 0.02])
    assert said[1] == (
        "  pair 2/5: swarmjax 1.00 s, pfl 3.00 s a round: 3.00x; others used 0% and 50% of the CPU"
    )
    assert turns["quiet_pairs"] == [0, 2, 4]  # others at most 10 % in both blocks
    assert turns["quiet_wall_ratio_median"] == pytest.approx(1.3)
    assert (turns["quiet_wall_ratio_min"], turns["quiet_wall_ratio_max"]) == pytest.approx(
        (1.2, 1.5)
    )
    line = vs_pfl.alternated_line({**turns, "dp": True, "accountant": "pld", "load": [1, 2]})
    assert "1.30x pfl's rounds per second" in line and "min 0.80, max 3.00" in line
    assert "3 of 5 pairs quiet" in line and "median 1.30x (min 1.20, max 1.50)" in line


def test_others_share_of_the_machine():
    assert vs_pfl.others_share((10.0, 100.0), (16.0, 110.0), own=4.0) == pytest.approx(0.2)
    assert vs_pfl.others_share((10.0, 100.0), (12.0, 110.0), own=4.0) == 0.0  # tick rounding
    assert math.isnan(vs_pfl.others_share(None, (1.0, 2.0), own=0.0))
    busy, total = vs_pfl.cpu_seconds() or (0.0, 1.0)  # Linux: since boot, busy <= total
    assert 0 <= busy <= total


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("die", "exited with status 3 before answering 'run 2'; its last line on stderr: torch"),
        ("garbage", "answered 'Round 1 of 5 done' to 'run 2', not its JSON line"),
        ("short", "answered 2 round(s) of 'run 2' with"),
        ("hang", "did not answer 'run 2' within 1 s"),
    ],
)
def test_a_pfl_that_dies_or_garbles_or_hangs_is_one_error_not_a_hang(tmp_path, how, said):
    t0 = time.perf_counter()
    with _server(tmp_path, how, [1.0]) as pfl:
        pfl.ready()  # a loaded machine may take a while to start Python
        pfl.timeout_s = 1.0
        with pytest.raises(PflError) as err:
            pfl.run(2)
        assert pfl._proc.poll() is not None  # killed, nothing left running
    assert said in str(err.value) and "\n" not in str(err.value)
    assert time.perf_counter() - t0 < 30  # the hanging one sleeps 120 s
    assert issubclass(PflError, _cli.UserError)  # entry_point: one line on stderr, exit 2


def test_pfl_that_never_starts_is_named(tmp_path):
    cmd = [sys.executable, "-c", "import sys; sys.exit('no module named pfl')"]
    with PflServer(cmd, tmp_path, 5.0) as pfl, pytest.raises(PflError) as err:
        pfl.ready()
    assert "exited with status 1 before answering its first round" in str(err.value)
    assert "no module named pfl" in str(err.value)


def test_pfl_run_serve_answers_run_k_and_refuses_other_commands(capsys, monkeypatch):
    """pfl_run.py's callback without pfl: its answers and the commands it takes (the module
    imports torch and pfl, absent here, so the class is read from its source)."""
    source = (Path(vs_pfl.__file__).with_name("pfl_run.py")).read_text()
    start, end = source.index("class RoundTimer"), source.index("def accuracy")
    code = source[start:end].replace("(TrainingProcessCallback)", "")
    scope = {"json": json, "sys": sys, "time": time, "TextIO": object}
    exec(code, scope)  # the repository's own source
    answers = []

    class Out:
        def write(self, text: str) -> None:
            answers.extend(json.loads(t) for t in text.split("\n") if t.strip())

        def flush(self) -> None:
            pass

    lines = iter(["run 2\n", "run 9\n"])
    monkeypatch.setattr(sys, "stdin", type("In", (), {"readline": lambda self: next(lines)})())
    timer = scope["RoundTimer"](5, Out())
    stops = [timer.after_central_iteration(dict(), None, central_iteration=i)[0] for i in range(3)]
    assert stops == [False, False, True]  # 'run 9' with 2 rounds left: refused, loop ended
    assert [len(a.get("round_times", [])) for a in answers] == [1, 2, 0]
    assert "1 <= K <= 2" in answers[-1]["error"]
