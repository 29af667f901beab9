"""A shard's revocations (ps/shards/core.py): the worker ids its coordinator's Commit names as gone are
refused from then on, whatever secret they carry; the commit that names them still counts a slice the
coordinator counted for them, so the shard steps with the coordinator's batches. A shard's Pull: the
header alone where asked, and what only the ParameterServer serves refused."""

from __future__ import annotations

import asyncio

import pytest
import torch

from common.errors import FailedPrecondition, InvalidArgument
from common.job.spec import JobSpec
from common.transport.messages import PushMeta, PushTimes
from common.transport.wire import encode
from ps.serving.worker_keys import WorkerKeys
from ps.shards.core import ShardCore


def loaded(spec: JobSpec, params: torch.Tensor) -> tuple[ShardCore, WorkerKeys]:
    core = ShardCore()
    keys = WorkerKeys()
    core.load({"spec": spec.to_json(), "start": 0, "stop": params.numel(), "round": 0, "params": params,
               "optimizer": None, "max_workers": spec.workers, "worker_key": keys.key.hex()})
    return core, keys


def staged(core: ShardCore, keys: WorkerKeys, name: str, batch: int) -> asyncio.Future[object]:
    meta = PushMeta(name, core.round, 0, batch, PushTimes(1.0), "float32", core.numel, secret=keys.secret(name))
    core.pull(name, keys.secret(name))  # a worker pulls the range before it pushes a slice of it
    receiver = core.begin_push(meta)
    receiver.feed(0, encode(torch.ones(core.numel)))
    return asyncio.ensure_future(core.push(meta, receiver.finish()))


def test_an_id_the_commit_revokes_is_refused_after_its_slice_counted() -> None:
    async def run() -> None:
        core, keys = loaded(JobSpec(workers=2, global_batch=64, lr=0.1), torch.zeros(8))
        gone = staged(core, keys, "gone", 32)  # pushed, then left before the round closed: the coordinator counted it
        kept = staged(core, keys, "kept", 32)
        await asyncio.sleep(0)
        ack = await core.commit(0, {"gone": 32, "kept": 32}, 0.1, wait_s=0.0, revoked=("gone",))
        assert ack.applied_batch == 64 and ack.missing == ()
        await asyncio.gather(gone, kept)  # both answered with the round's values
        for call in (lambda: core.pull("gone", keys.secret("gone")),
                     lambda: core.begin_push(PushMeta("gone", 1, 0, 32, PushTimes(1.0), "float32", 8,
                                                      secret=keys.secret("gone")))):
            with pytest.raises(FailedPrecondition, match="left the job or was evicted: its secret is revoked"):
                call()
        assert core.pull("kept", keys.secret("kept")).header.num_values == 8

    asyncio.run(run())


def test_a_revoked_ids_push_still_arriving_is_refused_when_it_lands() -> None:
    async def run() -> None:
        core, keys = loaded(JobSpec(workers=2, global_batch=64, lr=0.1), torch.zeros(8))
        meta = PushMeta("gone", 0, 0, 32, PushTimes(1.0), "float32", 8, secret=keys.secret("gone"))
        core.pull("gone", meta.secret)
        receiver = core.begin_push(meta)  # its header came in round 0
        await core.commit(0, {}, 0.1, wait_s=0.0, revoked=("gone",))
        receiver.feed(0, encode(torch.ones(8)))
        with pytest.raises(FailedPrecondition, match="revoked"):
            await core.push(PushMeta("gone", 1, 0, 32, PushTimes(1.0), "float32", 8, secret=keys.secret("gone")),
                            receiver.finish())
        assert core._staged == {}

    asyncio.run(run())


def test_a_pull_for_the_header_alone_gets_it_and_opens_no_push() -> None:
    """header_only: the range's header with num_values 0 and no values, which hands the worker nothing
    to compute on, so its push here is still refused until it pulls the values."""
    core, keys = loaded(JobSpec(workers=2, global_batch=64, lr=0.1), torch.zeros(8))
    secret = keys.secret("w")
    reply = core.pull("w", secret, header_only=True)
    assert (reply.header.num_values, reply.header.round, list(reply.payload)) == (0, 0, [])
    meta = PushMeta("w", 0, 0, 32, PushTimes(1.0), "float32", 8, secret=secret)
    with pytest.raises(FailedPrecondition, match="before its first Pull here"):
        core.begin_push(meta)
    assert core.pull("w", secret).header.num_values == 8
    core.begin_push(meta)


@pytest.mark.parametrize(("flag", "fragment"), [
    ("optimizer_state", "a shard serves its range's values, not the optimizer's state"),
    ("wait_for_batch", "wait_for_batch is the ParameterServer's long poll: a shard holds no plan"),
])
def test_a_pull_for_what_only_the_parameter_server_serves_is_refused(flag: str, fragment: str) -> None:
    core, keys = loaded(JobSpec(workers=2, global_batch=64, lr=0.1), torch.zeros(8))
    secret = keys.secret("w")
    with pytest.raises(InvalidArgument, match=fragment):
        core.pull("w", secret, **{flag: True})
    with pytest.raises(FailedPrecondition, match="before its first Pull here"):  # it counts as no pull
        core.begin_push(PushMeta("w", 0, 0, 32, PushTimes(1.0), "float32", 8, secret=secret))


def test_a_slice_with_a_negative_or_non_finite_squared_norm_is_refused() -> None:
    """A shard holds a push's squared norms to the coordinator's rule (PushMeta.check_norms) before it stages anything."""
    core, keys = loaded(JobSpec(workers=2, global_batch=64, lr=0.1), torch.zeros(8))
    secret = keys.secret("w")
    core.pull("w", secret)
    with pytest.raises(InvalidArgument, match="a push's local_sq_norm must be finite and >= 0"):
        core.begin_push(PushMeta("w", 0, 0, 32, PushTimes(1.0), "float32", 8, secret=secret, local_sq_norm=-4.0))
    assert core._staged == {}
