"""The model policy with real processes: a worker whose fixed per-step cost (ps-worker
--step-overhead-ms) makes every round slower is parked (batch 0, shown by Status, skipped by the
round), the job finishes and the parked worker exits cleanly; the policy's fits survive a checkpoint
and --resume."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

from ps.checkpoint import read_checkpoint
from tests.processes import start_server
from worker.transport.client import PSClient, ServerError

JOB = ["--mode", "bsp", "--workers", "3", "--model", "mlp", "--model-arg", "hidden=32", "--dataset", "digits",
       "--global-batch", "96", "--controller", "model", "--adjust-every", "8", "--grace", "5"]
SLOW = ("--step-overhead-ms", "250")


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            if predicate():
                return
        except ServerError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def parked_in_status(target: str) -> list[str]:
    client = PSClient(target)
    try:
        return sorted(w.name for w in client.status().workers if w.parked and w.batch_size == 0)
    finally:
        client.close()


def test_a_worker_with_a_large_fixed_cost_is_parked_and_the_job_finishes(tmp_path: Path) -> None:
    cluster = start_server(tmp_path, [*JOB, "--epochs", "3"])
    try:
        for name in ("a", "b"):
            cluster.start_worker(name)
        slow = cluster.start_worker("c", *SLOW)
        wait_for(lambda: parked_in_status(cluster.target) == ["c"], 120, "Status to show c parked")
        rounds = [e for e in cluster.events("adjust") if e.get("phase") == "solve"]
        assert rounds and rounds[0]["parked"] == ["c"], rounds
        solve = rounds[0]
        assert solve["batch_sizes"]["c"] == 0 and sum(solve["batch_sizes"].values()) == 96
        assert solve["park"]["parked"] < solve["park"]["held"]
        assert solve["fits"]["c"]["s"] > 150  # the 250 ms of busy work, fitted as c's fixed cost
        assert cluster.wait(240) == 0, cluster.server_log()
        assert slow.returncode == 0 and all(w.returncode == 0 for w in cluster.workers)
    finally:
        cluster.stop()
    (summary,) = cluster.events("summary")
    assert summary["reason"] == "finished" and summary["controller"] == "model", summary
    adjusts = cluster.events("adjust")
    assert any(e.get("phase") == "probe" for e in adjusts)  # the probe rounds are logged as such
    for e in adjusts:
        assert sum(e["batch_sizes"].values()) == 96
    # while parked, c pushed nothing: its updates are those of its probe rounds and re-probes
    assert summary["update_counts"]["c"] < summary["update_counts"]["a"]


def test_the_model_state_survives_a_checkpoint_and_resume(tmp_path: Path) -> None:
    """Stopped after its first solve, the job resumes with the checkpoint's fits: no probe again, the
    slow worker still parked from the first decision on."""
    ckpt = tmp_path / "ckpt"
    job = [*JOB, "--epochs", "4", "--checkpoint-dir", str(ckpt)]
    runs = {}
    for run, extra in (("first", []), ("resumed", ["--resume", str(ckpt)])):
        (tmp_path / run).mkdir()
        cluster = runs[run] = start_server(tmp_path / run, [*job, *extra])
        try:
            for name in ("a", "b"):
                cluster.start_worker(name)
            cluster.start_worker("c", *SLOW)
            if run == "first":
                wait_for(lambda: any(e.get("phase") == "solve" and "c" in e.get("parked", [])
                                     for e in cluster.events("adjust")), 240, "a solve that parks c")
                cluster.server.send_signal(signal.SIGTERM)
            assert cluster.wait(240) == 0, cluster.server_log()
        finally:
            cluster.stop()
        if run == "first":
            saved = read_checkpoint(cluster.events("checkpoint")[-1]["path"])["controller"]
    assert saved["config"]["policy"] == "model"
    assert {w["id"]: w["batch"] for w in saved["workers"]}["c"] == 0
    assert saved["model"]["workers"]["c"]["parked"] is not None and saved["model"]["workers"]["a"]["obs"]
    resumed = runs["resumed"]
    (resume,) = resumed.events("resume")
    assert "controller_changes" not in resume or not resume["controller_changes"]
    phases = [e.get("phase") for e in resumed.events("adjust")]
    assert "probe" not in phases, phases
    (summary,) = resumed.events("summary")
    assert summary["reason"] == "finished", summary
