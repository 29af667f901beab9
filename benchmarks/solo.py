"""One worker alone: the local training loop whose throughput a perfect balancer could reach.

``python -m benchmarks.solo --batch 64 [workload flags]`` trains the workload with no server at
all: fetch a batch (the worker's elastic sampler), forward, backward, SGD step, on one torch thread,
and prints one JSON line per measured configuration: ``{"batch", "slowdown", "steps", "seconds",
"step_ms", "samples_per_s"}``. The benchmark driver starts it inside the worker's CPU cgroup (placed
before exec), one worker after another, and sums the results: the ``ideal`` throughput.

``--batch`` and ``--slowdown`` take comma-separated lists (one configuration each, measured in
turn in this one process): where no cgroup backend is writable, the driver emulates slow workers by
sleeping, as ``ps-worker --slowdown`` does, and then needs no process per worker.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.cli_types import ints
from benchmarks.workload import add_child_workload_arguments, build, tune_like_a_worker


def _floats(text: str) -> list[float]:
    values = [float(v) for v in text.split(",") if v.strip()]
    if not values or any(not v >= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers >= 1, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.solo",
        description="Train the workload locally (no server) and print samples/s as JSON lines.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_child_workload_arguments(p)
    p.add_argument("--batch", type=ints, required=True, help="batch size(s), comma-separated")
    p.add_argument("--slowdown", type=_floats, default=[1.0],
                   help="software slowdown(s) per configuration (sleep compute*(F-1)), comma-separated")
    p.add_argument("--warmup", type=int, default=2, help="steps before timing starts")
    p.add_argument("--seconds", type=float, default=5.0, help="time at least this long ...")
    p.add_argument("--min-steps", type=int, default=3, help="... and at least this many steps")
    p.add_argument("--max-steps", type=int, default=10_000, help="stop timing after this many steps")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    return p


def measure(model: Any, dataset: Any, batch: int, slowdown: float, args: argparse.Namespace, index: int) -> dict:
    """Time steady steps of the local loop at one batch size."""
    import torch
    import torch.nn.functional as F

    from worker.data.sampler import ElasticBatchSampler

    sampler = ElasticBatchSampler(len(dataset.train_x), seed=args.seed * 1009 + index, batch_size=batch)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    model.train()

    def step() -> None:
        started = time.perf_counter()
        idx = sampler.next_batch()
        x, y = dataset.train_x[idx], dataset.train_y[idx]
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        if slowdown > 1.0:
            time.sleep((time.perf_counter() - started) * (slowdown - 1.0))
        optimizer.step()

    for _ in range(args.warmup):
        step()
    steps = 0
    start = time.perf_counter()
    while steps < args.max_steps and (steps < args.min_steps or time.perf_counter() - start < args.seconds):
        step()
        steps += 1
    seconds = time.perf_counter() - start
    return {
        "batch": batch,
        "slowdown": slowdown,
        "steps": steps,
        "seconds": round(seconds, 4),
        "step_ms": round(1000.0 * seconds / steps, 3),
        "samples_per_s": round(steps * batch / seconds, 2),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.warmup < 0 or args.min_steps < 1 or args.max_steps < args.min_steps or args.threads < 1:
        print("benchmarks.solo: error: need --warmup >= 0, 1 <= --min-steps <= --max-steps, --threads >= 1", file=sys.stderr)
        return 2
    if not tune_like_a_worker("benchmarks.solo"):  # so the ideal is measured with the workers' allocator settings
        return 2
    slowdowns = args.slowdown if len(args.slowdown) == len(args.batch) else args.slowdown * len(args.batch)
    if len(slowdowns) != len(args.batch):
        print("benchmarks.solo: error: give one --slowdown, or one per --batch", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(args.threads)
    for index, (batch, slowdown) in enumerate(zip(args.batch, slowdowns)):
        model, dataset = build(args)  # fresh weights per configuration: every solo starts alike
        print(json.dumps(measure(model, dataset, batch, slowdown, args, index)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
