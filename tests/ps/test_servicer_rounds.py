"""BSP and ASP rounds through the servicer (an in-process server): replies after a round closes,
exact weighted aggregation, large models, steps streamed piece by piece, staleness, Pull and Status."""

from __future__ import annotations

import concurrent.futures
import functools
import json

import pytest
import torch
import torch.nn.functional as F

from protos import ps_pb2, ps_pb2_grpc
from common.job.datasets import build_dataset
from common.job.models import build_model
from common.job.spec import JobSpec
from common.transport.layout import flatten_grads, flatten_params
from common.transport.wire import CHUNK_BYTES
from tests.state_compare import assert_same
from tests.rpc_calls import (
    Code, OpenRound, TIMEOUT, expect_refused, header, join, open_round, pull, push, push_chunks, rand,
    sgd_step, snapshot, start_cluster,
)


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


def test_a_pull_for_the_header_alone_and_the_optimizer_state_is_refused(ps_server, threads) -> None:
    """header_only and optimizer_state contradict (a header alone carries no state): INVALID_ARGUMENT
    at once, a parked worker's long poll included, and nothing changes."""
    c = start_cluster(ps_server, threads, cores={"a": 1.0, "b": 1.0})
    for wait in (False, True):
        request = ps_pb2.PullRequest(worker_id=c.ids["a"], secret=c.joins["a"].secret, header_only=True,
                                     optimizer_state=True, wait_for_batch=wait)
        expect_refused(c.server, lambda: list(c.stub.Pull(request, timeout=TIMEOUT)), Code.INVALID_ARGUMENT,
                       "a Pull asks for header_only or optimizer_state, not both")


def test_status_fields(ps_server, threads) -> None:
    c = start_cluster(ps_server, threads, "--global-batch", "32", "--epochs", "3", "--controller", "dynamic",
                      "--dynamic-start", "uniform", cores={"a": 2.0, "b": 6.0})
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


def test_the_first_plan_follows_the_declared_cores_by_default(ps_server, threads) -> None:
    """--dynamic-start static is the default: before anything is measured, B is split by the cores each
    worker declares (a worker declares its cgroup's CPU quota unless told --cores)."""
    c = start_cluster(ps_server, threads, "--global-batch", "32", "--epochs", "3", cores={"a": 2.0, "b": 6.0})
    status = c.stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT)
    assert status.controller == "auto"
    assert {w.name: w.batch_size for w in status.workers} == {"a": 8, "b": 24}


def test_job_end_is_reported(ps_server, threads) -> None:
    """One round over the whole train split ends the only epoch: replies and Status say done."""
    c = start_cluster(ps_server, threads, "--global-batch", "1438", "--epochs", "1")  # digits' training split
    assert c.server.coordinator.epochs.samples_per_epoch == 1438
    grad = rand(c.numel, seed=8)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(push, c.server.stub(), push_chunks(header(c.ids[n], grad, batch_size=719), grad)) for n in "ab"]
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
