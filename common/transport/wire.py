"""The wire codec: flat parameter buffers as ~1 MiB chunks, decoded without per-element Python.

Pure: no I/O. The layout (names, shapes, dtypes; common/transport/layout.py) is fixed at Join; afterwards
only flat buffers travel, optionally narrowed to bf16/fp16 (the server accumulates in fp32).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from common.errors import InvalidArgument
from common.transport.chunked import ChunkedVector
from common.transport.magnitude import magnitude

CHUNK_BYTES = 1 << 20

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def spans(total: int, size: int) -> list[tuple[int, int]]:
    """Consecutive [start, stop) ranges of at most `size` covering [0, total): how a vector is cut
    into chunks (and the optimizer's pieces). At least one, so an empty vector still sends one
    (empty) chunk."""
    if size < 1:
        raise ValueError(f"a span needs a size >= 1, got {size}")
    return [(start, min(start + size, total)) for start in range(0, max(total, 1), size)]


def itemsize(wire_dtype: str) -> int:
    return torch_dtype(wire_dtype).itemsize


def torch_dtype(wire_dtype: str) -> torch.dtype:
    """The torch dtype whose little-endian bytes the wire dtype's chunks carry."""
    return _TORCH_DTYPES[check_wire_dtype(wire_dtype)]


def check_wire_dtype(wire_dtype: str) -> str:
    if wire_dtype not in _TORCH_DTYPES:
        raise InvalidArgument(f"wire dtype must be one of {sorted(_TORCH_DTYPES)}, got {wire_dtype!r}")
    return wire_dtype


def encode(flat: torch.Tensor, wire_dtype: str = "float32") -> memoryview:
    """The flat vector's bytes in the wire dtype (one conversion, no per-element Python)."""
    t = flat.detach().reshape(-1)
    t = t.to(_TORCH_DTYPES[check_wire_dtype(wire_dtype)]).contiguous()
    if wire_dtype == "bfloat16":
        t = t.view(torch.int16)
    return memoryview(t.numpy()).cast("B")  # type: ignore[arg-type]  # numpy types ndarray as a buffer from Python 3.12 on


def views(buffer: memoryview, chunk_bytes: int = CHUNK_BYTES) -> Iterator[memoryview]:
    """Views of the buffer's slices, each at most chunk_bytes (at least one, possibly empty); no copy."""
    for start, stop in spans(len(buffer), chunk_bytes):
        yield buffer[start:stop]


def chunks(buffer: memoryview, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """Slices of the buffer as bytes, each at most chunk_bytes (at least one, possibly empty)."""
    for view in views(buffer, chunk_bytes):
        yield bytes(view)


def split(buffer: memoryview, chunk_bytes: int = CHUNK_BYTES) -> list[bytes]:
    return list(chunks(buffer, chunk_bytes))


class _StreamCheck:
    """What every receiver checks of a chunk stream: order, whole values, no overrun, and (with
    `check_finite`) no NaN/Inf, each chunk checked as it arrives, while it is still in cache. The
    check is a bound on the chunk's largest magnitude (common.transport.magnitude); `bound` keeps the largest."""

    def __init__(self, num_values: int, wire_dtype: str, check_finite: bool) -> None:
        self.num_values = num_values
        self.wire_dtype = check_wire_dtype(wire_dtype)
        self._itemsize = itemsize(wire_dtype)
        self._filled = 0
        self._next_seq = 0
        self._check_finite = check_finite
        self.bound = 0.0  # with check_finite: >= max|value| of the values received so far (inf: NaN/Inf)

    @property
    def filled(self) -> int:
        """How many values have arrived (in order: values [0, filled) are in)."""
        return self._filled

    def _accept(self, seq: int, data: bytes | memoryview) -> int:
        """The chunk's value count, after checking its place in the stream."""
        if seq != self._next_seq:
            raise InvalidArgument(f"chunk out of order: expected seq {self._next_seq}, got {seq}")
        if len(data) % self._itemsize:
            raise InvalidArgument(f"chunk {seq} has {len(data)} bytes, not a multiple of {self._itemsize} ({self.wire_dtype})")
        n = len(data) // self._itemsize
        if self._filled + n > self.num_values:
            raise InvalidArgument(f"too much data: chunk {seq} overruns the {self.num_values} expected values")
        return n

    def _advance(self, n: int, values: torch.Tensor) -> None:
        if n and self._check_finite and math.isfinite(self.bound):
            self.bound = max(self.bound, magnitude(values))
        self._filled += n
        self._next_seq += 1

    def _check_complete(self, check_finite: bool) -> None:
        if self._filled != self.num_values:
            raise InvalidArgument(f"too little data: got {self._filled} of {self.num_values} values")
        if check_finite and not math.isfinite(self.bound):
            raise InvalidArgument("buffer contains NaN or Inf values")


class FlatReceiver(_StreamCheck):
    """Reassembles a chunk stream into a preallocated fp32 tensor (`out`), validating as it goes."""

    def __init__(self, out: torch.Tensor, num_values: int, wire_dtype: str, check_finite: bool = True) -> None:
        if num_values != out.numel():
            raise InvalidArgument(f"buffer has {num_values} values, the layout expects {out.numel()}")
        super().__init__(num_values, wire_dtype, check_finite)
        self.out = out
        self._out_np = out.numpy()

    def feed(self, seq: int, data: bytes | memoryview) -> None:
        n = self._accept(seq, data)
        if n and self.wire_dtype == "float32":
            self._out_np[self._filled : self._filled + n] = np.frombuffer(data, dtype=np.float32)
        elif n:
            # torch widens bf16/fp16 ~4x faster than numpy (which has no bf16 and a slow fp16 cast)
            self.out[self._filled : self._filled + n].copy_(_readonly_tensor(data, _TORCH_DTYPES[self.wire_dtype]))
        self._advance(n, self.out[self._filled : self._filled + n])

    def finish(self, check_finite: bool = True) -> torch.Tensor:
        """The filled buffer; InvalidArgument if values are missing or (`check_finite`) not finite."""
        if check_finite and not self._check_finite and self._filled == self.num_values:
            self.bound = magnitude(self.out)
        self._check_complete(check_finite)
        return self.out


class ChunkReceiver(_StreamCheck):
    """Keeps a chunk stream as it arrived: each chunk's values are a view of its received bytes in
    the wire dtype (no copy into a buffer, no widening pass), and `finish` gives them as one
    ChunkedVector (common.transport.chunked), which the cores read a range at a time (bf16/fp16 ranges are widened
    by the arithmetic that reads them). The bytes stay alive, and unchanged (they are immutable), as
    long as the vector does.

    Chunks under `min_part_bytes` (default MIN_PART_BYTES) are copied together into parts of at least
    that size, so a stream of tiny chunks (a client's small chunk size, or a hostile one) costs memory
    in proportion to its values, not a tensor object per chunk."""

    MIN_PART_BYTES = 64 * 1024

    def __init__(self, num_values: int, wire_dtype: str = "float32", check_finite: bool = True,
                 min_part_bytes: int = MIN_PART_BYTES) -> None:
        super().__init__(num_values, wire_dtype, check_finite)
        self._dtype = _TORCH_DTYPES[self.wire_dtype]
        self._min_part_bytes = min_part_bytes
        self._parts: list[torch.Tensor] = []
        self._small = bytearray()  # consecutive small chunks' bytes, not yet a part

    def feed(self, seq: int, data: bytes | memoryview) -> None:
        n = self._accept(seq, data)
        values = _readonly_tensor(data, self._dtype) if n else torch.empty(0)
        self._advance(n, values)
        if not n:
            return
        if len(data) >= self._min_part_bytes:
            self._flush_small()
            self._parts.append(values)
            return
        self._small += data
        if len(self._small) >= self._min_part_bytes:
            self._flush_small()

    def finish(self, check_finite: bool = True) -> ChunkedVector:
        """The received values; InvalidArgument if values are missing or (`check_finite`) not finite."""
        self._check_complete(check_finite)
        self._flush_small()
        return ChunkedVector(self._parts, self.bound if self._check_finite else None)

    def _flush_small(self) -> None:
        if self._small:
            self._parts.append(torch.frombuffer(self._small, dtype=self._dtype))
            self._small = bytearray()

    def out_of_order(self) -> OffsetReceiver:
        """A receiver with this one's settings for a push whose chunks carry their offsets (gradient
        buckets streamed during backward, in any order)."""
        return OffsetReceiver(self.num_values, self.wire_dtype, self._check_finite)


class OffsetReceiver(_StreamCheck):
    """Receives chunks that each say where they go (`offset`, in values) and arrive in any order: a
    push of gradient buckets sent as backward produces them. Each chunk is copied once into a buffer
    of the wire dtype (its bytes, no widening), checked as it arrives; `finish` refuses a stream that
    does not cover every value exactly once, and gives the buffer as a one-part ChunkedVector."""

    def __init__(self, num_values: int, wire_dtype: str = "float32", check_finite: bool = True) -> None:
        super().__init__(num_values, wire_dtype, check_finite)
        self._buffer = torch.empty(num_values, dtype=_TORCH_DTYPES[self.wire_dtype])
        self._ranges: list[tuple[int, int]] = []

    def feed_at(self, seq: int, offset: int, data: bytes | memoryview) -> None:
        n = self._accept(seq, data)
        if not 0 <= offset <= self.num_values - n:
            raise InvalidArgument(f"chunk {seq} at offset {offset} with {n} values lies outside the "
                                  f"{self.num_values} values of the push")
        values = self._buffer[offset : offset + n]
        if n:
            values.copy_(_readonly_tensor(data, values.dtype))
            self._ranges.append((offset, offset + n))
        self._advance(n, values)

    def feed(self, seq: int, data: bytes | memoryview) -> None:
        raise InvalidArgument(f"chunk {seq} carries no offset; the push's header says its chunks do")

    def finish(self, check_finite: bool = True) -> ChunkedVector:
        """The received values; InvalidArgument if values are missing, overlap or (`check_finite`) are not finite."""
        self._ranges.sort()
        covered = 0
        for start, stop in self._ranges:
            if start != covered:
                what = "overlap" if start < covered else "are missing"
                raise InvalidArgument(f"the push's chunks {what} at value {min(start, covered)}")
            covered = stop
        self._check_complete(check_finite)
        return ChunkedVector([self._buffer], self.bound if self._check_finite else None)


def _readonly_tensor(data: bytes | memoryview, dtype: torch.dtype) -> torch.Tensor:
    """`data` as a tensor sharing its memory. The receivers only read it; torch warns about any
    read-only buffer, so the warning is silenced here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(data, dtype=dtype)


def decode(parts: Sequence[bytes], num_values: int, wire_dtype: str = "float32") -> torch.Tensor:
    """Decode a whole chunk list into a new fp32 tensor (tests and small messages)."""
    receiver = FlatReceiver(torch.empty(num_values), num_values, wire_dtype, check_finite=False)
    for seq, data in enumerate(parts):
        receiver.feed(seq, data)
    return receiver.finish(check_finite=False)
