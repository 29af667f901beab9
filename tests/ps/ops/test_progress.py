"""Progress for a person: a bar (epoch, rounds, samples/s, accuracy, time left) when the output is a
terminal, plain lines when it is a pipe, for ps-server and for ps-cluster run. Real processes, their
output a pseudo terminal or a pipe; and the plain line of an event, alone: a leave or eviction that
leaves a running job without workers says the job waits for one."""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

import pytest

from common.transport.messages import JoinAsk
from ps.ops.progress import NO_WORKER_LEFT, print_progress, progress_line
from tests.coordinator_rounds import joined_job
from tests.processes import ENV, Cluster
from tests.emulator_jobs import TINY_JOB, write_profile

SERVER_JOB = ["--mode", "bsp", "--workers", "2", "--model-arg", "hidden=32", "--global-batch", "64", "--epochs", "3",
              "--grace", "5"]


def terminal() -> tuple[int, int]:
    """A pseudo terminal (master, slave) of 30 rows by 120 columns, as a person's would be."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    return master, slave


def read_all(fd: int) -> str:
    """Everything from a pty's master side until the other side is closed."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: every process holding the terminal has exited
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.parametrize("terminal_output", [True, False], ids=["pty", "pipe"])
def test_the_server_shows_a_bar_on_a_terminal_and_lines_in_a_pipe(tmp_path: Path, terminal_output: bool) -> None:
    master, slave = terminal() if terminal_output else (None, None)
    log = tmp_path / "server.log"
    port_file, metrics = tmp_path / "port", tmp_path / "metrics.jsonl"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "ps.server", "--port", "0", "--port-file", str(port_file), "--metrics-log", str(metrics),
             *SERVER_JOB],
            stdout=out, stderr=slave if terminal_output else subprocess.PIPE, env=ENV,
        )
    if slave is not None:
        os.close(slave)
    workers: list[subprocess.Popen] = []
    try:
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        cluster = Cluster(server, int(port_file.read_text()), metrics, tmp_path)
        workers = [cluster.start_worker(name) for name in ("a", "b")]
        if master is not None:
            shown = read_all(master)
        else:
            assert server.stderr is not None
            shown = server.stderr.read().decode()
        assert server.wait(120) == 0, shown
    finally:
        if server.poll() is None:
            server.kill()
        for proc in workers:
            proc.kill()
            proc.wait()
        if master is not None:
            os.close(master)
    if terminal_output:
        assert "epoch 3/3 |" in shown and "rounds=" in shown and "samples/s=" in shown and "acc=0." in shown, shown
        assert "\r" in shown and "epoch 1:" not in shown  # one bar redrawn in place, no epoch lines
        assert "summary: " in shown
    else:
        assert "\r" not in shown and "epoch 3/3 |" not in shown and "rounds=" not in shown, repr(shown)
        assert [line.split(":")[0] for line in shown.splitlines() if line.startswith("epoch") and "samples/s" in line] == [
            "epoch 1", "epoch 2", "epoch 3"], shown
        assert "summary: " in shown


@pytest.mark.slow
@pytest.mark.parametrize("terminal_output", [True, False], ids=["pty", "pipe"])
def test_ps_cluster_run_shows_a_bar_on_a_terminal_and_lines_in_a_pipe(tmp_path: Path, terminal_output: bool) -> None:
    profile = write_profile(tmp_path / "two.yaml", [1, 2])
    argv = [sys.executable, "-m", "deploy.cli", "run", "--out", str(tmp_path / "out"), "--profile", str(profile),
            "--limiter", "slowdown", *TINY_JOB, "--epochs", "3"]
    if terminal_output:
        master, slave = terminal()
        proc = subprocess.Popen(argv, stdout=slave, stderr=subprocess.PIPE, env=ENV)
        os.close(slave)
        try:
            shown = read_all(master)
        finally:
            os.close(master)
    else:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
        assert proc.stdout is not None
        shown = proc.stdout.read().decode()
    try:
        assert proc.wait(120) == 0, shown
    finally:
        if proc.poll() is None:
            proc.kill()
        assert proc.stderr is not None
        proc.stderr.close()
    if terminal_output:
        assert "epoch 3/3 |" in shown and "rounds=" in shown and "samples/s=" in shown and "\r" in shown, shown
        assert "epoch  1/3 |" not in shown  # the per-epoch table lines give way to the bar
    else:
        assert "\r" not in shown
        assert [line[:10] for line in shown.splitlines() if line.startswith("epoch ")] == ["epoch  1/3", "epoch  2/3", "epoch  3/3"], shown


@pytest.mark.parametrize("measured", ["compute", "busy", "cycle"])
def test_the_epoch_line_names_what_the_times_measure(measured: str, capsys: pytest.CaptureFixture[str]) -> None:
    record = {"event": "epoch", "epoch": 3, "samples_per_s": 900.0, "batch_sizes": {"w0": 40}, "compute_ms": {"w0": 250.0},
              "balance": measured}
    print_progress(record)
    assert capsys.readouterr().err.strip() == f"epoch 3: 900.0 samples/s | batch w0=40 | {measured} ms w0=250.0"


def test_the_epoch_line_follows_the_balance_the_job_chose(capsys: pytest.CaptureFixture[str]) -> None:
    """--allreduce auto may switch the balance at the start: the epoch line takes the epoch record's."""
    record = {"event": "epoch", "epoch": 1, "samples_per_s": 10.0, "batch_sizes": {"w0": 4}, "compute_ms": {"w0": 2.0},
              "balance": "compute"}
    print_progress(record)
    print_progress({"event": "path", "allreduce": True, "why": "every worker computes on a GPU of its own",
                    "balance": "compute"})
    assert capsys.readouterr().err.splitlines() == [
        "epoch 1: 10.0 samples/s | batch w0=4 | compute ms w0=2.0",
        "--allreduce auto: the collective fast path (every worker computes on a GPU of its own; the controller "
        "balances compute time)",
    ]


def test_a_departure_that_leaves_no_worker_says_the_job_waits_for_one() -> None:
    """Every leave and evict record counts the workers left, active or waiting to enter (c, whom b's
    eviction lets in); once none is left in a job not done, its line says the job waits for a join:
    the server otherwise waits without a word. Driven on the coordinator (tests.coordinator_rounds)."""
    async def run() -> list[dict[str, Any]]:
        async with joined_job("--global-batch", "24", "--max-workers", "3", events=("leave", "evict")) as job:
            c, (a, b) = job.c, job.joined.values()
            await c.leave(a.worker_id, a.secret)
            joining = asyncio.ensure_future(c.join(JoinAsk("c", 1.0)))
            for _ in range(5):
                await asyncio.sleep(0)
            assert not joining.done()  # waits for the open round's boundary, which b holds
            c.members[b.worker_id].last_seen = c.clock() - c.evict_after - 1
            assert c.evict_stale() == ["b"]
            newcomer = await asyncio.wait_for(joining, 5)
            await c.leave(newcomer.worker_id, newcomer.secret)
            return job.records

    records = asyncio.run(asyncio.wait_for(run(), 60))
    assert [(r["event"], r["worker"], r["workers_left"], r["done"]) for r in records] == [
        ("leave", "a", 1, False), ("evict", "b", 1, False), ("leave", "c", 0, False)]
    assert [progress_line(r) for r in records] == [
        "a: left", "b: evicted after 3600s without a heartbeat", f"c: left ({NO_WORKER_LEFT})"]
    assert progress_line({**records[-1], "done": True}) == "c: left"  # a finished job waits for nobody


def test_a_change_of_the_adaptive_global_batch_is_a_line_and_a_decision_that_keeps_it_is_none() -> None:
    """--adaptive-batch gns: a person watching the server or ps-cluster run sees B move (before, only
    as a plan whose batches summed to another B)."""
    moved = {"event": "adapt", "step": 23, "current": 64, "batch": 89, "global_batch": 89, "changed": True,
             "reason": "goodput", "phi": 128.068}
    assert progress_line(moved) == "global batch 64 -> 89 (goodput; noise scale 128.1)"
    assert progress_line({**moved, "phi": None, "reason": "outside the bounds"}) == (
        "global batch 64 -> 89 (outside the bounds; noise scale unknown)")
    assert progress_line({**moved, "batch": 64, "global_batch": 64, "changed": False}) is None


def test_a_worker_turned_away_at_the_join_wait_is_a_line() -> None:
    """A server still waiting for its workers says that it turned one away (--join-wait), which the
    worker was told: its operator sees more than the listening line."""
    record = {"event": "join_wait", "worker": "w1", "waited_s": 5.0}
    assert progress_line(record) == "w1: turned away after waiting 5 s for the job to start (--join-wait)"


def test_a_job_that_ends_before_its_epochs_says_why() -> None:
    """A job stopped by its workers (the survivors cannot hold B) ends before its epochs: the server's
    lines say why, where before they went from the leave to the summary without a reason. A job that
    finished, or one stopped by a signal, adds no line."""
    record = {"event": "end", "step": 694, "epoch": 30,
              "reason": "the workers left cannot split --global-batch (infeasible split of 64: bounds sum to [2, 60])"}
    assert progress_line(record) == ("job ended at epoch 30, step 694: the workers left cannot split --global-batch "
                                     "(infeasible split of 64: bounds sum to [2, 60])")
    assert progress_line({**record, "reason": "finished"}) is None
    assert progress_line({**record, "reason": "stopping"}) is None


def test_the_summary_line_of_a_job_that_stopped_early_does_not_repeat_why() -> None:
    """An early end's reason is the `end` record's line (test above); the summary line after it repeated
    it in a `reason` field, so stderr said it twice. The summary line leaves it out (the record and
    summary.json keep it); a stop by a signal, which has no `end` line, still says `stopping` there."""
    record = {"event": "summary", "mode": "bsp", "controller": "dynamic", "epochs": 1, "wall_s": 2.0,
              "samples_per_s": 4494.06, "accuracy": 0.36, "reason": "finished"}
    shown = 'summary: {"mode": "bsp", "controller": "dynamic", "epochs": 1, "wall_s": 2.0, "samples_per_s": 4494.06, "accuracy": 0.36'
    assert progress_line(record) == shown + "}"
    why = "the workers left cannot split --global-batch (the workers' max_batch sum to 40 < global_batch 64)"
    assert progress_line({**record, "reason": why}) == shown + "}"
    assert progress_line({**record, "reason": "stopping"}) == shown + ', "reason": "stopping"}'


def test_an_early_end_says_why_once_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    """The end record and the summary record of a job that ended early, as ps-server prints them."""
    why = "the workers left cannot split --global-batch (the workers' max_batch sum to 64 < global_batch 128)"
    print_progress({"event": "end", "reason": why, "step": 694, "epoch": 30})
    print_progress({"event": "summary", "mode": "bsp", "controller": "uniform", "epochs": 30, "wall_s": 9.0,
                    "samples_per_s": 100.0, "accuracy": 0.5, "reason": why})
    assert capsys.readouterr().err.count(why) == 1
