"""The parameters as a server sends them: wire-dtype chunks, framed as the transport's messages, built
once per parameter version and shared by every reply that carries that version.

Pure: no I/O. The core (Coordinator, ShardCore) owns a `Payload`; the transport may hand it a
`frame`: the bytes its message puts before a chunk's data (ps/servicer.py: a ParamsChunk's fields).
Each message is allocated first and the values are written straight into its data region
(common.transport.message_buffer), in the wire dtype: a reply's data costs one write, not a write into a chunk and a
copy into a message. The default frame is empty: the chunk's bytes alone.

Chunks are framed when a reply first reaches them (`FramedChunks`), written by
`ValueSource.values_into`, which may apply a deferred optimizer step just that far (common.params.store), with
its output going straight into the message: a reply streams chunk 0 while the rest of the model is
still being stepped and framed. Whatever a version still owes is framed by `complete()`, which the
core registers as its store's `before_change` callback, so the values never change under a reply
that is still streaming them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Protocol, overload

import torch

from common.transport.message_buffer import MessageBuffer
from common.transport.wire import CHUNK_BYTES, spans, torch_dtype

Frame = Callable[[int, int], bytes]  # (seq, the chunk's data size in bytes) -> what the message puts before the data


def raw_chunk(seq: int, nbytes: int) -> bytes:
    """Nothing before the data: a chunk is its bytes as they are."""
    return b""


def _message(frame: Frame, seq: int, dtype: torch.dtype, numel: int, fill: Callable[[torch.Tensor], None]) -> bytes:
    """Message `seq`: `frame`'s bytes, then `numel` values of `dtype` that `fill` writes in place."""
    nbytes = numel * dtype.itemsize
    message = MessageBuffer(frame(seq, nbytes), nbytes)
    fill(message.values(dtype))
    return message.finish()


def _values_per_chunk(dtype: torch.dtype, chunk_bytes: int) -> int:
    return max(1, chunk_bytes // dtype.itemsize)


def frame_tensor(values: torch.Tensor, wire_dtype: str, frame: Frame = raw_chunk,
                 chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """`values` in `wire_dtype` as framed messages of at most `chunk_bytes` of data (at least one,
    possibly empty), each converted straight into its message and nothing kept: a push's chunks."""
    dtype = torch_dtype(wire_dtype)
    flat = values.detach().reshape(-1)
    for seq, (start, stop) in enumerate(spans(flat.numel(), _values_per_chunk(dtype, chunk_bytes))):
        part = flat[start:stop]

        def fill(out: torch.Tensor, part: torch.Tensor = part) -> None:
            out.copy_(part)

        yield _message(frame, seq, dtype, stop - start, fill)


class ValueSource(Protocol):
    """Where framing reads values from (common.params.store.ParameterStore; a plain tensor via `TensorSource`)."""

    @property
    def numel(self) -> int: ...

    def values_into(self, start: int, stop: int, out: torch.Tensor) -> None:
        """Write values [start, stop) into `out` (converted to its dtype: the wire's)."""


class TensorSource:
    """A tensor as a ValueSource."""

    def __init__(self, flat: torch.Tensor) -> None:
        self._flat = flat.reshape(-1)

    @property
    def numel(self) -> int:
        return self._flat.numel()

    def values_into(self, start: int, stop: int, out: torch.Tensor) -> None:
        out.copy_(self._flat[start:stop])


class FramedChunks(Sequence[bytes]):
    """One version's framed chunks, each built the first time it is asked for, in order."""

    def __init__(self, source: ValueSource, wire_dtype: str, frame: Frame, chunk_bytes: int) -> None:
        self._source = source
        self._dtype = torch_dtype(wire_dtype)
        self._frame = frame
        self._spans = spans(source.numel, _values_per_chunk(self._dtype, chunk_bytes))
        self._count = len(self._spans)
        self._built: list[bytes] = []

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError(f"chunk {index} of {self._count}")
        while len(self._built) <= index:
            self._build_next()
        return self._built[index]

    def __iter__(self) -> Iterator[bytes]:
        for index in range(self._count):
            yield self[index]

    @property
    def complete(self) -> bool:
        return len(self._built) == self._count

    def finish(self) -> None:
        """Frame every chunk not yet framed (the values are about to change)."""
        while len(self._built) < self._count:
            self._build_next()

    def _build_next(self) -> None:
        seq = len(self._built)
        start, stop = self._spans[seq]
        fill = functools.partial(self._source.values_into, start, stop)
        self._built.append(_message(self._frame, seq, self._dtype, stop - start, fill))


class Payload:
    """Framed chunks of the parameters, rebuilt only when the key (the parameter version) changes."""

    def __init__(self, frame: Frame = raw_chunk, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.frame = frame
        self.chunk_bytes = chunk_bytes
        self._key: Hashable | None = None
        self._chunks: FramedChunks | None = None

    def use_frame(self, frame: Frame) -> None:
        """Frame chunks with `frame` from now on (the transport's message bytes)."""
        self.frame = frame
        self.invalidate()

    def invalidate(self) -> None:
        """The parameters changed under the same key (a load, a snapshot): rebuild on the next get.
        The version being dropped is completed first (already done when a change went through the
        store's before_change), so a reply still streaming it never reads later values."""
        self.complete()
        self._key = None
        self._chunks = None

    def complete(self) -> None:
        """Frame what the current version still owes, from the values as they are now. The core calls
        this before the values change, so a reply still streaming that version sends it whole."""
        if self._chunks is not None:
            self._chunks.finish()

    def get(self, key: Hashable, source: ValueSource | torch.Tensor, wire_dtype: str) -> FramedChunks:
        """The chunks of the source's values in `wire_dtype`; the same object while `key` stays the same."""
        if self._chunks is None or self._key != (key, wire_dtype):
            if isinstance(source, torch.Tensor):
                source = TensorSource(source)
            self._chunks = FramedChunks(source, wire_dtype, self.frame, self.chunk_bytes)
            self._key = (key, wire_dtype)
        return self._chunks

    @staticmethod
    def empty() -> list[bytes]:
        """The payload of a reply without parameters: no chunks."""
        return []
