"""Pushed fp32 chunks kept as received: ChunkReceiver checks a stream as FlatReceiver does, its
ChunkedVector reads as the concatenated tensor would, and aggregation and the store give the same
bits from it as from that tensor."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import InvalidArgument
from common.job.spec import JobSpec
from common.params.aggregation import WeightedMean
from common.params.store import ParameterStore
from common.transport.chunked import ChunkedVector, as_tensor, parts
from common.transport.wire import ChunkReceiver, FlatReceiver, decode, encode, split


def rand(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def received(x: torch.Tensor, chunk_bytes: int, wire_dtype: str = "float32", min_part_bytes: int = 1) -> ChunkedVector:
    """x sent in chunks of chunk_bytes and kept by a ChunkReceiver, each chunk prefixed by 3 bytes
    as a message's tag and length prefix it (so the views are not 4-byte aligned). By default every
    chunk stays a part of its own (no coalescing), so small test chunks exercise the views."""
    receiver = ChunkReceiver(x.numel(), wire_dtype, min_part_bytes=min_part_bytes)
    for seq, data in enumerate(split(encode(x, wire_dtype), chunk_bytes)):
        receiver.feed(seq, memoryview(b"\x1a\x80\x01" + data)[3:])
    return receiver.finish()


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3000), chunk_values=st.integers(1, 700), start=st.integers(0, 3000), length=st.integers(0, 3000))
def test_a_chunked_vector_reads_as_the_tensor_it_was_cut_from(n: int, chunk_values: int, start: int, length: int) -> None:
    x = rand(n, 1)
    vector = received(x, 4 * chunk_values)
    assert vector.numel() == n and vector.shape == x.shape
    assert torch.equal(as_tensor(vector), x)
    assert torch.equal(vector[start : start + length], x[start : start + length])
    offsets = [offset for offset, _ in parts(vector)]
    assert offsets == list(range(0, n, chunk_values))


def test_a_slice_inside_one_chunk_is_a_view_of_the_received_bytes() -> None:
    x = rand(1000, 2)
    data = [bytes(c) for c in split(encode(x), 400)]  # 100 values a chunk
    receiver = ChunkReceiver(1000, min_part_bytes=1)
    for seq, chunk in enumerate(data):
        receiver.feed(seq, chunk)
    vector = receiver.finish()
    inside = vector[210:290]
    assert torch.equal(inside, x[210:290])
    assert inside.untyped_storage().data_ptr() == torch.frombuffer(data[2], dtype=torch.uint8).data_ptr()
    with pytest.raises(TypeError):
        vector[::2]


@pytest.mark.parametrize("make", [lambda n: ChunkReceiver(n), lambda n: FlatReceiver(torch.empty(n), n, "float32")])
def test_the_chunk_receiver_refuses_what_the_flat_receiver_refuses(make) -> None:
    parts8 = split(encode(torch.arange(8, dtype=torch.float32)), 8)
    r = make(8)
    r.feed(0, parts8[0])
    with pytest.raises(InvalidArgument, match="chunk out of order: expected seq 1, got 2"):
        r.feed(2, parts8[2])
    with pytest.raises(InvalidArgument, match="too much data: chunk 0 overruns the 8 expected values"):
        make(8).feed(0, bytes(encode(torch.ones(9))))
    with pytest.raises(InvalidArgument, match="chunk 0 has 9 bytes, not a multiple of 4"):
        make(8).feed(0, bytes(9))
    with pytest.raises(InvalidArgument, match="too little data: got 0 of 8 values"):
        make(8).finish()
    short = make(8)
    short.feed(0, bytes(encode(torch.ones(7))))
    with pytest.raises(InvalidArgument, match="too little data: got 7 of 8"):
        short.finish()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", [0, 1234, 1999])
def test_nan_and_inf_in_any_chunk_are_refused(bad: float, where: int) -> None:
    x = torch.ones(2000)
    x[where] = bad
    receiver = ChunkReceiver(2000)
    for seq, data in enumerate(split(encode(x), 1024)):
        receiver.feed(seq, data)
    with pytest.raises(InvalidArgument, match="NaN or Inf"):
        receiver.finish()
    assert not bool(torch.isfinite(as_tensor(receiver.finish(check_finite=False))).all())


@pytest.mark.parametrize("wire_dtype", ["bfloat16", "float16"])
def test_narrow_chunks_are_kept_in_their_dtype_and_widen_exactly(wire_dtype: str) -> None:
    x = rand(3000, 4)
    vector = received(x, 1000, wire_dtype)
    widened = decode(split(encode(x, wire_dtype), 1000), 3000, wire_dtype)  # what FlatReceiver makes
    assert all(part.dtype == getattr(torch, wire_dtype) for _, part in parts(vector))
    assert as_tensor(vector).dtype == torch.float32 and torch.equal(as_tensor(vector), widened)
    assert torch.equal(vector[400:700].float(), widened[400:700])
    bad = x.clone()
    bad[2500] = 1e6 if wire_dtype == "float16" else math.inf  # fp16 overflows to inf on the wire
    receiver = ChunkReceiver(3000, wire_dtype)
    for seq, data in enumerate(split(encode(bad, wire_dtype), 1000)):
        receiver.feed(seq, data)
    with pytest.raises(InvalidArgument, match="NaN or Inf"):
        receiver.finish()


@pytest.mark.parametrize("wire_dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("chunk_values", [256, 300, 4096])
@pytest.mark.parametrize("spec", [JobSpec(lr=0.1, momentum=0.9, weight_decay=1e-3), JobSpec(lr=0.1, momentum=0.9, nesterov=True),
                                  JobSpec(optimizer="adam", lr=0.01, momentum=0.0)], ids=["momentum+wd", "nesterov", "adam"])
def test_aggregation_and_the_store_give_the_same_bits_from_chunks_as_from_tensors(
        wire_dtype: str, chunk_values: int, spec: JobSpec) -> None:
    """Kept chunks give the bits that widening every push into one fp32 buffer gives (the
    FlatReceiver path): rounds of one, two and three contributors, deferred steps. Chunks of 256
    values line up with the store's SGD pieces (each piece steps from a view), 300 do not (pieces
    straddle chunks), and bf16/fp16 chunks are widened by the arithmetic that reads them."""
    n = 5000
    theta = rand(n, 0)
    itemsize = 4 if wire_dtype == "float32" else 2
    plain = ParameterStore(theta, spec, piece_values=256)
    chunked = ParameterStore(theta, spec, piece_values=256)
    for round_ in range(3):
        grads = [rand(n, 10 * round_ + k) for k in range(3)]
        batches = [5, 17, 3][: round_ + 1]
        sums = WeightedMean(n), WeightedMean(n)
        for g, b in zip(grads, batches):
            sums[0].add(decode(split(encode(g, wire_dtype)), n, wire_dtype), b)
            sums[1].add(received(g, itemsize * chunk_values, wire_dtype), b)
        plain.apply_gradient(sums[0].result())
        chunked.begin_step(sums[1].result())
        chunked.values_into(0, 700, torch.empty(700))  # part now, the rest when the next step begins
    assert torch.equal(plain.flat, chunked.flat)
    ours, theirs = chunked.optimizer_state()["state"][0], plain.optimizer_state()["state"][0]
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        assert torch.equal(torch.as_tensor(ours[key]), torch.as_tensor(value)), key


def test_a_staged_chunked_gradient_can_be_taken_out_again() -> None:
    n = 1000
    a, b = rand(n, 1), rand(n, 2)
    acc = WeightedMean(n)
    acc.add(received(a, 1200), 4)
    acc.add(received(b, 800), 6)
    acc.remove(received(b, 800), 6)
    torch.testing.assert_close(acc.result(), a, rtol=0, atol=1e-6)


def test_asp_updates_and_snapshots_apply_chunk_by_chunk() -> None:
    n = 3000
    theta, delta = rand(n, 0), rand(n, 1)
    store = ParameterStore(theta, JobSpec(momentum=0.0))
    store.apply_update(received(delta, 1000))
    assert torch.equal(store.flat, theta + delta)
    store.assign(received(theta, 1200))
    assert torch.equal(store.flat, theta)
    with pytest.raises(ValueError, match="2999 values for 3000 parameters"):
        store.apply_update(received(delta[:-1], 1000))
    assert torch.equal(store.flat, theta)


@pytest.mark.parametrize("wire_dtype", ["float32", "bfloat16"])
def test_tiny_chunks_are_coalesced_so_memory_stays_in_proportion_to_the_values(wire_dtype: str) -> None:
    """A push in 4-byte chunks (or big and tiny chunks in turn) gives a handful of parts, not one
    tensor per chunk, and the same values; chunks of MIN_PART_BYTES or more stay views."""
    itemsize = 4 if wire_dtype == "float32" else 2
    x = rand(50_000, 7)
    tiny = received(x, 4, wire_dtype, min_part_bytes=ChunkReceiver.MIN_PART_BYTES)
    per_part = ChunkReceiver.MIN_PART_BYTES // itemsize
    assert len(list(parts(tiny))) == -(-50_000 // per_part)
    assert torch.equal(as_tensor(tiny), decode(split(encode(x, wire_dtype)), 50_000, wire_dtype))
    big = ChunkReceiver.MIN_PART_BYTES
    data = encode(x, wire_dtype)
    receiver = ChunkReceiver(50_000, wire_dtype)
    offset, seq, sizes = 0, 0, []
    while offset < len(data):
        size = big if seq % 2 == 0 else itemsize
        receiver.feed(seq, data[offset : offset + size])
        sizes.append(min(size, len(data) - offset))
        offset, seq = offset + size, seq + 1
    vector = receiver.finish()
    assert torch.equal(as_tensor(vector), as_tensor(tiny))
    assert len(list(parts(vector))) <= sum(1 for s in sizes if s >= big) * 2 + 1
    assert all(part.numel() * itemsize >= big for _, part in list(parts(vector))[:-1:2])
