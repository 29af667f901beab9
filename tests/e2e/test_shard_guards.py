"""--shards: what a shard refuses (bad input, slices that could overflow or that no commit counts,
wrong secrets, a missing token), and how shards fail and stop with their server, with real processes."""

from __future__ import annotations

import asyncio
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch

from protos import ps_pb2, ps_pb2_grpc
from common.errors import FailedPrecondition, InvalidArgument, PermissionDenied, Unauthenticated
from common.job.spec import JobSpec
from common.transport.messages import PushMeta, PushTimes
from common.transport.wire import encode
from ps.serving.worker_keys import WorkerKeys
from ps.shards.core import ShardCore
from ps.shards.processes import LocalShards
from tests import processes
from tests.processes import start_server
from tests.shard_processes import listening_port, shard_children
from tests.sharded_jobs import JOB, join_two, same, train
from worker.transport.client import PSClient, ServerError

SHARD_KEY = "a-coordinator-key-for-tests"
CONTROL = [("x-ps-shard-key", SHARD_KEY)]  # the coordinator's credential (ps/shards/control_key.py)


@pytest.fixture
def shard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A running ps-shard loaded by a real coordinator (2 shards, one BSP job; the coordinator's key
    SHARD_KEY), the coordinator, a stub of the shard, and the job's two workers, joined."""
    with monkeypatch.context() as patch:
        patch.setitem(processes.ENV, "PS_SHARD_KEY", SHARD_KEY)
        cluster = start_server(tmp_path, [*JOB, "--shards", "2"])
    (pid,) = shard_children(cluster.server.pid)
    channel = grpc.insecure_channel(f"127.0.0.1:{listening_port(pid)}")
    workers = join_two(cluster.target)
    try:
        yield cluster, ps_pb2_grpc.ParameterShardStub(channel), workers
    finally:
        for client, _ in workers:
            client.close()
        channel.close()
        cluster.stop()


def refused(call, code: grpc.StatusCode, text: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        result = call()
        if hasattr(result, "__iter__"):
            list(result)
    assert info.value.code() == code and text in (info.value.details() or ""), info.value


def test_a_shard_refuses_bad_input_and_keeps_its_values(shard) -> None:
    cluster, stub, workers = shard
    client, joined = workers[0]
    w0, secret = joined.worker_id, client.secret(joined.worker_id)
    before = list(stub.Pull(ps_pb2.PullRequest(worker_id=w0, secret=secret)))
    numel = before[0].header.num_values
    assert numel > 0

    def push(round_: int, values: int, batch: int = 20, worker: str = w0, kind: int = ps_pb2.PUSH_VALUES,
             key: str = secret):
        header = ps_pb2.PushHeader(worker_id=worker, round=round_, batch_size=batch, wire_dtype="float32",
                                   num_values=values, kind=kind, secret=key)
        return stub.Push(iter([ps_pb2.PushChunk(header=header, seq=0, data=b"\0" * 4 * values)]), timeout=10)

    refused(lambda: push(0, numel, worker="stranger", key=""), grpc.StatusCode.UNAUTHENTICATED, "must carry the secret")
    refused(lambda: push(0, numel, key=""), grpc.StatusCode.UNAUTHENTICATED, "must carry the secret")
    refused(lambda: push(0, numel, worker=workers[1][1].worker_id), grpc.StatusCode.PERMISSION_DENIED, "wrong secret")
    refused(lambda: list(stub.Pull(ps_pb2.PullRequest(worker_id=w0, secret="0" * 64), timeout=10)),
            grpc.StatusCode.PERMISSION_DENIED, "wrong secret")
    refused(lambda: list(stub.Pull(ps_pb2.PullRequest(), timeout=10)), grpc.StatusCode.INVALID_ARGUMENT, "needs a worker id")
    refused(lambda: push(0, numel + 1), grpc.StatusCode.INVALID_ARGUMENT, "this shard holds")
    refused(lambda: push(5, numel), grpc.StatusCode.FAILED_PRECONDITION, "round 5 is not open")
    refused(lambda: push(0, numel, batch=0), grpc.StatusCode.INVALID_ARGUMENT, "batch size")
    refused(lambda: push(0, 0, kind=ps_pb2.PUSH_SNAPSHOT), grpc.StatusCode.INVALID_ARGUMENT, "gradient slices")
    refused(lambda: stub.Commit(ps_pb2.CommitRequest(round=3, lr=0.1), timeout=10, metadata=CONTROL),
            grpc.StatusCode.FAILED_PRECONDITION, "open round is 0")
    refused(lambda: stub.Commit(ps_pb2.CommitRequest(round=0, lr=float("nan")), timeout=10, metadata=CONTROL),
            grpc.StatusCode.INVALID_ARGUMENT, "lr must be")
    bad = ps_pb2.CommitRequest(round=0, lr=0.1, contributors=[ps_pb2.Contribution(worker_id="a", batch_size=1)] * 2)
    refused(lambda: stub.Commit(bad, timeout=10, metadata=CONTROL), grpc.StatusCode.INVALID_ARGUMENT, "distinct worker ids")
    refused(lambda: stub.Load(iter([ps_pb2.BlobChunk(seq=0, data=b"not a torch archive")]), timeout=10, metadata=CONTROL),
            grpc.StatusCode.INVALID_ARGUMENT, "bad shard load")
    after = stub.Pull(ps_pb2.PullRequest(worker_id=w0, secret=secret))
    assert [m.SerializeToString() for m in after] == [m.SerializeToString() for m in before]
    # and the job still runs: the coordinator's workers train through this shard
    train(workers, rounds=2)


def test_a_shard_refuses_a_push_before_the_workers_pull_of_its_range(shard) -> None:
    """A worker that never pulled this shard's range (joined only, or pulled at the coordinator alone) has
    its slice refused at once (FAILED_PRECONDITION), as the coordinator refuses a push before a Pull; the
    range stays as it was, and once both workers pull they train through the shard."""
    cluster, stub, workers = shard
    client, joined = workers[1]
    w1, secret = joined.worker_id, client.secret(joined.worker_id)
    (w0client, w0), _ = workers
    before = list(stub.Pull(ps_pb2.PullRequest(worker_id=w0.worker_id, secret=w0client.secret(w0.worker_id))))
    numel = before[0].header.num_values
    header = ps_pb2.PushHeader(worker_id=w1, round=0, batch_size=44, wire_dtype="float32", num_values=numel,
                               secret=secret)

    def push() -> None:
        list(stub.Push(iter([ps_pb2.PushChunk(header=header, seq=0, data=b"\0" * 4 * numel)]), timeout=10))

    refused(push, grpc.StatusCode.FAILED_PRECONDITION, "before its first Pull here")
    client.pull(w1, torch.empty(joined.layout.numel), header_only=True)  # the coordinator's plan, not the range
    refused(push, grpc.StatusCode.FAILED_PRECONDITION, "before its first Pull here")
    after = stub.Pull(ps_pb2.PullRequest(worker_id=w0.worker_id, secret=w0client.secret(w0.worker_id)))
    assert [m.SerializeToString() for m in after] == [m.SerializeToString() for m in before]
    train(workers, rounds=2)


def loaded_shard(spec: JobSpec, params: torch.Tensor) -> ShardCore:
    """A ShardCore holding `params` as the range [0, n) of a job (loaded as a coordinator would)."""
    core = ShardCore()
    core.load({"spec": spec.to_json(), "start": 0, "stop": params.numel(), "round": 0, "params": params,
               "optimizer": None, "max_workers": spec.workers, "worker_key": WorkerKeys().key.hex()})
    return core


def test_a_shard_refuses_a_slice_that_could_overflow_and_keeps_its_values() -> None:
    """A slice whose values could make the commit's step overflow fp32 is refused when it arrives
    (INVALID_ARGUMENT), before the shard sums it: the range and the open round stay as they were."""

    async def run() -> None:
        core = loaded_shard(JobSpec(workers=2, global_batch=64, lr=0.1, momentum=0.9), torch.zeros(8))
        assert core.keys is not None
        meta = PushMeta("w", 0, 0, 32, PushTimes(1.0), "float32", 8, secret=core.keys.secret("w"))
        core.pull("w", meta.secret)
        receiver = core.begin_push(meta)
        receiver.feed(0, encode(torch.full((8,), 3e38)))
        with pytest.raises(InvalidArgument, match="overflow"):
            await core.push(meta, receiver.finish())
        assert core._staged == {} and core._sum is not None and core._sum.count == 0
        assert torch.equal(core.fetch()["params"], torch.zeros(8)) and core.round == 0

    asyncio.run(run())


def test_a_slice_the_commit_does_not_count_is_refused_and_leaves_no_trace() -> None:
    """Slices staged at a shard count only for the commit's contributors, at the batch size the
    coordinator counted for them: a slice from a worker the round did not count, or at another batch
    size, is taken out again and its push refused; the range steps as if they had never come."""
    spec = JobSpec(workers=3, global_batch=64, lr=0.1, momentum=0.9)
    values = {name: torch.randn(8, generator=torch.Generator().manual_seed(i)) for i, name in enumerate("abcd")}

    async def run(pushes: dict[str, int]) -> tuple[torch.Tensor, dict[str, BaseException | None], int]:
        core = loaded_shard(spec, torch.zeros(8))
        keys = WorkerKeys(core.keys.key)
        tasks = {}
        for name, batch in pushes.items():
            meta = PushMeta(name, 0, 0, batch, PushTimes(1.0), "float32", 8, secret=keys.secret(name))
            core.pull(name, meta.secret)
            receiver = core.begin_push(meta)
            receiver.feed(0, encode(values[name]))
            tasks[name] = asyncio.ensure_future(core.push(meta, receiver.finish()))
        await asyncio.sleep(0)
        result = await core.commit(0, {"a": 20, "b": 44}, 0.1, wait_s=0.0)
        outcomes = {}
        for name, task in tasks.items():
            try:
                await task
                outcomes[name] = None
            except FailedPrecondition as exc:
                outcomes[name] = exc
        return core.fetch()["params"], outcomes, result.applied_batch

    clean, _, applied = asyncio.run(run({"a": 20, "b": 44}))
    noisy, outcomes, applied_noisy = asyncio.run(run({"c": 8, "a": 20, "d": 30, "b": 44}))
    assert applied == applied_noisy == 64
    assert same(noisy, clean)  # up to the rounding of taking the others' slices out of the sum again
    assert outcomes["a"] is None and outcomes["b"] is None
    assert all("closed without this worker's push" in str(outcomes[n]) for n in "cd")
    mismatched, outcomes, applied = asyncio.run(run({"a": 20, "b": 43}))  # b's slice at a batch not counted for it
    assert applied == 20 and "closed without this worker's push" in str(outcomes["b"]) and not same(mismatched, clean)


def test_a_shard_checks_the_workers_secrets() -> None:
    async def run() -> None:
        core = loaded_shard(JobSpec(workers=2, global_batch=64), torch.zeros(8))
        keys = WorkerKeys(core.keys.key)
        for secret, error in (("", Unauthenticated), (WorkerKeys().secret("a"), PermissionDenied), (keys.secret("b"), PermissionDenied)):
            with pytest.raises(error):
                core.begin_push(PushMeta("a", 0, 0, 20, PushTimes(1.0), "float32", 8, secret=secret))
            with pytest.raises(error):
                core.pull("a", secret)
        with pytest.raises(FailedPrecondition, match="before its first Pull here"):
            core.begin_push(PushMeta("a", 0, 0, 20, PushTimes(1.0), "float32", 8, secret=keys.secret("a")))
        assert core.pull("a", keys.secret("a")).header.num_values == 8
        core.begin_push(PushMeta("a", 0, 0, 20, PushTimes(1.0), "float32", 8, secret=keys.secret("a")))

    asyncio.run(run())


def test_shard_errors_reach_the_client_and_shards_die_with_the_server(tmp_path: Path) -> None:
    """A push for a closed round fails at the shard as at the coordinator: FAILED_PRECONDITION."""
    cluster = start_server(tmp_path, [*JOB, "--workers", "1", "--shards", "2"])
    client = PSClient(cluster.target)
    try:
        joined = client.join("solo", 1.0, timeout=60)
        params = torch.empty(joined.layout.numel)
        plan = client.pull(joined.worker_id, params)
        grad = torch.zeros(joined.layout.numel)
        meta = PushMeta(joined.worker_id, plan.round, 0, plan.batch_size, PushTimes(1.0), "float32")
        client.push(meta, grad, params)
        with pytest.raises(ServerError) as info:
            client.push(meta, grad, params)
        assert info.value.code == "FAILED_PRECONDITION"
        # a server killed outright takes its shard processes with it
        assert len(shard_children(cluster.server.pid)) == 1
        cluster.server.kill()
        cluster.server.wait()
        for _ in range(100):
            if not shard_children(cluster.server.pid):
                break
            time.sleep(0.1)
        assert not shard_children(cluster.server.pid)
    finally:
        client.close()
        cluster.stop()


def test_a_push_waiting_when_a_sharded_server_stops_hears_the_job_is_done(tmp_path: Path) -> None:
    """SIGTERM while a push waits in the open round: the stop drops the round and no shard commits it,
    so the shard's part of the reply never comes; the push returns the done plan (it does not fail),
    and the parameters stay the last committed round's."""
    cluster = start_server(tmp_path, [*JOB, "--shards", "2"])
    try:
        (client, joined), (other, _) = join_two(cluster.target)
        params = torch.empty(joined.layout.numel)
        plan = client.pull(joined.worker_id, params)
        before = params.clone()
        meta = PushMeta(joined.worker_id, plan.round, plan.version, plan.batch_size, PushTimes(1.0), "float32")
        result: dict[str, Any] = {}

        def push() -> None:
            try:
                result["plan"] = client.push(meta, torch.ones(joined.layout.numel), params)
            except ServerError as exc:
                result["error"] = exc

        pusher = threading.Thread(target=push)
        pusher.start()
        time.sleep(1.0)  # the push waits for the other worker's
        cluster.server.send_signal(signal.SIGTERM)
        pusher.join(60)
        assert not pusher.is_alive()
        assert "error" not in result, result
        assert result["plan"].done
        assert torch.equal(params, before)
        assert cluster.server.wait(60) == 0, cluster.server_log()
    finally:
        for c in (client, other):
            c.close()
        cluster.stop()


def test_the_token_guards_the_shards_too(tmp_path: Path) -> None:
    """With --token the shard processes check it as well: the workers (and the coordinator) carry it."""
    cluster = start_server(tmp_path, [*JOB, "--workers", "1", "--shards", "2", "--token", "s3cret-token-for-shards"])
    try:
        (pid,) = shard_children(cluster.server.pid)
        with grpc.insecure_channel(f"127.0.0.1:{listening_port(pid)}") as channel:
            refused(lambda: ps_pb2_grpc.ParameterShardStub(channel).Pull(ps_pb2.PullRequest(), timeout=10),
                    grpc.StatusCode.UNAUTHENTICATED, "token")
        client = PSClient(cluster.target, token="s3cret-token-for-shards")
        try:
            joined = client.join("solo", 1.0, timeout=60)
            params = torch.empty(joined.layout.numel)
            plan = client.pull(joined.worker_id, params)
            before = params.clone()
            client.push(PushMeta(joined.worker_id, plan.round, 0, plan.batch_size, PushTimes(1.0), "float32"),
                        torch.ones(joined.layout.numel), params)
            assert not torch.equal(params[-10:], before[-10:])  # the shard's range (the end) was stepped
        finally:
            client.close()
    finally:
        cluster.stop()


def test_local_shards_keep_no_folder_once_they_listen() -> None:
    """The shards' port files go as soon as the shards listen: a server killed later (SIGKILL, no
    stop()) leaves no ps-shards-* folder behind in the temporary folder."""
    before = set(Path(tempfile.gettempdir()).glob("ps-shards-*"))
    shards = LocalShards(1)
    try:
        assert len(shards.addresses) == 1 and shards.procs[0].poll() is None
        assert set(Path(tempfile.gettempdir()).glob("ps-shards-*")) == before
    finally:
        shards.stop()
