"""Batch-weighted aggregation (OmniLearn Eq. 4b/4c) and ASP learning-rate scaling (Eq. 5b).

Pure functions and one streaming accumulator: Σ b_k·g_k goes into one preallocated buffer
as pushes arrive and is divided by Σ b_k when the round closes, so memory is O(model).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ps.transport.chunked import Vector, as_tensor, parts


class WeightedMean:
    """Streaming batch-weighted mean of gradients into a preallocated fp32 buffer.

    The first gradient of a round is held by reference, not copied: a round with one contributor
    (one worker, or the others gone) yields that gradient itself, exactly its mean, and a second
    gradient writes b_1·g_1 + b_2·g_2 into the buffer (no zeroing pass). The caller must leave a
    gradient it added unchanged until `reset` (`holds` says whether the buffer is still in use).
    A gradient may be a ChunkedVector (ps.transport.chunked: the chunks a push arrived in, in the wire dtype),
    read part by part; the sum is fp32 whatever the parts' dtype.
    """

    def __init__(self, numel: int) -> None:
        self._sum = torch.zeros(numel, dtype=torch.float32)
        self._weight = 0
        self._count = 0
        self._single: Vector | None = None  # the only gradient added so far

    @property
    def count(self) -> int:
        return self._count

    @property
    def weight(self) -> int:
        return self._weight

    def holds(self, tensor: Vector) -> bool:
        """Whether `tensor` is a gradient held by reference (not to be reused before `reset`)."""
        return self._single is tensor

    def add(self, grad: Vector, batch: int) -> None:
        """Add a worker's mean gradient over `batch` samples."""
        if batch <= 0:
            raise ValueError(f"batch must be > 0, got {batch}")
        if self._count == 0:
            self._single = grad
        else:
            if self._single is not None:
                for start, part in parts(self._single):
                    out = self._sum[start : start + part.numel()]
                    if part.dtype == out.dtype:
                        torch.mul(part, float(self._weight), out=out)
                    else:  # a bf16/fp16 part: widen, then scale in fp32 (mul would round in the part's dtype)
                        out.copy_(part).mul_(float(self._weight))
                self._single = None
            self._add_parts(grad, float(batch))
        self._weight += batch
        self._count += 1

    def remove(self, grad: Vector, batch: int) -> None:
        """Take back a gradient added before (a shard's slice from a push the round did not count)."""
        if self._single is not None:
            if grad is not self._single:
                raise ValueError("remove: that gradient was not added")
            self._single = None
        else:
            self._add_parts(grad, -float(batch))
        self._weight -= batch
        self._count -= 1

    def partial_sum(self) -> torch.Tensor:
        """Σ b_k g_k of what was added so far (a copy; tests compare states with it)."""
        if self._count == 0:
            return torch.zeros_like(self._sum)
        if self._single is not None:
            return as_tensor(self._single) * float(self._weight)
        return self._sum.clone()

    def result(self) -> Vector:
        """g = Σ b_k g_k / Σ b_k (in place, or the one gradient added); call reset() before the next round."""
        if self._weight == 0:
            raise ValueError("no gradient was added")
        if self._single is not None:
            return self._single
        return self._sum.div_(self._weight)

    def _add_parts(self, grad: Vector, alpha: float) -> None:
        for start, part in parts(grad):
            self._sum[start : start + part.numel()].add_(part, alpha=alpha)

    def reset(self) -> None:
        self._weight = 0
        self._count = 0
        self._single = None


def weighted_mean(grads: Sequence[torch.Tensor], batches: Sequence[int]) -> torch.Tensor:
    """Reference (non-streaming) form of the same aggregation."""
    total = sum(batches)
    return sum((g * (b / total) for g, b in zip(grads, batches, strict=True)), torch.zeros_like(grads[0]))


def asp_lr(lr: float, batch: int, global_batch: int, scaling: bool = True) -> float:
    """η_k = η · b_k / B (Eq. 5b); without scaling every worker uses η."""
    return lr * batch / global_batch if scaling else lr
