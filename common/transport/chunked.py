"""A flat vector kept as the chunks it arrived in: views of the received bytes, never copied whole.

Pure: no I/O. A server that copied every pushed chunk into one contiguous buffer made a pass over the
whole gradient for nothing: the aggregation and the optimizer step read the gradient a range at a
time anyway. `ChunkedVector` hands out those ranges as views of the chunk they lie in (a copy only
for a range that straddles two chunks), so a push's gradient is read once, by the step. The parts
keep the wire dtype (fp32, bf16 or fp16): torch's arithmetic with an fp32 operand computes in fp32,
so a narrow part is widened by the operation that reads it, not by a pass of its own.

`Vector` is what the cores pass around: a plain tensor or a ChunkedVector; `parts` walks either.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

import torch


class ChunkedVector:
    """A 1-d vector made of consecutive parts (any sizes, one floating dtype), read through slices
    and `parts`."""

    def __init__(self, parts: Sequence[torch.Tensor], bound: float | None = None) -> None:
        """`bound`: an upper bound on max|value| where the receiver measured one (common.transport.magnitude)."""
        self.bound = bound
        self._parts = [p for p in parts if p.numel()]
        self._starts: list[int] = []
        offset = 0
        for part in self._parts:
            self._starts.append(offset)
            offset += part.numel()
        self._numel = offset

    def numel(self) -> int:
        return self._numel

    @property
    def shape(self) -> torch.Size:
        return torch.Size([self._numel])

    def parts(self) -> Iterator[tuple[int, torch.Tensor]]:
        """(offset, part) for every part, in order."""
        yield from zip(self._starts, self._parts, strict=True)

    def __getitem__(self, index: slice) -> torch.Tensor:
        """Values [start, stop) in the parts' dtype: a view when they lie in one part, else a new tensor."""
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("a ChunkedVector takes contiguous slices only")
        start, stop, _ = index.indices(self._numel)
        stop = max(start, stop)
        if start == stop:
            return torch.empty(0)
        first = bisect.bisect_right(self._starts, start) - 1
        offset = self._starts[first]
        part = self._parts[first]
        if stop <= offset + part.numel():
            return part[start - offset : stop - offset]
        pieces = []
        i = first
        while i < len(self._parts) and self._starts[i] < stop:
            lo = max(start, self._starts[i]) - self._starts[i]
            hi = min(stop, self._starts[i] + self._parts[i].numel()) - self._starts[i]
            pieces.append(self._parts[i][lo:hi])
            i += 1
        return torch.cat(pieces)

    def contiguous(self) -> torch.Tensor:
        """All values as one new fp32 tensor."""
        return torch.cat(self._parts).float() if self._parts else torch.empty(0)


Vector = torch.Tensor | ChunkedVector


def parts(vector: Vector) -> Iterator[tuple[int, torch.Tensor]]:
    """(offset, part) of a ChunkedVector's parts, or of a tensor as its one part."""
    if isinstance(vector, ChunkedVector):
        yield from vector.parts()
    else:
        yield 0, vector.reshape(-1)


def as_tensor(vector: Vector) -> torch.Tensor:
    """The vector as a tensor (itself, or a ChunkedVector's values copied into one fp32 tensor)."""
    return vector.contiguous() if isinstance(vector, ChunkedVector) else vector
