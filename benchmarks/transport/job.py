"""The job the benchmark's ps-server runs: one flat parameter of exactly N values, a dataset whose
epoch cannot end mid-measure, and the server flags for a push+pull measurement."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class FlatModel(nn.Module):
    """One parameter of exactly `numel` values; the forward pass only exists so evaluation works."""

    def __init__(self, numel: int, num_classes: int) -> None:
        super().__init__()
        if numel < num_classes:
            raise ValueError(f"flat_model needs numel >= num_classes ({num_classes}), got {numel}")
        self.num_classes = num_classes
        self.flat = nn.Parameter(torch.zeros(numel))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(len(x), -1).sum(1, keepdim=True) * self.flat[: self.num_classes]


def flat_model(input_shape: tuple[int, ...], num_classes: int, numel: float = 1_000_000) -> nn.Module:
    """Model factory for ``ps-server --model benchmarks.transport.job:flat_model --model-arg numel=N``."""
    return FlatModel(int(numel), num_classes)


def tiny_dataset(seed: int, size: int = 1 << 20, num_classes: int = 2) -> Any:
    """Dataset factory: `size` one-feature training samples (so an epoch spans size/B steps), 2 test samples."""
    from common.job.datasets import Dataset

    g = torch.Generator().manual_seed(seed)
    return Dataset(
        torch.zeros(int(size), 1),
        torch.randint(0, num_classes, (int(size),), generator=g),
        torch.zeros(2, 1),
        torch.tensor([0, 1]) % num_classes,
        num_classes,
    )


def server_argv(numel: int, workers: int, wire_dtype: str) -> list[str]:
    """`ps-server` flags for a push+pull measurement: nothing but transport and one SGD step per round."""
    return ["--mode", "bsp", "--workers", str(workers), "--global-batch", str(workers), "--controller", "uniform",
            "--model", "benchmarks.transport.job:flat_model", "--model-arg", f"numel={numel}",
            "--dataset", "benchmarks.transport.job:tiny_dataset", "--dataset-arg", f"size={1 << 20}",
            "--epochs", "1000000", "--lr", "0.001", "--momentum", "0", "--wire-dtype", wire_dtype,
            "--evict-after", "3600", "--grace", "0", "--quiet"]
