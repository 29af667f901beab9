"""Reading a push's chunk stream (the ParameterServer's and the shards' Push): header first, then
the payload, fed into the receiver the core hands out for that header. The chunks arrive parsed by
`common.transport.serialized.data_view_parser` (common/transport/handlers.py), their data a view of the received bytes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from protos import ps_pb2
from common.errors import InvalidArgument
from common.transport.messages import PushMeta
from common.transport.proto_convert import push_meta_from_proto, push_times_from_proto
from common.transport.serialized import DataChunk
from common.transport.wire import ChunkReceiver, OffsetReceiver


async def receive_push(
    chunks: AsyncIterator[DataChunk],
    begin: Callable[[PushMeta], ChunkReceiver],
) -> tuple[PushMeta, ChunkReceiver]:
    """The push's header and its filled receiver (not yet finished). Raises InvalidArgument for a
    malformed stream and DecodeError for an undecodable chunk.

    A push with offsets (PushHeader.offsets: buckets sent during backward) is received in any order
    and must end with a chunk carrying PushEnd, whose times replace the header's (checked here; the
    header's were checked by `begin`)."""
    first = await anext(aiter(chunks), None)
    if first is None or not first.fields.HasField("header"):
        raise InvalidArgument("the first push chunk must carry the header")
    meta = push_meta_from_proto(first.fields.header)
    receiver = begin(meta)
    if not meta.offsets:
        receiver.feed(first.fields.seq, first.data)
        async for chunk in chunks:
            if chunk.fields.HasField("header"):
                raise InvalidArgument(f"chunk {chunk.fields.seq} carries a second header; one push per stream")
            receiver.feed(chunk.fields.seq, chunk.data)
        return meta, receiver
    placed = receiver.out_of_order()
    end: ps_pb2.PushEnd | None = None
    chunk = first
    while True:
        if end is not None:
            raise InvalidArgument(f"chunk {chunk.fields.seq} follows the push's end")
        if chunk is not first and chunk.fields.HasField("header"):
            raise InvalidArgument(f"chunk {chunk.fields.seq} carries a second header; one push per stream")
        placed.feed_at(chunk.fields.seq, chunk.fields.offset, chunk.data)
        if chunk.fields.HasField("end"):
            end = chunk.fields.end
        chunk = await anext(chunks, None)
        if chunk is None:
            break
    if end is None:
        raise InvalidArgument("a push with offsets must end with a chunk carrying its end (PushEnd)")
    times = push_times_from_proto(end)
    times.check()
    return replace(meta, times=times), placed
