"""The benchmark's child processes: started under a guard that kills them with this process, stopped
on every exit path, and the servers among them waited for until they listen."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any


REPO = Path(__file__).resolve().parents[2]


START_TIMEOUT_S = 120.0


class Processes:
    """Every child process of the run; `stop_all` (also at exit and on SIGTERM) kills what is left."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._procs: list[tuple[str, subprocess.Popen]] = []
        self._counter = 0
        # set by the SIGTERM handler: its SystemExit is swallowed when the signal lands in an at-fork
        # hook (e.g. logging's, run inside Popen), so the places that start or wait on children check it
        self.terminated: int | None = None

    def check_terminated(self) -> None:
        if self.terminated is not None:
            raise SystemExit(128 + self.terminated)

    def start(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        self._counter += 1
        log_path = self.workdir / f"{self._counter:03d}-{name}.log"
        with open(log_path, "w", encoding="utf-8") as out:
            # benchmarks.guard execs argv with a kernel SIGKILL armed for when this process dies
            proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.guard", str(os.getpid()), *argv], cwd=REPO, stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore",
                     "GLOO_SOCKET_IFNAME": "lo", "TP_SOCKET_IFNAME": "lo", **(env or {})},
                start_new_session=True,
            )
        proc.log_path = log_path  # type: ignore[attr-defined]
        self._procs.append((name, proc))
        self.check_terminated()
        return proc

    @staticmethod
    def log_tail(proc: subprocess.Popen, chars: int = 2000) -> str:
        try:
            return Path(proc.log_path).read_text(encoding="utf-8", errors="replace")[-chars:]  # type: ignore[attr-defined]
        except OSError:
            return ""

    def find(self, name: str) -> subprocess.Popen:
        """The newest running child started under `name`."""
        for n, proc in reversed(self._procs):
            if n == name:
                return proc
        raise KeyError(name)

    def stop(self, proc: subprocess.Popen, grace: float = 5.0) -> None:
        """SIGTERM its process group, SIGKILL after `grace` seconds (at once with grace 0).

        Signals go only to a child not yet reaped, so its pid (and group) cannot have been reused.
        """
        if proc.poll() is None:
            if grace > 0:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=grace)
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._procs = [(n, p) for n, p in self._procs if p is not proc]

    def stop_all(self) -> None:
        for _, proc in reversed(list(self._procs)):
            self.stop(proc, grace=2.0)

    def wait_all(self, procs: Sequence[subprocess.Popen], timeout: float, what: str,
                 watch: Sequence[subprocess.Popen] = ()) -> None:
        """Wait for children to exit 0; raise with a log tail on a failure, a timeout, or a `watch`ed
        process (a server) exiting first. The caller stops them."""
        deadline = time.monotonic() + timeout
        pending = list(procs)
        while pending:
            self.check_terminated()
            for proc in watch:
                if proc.poll() is not None:
                    raise RuntimeError(f"{what}: the server exited {proc.returncode}:\n{self.log_tail(proc)}")
            for proc in list(pending):
                code = proc.poll()
                if code is None:
                    continue
                pending.remove(proc)
                if code != 0:
                    raise RuntimeError(f"{what}: a process exited {code}:\n{self.log_tail(proc)}")
            if pending and time.monotonic() > deadline:
                raise RuntimeError(f"{what}: no result within {timeout:.0f}s:\n{self.log_tail(pending[0])}")
            if pending:
                time.sleep(0.05)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port_file(proc: subprocess.Popen, path: Path, what: str, timeout: float = START_TIMEOUT_S) -> int:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited {proc.returncode} before listening:\n{Processes.log_tail(proc)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not listen within {timeout:.0f}s:\n{Processes.log_tail(proc)}")
        time.sleep(0.05)
    return int(path.read_text())


@contextlib.contextmanager
def server_processes(procs: Processes, servers: Sequence[tuple[str, Sequence[str]]]) -> Iterator[list[str]]:
    """Start servers (name, argv) that write their port to --port-file, all at once; yields their
    HOST:PORT targets once all listen, and stops them afterwards."""
    started: list[tuple[str, subprocess.Popen, Path]] = []
    try:
        for name, argv in servers:
            port_file = procs.workdir / f"{name}-{time.monotonic_ns()}.port"
            started.append((name, procs.start(name, [*argv, "--port", "0", "--port-file", str(port_file)]), port_file))
        yield [f"127.0.0.1:{wait_port_file(proc, path, name)}" for name, proc, path in started]
        for name, proc, _ in started:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited {proc.returncode} during the measurement:\n{procs.log_tail(proc)}")
    finally:
        for _, proc, _ in started:
            procs.stop(proc, grace=0.0)  # measured already: no need to wait for a graceful exit


@contextlib.contextmanager
def server_process(procs: Processes, name: str, argv: Sequence[str]) -> Iterator[str]:
    """One server: yields HOST:PORT once it listens and stops it afterwards."""
    with server_processes(procs, [(name, argv)]) as targets:
        yield targets[0]


def echo_argv() -> list[str]:
    """The echo server (its default gRPC options are ps-server's, ps.serving.server_options.GRPC_OPTIONS)."""
    return [sys.executable, "-m", "benchmarks.echo"]


def child_argv(role: str, result: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.transport.child", role, "--result", str(result), *args]


def read_result(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))
