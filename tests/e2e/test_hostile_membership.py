"""Members that attack a real job from inside (ps-server, ps-shard and ps-worker processes; the attackers
written from the protocols alone: benchmarks/hostile/peers.py): pushes that stall after their header
do not hold a round past its deadline, nor keep the honest worker's push from the server; a member
that never pushes and rejoins each time it is evicted holds its name's first round for the warm-up
bound only, and its rejoins back off; ids that left cannot act at the shards."""

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
    """Three joined members each push a header, then an empty chunk every second: two of them hold the
    whole --push-buffer-mib (420 KB a push, 1 MiB), the third and the real worker's push wait for room.
    Empty chunks are no progress: the stalled streams end at --push-idle, the waiting pushes are admitted
    in their order, the round closes at its deadline over the worker's push and the stalled members are
    evicted, their streams cancelled with them; they rejoin (backing off) and stall again, and the
    worker trains the job to its end without ever being evicted."""
    cluster = start_server(tmp_path, ["--workers", "1", "--max-workers", "4", "--model-arg", "hidden=288", "--dataset",
                                      "digits", "--global-batch", "64", "--lr", "0.05", "--epochs", "1",
                                      "--push-buffer-mib", "1", "--push-idle", "2", "--round-deadline", "4",
                                      "--evict-after", "30", "--grace", "2"])
    attack = StalledPushes(cluster.target, "", count=3, every_s=1.0)
    try:
        worker = cluster.start_worker("w0", "--retry-for", "60")
        wait_for_round(cluster, 2)
        attack.start()
        summary = finished(cluster, worker)
    finally:
        attack.stop()
        cluster.stop()
    evicted = [e["worker"] for e in cluster.events("evict")]
    assert "w0" not in evicted and evicted, evicted
    drops = cluster.events("deadline")
    assert drops and all("deadline (4.0 s) without its push" in d["reason"] for d in drops), drops
    said = attack.heard("push FAILED_PRECONDITION")
    assert any("no data in this push for 2 s (--push-idle; an empty chunk is no progress)" in d for d in said), said
    assert any("was evicted at round" in d and "rejoin" in d for d in said), said  # streams cancelled at eviction
    assert summary["longest_round_open_s"] < 4 + 2 + 2, summary  # the deadline, the reaper's tick, slack


def held(cluster: Cluster, name: str) -> list[tuple[float, str]]:
    """Each of `name`'s rounds held until its eviction at a deadline: the seconds from its entry (the
    `join` event) to the `deadline` event, and the eviction's reason."""
    entered, holds = None, []
    for event in cluster.events():
        if event.get("worker") != name:
            continue
        if event["event"] == "join":
            entered = event["elapsed_s"]
        elif event["event"] == "deadline" and entered is not None:
            holds.append((event["elapsed_s"] - entered, event["reason"]))
            entered = None
    return holds


def test_a_member_that_never_pushes_and_rejoins_gets_the_warm_up_once_and_backs_off(tmp_path: Path) -> None:
    """A member joins a running job, heartbeats, never pushes, and joins again as soon as it is evicted.
    Its name's first round holds for the warm-up bound (--round-warmup 4), and its eviction says so;
    back, its rounds hold for the round's deadline (1 s, the floor), and the evictions say 1.0 s; its
    joins in between are refused (RESOURCE_EXHAUSTED: join again in S s, doubling). The real worker
    is never evicted and trains on."""
    cluster = start_server(tmp_path, ["--workers", "1", "--max-workers", "2", *TINY, "--epochs", "1000",
                                      "--round-deadline-floor", "1", "--round-warmup", "4", "--evict-after", "30"])
    attack = RejoinLoop(cluster.target, "", name="x")
    try:
        worker = cluster.start_worker("w0", "--retry-for", "60")
        wait_for_round(cluster, 10)
        attack.start()
        started = time.monotonic()
        while len(held(cluster, "x")) < 4:
            assert time.monotonic() - started < 60, held(cluster, "x")
            time.sleep(0.2)
        rounds = wait_for_round(cluster, 0)
        wait_for_round(cluster, rounds + 5)  # w0 trains on
        assert worker.poll() is None, cluster.worker_log("w0")
    finally:
        attack.stop()
        cluster.stop()
    (first_s, first_why), *back = held(cluster, "x")
    assert 4 <= first_s < 4 + 2.5, first_s
    assert "deadline (4.0 s: its name's first round, the warm-up bound (--round-warmup)) without its push" \
        in first_why, first_why
    assert all(s < 3 and "deadline (1.0 s) without its push" in why for s, why in back), back
    waits = attack.heard("join RESOURCE_EXHAUSTED")
    assert waits and all("join again in" in w and "time(s) in a row without a push" in w for w in waits), waits
    assert {e["worker"] for e in cluster.events("evict")} == {"x"}


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
