"""BatchNorm running statistics of the global model, recomputed from its parameters ("precise BN").

The running mean and variance are not trained: workers normalise over their own batch (train mode),
and only evaluation reads the running statistics. So the server does not average the workers'
buffers; before each evaluation (and for any saved model) it recomputes them from the global
parameters over a fixed, seeded set of training batches of the job's micro-batch size, so they are
the same for the same parameters wherever they are computed, whatever batches the workers had."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset as TorchDataset

from common.job.splits import sample_batch

CALIBRATION_SAMPLES = 1024
"""Training samples the statistics are averaged over (fewer if the training set is smaller)."""


def batchnorm_layers(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    """The model's BatchNorm layers that keep running statistics."""
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]


@torch.no_grad()
def recalibrate(model: nn.Module, x: torch.Tensor | TorchDataset[Any], batch: int, seed: int = 0,
                samples: int = CALIBRATION_SAMPLES) -> bool:
    """Recompute every BatchNorm layer's running mean and variance as the plain average over
    `samples` training inputs of `x` (the inputs, or a map-style split read sample by sample) in batches of `batch` (each batch normalised alone, as in
    training). Returns whether the model has BatchNorm (False: nothing done). Leaves it in eval mode."""
    layers = batchnorm_layers(model)
    if not layers:
        return False
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    batch = max(2, batch)  # BatchNorm cannot take the variance of one sample
    n = len(x)  # type: ignore[arg-type]
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[: max(batch, min(samples, n))]
    momenta = [layer.momentum for layer in layers]
    for layer in layers:
        layer.reset_running_stats()
        layer.momentum = None  # a cumulative average over the batches below
    model.train()
    try:
        for start in range(0, len(order) - batch + 1, batch):
            part = order[start : start + batch]
            model(x[part] if isinstance(x, torch.Tensor) else sample_batch(x, part)[0])
    finally:
        for layer, momentum in zip(layers, momenta):
            layer.momentum = momentum
        model.eval()
    return True


def running_stats(model: nn.Module) -> dict[str, dict[str, float]]:
    """Per BatchNorm layer: the mean over channels of its running mean and variance (for reports)."""
    names = {id(m): n for n, m in model.named_modules()}
    stats: dict[str, dict[str, float]] = {}
    for layer in batchnorm_layers(model):
        mean, var = layer.running_mean, layer.running_var
        assert mean is not None and var is not None  # batchnorm_layers keeps only layers that track them
        stats[names[id(layer)]] = {"mean": float(mean.mean()), "var": float(var.mean())}
    return stats
