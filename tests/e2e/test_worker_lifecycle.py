"""A worker's membership from its side, with real processes: it leaves when it stops early or cannot
build the job, its reconnecting stops when --retry-for runs out, and a rejoin after a server restart
takes the new server's heartbeat interval (and happens also when the resync after a stale push fails)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.nn.functional as F

from common.job.endings import ENDED_EARLY
from tests import processes
from tests.processes import ENV, Cluster, exit_status, start_server
from worker import connect
from worker.transport.client import ServerError
from worker.transport.heartbeat import Heartbeat
from worker.runtime import Session
from tests.fault_jobs import wait_for

JOB = ["--mode", "bsp", "--workers", "1", "--model-arg", "hidden=16", "--dataset", "digits", "--global-batch", "32",
       "--epochs", "1000", "--evict-after", "60", "--grace", "0"]


def restart_server(cluster: Cluster, workdir: Path, args: list[str]) -> Cluster:
    """Kill `cluster`'s server and start a fresh one with `args` on its port (in `workdir`): a
    restart that knows none of the old server's worker ids."""
    cluster.server.kill()
    cluster.server.wait()
    workdir.mkdir()
    return start_server(workdir, args, port=cluster.port)


def train_one_step(session: Session) -> None:
    """One real step: a batch, its gradients, the push (and whatever recovery the push needs)."""
    x, y = session.next_batch()
    loss = F.cross_entropy(session.model(x), y)
    session.model.zero_grad()
    loss.backward()
    session.step()


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
        # measuring its memory before it joins (no --max-batch), it finds out before joining: nobody to leave
        # with --max-batch it joins, fails to build, and leaves
        for name, flags in (("probing", []), ("lost", ["--max-batch", "64"])):
            worker = subprocess.run(
                [sys.executable, "-m", "worker.cli", "--server", cluster.target, "--name", name, "--quiet",
                 "--allow-import", "server_only_model", *flags],
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


def test_a_worker_whose_loss_is_not_finite_says_so_in_one_line_and_leaves(tmp_path: Path) -> None:
    """A learning rate that diverges makes the loss NaN or Inf: the worker stops before pushing a
    gradient the server would refuse, names the step and the likely causes, and leaves."""
    cluster = start_server(tmp_path, [*JOB, "--lr", "1e12", "--momentum", "0"])
    try:
        worker = subprocess.run(
            [sys.executable, "-m", "worker.cli", "--server", cluster.target, "--name", "wild", "--quiet", "--max-batch", "64"],
            capture_output=True, text=True, env=ENV, timeout=120, check=False,
        )
        assert worker.returncode == 1, worker.stderr
        lines = [line for line in worker.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("ps-worker: error: step ") and "the loss is " in lines[0] \
            and "learning rate diverged" in lines[0] and lines[0].endswith("leaving the job"), worker.stderr
        wait_for(lambda: cluster.events("leave"), 10, "the leave event")
        assert [e["worker"] for e in cluster.events("leave")] == ["wild"]
    finally:
        cluster.stop()


def test_a_worker_exits_with_the_servers_status_when_the_job_ends_early(tmp_path: Path) -> None:
    """B = 96 with --max-batch 32: once one of three workers leaves (SIGTERM: it leaves at once, not by
    the stop signal's forced exit, and exits 0), the others cannot make up B and the server ends the
    job early. A survivor hears the reason in its reply and exits 3 as ps-server does, so a script that
    runs only workers tells it from a finished job; one under a supervisor that restarts it on any
    status but 0 asks for 0 (--early-end-status 0)."""
    cluster = start_server(tmp_path, [*JOB, "--workers", "3", "--global-batch", "96", "--max-batch", "32",
                                      "--controller", "uniform", "--grace", "5"])
    try:
        leaver = cluster.start_worker("leaver", "--max-batch", "32")
        survivor = cluster.start_worker("survivor", "--max-batch", "32")
        supervised = cluster.start_worker("supervised", "--max-batch", "32", "--early-end-status", "0")
        wait_for(lambda: len(cluster.events("adjust")) > 0, 120, "the job to start")
        leaver.terminate()
        assert exit_status(leaver, 45) == 0, cluster.worker_log("leaver")
        assert "exiting without leaving" not in cluster.worker_log("leaver"), cluster.worker_log("leaver")
        assert cluster.wait(120) == ENDED_EARLY, cluster.server_log()
        (end,) = cluster.events("end")
        assert "cannot split --global-batch" in end["reason"], end
        assert survivor.returncode == ENDED_EARLY, cluster.worker_log("survivor")
        assert supervised.returncode == 0, cluster.worker_log("supervised")
    finally:
        cluster.stop()


def test_a_worker_whose_server_disappears_says_so_at_once_and_gives_up_when_retry_for_runs_out(tmp_path: Path) -> None:
    """--retry-for bounds the whole recovery, the waits and the attempts together; the worker says at
    once that it lost the server and what it will do, and names the flag when it gives up."""
    cluster = start_server(tmp_path, JOB)
    try:
        worker = cluster.start_worker("w0", "--retry-for", "3")
        wait_for(lambda: len(cluster.events("adjust")) > 0, 60, "the job to start")
        time.sleep(1.0)  # a few steps
        cluster.server.kill()
        cluster.server.wait()
        killed = time.monotonic()
        said = wait_for(lambda: "w0: lost the server" in cluster.worker_log("w0"), 10, "the worker to say so")
        assert said < 2.0, f"said {said:.1f} s after the server died"
        code = worker.wait(timeout=60)
        gave_up_s = time.monotonic() - killed
        log = cluster.worker_log("w0")
        assert code == 1, log
        assert "rejoining, for up to 3 s (--retry-for), then giving up" in log
        assert f"ps-worker: error: UNAVAILABLE: server {cluster.target} unreachable for 3 s (--retry-for); giving up" in log
        assert "Traceback" not in log and "DEADLINE_EXCEEDED" not in log
        assert gave_up_s < 3 + 5, f"gave up {gave_up_s:.1f} s after the server died"
    finally:
        cluster.stop()


def test_a_rejoin_takes_the_restarted_servers_heartbeat_interval(tmp_path: Path) -> None:
    """The heartbeat interval is min(1 s, --evict-after/4), from Join. Before, a rejoin kept the old
    interval: 1 s from --evict-after 60, so a server restarted with --evict-after 0.6 (0.15 s beats)
    evicted the worker between two beats."""
    first = start_server(tmp_path, JOB)
    second: Cluster | None = None
    try:
        with connect(first.target, name="w0", timeout=60, retry_for=30) as session:
            train_one_step(session)
            second = restart_server(first, tmp_path / "restarted", [*JOB, "--evict-after", "0.6"])
            train_one_step(session)  # its push finds a server that does not know this worker: it rejoins
            assert session.rejoins == 1
            time.sleep(1.5)  # over two evictions' worth of silence at the old interval
            assert second.events("evict") == [], second.server_log()
            train_one_step(session)
            assert session.rejoins == 1 and session.steps == 2
            assert session._membership.heartbeat.interval == 0.15
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_a_resync_whose_pull_fails_rejoins_instead_of_raising(tmp_path: Path) -> None:
    """A push refused as stale is answered with a pull; when the server restarted in between, that
    pull fails too (the new server knows no such worker). Before, its error escaped and the worker
    died; now the worker rejoins as after any lost server."""
    first = start_server(tmp_path, JOB)
    second: Cluster | None = None
    try:
        with connect(first.target, name="w0", timeout=60, retry_for=30) as session:
            second = restart_server(first, tmp_path / "restarted", JOB)
            stale = ServerError("FAILED_PRECONDITION", "round 3 is not open; the open round is 4")  # ps/rounds/coordinator.py
            plan = session._replica.recover(stale, session.plan)
            assert session.rejoins == 1
            assert not plan.done and plan.batch_size == 32
    finally:
        first.stop()
        if second is not None:
            second.stop()


@pytest.mark.parametrize("interval", [0.0, -1.0, float("inf"), float("nan")])
def test_a_heartbeat_interval_must_be_positive_and_finite(interval: float) -> None:
    """0 would beat in a busy loop; inf or NaN would never beat, so the worker would be evicted."""
    with pytest.raises(ValueError, match="heartbeat interval"):
        Heartbeat(lambda worker_id: None, "w0", interval)
    heartbeat = Heartbeat(lambda worker_id: None, "w0", 1.0)
    try:
        with pytest.raises(ValueError, match="heartbeat interval"):
            heartbeat.retarget("w1", interval)
        assert (heartbeat.worker_id, heartbeat.interval) == ("w0", 1.0)
    finally:
        heartbeat.stop()
