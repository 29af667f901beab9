"""ASP beside BSP on a small heterogeneous case, over several seeds: does ASP train as well at its defaults?

``python -m benchmarks.asp`` runs, for each seed, the same job in BSP and in ASP (digits, MLP, four
workers slowed 1, 1, 2, 4, global batch 128, 8 epochs, ``--controller dynamic``, every other flag at
its default) and prints a JSON report: each run's final test accuracy and wall time, and per mode
the mean, the smallest and the largest accuracy, plus ASP's largest update staleness. ``--asp-arg``
adds a ps-server flag to the ASP runs only (e.g. ``--asp-arg=--staleness-bound=2``), to compare
variants at the same seeds.

``--hl8`` measures instead what ``ps-cluster run --profile hl8`` does in each mode (cgroup quotas in
each mode's HL8 shares, the emulator's default workload): BSP, ASP, and ASP with
``--staleness-bound 2``, one after another. It prints each run's accuracy, samples/s and largest
staleness (in versions, and in clocks under the bound), and the time each took to reach the
accuracy BSP ended at.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.report_output import add_result_options, save_result
from common.ops.arg_types import positive_int
from deploy.launcher import LocalCluster, WorkerSpec
from ps.ops.metrics import read_metrics

SLOWDOWNS = (1.0, 1.0, 2.0, 4.0)
JOB = ["--model", "mlp", "--dataset", "digits", "--workers", "4", "--global-batch", "128", "--controller", "dynamic"]


def run_job(mode: str, seed: int, epochs: int, extra: Sequence[str], workdir: Path, timeout: float) -> dict[str, Any]:
    """One job: its accuracy, wall seconds and (ASP) the largest staleness any update had."""
    workers = [WorkerSpec(f"w{i}", 1.0 / slowdown) for i, slowdown in enumerate(SLOWDOWNS)]
    argv = [*JOB, "--mode", mode, "--epochs", str(epochs), "--seed", str(seed), *extra]
    started = time.monotonic()
    with LocalCluster(argv, workers, workdir, limiter="slowdown", run_id=f"asp-bench-{mode}-{seed}") as cluster:
        cluster.start()
        code = cluster.wait(timeout)
        if code != 0:
            raise RuntimeError(f"{mode} seed {seed}: the server exited with {code}; see {workdir}/server.log")
        (summary,) = cluster.events("summary")
        epochs_seen = cluster.events("epoch")
    result: dict[str, Any] = {"seed": seed, "accuracy": summary["accuracy"], "seconds": round(time.monotonic() - started, 1)}
    if mode == "asp":
        result["staleness_max"] = max((max(e.get("staleness_max", {}).values(), default=0) for e in epochs_seen), default=0)
        result["ssp_waits"] = sum(sum(e.get("ssp_waits", {}).values()) for e in epochs_seen)
    return result


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean, smallest and largest accuracy of `runs`."""
    accuracies = [r["accuracy"] for r in runs]
    return {
        "mean": round(statistics.fmean(accuracies), 4),
        "min": round(min(accuracies), 4),
        "max": round(max(accuracies), 4),
        "runs": runs,
    }


HL8_RUNS = {"bsp": ["--mode", "bsp"], "asp": ["--mode", "asp"],
            "asp_ssp2": ["--mode", "asp", "--server-arg=--staleness-bound=2"]}
"""The --hl8 runs: ps-cluster run flags after --profile hl8."""


def run_hl8(name: str, flags: Sequence[str], out: Path, timeout: float) -> dict[str, Any]:
    """One `ps-cluster run --profile hl8` run: its summary figures and every evaluation."""
    argv = [sys.executable, "-m", "deploy.cli", "run", "--profile", "hl8", *flags, "--out", str(out)]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout)
    events = read_metrics(out / "metrics.jsonl")
    (summary,) = [e for e in events if e.get("event") == "summary"]
    epochs = [e for e in events if e.get("event") == "epoch"]
    record: dict[str, Any] = {
        "accuracy": summary["accuracy"],
        "samples_per_s": summary["samples_per_s"],
        "wall_s": summary["wall_s"],
        "evals": [(e["wall_s"], e["accuracy"]) for e in events if e.get("event") == "eval"],
    }
    if name != "bsp":
        for key in ("staleness_max", "clock_staleness_max", "ssp_waits"):
            record[key] = max((max(e.get(key, {}).values(), default=0) for e in epochs), default=0)
    return record


def time_to(evals: list[tuple[float, float]], accuracy: float) -> float | None:
    """The training time of the first evaluation at `accuracy` or more (None: never)."""
    return next((round(t, 2) for t, a in evals if a >= accuracy), None)


def bench_hl8(tmp: Path, timeout: float) -> dict[str, Any]:
    runs = {}
    for name, flags in HL8_RUNS.items():
        runs[name] = run_hl8(name, flags, tmp / name, timeout)
        print(f"hl8 {name}: accuracy {runs[name]['accuracy']}", file=sys.stderr, flush=True)
    goal = runs["bsp"]["accuracy"]
    for record in runs.values():
        record["time_to_bsp_accuracy_s"] = time_to(record.pop("evals"), goal)
    plain, ssp = runs["asp"], runs["asp_ssp2"]
    return {
        "command": "ps-cluster run --profile hl8 --mode {bsp,asp} [--server-arg=--staleness-bound=2]",
        "bsp_accuracy": goal,
        "runs": runs,
        "ssp_over_asp": {
            "accuracy_diff": round(ssp["accuracy"] - plain["accuracy"], 4),
            "throughput_ratio": round(ssp["samples_per_s"] / plain["samples_per_s"], 3),
            "max_clock_staleness": ssp["clock_staleness_max"],
        },
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.asp", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=positive_int, default=5, help="seeds 0..N-1 (default: 5)")
    p.add_argument("--epochs", type=positive_int, default=8, help="epochs per job (default: 8)")
    p.add_argument("--modes", default="bsp,asp", help="comma-separated modes to run (default: bsp,asp)")
    p.add_argument("--asp-arg", action="append", default=[], metavar="ARG", help="extra ps-server flag for the ASP runs")
    p.add_argument("--hl8", action="store_true", help="HL8 in the cgroup emulator instead: BSP, ASP, ASP --staleness-bound 2")
    p.add_argument("--run-timeout", type=float, default=600.0, help="seconds per job before giving up")
    add_result_options(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in ("bsp", "asp") for m in modes):
        build_parser().error(f"--modes takes bsp and/or asp, got {args.modes!r}")
    if args.hl8:
        with tempfile.TemporaryDirectory(prefix="asp-hl8-") as tmp:
            hl8 = bench_hl8(Path(tmp), args.run_timeout)
        print(json.dumps(hl8))
        save_result(args, "asp", hl8, argv)
        return 0
    report: dict[str, Any] = {
        "case": {"job": " ".join(JOB), "slowdowns": list(SLOWDOWNS), "epochs": args.epochs, "asp_args": args.asp_arg},
    }
    with tempfile.TemporaryDirectory(prefix="asp-bench-") as tmp:
        for mode in modes:
            runs = []
            for seed in range(args.seeds):
                workdir = Path(tmp) / f"{mode}-{seed}"
                workdir.mkdir()
                extra = args.asp_arg if mode == "asp" else []
                runs.append(run_job(mode, seed, args.epochs, extra, workdir, args.run_timeout))
                print(f"{mode} seed {seed}: {runs[-1]}", file=sys.stderr, flush=True)
            report[mode] = summarize(runs)
    if "bsp" in report and "asp" in report:
        report["asp_minus_bsp"] = round(report["asp"]["mean"] - report["bsp"]["mean"], 4)
    print(json.dumps(report))
    save_result(args, "asp", report, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
