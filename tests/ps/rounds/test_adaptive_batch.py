"""`--adaptive-batch gns` on the coordinator: a B₀ outside the range a decision chooses from (larger
than an epoch holds goodput.MIN_STEPS_PER_EPOCH rounds of) moves into it at the first round, before
φ or any round time is measured; a B₀ inside waits for the schedule."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from common.transport.messages import JoinAsk
from ps.control.global_batch.goodput import MIN_STEPS_PER_EPOCH, OUTSIDE
from ps.server_job import build_job
from tests.conftest import job_args
from tests.coordinator_rounds import close_round

DIGITS_TRAIN = 1437
"""The digits training split: an epoch holds 8 rounds of at most 179 samples."""


@pytest.mark.parametrize(("start", "moved_to"), [(1024, DIGITS_TRAIN // MIN_STEPS_PER_EPOCH), (180, 179), (179, None),
                                                 (64, None)])
def test_a_start_an_epoch_cannot_hold_moves_in_at_the_first_round(start: int, moved_to: int | None) -> None:
    async def run() -> None:
        built = build_job(job_args("--global-batch", str(start), "--min-global-batch", "16",
                                   "--max-global-batch", "1024", "--adaptive-batch", "gns", "--epochs", "100000",
                                   "--evict-after", "3600"))
        c = built.coordinator
        records: list[dict[str, Any]] = []
        c.metrics.observe(lambda r: records.append(r) if r["event"] == "adapt" else None)
        try:
            joined = dict(zip("ab", await asyncio.gather(c.join(JoinAsk("a", 1.0)), c.join(JoinAsk("b", 1.0))),
                              strict=True))
            assert sum(c.policy.plan().values()) == start
            await close_round(c, joined)
            if moved_to is None:
                assert records == [] and sum(c.policy.plan().values()) == start
                return
            assert [(r["current"], r["batch"], r["changed"], r["reason"], r["global_batch"], r["phi"])
                    for r in records] == [(start, moved_to, True, OUTSIDE, moved_to, None)]
            assert sum(c.policy.plan().values()) == moved_to
            for _ in range(3):
                await close_round(c, joined)
            assert len(records) == 1  # inside the range now: the schedule decides
        finally:
            built.evaluator.close()
            built.metrics.close()

    asyncio.run(run())
