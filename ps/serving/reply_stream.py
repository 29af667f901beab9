"""A reply streamed to a caller that must keep reading it.

gRPC writes a streamed reply's next message only once the caller's flow-control window has room, so
a caller that stops reading holds the handler, its place among the calls held at once, and the reply's
payload (one copy of the parameters for each version such replies were built from) for as long as it
likes: a member that opened a Pull every round and read none of them made the server hold a copy of
the model per round. Here each message must be taken within a bound, or the call is cancelled, and a
member holds at most MAX_PULLS_HELD Pulls at once."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import contextmanager

from common.errors import ResourceExhausted

MAX_PULLS_HELD = 2
"""The Pulls one member holds at once (a worker makes one at a time): within the reply bound, rounds
may come faster than it, and each unread Pull holds its own version's copy of the parameters."""


async def taken_within(messages: Iterable[bytes], idle_s: float | None) -> AsyncIterator[bytes]:
    """`messages`, each of which the caller must take within `idle_s` seconds (None: no bound); past
    it the handler's task is cancelled, which ends the call (the caller sees it cancelled or past its
    deadline) and lets go of what the reply holds."""
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for message in messages:
        timer = loop.call_later(idle_s, task.cancel) if idle_s is not None and task is not None else None
        try:
            yield message
        finally:
            if timer is not None:
                timer.cancel()


class PullsHeld:
    """The Pulls each member holds at once, at most `most`."""

    def __init__(self, most: int = MAX_PULLS_HELD) -> None:
        self.most = most
        self._held: Counter[str] = Counter()

    @contextmanager
    def holding(self, worker_id: str) -> Iterator[None]:
        """One more Pull of `worker_id` held while the block runs; ResourceExhausted, nothing held, if
        it holds `most` already."""
        if self._held[worker_id] >= self.most:
            raise ResourceExhausted(f"worker {worker_id!r} holds {self.most} Pulls already, the most one member may; "
                                    "read their replies, or try again once they end")
        self._held[worker_id] += 1
        try:
            yield
        finally:
            self._held[worker_id] -= 1
            if not self._held[worker_id]:
                del self._held[worker_id]
