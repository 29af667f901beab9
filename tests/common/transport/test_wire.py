"""The wire codec: exact round trips, 1 MiB chunking, every decoding error, and the model layout."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from common.errors import InvalidArgument
from common.job.models import build_model
from common.transport.layout import Layout, TensorEntry, flatten_grads, flatten_params, load_flat
from common.transport.wire import (
    CHUNK_BYTES,
    FlatReceiver,
    check_wire_dtype,
    chunks,
    decode,
    encode,
    itemsize,
    spans,
    split,
    views,
)

WIRE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def awkward_values(n: int = 4096, seed: int = 0) -> torch.Tensor:
    """Values that exercise rounding: wide magnitudes, both signs, subnormals, zeros, fp16 overflow."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.logspace(-30, 30, n, base=2.0)
    special = torch.tensor([0.0, -0.0, 1.0, -1.0, 1e-40, -1e-40, 6e-8, 65504.0, 65520.0, 1e5, -1e5, 3.0e38, 1.0 / 3.0])
    return torch.cat([x, special]).contiguous()


def receive(parts: list[bytes], num_values: int, wire_dtype: str) -> FlatReceiver:
    receiver = FlatReceiver(torch.empty(num_values), num_values, wire_dtype)
    for seq, data in enumerate(parts):
        receiver.feed(seq, data)
    return receiver


# ------------------------------------------------------------------ round trips
@pytest.mark.parametrize("wire_dtype", list(WIRE_DTYPES))
def test_round_trip_equals_torch_rounding(wire_dtype: str) -> None:
    x = awkward_values()
    buffer = encode(x, wire_dtype)
    assert len(buffer) == x.numel() * itemsize(wire_dtype)
    out = decode(split(buffer), x.numel(), wire_dtype)
    expected = x.to(WIRE_DTYPES[wire_dtype]).float()
    assert out.dtype == torch.float32
    assert torch.equal(out, expected)  # bit-exact, including signed zeros and infinities
    assert torch.equal(torch.signbit(out), torch.signbit(expected))
    if wire_dtype == "float32":
        assert torch.equal(out, x)


@pytest.mark.parametrize("wire_dtype", ["bfloat16", "float16"])
def test_narrow_round_trip_is_idempotent(wire_dtype: str) -> None:
    """Values already representable in the wire dtype come back unchanged."""
    x = awkward_values(seed=1).to(WIRE_DTYPES[wire_dtype]).float()
    x = x[torch.isfinite(x)]
    assert torch.equal(decode(split(encode(x, wire_dtype)), x.numel(), wire_dtype), x)


def test_encode_leaves_source_alone_and_accepts_views_and_grad_tensors() -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    view = base.t()  # not contiguous
    param = nn.Parameter(torch.ones(5))
    assert torch.equal(decode(split(encode(view)), 24, "float32"), view.reshape(-1))
    assert torch.equal(decode(split(encode(param, "bfloat16")), 5, "bfloat16"), torch.ones(5))
    assert torch.equal(base, torch.arange(24, dtype=torch.float32).reshape(4, 6))


# -------------------------------------------------------------------- chunking
@pytest.mark.parametrize("wire_dtype", list(WIRE_DTYPES))
def test_large_buffer_is_chunked_into_mebibyte_pieces(wire_dtype: str) -> None:
    n = 1_500_000  # 6 MB in fp32: over gRPC's default 4 MB message limit
    x = torch.randn(n, generator=torch.Generator().manual_seed(2))
    buffer = encode(x, wire_dtype)
    parts = split(buffer)
    assert all(isinstance(p, bytes) for p in parts)
    assert all(len(p) <= CHUNK_BYTES for p in parts)
    assert all(len(p) == CHUNK_BYTES for p in parts[:-1])
    assert len(parts) == math.ceil(n * itemsize(wire_dtype) / CHUNK_BYTES)
    assert b"".join(parts) == bytes(buffer)
    assert torch.equal(decode(parts, n, wire_dtype), x.to(WIRE_DTYPES[wire_dtype]).float())


@pytest.mark.parametrize("wire_dtype", list(WIRE_DTYPES))
@pytest.mark.parametrize("n", [0, 1, 255, 256, 4097, 3 * (1 << 18) + 7])
def test_framed_chunks_are_the_encoded_bytes_chunk_by_chunk(wire_dtype: str, n: int) -> None:
    """frame_tensor (chunk-at-a-time conversion into each message) yields exactly encode()'s bytes,
    cut as views() cuts them."""
    from common.transport.payload import frame_tensor

    x = awkward_values(n)[:n] if n <= 4109 else torch.randn(n)
    for chunk_bytes in (4, 1024, CHUNK_BYTES) if n <= 4109 else (1024, CHUNK_BYTES):  # 4-byte chunks of 3 MB: ~10^6 frames
        expected = [bytes(v) for v in views(encode(x, wire_dtype), chunk_bytes)]
        assert list(frame_tensor(x, wire_dtype, chunk_bytes=chunk_bytes)) == expected


@pytest.mark.parametrize(("total", "size", "expected"), [
    (0, 4, [(0, 0)]),
    (3, 4, [(0, 3)]),
    (8, 4, [(0, 4), (4, 8)]),
    (9, 4, [(0, 4), (4, 8), (8, 9)]),
])
def test_spans_cover_the_vector_in_order_and_an_empty_one_once(total: int, size: int, expected: list) -> None:
    assert spans(total, size) == expected


def test_spans_refuse_a_size_below_one() -> None:
    with pytest.raises(ValueError, match="size >= 1"):
        spans(10, 0)


def test_chunk_boundaries() -> None:
    data = memoryview(bytes(range(256)) * 10)  # 2560 bytes
    assert [len(p) for p in chunks(data, 1024)] == [1024, 1024, 512]
    assert [len(p) for p in chunks(memoryview(bytes(2048)), 1024)] == [1024, 1024]
    assert b"".join(chunks(data, 1024)) == bytes(data)
    assert list(chunks(memoryview(b""))) == [b""]  # an empty buffer still travels as one (empty) chunk


def test_empty_buffer_round_trip() -> None:
    out = decode(split(encode(torch.empty(0))), 0, "float32")
    assert out.numel() == 0


def test_receiver_fills_the_given_buffer_in_place() -> None:
    x = torch.randn(3000, generator=torch.Generator().manual_seed(3))
    out = torch.full((3000,), 7.0)
    receiver = FlatReceiver(out, 3000, "float32")
    for seq, data in enumerate(split(encode(x), 1000)):
        receiver.feed(seq, data)
    result = receiver.finish()
    assert result.data_ptr() == out.data_ptr()
    assert torch.equal(out, x)


def test_empty_chunks_mid_stream_are_harmless() -> None:
    x = torch.arange(10, dtype=torch.float32)
    parts = split(encode(x), 16)
    receiver = receive([parts[0], b"", *parts[1:]], 10, "float32")
    assert torch.equal(receiver.finish(), x)


# ------------------------------------------------------------- decoding errors
def test_chunk_out_of_order() -> None:
    parts = split(encode(torch.arange(8, dtype=torch.float32)), 8)
    receiver = FlatReceiver(torch.empty(8), 8, "float32")
    receiver.feed(0, parts[0])
    with pytest.raises(InvalidArgument, match="chunk out of order: expected seq 1, got 2"):
        receiver.feed(2, parts[2])
    with pytest.raises(InvalidArgument, match="expected seq 1, got 0"):
        receiver.feed(0, parts[1])  # a repeated seq is out of order too
    receiver.feed(1, parts[1])  # the stream can still go on in order
    with pytest.raises(InvalidArgument, match="expected seq 0, got 1"):
        FlatReceiver(torch.empty(8), 8, "float32").feed(1, parts[0])


@pytest.mark.parametrize("wire_dtype", list(WIRE_DTYPES))
def test_too_much_data(wire_dtype: str) -> None:
    parts = split(encode(torch.ones(9), wire_dtype))
    receiver = FlatReceiver(torch.empty(8), 8, wire_dtype)
    with pytest.raises(InvalidArgument, match="too much data: chunk 0 overruns the 8 expected values"):
        receiver.feed(0, parts[0])


def test_too_much_data_in_a_later_chunk_leaves_no_partial_write() -> None:
    out = torch.zeros(6)
    receiver = FlatReceiver(out, 6, "float32")
    receiver.feed(0, bytes(encode(torch.ones(4))))
    with pytest.raises(InvalidArgument, match="too much data: chunk 1"):
        receiver.feed(1, bytes(encode(torch.full((3,), 2.0))))
    assert torch.equal(out, torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0]))


@pytest.mark.parametrize("wire_dtype", list(WIRE_DTYPES))
def test_too_little_data(wire_dtype: str) -> None:
    receiver = receive(split(encode(torch.ones(7), wire_dtype)), 8, wire_dtype)
    with pytest.raises(InvalidArgument, match="too little data: got 7 of 8 values"):
        receiver.finish()
    with pytest.raises(InvalidArgument, match="too little data: got 0 of 8 values"):
        FlatReceiver(torch.empty(8), 8, wire_dtype).finish()


@pytest.mark.parametrize("wire_dtype", list(WIRE_DTYPES))
def test_byte_count_not_a_multiple_of_the_item_size(wire_dtype: str) -> None:
    size = itemsize(wire_dtype)
    receiver = FlatReceiver(torch.empty(8), 8, wire_dtype)
    with pytest.raises(InvalidArgument, match=f"chunk 0 has {2 * size + 1} bytes, not a multiple of {size} \\({wire_dtype}\\)"):
        receiver.feed(0, bytes(2 * size + 1))


@pytest.mark.parametrize("wire_dtype", list(WIRE_DTYPES))
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", [0, 1234, 1999])
def test_nan_and_inf_are_caught_by_finish(wire_dtype: str, bad: float, where: int) -> None:
    """Caught chunk by chunk as they arrive (a bad first chunk stays caught after good ones), or by
    one pass in finish for a receiver built without the per-chunk check."""
    x = torch.ones(2000)
    x[where] = bad
    parts = split(encode(x, wire_dtype), 1024)
    receiver = receive(parts, 2000, wire_dtype)
    with pytest.raises(InvalidArgument, match="NaN or Inf"):
        receiver.finish()
    assert not bool(torch.isfinite(receiver.finish(check_finite=False)).all())
    unchecked = FlatReceiver(torch.empty(2000), 2000, wire_dtype, check_finite=False)
    for seq, data in enumerate(parts):
        unchecked.feed(seq, data)
    with pytest.raises(InvalidArgument, match="NaN or Inf"):
        unchecked.finish()


def test_values_that_overflow_the_wire_dtype_become_inf_and_are_caught() -> None:
    receiver = receive(split(encode(torch.tensor([1.0, 1e5]), "float16")), 2, "float16")
    with pytest.raises(InvalidArgument, match="NaN or Inf"):
        receiver.finish()


def test_finite_values_whose_sum_overflows_are_accepted() -> None:
    """finish() sums first; an fp32 sum of large finite values is inf, which must not reject them."""
    x = torch.full((1000,), 3e38)
    assert math.isinf(x.sum().item())
    receiver = receive(split(encode(x), 1024), 1000, "float32")
    assert torch.equal(receiver.finish(), x)
    x[500] = -math.inf
    with pytest.raises(InvalidArgument, match="NaN or Inf"):
        receive(split(encode(x), 1024), 1000, "float32").finish()


@pytest.mark.parametrize("bad", ["int8", "", "fp32", "FLOAT32", "float64"])
def test_unknown_wire_dtype(bad: str) -> None:
    expected = "wire dtype must be one of \\['bfloat16', 'float16', 'float32'\\], got"
    with pytest.raises(InvalidArgument, match=expected):
        check_wire_dtype(bad)
    with pytest.raises(InvalidArgument, match=expected):
        FlatReceiver(torch.empty(4), 4, bad)
    with pytest.raises(InvalidArgument, match=expected):
        encode(torch.ones(4), bad)
    with pytest.raises(InvalidArgument, match=expected):
        itemsize(bad)


def test_receiver_refuses_a_count_other_than_its_buffer() -> None:
    with pytest.raises(InvalidArgument, match="buffer has 9 values, the layout expects 8"):
        FlatReceiver(torch.empty(8), 9, "float32")


def test_invalid_argument_is_a_value_error() -> None:
    """Callers outside the server may catch ValueError."""
    with pytest.raises(ValueError):
        check_wire_dtype("int8")


# ---------------------------------------------------------------------- layout
@pytest.fixture
def model() -> nn.Module:
    return build_model("cnn", (1, 8, 8), 10, {"width": 4}, seed=0)


def test_layout_of_model(model: nn.Module) -> None:
    layout = Layout.of(model)
    names = [n for n, _ in model.named_parameters()]
    assert [e.name for e in layout.entries] == names
    assert [e.shape for e in layout.entries] == [tuple(p.shape) for p in model.parameters()]
    assert all(e.dtype == "float32" for e in layout.entries)
    assert layout.numel == sum(p.numel() for p in model.parameters())
    assert layout.matches(model)
    assert layout.matches(build_model("cnn", (1, 8, 8), 10, {"width": 4}, seed=1))  # weights do not matter
    assert not layout.matches(build_model("cnn", (1, 8, 8), 10, {"width": 5}, seed=0))
    rebuilt = Layout(tuple(TensorEntry(e.name, tuple(e.shape), e.dtype) for e in layout.entries))
    assert rebuilt == layout
    assert TensorEntry("w", (3, 4)).numel == 12 and TensorEntry("b", ()).numel == 1


def test_flatten_load_round_trip(model: nn.Module) -> None:
    flat = flatten_params(model)
    assert flat.dtype == torch.float32 and flat.is_contiguous() and flat.numel() == Layout.of(model).numel
    assert not flat.requires_grad
    expected = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert torch.equal(flat, expected)

    other = build_model("cnn", (1, 8, 8), 10, {"width": 4}, seed=7)
    assert not torch.equal(flatten_params(other), flat)
    load_flat(other, flat)
    assert torch.equal(flatten_params(other), flat)
    for (name, a), (_, b) in zip(model.named_parameters(), other.named_parameters(), strict=True):
        assert torch.equal(a, b), name

    flat.add_(1.0)  # the flat copy is independent of the model
    assert not torch.equal(flatten_params(model), flat)


def test_load_flat_makes_the_parameters_views_of_the_buffer(model: nn.Module) -> None:
    """The worker decodes pulled parameters straight into its flat buffer: no copy into the model."""
    flat = flatten_params(model).mul_(2.0)
    load_flat(model, flat)
    assert torch.equal(flatten_params(model), flat)
    flat.add_(1.0)
    assert torch.equal(flatten_params(model), flat)
    start, end = flat.data_ptr(), flat.data_ptr() + flat.numel() * flat.element_size()
    assert all(start <= p.data_ptr() < end for p in model.parameters())


def test_load_flat_keeps_each_parameters_dtype() -> None:
    """A model with parameters of mixed dtypes keeps them (and its Layout): before, every parameter
    took the first one's dtype, and a worker's rejoin then saw "a different job"."""
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2).to(torch.bfloat16))
    layout = Layout.of(model)
    flat = flatten_params(model).add_(0.5)
    load_flat(model, flat)
    assert Layout.of(model) == layout
    assert [p.dtype for p in model.parameters()] == [torch.float32, torch.float32, torch.bfloat16, torch.bfloat16]
    torch.testing.assert_close(flatten_params(model), flat, rtol=0, atol=2e-2)  # bf16's rounding
    assert torch.equal(model[0].weight.reshape(-1), flat[:12])  # fp32 values exactly; as views, no copy
    assert model[0].weight.data_ptr() == flat.data_ptr()


def test_layout_and_wire_round_trip_through_a_model(model: nn.Module) -> None:
    """flatten -> encode -> chunks -> decode -> load_flat reproduces the model exactly (fp32)."""
    flat = flatten_params(model)
    numel = Layout.of(model).numel
    other = build_model("cnn", (1, 8, 8), 10, {"width": 4}, seed=3)
    load_flat(other, decode(split(encode(flat), 4096), numel, "float32"))
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)
    x = torch.randn(5, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(model(x), other(x))


def test_flatten_grads(model: nn.Module) -> None:
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    model(x).sum().backward()
    params = list(model.parameters())
    params[0].grad = None  # a parameter without a gradient contributes zeros
    out = torch.full((Layout.of(model).numel,), 5.0)
    result = flatten_grads(model, out)
    assert result.data_ptr() == out.data_ptr()
    n0 = params[0].numel()
    assert torch.equal(out[:n0], torch.zeros(n0))
    grads = [p.grad for p in params[1:]]
    assert all(g is not None for g in grads)
    assert torch.equal(out[n0:], torch.cat([g.reshape(-1) for g in grads if g is not None]))
    assert torch.equal(flatten_grads(model), out)


def test_bfloat16_decode_matches_numpy_bit_widening() -> None:
    """The receiver widens bf16 bits by a shift; check it against an independent numpy reference."""
    x = awkward_values(seed=5)
    bits = np.frombuffer(bytes(encode(x, "bfloat16")), dtype=np.uint16)
    reference = (bits.astype(np.uint32) << 16).view(np.float32)
    out = decode(split(encode(x, "bfloat16")), x.numel(), "bfloat16")
    assert np.array_equal(out.numpy().view(np.uint32), reference.view(np.uint32))
