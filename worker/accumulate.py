"""Gradient accumulation over micro-batches (`ps-server --micro-batch m`): a batch of k·m samples is
computed as k forward/backward passes of m samples each, so BatchNorm always normalises over m
samples whatever batch the plan gives the worker, and the gradient is the whole batch's mean-loss
gradient (each micro-batch's loss weighted by its share of the batch)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def backward_in_micro_batches(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, micro_batch: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
) -> torch.Tensor:
    """Zero the gradients and leave in them the gradient of the mean loss over (x, y), computed in
    micro-batches of `micro_batch` samples (1: the whole batch at once); returns that mean loss,
    detached. Without BatchNorm the result equals one pass over the whole batch up to rounding."""
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
    model.zero_grad(set_to_none=False)
    n = len(x)
    if micro_batch == 1 or n <= micro_batch:
        loss = loss_fn(model(x), y)
        loss.backward()
        return loss.detach()
    total = torch.zeros(())
    for start in range(0, n, micro_batch):
        xs, ys = x[start : start + micro_batch], y[start : start + micro_batch]
        part = loss_fn(model(xs), ys) * (len(xs) / n)
        part.backward()
        total += part.detach().cpu()
    return total
