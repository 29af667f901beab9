"""Data on disk and in memory for the data tests: a folder of PNG images by class, and a map-style
dataset whose samples say their own index."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset as TorchDataset


def write_folder(root: Path, classes: int = 3, per_class: int = 10, size: int = 8, mode: str = "RGB") -> Path:
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(per_class):
            shape = (size, size, 3) if mode == "RGB" else (size, size)
            Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(root / f"c{c}" / f"{i}.png")
    return root


class Indexed(TorchDataset):
    """Sample i is (a tensor filled with i, i): a batch says which indices it holds."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((2,), float(i)), i
