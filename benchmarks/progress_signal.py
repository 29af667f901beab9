"""How well the training loss measures progress per sample over the rounds a decision can wait for.

``python -m benchmarks.progress_signal`` trains the workload on one process at each fixed global
batch B (an SGD step on the mean loss of B samples: what a BSP round with batch-weighted aggregation
applies, whatever the split), records every step's training loss, and asks of it what a measured
take-back of a move on B would: over a window of W rounds, the slope of the loss per thousand
samples and its standard error (the step's scatter about the local trend over the window's spread of
samples), their ratio the window's signal-to-noise. Telling two batches whose goodput differs by a
fraction `gap` apart at `sds` standard errors, from one window at each, needs that ratio at
sds·√2/gap or more in each (`needed_snr`). The adaptive batch's review waits MIN_ROUNDS measured
rounds (ps/control/global_batch/goodput.py). Prints JSON (--json) and a table.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.analysis import target
from benchmarks.batch_sweep import fixed_batch_epochs
from benchmarks.cli_types import ints, seeds
from benchmarks.report_output import add_report_options, emit
from benchmarks.workload import add_child_workload_arguments, tune_like_a_worker
from ps.control.global_batch.goodput import MIN_ROUNDS

TREND_HALF = 20
"""Steps either side of a step that the local quadratic trend its residual is taken from spans."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.progress_signal",
        description="Train at fixed global batches on one process and measure how well the training loss's "
                    "slope over a window of rounds measures progress per sample (its signal-to-noise).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_child_workload_arguments(p)
    p.set_defaults(model="cnn", model_arg=["width=96"], dataset="patterns", dataset_arg=["size=4096"], lr=0.02)
    p.add_argument("--batches", type=ints, default=[16, 32, 64], help="the fixed global batches B to train at")
    p.add_argument("--seeds", type=seeds, default=[0, 1], help="seeds (model initialisation, data, order)")
    p.add_argument("--epochs", type=int, default=2, help="epochs at each B (the CNN reaches 0.8 in 1-2.5)")
    p.add_argument("--windows", type=ints, default=[MIN_ROUNDS, 16, 32],
                   help=f"window lengths in rounds ({MIN_ROUNDS}: the rounds a review of a move measures; the first "
                        "length is the targets')")
    p.add_argument("--gap", type=float, default=0.25, help="the goodput difference a take-back must tell apart")
    p.add_argument("--sds", type=float, default=2.0, help="standard errors a take-back asks of that difference")
    add_report_options(p, "progress_signal")
    return p


def needed_snr(gap: float, sds: float) -> float:
    """The signal-to-noise each of two windows needs for a difference of `gap` of their slope to
    stand `sds` standard errors of the difference (two independent slopes of the same error)."""
    return sds * math.sqrt(2.0) / gap


def residual_sd(losses: Sequence[float], half: int = TREND_HALF) -> float:
    """The scatter of each step's loss about a quadratic fitted over the 2·half + 1 steps around it
    (the steps `half` from either end have no such span and are left out)."""
    y = np.asarray(losses, dtype=float)
    if len(y) < 2 * half + 1:
        raise ValueError(f"need at least {2 * half + 1} steps for the trend, got {len(y)}")
    span = np.arange(-half, half + 1, dtype=float)
    out = []
    for i in range(half, len(y) - half):
        coef = np.polyfit(span, y[i - half:i + half + 1], 2)
        out.append(y[i] - coef[-1])  # the quadratic at the step itself (span 0)
    return float(np.std(out))


def window_snrs(losses: Sequence[float], batch: int, window: int, sd: float) -> list[dict[str, float]]:
    """Each whole window of `window` consecutive steps: the least-squares slope of the loss per
    thousand samples, its standard error with every step's scatter `sd`, and -slope / error."""
    y = np.asarray(losses, dtype=float)
    x = np.arange(window, dtype=float) * batch / 1000.0
    spread = float(((x - x.mean()) ** 2).sum())
    error = sd / math.sqrt(spread)
    out = []
    for start in range(0, len(y) - window + 1, window):
        slope = float(np.polyfit(x, y[start:start + window], 1)[0])
        out.append({"first_step": start, "slope_per_1k": slope, "error": error, "snr": -slope / error})
    return out


def train(args: argparse.Namespace, batch: int, seed: int) -> dict[str, Any]:
    """Every step's training loss at the fixed `batch`, and the test accuracy after each epoch."""
    losses: list[float] = []
    accuracy = []
    for epoch in fixed_batch_epochs(argparse.Namespace(**{**vars(args), "seed": seed}), batch):
        losses += epoch.losses
        accuracy.append(epoch.accuracy)
    return {"losses": losses, "accuracy_by_epoch": accuracy}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every (B, seed): the scatter of a step's loss and each window length's signal-to-noise."""
    runs = []
    for batch in args.batches:
        for seed in args.seeds:
            run = train(args, batch, seed)
            sd = residual_sd(run["losses"])
            windows = {}
            for w in args.windows:
                each = window_snrs(run["losses"], batch, w, sd)
                snrs = [e["snr"] for e in each]
                windows[str(w)] = {"windows": len(each), "median_snr": statistics.median(snrs) if snrs else None,
                                   "median_slope_per_1k": statistics.median(e["slope_per_1k"] for e in each) if each else None,
                                   "error_per_1k": each[0]["error"] if each else None}
            runs.append({"batch": batch, "seed": seed, "steps": len(run["losses"]), "loss_sd": sd,
                         "loss_first_last": [statistics.fmean(run["losses"][:5]), statistics.fmean(run["losses"][-5:])],
                         "accuracy_by_epoch": run["accuracy_by_epoch"], "by_window": windows})
    needed = needed_snr(args.gap, args.sds)
    first = str(args.windows[0])
    targets = [target(f"training loss's slope over {first} rounds at B = {b}: median SNR over seeds "
                      f"(a take-back telling {args.gap:.0%} of goodput apart needs)",
                      _median_or_none([r["by_window"][first]["median_snr"] for r in runs if r["batch"] == b]),
                      ">=", round(needed, 2), "progress_signal") for b in args.batches]
    return {"benchmark": "progress_signal", "targets": targets, "workload": {"model": args.model, "model_args": args.model_arg,
                                                         "dataset": args.dataset, "dataset_args": args.dataset_arg,
                                                         "lr": args.lr, "momentum": args.momentum, "epochs": args.epochs},
            "gap": args.gap, "sds": args.sds, "needed_snr": needed, "runs": runs}


def _median_or_none(values: Sequence[float | None]) -> float | None:
    """The median, or None where any value is (a window longer than the run)."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present and len(present) == len(values) else None


def table(report: dict[str, Any]) -> str:
    """A row per (B, seed): the loss's scatter a step, the accuracy by epoch and each window's median SNR."""
    windows = list(report["runs"][0]["by_window"]) if report["runs"] else []
    head = ["B", "seed", "loss sd a step", "test accuracy by epoch", *(f"SNR over {w} rounds" for w in windows)]
    rows = [f"| {' | '.join(head)} |", f"|{'---|' * len(head)}"]
    for run in report["runs"]:
        snrs = [run["by_window"][w]["median_snr"] for w in windows]
        cells = [str(run["batch"]), str(run["seed"]), f"{run['loss_sd']:.3f}",
                 ", ".join(f"{a:.2f}" for a in run["accuracy_by_epoch"]),
                 *("-" if s is None else f"{s:.2f}" for s in snrs)]
        rows.append(f"| {' | '.join(cells)} |")
    rows.append(f"\nA take-back telling a goodput difference of {report['gap']:.0%} at {report['sds']:g} standard "
                f"errors needs an SNR of {report['needed_snr']:.1f} in each window.")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.epochs < 1 or not 0 < args.gap < 1 or not args.sds > 0 or min(args.windows) < 3:
        parser.error("need --epochs >= 1, 0 < --gap < 1, --sds > 0 and windows of 3 rounds or more")
    if not tune_like_a_worker(parser.prog):
        return 2
    import torch

    torch.set_num_threads(1)
    try:
        report = measure(args)
    except ValueError as exc:  # a bad --model/--dataset option, a B above the data, too few steps for the trend
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    emit(args, "progress_signal", "progress_signal", report, table(report), argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
