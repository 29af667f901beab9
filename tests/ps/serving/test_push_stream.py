"""A push's chunk stream read by receive_push (ps/serving/push_stream.py): the times of the
PushEnd that closes it replace the header's, on a whole push as on one with offsets; a push without
one keeps the header's; nothing may follow the end; a chunk in order is where its offset says, if it
says one; only data keeps a push within its idle limit."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import pytest
import torch

from protos import ps_pb2
from common.errors import FailedPrecondition, InvalidArgument
from common.transport.messages import PushMeta, PushTimes
from common.transport.serialized import DataChunk, data_view_parser
from common.transport.wire import ChunkReceiver, encode
from ps.serving.push_stream import receive_push

PARSE = data_view_parser(ps_pb2.PushChunk)
END = ps_pb2.PushEnd(compute_ms=12.5, exposed_ms=3.0, own_exposed_ms=1.5, data_wait_ms=0.25)


def header(num_values: int, offsets: bool = False) -> ps_pb2.PushHeader:
    return ps_pb2.PushHeader(worker_id="w", batch_size=4, compute_ms=7.0, exposed_ms=2.0, wire_dtype="float32",
                             num_values=num_values, offsets=offsets)


async def stream(chunks: list[ps_pb2.PushChunk]) -> AsyncIterator[DataChunk]:
    for chunk in chunks:
        yield PARSE(chunk.SerializeToString())


def receive(chunks: list[ps_pb2.PushChunk]) -> tuple[PushMeta, torch.Tensor]:
    async def run() -> tuple[PushMeta, torch.Tensor]:
        meta, receiver = await receive_push(stream(chunks), lambda m: ChunkReceiver(m.num_values, m.wire_dtype))
        vector = receiver.finish()
        return meta, vector[0 : vector.numel()].float()

    return asyncio.run(run())


def whole(values: torch.Tensor, end: ps_pb2.PushEnd | None) -> list[ps_pb2.PushChunk]:
    """A push in order: the header with the first values, the rest, then (if given) an empty chunk with the end."""
    data = bytes(encode(values, "float32"))
    chunks = [ps_pb2.PushChunk(header=header(values.numel()), seq=0, data=data[:8]),
              ps_pb2.PushChunk(seq=1, data=data[8:])]
    return chunks + ([ps_pb2.PushChunk(seq=2, end=end)] if end is not None else [])


def test_a_whole_push_takes_its_times_from_its_end() -> None:
    values = torch.arange(6, dtype=torch.float32)
    meta, received = receive(whole(values, END))
    assert meta.times == PushTimes(12.5, 3.0, 1.5, 0.25)
    assert torch.equal(received, values)


def test_a_push_without_an_end_keeps_the_headers_times() -> None:
    values = torch.arange(6, dtype=torch.float32)
    meta, received = receive(whole(values, None))
    assert meta.times == PushTimes(7.0, 2.0, 0.0, 0.0)
    assert torch.equal(received, values)


def test_the_end_may_ride_on_the_last_chunk_with_data() -> None:
    values = torch.arange(4, dtype=torch.float32)
    chunk = ps_pb2.PushChunk(header=header(4), seq=0, data=bytes(encode(values, "float32")), end=END)
    meta, received = receive([chunk])
    assert meta.times.compute_ms == 12.5 and torch.equal(received, values)


def test_nothing_may_follow_the_end_and_its_times_are_checked() -> None:
    values = torch.arange(6, dtype=torch.float32)
    chunks = whole(values, END)
    chunks[1].end.CopyFrom(END)
    with pytest.raises(InvalidArgument, match="chunk 2 follows the push's end"):
        receive(chunks)
    with pytest.raises(InvalidArgument, match="compute_ms must be finite"):
        receive(whole(values, ps_pb2.PushEnd(compute_ms=math.nan)))
    with pytest.raises(InvalidArgument, match="data_wait_ms 9.0 exceeds compute_ms 8.0"):
        receive(whole(values, ps_pb2.PushEnd(compute_ms=8.0, data_wait_ms=9.0)))


def test_a_push_with_offsets_must_end_with_its_times() -> None:
    values = torch.arange(4, dtype=torch.float32)
    data = bytes(encode(values, "float32"))
    first = ps_pb2.PushChunk(header=header(4, offsets=True), seq=0)
    back = ps_pb2.PushChunk(seq=1, offset=2, data=data[8:])
    front = ps_pb2.PushChunk(seq=2, offset=0, data=data[:8], end=END)
    meta, received = receive([first, back, front])
    assert meta.times == PushTimes(12.5, 3.0, 1.5, 0.25) and torch.equal(received, values)
    with pytest.raises(InvalidArgument, match="must end with a chunk carrying its end"):
        receive([first, back, ps_pb2.PushChunk(seq=2, offset=0, data=data[:8])])


def test_an_in_order_chunk_whose_offset_is_not_its_place_is_refused() -> None:
    """Without offsets the chunks go in order from value 0: a chunk may say its offset (or leave it
    0, not set), and one that says another place is refused before anything is received."""
    values = torch.arange(6, dtype=torch.float32)
    chunks = whole(values, END)
    chunks[1].offset = 2  # its place: the first chunk carried 2 values
    meta, received = receive(chunks)
    assert torch.equal(received, values)
    for wrong in (1, 3, 6, -2):
        chunks[1].offset = wrong
        with pytest.raises(InvalidArgument, match=f"chunk 1 says offset {wrong}, where this push .* is at value 2"):
            receive(chunks)
    chunks[1].offset = 0
    chunks[0].offset = 4
    with pytest.raises(InvalidArgument, match="chunk 0 says offset 4, where this push .* is at value 0"):
        receive(chunks)


async def trickled(chunks: list[ps_pb2.PushChunk], every_s: float) -> AsyncIterator[DataChunk]:
    """`chunks`, one every `every_s` seconds."""
    for chunk in chunks:
        yield PARSE(chunk.SerializeToString())
        await asyncio.sleep(every_s)


def test_progress_is_data_an_empty_chunk_does_not_restart_the_idle_limit() -> None:
    """Empty chunks every 0.05 s keep no push alive past its 0.3 s idle limit; chunks with data at the
    same pace do."""
    values = torch.arange(8, dtype=torch.float32)
    data = bytes(encode(values, "float32"))
    empties = [ps_pb2.PushChunk(header=header(8), seq=0)] + [ps_pb2.PushChunk(seq=i) for i in range(1, 40)]

    async def run(chunks: list[ps_pb2.PushChunk]) -> float:
        started = asyncio.get_running_loop().time()
        try:
            await receive_push(trickled(chunks, 0.05), lambda m: ChunkReceiver(m.num_values, m.wire_dtype), idle_s=0.3)
        finally:
            elapsed = asyncio.get_running_loop().time() - started
        return elapsed

    with pytest.raises(FailedPrecondition, match=r"no data in this push for 0.3 s \(--push-idle; an empty chunk"):
        asyncio.run(run(empties))
    slow_data = [ps_pb2.PushChunk(header=header(8), seq=0)] + [
        ps_pb2.PushChunk(seq=1 + i, data=data[4 * i: 4 * i + 4]) for i in range(8)]
    assert asyncio.run(run(slow_data)) > 0.3  # 9 chunks 0.05 s apart: longer than the limit, data all along
