"""`python -m benchmarks.adaptive`: time to a target test accuracy, `--adaptive-batch gns` against
fixed global batches (small, medium, large), on the emulated HL8 cluster (CPU quotas,
benchmarks/hetero), same seeds; prints JSON.

Each run trains until its first evaluation at or above the task's target (or its epoch cap) and is
timed by the server's training wall time at that evaluation (`eval.wall_s`). The adaptive run starts
at the medium B with [small, large] as its bounds. Targets (issue: adaptive batch): the median over
seeds of adaptive / the best fixed B's time <= 0.8, and no seed's ratio above 1.1 (a seed whose
adaptive run misses the target counts as above it)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks import analysis
from benchmarks.hetero.cli import build_parser as hetero_parser
from benchmarks.hetero.cli import settings as hetero_settings
from benchmarks.hetero.runs import Run, run_cluster
from benchmarks.hetero.settings import Settings, log, resolve_emulation
from benchmarks.report_output import add_result_options, save_result

SOURCE = "issue: adaptive global batch (Cannikin §4 goodput; Pollux efficiency)"


@dataclass(frozen=True)
class Task:
    """A task: its workload flags, target accuracy, the small/medium/large B, its LR and epoch cap."""

    name: str
    args: tuple[str, ...]
    target: float
    batches: tuple[int, int, int]
    lr: float
    epochs: int


TASKS = {
    "teacher": Task("teacher", ("--model", "mlp", "--model-arg", "hidden=128", "--dataset", "teacher"),
                    0.6, (128, 256, 1024), 0.1, 14),
    "digits": Task("digits", ("--model", "mlp", "--model-arg", "hidden=64", "--dataset", "digits"),
                   0.93, (32, 128, 512), 0.1, 20),
}


TINY = ("--dataset-arg", "size=2560")
"""--tiny: hetero's software slowdown instead of quotas, and (teacher) small data: 2,048 training samples,
whose epoch holds 16 rounds (goodput.MIN_STEPS_PER_EPOCH) at the smallest arm's B of 128, as ps-server
requires of the adaptive range."""


def arms(task: Task) -> dict[str, list[str]]:
    """The runs of a task: each fixed B, the adaptive one from the medium B within [small, large]
    (--lr-scaling adascale, the default), and (opt-in, --arms) the adaptive one under the other rules."""
    small, medium, large = task.batches
    out = {f"fixed_{b}": ["--global-batch", str(b)] for b in task.batches}
    out["adaptive"] = ["--global-batch", str(medium), "--adaptive-batch", "gns", "--min-global-batch", str(small),
                       "--max-global-batch", str(large)]
    for rule in ("linear", "sqrt"):
        out[f"adaptive_{rule}"] = [*out["adaptive"], "--lr-scaling", rule]
    return out


DEFAULT_ARMS = ("fixed", "adaptive")
"""The arms run unless --arms names others: every fixed B, and adaptive."""


def task_settings(args: argparse.Namespace, task: Task, seed: int, workdir: Path) -> Settings:
    """benchmarks.hetero's settings for the task (HL8 by default, --tta its target), one seed."""
    argv = [*task.args, "--tta", str(task.target), "--epochs", str(args.epochs or task.epochs), "--lr", str(task.lr),
            "--seed", str(seed), "--policies", args.policy, "--profile", args.profile, "--no-baselines",
            "--run-timeout", str(args.run_timeout), *(["--cpu-budget", str(args.cpu_budget)] if args.cpu_budget else []),
            *(["--tiny", *(TINY if task.name == "teacher" else ())] if args.tiny else [])]
    s = hetero_settings(hetero_parser().parse_args(argv), workdir)
    return replace(s, workload=replace(s.workload, seed=seed))


def time_to_target(run: Run, target: float) -> dict[str, Any]:
    """A run's time and epochs to the target, its best accuracy, and what --adaptive-batch decided."""
    evals = analysis.of_kind(run.events, "eval")
    reached = analysis.first_reaching(evals, target)
    decisions = analysis.of_kind(run.events, "adapt")
    return {
        "time_to_target_s": None if reached is None else reached["wall_s"],
        "epochs_to_target": None if reached is None else reached["epoch"],
        "best_accuracy": max((e["accuracy"] for e in evals), default=None),
        "batches": [d["global_batch"] for d in decisions] or None,
        "phi": [d["phi"] for d in decisions] or None,
        "lr": [round(d["lr"], 5) for d in decisions] or None,
        "gain": [d["gain"] for d in decisions] or None,
        "basis": [d.get("basis") for d in decisions] or None,
    }


def bench_task(args: argparse.Namespace, task: Task, workdir: Path) -> dict[str, Any]:
    """Every arm of the task for every seed; per seed the adaptive time over the best fixed B's."""
    seeds: dict[str, Any] = {}
    for seed in args.seeds:
        s = task_settings(args, task, seed, workdir / f"{task.name}-{seed}")
        emu = resolve_emulation(s)
        runs = {}
        for name, extra in arms(task).items():
            if name not in args.arms and not (name.startswith("fixed_") and "fixed" in args.arms):
                continue
            def stop(cluster: Any, event: dict, run: Run) -> bool:
                return event.get("event") == "eval" and float(event.get("accuracy") or 0.0) >= task.target

            run = run_cluster(s, emu, f"{task.name}-s{seed}-{name}", args.policy, extra_server_args=extra, on_event=stop)
            runs[name] = time_to_target(run, task.target)
        fixed = [r["time_to_target_s"] for n, r in runs.items() if n.startswith("fixed_") and r["time_to_target_s"] is not None]
        best = min(fixed) if fixed else None
        mine = runs["adaptive"]["time_to_target_s"] if "adaptive" in runs else None
        seeds[str(seed)] = {"runs": runs, "best_fixed_s": best,
                            "adaptive_over_best_fixed": None if best is None or mine is None else round(mine / best, 4),
                            "limiter": emu.limiter, "shares": emu.shares}
    ratios = [v["adaptive_over_best_fixed"] for v in seeds.values()]
    known = [r for r in ratios if r is not None]
    median = statistics.median(known) if known and len(known) == len(ratios) else None
    worst = max(known) if known and len(known) == len(ratios) else None
    return {"target_accuracy": task.target, "batches": task.batches, "lr": task.lr, "seeds": seeds,
            "median_ratio": median, "worst_ratio": worst,
            "targets": [analysis.target(f"{task.name}: adaptive / best fixed B, median over seeds", median, "<=", 0.8, SOURCE),
                        analysis.target(f"{task.name}: adaptive / best fixed B, every seed", worst, "<=", 1.1, SOURCE)]}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.adaptive", description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default="teacher,digits", help="comma-separated of: " + ", ".join(TASKS))
    p.add_argument("--seeds", type=lambda t: [int(x) for x in t.split(",")], default=[0, 1, 2], help="e.g. 0,1,2")
    p.add_argument("--epochs", type=int, default=None, help="epoch cap per run (default: the task's)")
    p.add_argument("--controller", dest="policy", default="model", help=argparse.SUPPRESS)
    p.add_argument("--policy", default="model",
                   help="the batch policy of every run (default: model, whose fits predict the round at other B; "
                        "--controller is the same flag)")
    p.add_argument("--profile", default="hl8", help="heterogeneity profile (default: hl8)")
    p.add_argument("--cpu-budget", type=float, default=None, help="cores the quotas share (default: hetero's)")
    p.add_argument("--run-timeout", type=float, default=900.0, help="seconds per run before giving up")
    p.add_argument("--arms", type=lambda t: [a.strip() for a in t.split(",") if a.strip()], default=list(DEFAULT_ARMS),
                   help="runs per task and seed: fixed (every fixed B), adaptive, adaptive_linear, adaptive_sqrt")
    p.add_argument("--tiny", action="store_true", help="a smoke run: software slowdown, small data")
    p.add_argument("--json", action="store_true", help="print the JSON report")
    add_result_options(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        parser.error(f"--tasks: unknown {unknown or 'empty'}; choose from {', '.join(TASKS)}")
    started = time.monotonic()
    report: dict[str, Any] = {"benchmark": "adaptive", "controller": args.policy, "profile": args.profile,
                              "seeds": args.seeds, "tasks": {}}
    with tempfile.TemporaryDirectory(prefix="adaptive-bench-") as tmp:
        for name in tasks:
            log(f"adaptive: task {name}")
            report["tasks"][name] = bench_task(args, TASKS[name], Path(tmp))
    report["targets"] = [t for v in report["tasks"].values() for t in v["targets"]]
    report["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(report, indent=None if args.json else 2))
    save_result(args, "adaptive", report, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
