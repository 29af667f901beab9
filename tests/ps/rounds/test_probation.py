"""Probation (ps/rounds/probation.py), on a coordinator driven directly: a newcomer to a running BSP
job is not planned (no round waits for it, Σb = B over the others) until its probe push, which is
checked, not applied nor counted, and measured; it enters the plan at the next round boundary, which
its probe's reply tells. A probationer that leaves changes nothing of the others' plan; the workers
at the start and a name with a push taken are not on probation; with nobody planned left, a
probationer enters the plan on its probe. On the fast path a probationer holds no rank in the group
and its probe is a gradient."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

import pytest
import torch

from common.errors import InvalidArgument
from common.transport.messages import GroupInfo, JoinAsk, JoinInfo, PushMeta, PushTimes, StepReply
from ps.rounds.coordinator import Coordinator
from ps.rounds.probation import probe_batch
from ps.server_job import build_job
from tests.conftest import job_args
from tests.coordinator_rounds import close_round, push

B = 24


@asynccontextmanager
async def running(*flags: str) -> AsyncIterator[tuple[Coordinator, dict[str, JoinInfo]]]:
    """A started 2-worker job (a and b, 1 core each) that closed a round."""
    built = build_job(job_args("--global-batch", str(B), "--max-workers", "4", "--epochs", "100000",
                               "--evict-after", "3600", "--controller", "dynamic", *flags))
    c = built.coordinator
    joined = dict(zip("ab", await asyncio.gather(c.join(JoinAsk("a", 1.0)), c.join(JoinAsk("b", 1.0))), strict=True))
    try:
        await close_round(c, joined)
        yield c, joined
    finally:
        built.evaluator.close()
        built.metrics.close()


async def newcomer(c: Coordinator, joined: dict[str, JoinInfo], name: str, cores: float = 1.0) -> JoinInfo:
    """`name` joins the running job: it enters at the open round's close."""
    joining = asyncio.ensure_future(c.join(JoinAsk(name, cores)))
    await asyncio.sleep(0)
    await close_round(c, joined)
    return await asyncio.wait_for(joining, 5)


def test_the_probe_batch_is_the_cores_share_in_whole_micro_batches_within_the_bounds() -> None:
    assert probe_batch(24, 1.0, 2.0, 1, 24, 1) == 8
    assert probe_batch(24, 1.0, 2.0, 1, 24, 5) == 10  # 8 -> two micro-batches of 5
    assert probe_batch(24, 1.0, 2.0, 1, 6, 4) == 4  # its max batch (6) holds one micro-batch
    assert probe_batch(24, 0.01, 100.0, 3, 24, 1) == 3  # at least the min batch
    assert probe_batch(24, 1.0, 0.0, 1, 24, 8) == 24


def test_a_newcomer_is_on_probation_and_no_round_waits_for_it() -> None:
    async def run() -> None:
        async with running() as (c, joined):
            plan = dict(c.policy.plan())
            info = await newcomer(c, joined, "c")
            member = c.members[info.worker_id]
            assert c.probation.on(member) and not member.warmup
            assert c.policy.plan() == plan and sum(plan.values()) == B  # the others' plan stands
            assert info.batch_size == 8  # a third of B by cores
            header = c.pull(info.worker_id, info.secret, header_only=True).header
            assert (header.round, header.batch_size, header.global_batch) == (c.round, 8, B)
            assert header.slice and header.slice[0].offset == 0 and header.slice[0].count == 8  # the probe slice
            assert info.worker_id not in c.parking.required()
            held = c.sampling.slices.held
            assert info.worker_id not in held  # no slice of the epoch is handed to it
            before = c.round
            await close_round(c, joined)  # a and b close rounds without it
            assert c.round == before + 1 and c.probation.on(member)

    asyncio.run(run())


def test_a_probe_is_checked_not_applied_and_its_reply_tells_the_plan_it_entered() -> None:
    async def run() -> None:
        async with running() as (c, joined):
            info = await newcomer(c, joined, "c")
            samples = c.samples
            probe = await push(c, info, torch.full((c.own_numel,), 3.0))
            assert not probe.done()  # its reply waits for the round's close
            assert c.bsp.pushes() == 0 and info.worker_id not in c.bsp.pushed
            replies = await close_round(c, joined)
            reply = await asyncio.wait_for(probe, 5)
            assert c.samples == samples + B  # the round's B; the probe counted none
            assert not c.probation.on(c.members[info.worker_id])
            plan = c.policy.plan()
            assert set(plan) == {"a", "b", "c"} and sum(plan.values()) == B
            assert (reply.header.round, reply.header.batch_size) == (c.round, plan["c"])
            assert all(r.header.round == c.round for r in replies)
            assert c.policy.smoothed_ms()["c"] is not None  # the probe's time, its first measurement
            assert c.membership.names.proven("c")
            await close_round(c, {**joined, "c": info})  # it trains: the round waits for it too
            assert c.samples == samples + 2 * B

    asyncio.run(run())


def test_a_probe_told_rounds_ago_is_taken_once_and_one_for_a_round_to_come_is_refused() -> None:
    async def run() -> None:
        async with running() as (c, joined):
            info = await newcomer(c, joined, "c")
            told = c.pull(info.worker_id, info.secret, header_only=True).header
            await close_round(c, joined)
            await close_round(c, joined)  # the round it was told is two behind: a probe takes its time
            ahead = PushMeta(info.worker_id, c.round + 1, told.version, told.batch_size, PushTimes(1.0), "float32",
                             c.own_numel, secret=info.secret)
            with pytest.raises(Exception, match="is not open"):
                c.begin_push(ahead)
            meta = PushMeta(info.worker_id, told.round, told.version, told.batch_size, PushTimes(1.0), "float32",
                            c.own_numel, secret=info.secret)
            c.begin_push(meta)
            probe = asyncio.ensure_future(c.push(meta, torch.zeros(c.own_numel)))
            await asyncio.sleep(0)
            with pytest.raises(Exception, match="already pushed its probe"):
                c.begin_push(meta)
            await close_round(c, joined)
            await asyncio.wait_for(probe, 5)

    asyncio.run(run())


def test_a_probationer_that_goes_changes_nothing_of_the_plan_and_backs_off() -> None:
    async def run() -> None:
        async with running() as (c, joined):
            info = await newcomer(c, joined, "c")
            plan = dict(c.policy.plan())
            await c.leave(info.worker_id, info.secret)
            assert c.policy.plan() == plan and not c.probation.probes
            with pytest.raises(Exception, match="join again in"):
                await c.join(JoinAsk("c", 1.0))

    asyncio.run(run())


def test_a_probationer_that_heartbeats_but_never_probes_is_evicted_at_the_warm_up_bound() -> None:
    """It holds no round, but a place among --max-workers: the warm-up bound after the ask frees it,
    and its name backs off; the others' plan stands."""
    async def run() -> None:
        async with running("--round-warmup", "5") as (c, joined):
            now = [c.clock()]
            c.clock = lambda: now[0]  # type: ignore[method-assign]
            idle = await newcomer(c, joined, "c")
            plan = dict(c.policy.plan())
            now[0] += 4.0
            c.heartbeat(idle.worker_id, idle.secret)
            assert c.deadlines.check() == [] and c.probation.on(c.members[idle.worker_id])
            await close_round(c, joined)  # the planned workers go on: their round is not late
            now[0] += 2.0  # 6 s after the ask: past --round-warmup
            c.heartbeat(idle.worker_id, idle.secret)
            assert c.deadlines.check() == ["c"] and idle.worker_id not in c.members
            assert c.policy.plan() == plan and not c.probation.probes
            with pytest.raises(Exception, match="join again in"):
                await c.join(JoinAsk("c", 1.0))

    asyncio.run(run())


def test_with_nobody_planned_left_a_probationer_enters_the_plan_on_its_probe() -> None:
    """Its probe's batch was told for the open round: it enters on its probe push (the open round
    afresh, with all of B), never before, so that push counts in no round."""
    async def run() -> None:
        async with running() as (c, joined):
            info = await newcomer(c, joined, "c")
            open_round = c.round
            for w in joined.values():
                await c.leave(w.worker_id, w.secret)
            assert info.worker_id in c.probation.probes and "c" not in c.policy.plan()
            probed = await asyncio.wait_for(await push(c, info), 5)
            assert not c.probation.probes and c.policy.plan() == {"c": B} and c.round == open_round
            assert (probed.header.round, probed.header.batch_size) == (open_round, B)
            (reply,) = await close_round(c, {"c": info})
            assert c.round == open_round + 1 and reply.header.batch_size == B

    asyncio.run(run())


def test_on_the_fast_path_a_probationer_holds_no_rank_and_probes_with_its_whole_gradient() -> None:
    """--allreduce: the group does not re-form for a probationer, whose replies name no group and ask
    for a probe; a report from it proves nothing and is refused; its probe, a gradient pushed to the
    server whatever the path, is checked and dropped, and it enters the plan and the group's next
    generation at the round's close."""
    async def run() -> None:
        async with running("--allreduce", "on", "--sampling", "independent") as (c, joined):
            generation = c.fast_path.generation()
            info = await newcomer(c, joined, "c")
            assert c.probation.on(c.members[info.worker_id]) and info.group == GroupInfo()
            assert c.fast_path.generation() == generation and c.rendezvous.group.world_size == 2
            told = c.pull(info.worker_id, info.secret, header_only=True).header
            assert told.probe and told.group == GroupInfo() and not told.snapshot_requested and told.batch_size == 8
            report = PushMeta(info.worker_id, told.round, told.version, told.batch_size, PushTimes(1.0), "float32",
                              kind="report", secret=info.secret)
            with pytest.raises(InvalidArgument, match="on probation: its push is its probe's whole gradient"):
                c.begin_push(report)
            await close_round(c, joined)  # a and b train on in their group of two
            samples = c.samples
            probe = await push(c, info, torch.full((c.layout.numel,), 3.0))
            assert not probe.done() and c.bsp.pushes() == 0
            await close_round(c, joined)
            reply = await asyncio.wait_for(probe, 5)
            assert c.samples == samples + B and not c.probation.probes
            assert not reply.header.probe and reply.header.batch_size == c.policy.plan()["c"]
            assert c.fast_path.generation() == generation + 1 and reply.header.group.world_size == 3
            assert reply.header.group.generation == generation + 1 and reply.header.num_values == 0
            await close_round(c, {**joined, "c": info})  # it reports in the group of three
            assert c.samples == samples + 2 * B

    asyncio.run(run())


def test_a_name_with_a_push_taken_rejoins_without_probation() -> None:
    async def run() -> None:
        async with running() as (c, joined):
            b = joined.pop("b")
            await c.leave(b.worker_id, b.secret)  # b pushed a round: its name is proven
            back = await newcomer(c, joined, "b")
            assert not c.probation.probes and set(c.policy.plan()) == {"a", "b"}
            assert back.batch_size == c.policy.plan()["b"]

    asyncio.run(run())


def test_asp_has_no_probation() -> None:
    async def run() -> None:
        built = build_job(job_args("--mode", "asp", "--global-batch", str(B), "--max-workers", "4",
                                   "--evict-after", "3600"))
        c = built.coordinator
        try:
            await asyncio.gather(c.join(JoinAsk("a", 1.0)), c.join(JoinAsk("b", 1.0)))
            info = await c.join(JoinAsk("c", 1.0))
            assert not c.probation.probes and "c" in c.policy.plan() and info.batch_size > 0
        finally:
            built.evaluator.close()
            built.metrics.close()

    asyncio.run(run())
