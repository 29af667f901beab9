"""Test-split evaluation of the global model, run on a background thread off the rounds' path."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset as TorchDataset

from common.job.batchnorm import recalibrate, running_stats
from common.job.datasets import TrainingData
from common.job.splits import split_batches
from common.transport.layout import load_flat


def evaluate(model: nn.Module, split: TorchDataset, batch: int = 1024) -> tuple[float, float]:
    """(accuracy, mean cross-entropy loss) of model on the map-style `split`, read `batch` samples at
    a time (common.job.splits.split_batches: never the whole split in memory)."""
    model.eval()
    correct, loss_sum, count = 0, 0.0, 0
    with torch.no_grad():
        for x, target in split_batches(split, batch):
            logits = model(x)
            loss_sum += float(F.cross_entropy(logits, target, reduction="sum"))
            correct += int((logits.argmax(dim=1) == target).sum())
            count += len(target)
    return correct / count, loss_sum / count


class BackgroundEvaluator:
    """Evaluates parameter snapshots one at a time on its own thread and model copy. A model with
    BatchNorm first gets its running statistics recomputed from the snapshot over training batches
    of `bn_batch` samples (common/job/batchnorm.py); `last_bn_stats` keeps them for the eval record."""

    def __init__(self, model: nn.Module, dataset: TrainingData, bn_batch: int = 1, seed: int = 0,
                 every: int = 1, per_epoch: int = 1) -> None:
        if every < 1 or per_epoch < 1 or (every > 1 and per_epoch > 1):
            raise ValueError(f"evaluations every {every} epochs, {per_epoch} an epoch: each must be 1 or more, "
                             "and one of them 1")
        self.every = every  # epochs between evaluations (the last epoch's is always run)
        self.per_epoch = per_epoch  # evaluations an epoch, at each per_epoch-th of its samples
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
            if recalibrate(self._model, self._dataset.train, self._bn_batch, self._seed):
                self.last_bn_stats = running_stats(self._model)
            on_done(*evaluate(self._model, self._dataset.test))

        future = self._pool.submit(run)
        self._pending.append(future)
        return future

    def settle(self) -> None:
        """Wait for the evaluations submitted so far, from any thread (the one worker runs them in order)."""
        self._pool.submit(lambda: None).result()

    def drain(self) -> None:
        """Wait for every submitted evaluation (errors propagate)."""
        for future in self._pending:
            future.result()
        self._pending.clear()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
