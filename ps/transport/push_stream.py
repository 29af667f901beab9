"""Reading a push's chunk stream (the ParameterServer's and the shards' Push): header first, then
the payload, fed into the receiver the core hands out for that header. The chunks arrive parsed by
`ps.transport.serialized.data_view_parser` (ps/transport/handlers.py), their data a view of the received bytes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from protos import ps_pb2
from ps.errors import InvalidArgument
from ps.transport.messages import PushMeta
from ps.transport.serialized import DataChunk
from ps.transport.wire import ChunkReceiver

# the wire's PushKind numbers for the core's kind names (ps.transport.messages.PUSH_KINDS), and back
PUSH_KIND_NUMBERS = {"values": ps_pb2.PUSH_VALUES, "report": ps_pb2.PUSH_REPORT, "snapshot": ps_pb2.PUSH_SNAPSHOT}
PUSH_KIND_NAMES = {number: name for name, number in PUSH_KIND_NUMBERS.items()}


def push_meta(h: ps_pb2.PushHeader) -> PushMeta:
    return PushMeta(h.worker_id, h.round, h.version, h.batch_size, h.compute_ms, h.wire_dtype, h.num_values,
                    kind=PUSH_KIND_NAMES.get(h.kind, f"unknown ({h.kind})"), generation=h.generation, secret=h.secret,
                    local_sq_norm=h.local_sq_norm, global_sq_norm=h.global_sq_norm)


async def receive_push(
    chunks: AsyncIterator[DataChunk],
    begin: Callable[[PushMeta], ChunkReceiver],
) -> tuple[PushMeta, ChunkReceiver]:
    """The push's header and its filled receiver (not yet finished). Raises InvalidArgument for a
    malformed stream and DecodeError for an undecodable chunk."""
    first = await anext(aiter(chunks), None)
    if first is None or not first.fields.HasField("header"):
        raise InvalidArgument("the first push chunk must carry the header")
    meta = push_meta(first.fields.header)
    receiver = begin(meta)
    receiver.feed(first.fields.seq, first.data)
    async for chunk in chunks:
        if chunk.fields.HasField("header"):
            raise InvalidArgument(f"chunk {chunk.fields.seq} carries a second header; one push per stream")
        receiver.feed(chunk.fields.seq, chunk.data)
    return meta, receiver
