"""A batch sampler whose batch size can change between steps without rebuilding anything."""

from __future__ import annotations

import torch


class ElasticBatchSampler:
    """Draws index batches from a per-worker shuffled permutation, reshuffling when it runs out."""

    def __init__(self, num_samples: int, seed: int, batch_size: int = 1) -> None:
        if num_samples < 1:
            raise ValueError("num_samples must be >= 1")
        self.num_samples = num_samples
        self._generator = torch.Generator().manual_seed(seed)
        self._order = torch.randperm(num_samples, generator=self._generator)
        self._cursor = 0
        self.batch_size = batch_size

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        if value < 1:
            raise ValueError(f"batch size must be >= 1, got {value}")
        self._batch_size = int(value)

    def next_batch(self) -> torch.Tensor:
        """The next `batch_size` indices (a batch may span a reshuffle)."""
        parts = []
        need = self._batch_size
        while need:
            if self._cursor == self.num_samples:
                self._order = torch.randperm(self.num_samples, generator=self._generator)
                self._cursor = 0
            take = min(need, self.num_samples - self._cursor)
            parts.append(self._order[self._cursor : self._cursor + take])
            self._cursor += take
            need -= take
        return parts[0] if len(parts) == 1 else torch.cat(parts)
