"""`python -m benchmarks.memory_bound`: the b_max a worker measures on a GPU (worker/data/memory_probe.py)
against the largest batch that actually fits there.

The probe's figure comes from two small steps (torch's peak allocated bytes at two batch sizes and
the device's free memory); the largest batch that fits is found by trying real forward and backward
passes (doubling, then bisection, an out-of-memory error meaning "does not fit"). Target: the probe
within 10% of what fits. Needs a CUDA device: without one it prints {"skipped": ...} and exits 0.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.analysis import target
from benchmarks.report_output import add_result_options, save_result
from common.job.datasets import Dataset, build_dataset
from common.job.models import build_model
from ps.server_flags import parse_options
from worker.data.memory_probe import probe_max_batch

TARGET = 0.10
"""The most the probe may be off the largest batch that fits, as a fraction of it."""


def targets(measured: int, actual: int) -> list[dict[str, Any]]:
    """The probe within `TARGET` of the largest batch that fits, and not above it (a worker planned a
    batch above it runs out of memory)."""
    return [target("a GPU worker's measured b_max off the largest batch that fits, fraction of it",
                   abs(measured - actual) / max(1, actual), "<=", TARGET, "memory_bound"),
            target("a GPU worker's measured b_max over the largest batch that fits", measured / max(1, actual), "<=", 1.0,
                   "memory_bound")]


def fits(model: nn.Module, batch: int, shape: tuple[int, ...], classes: int, device: torch.device) -> bool:
    """Whether one forward and backward of `batch` random samples runs on `device` without running out."""
    x: torch.Tensor | None
    y: torch.Tensor | None
    try:
        x = torch.randn(batch, *shape, device=device)
        y = torch.randint(0, classes, (batch,), device=device)
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        torch.cuda.synchronize(device)
        return True
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        x = y = None  # noqa: F841 (freed before the cache is emptied)
        model.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()


def largest_fitting(model: nn.Module, start: int, shape: tuple[int, ...], classes: int, device: torch.device,
                    tolerance: float = 0.01) -> int:
    """The largest batch that fits, to `tolerance` of it: doubling from `start`, then bisection."""
    low, high = 0, max(2, start)
    while fits(model, high, shape, classes, device):
        low, high = high, high * 2
    while high - low > max(1, int(tolerance * low)):
        mid = (low + high) // 2
        low, high = (mid, high) if fits(model, mid, shape, classes, device) else (low, mid)
    return low


def build_parser() -> argparse.ArgumentParser:
    """`python -m benchmarks.memory_bound`'s command line."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.memory_bound", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="cnn-bn")
    p.add_argument("--model-arg", action="append", default=[], metavar="K=V")
    p.add_argument("--dataset", default="synthetic", help="gives the input shape and the classes")
    p.add_argument("--device", default="cuda")
    add_result_options(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    report: dict[str, Any] = {"model": args.model, "model_args": args.model_arg, "target": f"within {TARGET:.0%}"}
    if not torch.cuda.is_available():
        report["skipped"] = "needs a CUDA device (torch sees none)"
        print(json.dumps(report))
        save_result(args, "memory_bound", report, argv)
        return 0
    device = torch.device(args.device)
    data = build_dataset(args.dataset, {}, 0)
    assert isinstance(data, Dataset), f"{args.dataset}: the probe needs a dataset held in memory"
    model = build_model(args.model, data.input_shape, data.num_classes, parse_options(args.model_arg), 0)
    probe = probe_max_batch(model, data.train_x, data.train_y, device)  # as a worker does: its model still on the CPU
    model.to(device).train()
    actual = largest_fitting(model, max(2, probe.max_batch // 2), data.input_shape, data.num_classes, device)
    error = abs(probe.max_batch - actual) / max(1, actual)
    report.update(device=torch.cuda.get_device_name(device), measured_b_max=probe.max_batch, largest_fitting=actual,
                  per_sample_bytes=round(probe.per_sample_bytes), fixed_bytes=round(probe.fixed_bytes),
                  available_bytes=round(probe.available_bytes), relative_error=round(error, 4), met=error <= TARGET,
                  targets=targets(probe.max_batch, actual))
    print(json.dumps(report, indent=1))
    save_result(args, "memory_bound", report, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
