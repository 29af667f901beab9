"""The on-disk built-in datasets (common/job/disk_datasets.py): image_folder decodes, augments only
training and names a corrupt image; npy_arrays are memory-mapped and split; a missing folder is one error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from common.job.datasets import build_dataset
from common.job.disk_datasets import CORRUPT_SHOWN
from ps.server import main as server_main
from common.transport.messages import MAX_LEAVE_REASON, bounded_reason
from worker.data.loader import Batches, LoaderError, LoaderOptions
from worker.data.sampler import ElasticBatchSampler
from tests.data_files import write_folder


def test_image_folder_decodes_the_files_and_augments_only_training(tmp_path: Path) -> None:
    root = write_folder(tmp_path / "images")
    data = build_dataset("image_folder", {"root": str(root), "padding": 0, "flip": False, "normalize": False}, seed=0)
    assert (len(data.train), len(data.test), data.num_classes, data.input_shape) == (24, 6, 3, (3, 8, 8))
    x, y = data.test[0]
    path, label = data.test.files[0]
    expected = torch.from_numpy(np.array(Image.open(path).convert("RGB"))).permute(2, 0, 1).float() / 255
    assert torch.equal(x, expected) and y == label
    standard = build_dataset("image_folder", {"root": str(root), "padding": 0, "flip": False}, seed=0)
    every = torch.stack([standard.train[i][0] for i in range(len(standard.train))])
    assert every.mean(dim=(0, 2, 3)).abs().max() < 1e-4 and (every.std(dim=(0, 2, 3)) - 1).abs().max() < 1e-2
    mean, std = standard.test.scale
    assert torch.allclose(standard.test[0][0], (expected - mean) / std)  # the training split's scale
    augmented = build_dataset("image_folder", {"root": str(root), "normalize": False}, seed=0)
    draws = {tuple(augmented.train[0][0].flatten().tolist()) for _ in range(20)}
    assert len(draws) > 1  # a random crop and flip each time the sample is read (each epoch)
    assert torch.equal(augmented.test[0][0], data.test[0][0])  # test samples as they are


def test_a_corrupt_training_image_the_statistics_read_stops_the_build_unless_skipped(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    """With on_corrupt=stop (the default) a training image the normalization statistics cannot decode is
    one ValueError at build time, naming it and the ways on (remove it, or on_corrupt=skip): never a
    job whose every worker stops at it. ps-server says so and exits 2 before it writes anything;
    on_corrupt=skip builds."""
    root = write_folder(tmp_path / "images", per_class=4)
    bad = root / "c1" / "0.png"
    bad.write_bytes(b"not a png")
    with pytest.raises(ValueError, match=r"cannot decode the training image\(s\) \S*c1/0\.png: .*remove or replace "
                                         r"the file\(s\), or --dataset-arg on_corrupt=skip"):
        build_dataset("image_folder", {"root": str(root), "test_fraction": 0.1}, seed=0)
    # the statistics pass over it and say so, without naming a skip the job was not set to make
    warned = [r.getMessage() for r in caplog.records if "0.png" in r.getMessage()]
    assert warned and all("normalization statistics" in w and "on_corrupt=skip" not in w for w in warned), warned
    metrics = tmp_path / "metrics.jsonl"
    assert server_main(["--quiet", "--dataset", "image_folder", "--dataset-arg", f"root={root}", "--dataset-arg",
                        "test_fraction=0.1", "--metrics-log", str(metrics)]) == 2
    assert "c1/0.png" in capsys.readouterr().err and not metrics.exists()
    corrupt = {str(root / c / f"{i}.png") for c in ("c1", "c2") for i in range(4)}
    for path in corrupt:
        Path(path).write_bytes(b"")
    skip = build_dataset("image_folder", {"root": str(root), "test_fraction": 0.1, "on_corrupt": "skip"}, seed=0)
    assert skip.train.dataset.scale is not None and skip.input_shape == (3, 8, 8)
    named = sorted(p for p, _ in skip.train.dataset.files if p in corrupt)
    assert len(named) > CORRUPT_SHOWN  # the error names the first few and counts the rest
    with pytest.raises(ValueError) as refused:
        build_dataset("image_folder", {"root": str(root), "test_fraction": 0.1}, seed=0)
    assert f"{', '.join(named[:CORRUPT_SHOWN])} and {len(named) - CORRUPT_SHOWN} more: " in str(refused.value)


def test_a_corrupt_image_is_named_and_stops_or_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Where a training image is read that the build did not (no normalization statistics here), it stops
    the loader with an error naming it, or with on_corrupt=skip is passed over with a warning."""
    root = write_folder(tmp_path / "images", per_class=4)
    bad = root / "c1" / "0.png"
    bad.write_bytes(b"not a png")
    stop = build_dataset("image_folder", {"root": str(root), "test_fraction": 0.1, "normalize": False}, seed=0)
    index = next(i for i, (p, _) in enumerate(stop.train.dataset.files) if p == str(bad))  # under the augmentation
    with pytest.raises(ValueError, match="0.png"):
        stop.train[index]
    loader = Batches(stop.train, ElasticBatchSampler(len(stop.train), seed=0), LoaderOptions(0, 1))
    with pytest.raises(LoaderError, match=r"cannot decode image .*c1/0\.png") as stopped:
        for _ in range(10):
            loader.next(len(stop.train))
    loader.close()
    assert stopped.value.reason() == f"corrupt sample {bad}"  # what the worker tells the server as it leaves
    skip = build_dataset("image_folder", {"root": str(root), "test_fraction": 0.1, "on_corrupt": "skip"}, seed=0)
    caplog.clear()
    x, _ = skip.train[index]
    assert x.shape == (3, 8, 8)
    assert any("skipped (on_corrupt=skip)" in r.getMessage() for r in caplog.records)


def test_a_leave_reason_is_bounded_and_printable() -> None:
    """What a worker sends as LeaveRequest.reason is what the server takes: each character that is not
    printable as '?', at most MAX_LEAVE_REASON characters; a loader error without a file says its line."""
    assert bounded_reason("corrupt sample /d/a\nb.png") == "corrupt sample /d/a?b.png"
    long = bounded_reason("corrupt sample /" + "d" * 600)
    assert len(long) == MAX_LEAVE_REASON and long.endswith("...") and long.isprintable()
    error = LoaderError("the loader stopped")
    assert error.reason() == "data error: the loader stopped"


def test_images_of_another_size_are_one_clear_error_unless_image_size_resizes_them(tmp_path: Path) -> None:
    """Without image_size every image must have the first one's size: one of another size is an error
    naming it, the first and the option that resizes them, at build time where the normalization
    statistics read it, else where a loader reads it (never a torch stacking error); image_size makes
    every image that square. Not corrupt: on_corrupt=skip does not pass it over."""
    root = write_folder(tmp_path / "images", per_class=4)
    odd = root / "c2" / "3.png"
    Image.fromarray(np.zeros((5, 7, 3), dtype=np.uint8), "RGB").save(odd)
    with pytest.raises(ValueError, match=r"image .*c2/3\.png is 7x5 where the first, .*, is 8x8: .*image_size=N"):
        build_dataset("image_folder", {"root": str(root), "test_fraction": 0.1, "on_corrupt": "skip"}, seed=0)
    lazy = build_dataset("image_folder", {"root": str(root), "test_fraction": 0.1, "normalize": False,
                                          "padding": 0, "flip": False}, seed=0)
    split = lazy.train if any(p == str(odd) for p, _ in lazy.train.files) else lazy.test
    index = next(i for i, (p, _) in enumerate(split.files) if p == str(odd))
    with pytest.raises(ValueError, match=r"c2/3\.png is 7x5"):
        split[index]
    resized = build_dataset("image_folder", {"root": str(root), "test_fraction": 0.1, "image_size": 6}, seed=0)
    shapes = {tuple(resized.train[i][0].shape) for i in range(len(resized.train))}
    assert shapes == {(3, 6, 6)} and resized.input_shape == (3, 6, 6)


def test_a_class_folder_without_images_is_named_and_keeps_its_label(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    root = write_folder(tmp_path / "images", classes=2, per_class=4)
    (root / "b-empty").mkdir()
    data = build_dataset("image_folder", {"root": str(root), "test_fraction": 0.25}, seed=0)
    assert data.num_classes == 3 and {label for _, label in data.train.dataset.files} == {1, 2}  # b-empty is label 0
    assert any("b-empty" in r.getMessage() and "hold no images" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("make, words", [
    (lambda root: root.mkdir(), "holds no images"),
    (lambda root: None, "is not a folder"),
])
def test_an_empty_or_missing_folder_is_one_clear_error(tmp_path: Path, make, words: str) -> None:
    root = tmp_path / "none"
    make(root)
    with pytest.raises(ValueError, match=f"dataset 'image_folder'.*{words}"):
        build_dataset("image_folder", {"root": str(root)}, seed=0)


def test_an_npy_row_that_is_not_finite_is_named_where_it_is_read(tmp_path: Path) -> None:
    features = np.arange(40, dtype=np.float64).reshape(20, 2)
    features[7, 1] = np.inf
    np.save(tmp_path / "features.npy", features)
    np.save(tmp_path / "labels.npy", np.arange(20) % 4)
    data = build_dataset("npy_arrays", {"root": str(tmp_path)}, seed=1)
    split = data.train if 7 in data.train.indices else data.test
    with pytest.raises(ValueError, match=r"features\.npy row 7 holds NaN or Inf"):
        split[int(np.flatnonzero(split.indices == 7)[0])]
    assert all(np.isfinite(split[i][0].numpy()).all() for i in range(len(split)) if split.indices[i] != 7)


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


def test_no_indices_give_a_batch_of_no_samples_from_files_as_from_memory(tmp_path: Path) -> None:
    """A DDP rank's share of a short last step can be empty: its batch has no samples, shaped as the
    split's, whether the split is read from files or held in memory."""
    from common.job.splits import sample_batch

    folder = build_dataset("image_folder", {"root": str(write_folder(tmp_path / "images"))}, seed=0)
    memory = build_dataset("patterns", {"size": 64}, seed=0)
    for data in (folder, memory):
        x, y = sample_batch(data.train, torch.tensor([], dtype=torch.int64))
        assert x.shape == (0, *data.input_shape) and y.shape == (0,) and y.dtype == torch.int64
