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
        self._returned = torch.empty(0, dtype=torch.int64)  # put back, drawn first
        self.batch_size = batch_size

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        if value < 1:
            raise ValueError(f"batch size must be >= 1, got {value}")
        self._batch_size = int(value)

    def ready(self) -> bool:
        """Its next indices are always known (worker.data.loader.IndexSource)."""
        return True

    def next_batch(self) -> torch.Tensor:
        """The next `batch_size` indices (a batch may span a reshuffle)."""
        return self.draw(self._batch_size)

    def put_back(self, indices: torch.Tensor) -> None:
        """Indices drawn and not trained on (worker.data.loader.Batches gave up a prefetched batch): drawn
        again first, in the same order."""
        self._returned = torch.cat([indices.to(torch.int64), self._returned])

    def draw(self, count: int) -> torch.Tensor:
        """The next `count` indices: those put back first, then the permutation's."""
        parts = []
        need = int(count)
        if len(self._returned):
            parts.append(self._returned[:need])
            self._returned = self._returned[need:]
            need -= len(parts[0])
        while need:
            if self._cursor == self.num_samples:
                self._order = torch.randperm(self.num_samples, generator=self._generator)
                self._cursor = 0
            take = min(need, self.num_samples - self._cursor)
            parts.append(self._order[self._cursor : self._cursor + take])
            self._cursor += take
            need -= take
        return parts[0] if len(parts) == 1 else torch.cat(parts)
