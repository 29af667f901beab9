"""A round's CPU per worker and per part on the PS path, against DDP's per step for the same model and batch.

``python -m benchmarks.round_cpu --json`` runs, for each case (the HL8 benchmark's CNN, ~0.55M
parameters, and an MLP ~10x larger), a BSP job on loopback: one real ``ps-server`` and ``--workers``
real ``ps-worker`` processes at a fixed batch each (``--policy uniform``), the workers recording where
their CPU goes (worker/probes/cpu_parts.py, turned on by $PS_CPU_PARTS). Each worker's CPU time per round,
over ``--rounds`` rounds after ``--warmup``, is split into

- ``data``: drawing the batch; ``compute``: forward and backward (the main thread, less the
  backward hooks' work);
- ``push``: encoding and sending the push (``push_copy``: backward's hooks, the small gradients
  copied into the flat buffer and each bucket handed on; ``push_check``: step()'s check that none changed after its bucket went out;
  ``push_send``: framing, chunking, dtype conversion and gRPC's send, on the thread gRPC iterates
  the push on);
- ``receive``: receiving and parsing the reply and checking its values;
- ``copy``: its values decoded into the flat parameters the model's parameters are views of;
- ``rest``: the process's CPU time (all threads) less those parts: the session's own work in step()
  (``step``), gRPC's threads and the heartbeat (``rest_detail``: per thread kind, its CPU less the
  parts counted on it, ``native:...`` being gRPC's C threads; ``other``: what no thread accounts for).

Baseline, measured in the same run: PyTorch DDP (gloo, benchmarks/ddp_baseline.py) with as many
ranks, the same model and the same batch per rank. Its CPU per step is the process's CPU time (gloo's
threads included); ``comm`` is that less forward and backward of the same model without DDP, timed
in the same process on the same batches (DDP's all-reduce, its hooks and the optimizer step; a PS
worker steps no optimizer). Figures: ``ratio`` = PS-path process CPU per round / DDP's per step (the
target: <= 1.2), and ``comm_ratio`` = (PS-path CPU less data and compute) / DDP's ``comm``. CPU time, not wall
time, is the measure, so a busy machine slows the run without moving the figures much.

With ``--fast-path`` each case also runs on the collective fast path (``--allreduce on``, gloo), the
same parts recorded: its all-reduce, optimizer step and report to the server fall in ``rest``; its
``ratio`` is its process CPU per round over DDP's per step.

Progress goes to stderr; stdout gets the JSON report (with ``--json``) and a markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.cli_types import choices, parse_resolved
from benchmarks.ddp_baseline import run_ddp
from benchmarks.report_output import add_result_options, publish
from benchmarks.transport.processes import Processes, wait_port_file
from benchmarks.workload import Workload
from common.ops.arg_types import positive_float, positive_int

RATIO_TARGET = 1.2
PARTS = ("data", "compute", "push", "receive", "copy", "rest")
PUSH_PARTS = ("push_copy", "push_check", "push_send")
CHILD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
GRPC_PYTHON_THREADS = "grpc_python"  # gRPC's own Python threads (its channel's event thread, a push's request thread)


@dataclass(frozen=True)
class Case:
    name: str
    workload: Workload


CASES = {
    # benchmarks.hetero's default workload: cnn (width 32) on 32x32 synthetic images, ~0.55M parameters
    "cnn": Case("cnn", Workload()),
    # ~5.6M parameters: 3072 -> 1280 -> 1280 -> 10, on the same images
    "mlp_wide": Case("mlp_wide", Workload(model="mlp", model_args=("hidden=1280",))),
    # the smoke test's: a few thousand parameters on 8x8 images
    "tiny": Case("tiny", Workload(model="cnn", model_args=("width=4",), dataset_args=("size=256", "image_size=8"))),
}


def log(message: str) -> None:
    print(f"[round_cpu] {message}", file=sys.stderr, flush=True)


def describe(workload: Workload) -> tuple[int, int]:
    """The model's parameter count and the data set's training samples."""
    from benchmarks.workload import build

    model, dataset = build(argparse.Namespace(model=workload.model, model_arg=list(workload.model_args),
                                              dataset=workload.dataset, dataset_arg=list(workload.dataset_args),
                                              seed=workload.seed))
    return sum(p.numel() for p in model.parameters()), len(dataset.train)


def ps_run(case: Case, args: argparse.Namespace, train_samples: int, workdir: Path,
           server_args: Sequence[str] = ("--allreduce", "off")) -> list[dict[str, Any]]:
    """The BSP job (on the PS path, unless `server_args` say --allreduce on); each worker's cpu_parts record."""
    w, k = case.workload, args.workers
    global_batch = k * args.batch
    rounds_per_epoch = max(1, train_samples // global_batch)
    epochs = math.ceil((args.warmup + args.rounds + 3) / rounds_per_epoch)
    workdir.mkdir(parents=True, exist_ok=True)
    procs = Processes(workdir)
    try:
        port_file = workdir / "server.port"
        server = procs.start("server", [sys.executable, "-m", "ps.server", *w.cli_args(), "--mode", "bsp",
                                        "--workers", str(k), "--global-batch", str(global_batch), "--policy", "uniform",
                                        "--lr", str(w.lr), "--momentum", str(w.momentum), "--epochs", str(epochs),
                                        "--evict-after", "600", "--quiet", "--port", "0", "--port-file", str(port_file),
                                        *server_args],
                             env=CHILD_ENV)
        target = f"127.0.0.1:{wait_port_file(server, port_file, 'ps-server')}"
        window = f"{args.warmup}:{args.warmup + args.rounds}"
        files = [workdir / f"w{i}.cpu.json" for i in range(k)]
        workers = [procs.start(f"w{i}", [sys.executable, "-m", "worker.cli", "--server", target, "--name", f"w{i}",
                                         "--quiet", "--max-batch", str(args.batch * 4)],
                               env={**CHILD_ENV, "PS_CPU_PARTS": str(path), "PS_CPU_PARTS_STEPS": window})
                   for i, path in enumerate(files)]
        procs.wait_all(workers, args.timeout, f"{case.name}: ps-worker")
        records = []
        for proc, path in zip(workers, files, strict=True):
            record = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {"snapshots": []}
            if len(record["snapshots"]) != 2:
                raise RuntimeError(f"{case.name}: a worker took {len(record['snapshots'])} of the window's 2 "
                                   f"snapshots (steps {window}):\n{procs.log_tail(proc)}")
            records.append(record)
        return records
    finally:
        procs.stop_all()


def ps_parts(record: dict[str, Any], rounds: int) -> dict[str, Any]:
    """One worker's CPU ms per round, by part, from its two snapshots."""
    first, last = record["snapshots"]
    per_round = lambda seconds: round(1e3 * seconds / rounds, 3)  # noqa: E731
    parts: dict[str, float] = {}
    on_thread: dict[str, float] = {}  # thread -> CPU counted to some part on it
    for part in set(first["parts"]) | set(last["parts"]):
        before, after = first["parts"].get(part, {}), last["parts"].get(part, {})
        for tid in set(before) | set(after):
            spent = after.get(tid, 0.0) - before.get(tid, 0.0)
            parts[part] = parts.get(part, 0.0) + spent
            on_thread[tid] = on_thread.get(tid, 0.0) + spent
    process = last["process_s"] - first["process_s"]
    push = sum(parts.get(p, 0.0) for p in PUSH_PARTS)
    named = parts.get("data", 0.0) + parts.get("compute", 0.0) + push + parts.get("receive", 0.0) + parts.get("copy", 0.0)
    rest = process - named
    # the rest by thread: each thread alive at the last snapshot, its CPU less the parts counted on it
    by_kind: dict[str, float] = {"step": parts.get("step", 0.0)}
    for tid, after in last["threads"].items():
        kind = GRPC_PYTHON_THREADS if last["kinds"][tid] == "_run" else last["kinds"][tid]
        by_kind[kind] = by_kind.get(kind, 0.0) + after - first["threads"].get(tid, 0.0) - on_thread.get(tid, 0.0)
    detail = {kind: per_round(s) for kind, s in sorted(by_kind.items()) if abs(per_round(s)) >= 0.005}
    detail["other"] = per_round(rest - sum(by_kind.values()))
    return {
        "process": per_round(process), **{p: per_round(parts.get(p, 0.0)) for p in ("data", "compute")},
        "push": per_round(push), **{p: per_round(parts.get(p, 0.0)) for p in PUSH_PARTS},
        "receive": per_round(parts.get("receive", 0.0)), "copy": per_round(parts.get("copy", 0.0)),
        "rest": per_round(rest), "rest_detail": detail,
    }


def ddp_run(case: Case, args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    """DDP with as many ranks and the same batch per rank; each rank's CPU record (ms per step)."""
    cpu_dir = workdir / "ddp-cpu"
    cpu_dir.mkdir(parents=True, exist_ok=True)
    k = args.workers
    run_ddp(case.workload, args.batch, [None] * k, [1.0] * k, warmup=args.warmup, steps=args.rounds,
            workdir=workdir / "ddp", timeout_s=args.timeout, cpu_out=cpu_dir)
    ranks = []
    for rank in range(k):
        r = json.loads((cpu_dir / f"rank{rank}.json").read_text(encoding="utf-8"))
        r["comm_cpu_ms"] = round(r["process_cpu_ms"] - r["solo_fwd_bwd_cpu_ms"], 3)
        ranks.append(r)
    return ranks


def mean(rows: Sequence[dict[str, Any]], key: str) -> float:
    return round(sum(r[key] for r in rows) / len(rows), 3)


def check_batches(args: argparse.Namespace) -> None:
    """Each case's model and training set as `args.described`; ValueError, before any process starts,
    where a round's B = --workers x --batch exceeds a case's training samples (ps-server refuses it)."""
    args.described = {name: describe(CASES[name].workload) for name in args.cases}
    for name, (_, samples) in args.described.items():
        if args.workers * args.batch > samples:
            fits = (f"use --batch {samples // args.workers} or less" if samples >= args.workers
                    else f"use --workers {samples} or fewer")
            raise ValueError(f"--workers {args.workers} x --batch {args.batch} = {args.workers * args.batch} exceeds "
                             f"case {name}'s {samples} training samples (ps-server refuses a global batch above "
                             f"them): {fits}, or leave {name} out of --cases")


def measure(case: Case, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    params, train_samples = args.described[case.name]
    log(f"{case.name}: {params:,} parameters; PS path, {args.workers} workers at batch {args.batch}")
    ps = [ps_parts(r, args.rounds) for r in ps_run(case, args, train_samples, workdir / f"{case.name}-ps")]
    log(f"{case.name}: DDP (gloo), {args.workers} ranks")
    ddp = ddp_run(case, args, workdir / f"{case.name}-ddp")
    ps_mean = {key: mean(ps, key) for key in ("process", *PARTS, *PUSH_PARTS)}
    fast = None
    if args.fast_path:
        log(f"{case.name}: the collective fast path (--allreduce on, gloo), {args.workers} workers")
        fast = [ps_parts(r, args.rounds) for r in ps_run(case, args, train_samples, workdir / f"{case.name}-allreduce",
                                                          ("--allreduce", "on"))]
    ddp_mean = {key: mean(ddp, key) for key in ("process_cpu_ms", "fwd_bwd_cpu_ms", "optimizer_cpu_ms",
                                                "solo_fwd_bwd_cpu_ms", "comm_cpu_ms")}
    ps_comm = ps_mean["process"] - ps_mean["data"] - ps_mean["compute"]
    ratio = round(ps_mean["process"] / ddp_mean["process_cpu_ms"], 3) if ddp_mean["process_cpu_ms"] > 0 else None
    comm_ratio = round(ps_comm / ddp_mean["comm_cpu_ms"], 3) if ddp_mean["comm_cpu_ms"] > 0 else None
    beyond_compute = {p: ps_mean[p] for p in PARTS if p not in ("data", "compute")}
    row = {
        "case": case.name, "workload": case.workload.describe(), "params": params, "workers": args.workers,
        "batch_per_worker": args.batch, "rounds": args.rounds, "warmup": args.warmup,
        "ps": {"per_worker": ps, "mean": ps_mean, "beyond_compute": round(ps_comm, 3),
               "dominant_beyond_compute": max(beyond_compute, key=beyond_compute.__getitem__)},
        "ddp": {"per_rank": ddp, "mean": ddp_mean},
        "ratio": ratio, "comm_ratio": comm_ratio,
        "meets_target": None if ratio is None else ratio <= RATIO_TARGET,
    }
    if fast is not None:  # the same parts; its all-reduce, optimizer step and report are in `rest`
        fast_mean = {key: mean(fast, key) for key in ("process", "data", "compute", "rest")}
        row["fast_path"] = {"per_worker": fast, "mean": fast_mean,
                            "ratio": round(fast_mean["process"] / ddp_mean["process_cpu_ms"], 3)
                            if ddp_mean["process_cpu_ms"] > 0 else None}
    log(f"{case.name}: PS {ps_mean['process']:.1f} ms CPU a round (data and compute {ps_mean['data'] + ps_mean['compute']:.1f}), "
        f"DDP {ddp_mean['process_cpu_ms']:.1f} a step (compute {ddp_mean['solo_fwd_bwd_cpu_ms']:.1f}): "
        f"ratio {ratio}, beyond compute {comm_ratio}")
    return row


def markdown(report: dict[str, Any]) -> str:
    lines = ["| case | params | PS CPU/round | data + compute | push (copy + check + send) | receive | copy "
             "| rest (step) | DDP CPU/step | DDP compute | DDP comm | ratio | beyond-compute ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["cases"]:
        p, d = r["ps"]["mean"], r["ddp"]["mean"]
        step = sum(w["rest_detail"]["step"] for w in r["ps"]["per_worker"]) / len(r["ps"]["per_worker"])
        lines.append(f"| {r['case']} | {r['params']:,} | {p['process']:.1f} | {p['data'] + p['compute']:.1f} "
                     f"| {p['push']:.1f} ({p['push_copy']:.1f} + {p['push_check']:.1f} + {p['push_send']:.1f}) "
                     f"| {p['receive']:.1f} | {p['copy']:.1f} | {p['rest']:.1f} ({step:.1f}) | {d['process_cpu_ms']:.1f} "
                     f"| {d['solo_fwd_bwd_cpu_ms']:.1f} | {d['comm_cpu_ms']:.1f} | {r['ratio']} | {r['comm_ratio']} |")
    fast = [r for r in report["cases"] if "fast_path" in r]
    if fast:
        lines += ["", "| case | fast path CPU/round | data + compute | all-reduce, optimizer, report and the rest | DDP CPU/step "
                  "| ratio |", "|---|---|---|---|---|---|"]
        for r in fast:
            f = r["fast_path"]["mean"]
            lines.append(f"| {r['case']} | {f['process']:.1f} | {f['data'] + f['compute']:.1f} | {f['rest']:.1f} "
                         f"| {r['ddp']['mean']['process_cpu_ms']:.1f} | {r['fast_path']['ratio']} |")
    return "\n".join(lines + ["", "CPU ms per worker per round (PS path, fast path) or per step (DDP), the workers' mean."])


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for r in report["cases"]:
        out.append({"name": f"PS-path worker CPU per round / DDP's per step ({r['case']}, {r['params']:,} params)",
                    "value": r["ratio"], "op": "<=", "threshold": RATIO_TARGET, "pass": r["meets_target"]})
        out.append({"name": f"the same beyond forward and backward ({r['case']})", "value": r["comm_ratio"],
                    "needs": "-", "pass": None})
        if "fast_path" in r:
            out.append({"name": f"fast-path worker CPU per round / DDP's per step ({r['case']})",
                        "value": r["fast_path"]["ratio"], "needs": "-", "pass": None})
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.round_cpu", description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=choices(tuple(CASES)), default=["cnn", "mlp_wide"],
                   help=f"comma-separated, of {', '.join(CASES)} (default cnn,mlp_wide)")
    p.add_argument("--workers", type=positive_int, default=2, help="workers (PS path) and ranks (DDP) (default 2)")
    p.add_argument("--batch", type=positive_int, default=64, help="samples per worker per round (default 64)")
    p.add_argument("--warmup", type=positive_int, default=5, help="rounds before the measured ones (default 5)")
    p.add_argument("--rounds", type=positive_int, default=30, help="measured rounds (default 30)")
    p.add_argument("--timeout", type=positive_float, default=600.0, help="seconds each run may take (default 600)")
    p.add_argument("--fast-path", action="store_true",
                   help="also run each case on the collective fast path (--allreduce on) and report its CPU per round")
    p.add_argument("--json", action="store_true", help="print the JSON report before the table")
    p.add_argument("--out", type=Path, default=None, help="also write round_cpu.json and round_cpu.md here")
    add_result_options(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_resolved(build_parser(), argv, check_batches)
    import torch

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="round_cpu-") as tmp:
        rows = [measure(CASES[n], args, Path(tmp)) for n in args.cases]
    report: dict[str, Any] = {"benchmark": "round_cpu", "torch": torch.__version__, "cpus": os.cpu_count(),
                              "seconds": round(time.monotonic() - started, 1), "cases": rows}
    report["targets"] = targets(report)
    publish(args, "round_cpu", report, markdown(report), argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
