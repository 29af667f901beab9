"""A batch of k·m samples computed as k micro-batches of m (`ps-server --micro-batch m`): BatchNorm
normalises every micro-batch alone, so each worker's statistics are over m samples whatever batch
the plan gives it, and the gradient is the whole batch's mean-loss gradient.

A pass takes as many micro-batches as the worker's memory holds (all of them on a CPU, as a rule):
inside one forward, every BatchNorm layer normalises its input one micro-batch at a time ("ghost"
batch normalisation), which gives the same outputs, loss and gradient as one forward and backward
per micro-batch, each loss weighted by its share of the batch, for any model whose only coupling
between samples is BatchNorm, at the cost of one pass instead of k. Passes are accumulated."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from common.job.batchnorm import batchnorm_layers


@contextlib.contextmanager
def ghost_batchnorm(model: nn.Module, micro_batch: int) -> Iterator[None]:
    """Within: every BatchNorm layer of `model` that is training normalises its input in chunks of
    `micro_batch` samples, each chunk on its own statistics (and its own running-statistics update)."""
    layers = batchnorm_layers(model)
    for layer in layers:
        def chunked(x: torch.Tensor, layer: nn.Module = layer) -> torch.Tensor:
            own = type(layer).forward
            if not layer.training or x.shape[0] <= micro_batch:
                return own(layer, x)
            return torch.cat([own(layer, part) for part in x.split(micro_batch)])

        layer.forward = chunked  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward


def backward_in_micro_batches(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, micro_batch: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
    per_pass: int | None = None,
) -> torch.Tensor:
    """Zero the gradients and leave in them the gradient of the mean loss over (x, y), BatchNorm
    normalising micro-batches of `micro_batch` samples (1: the whole batch, one pass); a pass takes
    at most `per_pass` samples, rounded down to whole micro-batches (None: all). Returns the mean
    loss, detached. Without BatchNorm the gradient is one pass's over the whole batch up to rounding."""
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
    model.zero_grad(set_to_none=False)
    n = len(x)
    if micro_batch == 1 or n <= micro_batch:
        loss = loss_fn(model(x), y)
        loss.backward()
        return loss.detach()
    step = n if per_pass is None else max(micro_batch, per_pass // micro_batch * micro_batch)
    total = torch.zeros(())
    with ghost_batchnorm(model, micro_batch):
        for start in range(0, n, step):
            xs, ys = x[start : start + step], y[start : start + step]
            part = loss_fn(model(xs), ys) * (len(xs) / n)
            part.backward()
            total += part.detach().cpu()
    return total


def backward_with_sub_norm(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, sub: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
    first_pass: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext,
    noted: Callable[[int, float], None] | None = None,
) -> tuple[torch.Tensor, float]:
    """Zero the gradients and leave in them the gradient of the mean loss over (x, y), in two passes:
    the first `sub` samples, then the rest. Returns the mean loss, detached, and |g_s|² (float64) of
    the mean gradient over the first `sub` samples, which the server's noise scale pairs with the whole
    batch's (worker/session/sub_batch.py). `first_pass`: what the first pass runs within (a session's
    paused_push, so that the bucketed push sends the whole gradient); `noted` is given (sub, |g_s|²)
    before the second pass (a session's note_sub_norm: its push's header goes out during that pass).
    A BatchNorm layer normalises each pass alone."""
    n = len(x)
    if not 1 <= sub < n:
        raise ValueError(f"a sub-batch is part of the batch: needs 1 <= sub < {n}, got {sub}")
    model.zero_grad(set_to_none=False)
    with first_pass():
        first = loss_fn(model(x[:sub]), y[:sub]) * (sub / n)
        first.backward()
    norms = [torch.linalg.vector_norm(p.grad, dtype=torch.float64) for p in model.parameters() if p.grad is not None]
    sq_norm = float(torch.stack(norms).square().sum()) * (n / sub) ** 2 if norms else 0.0
    if noted is not None:
        noted(sub, sq_norm)
    rest = loss_fn(model(x[sub:]), y[sub:]) * ((n - sub) / n)
    rest.backward()
    return first.detach() + rest.detach(), sq_norm
