"""Gradient push during backward (worker/paths/overlap.py): the buckets, the out-of-order receiver, and
whole BSP rounds through a real server: the bucketed step equals the whole-gradient step (SGD with
momentum, Adam), parameters without a gradient do not hang the round, a gradient changed after its
bucket went out falls back to the serial push, and a worker killed mid-push leaves nothing applied."""

from __future__ import annotations

import math
import subprocess
import sys
import time

import pytest
import torch
from torch import nn

from common.errors import InvalidArgument
from common.transport.wire import OffsetReceiver, encode
from worker.paths import overlap
from worker.paths.overlap import plan_buckets
from tests.overlap_rounds import TIMEOUT, _reference, _train

UNUSED_MODEL = "tests.worker.paths.test_overlap:with_unused"


class WithUnused(nn.Module):
    """An MLP with a layer its forward never uses (its gradients stay None)."""

    def __init__(self, features: int, num_classes: int, hidden: int) -> None:
        super().__init__()
        self.body = nn.Linear(features, hidden)
        self.unused = nn.Linear(4, 4)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x.flatten(1))))


def with_unused(input_shape: tuple[int, ...], num_classes: int, hidden: int = 16) -> nn.Module:
    return WithUnused(math.prod(input_shape), num_classes, hidden)


# ------------------------------------------------------------------ the pieces
def test_buckets_cover_the_vector_once_from_the_last_parameter_back() -> None:
    sizes = [5, 300, 7, 120, 3, 90]
    buckets = plan_buckets(sizes, bucket_values=100)
    assert [b.members for b in buckets] == [[3, 4, 5], [1, 2], [0]]
    ranges = sorted((b.start, b.stop) for b in buckets)
    assert ranges[0][0] == 0 and ranges[-1][1] == sum(sizes)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert [b.members for b in plan_buckets([4], 100)] == [[0]]


@pytest.mark.parametrize("wire_dtype", ["float32", "bfloat16"])
def test_offset_receiver_places_chunks_that_arrive_in_any_order(wire_dtype: str) -> None:
    values = torch.randn(1000)
    data = encode(values, wire_dtype)
    size = 2 if wire_dtype == "bfloat16" else 4
    receiver = OffsetReceiver(1000, wire_dtype)
    for seq, (start, stop) in enumerate([(700, 1000), (0, 10), (300, 700), (10, 300)]):
        receiver.feed_at(seq, start, data[start * size : stop * size])
    got = receiver.finish().contiguous()
    assert torch.equal(got, values.to(got.dtype if wire_dtype == "float32" else torch.bfloat16).float())


@pytest.mark.parametrize("pieces, fragment", [
    ([(0, 600), (500, 1000)], "too much data"),       # overlap: more values than the push holds
    ([(0, 400), (500, 600)], "are missing at value 400"),
    ([(0, 500), (400, 900)], "overlap at value 400"),
    ([(990, 1001)], "outside"),
])
def test_offset_receiver_refuses_a_push_that_does_not_cover_every_value_once(pieces, fragment) -> None:
    data = encode(torch.ones(2000))
    receiver = OffsetReceiver(1000)
    with pytest.raises(InvalidArgument, match=fragment):
        for seq, (start, stop) in enumerate(pieces):
            receiver.feed_at(seq, start, data[start * 4 : stop * 4])
        receiver.finish()


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_bucketed_step_equals_the_whole_gradient_step(ps_server, threads, monkeypatch, optimizer) -> None:
    """Bit for bit, with the larger gradients framed in place from the second step on (the first
    step's are copied, to compare their values at step())."""
    monkeypatch.setattr(overlap, "BUCKET_VALUES", 100)  # several buckets for the small MLP
    monkeypatch.setattr(overlap, "DIRECT_VALUES", 100)  # the three weights in place, the biases copied
    args = ("--optimizer", optimizer, "--momentum", "0.9" if optimizer == "sgd" else "0", "--model-arg", "hidden=16")
    bucketed, sessions = _train(ps_server, threads, *args)
    assert all(s._replica.parts.buckets is not None and len(s._replica.parts.buckets.buckets) >= 2 and s._replica.parts.buckets.streamed == 3 for s in sessions)
    assert all(s._replica.parts.buckets is not None and s._replica.parts.buckets.sent_in_place == 3 * 2 for s in sessions)
    whole, serial = _train(ps_server, threads, *args, overlap_on=False)
    assert all(s._replica.parts.buckets is None for s in serial)
    assert torch.equal(bucketed, whole)  # the server got the same gradient, bit for bit
    torch.testing.assert_close(bucketed, _reference(optimizer), rtol=0, atol=2e-6)


def test_parameters_without_gradients_do_not_hang_the_round(ps_server, threads, monkeypatch) -> None:
    monkeypatch.setattr(overlap, "BUCKET_VALUES", 20)  # the unused layer is a bucket of its own
    args = ("--model", UNUSED_MODEL, "--momentum", "0.9")
    bucketed, sessions = _train(ps_server, threads, *args)
    assert all(s._replica.parts.buckets is not None and s._replica.parts.buckets.streamed == 3 for s in sessions)
    assert all(p.grad is None for p in sessions[0].model.unused.parameters())
    torch.testing.assert_close(bucketed, _reference("sgd", UNUSED_MODEL), rtol=0, atol=2e-6)


def _halve_in_place(model: nn.Module) -> None:  # a custom loop's edit between backward and step()
    for p in model.parameters():
        p.grad.mul_(0.5)


def _halve_through_data(model: nn.Module) -> None:  # an edit the version counter does not see
    for p in model.parameters():
        p.grad.data.mul_(0.5)


def _halve_into_new_tensors(model: nn.Module) -> None:
    for p in model.parameters():
        p.grad = p.grad * 0.5


@pytest.mark.parametrize("edit", [_halve_in_place, _halve_through_data, _halve_into_new_tensors])
def test_a_gradient_changed_after_its_bucket_went_out_is_pushed_whole(ps_server, threads, monkeypatch, edit) -> None:
    monkeypatch.setattr(overlap, "BUCKET_VALUES", 100)
    monkeypatch.setattr(overlap, "DIRECT_VALUES", 100)
    args = ("--momentum", "0.9", "--model-arg", "hidden=16")
    bucketed, sessions = _train(ps_server, threads, *args, edit=edit)
    assert all(s._replica.parts.buckets is not None and s._replica.parts.buckets.fallbacks == 3 and s._replica.parts.buckets.streamed == 0 for s in sessions)
    torch.testing.assert_close(bucketed, _reference("sgd", edit=edit), rtol=0, atol=2e-6)


def test_the_values_are_compared_at_the_first_streamed_step_only(ps_server, threads, monkeypatch) -> None:
    """A loop that leaves the gradients alone costs a comparison of the values once; later steps are
    checked by identity and version."""
    monkeypatch.setattr(overlap, "BUCKET_VALUES", 100)
    compared_at: set[int] = set()
    changed = overlap.BucketPush._changed

    def counted(self: overlap.BucketPush, index: int) -> bool:
        compared_at.add(self.streamed)
        return changed(self, index)

    monkeypatch.setattr(overlap.BucketPush, "_changed", counted)
    _, sessions = _train(ps_server, threads, "--momentum", "0.9", "--model-arg", "hidden=16")
    assert all(s._replica.parts.buckets is not None and s._replica.parts.buckets.streamed == 3 for s in sessions)
    assert compared_at == {0}


KILLED_WORKER = """
import os, signal, sys, time
import torch
from common.transport.messages import PushMeta, PushTimes
from worker.transport.client import PSClient
client = PSClient(sys.argv[1])
joined = client.join("b", 20.0)
numel = joined.layout.numel
client.pull(joined.worker_id, torch.empty(numel))  # a worker's first Pull, before its first push
stream = client.open_push(PushMeta(joined.worker_id, 0, 0, 20, PushTimes(), "float32"), torch.empty(numel))
stream.send(numel // 2, torch.full((numel - numel // 2,), 1000.0))
time.sleep(1.0)
print("sent", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_worker_killed_mid_push_leaves_the_round_consistent(ps_server, threads) -> None:
    """b (a real process) sends one bucket of its push and is killed: nothing of it is applied; once
    b is evicted the round closes with a's gradient alone."""
    from tests.rpc_calls import first_pull, header, push, push_chunks, rand

    server = ps_server("--global-batch", "32", "--controller", "static", "--lr", "0.1", "--momentum", "0",
                       "--evict-after", "1")
    killed = subprocess.Popen([sys.executable, "-c", KILLED_WORKER, server.target], stdout=subprocess.PIPE, text=True)
    try:
        stub = server.stub()
        from protos import ps_pb2

        reply = first_pull(stub, stub.Join(ps_pb2.JoinRequest(name="a", cores=12.0), timeout=TIMEOUT))
        theta0 = server.call(lambda: server.coordinator.store.flat.clone())
        grad_a = rand(theta0.numel(), seed=1)
        pending = threads.submit(push, server.stub(), push_chunks(header(reply.worker_id, grad_a, batch_size=12), grad_a))
        assert killed.stdout is not None and killed.stdout.readline().strip() == "sent"
        assert killed.wait(TIMEOUT) == -9
        beat = ps_pb2.HeartbeatRequest(worker_id=reply.worker_id, secret=reply.secret)
        deadline = time.monotonic() + TIMEOUT
        while True:
            stub.Heartbeat(beat, timeout=TIMEOUT)  # a stays; b, silent since its kill, goes
            if "b" in server.call(server.coordinator.evict_stale):
                break
            assert time.monotonic() < deadline
            time.sleep(0.2)
        h, params = pending.result(TIMEOUT)
        assert h.round == 1
        torch.testing.assert_close(params, theta0 - 0.1 * grad_a, rtol=0, atol=1e-6)  # a's gradient alone
    finally:
        if killed.poll() is None:
            killed.kill()
            killed.wait()


@pytest.mark.parametrize("balance", ["compute", "busy"])
def test_the_policy_fits_the_workers_own_exposed_time_where_the_balanced_time_leaves_it_out(
        ps_server, threads, monkeypatch, balance) -> None:
    """Each push reports the last step's exposed time (the wait for the round included) and its own
    part of it (sending after compute, receiving the reply); the policy hears the own part under
    --balance compute, and nothing under busy time (which holds it already)."""
    from ps.control.worker_plan import WorkerPlan

    heard: list[tuple[str, float]] = []
    observe = WorkerPlan.observe

    def recording(self, worker_id: str, batch: int, compute_ms: float, exposed_ms: float = 0.0) -> None:
        heard.append((worker_id, exposed_ms))
        observe(self, worker_id, batch, compute_ms, exposed_ms)

    monkeypatch.setattr(WorkerPlan, "observe", recording)
    _, sessions = _train(ps_server, threads, "--balance", balance, "--model-arg", "hidden=16", rounds=3)
    assert len(heard) == 6 and all(ms == 0.0 for _, ms in heard[:2])  # round 0: nothing measured yet
    assert all(s.exposed_ms > 0 for s in sessions)
    if balance == "compute":
        assert all(ms > 0 for _, ms in heard[2:])
    else:
        assert all(ms == 0.0 for _, ms in heard)


def test_a_narrow_wire_dtype_narrows_each_bucket_as_the_whole_push_would(ps_server, threads, monkeypatch) -> None:
    monkeypatch.setattr(overlap, "BUCKET_VALUES", 100)
    args = ("--wire-dtype", "bfloat16", "--momentum", "0.9", "--model-arg", "hidden=16")
    bucketed, sessions = _train(ps_server, threads, *args)
    assert all(s._replica.parts.buckets is not None and s._replica.parts.buckets.streamed == 3 for s in sessions)
    whole, _ = _train(ps_server, threads, *args, overlap_on=False)
    assert torch.equal(bucketed, whole)
