"""`--adaptive-batch gns` on the coordinator: a B₀ outside the range a decision chooses from (larger
than an epoch holds goodput.MIN_STEPS_PER_EPOCH rounds of) moves into it at the first round, before
φ or any round time is measured; a B₀ inside waits for the schedule."""

from __future__ import annotations

import asyncio
import pytest

from ps.control.global_batch.goodput import MIN_STEPS_PER_EPOCH, OUTSIDE
from tests.coordinator_rounds import close_round, joined_job

DIGITS_TRAIN = 1437
"""The digits training split: an epoch holds MIN_STEPS_PER_EPOCH (16) rounds of at most 89 samples."""


@pytest.mark.parametrize(("start", "moved_to"), [(1024, DIGITS_TRAIN // MIN_STEPS_PER_EPOCH), (90, 89), (89, None),
                                                 (64, None)])
def test_a_start_an_epoch_cannot_hold_moves_in_at_the_first_round(start: int, moved_to: int | None) -> None:
    async def run() -> None:
        async with joined_job("--global-batch", str(start), "--min-global-batch", "16", "--max-global-batch", "1024",
                              "--adaptive-batch", "gns", events=("adapt",)) as job:
            c, records = job.c, job.records
            assert sum(c.policy.plan().values()) == start
            await close_round(c, job.joined)
            if moved_to is None:
                assert records == [] and sum(c.policy.plan().values()) == start
                return
            assert [(r["current"], r["batch"], r["changed"], r["reason"], r["global_batch"], r["phi"])
                    for r in records] == [(start, moved_to, True, OUTSIDE, moved_to, None)]
            assert sum(c.policy.plan().values()) == moved_to
            for _ in range(3):
                await close_round(c, job.joined)
            assert len(records) == 1  # inside the range now: the schedule decides

    asyncio.run(run())
