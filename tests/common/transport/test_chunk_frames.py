"""The chunk messages as common/transport/chunk_frames.py frames them: a push's chunks, in order or with
offsets, parse to the PushChunks they stand for, their data 16-byte aligned, and go through the
server's push reader to the header, times and values sent; a blob's parts become its BlobChunks."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import torch

from protos import ps_pb2
from common.transport.chunk_frames import (
    blob_chunks,
    offset_frame,
    push_end_message,
    push_frame,
    push_header_message,
)
from common.transport.messages import PushMeta, PushTimes
from common.transport.payload import frame_tensor
from common.transport.proto_convert import push_meta_to_proto, push_times_to_proto
from common.transport.serialized import DataChunk, data_view_parser
from common.transport.wire import ChunkReceiver
from ps.serving.push_stream import receive_push
from tests.rpc_calls import rand

META = PushMeta("w-1", 4, 0, 8, PushTimes(2.5, 1.0, 0.5, 0.25), "float32", 3000, secret="s3cret")


def test_a_push_in_order_carries_its_header_on_the_first_chunk_alone() -> None:
    values = rand(3000, seed=1)
    messages = list(frame_tensor(values, "float32", push_frame(META), chunk_bytes=4096))
    parsed = [ps_pb2.PushChunk.FromString(m) for m in messages]
    assert [p.seq for p in parsed] == [0, 1, 2]
    assert parsed[0].header == push_meta_to_proto(META) and not any(p.HasField("header") for p in parsed[1:])
    assert torch.equal(torch.frombuffer(bytearray(b"".join(p.data for p in parsed)), dtype=torch.float32), values)
    assert all((len(m) - len(p.data)) % 16 == 0 for m, p in zip(messages, parsed, strict=True))  # data aligned


def test_a_push_with_offsets_is_its_header_the_buckets_at_their_offsets_and_its_end() -> None:
    """Two buckets sent last first, as backward hands them out, then the end with the step's times."""
    meta = PushMeta("w-1", 4, 0, 8, PushTimes(), "float32", 3000, secret="s3cret", offsets=True)
    values, per_chunk = rand(3000, seed=2), 1024
    messages = [push_header_message(meta)]
    for offset in (2048, 0):
        bucket = values[offset : offset + 2048]
        messages += frame_tensor(bucket, "float32", offset_frame(len(messages), offset, per_chunk), per_chunk * 4)
    messages.append(push_end_message(len(messages), META.times))
    parsed = [ps_pb2.PushChunk.FromString(m) for m in messages]
    assert parsed[0].header == push_meta_to_proto(meta) and parsed[0].data == b""
    assert [p.seq for p in parsed] == list(range(len(parsed)))
    assert [p.offset for p in parsed[1:-1]] == [2048, 0, 1024]
    assert parsed[-1].end == push_times_to_proto(META.times) and parsed[-1].data == b""

    async def chunks() -> AsyncIterator[DataChunk]:
        parse = data_view_parser(ps_pb2.PushChunk)
        for message in messages:
            yield parse(message)

    got, receiver = asyncio.run(receive_push(chunks(), lambda m: ChunkReceiver(m.num_values, m.wire_dtype)))
    assert got == dataclasses.replace(meta, times=META.times)
    assert torch.equal(receiver.finish().contiguous(), values)


def test_a_blobs_parts_are_its_chunks_in_order() -> None:
    parts = [b"first", b"", b"\x00third"]
    assert [(c.seq, c.data) for c in blob_chunks(parts)] == [(0, b"first"), (1, b""), (2, b"\x00third")]
