"""How a local cluster's processes end, and the errors that say so: the server's start (it must listen
within ``START_TIMEOUT_S``), a worker that exits while the job runs, and the stop of whatever still
runs (SIGTERM, then SIGKILL after ``STOP_GRACE_S``)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from deploy.run_files import last_line
from deploy.signals import describe_status

START_TIMEOUT_S = 60.0
"""How long the server may take to listen (it builds the model and dataset first)."""
STOP_GRACE_S = 2.0
"""How long processes get to exit after SIGTERM (close) or after the server (wait) before they are killed."""


class WorkerFailedError(RuntimeError):
    """A worker process exited with a non-zero status while the server was still running."""

    def __init__(self, failures: Sequence[tuple[str, int]], logs: dict[str, str]) -> None:
        self.failures = list(failures)
        described = ", ".join(f"{name} ({describe_status(code)})" for name, code in failures)
        tail = "; ".join(f"{name}: {text}" for name, text in logs.items() if text)
        super().__init__(
            f"worker {described} exited while the job was running, so the run was stopped (the cluster no "
            f"longer matches its profile)" + (f"; last log line: {tail}" if tail else "")
        )


class ServerStartError(RuntimeError):
    """The server exited before it listened (``returncode`` 2: it rejected its arguments)."""

    def __init__(self, message: str, returncode: int | None) -> None:
        super().__init__(message)
        self.returncode = returncode


def wait_for_port(server: subprocess.Popen[bytes], port_file: Path, log: Path) -> int:
    """The port the server writes to ``port_file``; ServerStartError if it exits or times out first."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        with contextlib.suppress(OSError, ValueError):
            text = port_file.read_text().strip()
            if text:
                return int(text)
        code = server.poll()
        if code is not None:
            raise ServerStartError(
                f"the server exited ({describe_status(code)}) before listening: {last_line(log) or 'no output'}", code,
            )
        if time.monotonic() > deadline:
            raise ServerStartError(f"the server did not listen within {START_TIMEOUT_S:g} s (see {log})", None)
        time.sleep(0.05)


def wait_all(processes: Sequence[subprocess.Popen[bytes]], grace_s: float = STOP_GRACE_S) -> None:
    """Give ``processes`` together ``grace_s`` seconds to exit on their own (those still running go on)."""
    end = time.monotonic() + grace_s
    for proc in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, end - time.monotonic()))


def stop_all(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every process that still runs, SIGKILL those still running ``STOP_GRACE_S`` later, and reap them."""
    running = [p for p in processes if p.poll() is None]
    for proc in running:
        with contextlib.suppress(OSError):
            proc.terminate()
    end = time.monotonic() + STOP_GRACE_S
    for proc in running:
        try:
            proc.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                proc.kill()
    for proc in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
