"""Does the batch size matter on a task? One process trains it at several global batches and compares.

``python -m benchmarks.batch_sweep --batch 64,256,1024 --epochs 40`` trains the workload (by default
the MLP on the ``teacher`` task, SGD at the server's default lr 0.1 and momentum 0.9) from the same
initial weights at each batch size, on one torch thread, and records the test accuracy after every
epoch and the training time (evaluation excluded). It prints JSON (per batch: accuracies, best, and
per target accuracy the first epoch and seconds that reach it) and a short table. A task on which
the batch size matters shows different times to a target, and accuracy still rising late.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from benchmarks.cli_types import ints
from benchmarks.report_output import add_result_options, save_result
from benchmarks.workload import add_child_workload_arguments, build


def _accuracies(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated accuracies, got {text!r}") from None
    if not values or any(not 0.0 < v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated accuracies in (0, 1], got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.batch_sweep",
        description="Train one workload at several batch sizes in one process; print accuracy per epoch "
                    "and the time to target accuracies as JSON and a table.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_child_workload_arguments(p)
    p.set_defaults(model="mlp", dataset="teacher", lr=0.1)
    p.add_argument("--batch", type=ints, default=[64, 256, 1024], help="global batch sizes, comma-separated")
    p.add_argument("--epochs", type=int, default=30, help="epochs per batch size")
    p.add_argument("--target", type=_accuracies, default=[0.6, 0.7], help="target test accuracies")
    p.add_argument("--json", action="store_true", help="print the JSON report before the table")
    add_result_options(p)
    return p


class Epoch(NamedTuple):
    """One epoch at a fixed batch: every step's training loss, its training seconds (evaluation
    excluded) and the test accuracy after it."""

    losses: list[float]
    seconds: float
    accuracy: float


def fixed_batch_epochs(args: argparse.Namespace, batch: int) -> Iterator[Epoch]:
    """Train the workload from its seeded initial weights (``args.seed``: weights, data and order) at one
    global batch, an SGD step on the mean loss of `batch` samples (what a BSP round with batch-weighted
    aggregation applies, whatever the split), for ``args.epochs`` epochs, each dropping the ragged last
    batch; ValueError for a batch above the training set."""
    import torch
    import torch.nn.functional as F

    from ps.rounds.evaluator import evaluate

    model, data = build(args)
    if batch > len(data.train_x):
        raise ValueError(f"batch {batch} exceeds the {len(data.train_x)} training samples")
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    order_rng = torch.Generator().manual_seed(args.seed)
    steps_per_epoch = len(data.train_x) // batch
    for _ in range(args.epochs):
        model.train()
        order = torch.randperm(len(data.train_x), generator=order_rng)
        losses = []
        started = time.perf_counter()
        for step in range(steps_per_epoch):
            idx = order[step * batch:(step + 1) * batch]
            loss = F.cross_entropy(model(data.train_x[idx]), data.train_y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        seconds = time.perf_counter() - started
        yield Epoch(losses, seconds, evaluate(model, data.test)[0])


def sweep_one(args: argparse.Namespace, batch: int) -> dict[str, Any]:
    """Train from the seeded initial weights at one batch size; accuracy and training time per epoch."""
    accuracy, seconds, spent, steps_per_epoch = [], [], 0.0, 0
    for epoch in fixed_batch_epochs(args, batch):
        spent += epoch.seconds
        steps_per_epoch = len(epoch.losses)
        accuracy.append(round(epoch.accuracy, 4))
        seconds.append(round(spent, 3))
    reached = {}
    for target in args.target:
        epoch_at = next((e for e, a in enumerate(accuracy) if a >= target), None)
        reached[str(target)] = None if epoch_at is None else {"epoch": epoch_at + 1, "seconds": seconds[epoch_at]}
    return {"batch": batch, "steps_per_epoch": steps_per_epoch, "accuracy": accuracy, "seconds": seconds,
            "best": max(accuracy), "reached": reached}


def table(results: list[dict[str, Any]], targets: list[float], epochs: int) -> str:
    marks = sorted({e for e in (5, 10, 20, epochs // 2, epochs) if 1 <= e <= epochs})
    head = ["B"] + [f"acc@{e}" for e in marks] + ["best"] + [f"to {t:g}: epoch, s" for t in targets]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        cells = [str(r["batch"])] + [f"{r['accuracy'][e - 1]:.3f}" for e in marks] + [f"{r['best']:.3f}"]
        for t in targets:
            hit = r["reached"][str(t)]
            cells.append("not reached" if hit is None else f"{hit['epoch']}, {hit['seconds']:.1f}")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.epochs < 1:
        print("benchmarks.batch_sweep: error: --epochs must be >= 1", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(1)
    try:
        results = [sweep_one(args, batch) for batch in args.batch]
    except ValueError as exc:  # a bad --model/--dataset option, or a batch larger than the data
        print(f"benchmarks.batch_sweep: error: {exc}", file=sys.stderr)
        return 2
    report = {"date": time.strftime("%Y-%m-%d"), "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "workload": {
        "model": args.model, "model_args": args.model_arg, "dataset": args.dataset, "dataset_args": args.dataset_arg,
        "lr": args.lr, "momentum": args.momentum, "seed": args.seed, "threads": 1}, "results": results}
    if args.json:
        print(json.dumps(report))
        print()
    print(table(results, args.target, args.epochs))
    save_result(args, "batch_sweep", report, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
