"""The parameters as a server sends them: wire-dtype chunks, framed as the transport's messages, built
once per parameter version and shared by every reply that carries that version.

Pure: no I/O. The core (Coordinator, ShardCore) owns a `Payload`; the transport may hand it a
`frame` that wraps each chunk in its message while the chunk is copied out of the parameters
(ps/servicer.py: ParamsChunk bytes), so a reply's data is copied once, not once into a chunk and
again into a message. The default frame is the chunk's bytes alone.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch

from ps.wire import CHUNK_BYTES, encoded_views

Frame = Callable[[int, memoryview], bytes]  # (seq, the chunk's bytes) -> what is sent


def raw_chunk(seq: int, data: memoryview) -> bytes:
    """The chunk's bytes as they are."""
    return bytes(data)


class Payload:
    """Framed chunks of the parameters, rebuilt only when the key (the parameter version) changes."""

    def __init__(self, frame: Frame = raw_chunk, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.frame = frame
        self.chunk_bytes = chunk_bytes
        self._key: Hashable | None = None
        self._chunks: list[bytes] = []

    def use_frame(self, frame: Frame) -> None:
        """Frame chunks with `frame` from now on (the transport's message bytes)."""
        self.frame = frame
        self.invalidate()

    def invalidate(self) -> None:
        """The parameters changed under the same key (a load, a snapshot): rebuild on the next get."""
        self._key = None

    def get(self, key: Hashable, flat: torch.Tensor, wire_dtype: str) -> list[bytes]:
        """The chunks of `flat` in `wire_dtype`; the same list object while `key` stays the same."""
        if self._key is None or self._key != (key, wire_dtype):
            chunks = encoded_views(flat, wire_dtype, self.chunk_bytes)
            self._chunks = [self.frame(seq, view) for seq, view in enumerate(chunks)]
            self._key = (key, wire_dtype)
        return self._chunks

    @staticmethod
    def empty() -> list[bytes]:
        """The payload of a reply without parameters: no chunks."""
        return []
