"""Batch-weighted aggregation (OmniLearn Eq. 4b/4c) and ASP learning-rate scaling (Eq. 5b).

Pure functions and one streaming accumulator: Σ b_k·g_k goes into one preallocated buffer
as pushes arrive and is divided by Σ b_k when the round closes, so memory is O(model).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class WeightedMean:
    """Streaming batch-weighted mean of gradients into a preallocated fp32 buffer."""

    def __init__(self, numel: int) -> None:
        self._sum = torch.zeros(numel, dtype=torch.float32)
        self._weight = 0
        self._count = 0
        # nothing added since the last reset: the next add overwrites the buffer (no zeroing pass)
        self._empty = True

    @property
    def count(self) -> int:
        return self._count

    @property
    def weight(self) -> int:
        return self._weight

    def add(self, grad: torch.Tensor, batch: int) -> None:
        """Add a worker's mean gradient over `batch` samples."""
        if batch <= 0:
            raise ValueError(f"batch must be > 0, got {batch}")
        if self._empty:
            torch.mul(grad, float(batch), out=self._sum)
            self._empty = False
        else:
            self._sum.add_(grad, alpha=float(batch))
        self._weight += batch
        self._count += 1

    def remove(self, grad: torch.Tensor, batch: int) -> None:
        """Take back a gradient added before (a shard's slice from a push the round did not count)."""
        self._sum.add_(grad, alpha=-float(batch))
        self._weight -= batch
        self._count -= 1
        self._empty = self._count == 0

    def partial_sum(self) -> torch.Tensor:
        """Σ b_k g_k of what was added so far (a copy; tests compare states with it)."""
        return torch.zeros_like(self._sum) if self._empty else self._sum.clone()

    def result(self) -> torch.Tensor:
        """g = Σ b_k g_k / Σ b_k, in place; call reset() before the next round."""
        if self._weight == 0:
            raise ValueError("no gradient was added")
        return self._sum.div_(self._weight)

    def reset(self) -> None:
        self._weight = 0
        self._count = 0
        self._empty = True


def weighted_mean(grads: Sequence[torch.Tensor], batches: Sequence[int]) -> torch.Tensor:
    """Reference (non-streaming) form of the same aggregation."""
    total = sum(batches)
    return sum((g * (b / total) for g, b in zip(grads, batches, strict=True)), torch.zeros_like(grads[0]))


def asp_lr(lr: float, batch: int, global_batch: int, scaling: bool = True) -> float:
    """η_k = η · b_k / B (Eq. 5b); without scaling every worker uses η."""
    return lr * batch / global_batch if scaling else lr
