"""Test-split evaluation of the global model, run on a background thread off the rounds' path."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from common.job.batchnorm import recalibrate, running_stats
from common.job.datasets import Dataset
from common.transport.layout import load_flat


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 1024) -> tuple[float, float]:
    """(accuracy, mean cross-entropy loss) of model on (x, y)."""
    model.eval()
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for start in range(0, len(x), batch):
            logits = model(x[start : start + batch])
            target = y[start : start + batch]
            loss_sum += float(F.cross_entropy(logits, target, reduction="sum"))
            correct += int((logits.argmax(dim=1) == target).sum())
    return correct / len(x), loss_sum / len(x)


class BackgroundEvaluator:
    """Evaluates parameter snapshots one at a time on its own thread and model copy. A model with
    BatchNorm first gets its running statistics recomputed from the snapshot over training batches
    of `bn_batch` samples (common/job/batchnorm.py); `last_bn_stats` keeps them for the eval record."""

    def __init__(self, model: nn.Module, dataset: Dataset, bn_batch: int = 1, seed: int = 0) -> None:
        self._model = model
        self._dataset = dataset
        self._bn_batch = bn_batch
        self._seed = seed
        self.last_bn_stats: dict[str, dict[str, float]] | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="eval")
        self._pending: list[concurrent.futures.Future] = []

    def submit(self, flat: torch.Tensor, on_done: Callable[[float, float], None]) -> concurrent.futures.Future:
        def run() -> None:
            load_flat(self._model, flat)
            if recalibrate(self._model, self._dataset.train_x, self._bn_batch, self._seed):
                self.last_bn_stats = running_stats(self._model)
            on_done(*evaluate(self._model, self._dataset.test_x, self._dataset.test_y))

        future = self._pool.submit(run)
        self._pending.append(future)
        return future

    def drain(self) -> None:
        """Wait for every submitted evaluation (errors propagate)."""
        for future in self._pending:
            future.result()
        self._pending.clear()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
