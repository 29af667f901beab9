"""Progress, not only liveness, with a real ps-server: a member whose push stalls while its heartbeat
goes on is evicted at the round's deadline and the job finishes without it; a second push in flight is
refused at once and the first goes on; a worker that joined waits at most --join-wait for the start;
in ASP with --staleness-bound one push waits for its reply at a time, and a worker that holds the
others back without pushing is evicted at the deadline; calls beyond --max-concurrent-rpcs are
refused at once. The deadline's arithmetic is checked pure."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
import torch

from common.transport.messages import PushMeta, PushTimes
from common.transport.wire import ChunkReceiver
from ps.rounds.deadlines import MIN_ROUNDS, ROUND_FACTOR, WARMUP_S, Limits, RoundTimes
from ps.rounds.inflight import PushesInFlight
from protos import ps_pb2, ps_pb2_grpc
from tests.processes import Cluster, start_server
from worker.transport.client import PSClient, ServerError

TINY = ["--model-arg", "hidden=8", "--dataset", "digits", "--global-batch", "64", "--lr", "0.1",
        "--dynamic-start", "uniform"]  # equal halves: a real worker declares its machine's CPUs, a raw one 1


def join_all(cluster: Cluster, names: list[str]) -> tuple[list[PSClient], dict[str, object]]:
    """Join `names` at once (the job starts when all are in); their clients and Joined replies."""
    clients = [PSClient(cluster.target) for _ in names]
    joined: dict[str, object] = {}
    threads = [threading.Thread(target=lambda c=c, n=n: joined.__setitem__(n, c.join(n, 1.0, timeout=60)))
               for c, n in zip(clients, names)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(joined) == set(names), joined
    return clients, joined


def header(client: PSClient, worker_id: str, plan: object, numel: int) -> ps_pb2.PushHeader:
    return ps_pb2.PushHeader(worker_id=worker_id, round=plan.round, version=plan.version, batch_size=plan.batch_size,
                             compute_ms=1.0, wire_dtype="float32", num_values=numel, secret=client.secret(worker_id))


def held_stream(head: ps_pb2.PushHeader, numel: int, go: threading.Event) -> Iterator[ps_pb2.PushChunk]:
    """A push that sends its header, then its values only once `go` is set."""
    yield ps_pb2.PushChunk(header=head, seq=0)
    go.wait()
    yield ps_pb2.PushChunk(seq=1, data=torch.zeros(numel).numpy().tobytes())


def beat_until(client: PSClient, worker_id: str, stop: threading.Event, errors: list[ServerError]) -> threading.Thread:
    def run() -> None:
        while not stop.wait(0.3):
            try:
                client.heartbeat(worker_id)
            except ServerError as exc:
                errors.append(exc)
                return
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_header_only_push_is_evicted_at_the_round_deadline_and_the_job_finishes(tmp_path: Path) -> None:
    """w0 is a real worker; b joins, sends only a push header and keeps heartbeating. At the round's
    deadline b is evicted (its heartbeat then hears so), the round closes over w0's push, and w0
    finishes the job alone; b's stalled stream was dropped before, by --push-idle."""
    cluster = start_server(tmp_path, ["--workers", "2", *TINY, "--epochs", "2", "--round-deadline", "3",
                                      "--push-idle", "1", "--evict-after", "30", "--grace", "2"])
    raw = PSClient(cluster.target)
    stop, errors = threading.Event(), []
    try:
        worker = cluster.start_worker("w0", "--retry-for", "30", "--slowdown", "30")  # a few seconds alone after b goes
        b = raw.join("b", 1.0, timeout=60)
        beat_until(raw, b.worker_id, stop, errors)
        plan = raw.pull(b.worker_id, torch.empty(b.layout.numel), header_only=True)
        stub = ps_pb2_grpc.ParameterServerStub(grpc.insecure_channel(cluster.target))
        sent = time.monotonic()
        never = threading.Event()
        call = stub.Push(held_stream(header(raw, b.worker_id, plan, b.layout.numel), b.layout.numel, never), timeout=60)
        with pytest.raises(grpc.RpcError) as dropped:
            list(call)
        held_s = time.monotonic() - sent
        assert dropped.value.code() == grpc.StatusCode.FAILED_PRECONDITION, dropped.value
        assert "--push-idle" in dropped.value.details(), dropped.value.details()
        assert cluster.wait(120) == 0, cluster.server_log()
        assert worker.wait(30) == 0, cluster.worker_log("w0")
        (drop,) = cluster.events("deadline")
        assert drop["worker"] == "b" and drop["round"] == plan.round and "deadline" in drop["reason"], drop
        assert [e["worker"] for e in cluster.events("evict")] == ["b"]
        assert errors and errors[0].code == "FAILED_PRECONDITION" and "rejoin" in errors[0].message, errors
        (summary,) = cluster.events("summary")
        assert summary["reason"] == "finished" and summary["deadline_drops"] == 1, summary
        # the round b was dropped from closed over w0's 32 samples; every other round had B = 64
        assert [(e["round"], e["batch"]) for e in cluster.events("short_round")] == [(plan.round, 32)]
        assert summary["short_rounds"] == 1 and summary["rounds_closed"] == summary["rounds"], summary
        assert held_s < 1 + 2, held_s  # the idle limit
    finally:
        stop.set()
        raw.close()
        cluster.stop()


def test_a_second_push_in_flight_is_refused_at_once_and_the_first_goes_on(tmp_path: Path) -> None:
    cluster = start_server(tmp_path, ["--workers", "2", *TINY, "--epochs", "100", "--grace", "1"])
    try:
        (ca, cb), joined = join_all(cluster, ["a", "b"])
        a, b = joined["a"], joined["b"]
        numel = a.layout.numel
        plan = ca.pull(a.worker_id, torch.empty(numel), header_only=True)
        stub = ps_pb2_grpc.ParameterServerStub(grpc.insecure_channel(cluster.target))
        go = threading.Event()
        replies: list[object] = []
        first_call = stub.Push(held_stream(header(ca, a.worker_id, plan, numel), numel, go), timeout=60)
        reader = threading.Thread(target=lambda: replies.append(list(first_call)), daemon=True)
        reader.start()
        time.sleep(0.5)  # the first push's header is in
        started = time.monotonic()
        with pytest.raises(ServerError) as second:
            ca.push(PushMeta(a.worker_id, plan.round, plan.version, plan.batch_size, PushTimes(1.0), "float32"),
                    torch.zeros(numel), torch.empty(numel))
        assert time.monotonic() - started < 5
        assert second.value.code == "FAILED_PRECONDITION" and "already has a push in flight" in second.value.message
        go.set()  # the first push sends its values; b's push closes the round and both are answered
        bplan = cb.pull(b.worker_id, torch.empty(numel), header_only=True)
        reply = cb.push(PushMeta(b.worker_id, bplan.round, bplan.version, bplan.batch_size, PushTimes(1.0), "float32"),
                        torch.zeros(numel), torch.empty(numel))
        reader.join(30)
        assert reply.round == plan.round + 1 and replies and replies[0][0].header.round == plan.round + 1, replies
    finally:
        cluster.stop()


def test_a_worker_waiting_for_the_start_is_turned_away_after_join_wait(tmp_path: Path) -> None:
    cluster = start_server(tmp_path, ["--workers", "2", *TINY, "--epochs", "1", "--join-wait", "2", "--grace", "1"])
    client = PSClient(cluster.target)
    try:
        started = time.monotonic()
        with pytest.raises(ServerError) as refused:
            client.join("early", 1.0, timeout=30)
        waited = time.monotonic() - started
        assert refused.value.code == "FAILED_PRECONDITION" and "--join-wait" in refused.value.message, refused.value
        assert 2 <= waited < 6, waited
        (event,) = cluster.events("join_wait")
        assert event["worker"] == "early"
        # its slot and name are free again: two workers that come together start the job
        clients, joined = join_all(cluster, ["early", "other"])
        assert {j.batch_size for j in joined.values()} == {32}
    finally:
        client.close()
        cluster.stop()


def test_calls_beyond_the_concurrent_rpc_cap_are_refused_at_once_and_the_held_ones_go_on(tmp_path: Path) -> None:
    """--max-concurrent-rpcs 2: two Joins wait for the start (--workers 3); a third call at the same
    time is RESOURCE_EXHAUSTED at once, and once a call ends the server takes calls again."""
    cluster = start_server(tmp_path, ["--workers", "3", *TINY, "--epochs", "1", "--max-concurrent-rpcs", "2",
                                      "--join-wait", "30", "--grace", "1"])
    clients = [PSClient(cluster.target) for _ in range(3)]
    outcomes: dict[str, object] = {}

    def join(client: PSClient, name: str) -> None:
        try:
            outcomes[name] = client.join(name, 1.0, timeout=60)
        except ServerError as exc:
            outcomes[name] = exc

    held = [threading.Thread(target=join, args=(c, n)) for c, n in zip(clients, ("a", "b"))]
    try:
        for t in held:
            t.start()
        time.sleep(2.0)  # no probe while the Joins arrive: a probe beside them would take one of the two places
        deadline = time.monotonic() + 30
        while True:  # a probe is served until both Joins are in and held
            try:
                clients[2].status()
            except ServerError as exc:
                assert exc.code == "RESOURCE_EXHAUSTED", exc
                break
            assert time.monotonic() < deadline, cluster.server_log()
            time.sleep(0.5)
        assert not outcomes, outcomes
        started = time.monotonic()
        with pytest.raises(ServerError) as refused:
            clients[2].join("c", 1.0, timeout=30)
        assert refused.value.code == "RESOURCE_EXHAUSTED", refused.value
        assert time.monotonic() - started < 5 and not outcomes  # at once; the held Joins still wait
        clients[0].close()  # a held call ends: the cap has room again
        for t in held[:1]:
            t.join(30)
        assert isinstance(outcomes.get("a"), ServerError)
        deadline = time.monotonic() + 30
        while True:  # the server frees the slot once it sees the cancellation
            try:
                assert clients[2].status().round == 0
                break
            except ServerError as exc:
                assert exc.code == "RESOURCE_EXHAUSTED" and time.monotonic() < deadline, exc
                time.sleep(0.1)
    finally:
        for c in clients:
            c.close()
        for t in held:
            t.join(30)
        cluster.stop()


def test_asp_one_held_reply_per_worker_and_the_slowest_evicted_at_the_deadline(tmp_path: Path) -> None:
    """--staleness-bound 0: a's first update is applied and its reply held for b; a second push of a's
    meanwhile is refused (the first stays held, and is answered). b, which holds a back and never
    pushes, is evicted at the deadline, which lets a's reply go."""
    cluster = start_server(tmp_path, ["--mode", "asp", "--workers", "2", *TINY, "--epochs", "100",
                                      "--staleness-bound", "0", "--round-deadline", "3", "--evict-after", "30"])
    stop, errors = threading.Event(), []
    try:
        (ca, cb), joined = join_all(cluster, ["a", "b"])
        a, b = joined["a"], joined["b"]
        beat_until(cb, b.worker_id, stop, errors)
        numel = a.layout.numel
        ca.pull(a.worker_id, torch.empty(numel), header_only=True)  # a worker pulls before its first push
        step = PushMeta(a.worker_id, 0, a.version, a.batch_size, PushTimes(1.0), "float32")
        pending = ca.start_push(step, torch.zeros(numel), torch.empty(numel))
        time.sleep(1.0)
        started = time.monotonic()
        with pytest.raises(ServerError) as second:
            ca.push(replace(step, version=a.version + 1), torch.zeros(numel), torch.empty(numel))
        assert time.monotonic() - started < 2
        assert second.value.code == "FAILED_PRECONDITION", second.value
        reply = pending()  # answered once b is evicted at the deadline
        waited = time.monotonic() - started
        assert reply.version == a.version + 1, reply  # a's first update only
        assert 1 < waited < 3 + 3, waited
        assert [e["worker"] for e in cluster.events("deadline")] == ["b"]
        deadline = time.monotonic() + 5
        while not errors and time.monotonic() < deadline:
            time.sleep(0.1)
        assert errors and "rejoin" in errors[0].message, errors
    finally:
        stop.set()
        cluster.stop()


def test_the_auto_deadline_is_k_times_the_median_round_with_a_floor_and_a_warmup() -> None:
    times = RoundTimes(Limits(floor_s=2.0))
    assert times.deadline() == max(2.0, WARMUP_S)
    for _ in range(MIN_ROUNDS):
        times.observe(0.1)
    assert times.deadline() == 2.0  # the floor
    for _ in range(MIN_ROUNDS + 1):
        times.observe(3.0)
    assert times.deadline() == ROUND_FACTOR * 3.0  # the median of 0.1 x3, 3.0 x4
    assert times.deadline(predicted_s=10.0) == ROUND_FACTOR * 10.0  # the policy's prediction, when larger
    assert RoundTimes(Limits(round_deadline="off")).deadline() is None
    assert RoundTimes(Limits(round_deadline=7.5)).deadline() == 7.5
    with pytest.raises(ValueError):
        Limits(round_deadline="soon")


def test_pushes_beyond_the_bytes_cap_wait_until_one_arrived_whole() -> None:
    async def run() -> list[str]:
        pushes = PushesInFlight(limit_bytes=400)
        order: list[str] = []

        def begin(meta: PushMeta) -> ChunkReceiver:
            return ChunkReceiver(meta.num_values, meta.wire_dtype)

        slots = {}
        for name in ("a", "b", "c"):
            slots[name] = pushes.slot(begin)
            slots[name].begin(PushMeta(name, 0, 0, 1, 1.0, "float32", 60))  # 240 bytes each

        async def stream(name: str) -> None:
            await slots[name].admit()
            assert pushes.bytes <= 400
            order.append(f"{name} admitted")
            await asyncio.sleep(0.05)
            slots[name].received()
            slots[name].close()

        await asyncio.gather(*(stream(n) for n in ("a", "b", "c")))
        assert pushes.bytes == 0 and not pushes.workers
        return order

    order = asyncio.run(run())
    assert order == ["a admitted", "b admitted", "c admitted"]
