"""A real Flower deployment on one machine: a SuperLink and N SuperNodes as separate
processes on ``127.0.0.1``, a run submitted with ``flwr run``, everything stopped after.

:class:`LocalDeployment` is what the tests, the benchmark and ``--runtime flower`` use; the
README shows the same commands typed by hand (docs/flower.md: what changes across
machines). Every process is started in its own session; leaving the ``with`` block (also
on an error or a failed test) terminates each process tree, then kills what is left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

import swarmjax
from swarmjax.fl.runtime.flower.relay import PID_FILE, start_worker

__all__ = ["APP_DIR", "LocalDeployment", "flower_bin", "free_port", "run_simulation"]

REPO = Path(swarmjax.__file__).resolve().parents[1]
APP_DIR = REPO / "flower_app"
HOST = "127.0.0.1"
# what this module starts, and what the SuperLink / SuperNodes start by name from PATH
EXECUTABLES = (
    "flower-superlink",
    "flower-supernode",
    "flwr",
    "flower-superexec",
    "flwr-serverapp",
    "flwr-clientapp",
)


def flower_bin() -> Path:
    """The folder of Flower's console scripts: the running Python's own (a virtual
    environment's ``bin``, activated or not), else wherever PATH finds ``flwr``. Raises
    ``FileNotFoundError`` naming what is missing."""
    here = Path(sys.executable).parent
    if (here / "flwr").exists():
        folder = here
    elif found := shutil.which("flwr"):
        folder = Path(found).parent
    else:
        raise FileNotFoundError(
            f"Flower's executables are not installed: no 'flwr' in {here} nor on PATH "
            "(pip install 'swarmjax[flower]' into the environment that runs this)"
        )
    missing = [name for name in EXECUTABLES if not (folder / name).exists()]
    if missing:
        raise FileNotFoundError(
            f"Flower executables missing from {folder}: {', '.join(missing)} "
            "(a partial or too old flwr install? pip install -U 'swarmjax[flower]')"
        )
    return folder


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def config_arg(config: dict[str, Any]) -> str:
    """``{"a": 1, "b": "x"}`` -> ``'a=1 b="x"'`` (``--run-config`` / ``--node-config``)."""
    return " ".join(f"{k}={_toml_value(v)}" for k, v in config.items())


@dataclass
class LocalDeployment:
    """SuperLink + SuperNodes on 127.0.0.1 (a context manager).

    Attributes:
        partitions: the partition id of each SuperNode started on entry.
        node_config: extra node configuration given to every SuperNode.
        workdir: where homes and logs go (default: a fresh temporary folder, removed on
            exit unless ``keep`` is set).
        startup_timeout: seconds to wait for the SuperLink to listen.
        task_poll_interval: seconds between two looks of each SuperExec for a new task
            (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``; Flower's default is 1).

    Each SuperNode's ClientApp hands its messages to a worker process
    (:mod:`swarmjax.fl.runtime.flower.worker`) in ``<workdir>/node<i>/worker``; those
    workers are stopped with their nodes.
    """

    partitions: tuple[int, ...] = (0, 1, 2)
    node_config: dict[str, Any] = field(default_factory=dict)
    workdir: Path | None = None
    startup_timeout: float = 60.0
    task_poll_interval: float | None = 0.1
    keep: bool = False
    port: int = 0
    nodes: dict[int, psutil.Popen] = field(default_factory=dict)
    _procs: list[psutil.Popen] = field(default_factory=list)
    _tmp: bool = False
    _bin: Path = field(default_factory=Path)

    def __enter__(self) -> LocalDeployment:
        self._bin = flower_bin()
        if self.workdir is None:
            self.workdir, self._tmp = Path(tempfile.mkdtemp(prefix="swarmjax-flower-")), True
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_superlink()
            for pid in self.partitions:
                self.start_node(pid)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._tmp and not self.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # ------------------------------------------------------------------------ processes

    def _env(self, home: str) -> dict[str, str]:
        env = dict(os.environ)
        env["FLWR_HOME"] = str(self.workdir / home)
        # the SuperLink and SuperNodes start flower-superexec, flwr-serverapp and
        # flwr-clientapp by name: this Python's, also when its environment is not activated
        env["PATH"] = os.pathsep.join([str(self._bin), env.get("PATH", "")]).rstrip(os.pathsep)
        if self.task_poll_interval is not None:
            env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = str(self.task_poll_interval)
        # the processes import this checkout's swarmjax, whatever the environment has
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
        return env

    def _spawn(self, args: list[str], home: str, log: str) -> psutil.Popen:
        out = open(self.workdir / log, "wb")  # closed below: the child keeps its own handle
        proc = psutil.Popen(
            args,
            env=self._env(home),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.workdir,
        )
        out.close()
        self._procs.append(proc)
        return proc

    def _start_superlink(self) -> None:
        self.port = free_port()
        self._spawn(
            [
                str(self._bin / "flower-superlink"),
                "--insecure",
                "--host",
                HOST,
                "--port",
                str(self.port),
                "--health-server-address",
                f"{HOST}:{free_port()}",
                "--disable-runtime-dependency-installation",
            ],
            "superlink",
            "superlink.log",
        )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex((HOST, self.port)) == 0:
                    break
            time.sleep(0.1)
        else:
            raise RuntimeError(
                f"SuperLink did not listen on {HOST}:{self.port} within "
                f"{self.startup_timeout} s; see {self.workdir / 'superlink.log'}"
            )
        cli = self.workdir / "cli"
        cli.mkdir(exist_ok=True)
        (cli / "config.toml").write_text(
            f'[superlink]\ndefault = "local"\n\n[superlink.local]\n'
            f'address = "{HOST}:{self.port}"\ninsecure = true\n'
        )

    def start_node(self, partition: int) -> psutil.Popen:
        """Start a SuperNode holding ``partition`` (also after the run started: a late join)."""
        config = {
            "partition-id": partition,
            "worker-dir": str(self.worker_dir(partition)),
            **self.node_config,
        }
        proc = self._spawn(
            [
                str(self._bin / "flower-supernode"),
                "--insecure",
                "--superlink",
                f"{HOST}:{self.port}",
                "--host",
                HOST,
                "--port",
                str(free_port()),
                "--node-config",
                config_arg(config),
            ],
            f"node{partition}",
            f"node{partition}.log",
        )
        self.nodes[partition] = proc
        # its worker starts now (JAX's and swarmjax's imports overlap the node's start and
        # the run's submission) and exits with the node; if it dies, the ClientApp starts one
        start_worker(self.worker_dir(partition), proc.pid)
        return proc

    def worker_dir(self, partition: int) -> Path:
        """The folder of the worker of the SuperNode holding ``partition``."""
        return self.workdir / f"node{partition}" / "worker"

    def workers(self) -> dict[int, psutil.Process]:
        """The live worker of each SuperNode that has one (started on its first message)."""
        out = {}
        for partition in self.partitions_seen:
            pid_file = self.worker_dir(partition) / PID_FILE
            try:
                out[partition] = psutil.Process(int(pid_file.read_text()))
            except (FileNotFoundError, ValueError, psutil.NoSuchProcess):
                continue
        return out

    @property
    def partitions_seen(self) -> list[int]:
        """Every partition a SuperNode was started for (also the killed ones)."""
        return sorted(int(p.name[4:]) for p in self.workdir.glob("node*") if p.name[4:].isdigit())

    def kill_node(self, partition: int) -> None:
        """SIGKILL the SuperNode of ``partition``, its ClientApp processes and its worker
        (a crash of the machine)."""
        worker = self.workers().get(partition)
        _kill_tree(self.nodes.pop(partition), graceful=False)
        if worker is not None:
            _kill_tree(worker, graceful=False)

    def stop(self) -> None:
        """Stop every process this deployment started (children and workers included)."""
        workers = self.workers() if self.workdir is not None else {}
        for proc in reversed(self._procs):
            _kill_tree(proc, graceful=True)
        for worker in workers.values():  # they exit by themselves once their node is gone
            _kill_tree(worker, graceful=True)
        self._procs.clear()
        self.nodes.clear()

    # ---------------------------------------------------------------------------- a run

    def start_run(self, run_config: dict[str, Any], app: Path = APP_DIR) -> psutil.Popen:
        """Submit a run (``flwr run app local --stream``) and return the CLI process, which
        streams the run's logs and exits when the run ends (see :meth:`finish`). swarmjax's
        ServerApp shares the nodes' ``jax-cache-dir`` unless ``run_config`` names its own."""
        if app == APP_DIR and "jax-cache-dir" in self.node_config:
            run_config = {"jax-cache-dir": self.node_config["jax-cache-dir"], **run_config}
        cmd = [
            str(self._bin / "flwr"),
            "run",
            str(app),
            "local",
            "--stream",
            "--run-config",
            config_arg(run_config),
        ]
        proc = psutil.Popen(
            cmd,
            env=self._env("cli"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.workdir,
        )
        self._procs.append(proc)
        return proc

    def finish(self, proc: psutil.Popen, timeout: float = 300.0) -> str:
        """Wait for a run started by :meth:`start_run`; its output. Raises ``RuntimeError``
        (with the output) if it fails or takes longer than ``timeout`` seconds."""
        return _finish(proc, timeout)

    def run(self, run_config: dict[str, Any], app: Path = APP_DIR, timeout: float = 300.0) -> str:
        """Run to the end (:meth:`start_run` then :meth:`finish`); the CLI's output."""
        return self.finish(self.start_run(run_config, app), timeout)

    def logs(self) -> str:
        """The tail of every process's log (for a failure message)."""
        parts = []
        for path in sorted(self.workdir.glob("*.log")):
            parts.append(f"== {path.name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)


def _finish(proc: psutil.Popen, timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(proc, graceful=False)
        out = proc.communicate()[0]
        raise RuntimeError(
            f"flwr run took more than {timeout} s:\n{out.decode()[-4000:]}"
        ) from None
    text = out.decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"flwr run failed ({proc.returncode}):\n{text[-4000:]}")
    return text


def run_simulation(
    run_config: dict[str, Any],
    num_supernodes: int,
    app: Path = APP_DIR,
    timeout: float = 1800.0,
    pythonpath: tuple[str, ...] = (),
) -> str:
    """Run ``app`` on Flower's Simulation Runtime (``flwr run app local --federation-config
    num-supernodes=N``; needs ``flwr[simulation]``, i.e. Ray): a SuperLink in simulation
    mode that Flower's CLI starts on free ports with its own ``FLWR_HOME``, stopped after.
    Node ``i`` gets ``partition-id = i``; the ClientApps live in Ray actors, which stay up
    between messages, so the ClientApp answers in its own process (no worker). Returns
    the CLI's output; ``pythonpath``: extra entries for the processes (e.g. where Ray is)."""
    home = Path(tempfile.mkdtemp(prefix="swarmjax-flower-sim-"))
    folder = flower_bin()
    env = dict(os.environ)
    env["FLWR_HOME"] = str(home)
    env["PATH"] = os.pathsep.join([str(folder), env.get("PATH", "")]).rstrip(os.pathsep)
    paths = [str(REPO), *pythonpath, env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(paths).rstrip(os.pathsep)
    ports = {"FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": free_port()}
    ports["FLWR_LOCAL_CONTROL_API_PORT"] = free_port()
    env |= {k: str(v) for k, v in ports.items()}
    # the environment already holds swarmjax (as --disable-runtime-dependency-installation)
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    cmd = [str(folder / "flwr"), "run", str(app), "local", "--stream"]
    cmd += ["--federation-config", f"num-supernodes={num_supernodes}"]
    cmd += ["--run-config", config_arg(run_config)]
    proc = psutil.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=home)
    try:
        return _finish(proc, timeout)
    finally:
        # the CLI started the SuperLink detached: find it by its ports, stop its tree
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == "LISTEN" and conn.laddr.port in ports.values() and conn.pid:
                with contextlib.suppress(psutil.NoSuchProcess):
                    _kill_tree(psutil.Process(conn.pid), graceful=True)
        shutil.rmtree(home, ignore_errors=True)


def _kill_tree(proc: psutil.Process, graceful: bool) -> None:
    """Terminate ``proc`` and all its descendants (SIGTERM, 3 s grace, SIGKILL)."""
    try:
        tree = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = [proc]
    # descendants that started their own session (the SuperExec) are children too
    for p in tree:
        try:
            p.terminate() if graceful else p.kill()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=3 if graceful else 1)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=3)
