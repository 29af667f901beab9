"""Map-style datasets, the on-disk built-ins, make-data, the worker's loader, batched evaluation, and a
job that trains on an image folder with real server and worker processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import Dataset as TorchDataset

from common.job.datasets import build_dataset
from common.job.splits import Splits
from deploy.cli import main as cluster_main
from deploy.make_data import make_data
from ps.rounds.evaluator import evaluate
from tests.processes import start_server
from worker.loader import BatchLoader, Batches, LoaderError, LoaderOptions
from worker.sampler import ElasticBatchSampler


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


def test_image_folder_decodes_the_files_and_augments_only_training(tmp_path: Path) -> None:
    root = write_folder(tmp_path / "images")
    data = build_dataset("image_folder", {"root": str(root), "padding": 0, "flip": False}, seed=0)
    assert (len(data.train), len(data.test), data.num_classes, data.input_shape) == (24, 6, 3, (3, 8, 8))
    x, y = data.test[0]
    path, label = data.test.files[0]
    expected = torch.from_numpy(np.array(Image.open(path).convert("RGB"))).permute(2, 0, 1).float() / 255
    assert torch.equal(x, expected) and y == label
    augmented = build_dataset("image_folder", {"root": str(root)}, seed=0)
    draws = {tuple(augmented.train[0][0].flatten().tolist()) for _ in range(20)}
    assert len(draws) > 1  # a random crop and flip each time the sample is read (each epoch)
    assert torch.equal(augmented.test[0][0], data.test[0][0])  # test samples as they are


def test_a_corrupt_image_is_named_and_stops_or_is_skipped(tmp_path: Path) -> None:
    root = write_folder(tmp_path / "images", per_class=4)
    bad = root / "c1" / "0.png"
    bad.write_bytes(b"not a png")
    stop = build_dataset("image_folder", {"root": str(root), "test_fraction": 0.1}, seed=0)
    index = next(i for i, (p, _) in enumerate(stop.train.dataset.files) if p == str(bad))  # under the augmentation
    with pytest.raises(ValueError, match="0.png"):
        stop.train[index]
    loader = Batches(stop.train, ElasticBatchSampler(len(stop.train), seed=0), LoaderOptions(0, 1))
    with pytest.raises(LoaderError, match=r"cannot decode image .*c1/0\.png"):
        for _ in range(10):
            loader.next(len(stop.train))
    loader.close()
    skip = build_dataset("image_folder", {"root": str(root), "test_fraction": 0.1, "on_corrupt": "skip"}, seed=0)
    x, _ = skip.train[index]
    assert x.shape == (3, 8, 8)


@pytest.mark.parametrize("make, words", [
    (lambda root: root.mkdir(), "holds no images"),
    (lambda root: None, "is not a folder"),
])
def test_an_empty_or_missing_folder_is_one_clear_error(tmp_path: Path, make, words: str) -> None:
    root = tmp_path / "none"
    make(root)
    with pytest.raises(ValueError, match=f"dataset 'image_folder'.*{words}"):
        build_dataset("image_folder", {"root": str(root)}, seed=0)


def test_npy_arrays_are_memory_mapped_and_split(tmp_path: Path) -> None:
    features = np.arange(40, dtype=np.float64).reshape(20, 2)
    np.save(tmp_path / "features.npy", features)
    np.save(tmp_path / "labels.npy", np.arange(20) % 4)
    data = build_dataset("npy_arrays", {"root": str(tmp_path)}, seed=1)
    assert (len(data.train), len(data.test), data.num_classes, data.input_shape) == (16, 4, 4, (2,))
    assert isinstance(data.train.features, np.memmap)
    rows = sorted(int(data.train[i][0][0]) // 2 for i in range(16)) + sorted(int(data.test[i][0][0]) // 2 for i in range(4))
    assert sorted(rows) == list(range(20))
    x, y = data.train[0]
    assert x.dtype == torch.float32 and y == int(x[0]) // 2 % 4


def factory_of_a_list(seed: int) -> list:
    return [1, 2, 3]


def factory_of_an_empty_split(seed: int) -> Splits:
    return Splits(Indexed(5), Indexed(0), num_classes=2)


def factory_of_indexed(seed: int) -> Splits:
    return Splits(Indexed(50), Indexed(10), num_classes=50, test_transform=lambda x: x * 0)


def test_a_factory_must_return_a_dataset() -> None:
    with pytest.raises(ValueError, match="factory 'tests.test_data:factory_of_a_list' returned list"):
        build_dataset("tests.test_data:factory_of_a_list", {}, seed=0)
    with pytest.raises(ValueError, match="factory_of_an_empty_split.*the test split is empty"):
        build_dataset("tests.test_data:factory_of_an_empty_split", {}, seed=0)
    data = build_dataset("tests.test_data:factory_of_indexed", {}, seed=0)
    assert data.input_shape == (2,) and float(data.test[3][0].sum()) == 0.0 and data.train[3][1] == 3


def test_make_data_writes_a_folder_the_image_dataset_reads(tmp_path: Path, capsys) -> None:
    out = tmp_path / "data"
    code = cluster_main(["make-data", "--out", str(out), "--dataset-arg", "size=200", "--dataset-arg", "image_size=8",
                         "--dataset-arg", "channels=1", "--quiet"])
    assert code == 0 and "--dataset image_folder" in capsys.readouterr().out
    data = build_dataset("image_folder", {"root": str(out)}, seed=0)
    assert (len(data.train), len(data.test), data.input_shape) == (160, 40, (1, 8, 8))
    assert cluster_main(["make-data", "--out", str(out)]) == 2  # an existing folder: nothing written
    assert "exists" in capsys.readouterr().err
    assert make_data("synthetic", {"size": 30}, 0, tmp_path / "arrays", "npy") == 30
    arrays = build_dataset("npy_arrays", {"root": str(tmp_path / "arrays")}, seed=0)
    assert arrays.input_shape == (3, 32, 32)
    with pytest.raises(ValueError, match="1 or 3 channels"):
        make_data("teacher", {"size": 30}, 0, tmp_path / "teacher", "png")
    assert not (tmp_path / "teacher").exists() and not (tmp_path / "teacher.partial").exists()


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


def test_a_job_trains_on_an_image_folder_on_disk(tmp_path: Path) -> None:
    out = tmp_path / "digits"
    assert make_data("digits", {}, 0, out, "png", progress=False) == 1797
    cluster = start_server(tmp_path, ["--mode", "bsp", "--workers", "2", "--model-arg", "hidden=256", "--dataset",
                                      "image_folder", "--dataset-arg", f"root={out}", "--dataset-arg", "padding=0",
                                      "--dataset-arg", "flip=false", "--global-batch", "64", "--lr", "0.1",
                                      "--epochs", "8"])
    try:
        cluster.start_worker("w0", "--loader-workers", "1")
        cluster.start_worker("w1", "--loader-workers", "0")
        assert cluster.wait(300) == 0, cluster.server_log()
        for name, proc in zip(("w0", "w1"), cluster.workers):
            assert proc.returncode == 0, cluster.worker_log(name)
    finally:
        cluster.stop()
    (summary,) = cluster.events("summary")
    assert summary["accuracy"] >= 0.85, summary
    epochs = cluster.events("epoch")
    assert set(epochs[-1]["data_wait_ms"]) == {"w0", "w1"}
    assert "data wait ms" in cluster.server_log()


def test_the_data_benchmark_reports_each_figure_against_its_baseline() -> None:
    out = subprocess.run([sys.executable, "-m", "benchmarks.data", "--files", "300", "--image-size", "8", "--batch", "16",
                          "--cnn-steps", "5"], capture_output=True, text=True, timeout=300, check=True)
    report = json.loads(out.stdout)
    assert report["files"] == 300 and report["throughput"]["samples"] == (240 // 16 - 1) * 16
    assert report["throughput"]["ours_samples_per_s"] > 0 and report["throughput"]["dataloader_samples_per_s"] > 0
    assert 0 <= report["cnn_step"]["wait_fraction"] <= 1 and report["cnn_step"]["steps"] == 4
    assert report["memory"]["folder_mb"] > 0 and report["memory"]["trainer_peak_rss_mb"] > 0
