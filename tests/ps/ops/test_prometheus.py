"""Prometheus metrics: `/metrics` of a real `ps-server` scraped over HTTP during a run, and the
exporter's bookkeeping of per-worker series (pure: events in, samples out)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from ps.ops.metrics_http import MAX_CONNECTIONS
from ps.ops.prometheus import JobMetrics
from ps.server import main as server_main
from tests.processes import ENV, start_server
from tests.metrics_scrape import Samples, scrape, value

JOB = ["--quiet", "--workers", "2", "--model-arg", "hidden=16", "--global-batch", "64", "--epochs", "1000",
       "--controller", "dynamic"]
WORKER = ("--slowdown", "10", "--retry-for", "0")
TOKEN = "metrics-t0ken"


def workers_in(samples: Samples) -> set[str]:
    return {dict(labels)["worker"] for _, labels in samples if "worker" in dict(labels)}


def wait_for(port: int, predicate: Callable[[Samples], bool], what: str, timeout: float = 60.0) -> Samples:
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(port)
        if predicate(samples):
            return samples
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.slow
def test_metrics_advance_during_a_run_and_a_leaving_worker_takes_its_series_along(tmp_path: Path) -> None:
    metrics_port_file = tmp_path / "metrics.port"
    cluster = start_server(tmp_path, [*JOB, "--metrics-port", "0", "--metrics-port-file", str(metrics_port_file)])
    try:
        port = int(metrics_port_file.read_text())
        assert f"ps-server: metrics on http://127.0.0.1:{port}/metrics" in cluster.server_log()
        before = scrape(port)
        assert value(before, "hetero_ps_steps_total") == 0
        assert value(before, "hetero_ps_job_info", balance="busy", controller="dynamic", mode="bsp", path="auto") == 1
        cluster.start_worker("a", *WORKER)
        leaver = cluster.start_worker("b", *WORKER)

        first = wait_for(port, lambda s: value(s, "hetero_ps_steps_total") >= 5, "5 steps")
        later = wait_for(port, lambda s: value(s, "hetero_ps_steps_total") >= value(first, "hetero_ps_steps_total") + 5,
                         "5 more steps")
        for name, labels in [("hetero_ps_samples_total", {}), ("hetero_ps_round_duration_seconds_count", {}),
                             ("hetero_ps_grpc_received_bytes_total", {"method": "Push"}),
                             ("hetero_ps_grpc_sent_bytes_total", {"method": "Push"}),
                             ("hetero_ps_worker_pushes_total", {"worker": "a"}),
                             ("hetero_ps_worker_samples_total", {"worker": "b"}),
                             ("hetero_ps_worker_step_time_seconds_count", {"worker": "a"})]:
            assert value(later, name, **labels) > value(first, name, **labels) > 0, name
        assert value(later, "hetero_ps_samples_total") == 64 * value(later, "hetero_ps_steps_total")
        assert value(later, "hetero_ps_round_duration_seconds_bucket", le="+Inf") == value(
            later, "hetero_ps_round_duration_seconds_count")
        assert value(later, "hetero_ps_joins_total") == 2 and value(later, "hetero_ps_workers") == 2
        assert value(later, "hetero_ps_worker_batch_size", worker="a") + value(later, "hetero_ps_worker_batch_size",
                                                                                worker="b") == 64
        assert value(later, "hetero_ps_job_info", balance="busy", controller="dynamic", mode="bsp", path="ps") == 1
        assert workers_in(later) == {"a", "b"}

        leaver.send_signal(signal.SIGTERM)  # it Leaves; its series go with it, the job goes on without it
        gone = wait_for(port, lambda s: value(s, "hetero_ps_leaves_total") == 1 and workers_in(s) == {"a"}, "b's leave")
        assert value(gone, "hetero_ps_workers") == 1 and value(gone, "hetero_ps_worker_batch_size", worker="a") == 64
        wait_for(port, lambda s: value(s, "hetero_ps_worker_pushes_total", worker="a")
                 > value(gone, "hetero_ps_worker_pushes_total", worker="a"), "a to go on")
        cluster.server.send_signal(signal.SIGTERM)
        assert cluster.wait(60) == 0, cluster.server_log()
    finally:
        cluster.stop()


def test_metrics_flags_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert server_main(["--metrics-port-file", str(tmp_path / "p"), "--quiet"]) == 2
    assert "ps-server: error: --metrics-port-file needs --metrics-port" in capsys.readouterr().err
    assert server_main(["--metrics-port", "0", "--metrics-port-file", str(tmp_path), "--quiet"]) == 2
    assert f"ps-server: error: --metrics-port-file {tmp_path} is a directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        server_main(["--metrics-port", "70000"])
    assert "expected a port in 0-65535" in capsys.readouterr().err
    shard = subprocess.run([sys.executable, "-m", "ps.shards.server", "--metrics-port-file", str(tmp_path / "p")],
                           env=ENV, capture_output=True, text=True, timeout=60)
    assert shard.returncode == 2 and "ps-shard: error: --metrics-port-file needs --metrics-port" in shard.stderr


def test_idle_sockets_leave_the_servers_threads_bounded_and_the_page_needs_the_token(tmp_path: Path) -> None:
    """600 idle sockets to a real server's --metrics-port: its thread count (/proc/PID/task) and open
    files stay bounded and /metrics still answers, to the token's holders only; --metrics-without-token
    serves it to anyone."""
    port_file = tmp_path / "metrics.port"
    cluster = start_server(tmp_path, [*JOB, "--token", TOKEN, "--metrics-port", "0", "--metrics-port-file", str(port_file)])
    try:
        port, pid = int(port_file.read_text()), cluster.server.pid
        assert f"ps-server: metrics on http://127.0.0.1:{port}/metrics (token required)" in cluster.server_log()
        with pytest.raises(urllib.error.HTTPError) as refused:
            scrape(port)
        assert refused.value.code == 401
        assert value(scrape(port, TOKEN), "hetero_ps_steps_total") == 0
        threads, files = len(os.listdir(f"/proc/{pid}/task")), len(os.listdir(f"/proc/{pid}/fd"))
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(600)]
        try:
            time.sleep(1.0)
            assert value(scrape(port, TOKEN), "hetero_ps_steps_total") == 0
            assert len(os.listdir(f"/proc/{pid}/task")) <= threads + 2, (threads, len(os.listdir(f"/proc/{pid}/task")))
            assert len(os.listdir(f"/proc/{pid}/fd")) <= files + MAX_CONNECTIONS + 2
        finally:
            for sock in idle:
                sock.close()
        cluster.server.send_signal(signal.SIGTERM)
        assert cluster.wait(60) == 0, cluster.server_log()
    finally:
        cluster.stop()
    (tmp_path / "open").mkdir()
    cluster = start_server(tmp_path / "open", [*JOB, "--token", TOKEN, "--metrics-port", "0", "--metrics-without-token",
                                               "--metrics-port-file", str(port_file)])
    try:
        assert value(scrape(int(port_file.read_text())), "hetero_ps_steps_total") == 0
    finally:
        cluster.stop()


# ---------------------------------------------------------------- the exporter alone
def adjust(plan: dict[str, int], changed: bool = True) -> dict:
    return {"event": "adjust", "batch_sizes": plan, "compute_ms": {w: 10.0 for w in plan}, "changed": changed}


def exported_workers(registry: CollectorRegistry) -> set[str]:
    return {s.labels["worker"] for family in registry.collect() for s in family.samples if "worker" in s.labels}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["join", "leave", "evict", "push"]), st.sampled_from("abcdef")), max_size=40))
def test_per_worker_series_are_those_of_the_workers_in_the_job(moves: list[tuple[str, str]]) -> None:
    """However workers come and go, the `worker` label values are those of the workers still in the
    job: the label set stays bounded by the job's size."""
    registry = CollectorRegistry()
    metrics = JobMetrics(registry, mode="bsp", controller="dynamic", balance="compute", path="ps")
    present: set[str] = set()
    for move, worker in moves:
        if move == "join" and worker not in present:
            present.add(worker)
            metrics.observe({"event": "join", "worker": worker})
            metrics.observe(adjust({w: 8 for w in present}))
        elif move in ("leave", "evict") and worker in present:
            present.discard(worker)
            metrics.observe({"event": move, "worker": worker, "reason": "test"})
            metrics.observe(adjust({w: 8 for w in present}))
        elif move == "push" and worker in present:
            metrics.observe({"event": "push", "worker": worker, "batch": 8, "ms": 5.0})
            metrics.observe({"event": "step", "step": 1, "batch": 8})
        assert exported_workers(registry) == present


def test_the_exporter_counts_what_the_events_say() -> None:
    registry = CollectorRegistry()
    metrics = JobMetrics(registry, mode="bsp", controller="dynamic", balance="busy", path="auto")
    get = registry.get_sample_value
    metrics.observe(adjust({"a": 40, "b": 24}))
    metrics.observe(adjust({"a": 40, "b": 24}, changed=False))
    for _ in range(3):
        metrics.observe({"event": "push", "worker": "a", "batch": 40, "ms": 20.0})
        metrics.observe({"event": "push", "worker": "b", "batch": 24, "ms": None})  # --balance cycle: first push
        metrics.observe({"event": "step", "step": 1, "batch": 64})
    metrics.observe({"event": "path", "allreduce": False, "balance": "busy", "why": "", "step": 0, "epoch": 0})
    metrics.observe({"event": "epoch", "epoch": 1})
    metrics.observe({"event": "eval", "epoch": 1, "accuracy": 0.9, "loss": 0.3, "wall_s": 1.0})
    metrics.observe({"event": "evict", "worker": "b", "reason": "silent"})
    metrics.observe({"event": "end", "reason": "finished"})
    assert get("hetero_ps_steps_total") == 3 and get("hetero_ps_samples_total") == 192
    assert get("hetero_ps_round_duration_seconds_count") == 2  # the first step has no previous one
    assert get("hetero_ps_controller_decisions_total", {"changed": "true"}) == 1
    assert get("hetero_ps_controller_decisions_total", {"changed": "false"}) == 1
    assert get("hetero_ps_worker_step_time_seconds_sum", {"worker": "a"}) == pytest.approx(0.06)
    assert get("hetero_ps_worker_step_time_seconds_bucket", {"worker": "a", "le": "0.025"}) == 3
    assert get("hetero_ps_worker_smoothed_step_seconds", {"worker": "a"}) == pytest.approx(0.01)
    assert get("hetero_ps_worker_samples_total", {"worker": "a"}) == 120
    assert get("hetero_ps_worker_pushes_total", {"worker": "b"}) is None  # evicted: its series are gone
    assert get("hetero_ps_evictions_total") == 1 and get("hetero_ps_leaves_total") == 0
    assert get("hetero_ps_epoch") == 1 and get("hetero_ps_test_accuracy_ratio") == 0.9
    assert get("hetero_ps_job_ended") == 1
    assert get("hetero_ps_job_info", {"mode": "bsp", "controller": "dynamic", "balance": "busy", "path": "ps"}) == 1
