"""Batched evaluation (ps/rounds/evaluator.py) reads a map-style split in batches, each sample once."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset as TorchDataset

from common.job.datasets import build_dataset
from ps.rounds.evaluator import evaluate


def test_evaluation_reads_a_map_style_split_in_batches() -> None:
    data = build_dataset("digits", {}, seed=0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    whole = evaluate(model, data.test, batch=10_000)

    class Counting(TorchDataset):
        reads = 0

        def __len__(self) -> int:
            return len(data.test)

        def __getitem__(self, i: int):
            Counting.reads += 1
            return data.test_x[i], data.test_y[i]

    batched = evaluate(model, Counting(), batch=50)
    assert Counting.reads == len(data.test)
    assert batched[0] == whole[0] and batched[1] == pytest.approx(whole[1], rel=1e-5)
