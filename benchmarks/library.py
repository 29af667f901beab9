"""The README's custom training loop against ``ps-worker``, on the same job.

``python -m benchmarks.library --json`` runs the README's quick-start job (``ps-server --workers 4
--model mlp --model-arg hidden=512 --dataset digits --global-batch 256 --controller dynamic``, fewer
epochs) once per variant and round, each time with its workers as:

* ``ps_worker``: ``ps-worker`` processes, the baseline;
* ``library``: the README's example (the python block of "Your own training loop") run as written,
  with only the server's address and a distinct name per worker put in;
* ``library_torch_threads`` (with ``--torch-threads-baseline``): the same example with
  ``threads=None``, torch's own thread count: what the library's default saves.

Every worker runs in its own process with the environment a user has (no ``OMP_NUM_THREADS``).
Reported per variant: the median over ``--rounds`` of the steady samples/s (the server's epoch
records, the last half of the epochs) and of the whole job's, and ``ratio_to_ps_worker``; the
target is ``library`` within 20% of ``ps_worker`` (ratio >= 0.8). The variants alternate within a
round, so a slow spell of the machine moves both sides. JSON (``--json``) then a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.analysis import markdown_table, of_kind, steady_throughput, target
from benchmarks.report_output import add_result_options, print_report, save_result
from common.ops.arg_types import positive_int
from ps.ops.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_TARGET = '"127.0.0.1:50051"'
README_NAME = 'name="mine"'
VARIANTS = ("ps_worker", "library", "library_torch_threads")
ENV = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")} | {"PYTHONUNBUFFERED": "1"}


def readme_loop(readme: Path = README) -> str:
    """The python block of the README's "Your own training loop" section, as written."""
    text = readme.read_text(encoding="utf-8")
    section = text[text.index("## Your own training loop"):]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    if match is None:
        raise ValueError("README.md: no python block under 'Your own training loop'")
    code = match.group(1)
    for needed in (README_TARGET, README_NAME):
        if needed not in code:
            raise ValueError(f"README.md's custom loop no longer has {needed}: update benchmarks/library.py")
    return code


def worker_code(loop: str, target: str, name: str, torch_threads: bool) -> str:
    """The README's loop for one worker: the server's address and a name of its own put in."""
    code = loop.replace(README_TARGET, json.dumps(target)).replace(README_NAME, f"name={json.dumps(name)}")
    if torch_threads:
        code = code.replace(f"name={json.dumps(name)}", f"name={json.dumps(name)}, threads=None")
    return code


def guarded(argv: Sequence[str]) -> list[str]:
    """`argv` run so that it dies with this process (benchmarks/guard.py)."""
    return [sys.executable, "-m", "benchmarks.guard", str(os.getpid()), sys.executable, *argv]


def run_job(variant: str, args: argparse.Namespace, loop: str, workdir: Path) -> dict[str, Any]:
    """One job to its end with `variant`'s workers; its throughput from the server's metrics log."""
    workdir.mkdir(parents=True)
    port_file, metrics = workdir / "port", workdir / "metrics.jsonl"
    job = ["--workers", str(args.workers), "--model", "mlp", "--model-arg", "hidden=512", "--dataset", "digits",
           "--global-batch", "256", "--epochs", str(args.epochs), "--controller", "dynamic", "--adjust-every", "5"]
    with open(workdir / "server.log", "w", encoding="utf-8") as log:
        server = subprocess.Popen(guarded(["-m", "ps.server", "--port", "0", "--port-file", str(port_file),
                                           "--metrics-log", str(metrics), "--quiet", *job]),
                                  stdout=log, stderr=subprocess.STDOUT, env=ENV)
    workers: list[subprocess.Popen] = []
    try:
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start: {(workdir / 'server.log').read_text()[-500:]}")
            time.sleep(0.05)
        target_address = f"127.0.0.1:{port_file.read_text().strip()}"
        for k in range(args.workers):
            name = f"w{k}"
            if variant == "ps_worker":
                argv = ["-m", "worker.cli", "--server", target_address, "--name", name, "--quiet"]
            else:
                argv = ["-c", worker_code(loop, target_address, name, variant == "library_torch_threads")]
            with open(workdir / f"{name}.log", "w", encoding="utf-8") as log:
                workers.append(subprocess.Popen(guarded(argv), stdout=log, stderr=subprocess.STDOUT, env=ENV))
        code = server.wait(timeout=args.timeout)
        failed = [w.wait(timeout=30) for w in workers]
        if code != 0 or any(failed):
            raise RuntimeError(f"{variant}: server exit {code}, workers {failed}; see {workdir}")
    finally:
        for proc in [*workers, server]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    events = read_metrics(metrics)
    steady, _ = steady_throughput(of_kind(events, "epoch"))
    (summary,) = of_kind(events, "summary")
    return {"steady_samples_per_s": steady, "samples_per_s": summary["samples_per_s"], "accuracy": summary["accuracy"]}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    loop = readme_loop()
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in args.variants}
    with tempfile.TemporaryDirectory(prefix="ps-library-bench-") as tmp:
        for r in range(args.rounds):
            order = args.variants if r % 2 == 0 else list(reversed(args.variants))
            for variant in order:
                result = run_job(variant, args, loop, Path(tmp) / f"{variant}-{r}")
                print(f"[library] round {r} {variant}: {result}", file=sys.stderr, flush=True)
                runs[variant].append(result)
    rows: dict[str, dict[str, Any]] = {}
    for variant, results in runs.items():
        rows[variant] = {
            "steady_samples_per_s": round(statistics.median(x["steady_samples_per_s"] for x in results), 1),
            "samples_per_s": round(statistics.median(x["samples_per_s"] for x in results), 1),
            "accuracy": round(statistics.median(x["accuracy"] for x in results), 4),
            "rounds": [round(x["steady_samples_per_s"], 1) for x in results],
        }
    base = rows.get("ps_worker", {}).get("steady_samples_per_s")
    for row in rows.values():
        row["ratio_to_ps_worker"] = round(row["steady_samples_per_s"] / base, 3) if base else None
    ratio = rows.get("library", {}).get("ratio_to_ps_worker")
    return {
        "benchmark": "library",
        "job": {"workers": args.workers, "model": "mlp hidden=512", "dataset": "digits", "global_batch": 256,
                "epochs": args.epochs, "controller": "dynamic"},
        "machine": {"cpus": os.cpu_count(), "platform": sys.platform},
        "date": time.strftime("%Y-%m-%d"),
        "rounds": args.rounds,
        "variants": rows,
        "targets": [target("README custom loop vs ps-worker, steady samples/s", ratio, ">=", 0.8, "library")],
    }


def table(report: dict[str, Any]) -> str:
    rows = [[v, r["steady_samples_per_s"], r["samples_per_s"], r["ratio_to_ps_worker"], r["accuracy"]]
            for v, r in report["variants"].items()]
    return markdown_table(["workers", "samples/s (steady)", "samples/s (job)", "vs ps-worker", "accuracy"], rows)


def build_parser() -> argparse.ArgumentParser:
    """`python -m benchmarks.library`'s command line."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.library", description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=positive_int, default=4, help="workers in the job")
    p.add_argument("--epochs", type=positive_int, default=6, help="epochs of the job (the quick start's 12 halved)")
    p.add_argument("--rounds", type=positive_int, default=2, help="runs of each variant, alternating")
    p.add_argument("--timeout", type=positive_int, default=600, help="seconds one job may take")
    p.add_argument("--torch-threads-baseline", action="store_true",
                   help="also run the loop with threads=None (torch's default thread count)")
    p.add_argument("--json", action="store_true", help="print the JSON report before the table")
    add_result_options(p)
    return p


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    args.variants = [v for v in VARIANTS if v != "library_torch_threads" or args.torch_threads_baseline]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = measure(args)
    print_report(json.dumps(report, indent=2), table(report), args.json)
    save_result(args, "library", report, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
