"""Hostile messages: a Join flood, messages over the size limits, and requests that do not decode; each
is answered in time with its documented code and leaves the server as it was."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest
import torch

from protos import ps_pb2, ps_pb2_grpc
from ps.serving.server_options import GRPC_OPTIONS, MAX_MESSAGE_BYTES
from common.transport.wire import CHUNK_BYTES
from tests.conftest import InProcessServer
from tests.state_compare import assert_same
from tests.hostile_peer import (
    Answer, Code, INVALID, MiB, OK, PRECONDITION, PushSpec, SECRETS, TIMEOUT, ask, first_pulls, read_params, snapshot,
    start_server, stop_server, wait_until,
)


# --------------------------------------------------------------------------- Join flood
def test_join_flood_admits_exactly_the_expected_workers() -> None:
    """300 concurrent Joins (60 names, each 5 times) against a job for 4 workers with --max-workers 4:
    exactly 4 get in, every other one is refused quickly (job full or name taken), Status keeps
    answering throughout, and the 4 then run a round."""
    server = start_server("--workers", "4", "--max-workers", "4", "--global-batch", "32")
    try:
        stubs = [ps_pb2_grpc.ParameterServerStub(server.channel()) for _ in range(4)]
        names = [f"flood-{i % 60}" for i in range(300)]
        names = names[::2] + names[1::2]  # duplicates spread through the flood

        stop = threading.Event()
        status_calls: list[tuple[float, float]] = []  # (answered at, latency)
        status_errors: list[str] = []

        def poll_status() -> None:
            stub = ps_pb2_grpc.ParameterServerStub(server.channel())
            while not stop.is_set():
                t = time.monotonic()
                answer = ask(lambda: stub.Status(ps_pb2.StatusRequest(), timeout=5.0))
                if answer.code != OK:
                    status_errors.append(f"{answer.code.name}: {answer.details}")
                status_calls.append((time.monotonic(), time.monotonic() - t))
                time.sleep(0.005)

        poller = threading.Thread(target=poll_status, name="status-poller")
        poller.start()
        try:
            start = time.monotonic()
            done_at: dict[int, float] = {}
            calls = [stubs[i % 4].Join.future(ps_pb2.JoinRequest(name=n, cores=1.0), timeout=30.0) for i, n in enumerate(names)]
            for i, call in enumerate(calls):
                call.add_done_callback(lambda _, i=i: done_at.setdefault(i, time.monotonic()))
            answers = [ask(call.result) for call in calls]
            flood_s = max(done_at.values()) - start
        finally:
            stop.set()
            poller.join(10)

        admitted = {names[i]: a.value.worker_id for i, a in enumerate(answers) if a.code == OK}
        SECRETS.update((a.value.worker_id, a.value.secret) for a in answers if a.code == OK)
        refused = [(i, a) for i, a in enumerate(answers) if a.code != OK]
        assert len(admitted) == 4 and len(refused) == 296
        codes = {a.code for _, a in refused}
        assert codes <= {PRECONDITION, Code.ALREADY_EXISTS}, codes
        assert all("job full" in a.details for _, a in refused if a.code == PRECONDITION)
        assert all("already in the job" in a.details for _, a in refused if a.code == Code.ALREADY_EXISTS)
        assert max(done_at[i] - start for i, _ in refused) < 10.0, "refusals were not quick"
        assert flood_s < 15.0
        during = [latency for at, latency in status_calls if start < at < start + flood_s]
        assert during, "no Status call was answered while the Joins were in flight"
        assert not status_errors and max(latency for _, latency in status_calls) < 5.0, status_errors

        state = snapshot(server)
        assert {m["name"]: k for k, m in state["active"].items()} == admitted
        assert state["pending"] == {} and state["departed"] == {} and state["joined"] == 4  # refusals used no index
        assert sorted(state["status"]["workers"][i]["batch_size"] for i in range(4)) == [8, 8, 8, 8]

        grad = torch.full((server.coordinator.layout.numel,), 0.01)
        first_pulls(stubs[0], [a.value for a in answers if a.code == OK])
        specs = [PushSpec(wid, 0, 0, 8, 5.0, "float32", len(grad)) for wid in admitted.values()]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = [f.result(2 * TIMEOUT) for f in [pool.submit(lambda s=s: ask(lambda: read_params(stubs[0].Push(iter(s.chunks()), timeout=TIMEOUT)))) for s in specs]]
        assert all(a.code == OK and a.value[0].round == 1 for a in answers), answers
        assert server.call(lambda: server.coordinator.round) == 1
    finally:
        stop_server(server)


# ------------------------------------------------------------------- message size limits
def _chunk_of_size(header: ps_pb2.PushHeader | None, seq: int, size: int) -> ps_pb2.PushChunk:
    """A PushChunk whose serialized size is exactly `size` bytes (data length adjusted for the varint)."""
    chunk = ps_pb2.PushChunk(header=header, seq=seq, data=b"")
    data_len = size - chunk.ByteSize()
    while True:
        chunk.data = b"\x00" * data_len
        if chunk.ByteSize() == size:
            return chunk
        data_len -= chunk.ByteSize() - size


@pytest.fixture
def open_round():
    """A BSP job with workers a and b; a has pushed for round 0 (its call waits), b has not."""
    server = start_server("--global-batch", "32", "--lr", "0.1", "--momentum", "0")
    pool = concurrent.futures.ThreadPoolExecutor(4)
    try:
        stub = ps_pb2_grpc.ParameterServerStub(server.channel())
        joins = [pool.submit(lambda n=n: stub.Join(ps_pb2.JoinRequest(name=n, cores=1.0), timeout=TIMEOUT)) for n in "ab"]
        replies = [f.result(TIMEOUT) for f in joins]
        SECRETS.update((r.worker_id, r.secret) for r in replies)
        first_pulls(stub, replies)
        ids = dict(zip("ab", (r.worker_id for r in replies)))
        numel = server.coordinator.layout.numel
        pending = pool.submit(lambda: ask(lambda: read_params(stub.Push(iter(PushSpec(ids["a"], 0, 0, 16, 5.0, "float32", numel, seed=1).chunks()), timeout=3 * TIMEOUT))))
        wait_until(lambda: server.call(lambda: set(server.coordinator.bsp.pushed)) == {ids["a"]}, "a's push")
        yield server, stub, ids, numel, pending
    finally:
        stop_server(server)
        pool.shutdown(wait=True, cancel_futures=True)


def _finish_round(stub: Any, ids: dict[str, str], numel: int, pending: concurrent.futures.Future) -> None:
    """b's valid push closes round 0: both calls are answered with round 1."""
    b = ask(lambda: read_params(stub.Push(iter(PushSpec(ids["b"], 0, 0, 16, 5.0, "float32", numel, seed=2).chunks()), timeout=TIMEOUT)))
    a = pending.result(2 * TIMEOUT)
    assert a.code == b.code == OK and a.value[0].round == b.value[0].round == 1, (a, b)
    assert torch.equal(a.value[1], b.value[1])


def test_message_size_limits(open_round) -> None:
    """The limits on what a call may carry, and that going over them is refused without a trace:

    * one gRPC message is at most ``MAX_MESSAGE_BYTES`` = 8 MiB (its serialized size), each way
      (``ps/serving/server_options.py: GRPC_OPTIONS``); gRPC itself refuses a bigger one with RESOURCE_EXHAUSTED
      before any handler runs, whichever RPC and wherever in a stream it comes. A client using the
      same options refuses to send it in the first place (RESOURCE_EXHAUSTED, "CLIENT: ...").
    * a push or a parameter reply is any number of messages, each payload chunk about
      ``CHUNK_BYTES`` = 1 MiB, that must add up to exactly the layout's values (INVALID_ARGUMENT).
    * Join: name 1-128 characters, cores in (0, 1e6]; Push: batch size in [1, B], compute_ms in
      [0, 24 h] (INVALID_ARGUMENT).
    """
    server, stub, ids, numel, pending = open_round
    assert MAX_MESSAGE_BYTES == 8 * MiB and CHUNK_BYTES == MiB and ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES) in GRPC_OPTIONS
    # a client that does not enforce the limit itself, so the server's limit is what is tested
    loose = ps_pb2_grpc.ParameterServerStub(server.channel(options=[("grpc.max_send_message_length", -1)]))
    header = ps_pb2.PushHeader(worker_id=ids["b"], round=0, batch_size=16, compute_ms=5.0, wire_dtype="float32", num_values=numel,
                               secret=SECRETS[ids["b"]])

    def push(chunks: list[ps_pb2.PushChunk], via: Any = loose) -> Answer:
        return ask(lambda: read_params(via.Push(iter(chunks), timeout=TIMEOUT)))

    def refused(call: Callable[[], Answer], code: grpc.StatusCode, fragment: str) -> None:
        before = snapshot(server)
        answer = call()
        assert answer.code == code and fragment in answer.details, answer
        assert_same(before, snapshot(server))

    too_big = "Received message larger than max"
    # exactly at the limit the message reaches the handler (and is refused there: far too many values) ...
    refused(lambda: push([_chunk_of_size(header, 0, MAX_MESSAGE_BYTES)]), INVALID, "chunk 0")
    # ... one byte over, gRPC refuses it: as the first message, or later in the stream
    refused(lambda: push([_chunk_of_size(header, 0, MAX_MESSAGE_BYTES + 1)]), Code.RESOURCE_EXHAUSTED, too_big)
    refused(lambda: push([ps_pb2.PushChunk(header=header, seq=0, data=bytes(8)), _chunk_of_size(None, 1, 9 * MiB)]), Code.RESOURCE_EXHAUSTED, too_big)
    refused(lambda: ask(lambda: loose.Join(ps_pb2.JoinRequest(name="x" * (9 * MiB), cores=1.0), timeout=TIMEOUT)), Code.RESOURCE_EXHAUSTED, too_big)
    refused(lambda: ask(lambda: list(loose.Pull(ps_pb2.PullRequest(worker_id="x" * (9 * MiB)), timeout=TIMEOUT))), Code.RESOURCE_EXHAUSTED, too_big)
    # a client with the project's options does not send it at all
    refused(lambda: push([_chunk_of_size(header, 0, 9 * MiB)], via=stub), Code.RESOURCE_EXHAUSTED, "CLIENT: Sent message larger than max")
    # the server is unharmed: the round closes on exactly a's and b's valid pushes
    assert not pending.done()
    _finish_round(stub, ids, numel, pending)


# -------------------------------------------------------------------- undecodable bytes
def _raw(server: InProcessServer, method: str, streaming: bool) -> Callable[..., Any]:
    """A call that sends bytes as they are (no protobuf encoding on the client side)."""
    channel = server.channel()
    path = f"/hetero_ps.ParameterServer/{method}"
    if streaming:
        return channel.stream_stream(path, request_serializer=bytes, response_deserializer=bytes)
    return channel.unary_unary(path, request_serializer=bytes, response_deserializer=bytes)


def test_undecodable_push_chunks_are_invalid_argument(open_round) -> None:
    """Bytes that are not a PushChunk, first in the stream or after a valid header, are INVALID_ARGUMENT."""
    server, stub, ids, numel, pending = open_round
    raw_push = _raw(server, "Push", streaming=True)
    header = ps_pb2.PushHeader(worker_id=ids["b"], round=0, batch_size=16, compute_ms=5.0, wire_dtype="float32", num_values=numel,
                               secret=SECRETS[ids["b"]])
    good = ps_pb2.PushChunk(header=header, seq=0, data=bytes(16)).SerializeToString()
    for messages in ([b"\xff\xff\xff"], [good, b"\x0a\x05\xff"], [good, b"\x1a\xff\xff\xff\xff\x0f"]):
        before = snapshot(server)
        answer = ask(lambda messages=messages: list(raw_push(iter(messages), timeout=TIMEOUT)))
        assert answer.code == INVALID and "not a valid" in answer.details, answer
        assert_same(before, snapshot(server))
    _finish_round(stub, ids, numel, pending)


UNARY_GARBAGE = [("Join", b"\x0a\x02\xff\xfe"), ("Pull", b"\xff\xff\xff"), ("Leave", b"\x0a\x01\x80"), ("Heartbeat", b"\x08")]


@pytest.mark.parametrize(("method", "garbage"), UNARY_GARBAGE, ids=[m for m, _ in UNARY_GARBAGE])
def test_undecodable_unary_request_is_invalid_argument(open_round, method: str, garbage: bytes) -> None:
    """An undecodable unary request is INVALID_ARGUMENT (not grpc's UNKNOWN) and changes nothing."""
    server, stub, ids, numel, pending = open_round
    before = snapshot(server)
    answer = ask(lambda: _raw(server, method, streaming=False)(garbage, timeout=TIMEOUT))
    assert answer.code == INVALID, answer
    assert "not a valid" in answer.details, answer
    assert_same(before, snapshot(server))
    _finish_round(stub, ids, numel, pending)
