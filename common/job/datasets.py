"""Built-in datasets, generated or shipped with a package, or read from files on disk: nothing is downloaded.

A dataset factory takes (seed, **options) and returns in-memory tensors (`Dataset`) or map-style
splits (common.job.splits.Splits). Every process that builds the same (name, options, seed) gets
the same samples and the same train/test split. Every built-in declares the range of its options
(DATASET_RANGES), checked before it runs; a generated set's size is checked against the memory the
caller says there is before it is drawn (GENERATED_VALUES, common.job.memory_bounds).
"""

from __future__ import annotations

import gzip
import importlib.util
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torch.utils.data import TensorDataset

from common.job.memory_bounds import DATA_COPIES, check_fits
from common.job.option_ranges import FRACTION, PROBABILITY, SCALE, Bound, check_ranges
from common.job.registry import built, check_options, resolve
from common.job.splits import Splits
from common.number_checks import finite, whole


@dataclass(frozen=True)
class Dataset:
    """In-memory train/test tensors; inputs are float32, labels int64."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])

    @property
    def train(self) -> TensorDataset:
        """The training split as a map-style dataset (common.job.splits)."""
        return TensorDataset(self.train_x, self.train_y)

    @property
    def test(self) -> TensorDataset:
        return TensorDataset(self.test_x, self.test_y)

    def __post_init__(self) -> None:
        if len(self.train_x) != len(self.train_y) or len(self.test_x) != len(self.test_y):
            raise ValueError("dataset inputs and labels differ in length")
        if len(self.train_x) == 0 or len(self.test_x) == 0:
            raise ValueError("dataset has an empty train or test split")


def _test_count(n: int, test_fraction: float) -> int:
    """How many of n samples go to the test set (at least one, and one left to train on)."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    return min(n - 1, max(1, int(round(n * test_fraction))))


def _split(x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int, num_classes: int) -> Dataset:
    n_test = _test_count(len(x), test_fraction)
    order = np.random.default_rng(seed).permutation(len(x))
    test, train = order[:n_test], order[n_test:]

    def as_x(idx: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(x[idx], dtype=np.float32))

    def as_y(idx: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(y[idx], dtype=np.int64))

    return Dataset(as_x(train), as_y(train), as_x(test), as_y(test), num_classes)


DIGITS_FILE = ("datasets", "data", "digits.csv.gz")  # inside the sklearn package: 64 pixels and the label per row


def digits(seed: int, test_fraction: float = 0.2) -> Dataset:
    """scikit-learn's 8x8 handwritten digits (1797 images, shipped with the package), as 1x8x8 in [0, 1]."""
    test_fraction = finite("test_fraction", test_fraction, 0.0, 1.0, open_low=True, open_high=True)
    pixels, labels = digits_arrays()
    x = (pixels / 16.0).reshape(-1, 1, 8, 8)
    return _split(x, labels, test_fraction, seed, 10)


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The digits' pixels (n, 64, float64 in 0..16) and labels (n, int64), as `load_digits` gives them.

    Read from the package's file without importing scikit-learn: that import costs about 1 s of
    CPU, and a worker builds its data after Join, when the emulator has already dropped it to its
    share: about 11 s of a 1/8-core worker's start, which every run paid before its first round.
    Falls back to `load_digits` if a scikit-learn release moves the file."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    path = Path(locations[0], *DIGITS_FILE) if locations else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits

        data = load_digits()
        return data.data, data.target
    with gzip.open(path) as f:
        table = np.loadtxt(f, delimiter=",")
    return table[:, :-1], table[:, -1].astype(np.int64)


def synthetic(
    seed: int,
    size: int = 4096,
    image_size: int = 32,
    channels: int = 3,
    num_classes: int = 10,
    noise: float = 1.0,
    test_fraction: float = 0.2,
) -> Dataset:
    """Generated images: a fixed random template per class plus Gaussian noise (learnable, any size).

    Drawn with torch in float32, summed in place, and split without a copy (the samples are drawn
    independently, so the first `test_fraction` of them is as random a test set as any): a worker
    builds its data after Join, at its emulated share, and the float64 draw, its conversion and the
    shuffled split cost 0.65 s of CPU for the default 4096 images (~5 s for a 1/8-core worker),
    against 0.1 s now."""
    size, image_size = whole("size", size, 2), whole("image_size", image_size, 4)
    channels, num_classes = whole("channels", channels, 1), whole("num_classes", num_classes, 2)
    noise = finite("noise", noise, 0.0)
    test_fraction = finite("test_fraction", test_fraction, 0.0, 1.0, open_low=True, open_high=True)
    n_test = _test_count(size, test_fraction)
    g = torch.Generator().manual_seed(seed)
    shape = (channels, image_size, image_size)
    templates = torch.randn((num_classes, *shape), generator=g)
    labels = torch.randint(0, num_classes, (size,), generator=g)
    x = torch.randn((size, *shape), generator=g).mul_(noise).add_(templates[labels])
    return Dataset(x[n_test:], labels[n_test:], x[:n_test], labels[:n_test], num_classes)


def teacher(
    seed: int,
    size: int = 65536,
    features: int = 32,
    hidden: int = 32,
    num_classes: int = 10,
    label_noise: float = 0.0,
    test_fraction: float = 0.2,
) -> Dataset:
    """Gaussian inputs labelled by a random teacher network: a harder task, on which the batch size matters.

    The teacher scores x ~ N(0, I) with one tanh layer of `hidden` units and a linear read-out; the
    class is the score's rank bin (`num_classes` equal-count bins: balanced classes). A label depends
    on the score's exact value, so accuracy grows as a student fits the teacher finer, for tens of epochs
    (the synthetic images are learnt in three), and SGD noise caps it: B changes the time to a target.
    `label_noise` replaces that fraction of the training labels with random classes (more gradient
    noise); test labels stay the teacher's. About 0.04 s of CPU for the default 65536 samples."""
    size, features = whole("size", size, 2), whole("features", features, 1)
    hidden, num_classes = whole("hidden", hidden, 1), whole("num_classes", num_classes, 2)
    label_noise = finite("label_noise", label_noise, 0.0, 1.0)
    test_fraction = finite("test_fraction", test_fraction, 0.0, 1.0, open_low=True, open_high=True)
    n_test = _test_count(size, test_fraction)
    g = torch.Generator().manual_seed(seed)
    layer = torch.randn((features, hidden), generator=g).mul_(1.5 / math.sqrt(features))  # into tanh's bend
    readout = torch.randn(hidden, generator=g)
    x = torch.randn((size, features), generator=g)
    score = torch.tanh(x @ layer) @ readout
    labels = torch.empty(size, dtype=torch.int64)
    labels[score.argsort()] = torch.arange(size) * num_classes // size  # rank -> equal-count bins
    flip = torch.rand(size, generator=g) < label_noise
    flip[:n_test] = False
    labels = torch.where(flip, torch.randint(0, num_classes, (size,), generator=g), labels)
    return Dataset(x[n_test:], labels[n_test:], x[:n_test], labels[:n_test], num_classes)


def patterns(
    seed: int,
    size: int = 4096,
    image_size: int = 32,
    channels: int = 3,
    num_classes: int = 10,
    shift: int = 8,
    separation: float = 0.35,
    noise: float = 1.0,
    label_noise: float = 0.1,
    test_fraction: float = 0.2,
) -> Dataset:
    """Generated images that take a small CNN many epochs: smooth class patterns, shifted and close together.

    Every image is a shared smooth pattern plus `separation` times its class's own smooth pattern
    (bilinear upsampling of a 4x4 random grid), rolled by a random offset of up to `shift` pixels
    each way, times a random contrast in [0.5, 1.5], plus Gaussian `noise`. Close classes under
    heavy noise and random shifts make a CNN learn shift-tolerant features slowly; `label_noise`
    replaces that fraction of the training labels with random classes, so training accuracy
    plateaus below 100% (test labels stay true). The default set costs about the same per epoch as
    `synthetic`, which a small CNN solves in two epochs."""
    size, image_size = whole("size", size, 2), whole("image_size", image_size, 4)
    channels, num_classes = whole("channels", channels, 1), whole("num_classes", num_classes, 2)
    shift = whole("shift", shift, 0)
    separation, noise = finite("separation", separation, 0.0), finite("noise", noise, 0.0)
    label_noise = finite("label_noise", label_noise, 0.0, 1.0)
    test_fraction = finite("test_fraction", test_fraction, 0.0, 1.0, open_low=True, open_high=True)
    n_test = _test_count(size, test_fraction)
    g = torch.Generator().manual_seed(seed)
    grids = torch.randn((num_classes + 1, channels, 4, 4), generator=g)
    smooth = torch.nn.functional.interpolate(grids, size=(image_size, image_size), mode="bilinear", align_corners=False)
    smooth = smooth / smooth.flatten(1).std(dim=1).view(-1, 1, 1, 1)
    templates = smooth[-1:] + separation * smooth[:-1]
    labels = torch.randint(0, num_classes, (size,), generator=g)
    offsets = torch.randint(-shift, shift + 1, (2, size), generator=g)
    span = torch.arange(image_size)
    rows = (span.view(1, -1) + offsets[0].view(-1, 1)) % image_size  # (size, H)
    cols = (span.view(1, -1) + offsets[1].view(-1, 1)) % image_size  # (size, W)
    x = templates[labels.view(-1, 1, 1, 1), torch.arange(channels).view(1, -1, 1, 1),
                  rows.view(size, 1, -1, 1), cols.view(size, 1, 1, -1)]
    x.mul_(0.5 + torch.rand((size, 1, 1, 1), generator=g))
    x.add_(torch.randn(x.shape, generator=g).mul_(noise))
    flip = torch.rand(size, generator=g) < label_noise
    flip[:n_test] = False
    labels = torch.where(flip, torch.randint(0, num_classes, (size,), generator=g), labels)
    return Dataset(x[n_test:], labels[n_test:], x[:n_test], labels[:n_test], num_classes)


TrainingData = Dataset | Splits
"""What a dataset factory returns: in-memory tensors or map-style splits; both have `train`, `test`,
`num_classes` and `input_shape`."""


def _builtins() -> dict[str, Callable[..., TrainingData]]:
    from common.job.disk_datasets import image_folder, npy_arrays  # on-disk sets need Pillow only when used

    return {"digits": digits, "synthetic": synthetic, "patterns": patterns, "teacher": teacher, "image_folder": image_folder,
            "npy_arrays": npy_arrays}


DATASETS: dict[str, Callable[..., TrainingData]] = _builtins()
_SIZE, _IMAGE, _CHANNELS, _CLASSES = Bound(2, 2**24), Bound(4, 1024), Bound(1, 64), Bound(2, 2**16)
DATASET_RANGES: dict[str, dict[str, Bound]] = {
    "digits": {"test_fraction": FRACTION},
    "synthetic": {"size": _SIZE, "image_size": _IMAGE, "channels": _CHANNELS, "num_classes": _CLASSES,
                  "noise": SCALE, "test_fraction": FRACTION},
    "teacher": {"size": _SIZE, "features": Bound(1, 2**16), "hidden": Bound(1, 2**16), "num_classes": _CLASSES,
                "label_noise": PROBABILITY, "test_fraction": FRACTION},
    "patterns": {"size": _SIZE, "image_size": _IMAGE, "channels": _CHANNELS, "num_classes": _CLASSES,
                 "shift": Bound(0, 1024), "separation": SCALE, "noise": SCALE, "label_noise": PROBABILITY,
                 "test_fraction": FRACTION},
    "image_folder": {"test_fraction": FRACTION, "image_size": Bound(0, 4096), "padding": Bound(0, 1024)},
    "npy_arrays": {"test_fraction": FRACTION, "num_classes": Bound(0, 2**16)},
}
"""The range of every built-in's numeric options (a set on disk is as large as its files: only its
options are bounded)."""


def _image_values(a: dict[str, Any]) -> int:
    return (int(a["size"]) + int(a["num_classes"])) * int(a["channels"]) * int(a["image_size"]) ** 2


GENERATED_VALUES: dict[str, Callable[[dict[str, Any]], int]] = {
    "synthetic": _image_values,  # the images and one template per class
    "patterns": _image_values,
    "teacher": lambda a: int(a["size"]) * (int(a["features"]) + int(a["hidden"])),  # the inputs and the teacher's layer
}
"""The fp32 values a generated set draws, from its arguments (the options and the factory's defaults)."""


def build_dataset(name: str, options: dict[str, Any], seed: int, allowed: Sequence[str] | None = None,
                  memory_bytes: float | None = None) -> TrainingData:
    """Build the named dataset; errors say which option was wrong, or that the factory's result is
    not a dataset. A factory path only from a module `allowed` admits (common.job.registry.resolve).
    A built-in's options must lie in their ranges, and with `memory_bytes` (what this process has) a
    generated set must fit in it, both checked before anything is drawn."""
    factory = resolve(name, DATASETS, "dataset", allowed)
    check_options("dataset", name, factory, options, fixed=1)
    if name in DATASETS:
        check_ranges("dataset", name, options, DATASET_RANGES[name])
        if memory_bytes is not None and name in GENERATED_VALUES:
            arguments = inspect.signature(factory).bind(seed, **options)
            arguments.apply_defaults()
            check_fits(f"dataset {name!r} with options {options}", GENERATED_VALUES[name](arguments.arguments),
                       DATA_COPIES, memory_bytes)
    dataset = built("dataset", name, options, lambda: factory(seed, **options))
    if not isinstance(dataset, (Dataset, Splits)):
        raise ValueError(f"dataset factory {name!r} returned {type(dataset).__name__}, not common.job.datasets.Dataset "
                         "(in-memory tensors) or common.job.splits.Splits (map-style train and test datasets)")
    return dataset
