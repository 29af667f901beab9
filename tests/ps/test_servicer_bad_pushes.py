"""Bad pushes against an in-process server, BSP and ASP: every one refused without a trace.

Each refusal asserts the status code, that the message says what was expected, and that the server's
state (parameters, optimizer, round/version/epoch/samples, controller, accumulator, members) is
exactly what it was before the call.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable
from typing import Any

import grpc
import pytest
import torch

from protos import ps_pb2
from common.transport.wire import encode
from tests.rpc_calls import (
    Cluster, Code, OpenRound, SECRETS, TIMEOUT, expect_refused, header, open_round, planned, pull, push, push_chunks,
    rand, start_cluster,
)


# ---------------------------------------------------------- bad pushes (BSP)
def _bad(name: str, build: Callable[[Cluster], list[ps_pb2.PushChunk]], code: grpc.StatusCode, *fragments: str):
    return pytest.param(build, code, fragments, id=name)


def _grad(c: Cluster) -> torch.Tensor:
    return rand(c.numel, seed=9)


def _with(c: Cluster, values: torch.Tensor | None = None, wire: str = "float32", **fields: Any) -> list[ps_pb2.PushChunk]:
    """A push as b: its planned batch, unless `fields` say otherwise."""
    values = _grad(c) if values is None else values
    fields.setdefault("batch_size", planned(c, "b"))
    fields.setdefault("num_values", c.numel)
    fields.setdefault("wire_dtype", wire)
    return push_chunks(header(c.ids["b"], values, **fields), values, wire)


def _nonfinite(c: Cluster, bad: float, wire: str = "float32") -> list[ps_pb2.PushChunk]:
    values = _grad(c)
    values[c.numel // 2] = bad
    return _with(c, values, wire)


def _reordered(c: Cluster) -> list[ps_pb2.PushChunk]:
    chunks = _with(c)
    assert len(chunks) >= 3
    return [chunks[0], chunks[2], chunks[1], *chunks[3:]]


def _headerless(c: Cluster) -> list[ps_pb2.PushChunk]:
    chunks = _with(c)
    chunks[0].ClearField("header")
    return chunks


def _second_header(c: Cluster) -> list[ps_pb2.PushChunk]:
    chunks = _with(c)
    chunks[1].header.CopyFrom(chunks[0].header)
    return chunks


def _odd_bytes(c: Cluster) -> list[ps_pb2.PushChunk]:
    chunks = _with(c)
    chunks[1].data = chunks[1].data + b"\x00\x00\x00"
    return chunks


def _extra_chunk(c: Cluster) -> list[ps_pb2.PushChunk]:
    chunks = _with(c)
    return [*chunks, ps_pb2.PushChunk(seq=len(chunks), data=bytes(encode(torch.ones(1))))]


def _offset_not_its_place(c: Cluster) -> list[ps_pb2.PushChunk]:
    """A push in order (no offsets) whose second chunk says it starts one chunk later than it does."""
    chunks = _with(c)
    chunks[1].offset = 2 * 256  # 1024-byte chunks: chunk 1 starts at value 256
    return chunks


def _data_wait_over_compute_in_end(c: Cluster) -> list[ps_pb2.PushChunk]:
    """A sound header, then a PushEnd whose data wait exceeds its compute: refused after the header was taken."""
    chunks = _with(c)
    chunks[-1].end.CopyFrom(ps_pb2.PushEnd(compute_ms=5.0, data_wait_ms=5.5))
    return chunks


BAD_PUSHES = [
    _bad("unknown-worker", lambda c: push_chunks(header("ghost-00000000", c.numel), _grad(c)), Code.NOT_FOUND, "unknown worker id 'ghost-00000000'", "Join first"),
    _bad("empty-worker-id", lambda c: push_chunks(header("", c.numel), _grad(c)), Code.NOT_FOUND, "unknown worker id ''"),
    _bad("future-round", lambda c: _with(c, round=1), Code.FAILED_PRECONDITION, "round 1 is not open; the open round is 0"),
    _bad("negative-round", lambda c: _with(c, round=-1), Code.FAILED_PRECONDITION, "round -1 is not open; the open round is 0"),
    _bad(
        "duplicate-push",
        lambda c: push_chunks(header(c.ids["a"], _grad(c)), _grad(c)),
        Code.FAILED_PRECONDITION, "already pushed for round 0",
    ),
    _bad("num-values-short", lambda c: _with(c, _grad(c)[:-1], num_values=c.numel - 1), Code.INVALID_ARGUMENT, "buffer has {n-1} values, the layout expects {n}"),
    _bad("num-values-long", lambda c: _with(c, torch.cat([_grad(c), torch.ones(1)]), num_values=c.numel + 1), Code.INVALID_ARGUMENT, "buffer has {n+1} values, the layout expects {n}"),
    _bad("num-values-zero", lambda c: _with(c, torch.empty(0), num_values=0), Code.INVALID_ARGUMENT, "buffer has 0 values, the layout expects {n}"),
    _bad("stream-too-short", lambda c: _with(c, _grad(c)[:-1]), Code.INVALID_ARGUMENT, "too little data: got {n-1} of {n} values"),
    _bad("stream-empty-payload", lambda c: _with(c, torch.empty(0)), Code.INVALID_ARGUMENT, "too little data: got 0 of {n} values"),
    _bad("stream-too-long", lambda c: _with(c, torch.cat([_grad(c), torch.ones(3)])), Code.INVALID_ARGUMENT, "too much data", "overruns the {n} expected values"),
    _bad("extra-chunk", _extra_chunk, Code.INVALID_ARGUMENT, "too much data"),
    _bad("in-order-chunk-offset-not-its-place", _offset_not_its_place, Code.INVALID_ARGUMENT,
         "chunk 1 says offset 512, where this push (without offsets: in order) is at value 256"),
    _bad("chunk-out-of-order", _reordered, Code.INVALID_ARGUMENT, "chunk out of order: expected seq 1, got 2"),
    _bad("first-chunk-without-header", _headerless, Code.INVALID_ARGUMENT, "the first push chunk must carry the header"),
    _bad("empty-stream", lambda c: [], Code.INVALID_ARGUMENT, "the first push chunk must carry the header"),
    _bad("second-header", _second_header, Code.INVALID_ARGUMENT, "chunk 1 carries a second header"),
    _bad("bytes-not-multiple-of-item", _odd_bytes, Code.INVALID_ARGUMENT, "not a multiple of 4 (float32)"),
    _bad("nan", lambda c: _nonfinite(c, math.nan), Code.INVALID_ARGUMENT, "NaN or Inf"),
    _bad("inf", lambda c: _nonfinite(c, math.inf), Code.INVALID_ARGUMENT, "NaN or Inf"),
    _bad("minus-inf", lambda c: _nonfinite(c, -math.inf), Code.INVALID_ARGUMENT, "NaN or Inf"),
    _bad("nan-bfloat16", lambda c: _nonfinite(c, math.nan, "bfloat16"), Code.INVALID_ARGUMENT, "NaN or Inf"),
    _bad("inf-float16", lambda c: _nonfinite(c, math.inf, "float16"), Code.INVALID_ARGUMENT, "NaN or Inf"),
    _bad("batch-zero", lambda c: _with(c, batch_size=0), Code.INVALID_ARGUMENT, "batch size must be > 0, got 0"),
    _bad("batch-negative", lambda c: _with(c, batch_size=-5), Code.INVALID_ARGUMENT, "batch size must be > 0, got -5"),
    _bad("batch-huge", lambda c: _with(c, batch_size=2**31 - 1), Code.INVALID_ARGUMENT, f"batch size {2**31 - 1} exceeds the global batch 32"),
    _bad("batch-over-global", lambda c: _with(c, batch_size=33), Code.INVALID_ARGUMENT, "batch size 33 exceeds the global batch 32"),
    _bad("batch-not-planned", lambda c: _with(c, batch_size=planned(c, "b") - 1), Code.FAILED_PRECONDITION,
         "is not what this server planned for worker b", "pull the plan"),
    _bad("no-secret", lambda c: _with(c, secret=""), Code.UNAUTHENTICATED, "must carry the secret its Join returned"),
    _bad("another-workers-secret", lambda c: _with(c, secret=SECRETS[c.ids["a"]]), Code.PERMISSION_DENIED,
         "wrong secret for worker"),
    _bad("made-up-secret", lambda c: _with(c, secret="0" * 64), Code.PERMISSION_DENIED, "wrong secret for worker"),
    _bad("compute-negative", lambda c: _with(c, compute_ms=-1.0), Code.INVALID_ARGUMENT, "compute_ms must be finite and in [0,", "got -1.0"),
    _bad("compute-nan", lambda c: _with(c, compute_ms=math.nan), Code.INVALID_ARGUMENT, "compute_ms must be finite", "got nan"),
    _bad("compute-inf", lambda c: _with(c, compute_ms=math.inf), Code.INVALID_ARGUMENT, "compute_ms must be finite", "got inf"),
    _bad("compute-absurd", lambda c: _with(c, compute_ms=1e12), Code.INVALID_ARGUMENT, "compute_ms must be finite and in [0, 86400000]"),
    _bad("data-wait-over-compute", lambda c: _with(c, compute_ms=5.0, data_wait_ms=6.0), Code.INVALID_ARGUMENT,
         "data_wait_ms 6.0 exceeds compute_ms 5.0", "part of the step's compute"),
    _bad("data-wait-over-compute-in-end", _data_wait_over_compute_in_end, Code.INVALID_ARGUMENT,
         "data_wait_ms 5.5 exceeds compute_ms 5.0"),
    _bad("values-local-sq-norm-negative", lambda c: _with(c, local_sq_norm=-1.0), Code.INVALID_ARGUMENT,
         "a push's local_sq_norm must be finite and >= 0 (0: not measured), got -1.0"),
    _bad("values-global-sq-norm-nan", lambda c: _with(c, global_sq_norm=math.nan), Code.INVALID_ARGUMENT,
         "a push's global_sq_norm must be finite and >= 0", "got nan"),
    _bad("own-exposed-over-exposed", lambda c: _with(c, exposed_ms=2.0, own_exposed_ms=3.0), Code.INVALID_ARGUMENT,
         "own_exposed_ms 3.0 exceeds exposed_ms 2.0", "at most exposed_ms"),
    _bad("wire-dtype-unknown", lambda c: _with(c, wire_dtype="int8"), Code.INVALID_ARGUMENT, "wire dtype must be one of ['bfloat16', 'float16', 'float32'], got 'int8'"),
    _bad("wire-dtype-empty", lambda c: _with(c, wire_dtype=""), Code.INVALID_ARGUMENT, "wire dtype must be one of", "got ''"),
    _bad(
        "wire-dtype-mismatch",  # declared fp16 but the bytes are fp32: twice the values
        lambda c: push_chunks(header(c.ids["b"], c.numel, wire_dtype="float16", batch_size=planned(c, "b")), _grad(c), "float32"),
        Code.INVALID_ARGUMENT, "too much data",
    ),
]


@pytest.mark.parametrize(("build", "code", "fragments"), BAD_PUSHES)
def test_bsp_bad_push_is_refused_without_a_trace(open_round: OpenRound, build, code, fragments) -> None:
    c = open_round
    chunks = build(c)
    expect_refused(c.server, lambda: push(c.stub, chunks), code, *_fill(fragments, c.numel))
    assert not c.pending_a.done()
    c.finish_round()  # the round still closes on exactly a's and b's valid gradients


def _fill(fragments: Iterable[str], n: int) -> list[str]:
    return [f.replace("{n-1}", str(n - 1)).replace("{n+1}", str(n + 1)).replace("{n}", str(n)) for f in fragments]


ASP_BAD_PUSHES = [p for p in BAD_PUSHES if p.id not in {"future-round", "negative-round", "duplicate-push"}]


@pytest.mark.parametrize(("build", "code", "fragments"), ASP_BAD_PUSHES)
def test_asp_bad_push_is_refused_without_a_trace(ps_server, threads, build, code, fragments) -> None:
    c = start_cluster(ps_server, threads, "--mode", "asp", "--global-batch", "32")
    delta = rand(c.numel, seed=10)
    push(c.stub, push_chunks(header(c.ids["a"], delta), delta))  # some state to keep: version 1, a staleness record
    expect_refused(c.server, lambda: push(c.stub, build(c)), code, *_fill(fragments, c.numel))
    h, params = push(c.stub, push_chunks(header(c.ids["b"], delta, version=0), delta))  # b was told version 0
    assert h.version == 2 and torch.equal(params, c.theta0 + delta + delta)


@pytest.mark.parametrize("mode", ["bsp", "asp"])
def test_a_push_before_the_workers_first_pull_is_refused_without_a_trace(ps_server, threads, mode: str) -> None:
    """A client written from the .proto that pushes right after Join, skipping the Pull: refused
    (FAILED_PRECONDITION naming the rule), no slice of the epoch handed or counted; after its Pull the
    same push is taken."""
    server = ps_server("--mode", mode, "--global-batch", "32", "--lr", "0.1", "--momentum", "0", "--controller", "static")
    stub = server.stub()
    futures = {n: threads.submit(lambda n=n: stub.Join(ps_pb2.JoinRequest(name=n, cores=1.0), timeout=TIMEOUT))
               for n in "ab"}
    joins = {n: f.result(TIMEOUT) for n, f in futures.items()}
    SECRETS.update((j.worker_id, j.secret) for j in joins.values())
    grad = rand(server.coordinator.layout.numel, seed=3)

    def pushed(name: str) -> tuple[ps_pb2.ParamsHeader, torch.Tensor]:
        return push(stub, push_chunks(header(joins[name].worker_id, grad, batch_size=joins[name].batch_size), grad))

    def slices() -> tuple[object, ...]:
        s = server.coordinator.sampling.slices
        return copy.deepcopy(s.held), list(s.returned), s.epoch, s.cursor, s.completed

    before = server.call(slices)
    expect_refused(server, lambda: pushed("b"), Code.FAILED_PRECONDITION, "worker b pushed before its first Pull",
                   "after Join a worker Pulls the parameters")
    assert server.call(slices) == before
    for j in joins.values():
        pull(stub, j.worker_id)
    if mode == "asp":
        assert pushed("b")[0].version == 1
        return
    pending = threads.submit(pushed, "a")
    assert pushed("b")[0].round == pending.result(TIMEOUT)[0].round == 1
