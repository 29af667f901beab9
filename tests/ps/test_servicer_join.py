"""The servicer's Join, Leave and worker secrets against an in-process server: what a join is told,
every bad join refused without a trace, unknown ids, and a secret per worker that opens nothing else."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import pytest
import torch

from protos import ps_pb2
from common.job.models import build_model
from common.job.spec import JobSpec
from common.transport.messages import MAX_LEAVE_REASON
from common.transport.layout import Layout
from ps.ops.progress import NO_WORKER_LEFT, progress_line
from tests.state_compare import assert_same
from tests.rpc_calls import (
    Code, OpenRound, SECRETS, TIMEOUT, expect_refused, header, join, join_all, leave, open_round, pull,
    push, push_chunks, rand, read_params, sgd_step, snapshot, start_cluster,
)

if TYPE_CHECKING:
    from tests.conftest import InProcessServer


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
        ("w\x1b[2J\r", 1.0, "name must be printable (no control characters)"),
        (" w", 1.0, "name must not begin or end with whitespace, got ' w'"),
        ("w ", 1.0, "name must not begin or end with whitespace"),
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
    # b enters on probation (ps.rounds.probation): its probe is its share, 2; a's plan stands
    assert a.batch_size == 4 and b.result(TIMEOUT).batch_size == 2 and (h.round, h.batch_size) == (1, 4)
    expect_refused(server, lambda: join(stub, "c", 1.0), Code.FAILED_PRECONDITION,
                   "job full: the global batch 4 cannot give one more worker its minimum batch",
                   "3 workers at --min-batch 2 take a global batch of 6: raise --global-batch to 6 or lower --min-batch")
    leave(stub, b.result().worker_id)
    c = threads.submit(join, server.stub(), "c", 1.0)
    wait_pending(server, 1)
    h, _ = push(stub, push_chunks(header(a.worker_id, grad, round=1, batch_size=4), grad))
    assert c.result(TIMEOUT).batch_size == 2 and h.batch_size == 4


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
    # b left without a push: its name waits a second before it joins again (ps/rounds/rejoins.py)
    expect_refused(c.server, lambda: join(c.stub, "b"), Code.RESOURCE_EXHAUSTED, "join again in")
    time.sleep(1.0)
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


# ------------------------------------------------------------------------ Leave
def test_a_leave_says_why_in_its_record_and_progress_and_a_bad_reason_changes_nothing(ps_server, threads) -> None:
    """LeaveRequest.reason (a worker that stopped on a corrupt sample says which) goes into the leave
    record as `why` and into the progress line, and does nothing else: the job goes on, and waits
    once no worker is left. One over MAX_LEAVE_REASON characters, or not printable, is INVALID_ARGUMENT
    and the worker stays."""
    c = start_cluster(ps_server, threads, "--global-batch", "32")
    records: list[dict] = []
    c.server.coordinator.metrics.observe(lambda r: records.append(r) if r["event"] == "leave" else None)
    a, b = c.ids["a"], c.ids["b"]
    for bad in ("x" * (MAX_LEAVE_REASON + 1), "corrupt sample\n/data/c1/7.png", "bell \x07"):
        expect_refused(c.server, lambda bad=bad: c.stub.Leave(ps_pb2.LeaveRequest(worker_id=b, secret=SECRETS[b], reason=bad),
                                                             timeout=TIMEOUT),
                       Code.INVALID_ARGUMENT, f"a Leave's reason must be at most {MAX_LEAVE_REASON} printable characters")
    c.stub.Leave(ps_pb2.LeaveRequest(worker_id=b, secret=SECRETS[b], reason="corrupt sample /data/c1/7.png"), timeout=TIMEOUT)
    c.stub.Leave(ps_pb2.LeaveRequest(worker_id=a, secret=SECRETS[a], reason="x" * MAX_LEAVE_REASON), timeout=TIMEOUT)
    assert [(r["worker"], r["reason"], r.get("why"), r["workers_left"], r["done"]) for r in records] == [
        ("b", "left", "corrupt sample /data/c1/7.png", 1, False), ("a", "left", "x" * MAX_LEAVE_REASON, 0, False)]
    assert progress_line(records[0]) == "b left: corrupt sample /data/c1/7.png"
    assert progress_line(records[1]) == f"a left: {'x' * MAX_LEAVE_REASON} ({NO_WORKER_LEFT})"
    assert not c.server.call(lambda: c.server.coordinator.done)  # a reason ends no job: it waits for a join
