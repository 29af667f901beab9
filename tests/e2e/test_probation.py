"""Probation with real processes (ps-server, ps-worker; the attackers written from the protocols alone:
benchmarks/hostile/peers.py): members that join a running BSP job under fresh names and stall their
push or never push hold no round (no deadline eviction, no round open past the deadline) and the job
ends about as fast as without them, while an honest ps-worker that joins in mid-job probes, enters the
plan and trains, its samples counted and every epoch's exactly once. It prints one `PROBATION {...}`
JSON line (run with `pytest -s -m slow tests/e2e/test_probation.py`). The same with --shards 2 (and
its shard servers) and on the --allreduce fast path, where the probe goes whole to the server and
the group re-forms once, when the newcomer enters the plan."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from benchmarks.hostile.peers import RejoinLoop, StalledPushes
from tests.fault_jobs import status, wait_for
from tests.processes import Cluster, start_server

EPOCHS = 24  # about 12 s clean: a worker started at round 5 joins well before the end
B = 64
JOB = ["--workers", "1", "--max-workers", "5", "--model-arg", "hidden=16", "--dataset", "digits", "--global-batch",
       str(B), "--lr", "0.1", "--epochs", str(EPOCHS), "--evict-after", "30", "--push-idle", "2", "--grace", "2"]
SLOWDOWN = "5"  # rounds of about 0.1 s: the job lasts long enough for a worker to start and join in its middle
SLACK = 1.0
"""How much longer than the clean job the attacked one may take, as a fraction of it: the attackers'
calls, the newcomer's start (a process importing torch) and, once it is in the plan, its training
share the two CPUs with w0 (epochs of 0.8-1.1 s against 0.5 clean; 20.5 s against 12.4 in a CI run
of 2026-12-07); a round held to the warm-up bound (20 s) for a probationer would take it past this,
and no round may stay open past the deadline floor (`longest_round_open_s`)."""
PATHS = {"shards": ["--shards", "2"], "allreduce": ["--allreduce", "on", "--sampling", "independent"]}
WARMUP = ["--round-warmup", "20"]  # a stalled member planned would hold a round this long
FLOOR_S = 5.0
"""--round-deadline-floor's default: the longest a round may stay open."""


def finished(cluster: Cluster, workers: dict[str, subprocess.Popen]) -> dict:
    """The job's summary once the server and `workers` exited 0."""
    assert cluster.wait(150) == 0, cluster.server_log()
    for name, proc in workers.items():
        assert proc.wait(15) == 0, cluster.worker_log(name)
    (summary,) = cluster.events("summary")
    assert summary["reason"] == "finished", summary
    return summary


def run(tmp_path: Path, attacked: bool, *flags: str) -> tuple[Cluster, dict]:
    """The job (with `flags`), clean or with a stalling member, a never-pushing one and an honest
    newcomer joining at round 5."""
    cluster = start_server(tmp_path, [*JOB, *flags])
    stall = StalledPushes(cluster.target, "", count=1, every_s=1.0)
    never = RejoinLoop(cluster.target, "", name="never")
    try:
        workers = {"w0": cluster.start_worker("w0", "--retry-for", "60", "--slowdown", SLOWDOWN)}
        if attacked:
            wait_for(lambda: status(cluster.target)["round"] >= 5, 60, "round 5")
            stall.start()
            never.start()
            workers["late"] = cluster.start_worker("late", "--retry-for", "60", "--slowdown", SLOWDOWN)
        summary = finished(cluster, workers)
    finally:
        stall.stop()
        never.stop()
        cluster.stop()
    return cluster, summary


def test_fresh_names_that_never_push_hold_no_round_and_a_newcomer_trains_after_its_probe(tmp_path: Path) -> None:
    (tmp_path / "clean").mkdir()
    (tmp_path / "attacked").mkdir()
    _, clean = run(tmp_path / "clean", attacked=False)
    cluster, summary = run(tmp_path / "attacked", attacked=True)
    print("PROBATION " + json.dumps({"clean_wall_s": clean["wall_s"], "attacked_wall_s": summary["wall_s"],
                                     "longest_round_open_s": summary["longest_round_open_s"]}))
    on_probation = {e["worker"] for e in cluster.events("probation")}
    assert {"stall0", "never", "late"} <= on_probation, on_probation
    assert [e["worker"] for e in cluster.events("probe")] == ["late"]  # the one that computes proved it
    planned = {e["worker"] for e in cluster.events("join")}
    assert "late" in planned and not planned & {"stall0", "never"}, planned
    # no round waits for a probationer; one still unprobed at --round-warmup (60 s) is evicted, nobody else
    dropped = [e["worker"] for e in cluster.events("deadline")]
    assert set(dropped) <= {"stall0", "never"} and summary["deadline_drops"] == len(dropped), (dropped, summary)
    assert summary["longest_round_open_s"] < FLOOR_S, summary
    assert summary["wall_s"] <= clean["wall_s"] * (1.0 + SLACK), (summary["wall_s"], clean["wall_s"])
    assert summary["update_counts"].get("late", 0) > 0, summary  # its pushes went into rounds
    exact = summary["exactly_once"]
    assert exact["overlaps"] == 0 and exact["exact_epochs"] == list(range(EPOCHS)), exact
    assert summary["short_rounds"] == 0 and summary["rounds"] == clean["rounds"], (summary, clean)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_on_the_sharded_and_the_fast_path_a_newcomer_probes_through_the_server(tmp_path: Path, path: str) -> None:
    """--shards 2, or --allreduce: the probationers hold no round, the honest newcomer's probe (its whole
    gradient, to the server) takes it into the plan and it trains; every plan sums to B."""
    cluster, summary = run(tmp_path, True, *PATHS[path], *WARMUP)
    assert {"stall0", "never", "late"} <= {e["worker"] for e in cluster.events("probation")}
    assert [e["worker"] for e in cluster.events("probe")] == ["late"]
    planned = {e["worker"] for e in cluster.events("join")}
    assert "late" in planned and not planned & {"stall0", "never"}, planned
    dropped = [e["worker"] for e in cluster.events("deadline")]  # a probationer unprobed at --round-warmup
    assert set(dropped) <= {"stall0", "never"} and summary["deadline_drops"] == len(dropped), (dropped, summary)
    assert summary["longest_round_open_s"] < FLOOR_S, summary
    assert summary["update_counts"].get("late", 0) > 0, summary  # its pushes (reports) went into rounds
    plans = [e["batch_sizes"] for e in cluster.events("adjust")]
    assert plans and all(sum(p.values()) == B for p in plans), plans
    (entered,) = [e["step"] for e in cluster.events("join") if e["worker"] == "late"]
    # on the fast path a new batch size applies one step later (docs/fast-path.md): at late's entry
    # w0's report is of its batch before the re-split; every other round is of B
    off = [e["round"] for e in cluster.events("short_round")]
    assert off == ([] if path == "shards" else off[:1]) and set(off) <= {entered}, (off, entered)
    if path == "allreduce":  # the group formed at the start, and once more when late entered the plan
        groups = [sorted(e["ranks"]) for e in cluster.events("regroup")]
        assert groups == [["w0"], ["late", "w0"]], groups
