"""Device benchmark: one GPU worker beside CPU workers (`ps-worker --device`), real processes on loopback.

A GPU and a few CPU cores are the most heterogeneous cluster there is. Each scenario runs one job
(the hetero benchmark's CNN on synthetic 32×32 images, with more data and B = 4096, BSP) to its end:

* ``cpu``: one CPU worker (``--cpu-threads`` threads), the per-CPU-worker baseline;
* ``gpu``: one GPU worker, PS path; ``gpu_allreduce``: the same with ``--allreduce`` (NCCL, world size 1);
* ``mixed_uniform`` / ``mixed_dynamic``: the GPU worker and ``--cpu-workers`` CPU workers, equal
  batches against the deadband controller; ``mixed_dynamic_allreduce``: the controller on the fast
  path (a mixed group runs gloo: NCCL needs a GPU on every rank).

``ideal`` = the GPU worker's solo rate + cpu-workers × the CPU worker's solo rate. Measured in the same
run, one scenario at a time. Progress on stderr; ``--json`` prints the JSON, then a table, on stdout.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import analysis
from benchmarks.report_output import add_result_options, print_report, save_result
from benchmarks.workload import Workload
from common.ops.arg_types import positive_float, positive_int
from ps.ops.metrics import read_metrics

SCENARIOS = ("cpu", "gpu", "gpu_allreduce", "mixed_uniform", "mixed_dynamic", "mixed_dynamic_allreduce")


def log(message: str) -> None:
    print(f"[devices] {message}", file=sys.stderr, flush=True)


def plan(name: str, cpu_workers: int) -> tuple[list[str], list[str]]:
    """A scenario's extra server flags and its workers' devices ("gpu" or "cpu")."""
    devices = {"cpu": ["cpu"], "gpu": ["gpu"], "gpu_allreduce": ["gpu"]}.get(name, ["gpu"] + ["cpu"] * cpu_workers)
    controller = "dynamic" if "dynamic" in name else "uniform"
    # the PS-path scenarios pin it: --allreduce auto would take the fast path for a GPU worker alone
    flags = ["--controller", controller, "--allreduce", "on" if name.endswith("allreduce") else "off"]
    return flags, devices


def run_scenario(name: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Run one job to its end; its record (steady samples/s over the last half of the epochs)."""
    flags, devices = plan(name, args.cpu_workers)
    run_dir = workdir / name
    run_dir.mkdir()
    metrics = run_dir / "metrics.jsonl"
    w = Workload(dataset_args=(f"size={args.dataset_size}",), global_batch=args.global_batch)
    server = [sys.executable, "-m", "ps.server", "--port", "0", "--port-file", str(run_dir / "port"), "--quiet",
              "--metrics-log", str(metrics), *w.cli_args(), "--mode", "bsp", "--workers", str(len(devices)),
              "--global-batch", str(w.global_batch), "--lr", str(w.lr), "--momentum", str(w.momentum),
              "--epochs", str(args.epochs), "--evict-after", "120", *flags]
    procs: list[subprocess.Popen] = []
    started = time.monotonic()
    log(f"{name}: {len(devices)} worker(s) on {','.join(devices)} {' '.join(flags)}")
    try:
        procs.append(subprocess.Popen(server, stdout=open(run_dir / "server.log", "w"), stderr=subprocess.STDOUT))  # noqa: SIM115
        port_file = run_dir / "port"
        while not (port_file.exists() and port_file.read_text().strip()):
            if procs[0].poll() is not None or time.monotonic() - started > 60:
                raise RuntimeError(f"{name}: ps-server did not start:\n{(run_dir / 'server.log').read_text()[-1500:]}")
            time.sleep(0.1)
        target = f"127.0.0.1:{port_file.read_text().strip()}"
        for i, device in enumerate(devices):
            threads = args.gpu_threads if device == "gpu" else args.cpu_threads
            argv = [sys.executable, "-m", "worker.cli", "--server", target, "--name", f"{device}{i}", "--quiet",
                    "--device", args.gpu_device if device == "gpu" else "cpu", "--threads", str(threads)]
            procs.append(subprocess.Popen(argv, stdout=open(run_dir / f"{device}{i}.log", "w"), stderr=subprocess.STDOUT))  # noqa: SIM115
        code = procs[0].wait(timeout=args.timeout)
        if code != 0:
            raise RuntimeError(f"{name}: ps-server exited with {code}:\n{(run_dir / 'server.log').read_text()[-1500:]}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    events = read_metrics(metrics)
    epochs = analysis.of_kind(events, "epoch")
    rate, counted = analysis.steady_throughput(epochs, 0.5)
    (summary,) = analysis.of_kind(events, "summary")
    regroups = analysis.of_kind(events, "regroup")
    last = epochs[-1] if epochs else {}
    record = {
        "scenario": name,
        "devices": devices,
        "samples_per_s": None if rate is None else round(rate, 2),
        "steady_epochs": counted,
        "samples_per_s_overall": summary.get("samples_per_s"),
        "batch_sizes": last.get("batch_sizes"),
        "compute_ms": {k: round(v, 1) for k, v in (last.get("compute_ms") or {}).items()},
        "compute_spread": None if (sp := analysis.spread(last.get("compute_ms"))) is None else round(sp, 3),
        "adjustments": summary.get("adjustments"),
        "backend": regroups[-1]["backend"] if regroups else None,
        "accuracy": summary.get("accuracy"),
        "wall_s": round(time.monotonic() - started, 2),
    }
    log(f"{name}: {record['samples_per_s']} samples/s steady, batches {record['batch_sizes']}")
    return record


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if not a or not b else round(a / b, 3)


def report(records: dict[str, dict], cpu_workers: int) -> dict[str, Any]:
    rate = {name: r["samples_per_s"] for name, r in records.items()}
    ideal = None
    if rate.get("gpu") and rate.get("cpu"):
        ideal = rate["gpu"] + cpu_workers * rate["cpu"]
    ratios = {
        "gpu_allreduce_to_gpu": _ratio(rate.get("gpu_allreduce"), rate.get("gpu")),
        "gpu_to_cpu": _ratio(rate.get("gpu"), rate.get("cpu")),
        "mixed_dynamic_to_uniform": _ratio(rate.get("mixed_dynamic"), rate.get("mixed_uniform")),
        "mixed_dynamic_to_ideal": _ratio(rate.get("mixed_dynamic"), ideal),
        "mixed_dynamic_allreduce_to_mixed_dynamic": _ratio(rate.get("mixed_dynamic_allreduce"), rate.get("mixed_dynamic")),
    }
    targets = []
    if "gpu_allreduce" in rate and "gpu" in rate:
        targets.append(analysis.target("one GPU worker, --allreduce (NCCL) over the PS path, steady samples/s",
                                       ratios["gpu_allreduce_to_gpu"], ">=", 1.0, "devices"))
    return {"ideal_samples_per_s": ideal, "ratios": {k: v for k, v in ratios.items() if v is not None},
            "targets": targets, "scenarios": list(records.values())}


def table(result: dict[str, Any]) -> str:
    rows = ["| scenario | devices | samples/s (steady) | overall | batch sizes | compute spread | backend |",
            "|---|---|---|---|---|---|---|"]
    for r in result["scenarios"]:
        batches = " ".join(f"{k}={v}" for k, v in (r["batch_sizes"] or {}).items())
        rows.append(f"| {r['scenario']} | {','.join(r['devices'])} | {r['samples_per_s']} | {r['samples_per_s_overall']} | "
                    f"{batches} | {r['compute_spread']} | {r['backend'] or '-'} |")
    rows.append(f"\nideal {result['ideal_samples_per_s']}; ratios {json.dumps(result['ratios'])}")
    return "\n".join(rows)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.devices", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, from: " + ", ".join(SCENARIOS))
    p.add_argument("--epochs", type=positive_int, default=4, help="epochs per job (steady rate: the last half)")
    p.add_argument("--dataset-size", type=positive_int, default=16384, help="synthetic training samples (an epoch)")
    p.add_argument("--global-batch", type=positive_int, default=4096,
                   help="B: large enough that a GPU step is not all overhead, and that CPU workers get more than --min-batch")
    p.add_argument("--cpu-workers", type=positive_int, default=3, help="CPU workers beside the GPU worker in the mixed runs")
    p.add_argument("--cpu-threads", type=positive_int, default=4, help="torch threads per CPU worker")
    p.add_argument("--gpu-threads", type=positive_int, default=1, help="torch threads of the GPU worker")
    p.add_argument("--gpu-device", default="cuda", help="the fast worker's --device (cpu: a smoke test without a GPU)")
    p.add_argument("--timeout", type=positive_float, default=600.0, help="seconds per job before giving up")
    p.add_argument("--json", action="store_true", help="print the JSON before the table")
    add_result_options(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown or not names:
        print(f"devices: error: unknown scenario(s) {unknown or names}; choose from {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    from worker.device import resolve_device

    try:
        resolve_device(args.gpu_device)
    except ValueError as exc:
        print(f"devices: error: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ps-devices-") as tmp:
        records = {name: run_scenario(name, args, Path(tmp)) for name in names}
    result = report(records, args.cpu_workers)
    print_report(json.dumps(result, indent=2), table(result), args.json)
    save_result(args, "devices", result, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
