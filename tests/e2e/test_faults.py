"""Fault injection with real processes: killed, frozen and stopped workers, a killed server.

Each test prints one `FAULT {...}` JSON line (stall time, rounds lost) for the issue's table;
run with `pytest -s tests/e2e/test_faults.py` to see them.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from common.job.datasets import build_dataset
from common.job.endings import ENDED_EARLY
from common.job.models import build_model
from common.transport.messages import PushMeta, PushTimes
from ps.checkpoint import checkpoint_files, read_checkpoint
from ps.rounds.checkpoint_state import params_digest
from tests.processes import ENV, Cluster, start_server
from worker.transport.client import PSClient
from tests.fault_jobs import JOB, NAMES, TARGET, WORKER, status, wait_for, wait_for_events


def start_workers(cluster: Cluster) -> dict[str, subprocess.Popen]:
    return {name: cluster.start_worker(name, *WORKER) for name in NAMES}


def report(**fields: object) -> None:
    print("FAULT " + json.dumps(fields), flush=True)


def test_killed_worker_is_evicted_and_rejoins(tmp_path: Path) -> None:
    cluster = start_server(tmp_path, [*JOB, "--epochs", "8"])
    try:
        workers = start_workers(cluster)
        wait_for(lambda: status(cluster.target)["epoch"] >= 2, 120, "epoch 2")
        before = status(cluster.target)["round"]
        killed_at = time.monotonic()
        workers["w3"].kill()
        evicted = wait_for(lambda: set(status(cluster.target)["workers"]) == {"w0", "w1", "w2"}, 30, "eviction")
        s = status(cluster.target)
        assert sum(s["workers"].values()) == 128  # B re-split over the survivors
        wait_for(lambda: status(cluster.target)["round"] > s["round"], 30, "progress without w3")
        stall = time.monotonic() - killed_at
        cluster.start_worker("w3", *WORKER)
        wait_for(lambda: set(status(cluster.target)["workers"]) == set(NAMES), 60, "w3 to rejoin")
        assert cluster.wait(300) == 0, cluster.server_log()
        (summary,) = cluster.events("summary")
        assert summary["accuracy"] >= TARGET, summary
        assert [e["worker"] for e in cluster.events("evict")] == ["w3"]
        report(fault="SIGKILL worker mid-run", detected_s=round(evicted, 2), stall_s=round(stall, 2),
               rounds_lost=0, round_at_fault=before, accuracy=summary["accuracy"])
    finally:
        cluster.stop()


def test_frozen_worker_is_evicted_then_rejoins_after_sigcont(tmp_path: Path) -> None:
    cluster = start_server(tmp_path, [*JOB, "--epochs", "8"])
    try:
        workers = start_workers(cluster)
        wait_for(lambda: status(cluster.target)["epoch"] >= 1, 120, "epoch 1")
        frozen_at = time.monotonic()
        os.kill(workers["w1"].pid, signal.SIGSTOP)
        evicted = wait_for(lambda: "w1" not in status(cluster.target)["workers"], 30, "eviction of the frozen worker")
        r = status(cluster.target)["round"]
        wait_for(lambda: status(cluster.target)["round"] > r, 30, "progress without w1")
        stall = time.monotonic() - frozen_at
        os.kill(workers["w1"].pid, signal.SIGCONT)
        wait_for(lambda: "w1" in status(cluster.target)["workers"], 60, "w1 to rejoin after SIGCONT")
        assert cluster.wait(300) == 0, cluster.server_log()
        assert workers["w1"].wait(30) == 0, cluster.worker_log("w1")
        (summary,) = cluster.events("summary")
        assert summary["accuracy"] >= TARGET, summary
        report(fault="SIGSTOP worker, SIGCONT later", detected_s=round(evicted, 2), stall_s=round(stall, 2),
               rounds_lost=0, accuracy=summary["accuracy"])
    finally:
        cluster.stop()


def test_killed_server_resumes_from_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    first = tmp_path / "first"
    first.mkdir()
    job = [*JOB, "--epochs", "9", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "10"]
    cluster = start_server(first, job)
    workers: dict[str, subprocess.Popen] = {}
    try:
        workers = start_workers(cluster)
        wait_for(lambda: status(cluster.target)["epoch"] >= 2, 120, "epoch 2")
        round_at_kill = status(cluster.target)["round"]
        cluster.server.kill()
        cluster.server.wait()
        killed_at = time.monotonic()
        newest = checkpoint_files(ckpt)[-1]
        saved = read_checkpoint(newest)
        assert round_at_kill - saved["round"] <= 10  # nothing lost beyond the checkpoint interval
        # the replacement listens on the same port, so the workers' retries find it
        second = tmp_path / "second"
        second.mkdir()
        resumed = start_server(second, [*job, "--resume", str(ckpt)], port=cluster.port)
        resumed.workers = list(workers.values())
        (resume,) = wait_for_events(resumed, "resume")
        assert resume["params_sha256"] == params_digest(saved["params"])
        assert resume["round"] == saved["round"]
        wait_for(lambda: status(resumed.target)["round"] > saved["round"], 90, "training to continue")
        stall = time.monotonic() - killed_at
        assert resumed.wait(300) == 0, resumed.server_log()
        for name, proc in workers.items():
            assert proc.wait(30) == 0, cluster.worker_log(name)
            log = cluster.worker_log(name)  # what each worker said: the loss at once, the rejoin when it came
            assert f"{name}: lost the server" in log and f"{name}: rejoined {cluster.target} as " in log, log
        (summary,) = resumed.events("summary")
        assert summary["accuracy"] >= TARGET, summary
        report(fault="SIGKILL server, restart with --resume", stall_s=round(stall, 2),
               rounds_lost=round_at_kill - saved["round"], checkpoint_every=10, accuracy=summary["accuracy"])
    finally:
        for proc in workers.values():
            if proc.poll() is None:
                proc.kill()
        cluster.stop()


def test_resume_runs_under_the_command_lines_controller_settings(tmp_path: Path) -> None:
    """A job stopped under dynamic control resumes with --controller static --deadband 0.3: those apply
    (a static plan, the new deadband in the checkpoints), the checkpoint's adjustment count carries
    over, and the server names the changed settings on stderr and in the resume event."""
    ckpt = tmp_path / "ckpt"
    job = ["--mode", "bsp", "--workers", "2", "--model-arg", "hidden=32", "--global-batch", "64", "--epochs", "8",
           "--balance", "compute", "--checkpoint-dir", str(ckpt), "--grace", "5", "--controller", "dynamic"]
    slow = {"a": ("--cores", "1", "--slowdown", "40"), "b": ("--cores", "1", "--slowdown", "10")}  # epochs of ~0.5 s
    runs = {}
    resumed = ["--resume", str(ckpt), "--controller", "static", "--deadband", "0.3"]
    for run, extra in (("first", []), ("resumed", resumed)):
        (tmp_path / run).mkdir()
        cluster = runs[run] = start_server(tmp_path / run, [*job, *extra])
        try:
            for name, args in slow.items():
                cluster.start_worker(name, *args)
            if run == "first":
                wait_for(lambda: bool(cluster.events("adjust")[1:]) and status(cluster.target)["epoch"] >= 1, 120,
                         "the first epoch-end adjustment")
                cluster.server.send_signal(signal.SIGTERM)
            assert cluster.wait(300) == 0, cluster.server_log()
        finally:
            cluster.stop()
        if run == "first":  # read now: the resumed run's checkpoints prune it
            assert [e["reason"] for e in cluster.events("summary")] == ["stopping"]
            saved = read_checkpoint(cluster.events("checkpoint")[-1]["path"])["controller"]
    assert saved["config"]["policy"] == "dynamic" and saved["adjustments"] >= 1
    assert {w["batch"] for w in saved["workers"]} != {32}  # the slow worker got less: a plan a replan must undo
    (resume,) = runs["resumed"].events("resume")
    assert resume["controller_changes"] == {"policy": ["dynamic", "static"], "deadband": [0.1, 0.3]}
    assert ("ps-server: warning: the controller settings differ from the checkpoint's (--controller dynamic -> "
            "static, --deadband 0.1 -> 0.3); the command line's apply") in runs["resumed"].server_log()
    (summary,) = runs["resumed"].events("summary")
    assert summary["controller"] == "static" and summary["reason"] == "finished", summary
    assert summary["batch_sizes"] == {"a": 32, "b": 32} and summary["adjustments"] == saved["adjustments"]
    final = read_checkpoint(runs["resumed"].events("checkpoint")[-1]["path"])["controller"]
    assert (final["config"]["policy"], final["config"]["deadband"]) == ("static", 0.3)


def test_resume_of_a_finished_job_says_so_or_extends_it(tmp_path: Path) -> None:
    """--resume of a job that ran to its end: the server says the job is complete and exits 0 at once
    (no listening, no waiting for workers); with --epochs raised it warns what changed, the workers
    rejoin and the job trains on to the new last epoch."""
    ckpt = tmp_path / "ckpt"
    job = ["--mode", "bsp", "--workers", "2", "--model-arg", "hidden=32", "--global-batch", "64", "--grace", "5",
           "--checkpoint-dir", str(ckpt)]
    (tmp_path / "first").mkdir()
    cluster = start_server(tmp_path / "first", [*job, "--epochs", "1"])
    try:
        for name in ("a", "b"):
            cluster.start_worker(name)
        assert cluster.wait(120) == 0, cluster.server_log()
    finally:
        cluster.stop()
    first_round = cluster.events("summary")[0]["rounds"]
    again = subprocess.run(
        [sys.executable, "-m", "ps.server", "--port", "0", *job, "--epochs", "1", "--resume", str(ckpt)],
        capture_output=True, text=True, timeout=60, env=ENV, check=False,
    )
    assert again.returncode == 0, again.stderr
    assert f"ps-server: the job in {ckpt} is complete (" in again.stdout and "epoch 1 of 1" in again.stdout, again.stdout
    assert "--epochs above 1 to extend it" in again.stdout and "listening" not in again.stdout
    (tmp_path / "extended").mkdir()
    extended = start_server(tmp_path / "extended", [*job, "--epochs", "2", "--resume", str(ckpt)])
    try:
        for name in ("a", "b"):
            extended.start_worker(name)
        assert extended.wait(120) == 0, extended.server_log()
    finally:
        extended.stop()
    assert ("ps-server: warning: the job's settings differ from the checkpoint's (--epochs 1 -> 2); "
            "the command line's apply") in extended.server_log()
    (resume,) = extended.events("resume")
    (summary,) = extended.events("summary")
    assert resume["epoch"] == 1 and summary["reason"] == "finished" and summary["rounds"] > first_round
    assert [e["epoch"] for e in extended.events("epoch")] == [2]


def test_sigterm_worker_leaves_then_sigterm_server_checkpoints(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    cluster = start_server(tmp_path, [*JOB, "--epochs", "50", "--checkpoint-dir", str(ckpt)])
    try:
        workers = start_workers(cluster)
        wait_for(lambda: status(cluster.target)["epoch"] >= 1, 120, "epoch 1")
        workers["w2"].send_signal(signal.SIGTERM)
        assert workers["w2"].wait(30) == 0, cluster.worker_log("w2")
        wait_for(lambda: set(status(cluster.target)["workers"]) == {"w0", "w1", "w3"}, 10, "w2 to leave")
        assert [e["worker"] for e in cluster.events("leave")] == ["w2"]
        assert not cluster.events("evict")
        r = status(cluster.target)["round"]
        wait_for(lambda: status(cluster.target)["round"] > r, 30, "progress without w2")
        cluster.server.send_signal(signal.SIGTERM)
        assert cluster.server.wait(60) == 0, cluster.server_log()
        for name in ("w0", "w1", "w3"):
            assert workers[name].wait(30) == 0, cluster.worker_log(name)
        (summary,) = cluster.events("summary")
        assert summary["reason"] == "stopping"
        (event,) = cluster.events("checkpoint")
        state = read_checkpoint(event["path"])
        assert state["round"] == summary["rounds"]
        data = build_dataset("digits", {}, 0)
        model = build_model("mlp", data.input_shape, 10, {"hidden": 256}, 0)
        model.load_state_dict(state["model"])  # the documented way back into a module
        assert torch.equal(torch.cat([p.reshape(-1) for p in model.parameters()]), state["params"])
    finally:
        cluster.stop()


def test_a_channel_close_that_hangs_is_given_up(caplog: pytest.LogCaptureFixture) -> None:
    """grpc/grpc#19973: a call interrupted by a signal handler's exception (SIGTERM mid-wait) can make
    gRPC's channel close wait forever. The worker gives the close up after its timeout and says so,
    so it still exits (worker/cli.py then ends the process with os._exit)."""
    client = PSClient("127.0.0.1:1")
    real_close, release = client._channel.close, threading.Event()
    client._channel.close = lambda: release.wait(30)  # stands in for the close gRPC never finishes
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="worker.transport.client"):
        assert client.close(timeout=0.2) is False
    assert time.monotonic() - started < 5.0
    assert "did not finish within 0.2 s; giving it up" in caplog.text
    release.set()
    real_close()
    assert PSClient("127.0.0.1:1").close() is True


def test_a_leave_that_leaves_too_few_workers_for_the_global_batch_ends_the_job(tmp_path: Path) -> None:
    """--max-batch 64, B = 128: after one of two workers leaves, no plan can make up B. The job ends
    with that reason and the survivor's open push is answered (before: the replan raised, the round
    never closed and the survivor waited forever), and ps-server exits with ENDED_EARLY."""
    cluster = start_server(tmp_path, ["--mode", "bsp", "--workers", "2", "--model-arg", "hidden=8", "--global-batch", "128",
                                      "--max-batch", "64", "--controller", "uniform", "--epochs", "100", "--grace", "1"])
    clients = [PSClient(cluster.target) for _ in range(2)]
    try:
        joined: dict[int, object] = {}
        threads = [threading.Thread(target=lambda k=k: joined.__setitem__(k, clients[k].join(f"w{k}", 1.0, timeout=60)))
                   for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        a, b = joined[0], joined[1]
        out = torch.empty(a.layout.numel)
        plan = clients[0].pull(a.worker_id, out)
        pending = clients[0].start_push(PushMeta(a.worker_id, plan.round, plan.version, plan.batch_size, PushTimes(1.0),
                                                 "float32"), torch.zeros(a.layout.numel), out)
        clients[1].leave(b.worker_id)
        reply = pending()
        assert reply.done and "the workers left cannot split --global-batch" in reply.reason, reply
        assert cluster.wait(60) == ENDED_EARLY, cluster.server_log()  # before: 0, as if it had finished
        (summary,) = cluster.events("summary")
        assert "cannot split --global-batch" in summary["reason"], summary
        assert cluster.server_log().count(summary["reason"]) == 1, cluster.server_log()  # the `end` line's, once
    finally:
        for client in clients:
            client.close()
        cluster.stop()
