"""A reply streamed to a caller that must keep reading it.

gRPC writes a streamed reply's next message only once the caller's flow-control window has room, so
a caller that stops reading holds the handler, its place among the calls held at once, and the reply's
payload (one copy of the parameters for each version such replies were built from) for as long as it
likes: a member that opened a Pull every round and read none of them made the server hold a copy of
the model per round. Here each message must be taken within a bound, or the call is cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable


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
