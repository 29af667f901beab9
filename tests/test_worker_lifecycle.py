"""A worker's membership from its side, with real processes: it leaves when it stops early or cannot
build the job, and its reconnecting stops when --retry-for runs out."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.nn.functional as F

from tests import processes
from tests.processes import ENV, start_server
from worker import connect

JOB = ["--mode", "bsp", "--workers", "1", "--model-arg", "hidden=16", "--dataset", "digits", "--global-batch", "32",
       "--epochs", "1000", "--evict-after", "60", "--grace", "0"]


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def test_a_loop_that_stops_early_leaves_instead_of_waiting_to_be_evicted(tmp_path: Path) -> None:
    cluster = start_server(tmp_path, JOB)
    try:
        with connect(cluster.target, name="early", timeout=60) as session:
            for x, y in session.batches():
                loss = F.cross_entropy(session.model(x), y)
                session.model.zero_grad()
                loss.backward()
                session.step()
                if session.steps == 2:
                    break
        assert not session.done
        wait_for(lambda: cluster.events("leave"), 10, "the leave event")
        assert [e["worker"] for e in cluster.events("leave")] == ["early"]
        assert cluster.events("evict") == []
    finally:
        cluster.stop()


def test_a_worker_that_cannot_build_the_job_says_so_in_one_line_and_leaves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    modules = tmp_path / "server_only"
    modules.mkdir()
    (modules / "server_only_model.py").write_text(
        "from torch import nn\n\n"
        "def make(input_shape, num_classes, hidden=16):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))\n"
    )
    with monkeypatch.context() as patch:  # the server can import the model's module, the worker cannot
        patch.setitem(processes.ENV, "PYTHONPATH", str(modules))
        cluster = start_server(tmp_path, [*JOB, "--model", "server_only_model:make"])
    try:
        worker = subprocess.run(
            [sys.executable, "-m", "worker.cli", "--server", cluster.target, "--name", "lost", "--quiet"],
            capture_output=True, text=True, env=ENV, timeout=120, check=False,
        )
        assert worker.returncode == 2, worker.stderr
        lines = [line for line in worker.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("ps-worker: error: this worker cannot build the job's data "
                                                      "and model: cannot import model module"), worker.stderr
        wait_for(lambda: cluster.events("leave"), 10, "the leave event")
        assert [e["worker"] for e in cluster.events("leave")] == ["lost"]
        assert cluster.events("evict") == []
    finally:
        cluster.stop()


def test_reconnecting_stops_when_retry_for_runs_out(tmp_path: Path) -> None:
    """--retry-for bounds the whole recovery: before, each attempt could wait --retry-for on its own
    (19 s for --retry-for 3, about 100 minutes for the default 120 s)."""
    cluster = start_server(tmp_path, JOB)
    try:
        worker = cluster.start_worker("w0", "--retry-for", "3")
        wait_for(lambda: len(cluster.events("adjust")) > 0, 60, "the job to start")
        time.sleep(1.0)  # a few steps
        cluster.server.kill()
        cluster.server.wait()
        killed = time.monotonic()
        code = worker.wait(timeout=60)
        gave_up_s = time.monotonic() - killed
        assert code == 1, cluster.worker_log("w0")
        assert "gave up after 3s of retries" in cluster.worker_log("w0")
        assert gave_up_s < 3 + 5, f"gave up {gave_up_s:.1f} s after the server died"
    finally:
        cluster.stop()
