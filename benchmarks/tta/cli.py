"""`python -m benchmarks.tta`: the flags, the settings they resolve to, the arms over the seeds, and the output."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.cli_types import choices, distinct_ints, emulation_arguments, parse_resolved, seeds
from benchmarks.cluster_run import run_in_workdir
from benchmarks.hetero.cli import build_parser as hetero_parser
from benchmarks.hetero.cli import settings as hetero_settings
from benchmarks.hetero.report import environment
from benchmarks.hetero.settings import Emulation, Settings, limiter_backend_of, log, resolve_emulation
from benchmarks.report_output import add_report_options, emit
from benchmarks.tta import arms as arms_
from benchmarks.tta.plots import write_plots
from benchmarks.tta.report import render_table, summarize, targets
from benchmarks.tta.sweep import render_sweep_table, sweep_targets
from common.ops.arg_types import eval_interval, positive_float, positive_int

TARGET = 0.8
"""The default target: past the plateau near 0.5 that the default CNN crosses on patterns in 7-12 epochs at B=512."""
EVAL_EVERY = "0.25"
"""Every arm evaluates four times an epoch (--eval-every): a target reached in 2 to 4 epochs is timed to a
quarter of one."""

QUICK_DATASET_ARGS = ("size=384", "image_size=8", "shift=1", "separation=1.5")


def sweep_batches(text: str) -> list[int]:
    """Comma-separated distinct B0s >= 1, in increasing order."""
    return sorted(distinct_ints(text, 1, "B0s"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.tta",
        description="Time to a test accuracy, and the accuracy within a time budget, on an emulated heterogeneous "
        "cluster (one CPU-quota cgroup per worker): equal-batch DDP, DDP with per-rank batches set to our model "
        "policy's split, and our parameter server under the uniform, dynamic and model policies and model with "
        "--adaptive-batch gns; every seed, median and worst. Progress on stderr; JSON (--json) then a markdown "
        "table on stdout; with --out, the accuracy curves of every arm (a plot a seed) and the adaptive arm's B.",
        epilog="examples:\n"
        "  python -m benchmarks.tta --json --save-result                # HL8, cnn on patterns, seeds 0,1,2\n"
        "  ps-cluster make-data --dataset patterns --out /tmp/pat\n"
        "  python -m benchmarks.tta --dataset image_folder --dataset-arg root=/tmp/pat --json\n"
        "  python -m benchmarks.tta --sweep 64,128,256,512,1024 --arms model,model_adaptive,ddp_split --json\n"
        "  python -m benchmarks.tta --quick --json                      # smoke test (seconds)\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = p.add_argument_group("what to measure")
    what.add_argument("--profile", default="hl8", metavar="NAME|PATH", help="heterogeneity profile (default: hl8)")
    what.add_argument("--arms", type=choices(arms_.ARMS), default=list(arms_.ARMS), metavar="LIST",
                      help=f"comma-separated arms (default: all of {','.join(arms_.ARMS)}; ddp_split takes model's "
                      "final split of the first seed, so it needs model)")
    what.add_argument("--seeds", type=seeds, default=None, metavar="LIST",
                      help="comma-separated seeds, each a model initialisation, data set and order (default: 0,1,2; "
                      "--quick: 0)")
    what.add_argument("--target", type=positive_float, default=None,
                      help=f"test accuracy to reach (default: {TARGET}; --quick: 0.15)")
    what.add_argument("--budget", type=float, default=None, metavar="S",
                      help="seconds of training after which the accuracy reached is reported; a run goes on until "
                      "both the target and the budget are reached, or --epochs (default: 60)")
    what.add_argument("--epochs", type=positive_int, default=None, help="epoch cap of every run (default: 30; --quick: 2)")
    what.add_argument("--eval-every", type=eval_interval, default=EVAL_EVERY, metavar="EPOCHS",
                      help="every arm evaluates every EPOCHS epochs, or K times an epoch with EPOCHS = 1/K: a time to "
                      "the target then resolves a K-th of an epoch (a target 3 epochs in, evaluated only at epoch "
                      f"ends, reads 3 or 4 epochs: a third apart) (default: {EVAL_EVERY})")
    what.add_argument("--run-timeout", type=positive_float, default=1800.0, help="seconds per run before giving up")
    what.add_argument("--quick", action="store_true",
                      help="smoke test: a tiny CNN and data set, one seed, 2 epochs, software slowdown (seconds)")
    job = p.add_argument_group("workload (default: what ps-cluster run trains: cnn on patterns size=4096, B 512, lr 0.02)")
    job.add_argument("--model", default="cnn", help="model of every arm (default: cnn)")
    job.add_argument("--model-arg", action="append", metavar="K=V", help="model option (--quick: width=4)")
    job.add_argument("--dataset", default="patterns", help="data set, e.g. image_folder (default: patterns)")
    job.add_argument("--dataset-arg", action="append", metavar="K=V",
                     help="data set option, e.g. root=DIR (default for patterns: size=4096; --quick: "
                     f"{' '.join(QUICK_DATASET_ARGS)})")
    job.add_argument("--global-batch", type=positive_int, default=None, help="B, the fixed B0 of the adaptive arm "
                     "(default: 512; --quick: 64)")
    job.add_argument("--sweep", type=sweep_batches, default=None, metavar="LIST",
                     help="comma-separated B0s, e.g. 64,128,256,512,1024: every arm from each (instead of "
                     "--global-batch), the adaptive arm within the same bounds from all of them, and the goals "
                     "against the best fixed B of model and of ddp_split")
    job.add_argument("--lr", type=positive_float, default=0.02, help="learning rate (default: 0.02)")
    job.add_argument("--min-global-batch", type=positive_int, default=None,
                     help="model_adaptive's smallest B (default: B/4; --sweep: the smallest B0/4)")
    job.add_argument("--max-global-batch", type=positive_int, default=None,
                     help="model_adaptive's largest B (default: 4B; --sweep: the largest B0 x 4)")
    emulation_arguments(p)
    add_report_options(p.add_argument_group("output"), "tta")
    return p


def settings(args: argparse.Namespace, seed: int, workdir: Path) -> Settings:
    """benchmarks.hetero's settings for one seed (its emulation, workload and run helpers)."""
    quick = args.quick
    dataset_args = args.dataset_arg or (list(QUICK_DATASET_ARGS if quick else ("size=4096",))
                                        if args.dataset == "patterns" else [])
    model_args = args.model_arg or (["width=4"] if quick else [])
    argv = ["--profile", args.profile, "--tta", str(args.target), "--epochs", str(args.epochs), "--lr", str(args.lr),
            "--global-batch", str(args.global_batch), "--model", args.model, "--dataset", args.dataset,
            "--seed", str(seed), "--no-baselines", "--run-timeout", str(args.run_timeout),
            *(f"--model-arg={a}" for a in model_args), *(f"--dataset-arg={a}" for a in dataset_args),
            *(["--cpu-budget", str(args.cpu_budget)] if args.cpu_budget else []),
            *(["--limiter", args.limiter] if args.limiter else []), *(["--tiny"] if quick else [])]
    s = hetero_settings(hetero_parser().parse_args(argv), workdir)
    return replace(s, workload=replace(s.workload, seed=seed))


def resolve_defaults(args: argparse.Namespace) -> None:
    """Fill the defaults that depend on --quick, and check what the parser cannot (ValueError)."""
    quick = args.quick
    args.seeds = args.seeds or ([0] if quick else [0, 1, 2])
    args.target = args.target if args.target is not None else (0.15 if quick else TARGET)
    args.budget = 60.0 if args.budget is None else args.budget
    args.epochs = args.epochs or (2 if quick else 30)
    if args.sweep is not None and args.global_batch is not None:
        raise ValueError("--sweep gives the B0s: leave out --global-batch")
    starts = args.sweep or [args.global_batch or (64 if quick else 512)]
    args.global_batch = starts[0]
    args.min_global_batch = args.min_global_batch or max(1, min(starts) // 4)
    args.max_global_batch = args.max_global_batch or 4 * max(starts)
    if args.target > 1 or args.budget < 0:
        raise ValueError("--target is an accuracy in (0, 1]; --budget must be >= 0")
    if not (args.min_global_batch <= min(starts) and max(starts) <= args.max_global_batch):
        raise ValueError("--min-global-batch <= every B0 (--global-batch, --sweep) <= --max-global-batch")
    if "ddp_split" in args.arms and "model" not in args.arms:
        raise ValueError("--arms: ddp_split takes model's split: add model")
    limiter_backend_of(args.limiter or "auto")  # --limiter cgroup where this machine has none


def run_seed(args: argparse.Namespace, s: Settings, emu: Emulation, seed: int, split: dict[str, int] | None,
             timings: dict[str, float]) -> tuple[dict[str, dict], dict[str, int] | None]:
    """Every arm on one seed, our server's first (ddp_split takes model's split when none is set yet)."""
    goal = arms_.Goal(args.target, args.budget, args.eval_every)
    records: dict[str, dict] = {}
    for arm in [a for a in arms_.ARMS if a in args.arms and a in arms_.PS_ARMS] + \
               [a for a in arms_.ARMS if a in args.arms and a in arms_.DDP_ARMS]:
        t = time.monotonic()
        name = f"s{seed}-{arm}"
        if arm in arms_.PS_ARMS:
            records[arm] = arms_.run_ps(s, emu, name, arm, goal, args.min_global_batch, args.max_global_batch)
            if arm == "model" and split is None:
                split = records[arm]["batch_sizes"]
        else:
            batches = arms_.ddp_batches(s, emu, split if arm == "ddp_split" else None)
            records[arm] = arms_.run_ddp_arm(s, emu, name, batches, goal)
        timings[name] = round(time.monotonic() - t, 1)
        r = records[arm]
        log(f"{name}: time to {args.target}: {r['time_to_target_s']} s, accuracy within {args.budget:g} s: "
            f"{r['accuracy_at_budget']}")
    return records, split


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Every arm on every seed; the report."""
    started = time.monotonic()
    per_arm: dict[str, dict[str, dict]] = {arm: {} for arm in args.arms}
    timings: dict[str, float] = {}
    split: dict[str, int] | None = None
    report: dict[str, Any] = {"benchmark": "tta", "profile": args.profile, "quick": args.quick, "seeds": args.seeds}
    for seed in args.seeds:
        s = settings(args, seed, workdir / f"seed-{seed}")
        emu = resolve_emulation(s)
        if "environment" not in report:
            report["environment"] = environment(s, emu)
            report["workload"] = {**s.workload.describe(), "seed": None, "epochs": s.epochs, "target": args.target,
                                  "budget_s": args.budget, "min_global_batch": args.min_global_batch,
                                  "max_global_batch": args.max_global_batch}
            log(f"tta: limiter {emu.limiting}, shares {dict(zip(emu.names, emu.shares))}, target {args.target}, "
                f"budget {args.budget:g} s, seeds {args.seeds}, arms {args.arms}")
        records, split = run_seed(args, s, emu, seed, split, timings)
        for arm, record in records.items():
            per_arm[arm][str(seed)] = record
    report["split"] = {"from": "model, first seed", "batch_sizes": split} if "ddp_split" in args.arms else None
    report["arms"] = summarize(per_arm)
    report["targets"] = targets(report["arms"], args.seeds)
    report["environment"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    report["timings_s"] = {**timings, "total": round(time.monotonic() - started, 1)}
    return report


def run_sweep(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Every arm from each B0 of --sweep (`run`, the adaptive arm within the same bounds); the sweep's report."""
    started = time.monotonic()
    runs: dict[str, dict[str, Any]] = {}
    for b0 in args.sweep:
        log(f"tta sweep: B0 = {b0}")
        runs[str(b0)] = run(argparse.Namespace(**{**vars(args), "global_batch": b0}), workdir / f"b{b0}")
    return {"benchmark": "tta", "sweep": args.sweep, "profile": args.profile, "quick": args.quick,
            "seeds": args.seeds, "min_global_batch": args.min_global_batch, "max_global_batch": args.max_global_batch,
            "runs": runs, "targets": sweep_targets(runs), "seconds": round(time.monotonic() - started, 1)}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_resolved(build_parser(), argv, resolve_defaults)
    code, report = run_in_workdir("tta", args.out, lambda workdir: (run_sweep if args.sweep else run)(args, workdir))
    if report is None:
        return code
    if args.out is not None:
        reports = report["runs"] if args.sweep else {"": report}
        report["plots"] = [str(p) for b0, r in reports.items()
                           for p in write_plots(r, args.out / f"b{b0}" if b0 else args.out)]
    emit(args, "tta", "tta", report, (render_sweep_table if args.sweep else render_table)(report), argv)
    return 0
