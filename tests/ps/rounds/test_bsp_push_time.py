"""A BSP round tells the batch policy the server's time a push in it (its event loop's CPU over the
round per push: auto/arrival.py plans the order the pushes arrive in by it); a fast-path round tells none."""

from __future__ import annotations

import asyncio

import pytest

from tests.coordinator_rounds import close_round, joined_job


@pytest.mark.parametrize(("flags", "measured"), [((), True), (("--allreduce", "on"), False)])
def test_a_round_tells_the_policy_the_servers_time_a_push(flags: tuple[str, ...], measured: bool) -> None:
    async def run() -> list[tuple[float, float]]:
        told: list[tuple[float, float]] = []
        async with joined_job("--global-batch", "64", *flags) as job:
            calls = job.c.policy_calls
            inner = calls.observe_round

            def recording(round_ms: float, push_ms: float = 0.0) -> None:
                told.append((round_ms, push_ms))
                inner(round_ms, push_ms)

            calls.observe_round = recording  # type: ignore[method-assign]
            for _ in range(4):
                await close_round(job.c, job.joined)
        return told

    told = asyncio.run(run())
    assert len(told) >= 2 and all(r >= 0.0 for r, _ in told)
    assert all(p > 0.0 for _, p in told) if measured else all(p == 0.0 for _, p in told)
