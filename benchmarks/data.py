"""`python -m benchmarks.data`: the worker's loader on an image folder written in the run.

1. Throughput: the worker's loader (worker.data.loader.Batches: index lists submitted ahead to a DataLoader
   over them) against a plain `torch.utils.data.DataLoader` (shuffled, same batch size), over the same
   files, the same per-sample transforms (decode, random crop and flip) and the same number of loader
   processes: samples/s of each and their ratio (target >= 0.9).
2. Exposed wait: a CNN training step fed by the loader with one loader process (`--loader-workers 1`):
   the time the steps waited for their batch as a fraction of the steps' time (target <= 10%).
3. Memory: a worker-like process training one epoch over the folder with one loader process: its peak
   resident memory (and its loader process's) against the folder's size on disk; the folder is a
   multiple of the process's memory only at sizes that make it one (`--files`, `--image-size`).

Prints one JSON object; each figure is measured in this run, its baseline beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.report_output import add_result_options, save_result
from common.ops.arg_types import int_at_least, positive_int

THROUGHPUT_TARGET = 0.9
WAIT_TARGET = 0.10
MEMORY_TARGET = 10.0  # the folder's size on disk over the peak RSS of the training process or its loader


def folder_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def write_folder(root: Path, files: int, image_size: int) -> float:
    """`files` PNG images (3 x image_size^2) under root, as ps-cluster make-data writes them; seconds taken."""
    from deploy.make_data import make_data

    started = time.perf_counter()
    make_data("synthetic", {"size": files, "image_size": image_size, "channels": 3}, 0, root, "png", progress=False)
    return time.perf_counter() - started


def write_noise_folder(root: Path, files: int, side: int, classes: int = 4) -> float:
    """`files` incompressible PNG images (3 x side^2 of random bytes, stored uncompressed) in `classes`
    class subfolders: a folder whose size on disk is its pixels; seconds taken."""
    import numpy as np
    from PIL import Image

    started = time.perf_counter()
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True, exist_ok=True)
    for i in range(files):
        pixels = rng.integers(0, 256, size=(side, side, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / f"c{i % classes}" / f"{i:06d}.png", compress_level=0)
    return time.perf_counter() - started


def throughput(root: Path, workers: int, batch: int, prefetch: int, rounds: int = 4) -> dict[str, Any]:
    """Samples/s over one epoch of the training split, ours and DataLoader's after their first batch,
    timed in `rounds` alternating stretches so that a change in the machine's load falls on both."""
    import torch
    from torch.utils.data import DataLoader

    from common.job.datasets import build_dataset
    from worker.data.loader import Batches, LoaderOptions
    from worker.data.sampler import ElasticBatchSampler

    data = build_dataset("image_folder", {"root": str(root)}, seed=0)
    train_size = len(data.train)  # type: ignore[arg-type]  # common.job.splits.Splits checks __len__
    steps = train_size // batch
    ours = Batches(data.train, ElasticBatchSampler(train_size, seed=0), LoaderOptions(workers, prefetch))
    plain = DataLoader(data.train, batch_size=batch, shuffle=True, drop_last=True, num_workers=workers,
                       prefetch_factor=max(1, -(-prefetch // workers)) if workers else None,
                       persistent_workers=workers > 0, multiprocessing_context="spawn" if workers else None,
                       generator=torch.Generator().manual_seed(0))
    theirs = iter(plain)
    ours.next(batch)
    next(theirs)
    stretch = max(1, (steps - 1) // rounds)
    elapsed = {"ours": 0.0, "theirs": 0.0}
    for _ in range(rounds):
        for name, draw in (("ours", lambda: ours.next(batch)), ("theirs", lambda: next(theirs))):
            started = time.perf_counter()
            for _ in range(stretch):
                draw()
            elapsed[name] += time.perf_counter() - started
    ours.close()
    del theirs
    samples = rounds * stretch * batch
    ours_rate, plain_rate = samples / elapsed["ours"], samples / elapsed["theirs"]
    return {"loader_workers": workers, "batch": batch, "samples": samples, "rounds": rounds,
            "ours_samples_per_s": round(ours_rate, 1), "dataloader_samples_per_s": round(plain_rate, 1),
            "ratio": round(ours_rate / plain_rate, 3), "target": THROUGHPUT_TARGET,
            "meets_target": ours_rate / plain_rate >= THROUGHPUT_TARGET}


def train_epoch(root: Path, workers: int, batch: int, prefetch: int, steps: int | None = None,
                train_size: int = 0) -> dict[str, Any]:
    """CNN steps fed by the loader: the wait for data as a fraction of the steps' time (after the first)."""
    import torch
    import torch.nn.functional as F

    from common.job.datasets import build_dataset
    from common.job.models import build_model
    from worker.data.loader import Batches, LoaderOptions
    from worker.data.sampler import ElasticBatchSampler

    torch.set_num_threads(1)
    data = build_dataset("image_folder", {"root": str(root), "image_size": train_size}, seed=0)
    model = build_model("cnn", data.input_shape, data.num_classes, {}, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    train_size = len(data.train)  # type: ignore[arg-type]  # common.job.splits.Splits checks __len__
    batches = Batches(data.train, ElasticBatchSampler(train_size, seed=0), LoaderOptions(workers, prefetch))
    steps = steps or train_size // batch
    waited = total = 0.0
    for step in range(steps):
        started = time.perf_counter()
        x, y = batches.next(batch)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        if step:  # the first waits for the loader process to start
            waited += batches.wait_ms / 1000.0
            total += time.perf_counter() - started
    batches.close()
    return {"loader_workers": workers, "batch": batch, "steps": steps - 1, "step_ms": round(total / (steps - 1) * 1000, 2),
            "data_wait_ms": round(waited / (steps - 1) * 1000, 3), "wait_fraction": round(waited / total, 4),
            "target": WAIT_TARGET, "meets_target": waited / total <= WAIT_TARGET}


def memory(root: Path, batch: int, train_size: int = 0) -> dict[str, Any]:
    """One epoch in a fresh process (one loader process, images resized to `train_size` as they are
    read): peak RSS of each against the folder on disk."""
    command = [sys.executable, "-m", "benchmarks.data", "--rss-child", str(root), "--batch", str(batch),
               "--train-size", str(train_size)]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    child = json.loads(out.stdout.strip().splitlines()[-1])
    disk = folder_bytes(root)
    peak = max(child["trainer_peak_rss_mb"], child["loader_peak_rss_mb"])
    return {"folder_mb": round(disk / 2**20, 1), "trainer_peak_rss_mb": child["trainer_peak_rss_mb"],
            "loader_process_peak_rss_mb": child["loader_peak_rss_mb"],
            "folder_over_trainer_rss": round(disk / 2**20 / child["trainer_peak_rss_mb"], 2),
            "folder_over_peak_rss": round(disk / 2**20 / peak, 2), "target": MEMORY_TARGET,
            "meets_target": disk / 2**20 / peak >= MEMORY_TARGET,
            "trainer_rss_after_setup_mb": child["rss_after_setup_mb"], "epoch": child["epoch"]}


def resident_mb(pid: int | str) -> float:
    """A process's resident memory now (VmRSS), 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def child_pids() -> list[str]:
    """This process's children (its loader processes), from /proc."""
    pids: list[str] = []
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            pids += (task / "children").read_text().split()
    return pids


def rss_child(root: Path, batch: int, train_size: int) -> None:
    """--rss-child: train one epoch and print the peak resident memory of this process and of its
    loader processes, sampled from /proc every 50 ms (getrusage's high-water mark would count the
    parent's memory this process was forked from)."""
    import torch  # noqa: F401 - counted in the setup's resident memory

    setup = resident_mb("self")
    peaks = {"trainer": setup, "loader": 0.0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            peaks["trainer"] = max(peaks["trainer"], resident_mb("self"))
            peaks["loader"] = max([peaks["loader"], *(resident_mb(pid) for pid in child_pids())])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    epoch = train_epoch(root, 1, batch, 2, train_size=train_size)
    stop.set()
    sampler.join()
    print(json.dumps({"trainer_peak_rss_mb": round(peaks["trainer"], 1), "loader_peak_rss_mb": round(peaks["loader"], 1),
                      "rss_after_setup_mb": round(setup, 1), "epoch": epoch}))


def build_parser() -> argparse.ArgumentParser:
    """`python -m benchmarks.data`'s command line."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.data", description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=positive_int, default=20000, help="images in the folder written for the run")
    p.add_argument("--image-size", type=positive_int, default=32, help="their side (3 channels)")
    p.add_argument("--batch", type=positive_int, default=64, help="samples per batch")
    p.add_argument("--loader-workers", type=positive_int, default=1, help="loader processes, ours and DataLoader's")
    p.add_argument("--prefetch", type=positive_int, default=2, help="batches prepared ahead")
    p.add_argument("--cnn-steps", type=int_at_least(2), default=100, help="CNN steps timed for the exposed wait")
    p.add_argument("--root", type=Path, help="an image folder to use instead of writing one")
    p.add_argument("--memory-files", type=int_at_least(0), default=1500,
                   help="images of the folder written for the memory run (0: train over the throughput folder)")
    p.add_argument("--memory-image-side", type=positive_int, default=1024,
                   help="their side: random pixels stored uncompressed, so the folder is files x 3 x side^2 bytes")
    p.add_argument("--train-size", type=positive_int, default=32, help="the memory run resizes each image to this side")
    p.add_argument("--rss-child", type=Path, help=argparse.SUPPRESS)
    add_result_options(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.rss_child is not None:
        rss_child(args.rss_child, args.batch, args.train_size)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or Path(tmp) / "images"
        wrote = 0.0 if args.root else write_folder(root, args.files, args.image_size)
        report: dict[str, Any] = {
            "benchmark": "data", "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "files": args.files,
            "image_size": args.image_size, "write_s": round(wrote, 1),
            "throughput": throughput(root, args.loader_workers, args.batch, args.prefetch),
            "cnn_step": train_epoch(root, 1, args.batch, args.prefetch, args.cnn_steps),
        }
        if args.memory_files:
            big = Path(tmp) / "large-images"
            report["memory_write_s"] = round(write_noise_folder(big, args.memory_files, args.memory_image_side), 1)
            report["memory"] = memory(big, args.batch, args.train_size)
            shutil.rmtree(big)
        else:
            report["memory"] = memory(root, args.batch)
    report["targets"] = targets(report)
    print(json.dumps(report, indent=1))
    save_result(args, "data", report, argv)
    return 0


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's three figures, in the form the results table reads."""
    t, c, m = report["throughput"], report["cnn_step"], report["memory"]
    return [
        {"name": f"our loader / DataLoader, samples/s ({t['loader_workers']} loader process)", "value": t["ratio"],
         "op": ">=", "threshold": THROUGHPUT_TARGET, "pass": t["meets_target"]},
        {"name": "CNN step's wait for data, --loader-workers 1", "value": c["wait_fraction"], "op": "<=",
         "threshold": WAIT_TARGET, "pass": c["meets_target"]},
        {"name": "folder on disk / peak RSS of a process training over it", "value": m["folder_over_peak_rss"],
         "op": ">=", "threshold": MEMORY_TARGET, "pass": m["meets_target"]},
    ]


if __name__ == "__main__":
    sys.exit(main())
