"""The chunk messages (PushChunk, ParamsChunk, BlobChunk) as the service sends them: each message's
bytes before its data (a `Frame`, common.transport.payload: the values are written after it in place,
common.transport.serialized.data_header), and the messages that carry no data. With
common.transport.proto_convert, the only code that builds protobuf messages."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from protos import ps_pb2
from common.transport.messages import PushMeta, PushTimes, StepReply
from common.transport.payload import Frame
from common.transport.proto_convert import push_meta_to_proto, push_times_to_proto, step_header_to_proto
from common.transport.serialized import data_header


def params_chunk(seq: int, nbytes: int) -> bytes:
    """What a serialized ParamsChunk puts before payload chunk `seq`'s data (the cores' Payload frame;
    the data is written after it in place). Its message seq is seq + 1: message 0 of a reply is the
    header alone."""
    return data_header(ps_pb2.ParamsChunk(seq=seq + 1), nbytes)


def reply_messages(reply: StepReply) -> Iterator[bytes]:
    """A StepReply as a serialized ParamsChunk stream: the header message, then the payload chunks.

    The core's payload chunks are already serialized ParamsChunks (the servicers have the core's
    Payload frame them with `params_chunk`), built once per parameter version and shared by every
    reply that carries it, as they are: a reply adds only its own header message (seq 0, no data).
    The response serializer passes bytes through (ps/serving/handlers.py, common/transport/serialized.py),
    so gRPC sends these as they are.
    """
    yield ps_pb2.ParamsChunk(header=step_header_to_proto(reply.header)).SerializeToString()
    yield from reply.payload  # framed as they are reached (common.transport.payload), the first while later ones step


def push_frame(meta: PushMeta) -> Frame:
    """The frame of a push whose chunks go in order from value 0 (common.transport.payload.frame_tensor):
    the header (`meta`, its num_values this server's part) on chunk 0, none on the others."""
    head = push_meta_to_proto(meta)

    def push_chunk(seq: int, nbytes: int) -> bytes:
        return data_header(ps_pb2.PushChunk(header=head if seq == 0 else None, seq=seq), nbytes)

    return push_chunk


def push_header_message(meta: PushMeta) -> bytes:
    """The first message of a push with offsets (`meta.offsets`: buckets sent during backward): the
    header alone, seq 0."""
    return data_header(ps_pb2.PushChunk(header=push_meta_to_proto(meta), seq=0), 0)


def offset_frame(first_seq: int, offset: int, per_chunk: int) -> Frame:
    """The frame of one bucket's chunks in a push with offsets: the bucket's chunk `index` is message
    `first_seq + index`, its values from `offset + index * per_chunk` of the server's range on."""

    def chunk(index: int, nbytes: int) -> bytes:
        return data_header(ps_pb2.PushChunk(seq=first_seq + index, offset=offset + index * per_chunk), nbytes)

    return chunk


def push_end_message(seq: int, times: PushTimes) -> bytes:
    """The last message of a push with offsets, message `seq`: the step's times (PushEnd), no data."""
    return data_header(ps_pb2.PushChunk(seq=seq, end=push_times_to_proto(times)), 0)


def blob_chunks(parts: Iterable[bytes]) -> Iterator[ps_pb2.BlobChunk]:
    """A blob's parts (ps.serving.blob.pack) as the BlobChunks of a shard's Load or Fetch."""
    for seq, data in enumerate(parts):
        yield ps_pb2.BlobChunk(seq=seq, data=data)
