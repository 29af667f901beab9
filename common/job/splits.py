"""A job's data as map-style datasets: a train and a test split, each any `torch.utils.data.Dataset`
with `__len__` whose item i is one (input, label) sample, and what the model needs to know of them.

A dataset factory returns either the in-memory tensors (common.job.datasets.Dataset, whose
`train`/`test` are TensorDatasets) or `Splits`: samples are then produced by `__getitem__` where they
are used (a worker's loader, the server's evaluation), each through its split's per-sample transform,
so a set larger than memory (files on disk, a memory-mapped array) trains without being loaded whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sized
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset, default_collate
from torch.utils.data import Dataset as TorchDataset

Transform = Callable[[torch.Tensor], torch.Tensor]
"""A per-sample transform of one input (e.g. a random crop and flip for training)."""


class Transformed(TorchDataset[tuple[torch.Tensor, Any]]):
    """`dataset`'s samples with `transform` applied to each input (the label as it is)."""

    def __init__(self, dataset: TorchDataset[Any], transform: Transform) -> None:
        self.dataset = dataset
        self.transform = transform

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, Any]:
        x, y = self.dataset[index]
        return self.transform(x), y


@dataclass(frozen=True)
class Splits:
    """Map-style train and test splits. `input_shape` None: read from the first training sample.
    `train_transform`/`test_transform` are applied to every sample's input as it is read."""

    train: TorchDataset[Any]
    test: TorchDataset[Any]
    num_classes: int
    input_shape: tuple[int, ...] = None  # type: ignore[assignment]  # None: read from the first sample at construction
    train_transform: Transform | None = None
    test_transform: Transform | None = None

    def __post_init__(self) -> None:
        for name in ("train", "test"):
            split = getattr(self, name)
            if not isinstance(split, TorchDataset) or not isinstance(split, Sized):
                raise ValueError(f"the {name} split is a {type(split).__name__}, not a torch.utils.data.Dataset "
                                 "with __len__")
            if len(split) == 0:
                raise ValueError(f"the {name} split is empty")
        if isinstance(self.num_classes, bool) or not isinstance(self.num_classes, int) or self.num_classes < 1:
            raise ValueError(f"num_classes must be a whole number >= 1, got {self.num_classes!r}")
        if self.train_transform is not None:
            object.__setattr__(self, "train", Transformed(self.train, self.train_transform))
        if self.test_transform is not None:
            object.__setattr__(self, "test", Transformed(self.test, self.test_transform))
        if self.input_shape is None:
            x = self.train[0][0]
            if not isinstance(x, torch.Tensor):
                raise ValueError(f"a training sample's input is a {type(x).__name__}, not a tensor")
            object.__setattr__(self, "input_shape", tuple(x.shape))
        shape = tuple(self.input_shape or ())
        if not shape or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in shape):
            raise ValueError(f"input_shape must be whole numbers >= 1, got {self.input_shape!r}")
        object.__setattr__(self, "input_shape", shape)


def in_memory(split: TorchDataset[Any]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The (inputs, labels) tensors of a split held whole in memory (a TensorDataset of two), else None."""
    if isinstance(split, TensorDataset) and len(split.tensors) == 2:
        return split.tensors[0], split.tensors[1]
    return None


def sample_batch(split: TorchDataset[Any], indices: torch.Tensor | list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples at `indices` collated into one batch (tensors indexed directly when in memory); no
    indices give a batch of no samples, shaped as one of the split's (a rank's share of a short last
    step can be empty)."""
    tensors = in_memory(split)
    if tensors is not None:
        index = torch.as_tensor(indices, dtype=torch.int64)
        return tensors[0][index], tensors[1][index]
    if len(indices) == 0:
        inputs, labels = default_collate([split[0]])
        return inputs[:0], labels[:0]
    inputs, labels = default_collate([split[int(i)] for i in indices])
    return inputs, labels


def split_batches(split: TorchDataset[Any], batch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The split in order, `batch` samples at a time: slices of its tensors when in memory, else read
    through a DataLoader (never the whole split at once)."""
    tensors = in_memory(split)
    if tensors is not None:
        for start in range(0, len(tensors[0]), batch):
            yield tensors[0][start : start + batch], tensors[1][start : start + batch]
        return
    yield from DataLoader(split, batch_size=batch, shuffle=False, num_workers=0)
