"""Start real ps-server / ps-worker processes on loopback for end-to-end tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ps.ops.metrics import read_metrics

ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore"}


def exit_status(proc: subprocess.Popen, timeout: float) -> int | None:
    """`proc`'s exit status, or None if it still runs after `timeout` s: then it has printed its threads'
    stacks to its log (SIGUSR1, common/ops/stack_dump.py)."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        return None


@dataclass
class Cluster:
    """A server process and its workers; stop() kills whatever is still running."""

    server: subprocess.Popen
    port: int
    metrics_path: Path
    workdir: Path
    workers: list[subprocess.Popen] = field(default_factory=list)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start_worker(self, name: str, *args: str, prefix: Sequence[str] = (), target: str | None = None) -> subprocess.Popen:
        """A ps-worker for this server (`prefix`: e.g. `ip netns exec NS`; `target`: another address)."""
        log = open(self.workdir / f"{name}.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "worker.cli", "--server", target or self.target, "--name", name, "--quiet", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=ENV,
        )
        self.workers.append(proc)
        return proc

    def wait(self, timeout: float) -> int:
        """Wait for the server to exit; returns its exit code (kills everything on timeout)."""
        try:
            code = self.server.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            running = self.dump_stacks()
            self.stop()
            logs = "".join(f"\n--- {name} (still running):\n{self._log_tail(name)}" for name in running)
            raise AssertionError(f"server did not finish within {timeout}s; log:\n{self.server_log()}{logs}") from None
        for proc in self.workers:
            if exit_status(proc, 15) is None:
                proc.kill()
                proc.wait()
        return code

    def events(self, kind: str | None = None) -> list[dict]:
        events = read_metrics(self.metrics_path) if self.metrics_path.exists() else []
        return [e for e in events if kind is None or e["event"] == kind]

    def server_log(self) -> str:
        return (self.workdir / "server.log").read_text()

    def worker_log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text()

    def dump_stacks(self) -> list[str]:
        """SIGUSR1 to the server and every worker still running, so that each prints its threads' stacks
        to its log (common/ops/stack_dump.py); the names of the workers that were running."""
        running = [proc for proc in [self.server, *self.workers] if proc.poll() is None]
        for proc in running:
            proc.send_signal(signal.SIGUSR1)
        if running:
            time.sleep(1.0)
        return [self._name(proc) for proc in running if proc is not self.server]

    @staticmethod
    def _name(worker: subprocess.Popen) -> str:
        """The --name a worker was started with (start_worker gives one), else its pid."""
        args = [str(a) for a in worker.args] if isinstance(worker.args, list) else []
        return args[args.index("--name") + 1] if "--name" in args[:-1] else str(worker.pid)

    def _log_tail(self, name: str, lines: int = 60) -> str:
        path = self.workdir / f"{name}.log"
        return "\n".join(path.read_text().splitlines()[-lines:]) if path.exists() else "(no log)"

    def stop(self) -> None:
        for proc in [*self.workers, self.server]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def start_server(workdir: Path, args: Sequence[str], timeout: float = 60.0, port: int = 0,
                 prefix: Sequence[str] = ()) -> Cluster:
    """Start ps-server (on a free port unless one is given; `prefix`: e.g. `prlimit --nofile=N`) and wait
    until it listens."""
    port_file = workdir / "port"
    metrics = workdir / "metrics.jsonl"
    log = open(workdir / "server.log", "w")  # noqa: SIM115
    server = subprocess.Popen(
        [*prefix, sys.executable, "-m", "ps.server", "--port", str(port), "--port-file", str(port_file), "--metrics-log", str(metrics), *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=ENV,
    )
    deadline = time.monotonic() + timeout
    while not (port_file.exists() and port_file.read_text().strip()):
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise AssertionError(f"server did not start:\n{(workdir / 'server.log').read_text()}")
        time.sleep(0.1)
    return Cluster(server, int(port_file.read_text()), metrics, workdir)
