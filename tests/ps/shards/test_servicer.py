"""A shard's Pull through its servicer (ps/shards/servicer.py), driven without a network: the header
alone where header_only asks, and a request the shard cannot serve, or that contradicts itself,
answered with INVALID_ARGUMENT and no reply."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import torch

from protos import ps_pb2
from common.job.spec import JobSpec
from ps.serving.worker_keys import WorkerKeys
from ps.shards.core import ShardCore
from ps.serving.reply_stream import MAX_PULLS_HELD
from ps.shards.servicer import ParameterShardServicer


class Aborted(Exception):
    """What the fake context's abort raises, as grpc.aio's does."""


class Context:
    """The part of a grpc.aio.ServicerContext the Pull handler uses."""

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


def loaded() -> tuple[ShardCore, WorkerKeys]:
    """A shard of 8 values, and the keys of its workers' secrets."""
    core, keys = ShardCore(), WorkerKeys()
    spec = JobSpec(workers=2, global_batch=64, lr=0.1)
    core.load({"spec": spec.to_json(), "start": 0, "stop": 8, "round": 0, "params": torch.zeros(8),
               "optimizer": None, "max_workers": 2, "worker_key": keys.key.hex()})
    return core, keys


def pull(request: ps_pb2.PullRequest) -> list[ps_pb2.ParamsChunk]:
    """The shard's reply to `request` (its worker id's secret filled in), parsed; a shard of 8 values."""
    core, keys = loaded()
    request = ps_pb2.PullRequest(worker_id=request.worker_id, secret=keys.secret(request.worker_id),
                                 header_only=request.header_only, optimizer_state=request.optimizer_state,
                                 wait_for_batch=request.wait_for_batch)

    async def run() -> list[bytes]:
        return [m async for m in ParameterShardServicer(core).Pull(request, Context())]

    return [ps_pb2.ParamsChunk.FromString(bytes(m)) for m in asyncio.run(run())]


def test_a_header_only_pull_is_answered_with_the_header_alone() -> None:
    (only,) = pull(ps_pb2.PullRequest(worker_id="w", header_only=True))
    assert only.header.num_values == 0 and not only.data
    whole = pull(ps_pb2.PullRequest(worker_id="w"))
    assert whole[0].header.num_values == 8 and sum(len(m.data) for m in whole[1:]) == 8 * 4


@pytest.mark.parametrize(("request_", "fragment"), [
    (ps_pb2.PullRequest(worker_id="w", optimizer_state=True),
     "a shard serves its range's values, not the optimizer's state"),
    (ps_pb2.PullRequest(worker_id="w", wait_for_batch=True, header_only=True),
     "wait_for_batch is the ParameterServer's long poll"),
    (ps_pb2.PullRequest(worker_id="w", header_only=True, optimizer_state=True),
     "a Pull asks for header_only or optimizer_state, not both"),
])
def test_a_pull_the_shard_cannot_serve_is_invalid_argument(request_: ps_pb2.PullRequest, fragment: str) -> None:
    with pytest.raises(Aborted) as info:
        pull(request_)
    code, details = info.value.args
    assert code == grpc.StatusCode.INVALID_ARGUMENT and fragment in details


def test_a_worker_holds_at_most_two_pulls_at_a_shard_and_a_wrong_secret_takes_no_place() -> None:
    """Each unread Pull holds its round's copy of the range (ps/serving/reply_stream.py)."""
    core, keys = loaded()
    servicer = ParameterShardServicer(core)
    request = ps_pb2.PullRequest(worker_id="w", secret=keys.secret("w"))

    async def run() -> None:
        held = [servicer.Pull(request, Context()) for _ in range(MAX_PULLS_HELD)]
        for each in held:
            await each.__anext__()  # its header: the reply is under way, unread
        with pytest.raises(Aborted) as beyond:
            await servicer.Pull(request, Context()).__anext__()
        assert beyond.value.args[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(Aborted) as foreign:
            await servicer.Pull(ps_pb2.PullRequest(worker_id="w", secret="x" * 64), Context()).__anext__()
        assert foreign.value.args[0] == grpc.StatusCode.PERMISSION_DENIED
        await held[0].aclose()  # an ended Pull gives its place back
        assert len([m async for m in servicer.Pull(request, Context())]) >= 2

    asyncio.run(run())
