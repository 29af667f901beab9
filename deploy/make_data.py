"""`ps-cluster make-data`: write a built-in generated dataset to disk, as an image folder that the
`image_folder` dataset reads (OUT/train/CLASS/N.png, OUT/test/CLASS/N.png) or as the `.npy` arrays
that `npy_arrays` reads (OUT/features.npy, OUT/labels.npy), so that a job trains on real files.

The folder is written under a temporary name beside OUT and renamed at the end: a failed or
interrupted run leaves no OUT behind, and an existing OUT is never written into."""

from __future__ import annotations

import argparse
import shutil
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported when the command runs, not when ps-cluster builds its parser
    import numpy as np
    import torch

    from common.job.datasets import Dataset

FORMATS = ("png", "npy")
PROGRESS_FROM = 2000
"""Samples from which the progress bar shows (fewer are written in a moment)."""


def to_pixels(x: torch.Tensor, low: float, high: float) -> np.ndarray:
    """Images N x C x H x W (C 1 or 3) scaled from [low, high] to uint8 N x H x W (x C)."""
    import torch
    scaled = ((x - low) / max(high - low, 1e-12)).clamp_(0, 1).mul_(255).round_().to(torch.uint8).numpy()
    return scaled[:, 0] if scaled.shape[1] == 1 else scaled.transpose(0, 2, 3, 1)


def write_images(data: Dataset, out: Path, progress: bool) -> int:
    """The splits as PNG files under `out`/train and `out`/test, one folder per class; the files written."""
    import torch
    from PIL import Image
    from tqdm import tqdm

    if data.train_x.dim() != 4 or data.train_x.shape[1] not in (1, 3):
        raise ValueError(f"images need inputs of shape C x H x W with 1 or 3 channels, this dataset's are "
                         f"{tuple(data.input_shape)}: use --format npy")
    low = float(torch.minimum(data.train_x.min(), data.test_x.min()))
    high = float(torch.maximum(data.train_x.max(), data.test_x.max()))
    total = len(data.train_x) + len(data.test_x)
    written = 0
    with tqdm(total=total, unit="file", desc="make-data", disable=not progress or total < PROGRESS_FROM,
              file=sys.stderr) as bar:
        for split, x, y in (("train", data.train_x, data.train_y), ("test", data.test_x, data.test_y)):
            for label in range(data.num_classes):
                (out / split / f"{label:03d}").mkdir(parents=True)
            for start in range(0, len(x), 1024):
                pixels = to_pixels(x[start : start + 1024], low, high)
                for offset, image in enumerate(pixels):
                    index = start + offset
                    Image.fromarray(image).save(out / split / f"{int(y[index]):03d}" / f"{index:07d}.png")
                written += len(pixels)
                bar.update(len(pixels))
    return written


def write_arrays(data: Dataset, out: Path) -> int:
    """Both splits, train first, as out/features.npy (float32) and out/labels.npy (int64); the rows written."""
    import numpy as np
    import torch

    out.mkdir(parents=True)
    np.save(out / "features.npy", torch.cat([data.train_x, data.test_x]).numpy().astype(np.float32))
    np.save(out / "labels.npy", torch.cat([data.train_y, data.test_y]).numpy().astype(np.int64))
    return len(data.train_x) + len(data.test_x)


def make_data(dataset: str, options: dict[str, Any], seed: int, out: Path, form: str, progress: bool = True) -> int:
    """Write the built-in in-memory `dataset` to `out` (which must not exist) in `form`; the samples written."""
    from common.job.datasets import Dataset, build_dataset

    if form not in FORMATS:
        raise ValueError(f"--format must be one of {FORMATS}, got {form!r}")
    if out.exists():
        raise ValueError(f"{out} exists; give a new folder")
    data = build_dataset(dataset, options, seed)
    if not isinstance(data, Dataset):
        raise ValueError(f"dataset {dataset!r} is not held in memory (it is read from files already)")
    partial = out.with_name(out.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    try:
        count = write_images(data, partial, progress) if form == "png" else write_arrays(data, partial)
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return count


def _make_data(args: argparse.Namespace) -> int:
    from ps.server_flags import parse_options

    count = make_data(args.dataset, parse_options(args.dataset_arg or []), args.seed, args.out, args.format,
                      progress=not args.quiet)
    dataset = "image_folder" if args.format == "png" else "npy_arrays"
    print(f"wrote {count} samples to {args.out}; train on them with --dataset {dataset} --dataset-arg root={args.out}")
    return 0


def add_make_data_command(subcommands: Any) -> None:
    """``make-data``: write a generated dataset as files."""
    parser = subcommands.add_parser(
        "make-data",
        help="write a built-in generated dataset to disk (PNG image folder or .npy arrays) to train on files",
        description=textwrap.fill("Write a built-in dataset (synthetic, digits) to a new folder: as PNG images, one "
                                  "subfolder per class under train/ and test/ (what --dataset image_folder reads), or "
                                  "as features.npy and labels.npy (--dataset npy_arrays). Inputs are scaled to 0-255 "
                                  "over the whole set. docs/data.md.", width=88),
        epilog="example:\n  ps-cluster make-data --dataset synthetic --dataset-arg size=20000 "
               "--dataset-arg image_size=16 --out data/synthetic\n"
               "exit status: 0 written, 2 bad input (nothing written).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="the folder to create (must not exist)")
    parser.add_argument("--dataset", default="synthetic", help="built-in in-memory dataset (default: synthetic)")
    parser.add_argument("--dataset-arg", action="append", metavar="K=V", help="dataset option, e.g. size=20000")
    parser.add_argument("--format", choices=FORMATS, default="png", help="png: an image folder; npy: arrays (default: png)")
    parser.add_argument("--seed", type=int, default=0, help="the dataset's seed and train/test split (default: 0)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(handler=_make_data)
