"""Members that attack a real job from inside (ps-server, ps-shard and ps-worker processes; the attackers
written from the protocols alone: benchmarks/hostile/peers.py): members that join a running job and
stall their pushes after the header, or never push, hold no round (they are on probation,
ps.rounds.probation) nor keep the honest worker's push from the server; ids that left cannot act at
the shards."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import grpc

from benchmarks.hostile.peers import DepartedAtShards, RejoinLoop, StalledPushes
from protos import ps_pb2, ps_pb2_grpc
from tests.processes import Cluster, start_server

FINISH_S = 150.0
TINY = ["--model-arg", "hidden=16", "--dataset", "digits", "--global-batch", "64", "--lr", "0.1"]


def wait_for_round(cluster: Cluster, round_: int, timeout: float = 60.0) -> int:
    """The server's round once it reached `round_`."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(cluster.target) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        while (now := stub.Status(ps_pb2.StatusRequest(), timeout=10).round) < round_:
            assert time.monotonic() < deadline, f"the job stayed at round {now}"
            time.sleep(0.05)
    return now


def finished(cluster: Cluster, worker: subprocess.Popen) -> dict:
    """The job's summary once the server and its worker exited 0."""
    assert cluster.wait(FINISH_S) == 0, cluster.server_log()
    assert worker.wait(15) == 0, cluster.worker_log("w0")
    (summary,) = cluster.events("summary")
    assert summary["reason"] == "finished", summary
    return summary


def test_pushes_that_stall_after_their_header_neither_hold_the_round_nor_the_honest_push(tmp_path: Path) -> None:
    """Three members join the running job (on probation: ps.rounds.probation) and each push a header,
    then an empty chunk every second: two of them hold the whole --push-buffer-mib (420 KB a push,
    1 MiB), the third and the real worker's push wait for room. Empty chunks are no progress: the
    stalled streams end at --push-idle, the waiting pushes are admitted in their order, and no round
    waits for the stalled members (no probe of theirs arrived, the plan does not hold them): nobody is
    evicted at a deadline, and the worker trains the job to its end."""
    cluster = start_server(tmp_path, ["--workers", "1", "--max-workers", "4", "--model-arg", "hidden=288", "--dataset",
                                      "digits", "--global-batch", "64", "--lr", "0.05", "--epochs", "1",
                                      "--push-buffer-mib", "1", "--push-idle", "2", "--round-deadline", "4",
                                      "--evict-after", "30", "--grace", "2"])
    attack = StalledPushes(cluster.target, "", count=3, every_s=1.0)
    try:
        # steps slowed to ~0.2 s: the epoch outlasts the attack's first stalls past --push-idle on a fast
        # machine too (unslowed, its 23 rounds took 0.22 s and ended before any push stalled)
        worker = cluster.start_worker("w0", "--retry-for", "60", "--slowdown", "30")
        wait_for_round(cluster, 2)
        attack.start()
        summary = finished(cluster, worker)
    finally:
        attack.stop()
        cluster.stop()
    assert cluster.events("evict") == [] and cluster.events("deadline") == [], cluster.events("evict")
    assert {e["worker"] for e in cluster.events("probation")} == set(attack.names)
    said = attack.heard("push FAILED_PRECONDITION")
    assert any("no data in this push for 2 s (--push-idle; an empty chunk is no progress)" in d for d in said), (
        attack.told(), attack.tally())
    assert summary["longest_round_open_s"] < 2 + 2, summary  # a wait for room: the idle limit, slack


def test_a_member_that_never_pushes_holds_no_round(tmp_path: Path) -> None:
    """A member joins a running job, heartbeats and never pushes: it is on probation, so no round
    waits for it and no deadline evicts it; the real worker trains on. (The warm-up bound of a name's
    first round and the rejoins' backoff: tests/ps/rounds/test_deadlines.py, test_rejoins.py.)"""
    cluster = start_server(tmp_path, ["--workers", "1", "--max-workers", "2", *TINY, "--epochs", "1000",
                                      "--round-deadline-floor", "1", "--round-warmup", "4", "--evict-after", "30"])
    attack = RejoinLoop(cluster.target, "", name="x")
    try:
        worker = cluster.start_worker("w0", "--retry-for", "60")
        wait_for_round(cluster, 10)
        attack.start()
        started = time.monotonic()
        while not cluster.events("probation"):
            assert time.monotonic() - started < 30, "x did not enter"
            time.sleep(0.2)
        rounds = wait_for_round(cluster, 0)
        wait_for_round(cluster, rounds + 20, timeout=20)  # w0 trains on, x in the job
        assert worker.poll() is None, cluster.worker_log("w0")
    finally:
        attack.stop()
        cluster.stop()
    assert [e["worker"] for e in cluster.events("probation")] == ["x"]
    assert cluster.events("deadline") == [] and cluster.events("evict") == []
    assert "x" not in {e["worker"] for e in cluster.events("join")}  # never planned


def test_ids_that_left_are_revoked_at_the_shards_and_cannot_crowd_out_the_worker(tmp_path: Path) -> None:
    """Four members join (--max-workers 2 beside the real worker: one after another) and leave, keeping
    their ids and secrets, then pull their old range at the shard and stage zero slices there every
    round: from the commit of the round each left in, the shard refuses them (FAILED_PRECONDITION:
    revoked). Let in, they would fill the shard's four pending slots, its refusals of the worker's
    slices would leave the ranges stepped apart. The worker trains the job to its end, no shard
    missing its slice."""
    # 30 epochs (several seconds): the four take their turns at the one free place before the job ends
    cluster = start_server(tmp_path, ["--workers", "1", "--max-workers", "2", "--shards", "2", *TINY, "--epochs", "30",
                                      "--evict-after", "30", "--grace", "2"])
    attacks = [DepartedAtShards(cluster.target, "", name=f"gone{i}") for i in range(4)]
    try:
        worker = cluster.start_worker("w0", "--retry-for", "60")
        wait_for_round(cluster, 2)
        for attack in attacks:
            attack.start()
        summary = finished(cluster, worker)
    finally:
        for attack in attacks:
            attack.stop()
        cluster.stop()
    for attack in attacks:
        tally = attack.tally()
        assert tally.get("left") == 1 and tally.get("shard stage OK", 0) == 0, tally
        assert tally.get("shard pull OK", 0) <= 2, tally  # in the round it left in, before that round's commit
        refused = attack.heard("shard pull FAILED_PRECONDITION") + attack.heard("shard stage FAILED_PRECONDITION")
        assert any("left the job or was evicted: its secret is revoked at this shard" in r for r in refused), tally
    assert cluster.events("shard_missing") == [] and summary["epochs"] == 30, summary
