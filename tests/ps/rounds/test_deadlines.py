"""The BSP round's deadlines (ps/rounds/deadlines.py), on a coordinator driven directly with a clock of
the test's: a round nobody's push reached has a deadline from its opening; a name's first round has the
warm-up bound and the same name back does not; a member that entered after the round opened counts
from its entry; the eviction says the bound it applied."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import torch

from common.errors import ResourceExhausted
from common.transport.messages import JoinAsk, JoinInfo, PushMeta, PushTimes
from ps.rounds.coordinator import Coordinator
from ps.rounds.deadlines import MIN_ROUNDS
from ps.server_job import build_job
from tests.conftest import job_args

WARMUP = 10.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def job(*flags: str) -> AsyncIterator[tuple[Coordinator, Clock, dict[str, JoinInfo]]]:
    """A started 2-worker job (a and b) with the test's clock; the round times already past the warm-up."""
    built = build_job(job_args("--global-batch", "24", "--max-workers", "3", "--epochs", "100000", "--evict-after",
                               "3600", "--round-deadline-floor", "1", "--round-warmup", str(WARMUP), *flags))
    c = built.coordinator
    clock = Clock()
    c.clock = clock
    joined = dict(zip("ab", await asyncio.gather(c.join(JoinAsk("a", 1.0)), c.join(JoinAsk("b", 1.0))), strict=True))
    for info in joined.values():  # a worker's first Pull, before its first push
        c.pull(info.worker_id, info.secret, header_only=True)
    for _ in range(MIN_ROUNDS):
        c.deadlines.rounds.observe(0.1)  # D = the floor, 1 s, from here
    try:
        yield c, clock, joined
    finally:
        built.evaluator.close()
        built.metrics.close()


async def push(c: Coordinator, info: JoinInfo) -> asyncio.Future[object]:
    """`info`'s push for the open round, taken in (its reply comes when the round closes)."""
    meta = PushMeta(info.worker_id, c.round, c.version, c.policy.plan()[info.worker_id.rsplit("-", 1)[0]],
                    PushTimes(1.0), "float32", c.own_numel, secret=info.secret)
    c.begin_push(meta)
    pushed = asyncio.ensure_future(c.push(meta, torch.zeros(c.own_numel)))
    for _ in range(3):
        await asyncio.sleep(0)
    return pushed


def reasons(c: Coordinator) -> dict[str, str]:
    return {w: why for w, why in c.membership.departed.items()}


def test_a_round_nobody_pushed_has_a_fixed_deadline_from_its_opening() -> None:
    async def run() -> None:
        async with job("--round-deadline", "2") as (c, clock, joined):
            clock.now += 1.9
            assert c.deadlines.check() == []
            clock.now += 0.2
            assert c.deadlines.check() == ["a", "b"]
            assert set(reasons(c).values()) == {"evicted at round 0's deadline (2.0 s) without its push"}

    asyncio.run(run())


def test_a_round_nobody_pushed_has_the_warm_up_bound_with_an_auto_deadline() -> None:
    """a and b entered for the first time: their first round has the warm-up bound. Back after their
    eviction (and their names' backoff), they enter the open round at once (nobody is left in it) and
    count from there; nobody's push reached it, so the warm-up bound again, named as such."""
    async def run() -> None:
        async with job() as (c, clock, joined):
            clock.now += WARMUP - 0.5
            assert c.deadlines.check() == []
            clock.now += 1.0
            assert c.deadlines.check() == ["a", "b"]
            assert set(reasons(c).values()) == {
                f"evicted at round 0's deadline ({WARMUP:.1f} s: its name's first round, the warm-up bound "
                "(--round-warmup)) without its push"}
            try:
                await c.join(JoinAsk("a", 1.0))
                raise AssertionError("a rejoin without a push came back at once")
            except ResourceExhausted as exc:
                assert "join again in 1.0 s" in str(exc), exc
            clock.now += 1.0
            again = await c.join(JoinAsk("a", 1.0))
            entered = clock.now
            clock.now += WARMUP - 0.5
            assert c.deadlines.check() == []
            clock.now += 1.0
            assert c.deadlines.check() == ["a"], clock.now - entered
            assert c.membership.departed[again.worker_id] == (
                f"evicted at round 0's deadline ({WARMUP:.1f} s: no push of the round arrived, the warm-up bound "
                "(--round-warmup)) without its push")

    asyncio.run(run())


def test_a_name_back_after_its_eviction_is_held_to_the_rounds_deadline_not_the_warm_up() -> None:
    """a pushes every round; b never does. b's first round has the warm-up bound; back (after its
    backoff) without a push taken, it is on probation (ps.rounds.probation): a's pushes close the rounds
    alone. Its probe in, it enters the plan at the next boundary, held to the deadline D = 1 s, and its
    eviction says 1.0 s."""
    async def run() -> None:
        async with job() as (c, clock, joined):
            pushed = await push(c, joined["a"])
            clock.now += WARMUP + 0.5
            assert c.deadlines.check() == ["b"]
            await asyncio.wait_for(pushed, 5)  # the round closed over a's push
            assert reasons(c)[joined["b"].worker_id].endswith("its name's first round, the warm-up bound "
                                                               "(--round-warmup)) without its push")
            clock.now += 1.0  # b's backoff after one departure without a push
            rejoin = asyncio.ensure_future(c.join(JoinAsk("b", 1.0)))
            await asyncio.sleep(0)
            pushed = await push(c, joined["a"])  # closes round 1: b enters at its boundary, on probation
            b = await asyncio.wait_for(rejoin, 5)
            await asyncio.wait_for(pushed, 5)
            assert c.probation.on(c.members[b.worker_id]) and "b" not in c.policy.plan()
            clock.now += WARMUP
            await asyncio.wait_for(await push(c, joined["a"]), 5)  # a alone closes the round
            assert c.deadlines.check() == []
            told = c.pull(b.worker_id, b.secret, header_only=True).header  # its probe, at the open round
            meta = PushMeta(b.worker_id, told.round, told.version, told.batch_size, PushTimes(1.0), "float32",
                            c.own_numel, secret=b.secret)
            c.begin_push(meta)
            probe = asyncio.ensure_future(c.push(meta, torch.zeros(c.own_numel)))
            await asyncio.wait_for(await push(c, joined["a"]), 5)  # its close puts b in the plan
            await asyncio.wait_for(probe, 5)
            pushed = await push(c, joined["a"])
            clock.now += 1.1
            held = c.round
            assert c.deadlines.check() == ["b"]
            assert c.membership.departed[b.worker_id] == f"evicted at round {held}'s deadline (1.0 s) without its push"
            await asyncio.wait_for(pushed, 5)

    asyncio.run(run())
