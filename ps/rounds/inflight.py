"""Pushes in flight: what a peer can make the server hold while its push streams in.

Each push buffers up to a whole model until its last chunk arrives, so a worker has at most one push
in flight (a second, while the first streams or waits for its round, is refused at once and the first
goes on undisturbed; a snapshot, --allreduce the hub's, counts apart from its reports), and the pushes
streaming at once hold at most `limit_bytes` of payload: a push whose header would pass the cap waits,
unread (gRPC's flow control holds its sender), until enough of the others arrived whole. A push
larger than the cap alone still goes, by itself."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from common.errors import PUSH_IN_FLIGHT, FailedPrecondition
from common.transport.messages import PushMeta
from common.transport.wire import ChunkReceiver, itemsize


class PushesInFlight:
    """The workers with a push in flight and the payload bytes the streaming ones reserved."""

    def __init__(self, limit_bytes: int) -> None:
        if limit_bytes < 1:
            raise ValueError(f"the push bytes limit must be >= 1, got {limit_bytes}")
        self.limit_bytes = limit_bytes
        self.workers: set[tuple[str, bool]] = set()  # (worker id, is a snapshot)
        self.bytes = 0
        self.refused = 0  # second pushes refused
        self._freed = asyncio.Event()

    def slot(self, begin: Callable[[PushMeta], ChunkReceiver]) -> PushSlot:
        """A slot for one Push stream; `begin` validates its header (Coordinator.begin_push)."""
        return PushSlot(self, begin)

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

    async def reserve(self, nbytes: int) -> None:
        """Wait until `nbytes` of payload fit the cap beside the other streaming pushes, and hold them."""
        while self.bytes > 0 and self.bytes + nbytes > self.limit_bytes:
            await self._freed.wait()
        self.bytes += nbytes

    def free(self, nbytes: int) -> None:
        """`nbytes` held arrived whole: they no longer count against the cap."""
        self.bytes -= nbytes
        self._freed.set()
        self._freed = asyncio.Event()


class PushSlot:
    """One push stream's hold on PushesInFlight: `begin` (its header), `admit` (before its payload is
    read), `received` (the payload arrived whole), `close` (the stream ended, however)."""

    def __init__(self, pushes: PushesInFlight, begin: Callable[[PushMeta], ChunkReceiver]) -> None:
        self.pushes = pushes
        self._begin = begin
        self.key: tuple[str, bool] | None = None
        self.nbytes = 0
        self.reserved = False

    def begin(self, meta: PushMeta) -> ChunkReceiver:
        receiver = self._begin(meta)
        key = (meta.worker_id, meta.kind == "snapshot")
        self.pushes.claim(key)
        self.key = key
        self.nbytes = max(0, meta.num_values) * itemsize(meta.wire_dtype)  # the dtype was checked by `begin`
        return receiver

    async def admit(self) -> None:
        """Wait until the payload fits the cap beside the other streaming pushes."""
        await self.pushes.reserve(self.nbytes)
        self.reserved = True

    def received(self) -> None:
        """The payload arrived whole: its bytes no longer count against the cap."""
        if self.reserved:
            self.reserved = False
            self.pushes.free(self.nbytes)

    def close(self) -> None:
        self.received()
        if self.key is not None:
            self.pushes.release(self.key)
            self.key = None
