"""`python -m benchmarks.micro_batches`: equal micro-batches (--micro-batch) against a uniform split and
plain variable batching, on the emulated HL8 cluster with the BatchNorm CNN (cnn-bn), same seeds.

Two parts, both printed as one JSON object:

* accuracy: per seed, three runs of the same job (digits, B=48 by default, so that the variable
  split gives HL8's slowest worker a batch of at most 4): `uniform` (equal batches), `variable`
  (the dynamic policy, any batch) and `microM` (the dynamic policy in micro-batches of M). Each run's
  final test accuracy, the server's BatchNorm running statistics at the end (common/job/batchnorm.py)
  and the smallest batch the slowest worker was given; then the mean and spread over seeds and how
  far each run's statistics are from the uniform run's of the same seed.
* throughput: the dynamic policy with and without --micro-batch on HL8's throughput workload (cnn-bn
  on synthetic 32x32 images, B=512), the steady samples/s (the epochs after the first) and their ratio.
  Target: micro >= 0.9x variable.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.cli_types import distinct_ints, seeds as seed_list
from benchmarks.hetero.cli import build_parser as hetero_parser
from benchmarks.hetero.cli import settings
from benchmarks.hetero.runs import run_cluster
from benchmarks.hetero.settings import limiter_backend_of, resolve_emulation
from benchmarks.report_output import add_result_options, save_result
from common.ops.arg_types import int_at_least, positive_float, positive_int

SLOWEST = "w2"
"""HL8's slowest worker (4 of 48 cores) as the emulation names it."""


def one_run(workdir: Path, name: str, controller: str, extra: Sequence[str], hetero_args: Sequence[str]) -> dict[str, Any]:
    """A run on the emulated cluster; its accuracy, BatchNorm statistics, batches and throughput."""
    s = settings(hetero_parser().parse_args([*hetero_args, "--no-baselines", "--policies", controller]), workdir)
    emu = resolve_emulation(s)
    run = run_cluster(s, emu, name, controller, extra_server_args=extra)
    evals = [e for e in run.events if e["event"] == "eval"]
    epochs = [e for e in run.events if e["event"] == "epoch"]
    summary = next(e for e in run.events if e["event"] == "summary")
    slow = emu.names[min(range(len(emu.shares)), key=lambda i: emu.shares[i])]
    steady = [e["samples_per_s"] for e in epochs[1:]] or [e["samples_per_s"] for e in epochs]
    return {
        "accuracy": evals[-1]["accuracy"] if evals else None,
        "bn": evals[-1].get("bn") if evals else None,
        "slowest_worker": slow,
        "slowest_batches": sorted({e["batch_sizes"][slow] for e in epochs if slow in e["batch_sizes"]}),
        "last_epoch_batches": epochs[-1]["batch_sizes"] if epochs else None,
        "samples_per_s": summary["samples_per_s"],
        "steady_samples_per_s": round(statistics.median(steady), 1) if steady else None,
        "limiting": run.limiting,
    }


def bn_distance(a: dict[str, dict[str, float]] | None, b: dict[str, dict[str, float]] | None) -> float | None:
    """Mean relative difference of two runs' per-layer running means and variances."""
    if not a or not b:
        return None
    diffs = [abs(a[layer][k] - b[layer][k]) / max(1e-6, abs(b[layer][k])) for layer in b for k in ("mean", "var")]
    return round(statistics.fmean(diffs), 4)


def spread(values: list[float]) -> dict[str, float | None]:
    return {"mean": round(statistics.fmean(values), 4) if values else None,
            "stdev": round(statistics.stdev(values), 4) if len(values) > 1 else None}


def _seeds(text: str) -> list[int]:
    """--seeds: distinct seeds >= 0, or none (empty: the throughput part only)."""
    return seed_list(text) if text.strip() else []


def _micro_batches(text: str) -> list[int]:
    """--micro-batch: distinct micro-batch sizes >= 1."""
    return distinct_ints(text, 1, "micro-batch sizes")


def build_parser() -> argparse.ArgumentParser:
    """`python -m benchmarks.micro_batches`'s command line."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.micro_batches", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=_seeds, default="0,1,2",
                   help="comma-separated seeds (each: uniform, variable, micro); empty: skip the accuracy part")
    p.add_argument("--global-batch", type=positive_int, default=48, help="B of the accuracy runs")
    p.add_argument("--micro-batch", type=_micro_batches, default="4,8",
                   help="comma-separated m of the accuracy runs (a micro run each)")
    p.add_argument("--epochs", type=positive_int, default=6, help="epochs of the accuracy runs")
    p.add_argument("--throughput-batch", type=int_at_least(0), default=512, help="B of the throughput runs (0: skip them)")
    p.add_argument("--throughput-micro-batch", type=positive_int, default=16, help="m of the throughput runs")
    p.add_argument("--throughput-epochs", type=positive_int, default=4)
    p.add_argument("--throughput-repeats", type=positive_int, default=3,
                   help="variable/micro pairs (the median ratio is reported)")
    p.add_argument("--cpu-budget", type=positive_float, default=None, help="passed to the HL8 emulation (default: its own)")
    p.add_argument("--limiter", choices=("auto", "cgroup", "slowdown"), default="auto",
                   help="how HL8's shares are applied (benchmarks.hetero --limiter)")
    add_result_options(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        limiter_backend_of(args.limiter)  # --limiter cgroup where this machine has none
    except ValueError as exc:
        p.error(str(exc))
    seeds: list[int] = args.seeds
    budget = [*(["--cpu-budget", str(args.cpu_budget)] if args.cpu_budget else []), "--limiter", args.limiter]
    workdir = Path(tempfile.mkdtemp(prefix="micro-bench-"))
    report: dict[str, Any] = {"profile": "hl8", "model": "cnn-bn", "accuracy_runs": {}, "workdir": str(workdir)}
    acc_args = ["--profile", "hl8", "--model", "cnn-bn", "--dataset", "digits", "--dataset-arg", "test_fraction=0.2", "--global-batch", str(args.global_batch),
                "--epochs", str(args.epochs), "--lr", "0.05", "--adjust-every", "10", *budget]
    micro: list[int] = args.micro_batch
    runs = {"uniform": ("uniform", []), "variable": ("dynamic", []),
            **{f"micro{m}": ("dynamic", ["--micro-batch", str(m)]) for m in micro}}
    for seed in seeds:
        for name, (controller, extra) in runs.items():
            record = one_run(workdir, f"{name}-s{seed}", controller, extra, [*acc_args, "--seed", str(seed)])
            report["accuracy_runs"].setdefault(name, []).append({"seed": seed, **record})
    by = report["accuracy_runs"]
    if seeds:  # --seeds "": the throughput part only
        report["accuracy"] = {name: spread([r["accuracy"] for r in by[name] if r["accuracy"] is not None]) for name in runs}
        report["bn_distance_to_uniform"] = {
            name: [bn_distance(r["bn"], u["bn"]) for r, u in zip(by[name], by["uniform"], strict=True)]
            for name in runs if name != "uniform"}
        report["slowest_worker_batches"] = {name: sorted({b for r in by[name] for b in r["slowest_batches"]}) for name in runs}
        report["samples_per_s"] = {name: spread([r["samples_per_s"] for r in by[name]]) for name in runs}
    if args.throughput_batch:
        tp_args = ["--profile", "hl8", "--model", "cnn-bn", "--global-batch", str(args.throughput_batch),
                   "--epochs", str(args.throughput_epochs), "--adjust-every", "4", *budget]
        pairs = []
        for i in range(args.throughput_repeats):  # alternated, so that a load change hits both alike
            variable = one_run(workdir, f"tp-variable-{i}", "dynamic", [], tp_args)
            micro_run = one_run(workdir, f"tp-micro-{i}", "dynamic", ["--micro-batch", str(args.throughput_micro_batch)], tp_args)
            pairs.append({"variable": variable, "micro": micro_run,
                          "micro_over_variable": round(micro_run["steady_samples_per_s"] / variable["steady_samples_per_s"], 3)})
        ratio = statistics.median(p["micro_over_variable"] for p in pairs)
        report["throughput"] = {"micro_batch": args.throughput_micro_batch, "runs": pairs,
                                "micro_over_variable_median": ratio, "target": ">= 0.9", "met": ratio >= 0.9}
    json.dump(report, sys.stdout, indent=1)
    print()
    save_result(args, "micro_batches", report, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
