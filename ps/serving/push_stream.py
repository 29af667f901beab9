"""Reading a push's chunk stream (the ParameterServer's and the shards' Push): header first, then
the payload, fed into the receiver the core hands out for that header. The chunks arrive parsed by
`common.transport.serialized.data_view_parser` (ps/serving/handlers.py), their data a view of the received bytes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

from protos import ps_pb2
from common.errors import FailedPrecondition, InvalidArgument
from common.transport.messages import PushMeta
from common.transport.proto_convert import push_meta_from_proto, push_times_from_proto
from common.transport.serialized import DataChunk
from common.transport.wire import ChunkReceiver, OffsetReceiver


class Idle:
    """The idle limit of one push stream: a chunk that brings data (values, the header, the end) restarts
    it, an empty one does not, so a stream that trickles empty chunks is dropped like a silent one."""

    def __init__(self, idle_s: float | None) -> None:
        self.idle_s = idle_s
        self._until: float | None = None

    def progress(self) -> None:
        """Data arrived (or the wait starts): the stream has idle_s from now."""
        if self.idle_s is not None:
            self._until = asyncio.get_running_loop().time() + self.idle_s

    def heard(self, chunk: DataChunk) -> None:
        if len(chunk.data) or chunk.fields.HasField("header") or chunk.fields.HasField("end"):
            self.progress()

    async def next_chunk(self, chunks: AsyncIterator[DataChunk]) -> DataChunk | None:
        """The stream's next chunk (None at its end); FailedPrecondition when no data came within idle_s
        (None: no limit), so a push that stopped mid-stream does not hold its buffer forever."""
        if self.idle_s is None:
            chunk = await anext(chunks, None)
        else:
            if self._until is None:
                self.progress()
            assert self._until is not None
            try:
                chunk = await asyncio.wait_for(anext(chunks, None), max(0.0, self._until - asyncio.get_running_loop().time()))
            except TimeoutError:
                raise FailedPrecondition(f"no data in this push for {self.idle_s:g} s (--push-idle; an empty chunk is "
                                         "no progress); the push is dropped") from None
        if chunk is not None:
            self.heard(chunk)
        return chunk


async def receive_push(
    chunks: AsyncIterator[DataChunk],
    begin: Callable[[PushMeta], ChunkReceiver],
    idle_s: float | None = None,
    admit: Callable[[], Awaitable[None]] | None = None,
) -> tuple[PushMeta, ChunkReceiver | OffsetReceiver]:
    """The push's header and its filled receiver (not yet finished). Raises InvalidArgument for a
    malformed stream, DecodeError for an undecodable chunk, and FailedPrecondition when the stream
    brings no data for `idle_s` (an empty chunk is no progress). `admit`, awaited after the header was accepted and before
    the payload is read, may hold the stream back (the server's cap on the bytes in flight).

    The step's times travel in the PushEnd on the push's last chunk, which replaces the header's
    (checked here; the header's were checked by `begin`); a push without one keeps the header's. A
    push with offsets (PushHeader.offsets: buckets sent during backward) is received in any order
    and must end with a PushEnd; a push without them is in order, and a chunk's offset, if set, is its place."""
    chunks = aiter(chunks)
    idle = Idle(idle_s)
    first = await idle.next_chunk(chunks)
    if first is None or not first.fields.HasField("header"):
        raise InvalidArgument("the first push chunk must carry the header")
    meta = push_meta_from_proto(first.fields.header)
    receiver = begin(meta)
    if admit is not None:
        await admit()
        idle.progress()  # the wait for room was the server's: the stream's idle limit starts after it
    placed = receiver.out_of_order() if meta.offsets else None
    end: ps_pb2.PushEnd | None = None
    chunk: DataChunk | None = first
    while chunk is not None:
        if end is not None:
            raise InvalidArgument(f"chunk {chunk.fields.seq} follows the push's end")
        if chunk is not first and chunk.fields.HasField("header"):
            raise InvalidArgument(f"chunk {chunk.fields.seq} carries a second header; one push per stream")
        if placed is None:
            if chunk.fields.offset not in (0, receiver.filled):  # 0: not set
                raise InvalidArgument(f"chunk {chunk.fields.seq} says offset {chunk.fields.offset}, where this push "
                                      f"(without offsets: in order) is at value {receiver.filled}")
            receiver.feed(chunk.fields.seq, chunk.data)
        else:
            placed.feed_at(chunk.fields.seq, chunk.fields.offset, chunk.data)
        if chunk.fields.HasField("end"):
            end = chunk.fields.end
        chunk = await idle.next_chunk(chunks)
    if end is None:
        if placed is not None:
            raise InvalidArgument("a push with offsets must end with a chunk carrying its end (PushEnd)")
        return meta, receiver
    times = push_times_from_proto(end)
    times.check()
    return replace(meta, times=times), receiver if placed is None else placed
