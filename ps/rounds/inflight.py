"""Pushes in flight: what a peer can make the server hold while its push streams in.

Each push buffers up to a whole model until its last chunk arrives, so a worker has at most one push
in flight (a second, while the first streams or waits for its round, is refused at once and the first
goes on undisturbed; a snapshot, --allreduce the hub's, counts apart from its reports), and the pushes
streaming at once hold at most `limit_bytes` of payload: a push whose header would pass the cap waits,
unread (gRPC's flow control holds its sender), until enough of the others arrived whole. A push
larger than the cap alone still goes, by itself.

The waiting pushes are admitted in the order their headers came (a later one never passes one that
waits), and none waits longer than `wait_s`: then it is refused RESOURCE_EXHAUSTED, which a worker
retries. A worker that leaves or is evicted loses its streams that have not arrived whole (`drop`):
each is cancelled through the callable its slot was given, with the reason, and what it held or
waited for is released at once."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from common.errors import PUSH_IN_FLIGHT, FailedPrecondition, ResourceExhausted
from common.transport.messages import PushMeta
from common.transport.wire import ChunkReceiver, itemsize

ADMIT_WAIT_S = 60.0
"""The longest a push waits for room among the pushes streaming in (--push-admit-wait)."""


@dataclass
class _Waiter:
    nbytes: int
    admitted: asyncio.Future[None]


class PushesInFlight:
    """The workers with a push in flight, the payload bytes the streaming ones reserved, and the
    pushes waiting for room, in their order."""

    def __init__(self, limit_bytes: int, wait_s: float = ADMIT_WAIT_S) -> None:
        if limit_bytes < 1:
            raise ValueError(f"the push bytes limit must be >= 1, got {limit_bytes}")
        if not wait_s > 0:
            raise ValueError(f"the push admission wait must be > 0 seconds, got {wait_s}")
        self.limit_bytes = limit_bytes
        self.wait_s = wait_s
        self.workers: set[tuple[str, bool]] = set()  # (worker id, is a snapshot)
        self.bytes = 0
        self.refused = 0  # second pushes refused
        self.timed_out = 0  # pushes refused after waiting wait_s for room
        self.dropped = 0  # streams cancelled because their worker left or was evicted
        self._waiting: deque[_Waiter] = deque()
        self._slots: set[PushSlot] = set()  # the streams not yet arrived whole

    def slot(self, begin: Callable[[PushMeta], ChunkReceiver], cancel: Callable[[], object] = lambda: None) -> PushSlot:
        """A slot for one Push stream; `begin` validates its header (Coordinator.begin_push), `cancel`
        stops the stream (its handler's task.cancel) when its worker goes (`drop`)."""
        return PushSlot(self, begin, cancel)

    def claim(self, key: tuple[str, bool]) -> None:
        """A push stream of `key` (worker id, is a snapshot) begins: refused while one of the same is in flight."""
        if key in self.workers:
            self.refused += 1
            raise FailedPrecondition(
                f"worker {key[0]!r} {PUSH_IN_FLIGHT}; one at a time (this one is refused, the first goes on)")
        self.workers.add(key)

    def release(self, key: tuple[str, bool]) -> None:
        """The push stream of `key` ended, however."""
        self.workers.discard(key)

    def _fits(self, nbytes: int) -> bool:
        return self.bytes == 0 or self.bytes + nbytes <= self.limit_bytes

    async def reserve(self, nbytes: int) -> None:
        """Wait until `nbytes` of payload fit the cap beside the other streaming pushes, after the pushes
        that waited before this one, and hold them; ResourceExhausted after wait_s."""
        if not self._waiting and self._fits(nbytes):
            self.bytes += nbytes
            return
        loop = asyncio.get_running_loop()
        waiter = _Waiter(nbytes, loop.create_future())
        self._waiting.append(waiter)
        expiry = loop.call_later(self.wait_s, self._expire, waiter)
        try:
            await waiter.admitted
        except asyncio.CancelledError:  # its stream was cancelled (dropped, or its caller went)
            admitted = waiter.admitted
            if admitted.done() and not admitted.cancelled() and admitted.exception() is None:
                self.free(nbytes)  # admitted just before: the room goes back
            else:
                self._give_up(waiter)
            raise
        finally:
            expiry.cancel()

    def _expire(self, waiter: _Waiter) -> None:
        """`waiter` waited wait_s: refused, and the pushes behind it move up."""
        if waiter.admitted.done():
            return
        self.timed_out += 1
        waiter.admitted.set_exception(ResourceExhausted(
            f"this push waited {self.wait_s:g} s (--push-admit-wait) for room among the pushes streaming in "
            f"(--push-buffer-mib {self.limit_bytes / (1 << 20):g}): the server is at its bound; retry"))
        self._give_up(waiter)

    def _give_up(self, waiter: _Waiter) -> None:
        if waiter in self._waiting:
            self._waiting.remove(waiter)
        self._admit_waiting()

    def free(self, nbytes: int) -> None:
        """`nbytes` held arrived whole (or their stream ended): they no longer count against the cap."""
        self.bytes -= nbytes
        self._admit_waiting()

    def _admit_waiting(self) -> None:
        """Admit the waiting pushes, first come first, while the first fits."""
        while self._waiting and (self._waiting[0].admitted.done() or self._fits(self._waiting[0].nbytes)):
            waiter = self._waiting.popleft()
            if not waiter.admitted.done():  # done: its stream was cancelled, and has not heard yet
                self.bytes += waiter.nbytes
                waiter.admitted.set_result(None)

    def enter(self, slot: PushSlot) -> None:
        self._slots.add(slot)

    def leave(self, slot: PushSlot) -> None:
        self._slots.discard(slot)

    def drop(self, worker_id: str, why: str) -> int:
        """`worker_id` left or was evicted: cancel its streams that have not arrived whole, with `why`, and
        release what they held; how many."""
        dropped = [s for s in self._slots if s.key is not None and s.key[0] == worker_id]
        for slot in dropped:
            slot.drop(why)
        self.dropped += len(dropped)
        return len(dropped)


class PushSlot:
    """One push stream's hold on PushesInFlight: `begin` (its header), `admit` (before its payload is
    read), `received` (the payload arrived whole), `close` (the stream ended, however); `dropped` says
    why it was cancelled (its worker went), None while it was not."""

    def __init__(self, pushes: PushesInFlight, begin: Callable[[PushMeta], ChunkReceiver],
                 cancel: Callable[[], object]) -> None:
        self.pushes = pushes
        self._begin = begin
        self._cancel = cancel
        self.key: tuple[str, bool] | None = None
        self.nbytes = 0
        self.reserved = False
        self.dropped: str | None = None

    def begin(self, meta: PushMeta) -> ChunkReceiver:
        receiver = self._begin(meta)
        key = (meta.worker_id, meta.kind == "snapshot")
        self.pushes.claim(key)
        self.key = key
        self.nbytes = max(0, meta.num_values) * itemsize(meta.wire_dtype)  # the dtype was checked by `begin`
        self.pushes.enter(self)
        return receiver

    async def admit(self) -> None:
        """Wait until the payload fits the cap beside the other streaming pushes (ResourceExhausted when
        it waited too long)."""
        await self.pushes.reserve(self.nbytes)
        self.reserved = True
        if self.dropped is not None:  # its worker went as the room came (a cancellation asyncio let pass)
            self.received()
            raise FailedPrecondition(self.dropped)

    def received(self) -> None:
        """The payload arrived whole: its bytes no longer count against the cap, and its worker's going
        no longer cancels it (the push is the round's, or refused, from here)."""
        self.pushes.leave(self)
        if self.reserved:
            self.reserved = False
            self.pushes.free(self.nbytes)

    def drop(self, why: str) -> None:
        """Its worker went: release what the stream holds and cancel it."""
        self.dropped = why
        self.close()
        self._cancel()

    def close(self) -> None:
        self.received()
        if self.key is not None:
            self.pushes.release(self.key)
            self.key = None
