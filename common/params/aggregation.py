"""Batch-weighted aggregation (OmniLearn Eq. 4b/4c) and ASP learning-rate scaling (Eq. 5b).

Pure functions and one streaming accumulator: Σ (b_k/B)·g_k goes into one preallocated buffer
as pushes arrive and is rescaled by B/Σ b_k when the round closes, so memory is O(model).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from common.transport.chunked import Vector, as_tensor, parts
from common.transport.magnitude import magnitude_of, within_limit


class WeightedMean:
    """Streaming batch-weighted mean of gradients into a preallocated fp32 buffer.

    The buffer holds Σ (b_k/scale)·g_k and the mean is that times scale/Σ b_k. With `scale` the
    planned global batch B, every partial sum stays within the largest gradient (no b_k·g_k near the
    fp32 limit overflows), and a round whose batches sum to B needs no division pass at all.

    The first gradient of a round is held by reference, not copied: a round with one contributor
    (one worker, or the others gone) yields that gradient itself, exactly its mean, and a second
    gradient writes w_1·g_1 + w_2·g_2 into the buffer (no zeroing pass). The caller must leave a
    gradient it added unchanged until `reset` (`holds` says whether the buffer is still in use).
    A gradient may be a ChunkedVector (common.transport.chunked: the chunks a push arrived in, in the wire dtype),
    read part by part; the sum is fp32 whatever the parts' dtype.

    `bound` is an upper bound on the mean's largest magnitude (common.transport.magnitude), from the gradients' own
    bounds, for the store's overflow check; `admits` says whether a gradient keeps the sum within
    common.transport.magnitude.LIMIT.
    """

    def __init__(self, numel: int, scale: int = 1) -> None:
        if scale < 1:
            raise ValueError(f"scale must be >= 1, got {scale}")
        self._sum = torch.zeros(numel, dtype=torch.float32)
        self._scale = scale
        self._weight = 0
        self._count = 0
        self._single: Vector | None = None  # the only gradient added so far
        self._single_bound = 0.0
        self._bound_sum = 0.0  # Σ b_k·bound(g_k)

    @property
    def count(self) -> int:
        return self._count

    @property
    def weight(self) -> int:
        return self._weight

    @property
    def bound(self) -> float:
        """>= max|value| of `result()` (0 before any gradient)."""
        if self._single is not None:
            return self._single_bound
        if self._weight <= 0:
            return 0.0
        return max(0.0, self._bound_sum) / self._weight * (1 + (self._count + 2) * 2**-22)

    def holds(self, tensor: Vector) -> bool:
        """Whether `tensor` is a gradient held by reference (not to be reused before `reset`)."""
        return self._single is tensor

    def admits(self, grad: Vector, batch: int) -> bool:
        """Whether adding `grad` over `batch` samples keeps every partial sum within common.transport.magnitude.LIMIT."""
        return within_limit((self._bound_sum + batch * magnitude_of(grad)) / self._scale)

    def add(self, grad: Vector, batch: int) -> None:
        """Add a worker's mean gradient over `batch` samples."""
        if batch <= 0:
            raise ValueError(f"batch must be > 0, got {batch}")
        bound = magnitude_of(grad)
        if self._count == 0:
            self._single, self._single_bound = grad, bound
        else:
            if self._single is not None:
                weight = self._weight / self._scale
                for start, part in parts(self._single):
                    out = self._sum[start : start + part.numel()]
                    if part.dtype == out.dtype:
                        torch.mul(part, weight, out=out)
                    else:  # a bf16/fp16 part: widen, then scale in fp32 (mul would round in the part's dtype)
                        out.copy_(part).mul_(weight)
                self._single = None
            self._add_parts(grad, batch / self._scale)
        self._weight += batch
        self._count += 1
        self._bound_sum += batch * bound

    def remove(self, grad: Vector, batch: int) -> None:
        """Take back a gradient added before (a shard's slice from a push the round did not count)."""
        if self._single is not None:
            if grad is not self._single:
                raise ValueError("remove: that gradient was not added")
            self._single = None
        else:
            self._add_parts(grad, -batch / self._scale)
        self._weight -= batch
        self._count -= 1
        self._bound_sum = self._bound_sum - batch * magnitude_of(grad) if self._count else 0.0

    def partial_sum(self) -> torch.Tensor:
        """Σ (b_k/scale)·g_k of what was added so far (a copy; tests compare states with it)."""
        if self._count == 0:
            return torch.zeros_like(self._sum)
        if self._single is not None:
            return as_tensor(self._single) * (self._weight / self._scale)
        return self._sum.clone()

    def result(self) -> Vector:
        """g = Σ b_k g_k / Σ b_k (in place, or the one gradient added); call reset() before the next round."""
        if self._weight == 0:
            raise ValueError("no gradient was added")
        if self._single is not None:
            return self._single
        if self._weight != self._scale:
            self._sum.div_(self._weight / self._scale)
        return self._sum

    def _add_parts(self, grad: Vector, alpha: float) -> None:
        for start, part in parts(grad):
            self._sum[start : start + part.numel()].add_(part, alpha=alpha)

    def reset(self) -> None:
        self._weight = 0
        self._count = 0
        self._single = None
        self._bound_sum = 0.0


def weighted_mean(grads: Sequence[torch.Tensor], batches: Sequence[int]) -> torch.Tensor:
    """Reference (non-streaming) form of the same aggregation."""
    total = sum(batches)
    return sum((g * (b / total) for g, b in zip(grads, batches, strict=True)), torch.zeros_like(grads[0]))


def asp_lr(lr: float, batch: int, global_batch: int, scaling: bool = True) -> float:
    """η_k = η · b_k / B (Eq. 5b); without scaling every worker uses η."""
    return lr * batch / global_batch if scaling else lr


def squared_norm(vector: Vector) -> float:
    """|v|² summed in float64, a ~1 MiB part at a time (the gradient noise scale subtracts such norms,
    so fp32 sums would lose the difference): one read of the vector, no full-size copy."""
    total = 0.0
    for _, part in parts(vector):
        for piece in torch.split(part.reshape(-1), _NORM_PIECE):
            wide = piece.to(torch.float64)
            total += float(torch.dot(wide, wide))
    return total


_NORM_PIECE = 1 << 18
"""Elements widened to float64 at a time by `squared_norm` (2 MiB)."""
