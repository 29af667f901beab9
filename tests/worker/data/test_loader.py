"""The worker's prefetching loader (worker/data/loader.py): order kept, a batch size change followed without a
rebuild, an in-memory split indexed without a thread, and a corrupt sample named alike with loader
processes and without."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from common.job.datasets import build_dataset
from worker.data.loader import BatchLoader, Batches, LoaderError, LoaderOptions
from worker.data.sampler import ElasticBatchSampler
from tests.data_files import Indexed, write_folder


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


def test_a_corrupt_sample_reads_the_same_with_loader_processes_as_without(tmp_path: Path) -> None:
    """A loader that stops on a file it cannot decode says the same with --loader-workers 1 as in
    process: the error's line (ps-worker prints it) and the reason its Leave gives, which names the file."""
    root = write_folder(tmp_path / "images", classes=2, per_class=4)
    data = build_dataset("image_folder", {"root": str(root), "test_fraction": 0.25, "normalize": False}, seed=0)
    bad = Path(data.train.dataset.files[0][0])  # a training image, read first by the loaders
    bad.write_bytes(b"not a png")
    said = []
    for workers in (0, 1):
        loader = Batches(data.train, ElasticBatchSampler(len(data.train), seed=0), LoaderOptions(workers, 1))
        with pytest.raises(LoaderError) as stopped:
            loader.next(len(data.train))  # the whole training split: the corrupt file is in it
        loader.close()
        said.append((str(stopped.value), stopped.value.reason()))
    assert said[0] == said[1], said
    line, reason = said[0]
    assert line.startswith(f"cannot decode image {bad}: ") and "\n" not in line, line
    assert reason == f"corrupt sample {bad}"
