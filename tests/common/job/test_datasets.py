"""Built-in datasets: digits read from scikit-learn's file without importing it; synthetic images; the teacher task."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from common.job import datasets
from common.job.datasets import build_dataset, digits_arrays
from common.job.splits import Splits
from tests.data_files import Indexed
from tests.processes import ENV
from tests.repo import ROOT


def test_digits_are_load_digits_exactly() -> None:
    pixels, labels = digits_arrays()
    reference = load_digits()
    assert pixels.dtype == reference.data.dtype and labels.dtype == reference.target.dtype
    assert np.array_equal(pixels, reference.data) and np.array_equal(labels, reference.target)
    data = build_dataset("digits", {}, 0)
    assert len(data.train_x) + len(data.test_x) == 1797 and tuple(data.train_x.shape[1:]) == (1, 8, 8)
    assert 0.0 <= float(data.train_x.min()) and float(data.train_x.max()) <= 1.0


def test_the_digits_training_split_is_the_size_the_docs_give() -> None:
    """At the default test_fraction 0.2 the training split holds 1,438 of the 1,797 images, whatever the
    seed: the number the adaptive batch's epoch bound is documented with."""
    sizes = {len(build_dataset("digits", {}, seed).train) for seed in (0, 7)}
    assert sizes == {1438}
    for path in (ROOT / "docs" / "adaptive-batch.md", ROOT / "ps" / "control" / "global_batch" / "goodput.py"):
        assert "digits' 1,438 training samples" in " ".join(path.read_text().split()).lower(), path


def test_building_digits_does_not_import_sklearn() -> None:
    """The import is what a 1/8-core worker paid for ~11 s after Join; a fresh process shows it."""
    code = ("import sys; from common.job.datasets import build_dataset; build_dataset('digits', {}, 0); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_digits_fall_back_to_load_digits_if_the_file_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasets, "DIGITS_FILE", ("datasets", "data", "no-such-file.csv.gz"))
    pixels, labels = digits_arrays()
    assert np.array_equal(pixels, load_digits().data) and np.array_equal(labels, load_digits().target)


def test_synthetic_is_the_same_in_every_process_for_a_seed() -> None:
    a, b, other = (build_dataset("synthetic", {"size": 100, "image_size": 8}, seed) for seed in (3, 3, 4))
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    assert not torch.equal(a.train_x, other.train_x)
    assert (len(a.train_x), len(a.test_x)) == (80, 20) and a.train_x.dtype == torch.float32 and a.train_y.dtype == torch.int64
    assert a.train_x.is_contiguous() and set(a.train_y.tolist()) <= set(range(10))
    with pytest.raises(ValueError, match="test_fraction must be in"):
        build_dataset("synthetic", {"test_fraction": 1.0}, 0)


def test_teacher_is_the_same_in_every_process_for_a_seed() -> None:
    a, b, other = (build_dataset("teacher", {"size": 1000, "features": 8}, seed) for seed in (3, 3, 4))
    for name in ("train_x", "train_y", "test_x", "test_y"):
        assert torch.equal(getattr(a, name), getattr(b, name))
    assert not torch.equal(a.train_x, other.train_x) and not torch.equal(a.test_y, other.test_y)
    assert (len(a.train_x), len(a.test_x)) == (800, 200) and a.input_shape == (8,) and a.num_classes == 10
    assert a.train_x.dtype == torch.float32 and a.train_y.dtype == torch.int64 and a.train_x.is_contiguous()


def test_teacher_classes_are_balanced() -> None:
    data = build_dataset("teacher", {"size": 5000, "num_classes": 5}, 0)
    labels = torch.cat([data.train_y, data.test_y])
    assert torch.bincount(labels).tolist() == [1000] * 5  # rank bins of the teacher's score


def test_teacher_label_noise_changes_training_labels_only() -> None:
    clean = build_dataset("teacher", {"size": 4000}, 1)
    noisy = build_dataset("teacher", {"size": 4000, "label_noise": 0.5}, 1)
    assert torch.equal(noisy.train_x, clean.train_x) and torch.equal(noisy.test_y, clean.test_y)
    changed = float((noisy.train_y != clean.train_y).float().mean())
    assert 0.5 * 0.9 * 0.8 < changed < 0.5 * 0.9 * 1.2  # half replaced, a tenth of those by the same class


def test_teacher_is_cheap_to_build() -> None:
    """A 1/8-core worker builds it after Join: the default size must cost well under a second of CPU."""
    start = time.process_time()
    build_dataset("teacher", {}, 0)
    assert time.process_time() - start < 0.5


@pytest.mark.parametrize(
    ("name", "options", "needle"),
    [
        ("synthetic", {"size": 1}, "size must be >= 2"),
        ("synthetic", {"image_size": 8.5}, "image_size must be a whole number >= 4"),
        ("synthetic", {"noise": float("inf")}, "noise must be a finite number"),
        ("synthetic", {"noise": -1}, "noise must be in [0, inf]"),
        ("synthetic", {"noise": 10**400}, "noise must be a finite number"),
        ("synthetic", {"channels": True}, "channels must be a whole number"),
        ("digits", {"test_fraction": 0}, "test_fraction must be in (0, 1)"),
        ("teacher", {"size": 1}, "size must be >= 2"),
        ("teacher", {"features": 0}, "features must be >= 1"),
        ("teacher", {"hidden": 2.5}, "hidden must be a whole number >= 1"),
        ("teacher", {"num_classes": 1}, "num_classes must be >= 2"),
        ("teacher", {"label_noise": 1.5}, "label_noise must be in [0, 1]"),
        ("teacher", {"label_noise": float("nan")}, "label_noise must be a finite number"),
        ("teacher", {"test_fraction": 1}, "test_fraction must be in (0, 1)"),
        ("teacher", {"depth": 2}, "has no option 'depth' (its options: size, features, hidden, num_classes, label_noise, test_fraction)"),
        ("digits", {"colour": 1}, "has no option 'colour' (its options: test_fraction)"),
    ],
)
def test_bad_dataset_options_are_one_value_error_naming_the_option(name: str, options: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=r"dataset '\w+' (rejected its options|has no option)") as caught:
        build_dataset(name, options, seed=0)
    assert needle in str(caught.value)


def factory_of_a_list(seed: int) -> list:
    return [1, 2, 3]


def factory_of_an_empty_split(seed: int) -> Splits:
    return Splits(Indexed(5), Indexed(0), num_classes=2)


def factory_of_indexed(seed: int) -> Splits:
    return Splits(Indexed(50), Indexed(10), num_classes=50, test_transform=lambda x: x * 0)


def test_a_factory_must_return_a_dataset() -> None:
    with pytest.raises(ValueError, match="factory 'tests.common.job.test_datasets:factory_of_a_list' returned list"):
        build_dataset("tests.common.job.test_datasets:factory_of_a_list", {}, seed=0)
    with pytest.raises(ValueError, match="factory_of_an_empty_split.*the test split is empty"):
        build_dataset("tests.common.job.test_datasets:factory_of_an_empty_split", {}, seed=0)
    data = build_dataset("tests.common.job.test_datasets:factory_of_indexed", {}, seed=0)
    assert data.input_shape == (2,) and float(data.test[3][0].sum()) == 0.0 and data.train[3][1] == 3
