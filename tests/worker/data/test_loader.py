"""The worker's prefetching loader (worker/data/loader.py): order kept, a batch size change followed without a
rebuild, and an in-memory split indexed without a thread."""

from __future__ import annotations

import pytest
import torch

from common.job.datasets import build_dataset
from worker.data.loader import BatchLoader, Batches, LoaderOptions
from worker.data.sampler import ElasticBatchSampler
from tests.data_files import Indexed


@pytest.mark.parametrize("workers", [0, 1])
def test_the_loader_keeps_order_and_follows_a_batch_size_change_without_a_rebuild(workers: int) -> None:
    loader = BatchLoader(Indexed(100), LoaderOptions(workers, 2))
    for batch in ([1, 2, 3], [7], [9, 8]):
        loader.submit(batch)
    assert [loader.take()[1].tolist() for _ in range(3)] == [[1, 2, 3], [7], [9, 8]]
    loader.submit([4, 5])
    loader.submit([6, 7])
    assert loader.discard().tolist() == [4, 5, 6, 7]  # given up: what was prepared is dropped as it arrives
    loader.submit([10])
    assert loader.take()[1].tolist() == [10]
    loader.close()

    sampler = ElasticBatchSampler(100, seed=0)
    batches = Batches(Indexed(100), sampler, LoaderOptions(workers, 3))
    seen = [batches.next(4)[1] for _ in range(3)]
    worker_loader = batches._loader
    seen += [batches.next(10)[1] for _ in range(12)]  # the size changes: prefetched batches come back
    assert batches._loader is worker_loader and [len(y) for y in seen] == [4] * 3 + [10] * 12
    every = torch.cat(seen).tolist()
    assert sorted(every[:100]) == list(range(100))  # an epoch of the sampler, none lost or repeated
    batches.close()


def test_an_in_memory_split_is_indexed_directly_without_a_thread() -> None:
    data = build_dataset("digits", {}, seed=0)
    batches = Batches(data.train, ElasticBatchSampler(len(data.train), seed=0), LoaderOptions(0, 2))
    assert batches._loader is None
    x, y = batches.next(16)
    assert x.shape == (16, 1, 8, 8) and batches.wait_ms >= 0
