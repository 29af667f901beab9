"""gRPC stub tests against an in-process server: every RPC, and every bad input refused without a trace.

Each refusal asserts the status code, that the message says what was expected, and that the server's
state (parameters, optimizer, round/version/epoch/samples, controller, accumulator, members) is
exactly what it was before the call.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import grpc
import pytest
import torch
import torch.nn.functional as F

from protos import ps_pb2, ps_pb2_grpc
from common.job.datasets import build_dataset
from common.job.models import build_model
from common.job.spec import JobSpec
from common.transport.layout import Layout, flatten_grads, flatten_params
from common.transport.wire import CHUNK_BYTES, FlatReceiver, encode, split
from tests.state_compare import assert_same, server_state

if TYPE_CHECKING:
    from tests.conftest import InProcessServer

TIMEOUT = 20.0
Code = grpc.StatusCode


# ---------------------------------------------------------------------- helpers
SECRETS: dict[str, str] = {}
"""Worker id -> the secret its Join returned: the helpers send it with every call naming that id, as
worker.client.PSClient does (ids are unique: each carries random digits)."""


def join(stub: Any, name: str, cores: float = 1.0, timeout: float = TIMEOUT) -> ps_pb2.JoinReply:
    reply = stub.Join(ps_pb2.JoinRequest(name=name, cores=cores), timeout=timeout)
    SECRETS[reply.worker_id] = reply.secret
    return reply


def leave(stub: Any, worker_id: str) -> ps_pb2.LeaveReply:
    return stub.Leave(ps_pb2.LeaveRequest(worker_id=worker_id, secret=SECRETS.get(worker_id, "")), timeout=TIMEOUT)


def join_all(server: InProcessServer, threads: concurrent.futures.Executor, workers: dict[str, float]) -> dict[str, ps_pb2.JoinReply]:
    """Join every worker from its own thread (Join blocks until all expected workers are in)."""
    futures = {name: threads.submit(join, server.stub(), name, cores) for name, cores in workers.items()}
    return {name: f.result(TIMEOUT) for name, f in futures.items()}


def push_chunks(
    header: ps_pb2.PushHeader | None, values: torch.Tensor, wire_dtype: str = "float32", chunk_bytes: int = 1024
) -> list[ps_pb2.PushChunk]:
    """A well-formed chunk stream: header on chunk 0, seq 0, 1, 2, ... (small chunks: several per push)."""
    parts = split(encode(values, wire_dtype), chunk_bytes)
    return [ps_pb2.PushChunk(header=header if i == 0 else None, seq=i, data=p) for i, p in enumerate(parts)]


def header(worker_id: str, values: torch.Tensor | int, **fields: Any) -> ps_pb2.PushHeader:
    num_values = values if isinstance(values, int) else values.numel()
    base: dict[str, Any] = {
        "worker_id": worker_id, "round": 0, "version": 0, "batch_size": 16,
        "compute_ms": 5.0, "wire_dtype": "float32", "num_values": num_values, "secret": SECRETS.get(worker_id, ""),
    }
    return ps_pb2.PushHeader(**(base | fields))


def read_params(stream: Iterable[ps_pb2.ParamsChunk]) -> tuple[ps_pb2.ParamsHeader, torch.Tensor]:
    """Decode a parameter stream (header first) into (header, fp32 tensor), checking the chunking."""
    messages = list(stream)
    assert messages and messages[0].HasField("header")
    assert not any(m.HasField("header") for m in messages[1:])
    assert all(len(m.data) <= CHUNK_BYTES for m in messages)
    h = messages[0].header
    receiver = FlatReceiver(torch.empty(h.num_values), h.num_values, h.wire_dtype)
    for m in messages:
        receiver.feed(m.seq, m.data)
    return h, receiver.finish()


def push(stub: Any, chunks: list[ps_pb2.PushChunk], timeout: float = TIMEOUT) -> tuple[ps_pb2.ParamsHeader, torch.Tensor]:
    return read_params(stub.Push(iter(chunks), timeout=timeout))


def pull(stub: Any, worker_id: str) -> tuple[ps_pb2.ParamsHeader, torch.Tensor]:
    return read_params(stub.Pull(ps_pb2.PullRequest(worker_id=worker_id, secret=SECRETS.get(worker_id, "")), timeout=TIMEOUT))


def expect_error(call: Callable[[], Any], code: grpc.StatusCode, *fragments: str) -> str:
    """Run call; it must fail with `code` and a message containing every fragment."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    err = info.value
    assert err.code() == code, f"{err.code()}: {err.details()}"
    for fragment in fragments:
        assert fragment in err.details(), f"{fragment!r} not in {err.details()!r}"
    return err.details()


def snapshot(server: InProcessServer) -> dict[str, Any]:
    """Everything a refused request must leave alone (tests/state_compare.py), copied on the server's loop."""
    return server.call(lambda: server_state(server.coordinator))


def expect_refused(server: InProcessServer, call: Callable[[], Any], code: grpc.StatusCode, *fragments: str) -> str:
    """expect_error, and the server state is exactly what it was before."""
    before = snapshot(server)
    details = expect_error(call, code, *fragments)
    assert_same(before, snapshot(server))
    return details


def sgd_step(theta: torch.Tensor, grads_and_batches: list[tuple[torch.Tensor, int]], lr: float) -> torch.Tensor:
    """θ - lr · Σ b_k g_k / Σ b_k (SGD without weight decay; first step, so momentum adds nothing)."""
    total = torch.zeros_like(theta)
    for g, b in grads_and_batches:
        total.add_(g, alpha=float(b))
    total.div_(sum(b for _, b in grads_and_batches))
    return theta - lr * total


def rand(n: int, seed: int, scale: float = 0.01) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)) * scale


# ------------------------------------------------------------------- fixtures
@dataclasses.dataclass
class Cluster:
    server: InProcessServer
    stub: Any
    ids: dict[str, str]
    joins: dict[str, ps_pb2.JoinReply]
    numel: int
    theta0: torch.Tensor


def start_cluster(ps_server: Callable[..., InProcessServer], threads: concurrent.futures.Executor, *argv: str, cores: dict[str, float] | None = None) -> Cluster:
    server = ps_server(*argv)
    joins = join_all(server, threads, cores or {"a": 1.0, "b": 1.0})
    return Cluster(
        server,
        server.stub(),
        {name: r.worker_id for name, r in joins.items()},
        joins,
        server.coordinator.layout.numel,
        server.call(lambda: server.coordinator.store.flat.clone()),
    )


@dataclasses.dataclass
class OpenRound(Cluster):
    """A BSP round 0 in which worker a has pushed (its call still waiting) and b has not."""

    grad_a: torch.Tensor
    pending_a: concurrent.futures.Future

    def finish_round(self) -> None:
        """b pushes a valid gradient; both calls return the step of exactly a's and b's gradients."""
        grad_b = rand(self.numel, seed=2)
        hb, params_b = push(self.stub, push_chunks(header(self.ids["b"], grad_b, batch_size=20), grad_b))
        ha, params_a = self.pending_a.result(TIMEOUT)
        expected = sgd_step(self.theta0, [(self.grad_a, 12), (grad_b, 20)], lr=0.1)
        for h, params in ((ha, params_a), (hb, params_b)):
            assert (h.round, h.version) == (1, 1)
            torch.testing.assert_close(params, expected, rtol=0, atol=1e-7)


def planned(c: Cluster, name: str) -> int:
    """The batch size the server's plan gives worker `name` now."""
    return c.server.call(lambda: c.server.coordinator.policy.plan()[name])


@pytest.fixture
def open_round(ps_server, threads, signal_after) -> OpenRound:
    """a (12 of B = 32, the static plan's) has pushed round 0 and waits; b (20) has not."""
    c = start_cluster(ps_server, threads, "--global-batch", "32", "--lr", "0.1", "--momentum", "0", "--controller", "static",
                      cores={"a": 12.0, "b": 20.0})
    pushed = signal_after(c.server.coordinator.policy, "observe")
    grad_a = rand(c.numel, seed=1)
    pending = threads.submit(push, c.server.stub(), push_chunks(header(c.ids["a"], grad_a, batch_size=12), grad_a))
    assert pushed.wait(TIMEOUT)
    state = snapshot(c.server)  # runs on the loop after a's push reached its wait
    weight, count, _ = state["accumulator"]
    assert state["pushed"] == {c.ids["a"]} and count == 1 and weight == 12
    assert state["round"] == 0 and not pending.done()
    return OpenRound(**vars(c), grad_a=grad_a, pending_a=pending)


# ------------------------------------------------------------------------ Join
def test_join_replies_with_job_layout_and_plan(ps_server, threads) -> None:
    c = start_cluster(ps_server, threads, "--global-batch", "32", "--controller", "static", cores={"a": 1.0, "b": 3.0})
    coordinator = c.server.coordinator
    layout = Layout.of(build_model("mlp", (1, 8, 8), 10, {"hidden": 16}, seed=0))
    assert sorted(r.index for r in c.joins.values()) == [0, 1]
    for name, reply in c.joins.items():
        assert reply.worker_id.startswith(f"{name}-") and reply.worker_id in coordinator.members
        spec = JobSpec.from_json(reply.job_json)
        assert spec == coordinator.spec and spec.model_options == {"hidden": 16} and spec.workers == 2
        assert [(t.name, tuple(t.shape), t.dtype) for t in reply.layout] == [(e.name, e.shape, e.dtype) for e in layout.entries]
        assert reply.num_params == layout.numel == c.numel
        assert (reply.round, reply.version, reply.epoch) == (0, 0, 0)
    assert c.joins["a"].batch_size == 8 and c.joins["b"].batch_size == 24  # static: b_k ∝ cores (Eq. 4a)
    assert c.ids["a"] != c.ids["b"]


@pytest.mark.parametrize(
    ("name", "cores", "fragment"),
    [
        ("", 1.0, "name must be 1-128 characters"),
        ("x" * 129, 1.0, "name must be 1-128 characters"),
        ("w", 0.0, "cores must be a finite number in (0, 1000000], got 0.0"),
        ("w", -2.0, "cores must be a finite number in (0, 1000000], got -2.0"),
        ("w", math.nan, "cores must be a finite number in (0, 1000000], got nan"),
        ("w", math.inf, "cores must be a finite number in (0, 1000000], got inf"),
    ],
)
def test_join_invalid_argument(ps_server, name: str, cores: float, fragment: str) -> None:
    server = ps_server()
    stub = server.stub()
    expect_refused(server, lambda: join(stub, name, cores), Code.INVALID_ARGUMENT, fragment)
    assert server.call(lambda: dict(server.coordinator.members)) == {}


def test_join_duplicate_name_then_job_full(ps_server, threads, signal_after) -> None:
    server = ps_server()
    added = signal_after(server.coordinator.membership, "admit")
    first = threads.submit(join, server.stub(), "a", 2.0)
    assert added.wait(TIMEOUT)
    stub = server.stub()
    expect_refused(server, lambda: join(stub, "a", 1.0), Code.ALREADY_EXISTS, "a worker named 'a' is already in the job", "--name")
    assert not first.done()
    second = join(stub, "b", 1.0)
    assert first.result(TIMEOUT).worker_id.startswith("a-") and second.worker_id.startswith("b-")
    expect_refused(server, lambda: join(stub, "c", 1.0), Code.FAILED_PRECONDITION, "job full: 2 workers are in the job")
    expect_refused(server, lambda: join(stub, "a", 1.0), Code.FAILED_PRECONDITION, "job full")


def test_join_that_the_global_batch_cannot_split_is_refused(ps_server, threads) -> None:
    """BSP gives every worker at least --min-batch of B: a join beyond that is refused with a clear
    FAILED_PRECONDITION and changes nothing (it once got into the job without a share: UNKNOWN);
    after a worker leaves there is room again."""
    server = ps_server("--workers", "1", "--global-batch", "4", "--min-batch", "2", "--max-workers", "4")
    a = join_all(server, threads, {"a": 1.0})["a"]
    stub = server.stub()
    grad = rand(a.num_params, seed=1)
    b = threads.submit(join, server.stub(), "b", 1.0)  # admitted when a's open round closes
    wait_pending(server, 1)
    h, _ = push(stub, push_chunks(header(a.worker_id, grad, batch_size=4), grad))
    assert a.batch_size == 4 and b.result(TIMEOUT).batch_size == 2 and (h.round, h.batch_size) == (1, 2)
    expect_refused(server, lambda: join(stub, "c", 1.0), Code.FAILED_PRECONDITION,
                   "job full: the global batch 4 cannot give one more worker its minimum batch", "--min-batch")
    leave(stub, b.result().worker_id)
    c = threads.submit(join, server.stub(), "c", 1.0)
    wait_pending(server, 1)
    h, _ = push(stub, push_chunks(header(a.worker_id, grad, round=1, batch_size=2), grad))  # the round b left
    assert c.result(TIMEOUT).batch_size == 2 and h.batch_size == 2


def wait_pending(server: InProcessServer, count: int) -> None:
    """Until `count` joins wait to be admitted."""
    deadline = time.monotonic() + TIMEOUT
    while server.call(lambda: len(server.coordinator.membership.pending)) != count:
        assert time.monotonic() < deadline, f"{count} joins did not reach the server"
        time.sleep(0.005)


def test_join_abandoned_while_waiting_frees_its_slot(ps_server, threads, signal_after) -> None:
    """A worker that gives up waiting for the others (cancel, deadline, crash) must not keep its slot or name."""
    server = ps_server()
    added = signal_after(server.coordinator.membership, "admit")
    removed = signal_after(server.coordinator.membership, "remove")
    before = snapshot(server)
    call = server.stub().Join.future(ps_pb2.JoinRequest(name="a", cores=1.0), timeout=TIMEOUT)
    assert added.wait(TIMEOUT)
    assert len(snapshot(server)["pending"]) == 1
    call.cancel()
    assert removed.wait(TIMEOUT)
    assert call.cancelled()
    after = snapshot(server)
    assert after.pop("joined") == 1 and before.pop("joined") == 0  # join indexes are never reused
    assert list(after.pop("departed").values()) == ["gone before it was admitted"] and before.pop("departed") == {}
    assert_same(before, after)
    joins = join_all(server, threads, {"a": 1.0, "b": 1.0})  # the same name can join again
    assert server.call(lambda: sorted(m.name for m in server.coordinator.members.values())) == ["a", "b"]
    assert joins["a"].batch_size + joins["b"].batch_size == 128


def test_push_before_the_job_started(ps_server, threads, signal_after) -> None:
    server = ps_server()
    added = signal_after(server.coordinator.membership, "admit")
    pending = threads.submit(join, server.stub(), "a", 1.0)
    assert added.wait(TIMEOUT)
    (worker_id,) = server.call(lambda: list(server.coordinator.membership.pending))
    numel = server.coordinator.layout.numel
    stub = server.stub()
    grad = rand(numel, 0)
    secret = server.coordinator.keys.secret(worker_id)  # as the Join will return it
    expect_refused(server, lambda: push(stub, push_chunks(header(worker_id, grad, secret=secret), grad)),
                   Code.FAILED_PRECONDITION, "the job has not started")
    join(stub, "b")
    assert pending.result(TIMEOUT).worker_id == worker_id


# ------------------------------------------------------------------------- BSP
def test_bsp_round_answers_both_pushes_after_it_closes(open_round: OpenRound) -> None:
    c = open_round
    grad_b = rand(c.numel, seed=2)
    hb, params_b = push(c.stub, push_chunks(header(c.ids["b"], grad_b, batch_size=20, compute_ms=7.5), grad_b))
    ha, params_a = c.pending_a.result(TIMEOUT)
    expected = sgd_step(c.theta0, [(c.grad_a, 12), (grad_b, 20)], lr=0.1)
    server_flat = c.server.call(lambda: c.server.coordinator.store.flat.clone())
    assert torch.equal(params_a, server_flat) and torch.equal(params_b, server_flat)
    torch.testing.assert_close(server_flat, expected, rtol=0, atol=1e-7)
    for h in (ha, hb):
        assert (h.round, h.version, h.epoch, h.done) == (1, 1, 0, False)
        assert (h.wire_dtype, h.num_values, h.global_batch) == ("float32", c.numel, 32)
        assert h.lr == pytest.approx(0.1)
    assert (ha.batch_size, hb.batch_size) == (12, 20)
    state = snapshot(c.server)
    assert state["round"] == 1 and state["version"] == 1 and state["samples"] == 32
    weight, count, total = state["accumulator"]
    assert state["pushed"] == set() and count == 0 and weight == 0
    assert not total.any()

    # round 1: the same again, now from round 1; a push for the closed round 0 is refused
    grad = rand(c.numel, seed=3)
    expect_refused(
        c.server, lambda: push(c.stub, push_chunks(header(c.ids["a"], grad, round=0), grad)),
        Code.FAILED_PRECONDITION, "round 0 is not open; the open round is 1",
    )
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(push, c.server.stub(), push_chunks(header(c.ids[n], grad, round=1, batch_size=b), grad))
                   for n, b in (("a", 12), ("b", 20))]
        replies = [f.result(TIMEOUT) for f in futures]
    assert all(h.round == 2 and h.version == 2 for h, _ in replies)
    assert torch.equal(replies[0][1], replies[1][1])


def test_bsp_weighted_aggregation_is_exact(ps_server, threads) -> None:
    """Mean gradients of 7 and 25 samples, weighted by batch, equal one process on all 32 samples."""
    c = start_cluster(ps_server, threads, "--global-batch", "32", "--lr", "1", "--momentum", "0", "--weight-decay", "0",
                      "--controller", "static", cores={"a": 7.0, "b": 25.0})
    data = build_dataset("digits", {}, 0)
    x, y = data.train_x[:32], data.train_y[:32]

    def mean_grad(lo: int, hi: int) -> torch.Tensor:
        model = build_model("mlp", data.input_shape, data.num_classes, {"hidden": 16}, seed=0)
        assert torch.equal(flatten_params(model), c.theta0)  # the worker's copy is the server's model
        F.cross_entropy(model(x[lo:hi]), y[lo:hi]).backward()
        return flatten_grads(model)

    g_a, g_b, g_all = mean_grad(0, 7), mean_grad(7, 32), mean_grad(0, 32)
    assert not torch.allclose(g_a, g_b, atol=1e-3)  # the two halves really differ
    pending = threads.submit(push, c.server.stub(), push_chunks(header(c.ids["a"], g_a, batch_size=7), g_a))
    _, params_b = push(c.stub, push_chunks(header(c.ids["b"], g_b, batch_size=25), g_b))
    _, params_a = pending.result(TIMEOUT)
    assert torch.equal(params_a, params_b)
    torch.testing.assert_close(params_b, c.theta0 - g_all, rtol=0, atol=1e-5)
    unweighted = c.theta0 - (g_a + g_b) / 2
    assert not torch.allclose(params_b, unweighted, atol=1e-4)  # a plain mean would not pass


def test_bsp_large_model_over_default_message_limits(ps_server) -> None:
    """A > 4 MB model travels as <= 1 MiB chunks even on a channel with gRPC's default 4 MB limit."""
    server = ps_server("--workers", "1", "--model-arg", "hidden=1100", "--lr", "1", "--momentum", "0", "--global-batch", "8")
    stub = ps_pb2_grpc.ParameterServerStub(server.channel(options=[]))
    worker_id = join(stub, "solo").worker_id
    numel = server.coordinator.layout.numel
    assert numel * 4 > 4 * 1024 * 1024
    theta0 = server.call(lambda: server.coordinator.store.flat.clone())
    grad = rand(numel, seed=4)
    h, params = push(stub, push_chunks(header(worker_id, grad, batch_size=8), grad, chunk_bytes=CHUNK_BYTES))
    assert h.round == 1 and h.num_values == numel
    torch.testing.assert_close(params, theta0 - grad, rtol=0, atol=1e-7)
    _, pulled = pull(stub, worker_id)
    assert torch.equal(pulled, params)


def test_bsp_steps_piece_by_piece_while_replies_stream(ps_server, threads, monkeypatch) -> None:
    """With the optimizer stepped in 5 pieces and the replies framed lazily in 5 chunks, three rounds of
    two workers (momentum, weight decay) give every reply and a pull what one optimizer over the whole
    vector gives."""
    import common.params.stepping
    import common.params.store
    from common.params.aggregation import WeightedMean

    monkeypatch.setattr(common.params.stepping, "PIECE_VALUES", 1 << 18)
    c = start_cluster(ps_server, threads, "--model-arg", "hidden=1100", "--global-batch", "32", "--lr", "0.1",
                      "--momentum", "0.9", "--weight-decay", "0.001", "--controller", "static", cores={"a": 12.0, "b": 20.0})
    assert len(c.server.coordinator.store.pieces) == 5 and c.numel > 4 * (1 << 18)
    reference = common.params.store.ParameterStore(c.theta0, JobSpec(lr=0.1, momentum=0.9, weight_decay=0.001), piece_values=c.numel)
    for round_ in range(3):
        g_a, g_b = rand(c.numel, seed=10 + round_), rand(c.numel, seed=20 + round_)
        pending = threads.submit(push, c.server.stub(), push_chunks(
            header(c.ids["a"], g_a, batch_size=12, round=round_, version=round_), g_a, chunk_bytes=CHUNK_BYTES))
        h, params_b = push(c.stub, push_chunks(
            header(c.ids["b"], g_b, batch_size=20, round=round_, version=round_), g_b, chunk_bytes=CHUNK_BYTES))
        _, params_a = pending.result(TIMEOUT)
        mean = WeightedMean(c.numel)
        mean.add(g_a, 12)
        mean.add(g_b, 20)
        reference.apply_gradient(mean.result())
        assert h.round == round_ + 1 and torch.equal(params_a, params_b)
        torch.testing.assert_close(params_b, reference.flat, rtol=0, atol=1e-6)
    _, pulled = pull(c.stub, c.ids["a"])
    assert torch.equal(pulled, params_b)


def test_reply_chunks_are_serialized_once_per_version_and_exactly_as_protobuf_would() -> None:
    """The core's Payload, framed with params_chunk, holds for each ParamsChunk bytes that parse to
    the message (data 16-byte aligned by a zero pad field), built once per version; reply_messages only
    puts each reply's header message first."""
    from common.transport.messages import StepHeader, StepReply
    from common.transport.payload import Payload
    from common.transport.replies import params_chunk, reply_messages

    values = rand(3000, seed=5)
    raw = split(encode(values), 4096)
    assert len(raw) == 3 and len(raw[-1]) < 4096
    payload = Payload(params_chunk, chunk_bytes=4096)
    parts = payload.get(7, values, "float32")
    assert payload.get(7, values, "float32") is parts  # same version: the same chunks
    assert payload.get(8, values, "float32") is not parts

    def reply(batch_size: int, chunks: Sequence[bytes]) -> StepReply:
        return StepReply(StepHeader(round=2, version=3, epoch=1, batch_size=batch_size, done=False, lr=0.5,
                                    global_batch=8, wire_dtype="float32", num_values=3000, reason="r"), chunks)

    first, second = list(reply_messages(reply(3, parts))), list(reply_messages(reply(5, parts)))
    h = ps_pb2.ParamsHeader(round=2, version=3, epoch=1, batch_size=3, wire_dtype="float32", num_values=3000,
                            lr=0.5, global_batch=8, reason="r")
    expected = [ps_pb2.ParamsChunk(header=h, seq=0)]
    expected += [ps_pb2.ParamsChunk(seq=i, data=d) for i, d in enumerate(raw, start=1)]
    assert first[0] == expected[0].SerializeToString()
    assert [unpadded(m, ps_pb2.ParamsChunk) for m in first] == expected
    assert all((len(m) - len(d)) % 16 == 0 for m, d in zip(first[1:], raw, strict=True))  # data aligned
    assert ps_pb2.ParamsChunk.FromString(second[0]).header.batch_size == 5
    assert all(a is b for a, b in zip(first[1:], second[1:], strict=True))
    assert all(a is b for a, b in zip(first[1:], parts, strict=True))  # the payload's chunks, not copies
    assert list(reply_messages(reply(3, payload.empty()))) == [ps_pb2.ParamsChunk(header=h).SerializeToString()]


def test_chunk_data_is_parsed_as_a_view_and_the_rest_as_protobuf_would() -> None:
    """data_view_parser gives the same fields and data as FromString, data without a copy, and
    raises DecodeError for bytes FromString refuses or that end inside a field."""
    from google.protobuf.message import DecodeError

    from common.transport.serialized import data_view_parser

    parse = data_view_parser(ps_pb2.PushChunk)
    h = header("w", 3000, round=4)
    for message in [ps_pb2.PushChunk(header=h, seq=0, data=b"\x01\x02\x03\x04"), ps_pb2.PushChunk(seq=9, data=bytes(5000)),
                    ps_pb2.PushChunk(seq=3), ps_pb2.PushChunk()]:
        raw = message.SerializeToString()
        chunk = parse(raw)
        assert chunk.fields.HasField("header") == message.HasField("header")
        assert chunk.fields.header == message.header and chunk.fields.seq == message.seq
        assert bytes(chunk.data) == message.data and not chunk.fields.data
        if message.data:
            assert chunk.data.obj is raw  # a view of the received bytes
    # fields in any order, data repeated (the last wins), unknown fields skipped, as protobuf does
    odd = (ps_pb2.PushChunk(data=b"old").SerializeToString() + ps_pb2.PushChunk(seq=2).SerializeToString()
           + b"\x78\x05" + b"\x81\x01" + bytes(8) + ps_pb2.PushChunk(header=h, data=b"new").SerializeToString())
    chunk, reference = parse(odd), ps_pb2.PushChunk.FromString(odd)
    assert bytes(chunk.data) == reference.data == b"new"
    assert chunk.fields.seq == reference.seq == 2 and chunk.fields.header == reference.header
    good = ps_pb2.PushChunk(header=h, seq=1, data=bytes(100)).SerializeToString()
    for bad in [good[:-1], good[:3], b"\x1a\xff", b"\x10", b"\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
                b"\x00\x01", b"\x0b", b"\x0a\x02\xff\xff"]:
        with pytest.raises(DecodeError):
            parse(bad)


def test_pushes_are_sent_as_the_chunk_messages_serialized() -> None:
    """The client writes each push chunk straight from a view of the values (common/transport/serialized.py): without
    alignment exactly SerializeToString's bytes; aligned (the default), a zero pad field first, so that
    data starts at a multiple of 16 bytes into the message, and the same message once parsed."""
    from common.transport.serialized import with_data
    from common.transport.wire import views

    values = encode(rand(3000, seed=6))
    h = header("w", 3000)
    for seq, view in enumerate(views(values, 4096)):
        fields = ps_pb2.PushChunk(header=h if seq == 0 else None, seq=seq)
        expected = ps_pb2.PushChunk(header=h if seq == 0 else None, seq=seq, data=bytes(view))
        assert with_data(fields, view, align=1) == expected.SerializeToString()
        aligned = with_data(fields, view)
        assert unpadded(aligned, ps_pb2.PushChunk) == expected and (len(aligned) - len(view)) % 16 == 0


def unpadded(raw: bytes, message_type: type) -> Any:
    """The message `raw` parses to, after checking that its pad (alignment only) is zeros under 16
    bytes, with the pad cleared."""
    message = message_type.FromString(raw)
    assert len(message.pad) < 16 and not any(message.pad)
    message.ClearField("pad")
    return message


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


def test_bsp_leave_closes_a_round_that_waited_only_on_the_leaver(open_round: OpenRound) -> None:
    c = open_round
    leave(c.stub, c.ids["b"])
    h, params = c.pending_a.result(TIMEOUT)
    assert h.round == 1 and h.batch_size == 32 and h.global_batch == 32  # a now carries the whole batch
    torch.testing.assert_close(params, sgd_step(c.theta0, [(c.grad_a, 12)], lr=0.1), rtol=0, atol=1e-7)
    status = c.stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT)
    assert [w.name for w in status.workers] == ["a"] and status.workers[0].batch_size == 32
    for call, fragment in (
        (lambda: leave(c.stub, c.ids["b"]), "left; Join again"),
        (lambda: pull(c.stub, c.ids["b"]), "left; Join again"),
        (lambda: push(c.stub, push_chunks(header(c.ids["b"], c.grad_a, round=1), c.grad_a)), "left; Join again"),
    ):
        expect_refused(c.server, call, Code.NOT_FOUND, fragment)
    h, _ = push(c.stub, push_chunks(header(c.ids["a"], c.grad_a, round=1, batch_size=32), c.grad_a))
    assert h.round == 2  # a alone closes the next round at once


def test_leave_then_status(ps_server, threads) -> None:
    c = start_cluster(ps_server, threads, "--global-batch", "32")
    assert leave(c.stub, c.ids["a"]) == ps_pb2.LeaveReply()
    state = snapshot(c.server)
    assert list(state["active"]) == [c.ids["b"]]
    assert [w["id"] for w in state["controller"]["workers"]] == ["b"]
    assert state["status"]["global_batch"] == 32


@pytest.mark.parametrize("worker_id", ["nobody-12345678", ""])
def test_unknown_worker_id_on_pull_and_leave(ps_server, threads, worker_id: str) -> None:
    c = start_cluster(ps_server, threads)
    expect_refused(c.server, lambda: pull(c.stub, worker_id), Code.NOT_FOUND, f"unknown worker id {worker_id!r}; Join first")
    expect_refused(
        c.server, lambda: leave(c.stub, worker_id),
        Code.NOT_FOUND, f"unknown worker id {worker_id!r}; Join first",
    )


# -------------------------------------------------------------- worker secrets
def test_join_gives_each_worker_a_secret_that_status_never_shows(ps_server, threads) -> None:
    c = start_cluster(ps_server, threads, "--global-batch", "32")
    secrets = [r.secret for r in c.joins.values()]
    assert len(set(secrets)) == 2 and all(len(x) == 64 and int(x, 16) >= 0 for x in secrets)
    status = c.stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT).SerializeToString()
    assert not any(x.encode() in status for x in secrets)
    assert {w.worker_id for w in ps_pb2.StatusReply.FromString(status).workers} == set(c.ids.values())  # ids are public


def test_calls_as_a_worker_without_its_secret_are_refused_and_change_nothing(open_round: OpenRound) -> None:
    """Every call naming a worker: no secret is UNAUTHENTICATED, another worker's or a made-up one is
    PERMISSION_DENIED, and nothing changes. The issue's case: a client that never joined pushes as b
    (whose id Status lists); it is refused, and b's own push then closes the round as if nothing had
    happened."""
    c = open_round
    b, a_secret = c.ids["b"], SECRETS[c.ids["a"]]
    grad = rand(c.numel, seed=5)
    calls = {
        "Push": lambda secret: push(c.stub, push_chunks(header(b, grad, batch_size=20, secret=secret), grad)),
        "Pull": lambda secret: read_params(c.stub.Pull(ps_pb2.PullRequest(worker_id=b, secret=secret), timeout=TIMEOUT)),
        "Pull header": lambda secret: list(c.stub.Pull(ps_pb2.PullRequest(worker_id=b, secret=secret, header_only=True),
                                                       timeout=TIMEOUT)),
        "Leave": lambda secret: c.stub.Leave(ps_pb2.LeaveRequest(worker_id=b, secret=secret), timeout=TIMEOUT),
        "Heartbeat": lambda secret: c.stub.Heartbeat(ps_pb2.HeartbeatRequest(worker_id=b, secret=secret), timeout=TIMEOUT),
    }
    for call in calls.values():
        expect_refused(c.server, lambda call=call: call(""), Code.UNAUTHENTICATED, "must carry the secret")
        for wrong in (a_secret, "f" * 64, SECRETS[b][:-1], SECRETS[b] + "0", SECRETS[b].upper()):
            expect_refused(c.server, lambda call=call, wrong=wrong: call(wrong), Code.PERMISSION_DENIED, "wrong secret")
    assert not c.pending_a.done()
    c.finish_round()


def test_a_rejoin_gets_a_new_secret_and_the_old_one_opens_nothing(ps_server, threads) -> None:
    c = start_cluster(ps_server, threads, "--global-batch", "32")
    old_id, old_secret = c.ids["b"], SECRETS[c.ids["b"]]
    leave(c.stub, old_id)
    rejoin = threads.submit(join, c.server.stub(), "b")  # admitted when a closes the open round
    wait_pending(c.server, 1)
    grad = rand(c.numel, seed=3)
    push(c.stub, push_chunks(header(c.ids["a"], grad, batch_size=16), grad))
    again = rejoin.result(TIMEOUT)
    assert again.worker_id != old_id and again.secret != old_secret
    expect_refused(c.server, lambda: read_params(c.stub.Pull(ps_pb2.PullRequest(worker_id=again.worker_id, secret=old_secret),
                                                             timeout=TIMEOUT)), Code.PERMISSION_DENIED, "wrong secret")
    expect_refused(c.server, lambda: read_params(c.stub.Pull(ps_pb2.PullRequest(worker_id=old_id, secret=old_secret),
                                                             timeout=TIMEOUT)), Code.NOT_FOUND, "left; Join again")


# ------------------------------------------------------------------------- ASP
def test_asp_updates_apply_at_once_and_record_staleness(ps_server, threads) -> None:
    c = start_cluster(ps_server, threads, "--mode", "asp", "--global-batch", "32", "--lr", "0.2", "--max-staleness", "2", cores={"a": 1.0, "b": 1.0})
    theta = c.theta0.clone()
    d1, d2, d3, d4 = (rand(c.numel, seed=s) for s in (11, 12, 13, 14))

    h, params = push(c.stub, push_chunks(header(c.ids["a"], d1, version=0, batch_size=16, compute_ms=4.0), d1))
    theta += d1
    assert (h.version, h.round, h.batch_size, h.global_batch) == (1, 0, 16, 32)
    assert h.lr == pytest.approx(0.2 * 16 / 32)  # Eq. 5b: η_k = η · b_k / B
    assert torch.equal(params, theta)  # applied at once, without waiting for b

    h, params = push(c.stub, push_chunks(header(c.ids["b"], d2, version=0, compute_ms=6.0), d2))  # 1 version stale
    theta += d2
    assert h.version == 2 and torch.equal(params, theta)

    h, params = push(c.stub, push_chunks(header(c.ids["b"], d3, version=0), d3))  # 2 versions stale: the limit
    theta += d3
    assert h.version == 3 and torch.equal(params, theta)

    for version, code, fragments in (
        (4, Code.FAILED_PRECONDITION, ("version 4 is unknown; the current version is 3",)),
        (100, Code.FAILED_PRECONDITION, ("version 100 is unknown; the current version is 3",)),
        (-1, Code.FAILED_PRECONDITION, ("version -1 is unknown; the current version is 3",)),
        (0, Code.FAILED_PRECONDITION, ("version 0 is 3 versions old, over the limit 2", "pull and recompute")),
    ):
        chunks = push_chunks(header(c.ids["a"], d4, version=version), d4)
        expect_refused(c.server, functools.partial(push, c.stub, chunks), code, *fragments)

    state = snapshot(c.server)
    assert state["version"] == 3 and state["round"] == 0 and state["samples"] == 48
    assert state["accumulator"] is None  # ASP keeps no accumulator
    members = {m["name"]: m for m in state["active"].values()}
    assert (members["a"]["updates"], members["a"]["staleness_sum"]) == (1, 0)
    assert (members["b"]["updates"], members["b"]["staleness_sum"]) == (2, 3)
    status = c.stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT)
    by_name = {w.name: w for w in status.workers}
    assert by_name["a"].mean_staleness == 0.0 and by_name["b"].mean_staleness == pytest.approx(1.5)
    assert (by_name["a"].updates, by_name["b"].updates) == (1, 2)
    assert by_name["a"].compute_ms == pytest.approx(4.0)  # first observation at its planned batch
    assert (status.mode, status.version, status.round) == ("asp", 3, 0)

    h, pulled = pull(c.stub, c.ids["a"])
    assert h.version == 3 and torch.equal(pulled, theta)


def test_asp_without_staleness_limit_accepts_old_versions(ps_server, threads) -> None:
    c = start_cluster(ps_server, threads, "--mode", "asp", "--global-batch", "32")
    delta = rand(c.numel, seed=5)
    for _ in range(4):
        push(c.stub, push_chunks(header(c.ids["a"], delta, version=0), delta))
    h, _ = push(c.stub, push_chunks(header(c.ids["b"], delta, version=0), delta))
    assert h.version == 5
    staleness = {w["name"]: w["mean_staleness"] for w in snapshot(c.server)["status"]["workers"]}
    assert staleness == {"a": (0 + 1 + 2 + 3) / 4, "b": 4.0}
    chunks = push_chunks(header(c.ids["b"], delta, version=6), delta)
    expect_refused(c.server, lambda: push(c.stub, chunks), Code.FAILED_PRECONDITION, "version 6 is unknown; the current version is 5")


def test_asp_narrow_wire_dtypes(ps_server, threads) -> None:
    """Pushes in bf16 are widened exactly; replies in the server's fp16 are torch's fp16 rounding."""
    c = start_cluster(ps_server, threads, "--mode", "asp", "--global-batch", "32", "--wire-dtype", "float16")
    delta = rand(c.numel, seed=6)
    h, params = push(c.stub, push_chunks(header(c.ids["a"], delta, wire_dtype="bfloat16"), delta, "bfloat16"))
    server_flat = c.server.call(lambda: c.server.coordinator.store.flat.clone())
    assert torch.equal(server_flat, c.theta0 + delta.to(torch.bfloat16).float())
    assert h.wire_dtype == "float16"
    assert torch.equal(params, server_flat.to(torch.float16).float())
    h, pulled = pull(c.stub, c.ids["b"])
    assert h.wire_dtype == "float16" and torch.equal(pulled, params)


# ------------------------------------------------------------------ Pull/Status
def test_pull_returns_current_parameters_and_plan(ps_server, threads) -> None:
    c = start_cluster(ps_server, threads, "--global-batch", "32", "--lr", "0.05", cores={"a": 1.0, "b": 1.0})
    for name in "ab":
        h, params = pull(c.stub, c.ids[name])
        assert torch.equal(params, c.theta0)
        assert (h.round, h.version, h.epoch, h.done, h.batch_size, h.global_batch) == (0, 0, 0, False, 16, 32)
        assert (h.wire_dtype, h.num_values) == ("float32", c.numel) and h.lr == pytest.approx(0.05)
    assert_same(snapshot(c.server), snapshot(c.server))  # pulls change nothing


def test_status_fields(ps_server, threads) -> None:
    c = start_cluster(ps_server, threads, "--global-batch", "32", "--epochs", "3", cores={"a": 2.0, "b": 6.0})
    status = c.stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT)
    assert (status.mode, status.controller, status.round, status.version) == ("bsp", "dynamic", 0, 0)
    assert (status.epoch, status.epochs, status.done, status.global_batch) == (0, 3, False, 32)
    assert (status.last_accuracy, status.adjustments, status.expected_workers) == (-1.0, 0, 2)
    workers = {w.name: w for w in status.workers}
    assert {n: (w.worker_id, w.cores, w.batch_size, w.compute_ms, w.updates, w.mean_staleness) for n, w in workers.items()} == {
        "a": (c.ids["a"], 2.0, 16, 0.0, 0, 0.0),
        "b": (c.ids["b"], 6.0, 16, 0.0, 0, 0.0),
    }
    grad = rand(c.numel, seed=7)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [
            pool.submit(push, c.server.stub(), push_chunks(header(c.ids[n], grad, compute_ms=ms), grad))
            for n, ms in (("a", 12.5), ("b", 3.25))
        ]
        [f.result(TIMEOUT) for f in futures]
    status = c.stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT)
    assert (status.round, status.version) == (1, 1)
    workers = {w.name: w for w in status.workers}
    assert (workers["a"].compute_ms, workers["b"].compute_ms) == (12.5, 3.25)
    assert (workers["a"].updates, workers["b"].updates) == (1, 1)


def test_job_end_is_reported(ps_server, threads) -> None:
    """One round over the whole train split ends the only epoch: replies and Status say done."""
    c = start_cluster(ps_server, threads, "--global-batch", "2000", "--epochs", "1")
    assert 2000 >= c.server.coordinator.epochs.samples_per_epoch
    grad = rand(c.numel, seed=8)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(push, c.server.stub(), push_chunks(header(c.ids[n], grad, batch_size=1000), grad)) for n in "ab"]
        replies = [f.result(TIMEOUT) for f in futures]
    assert all(h.done and h.epoch == 1 and h.round == 1 for h, _ in replies)
    assert c.server.job is not None
    c.server.job.evaluator.drain()
    status = c.stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT)
    assert status.done and status.epoch == 1
    assert 0.0 <= status.last_accuracy <= 1.0
    h, _ = pull(c.stub, c.ids["a"])
    assert h.done
    h, _ = push(c.stub, push_chunks(header(c.ids["b"], grad, round=1), grad))  # a late push just hears "done"
    assert h.done and h.round == 1
    assert json.loads(c.joins["a"].job_json)["epochs"] == 1


def test_a_reply_that_ends_before_its_header_is_a_server_error() -> None:
    from worker.client import ServerError, _receive

    with pytest.raises(ServerError, match="INTERNAL: the server's reply ended before its header"):
        _receive(iter([]), torch.empty(0))
