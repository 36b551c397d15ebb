"""A sweep under ``jax.distributed``: two local CPU processes, one shared folder."""

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from swarmjax import sweep
from swarmjax.paaso_sweep import PAASOTask, expand_phi

REPO = Path(__file__).resolve().parents[1]

GRID = {  # FL and f5: XLA rounds them differently at other batch widths (test_sweep.py)
    "strategy": ["bdrd", "fl"],
    "function": "f5",
    "iterations": 30,
    "num_agents": 10,
    "w": [0.2, 0.5, 0.7],
    "seed": list(range(5)),
}

DRIVER = textwrap.dedent(
    """
    import sys
    import jax

    rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    jax.config.update("jax_platforms", "cpu")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=rank
    )
    from swarmjax import sweep
    from swarmjax.paaso_sweep import PAASOTask, expand_phi

    grid = expand_phi(GRID)
    rows = sweep.run_sweep(PAASOTask(), grid, out, progress=False)
    print("rows", rank, len(rows), flush=True)
    jax.distributed.shutdown()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_sweep_equals_one_process(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(f"GRID = {GRID!r}\n{DRIVER}")
    port = str(_free_port())
    out = tmp_path / "shared"
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), port, str(out)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},  # this checkout's swarmjax
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        logs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, (p, log) in enumerate(zip(procs, logs, strict=True)):
        assert p.returncode == 0, log[-2000:]
        assert f"rows {rank} 30" in log  # each process returns the union
    parts = list((out / "parts").glob("*.csv"))
    written = [set(sweep.load_results(out).query("chunk == @c.stem").run_id) for c in parts]
    # one slice of each group (bdrd, fl) per process
    assert len(parts) == 4 and sorted(map(len, written)) == [7, 7, 8, 8]

    # the shared folder's secret (process 0 drew and saved it; process 1 read it): the
    # one-process sweep seeded with it draws the same numbers
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / sweep.SWEEP_SECRET).write_bytes((out / sweep.SWEEP_SECRET).read_bytes())
    sweep.run_sweep(PAASOTask(), expand_phi(GRID), tmp_path / "one", progress=False)
    rows, traj = sweep.load_trajectories(out)
    rows_1, traj_1 = sweep.load_trajectories(tmp_path / "one")
    assert sorted(rows.run_id) == sorted(rows_1.run_id)
    order = rows_1.reset_index().set_index("run_id").loc[rows.run_id, "index"].to_numpy()
    np.testing.assert_array_equal(rows.final_objective, rows_1.final_objective.to_numpy()[order])
    np.testing.assert_array_equal(traj, traj_1[order])
