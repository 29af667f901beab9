"""What a user sees when something is wrong: a worker or connect() that cannot reach its server says
so within seconds and then every ten, naming the setting that bounds the wait; a normal run prints
no Python warning."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.nn.functional as F

from tests.processes import ENV, start_server
from worker import connect
from worker.transport.client import ServerError
from worker.transport.reconnect import FIRST_NOTE_S, NOTE_EVERY_S, Waiting


def dead_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_waiting_says_so_after_a_few_seconds_then_every_ten(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    waiting = Waiting("w0", "10.0.0.1:50051", deadline=clock.now + 60, flag="--timeout", clock=clock)
    with caplog.at_level(logging.WARNING, logger="worker"):
        waiting.note_if_due()
        clock.now += FIRST_NOTE_S
        waiting.note_if_due()
        clock.now += NOTE_EVERY_S - 1
        waiting.note_if_due()
        clock.now += 1
        waiting.note_if_due()
        waiting.recovered("server 10.0.0.1:50051 answered")
    assert caplog.messages == [
        "w0: server 10.0.0.1:50051 unreachable, retrying for 58 s (--timeout)",
        "w0: server 10.0.0.1:50051 still unreachable after 12 s, retrying for 48 s more",
        "w0: server 10.0.0.1:50051 answered after 12 s",
    ]
    assert str(waiting.given_up()) == "UNAVAILABLE: server 10.0.0.1:50051 unreachable for 60 s (--timeout); giving up"


def test_connect_to_a_dead_port_says_so_within_seconds_and_gives_up_naming_the_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = dead_port()
    lines: list[tuple[float, str]] = []

    class Stamp(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append((time.monotonic(), record.getMessage()))

    handler = Stamp()
    logging.getLogger("worker").addHandler(handler)
    started = time.monotonic()
    try:
        with pytest.raises(ServerError, match=rf"server 127.0.0.1:{port} unreachable for 4 s \(--timeout\); giving up"):
            connect(f"127.0.0.1:{port}", name="mine", timeout=4)
    finally:
        logging.getLogger("worker").removeHandler(handler)
    assert len(lines) == 1, lines
    at, message = lines[0]
    assert message.startswith(f"mine: server 127.0.0.1:{port} unreachable, retrying for ") and message.endswith(" s (--timeout)")
    assert at - started < 5.0


def test_connect_sets_the_torch_threads_as_ps_worker_does(tmp_path: Path) -> None:
    import torch

    job = ["--workers", "1", "--model-arg", "hidden=16", "--global-batch", "32", "--epochs", "1"]
    cluster = start_server(tmp_path, job)
    before = torch.get_num_threads()
    try:
        with connect(cluster.target, name="mine", threads=1) as session:
            assert torch.get_num_threads() == 1
            for x, y in session.batches():
                session.model.zero_grad()
                F.cross_entropy(session.model(x), y).backward()
                session.step()
        assert cluster.wait(60) == 0
        with pytest.raises(ValueError, match="threads must be a whole number >= 1"):
            connect(cluster.target, threads=0)
    finally:
        torch.set_num_threads(before)
        cluster.stop()


def test_a_quick_start_run_prints_no_python_warning(tmp_path: Path) -> None:
    """The README's quick start, shortened, with Python's default warning filters."""
    env = {k: v for k, v in ENV.items() if k != "PYTHONWARNINGS"}
    job = ["--mode", "bsp", "--workers", "2", "--model", "mlp", "--model-arg", "hidden=64", "--dataset", "teacher",
           "--dataset-arg", "size=4096", "--global-batch", "64", "--epochs", "2", "--policy", "model", "--adjust-every", "5"]
    port_file = tmp_path / "port"
    with open(tmp_path / "server.log", "w") as log:
        server = subprocess.Popen([sys.executable, "-m", "ps.server", "--port", "0", "--port-file", str(port_file), *job],
                                  stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.1)
        target = f"127.0.0.1:{port_file.read_text().strip()}"
        worker = [sys.executable, "-m", "worker.cli", "--server", target, "--log-every", "0.2"]
        other = subprocess.Popen([*worker, "--name", "w1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        first = subprocess.run([*worker, "--name", "w0"], capture_output=True, text=True, env=env, timeout=120)
        second, _ = other.communicate(timeout=60)
        assert server.wait(timeout=60) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    outputs = {"server": (tmp_path / "server.log").read_text(), "w0": first.stdout + first.stderr, "w1": second}
    assert "loss" in outputs["w0"] and "test accuracy" in outputs["server"], outputs
    for name, text in outputs.items():
        assert "Warning" not in text and "warnings.warn" not in text, f"{name}:\n{text}"
