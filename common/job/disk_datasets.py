"""Built-in datasets read from files on disk, one sample at a time, so a set larger than memory trains:
an image folder (one subfolder per class, PNG/JPEG decoded with Pillow, a random crop and flip per
training sample) and memory-mapped `.npy` arrays. Nothing is read whole at build time but the file list
(and the first image, for the input shape)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset as TorchDataset

from common.job.splits import Splits
from common.number_checks import finite, whole

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
ON_CORRUPT = ("stop", "skip")
"""What an image that cannot be decoded does: stop training with an error naming the file, or skip it
(a warning naming the file, once, and the split's next readable image in its place)."""


class CorruptSample(ValueError):
    """A file of the dataset that cannot be decoded; the message names it, and so does `path` where one
    file is to blame (an error a DataLoader process re-raises keeps the message only)."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class OtherSize(ValueError):
    """An image whose size differs from the first one's where no `image_size` resizes them; the message
    names both and the option that resizes them (not corrupt: `on_corrupt=skip` does not pass it over)."""


def decode_image(path: str, mode: str, size: int = 0) -> torch.Tensor:
    """The image at `path` as a float32 C x H x W tensor in [0, 1] (`mode` "L": 1 channel, "RGB": 3),
    resized to size x size first when `size` > 0. CorruptSample names the file it cannot decode."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as opened:
            image = opened.convert(mode)
            if size and image.size != (size, size):
                image = image.resize((size, size), Image.Resampling.BILINEAR)
            pixels = np.asarray(image, dtype=np.uint8)
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as exc:
        raise CorruptSample(f"cannot decode image {path}: {exc}", path) from exc
    tensor = torch.from_numpy(pixels.copy()).to(torch.float32).div_(255.0)
    return tensor.unsqueeze(0) if tensor.dim() == 2 else tensor.permute(2, 0, 1).contiguous()


class RandomCropFlip:
    """Training augmentation of one C x H x W image: a random H x W crop of the image zero-padded by
    `padding` on each side, and a horizontal flip half the time (torch's random generator: a
    loader process has its own seed, so the crops differ per process and per epoch)."""

    def __init__(self, padding: int = 4, flip: bool = True) -> None:
        self.padding, self.flip = padding, flip

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.padding:
            h, w = x.shape[-2:]
            padded = F.pad(x, (self.padding,) * 4)
            top, left = (int(v) for v in torch.randint(0, 2 * self.padding + 1, (2,)))
            x = padded[..., top : top + h, left : left + w]
        if self.flip and bool(torch.rand(()) < 0.5):
            x = x.flip(-1)
        return x.contiguous()


class ImageFiles(TorchDataset[tuple[torch.Tensor, int]]):
    """Labelled image files, decoded as they are read."""

    def __init__(self, files: list[tuple[str, int]], mode: str, size: int, on_corrupt: str,
                 scale: tuple[torch.Tensor, torch.Tensor] | None = None,
                 skipped_note: str = "skipped (on_corrupt=skip)",
                 first: tuple[str, tuple[int, int]] | None = None) -> None:
        self.files, self.mode, self.size, self.on_corrupt = files, mode, size, on_corrupt
        self.first = first  # without `size`: the first image's path and (width, height), which every image must have
        self.skipped_note = skipped_note  # what the warning says of a file passed over
        self.scale = scale  # per-channel (mean, std) that every image is standardized with (None: [0, 1])
        self._skipped: set[str] = set()

    def __len__(self) -> int:
        return len(self.files)

    @property
    def skipped(self) -> list[str]:
        """The files passed over so far as corrupt, sorted (what a build reports of a statistics pass)."""
        return sorted(self._skipped)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        for step in range(len(self.files)):
            path, label = self.files[(index + step) % len(self.files)]
            try:
                image = decode_image(path, self.mode, self.size)
                self._check_size(path, image)
                return (image if self.scale is None else (image - self.scale[0]) / self.scale[1]), label
            except CorruptSample as exc:
                if self.on_corrupt == "stop":
                    raise
                if path not in self._skipped:
                    self._skipped.add(path)
                    log.warning("%s; %s", exc, self.skipped_note)
        raise CorruptSample(f"no image of the split can be decoded (the first: {self.files[index][0]})")

    def _check_size(self, path: str, image: torch.Tensor) -> None:
        """OtherSize where `image` (C x H x W) is not the first image's size and nothing resizes them."""
        if self.size or self.first is None:
            return
        (first, (width, height)), (h, w) = self.first, image.shape[-2:]
        if (w, h) != (width, height):
            raise OtherSize(f"image {path} is {w}x{h} where the first, {first}, is {width}x{height}: the images "
                            "must share one size, or --dataset-arg image_size=N resizes every one to N x N")


def _class_files(folder: Path) -> list[tuple[str, list[str]]]:
    """(class name, its image files) for each subfolder of `folder`, sorted; ValueError for a folder
    that is missing, unreadable or holds no images."""
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder")
    try:
        classes = sorted((entry for entry in os.scandir(folder) if entry.is_dir()), key=lambda e: e.name)
    except OSError as exc:
        raise ValueError(f"cannot read {folder}: {exc}") from exc
    found = []
    for entry in classes:
        try:
            names = sorted(n for n in os.listdir(entry.path) if n.lower().endswith(IMAGE_SUFFIXES))
        except OSError as exc:
            raise ValueError(f"cannot read {entry.path}: {exc}") from exc
        found.append((entry.name, [os.path.join(entry.path, n) for n in names]))
    if not any(files for _, files in found):
        raise ValueError(f"{folder} holds no images ({', '.join(IMAGE_SUFFIXES)}) in class subfolders "
                         "(expected FOLDER/CLASS/IMAGE)")
    empty = [name for name, files in found if not files]
    if empty:
        log.warning("%s: the class folder(s) %s hold no images (%s): their labels are kept, in name order, "
                    "with no sample", folder, ", ".join(empty), ", ".join(IMAGE_SUFFIXES))
    return found


def image_folder(
    seed: int,
    root: str = "",
    test_fraction: float = 0.2,
    image_size: int = 0,
    padding: int = 4,
    flip: bool = True,
    on_corrupt: str = "stop",
    normalize: bool = True,
) -> Splits:
    """Images in `root`, one subfolder per class (`root/CLASS/*.png|jpg`). With `root/train` and
    `root/test` (as `ps-cluster make-data` writes) those are the splits, else `test_fraction` of the
    files, drawn with `seed`, is the test split. Every image is converted to the first one's mode
    (grey: 1 channel, else RGB) and, with `image_size` > 0, resized to that square (else all must
    have the first one's size). With `normalize`, every image is standardized per channel by the
    mean and spread of up to NORMALIZE_SAMPLE training images drawn with `seed` (every process
    draws the same), as a model trained on in-memory data sees it; with `on_corrupt` stop, one of those
    that cannot be decoded is a ValueError here, before any worker trains and stops at it. Training
    samples get a random crop (zero padding `padding`) and, with `flip`, a random horizontal flip;
    test samples are read as they are."""
    if not root:
        raise ValueError("give the folder: --dataset-arg root=PATH")
    if on_corrupt not in ON_CORRUPT:
        raise ValueError(f"on_corrupt must be one of {ON_CORRUPT}, got {on_corrupt!r}")
    image_size, padding = whole("image_size", image_size, 0), whole("padding", padding, 0)
    base = Path(str(root)).expanduser()
    if (base / "train").is_dir() and (base / "test").is_dir():
        train_classes, test_classes = _class_files(base / "train"), _class_files(base / "test")
        names = [name for name, _ in train_classes]
        if [name for name, _ in test_classes] != names:
            raise ValueError(f"{base}: the classes of train/ and test/ differ")
        train = [(f, label) for label, (_, files) in enumerate(train_classes) for f in files]
        test = [(f, label) for label, (_, files) in enumerate(test_classes) for f in files]
    else:
        test_fraction = finite("test_fraction", test_fraction, 0.0, 1.0, open_low=True, open_high=True)
        classes = _class_files(base)
        names = [name for name, _ in classes]
        every = [(f, label) for label, (_, files) in enumerate(classes) for f in files]
        if len(every) < 2:
            raise ValueError(f"{base} holds {len(every)} image; a train and a test split need two")
        order = np.random.default_rng(seed).permutation(len(every))
        n_test = min(len(every) - 1, max(1, int(round(len(every) * test_fraction))))
        test = [every[i] for i in sorted(order[:n_test])]
        train = [every[i] for i in sorted(order[n_test:])]
    if not train or not test:
        raise ValueError(f"{base}: the {'train' if not train else 'test'} split holds no images")
    from PIL import Image

    first = train[0][0]
    try:
        with Image.open(first) as image:
            mode = "L" if image.mode in ("L", "1", "I;16", "I") else "RGB"
            shape = (first, image.size)
    except OSError as exc:
        raise ValueError(f"cannot decode image {first}: {exc}") from exc
    statistics = ImageFiles(train, mode, image_size, "skip", skipped_note="passed over in the normalization statistics",
                            first=shape)
    scale = channel_scale(statistics, seed) if normalize else None
    if on_corrupt == "stop" and statistics.skipped:  # else every worker stops at the file once training reads it
        shown = ", ".join(statistics.skipped[:CORRUPT_SHOWN])
        more = len(statistics.skipped) - CORRUPT_SHOWN
        raise ValueError(f"cannot decode the training image(s) {shown}{f' and {more} more' if more > 0 else ''}: "
                         "with on_corrupt=stop (the default) training would stop there; remove or replace the "
                         "file(s), or --dataset-arg on_corrupt=skip passes over every image that cannot be decoded")
    train_set = ImageFiles(train, mode, image_size, on_corrupt, scale, first=shape)
    augment = RandomCropFlip(padding, bool(flip)) if padding or flip else None
    return Splits(train_set, ImageFiles(test, mode, image_size, on_corrupt, scale, first=shape), num_classes=len(names),
                  train_transform=augment)


NORMALIZE_SAMPLE = 256
CORRUPT_SHOWN = 5
"""How many corrupt files found at build time the error names (the rest it counts)."""


def channel_scale(images: ImageFiles, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and standard deviation (C x 1 x 1 each) of up to NORMALIZE_SAMPLE of `images`,
    drawn with `seed` (a corrupt file is passed over here, and recorded in `images.skipped`: with
    `on_corrupt` stop the build then refuses the folder); a channel without spread keeps a deviation of 1."""
    picks = np.random.default_rng(seed).permutation(len(images))[:NORMALIZE_SAMPLE]
    stack = torch.stack([images[int(i)][0] for i in sorted(picks)])
    mean = stack.mean(dim=(0, 2, 3)).view(-1, 1, 1)
    std = stack.std(dim=(0, 2, 3)).view(-1, 1, 1)
    return mean, torch.where(std > 1e-6, std, torch.ones_like(std))


class ArrayRows(TorchDataset[tuple[torch.Tensor, int]]):
    """Rows `indices` of memory-mapped feature and label arrays, read one at a time as float32/int64."""

    def __init__(self, features: np.ndarray, labels: np.ndarray, indices: np.ndarray, path: str = "features.npy") -> None:
        self.features, self.labels, self.indices, self.path = features, labels, indices, path

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        row = int(self.indices[index])
        values = np.asarray(self.features[row], dtype=np.float32)
        if not np.isfinite(values).all():  # a NaN trains to a NaN gradient, which the server refuses
            raise ValueError(f"{self.path} row {row} holds NaN or Inf values (as float32)")
        return torch.from_numpy(values), int(self.labels[row])


def npy_arrays(seed: int, root: str = "", test_fraction: float = 0.2, num_classes: int = 0) -> Splits:
    """`root/features.npy` (N x ...) and `root/labels.npy` (N whole numbers from 0), memory-mapped
    (np.load(mmap_mode='r')): only the rows a batch needs are read. `test_fraction` of the rows,
    drawn with `seed`, is the test split. `num_classes` 0: the largest label + 1."""
    if not root:
        raise ValueError("give the folder: --dataset-arg root=PATH")
    test_fraction = finite("test_fraction", test_fraction, 0.0, 1.0, open_low=True, open_high=True)
    base = Path(str(root)).expanduser()
    try:
        features = np.load(base / "features.npy", mmap_mode="r")
        labels = np.load(base / "labels.npy", mmap_mode="r")
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {base}/features.npy and labels.npy: {exc}") from exc
    if features.ndim < 2 or labels.ndim != 1 or len(features) != len(labels):
        raise ValueError(f"{base}: features {features.shape} and labels {labels.shape} must be N x ... and N")
    if len(labels) < 2 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{base}: labels.npy must hold at least 2 whole numbers, got {len(labels)} of {labels.dtype}")
    low, high = int(labels.min()), int(labels.max())
    classes = whole("num_classes", num_classes, 0) or high + 1
    if low < 0 or high >= classes:
        raise ValueError(f"{base}: labels must be in [0, {classes}), found {low}..{high}")
    order = np.random.default_rng(seed).permutation(len(labels))
    n_test = min(len(labels) - 1, max(1, int(round(len(labels) * test_fraction))))
    path = str(base / "features.npy")
    return Splits(ArrayRows(features, labels, np.sort(order[n_test:]), path),
                  ArrayRows(features, labels, np.sort(order[:n_test]), path), num_classes=classes, input_shape=tuple(int(d) for d in features.shape[1:]))
