"""A streamed reply's messages must each be taken within a bound (ps/serving/reply_stream.py): a caller
that stops reading has its call cancelled; one that keeps reading gets every message, however long
the whole reply takes."""

from __future__ import annotations

import asyncio

import pytest

from common.errors import ResourceExhausted
from ps.serving.reply_stream import PullsHeld, taken_within


async def take(messages: list[bytes], idle_s: float | None, pause_s: float) -> list[bytes]:
    """The messages a caller that pauses `pause_s` after each takes."""
    taken = []
    async for message in taken_within(messages, idle_s):
        taken.append(message)
        await asyncio.sleep(pause_s)
    return taken


def test_a_caller_that_keeps_taking_gets_every_message_past_the_bound_in_all() -> None:
    messages = [b"%d" % i for i in range(10)]
    assert asyncio.run(take(messages, 0.2, 0.05)) == messages  # 0.5 s in all, each within 0.2 s


def test_a_caller_that_stops_taking_is_cancelled_at_the_bound() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(asyncio.CancelledError):
            await take([b"a", b"b", b"c"], 0.2, 30.0)
        return loop.time() - started

    assert 0.15 <= asyncio.run(main()) < 5.0


def test_no_bound_cancels_nothing() -> None:
    assert asyncio.run(take([b"a", b"b"], None, 0.3)) == [b"a", b"b"]


def test_a_member_holds_at_most_its_pulls_and_each_ended_one_gives_its_place_back() -> None:
    pulls = PullsHeld(most=2)
    with pulls.holding("w0"), pulls.holding("w0"), pulls.holding("w1"):
        with pytest.raises(ResourceExhausted, match="worker 'w0' holds 2 Pulls already"):
            with pulls.holding("w0"):
                pass
    with pulls.holding("w0"), pulls.holding("w0"):
        pass
