"""--micro-batch and per-worker max batches with real server and worker processes: the BatchNorm model
trains in whole micro-batches within a worker's --max-batch (PS path and fast path), a worker whose
join would leave B unheld is refused, a leave that leaves B unheld ends the job with that reason, and
impossible flags are refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from common.job.endings import ENDED_EARLY
from tests.processes import ENV, start_server

JOB = ["--workers", "2", "--model", "cnn-bn", "--model-arg", "width=8", "--dataset", "digits", "--global-batch", "64",
       "--micro-batch", "8", "--controller", "dynamic", "--adjust-every", "5", "--grace", "5", "--evict-after", "60"]


def check_plans(adjusts: list[dict], capped: str, cap: int) -> None:
    assert adjusts
    for e in adjusts:
        plan = e["batch_sizes"]
        assert sum(plan.values()) == 64 and all(b % 8 == 0 and b >= 8 for b in plan.values()), plan
        assert plan.get(capped, 0) <= cap, plan


def test_bn_model_trains_in_micro_batches_within_a_workers_max_batch(tmp_path: Path) -> None:
    cluster = start_server(tmp_path, [*JOB, "--epochs", "2"])
    try:
        workers = {"a": cluster.start_worker("a", "--max-batch", "20"), "b": cluster.start_worker("b", "--max-batch", "24")}
        deadline = time.monotonic() + 60  # whichever joins second would leave 16 + 24 < 64: refused at join
        while all(w.poll() is None for w in workers.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        (refused,) = [name for name, w in workers.items() if w.poll() is not None]
        assert workers[refused].returncode == 1
        cluster.start_worker("c", "--slowdown", "2")  # measured: no bound of its own under micro-batches
        assert cluster.wait(180) == 0, cluster.server_log()
    finally:
        cluster.stop()
    line = cluster.worker_log(refused).strip()
    assert line == ("ps-worker: error: FAILED_PRECONDITION: the 2 workers that would start the job hold at most 40 "
                    "samples together (their max batches in whole micro-batches), below --global-batch 64; join "
                    "workers with more memory or lower --global-batch"), line
    capped = "b" if refused == "a" else "a"
    check_plans(cluster.events("adjust"), capped, {"a": 16, "b": 24}[capped])
    (summary,) = cluster.events("summary")
    assert summary["reason"] == "finished" and summary["accuracy"] > 0.8, summary
    evals = cluster.events("eval")
    assert evals and all(set(e["bn"]) == {"features.1", "features.5", "head.2"} for e in evals)


def test_micro_batches_on_the_fast_path(tmp_path: Path) -> None:
    cluster = start_server(tmp_path, [*JOB, "--epochs", "1", "--allreduce", "on"])
    try:
        cluster.start_worker("a", "--max-batch", "16")
        cluster.start_worker("c")
        assert cluster.wait(180) == 0, cluster.server_log()
    finally:
        cluster.stop()
    check_plans(cluster.events("adjust"), "a", 16)
    (summary,) = cluster.events("summary")
    assert summary["reason"] == "finished" and summary["allreduce"] and summary["accuracy"] > 0.5, summary


def test_a_leave_that_leaves_b_unheld_ends_the_job(tmp_path: Path) -> None:
    cluster = start_server(tmp_path, [*JOB, "--workers", "3", "--epochs", "50"])
    try:
        cluster.start_worker("a", "--max-batch", "16")
        cluster.start_worker("b", "--max-batch", "16")
        big = cluster.start_worker("c")
        deadline = time.monotonic() + 120
        while not cluster.events("eval") and time.monotonic() < deadline:
            time.sleep(0.2)
        big.terminate()  # leaves: a and b hold 32 of the 64
        assert cluster.wait(120) == ENDED_EARLY, cluster.server_log()
    finally:
        cluster.stop()
    (summary,) = cluster.events("summary")
    assert summary["reason"].startswith("the workers left cannot split --global-batch"), summary
    check_plans(cluster.events("adjust")[:-1], "a", 16)


def test_impossible_flags_are_refused_in_one_line() -> None:
    for args, message in (
        (["--global-batch", "60", "--micro-batch", "8"],
         "ps-server: error: --global-batch 60 is not a multiple of --micro-batch 8; use 56 or 64"),
        (["--global-batch", "64", "--micro-batch", "8", "--mode", "asp"],
         "ps-server: error: --micro-batch is for --mode bsp (ASP updates do not add up to one global batch), not --mode asp"),
        (["--global-batch", "64", "--micro-batch", "8", "--workers", "9"],
         "ps-server: error: --workers 9 x --micro-batch 8 exceeds --global-batch 64"),
    ):
        done = subprocess.run([sys.executable, "-m", "ps.server", *args], capture_output=True, text=True, env=ENV, timeout=60)
        assert (done.returncode, done.stderr.strip()) == (2, message)


def test_a_batchnorm_model_never_gets_one_sample(tmp_path: Path) -> None:
    """Without --micro-batch a BatchNorm model's workers get 2 samples at least (--min-batch's default
    for it): a slow worker that the dynamic policy would give 1 sample (torch fails on it in train mode)
    trains at 2, and a worker whose memory holds 1 sample is refused at Join."""
    cluster = start_server(tmp_path, ["--workers", "2", "--model", "cnn-bn", "--model-arg", "width=8", "--dataset",
                                      "digits", "--global-batch", "16", "--controller", "dynamic", "--adjust-every",
                                      "5", "--epochs", "2", "--grace", "5", "--evict-after", "60"])
    try:
        tiny = cluster.start_worker("tiny", "--max-batch", "1")
        assert tiny.wait(60) == 1
        cluster.start_worker("fast")
        cluster.start_worker("slow", "--slowdown", "30")
        assert cluster.wait(300) == 0, cluster.server_log()
    finally:
        cluster.stop()
    assert cluster.worker_log("tiny").strip() == (
        "ps-worker: error: FAILED_PRECONDITION: this worker holds at most 1 samples, below the job's smallest batch 2 "
        "(--min-batch 2, --micro-batch 1)")
    plans = [e["batch_sizes"] for e in cluster.events("adjust")]
    assert plans and all(min(p.values()) >= 2 for p in plans), plans
    assert any(p["slow"] == 2 for p in plans), plans  # the floor binds
    (summary,) = cluster.events("summary")
    assert summary["reason"] == "finished", summary


def test_a_batchnorm_model_refuses_a_batch_of_one_in_one_line() -> None:
    bn = ["--model", "cnn-bn", "--dataset", "digits"]
    for args, message in (
        ([*bn, "--min-batch", "1"], "ps-server: error: --min-batch 1: --model cnn-bn has BatchNorm, which cannot train "
                                    "on one sample; give --min-batch 2 or more (its default for this model)"),
        ([*bn, "--workers", "4", "--global-batch", "6"],
         "ps-server: error: --global-batch 6 cannot give --workers 4 the 2 samples a model with BatchNorm (--model "
         "cnn-bn) needs; use --global-batch 8 or more"),
        ([*bn, "--max-batch", "1"],
         "ps-server: error: --max-batch 1 is below the 2 samples a model with BatchNorm (--model cnn-bn) needs"),
    ):
        done = subprocess.run([sys.executable, "-m", "ps.server", *args], capture_output=True, text=True, env=ENV, timeout=60)
        assert (done.returncode, done.stderr.strip()) == (2, message)


def test_the_benchmark_reports_the_three_runs_side_by_side() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.micro_batches", "--seeds", "0", "--epochs", "1", "--micro-batch", "4",
         "--throughput-batch", "0", "--limiter", "slowdown"],
        capture_output=True, text=True, env=ENV, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert set(report["accuracy"]) == {"uniform", "variable", "micro4"}
    assert report["slowest_worker_batches"]["uniform"] == [12]
    assert all(b % 4 == 0 for b in report["slowest_worker_batches"]["micro4"])
    assert all(r["bn"] and r["accuracy"] > 0.3 for runs in report["accuracy_runs"].values() for r in runs)
    assert report["bn_distance_to_uniform"]["micro4"][0] is not None
