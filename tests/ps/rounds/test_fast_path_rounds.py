"""The BSP collective fast path (`ps-server --allreduce`) against an in-process server, once joined:
rounds closed on reports, snapshots at epoch ends and of the hub, the optimizer state a pull hands
back, and the generations a leave starts."""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

import grpc
import torch

from protos import ps_pb2
from ps.ops.metrics import read_metrics
from ps.checkpoint import checkpoint_files, read_checkpoint
from tests.hostile_peer import wait_until
from tests.rpc_calls import SECRETS, TIMEOUT, expect_refused, header, join_all, push_chunks, rand
from worker.transport.client import PSClient
from tests.fast_path_jobs import Code, TINY, call, report, report_round, snapshot_push


# ------------------------------------------------------- reports, snapshots and generations, in process

def test_pushes_of_the_wrong_kind_are_refused_without_a_trace(ps_server, threads) -> None:
    server = ps_server(*TINY)
    ids = {n: j.worker_id for n, j in join_all(server, threads, {"a": 1.0, "b": 1.0}).items()}
    stub, numel = server.stub(), server.coordinator.layout.numel
    grad = rand(numel, seed=1)
    rank1 = next(w for w in ids.values() if server.coordinator.rendezvous.rank(w) == 1)
    rank0 = next(w for w in ids.values() if w != rank1)
    cases = [
        (push_chunks(header(ids["a"], grad), grad), Code.INVALID_ARGUMENT, "collective fast path (--allreduce)"),
        (push_chunks(header(ids["a"], 4, kind=ps_pb2.PUSH_REPORT), torch.ones(4)), Code.INVALID_ARGUMENT,
         "a report carries no values (num_values 0), got 4"),
        (report(ids["a"], round=1), Code.FAILED_PRECONDITION, "round 1 is not open"),
        (report(ids["a"], round=0, batch=0), Code.INVALID_ARGUMENT, "batch size must be > 0"),
        (report(ids["a"], round=0, generation=2), Code.INVALID_ARGUMENT, "a report's generation must be in [0, 1]"),
        (report(ids["a"], round=0, generation=-1), Code.INVALID_ARGUMENT, "a report's generation must be in [0, 1]"),
        (snapshot_push(rank1, grad, 0), Code.FAILED_PRECONDITION, "only the hub (rank 0, the largest batch) sends snapshots",
         "rank 1 of generation 1"),
        (snapshot_push(rank0, grad, 0), Code.FAILED_PRECONDITION, "no snapshot was requested"),
        (push_chunks(header(ids["a"], grad, kind=7), grad), Code.INVALID_ARGUMENT, "push kind must be one of"),
    ]
    for chunks, code, *fragments in cases:
        expect_refused(server, lambda chunks=chunks: list(stub.Push(iter(chunks), timeout=TIMEOUT)), code, *fragments)
    assert server.call(lambda: (server.coordinator.bsp.round_batch, server.coordinator.whole_model.snapshot_requested)) == (0, False)


def test_reports_and_store_calls_in_a_ps_job_are_refused(ps_server, threads) -> None:
    server = ps_server("--global-batch", "32")
    ids = {n: j.worker_id for n, j in join_all(server, threads, {"a": 1.0, "b": 1.0}).items()}
    stub = server.stub()
    expect_refused(server, lambda: list(stub.Push(iter(report(ids["a"], 0)), timeout=TIMEOUT)), Code.INVALID_ARGUMENT,
                   "a report push is for --allreduce jobs")
    put = ps_pb2.StoreRequest(worker_id=ids["a"], secret=SECRETS[ids["a"]], op=ps_pb2.STORE_SET, keys=["k"], value=b"v")
    expect_refused(server, lambda: stub.Rendezvous(put, timeout=TIMEOUT), Code.FAILED_PRECONDITION,
                   "this job is not on the collective fast path (no --allreduce)")


def test_rounds_close_on_reports_and_rank0_snapshots_at_epoch_end(ps_server, threads, tmp_path: Path) -> None:
    server = ps_server(*TINY, "--checkpoint-dir", str(tmp_path))
    core = server.coordinator
    ids = {n: j.worker_id for n, j in join_all(server, threads, {"a": 1.0, "b": 1.0}).items()}
    theta0 = server.call(lambda: core.store.flat.clone())
    first = report_round(server.stub, threads, ids, 0)
    assert {(h.round, h.epoch, h.generation, h.snapshot_requested) for h in first.values()} == {(1, 0, 1, False)}
    assert torch.equal(server.call(lambda: core.store.flat.clone()), theta0)  # no gradient applied on the server
    second = report_round(server.stub, threads, ids, 1)  # 64 samples: epoch 1 ends
    rank0 = next(n for n, w in ids.items() if core.rendezvous.rank(w) == 0)
    assert {n: h.snapshot_requested for n, h in second.items()} == {n: n == rank0 for n in ids}
    assert all(h.round == 2 and h.epoch == 1 for h in second.values())
    assert core.evaluation.results == [] and not list(tmp_path.glob("ckpt-*"))  # both wait for the snapshot
    params = theta0 + rand(theta0.numel(), seed=3)
    h = call(server.stub(), snapshot_push(ids[rank0], params, 2))
    assert not h.snapshot_requested and h.round == 2
    assert torch.equal(server.call(lambda: core.store.flat.clone()), params)
    server.job.checkpointer.flush()
    (ckpt,) = checkpoint_files(tmp_path)
    assert torch.equal(read_checkpoint(ckpt)["params"], params) and read_checkpoint(ckpt)["round"] == 2
    deadline = time.monotonic() + TIMEOUT
    while not core.evaluation.results and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [e[0] for e in core.evaluation.results] == [1]


def test_the_snapshot_is_asked_of_the_hub_not_rank_0(ps_server, threads) -> None:
    """The member with the largest batch (the hub, the fastest) pushes the snapshot; rank 0, joined
    first with a third of its cores, is neither asked nor heard."""
    server = ps_server(*TINY, "--controller", "static")
    core = server.coordinator
    small = threads.submit(join_all, server, threads, {"small": 1.0})
    wait_until(lambda: server.call(lambda: len(core.membership.pending)) == 1, "the small worker waiting in Join")
    joined = {**join_all(server, threads, {"big": 3.0}), **small.result(TIMEOUT)}
    ids = {n: j.worker_id for n, j in joined.items()}
    assert {n: (j.rank, j.batch_size) for n, j in joined.items()} == {"small": (0, 8), "big": (1, 24)}

    def reports(round: int) -> dict[str, ps_pb2.ParamsHeader]:
        futures = {n: threads.submit(call, server.stub(), report(w, round, batch=joined[n].batch_size)) for n, w in ids.items()}
        return {n: f.result(TIMEOUT) for n, f in futures.items()}

    reports(0)
    asked = reports(1)  # 64 samples: epoch 1 ends, the evaluation waits for a snapshot
    assert {n: (h.snapshot_requested, h.hub_rank) for n, h in asked.items()} == {"small": (False, 1), "big": (True, 1)}
    params = server.call(lambda: core.store.flat.clone()) + 1.0
    expect_refused(server, lambda: call(server.stub(), snapshot_push(ids["small"], params, 2)), Code.FAILED_PRECONDITION,
                   "only the hub (rank 1, the largest batch) sends snapshots", "worker small is rank 0")
    assert server.call(lambda: core.whole_model.snapshot_requested)
    assert not call(server.stub(), snapshot_push(ids["big"], params, 2)).snapshot_requested
    assert torch.equal(server.call(lambda: core.store.flat.clone()), params)


def test_a_snapshot_carries_the_optimizer_state_and_a_pull_hands_it_back(ps_server, threads) -> None:
    """The hub's snapshot is the parameters, then the momentum buffer (common.params.flat_state); the server keeps
    both (what its checkpoints hold) and hands the momentum to a worker that asks (after a resume).
    A snapshot of another size, or a non-finite state, is refused and changes nothing."""
    server = ps_server(*TINY, "--momentum", "0.9")
    core = server.coordinator
    ids = {n: j.worker_id for n, j in join_all(server, threads, {"a": 1.0, "b": 1.0}).items()}
    client = PSClient(server.target)
    for worker_id in ids.values():
        client.use_secret(worker_id, SECRETS[worker_id])
    try:
        assert client.pull_optimizer_state(ids["a"], core.store.numel) is None  # not stepped yet
        report_round(server.stub, threads, ids, 0)
        second = report_round(server.stub, threads, ids, 1)
        rank0 = next(n for n, h in second.items() if h.snapshot_requested)
        n = server.call(lambda: core.store.numel)
        params, momentum = rand(n, seed=4), rand(n, seed=5)
        nan_state = torch.cat([params, momentum])
        nan_state[n + 7] = float("nan")
        stub = server.stub()
        for values, needle in [
            (torch.cat([params, momentum[:-1]]), f"a snapshot has {2 * n - 1} values; the layout expects {n} or {2 * n}"),
            (nan_state, "NaN or Inf"),
        ]:
            chunks = snapshot_push(ids[rank0], values, 2)
            expect_refused(server, lambda c=chunks: list(stub.Push(iter(c), timeout=TIMEOUT)), Code.INVALID_ARGUMENT, needle)
        call(stub, snapshot_push(ids[rank0], torch.cat([params, momentum]), 2))
        state = server.call(lambda: core.store.optimizer_state())
        assert torch.equal(state["state"][0]["momentum_buffer"], momentum) and state["param_groups"][0]["momentum"] == 0.9
        assert torch.equal(server.call(lambda: core.store.flat.clone()), params)
        assert torch.equal(client.pull_optimizer_state(ids["b"], n), momentum)
        flags = [m.header.optimizer_state for m in (
            next(iter(stub.Pull(ps_pb2.PullRequest(worker_id=ids["b"], secret=SECRETS[ids["b"]], **extra), timeout=TIMEOUT)))
            for extra in ({"optimizer_state": True}, {}))]
        assert flags == [True, False]  # the reply says what its payload is
        report_round(server.stub, threads, ids, 2)
        fourth = report_round(server.stub, threads, ids, 3)  # epoch 2 ends: the job's last snapshot
        rank0 = next(n for n, h in fourth.items() if h.snapshot_requested)
        call(stub, snapshot_push(ids[rank0], params, 4))  # parameters alone: an optimizer without state
        assert server.call(lambda: core.store.optimizer_state())["state"] == {}
    finally:
        client.close()


def test_a_server_without_optimizer_state_pulls_leaves_the_momentum_at_zero(tmp_path: Path) -> None:
    """A server that predates `PullRequest.optimizer_state` ignores the field and sends parameters,
    without the reply's `optimizer_state` flag: the worker must not load them as its momentum."""
    def old_pull(request: bytes, context: grpc.ServicerContext):
        yield ps_pb2.ParamsChunk(header=ps_pb2.ParamsHeader(num_values=4, wire_dtype="float32")).SerializeToString()
        yield ps_pb2.ParamsChunk(seq=1, data=torch.ones(4).numpy().tobytes()).SerializeToString()

    handler = grpc.method_handlers_generic_handler(
        "hetero_ps.ParameterServer", {"Pull": grpc.unary_stream_rpc_method_handler(old_pull)})
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    client = PSClient(f"127.0.0.1:{port}")
    try:
        assert client.pull_optimizer_state("w-0", 4) is None
    finally:
        client.close()
        server.stop(None)


def report_then_leave(server, threads, ids: dict[str, str], reporter: str, leaver: str) -> ps_pb2.ParamsHeader:
    """`reporter` reports round 0 and waits; once the server has it, `leaver` leaves; the report's reply."""
    pending = threads.submit(call, server.stub(), report(ids[reporter], 0))
    wait_until(lambda: server.call(lambda: server.coordinator.bsp.round_batch) > 0, f"{reporter}'s report")
    server.stub().Leave(ps_pb2.LeaveRequest(worker_id=ids[leaver], secret=SECRETS[ids[leaver]]), timeout=TIMEOUT)
    return pending.result(TIMEOUT)


def test_a_report_carries_the_batch_told_for_its_round_or_the_one_before(ps_server, threads) -> None:
    """The fast path's worker draws its batch before it reads its previous report's reply, so a report
    for round r may carry what it was told for r or r - 1, and nothing else. c leaves after round 0:
    the re-split (24 each) reaches a and b in round 1's replies, after they drew round 1's batches of 16."""
    server = ps_server(*TINY, "--workers", "3", "--global-batch", "48", "--epochs", "50")
    ids = {n: j.worker_id for n, j in join_all(server, threads, {"a": 1.0, "b": 1.0, "c": 1.0}).items()}
    assert {h.batch_size for h in report_round(server.stub, threads, ids, 0).values()} == {16}
    stub = server.stub()
    stub.Leave(ps_pb2.LeaveRequest(worker_id=ids["c"], secret=SECRETS[ids["c"]]), timeout=TIMEOUT)
    del ids["c"]
    expect_refused(server, lambda: call(stub, report(ids["a"], 1, batch=24)), Code.FAILED_PRECONDITION,
                   "batch size 24 is not what this server planned for worker a at round 1 (told: 16)")
    first = {n: threads.submit(call, server.stub(), report(w, 1, batch=16)) for n, w in ids.items()}
    assert {f.result(TIMEOUT).batch_size for f in first.values()} == {24}  # told for round 2
    for batch in (20, 32):
        expect_refused(server, lambda batch=batch: call(stub, report(ids["a"], 2, batch=batch)), Code.FAILED_PRECONDITION,
                       f"batch size {batch} is not what this server planned", "told: 16, 24")
    lagged = {n: threads.submit(call, server.stub(), report(w, 2, batch=16)) for n, w in ids.items()}  # drawn before
    assert {f.result(TIMEOUT).round for f in lagged.values()} == {3}
    expect_refused(server, lambda: call(stub, report(ids["a"], 3, batch=16)), Code.FAILED_PRECONDITION, "told: 24")


def test_leave_starts_a_new_generation(ps_server, threads) -> None:
    server = ps_server(*TINY)
    ids = {n: j.worker_id for n, j in join_all(server, threads, {"a": 1.0, "b": 1.0}).items()}
    h = report_then_leave(server, threads, ids, "a", "b")  # the round closed with a alone
    assert (h.round, h.generation, h.rank, h.world_size, h.batch_size, h.global_batch) == (1, 2, 0, 1, 32, 32)


def test_a_leave_after_a_report_closes_the_round_without_the_others(ps_server, threads, tmp_path: Path) -> None:
    """a's report says the group's all-reduce of round 0 succeeded. When c leaves, b may be the rank
    whose all-reduce failed part way (c gone before the hub's send to b): it waits for the next
    generation and would wait there for a, which waits for b's report. The round closes instead; b
    forms the next generation at round 1, and a report of round 0 that b still sends is refused."""
    server = ps_server(*TINY, "--workers", "3", "--global-batch", "48", "--metrics-log", str(tmp_path / "metrics.jsonl"))  # 16 each
    ids = {n: j.worker_id for n, j in join_all(server, threads, {"a": 1.0, "b": 1.0, "c": 1.0}).items()}
    h = report_then_leave(server, threads, ids, "a", "c")
    stub = server.stub()
    assert (h.round, h.generation, h.world_size) == (1, 2, 2)
    (b_plan,) = stub.Pull(ps_pb2.PullRequest(worker_id=ids["b"], secret=SECRETS[ids["b"]], header_only=True), timeout=TIMEOUT)
    assert (b_plan.header.round, b_plan.header.generation, {h.rank, b_plan.header.rank}) == (1, 2, {0, 1})
    expect_refused(server, lambda: call(stub, report(ids["b"], 0)), Code.FAILED_PRECONDITION, "round 0 is not open")
    assert server.call(lambda: server.coordinator.samples) == 16  # a's step, counted once
    (closed,) = [e for e in read_metrics(tmp_path / "metrics.jsonl") if e["event"] == "close_without"]
    assert (closed["round"], closed["workers"]) == (0, ["b"])


def test_a_report_from_a_replaced_generation_closes_the_round(ps_server, threads, tmp_path: Path) -> None:
    """The same failure with the leave first (seen in CI: the leaver's Leave beat a's report): c
    leaves, then a reports round 0 from generation 1, whose all-reduce gave it the sum. Generation 2
    exists by then, and b (without the sum) waits there for a, so a's report closes the round at once.
    A report from the current generation still waits for everyone."""
    server = ps_server(*TINY, "--workers", "3", "--global-batch", "48", "--metrics-log", str(tmp_path / "metrics.jsonl"))  # 16 each
    ids = {n: j.worker_id for n, j in join_all(server, threads, {"a": 1.0, "b": 1.0, "c": 1.0}).items()}
    stub = server.stub()
    stub.Leave(ps_pb2.LeaveRequest(worker_id=ids["c"], secret=SECRETS[ids["c"]]), timeout=TIMEOUT)
    h = call(stub, report(ids["a"], 0, generation=1))
    assert (h.round, h.generation, h.world_size) == (1, 2, 2)
    expect_refused(server, lambda: call(stub, report(ids["b"], 0, generation=2)), Code.FAILED_PRECONDITION,
                   "round 0 is not open")
    (closed,) = [e for e in read_metrics(tmp_path / "metrics.jsonl") if e["event"] == "close_without"]
    assert (closed["round"], closed["workers"]) == (0, ["b"])
    pending = threads.submit(call, server.stub(), report(ids["a"], 1, generation=2))
    time.sleep(0.3)
    assert not pending.done()  # the current generation's report waits for b's
    h = call(stub, report(ids["b"], 1, generation=2))
    assert h.round == pending.result(TIMEOUT).round == 2
