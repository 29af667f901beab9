"""Calls to an in-process server as a worker makes them (join, push, pull, leave, each with its
secret), the checks that a refused call changed nothing, and the clusters and open rounds the
servicer's tests start from."""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import grpc
import pytest
import torch

from protos import ps_pb2
from common.transport.wire import CHUNK_BYTES, FlatReceiver, encode, split
from tests.state_compare import assert_same, server_state

if TYPE_CHECKING:
    from tests.conftest import InProcessServer

TIMEOUT = 20.0
Code = grpc.StatusCode


# ---------------------------------------------------------------------- helpers
SECRETS: dict[str, str] = {}
"""Worker id -> the secret its Join returned: the helpers send it with every call naming that id, as
worker.transport.client.PSClient does (ids are unique: each carries random digits)."""


def join(stub: Any, name: str, cores: float = 1.0, timeout: float = TIMEOUT) -> ps_pb2.JoinReply:
    """Join as `name`, then the Pull a worker makes before its first push (its parameters and samples)."""
    return first_pull(stub, stub.Join(ps_pb2.JoinRequest(name=name, cores=cores), timeout=timeout))


def first_pull(stub: Any, reply: ps_pb2.JoinReply) -> ps_pb2.JoinReply:
    """`reply`'s worker noted with its secret, and its first Pull made (the server refuses a push
    before it: ps.rounds.push_checks); `reply` itself."""
    SECRETS[reply.worker_id] = reply.secret
    pull(stub, reply.worker_id)
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
    """expect_error, and the server state is exactly what it was before (after the evaluations under way,
    whose results land on the evaluator's thread whenever they finish)."""
    evaluator = server.call(lambda: server.coordinator.evaluation.evaluator)
    if evaluator is not None:
        evaluator.settle()
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
