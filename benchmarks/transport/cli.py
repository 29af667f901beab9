"""`python -m benchmarks.transport`: the flags, their defaults, the sweep and the report's output."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.cli_types import choices, counts, ints, parse_resolved
from benchmarks.report_output import add_result_options, print_report, save_report, save_result
from benchmarks.transport.measures import measure_echo, measure_gloo, measure_ps, measure_torch_rpc
from benchmarks.transport.overhead import measure_overhead_inprocess, measure_overhead_outside
from benchmarks.transport.processes import Processes
from benchmarks.transport.profiling import profile_server
from benchmarks.transport.report import add_ratios, combine_rounds, environment, evaluate_targets, markdown, shards_note
from benchmarks.transport.stats import human, iterations_for, warmup_for
from common.ops.memory import tune_malloc


ALL_BENCHMARKS = ("grpc_stream_echo", "torch_rpc", "ps_push_pull", "gloo_allreduce", "server_overhead")


def log(message: str) -> None:
    print(f"[transport] {message}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.transport",
        description=("Transport benchmark on loopback: our push+pull (real ps-server, PSClient workers, fp32/bf16) "
                     "against a raw gRPC streaming echo (the ceiling), torch.distributed.rpc (TensorPipe) and gloo "
                     "all_reduce, plus the server's per-step overhead. Progress on stderr; JSON (--json) then a "
                     "markdown table on stdout. MB = 10^6 bytes; round trips count up + down bytes."),
        epilog=("examples:\n"
                "  python -m benchmarks.transport --json\n"
                "  python -m benchmarks.transport --sizes 25e6 --workers 1 --benchmarks grpc_stream_echo,ps_push_pull\n"
                "  python -m benchmarks.transport --tiny --json     # smoke test (well under a minute)\n"
                "  python -m benchmarks.transport --sizes 1e6 --profile 25e6   # also py-spy the server at 25 M"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sizes", type=counts(2), default=None,
                   help="float32 parameter counts, comma-separated (default 1e6,25e6,100e6; --tiny: 1e5)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed iterations per measurement at >= 10 M parameters; smaller sizes run "
                        "proportionally more, up to 10x (default 5; --tiny: 1)")
    p.add_argument("--warmup", type=int, default=1, help="untimed iterations first (at least 1/10 of the timed ones)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the whole sweep (echo, torch rpc, push+pull, gloo) this many times and report, per row, "
                        "the round with the median MB/s and the median of the rounds' ratios (default 1)")
    p.add_argument("--workers", type=ints, default=None, help="push+pull worker counts (default 1,2,4; --tiny: 1,2)")
    p.add_argument("--wire-dtypes", type=choices(("float32", "bfloat16", "float16")), default=["float32", "bfloat16"],
                   help="push+pull wire dtypes, comma-separated")
    p.add_argument("--shards", type=ints, default=[1, 2],
                   help="push+pull server shard counts (ps-server --shards), comma-separated; counts above 1 run "
                        "fp32 only, with every --workers count (--tiny: the largest) (default 1,2)")
    p.add_argument("--torch-rpc-variants", type=choices(("defaults", "tcp")), default=None,
                   help="torch rpc runs: TensorPipe 'defaults' and/or 'tcp' (uv transport, basic channel) "
                        "(default defaults,tcp; --tiny: defaults)")
    p.add_argument("--gloo-processes", type=ints, default=None, help="all_reduce group sizes (default 2,4; --tiny: 2)")
    p.add_argument("--benchmarks", type=choices(ALL_BENCHMARKS), default=list(ALL_BENCHMARKS),
                   help=f"which to run, comma-separated (default all: {','.join(ALL_BENCHMARKS)}); "
                        "torch_rpc runs TensorPipe's defaults and its TCP-only variant")
    p.add_argument("--overhead-params", type=float, default=None,
                   help="model size for server_overhead, <= 1e6 (default 1e6; --tiny: 1e5)")
    p.add_argument("--overhead-steps", type=int, default=None, help="timed steps for server_overhead (default 50; --tiny: 5)")
    p.add_argument("--profile", type=float, default=None, metavar="N",
                   help="also run a 1-worker fp32 push+pull at N parameters with ps-server under py-spy and report "
                        "the hot spots (not part of the measured rows)")
    p.add_argument("--profile-steps", type=int, default=10, help="timed steps of the profiled run")
    p.add_argument("--tiny", action="store_true",
                   help="smoke test: 1e5 parameters, 1 repeat, push+pull fp32 with 1 and 2 workers and bf16 with 1 "
                        "(unless --workers is given), 2 shards with 2 workers, torch rpc defaults only, gloo on 2, "
                        "5 overhead steps")
    p.add_argument("--json", action="store_true", help="print the JSON report on stdout before the table")
    p.add_argument("--out", type=Path, default=None,
                   help="keep child logs here and write transport.json / transport.md (default: a temporary folder)")
    add_result_options(p)
    return p


def resolve_defaults(args: argparse.Namespace) -> None:
    tiny = args.tiny
    workers_given = args.workers is not None
    args.sizes = args.sizes or ([100_000] if tiny else [1_000_000, 25_000_000, 100_000_000])
    args.repeats = args.repeats if args.repeats is not None else (1 if tiny else 5)
    args.workers = args.workers or ([1, 2] if tiny else [1, 2, 4])
    args.gloo_processes = args.gloo_processes or ([2] if tiny else [2, 4])
    args.torch_rpc_variants = args.torch_rpc_variants or (["defaults"] if tiny else ["defaults", "tcp"])
    shard_dtype = "float32" if "float32" in args.wire_dtypes else args.wire_dtypes[0]
    # (wire dtype, workers, shards); a run's shard variants follow it, so the two are measured close in time
    args.ps_runs = [(dtype, w, s) for dtype in args.wire_dtypes for w in args.workers
                    if workers_given or not tiny or dtype == "float32" or w == args.workers[0]
                    for s in args.shards
                    if s == 1 or (dtype == shard_dtype and (not tiny or w == max(args.workers)))]
    args.shard_workers = 4 if 4 in args.workers else max(args.workers)
    args.shard_target = 2 if 2 in args.shards else max(args.shards)
    args.overhead_params = int(args.overhead_params if args.overhead_params is not None else (1e5 if tiny else 1e6))
    args.overhead_steps = args.overhead_steps if args.overhead_steps is not None else (5 if tiny else 50)
    if min(args.repeats, args.rounds, args.overhead_steps, args.profile_steps) < 1 or args.warmup < 0:
        raise ValueError("--repeats, --rounds, --overhead-steps and --profile-steps must be >= 1, --warmup >= 0")
    if not 2 <= args.overhead_params <= 1_000_000:
        raise ValueError("--overhead-params must be in [2, 1e6] (the target is about small models)")
    if args.profile is not None and args.profile < 2:
        raise ValueError("--profile needs a parameter count >= 2")


def run(args: argparse.Namespace, procs: Processes) -> dict[str, Any]:
    started = time.monotonic()
    env = environment()
    timings: dict[str, float] = {}
    selected = set(args.benchmarks)

    def timed(name: str, fn: Callable[..., Any], *fn_args: Any) -> Any:
        t0 = time.monotonic()
        try:
            return fn(*fn_args)
        finally:
            timings[name] = round(timings.get(name, 0.0) + time.monotonic() - t0, 2)

    sweeps: list[list[dict[str, Any]]] = []
    for sweep in range(args.rounds):
        rows: list[dict[str, Any]] = []
        if args.rounds > 1:
            log(f"round {sweep + 1} of {args.rounds}")
        for numel in args.sizes:
            iters = iterations_for(numel, args.repeats)
            warm = warmup_for(iters, args.warmup)
            if "grpc_stream_echo" in selected:
                log(f"{human(numel)}: raw gRPC echo ({iters} round trips)")
                rows += timed("grpc_stream_echo", measure_echo, procs, numel, iters, warm)
            if "torch_rpc" in selected:
                for tcp_only in (v == "tcp" for v in args.torch_rpc_variants):
                    log(f"{human(numel)}: torch rpc{' (tcp only)' if tcp_only else ''} ({iters} round trips)")
                    rows.append(timed("torch_rpc", measure_torch_rpc, procs, numel, iters, warm, tcp_only))
            if "ps_push_pull" in selected:
                for dtype, w, shards in args.ps_runs:
                    log(f"{human(numel)}: ps push+pull, {w} worker(s), {dtype}, {shards} shard(s) ({iters} steps)")
                    rows.append(timed("ps_push_pull", measure_ps, procs, numel, w, dtype, iters, warm, shards))
                    log(f"  -> {rows[-1]['mb_per_s']} MB/s aggregate, {rows[-1]['mb_per_s_per_worker']} per worker")
            if "gloo_allreduce" in selected:
                for world in args.gloo_processes:
                    log(f"{human(numel)}: gloo all_reduce, {world} processes ({iters} ops)")
                    rows.append(timed("gloo_allreduce", measure_gloo, procs, numel, world, iters, warm))
        add_ratios(rows)
        sweeps.append(rows)
    rows = combine_rounds(sweeps)

    overhead = None
    if "server_overhead" in selected:
        n, steps = args.overhead_params, args.overhead_steps
        warm = max(2, steps // 10)
        log(f"server overhead: in-process, {human(n)} params, 4 workers ({steps} steps)")
        inproc = timed("server_overhead", measure_overhead_inprocess, n, 4, steps, warm)
        log(f"server overhead: outside, {human(n)} params, 4 workers ({steps} steps)")
        outside = timed("server_overhead", measure_overhead_outside, procs, n, 4, steps, warm)
        overhead = {"inprocess": inproc, "outside": outside,
                    "note": "the target uses the in-process figure (the server's own work, timed precisely); the "
                            "outside figure adds gRPC I/O and client-thread scheduling noise"}

    profile = None
    if args.profile is not None:
        log(f"profile: ps-server under py-spy, {human(int(args.profile))} params, 1 worker, fp32")
        profile = timed("profile", profile_server, procs, int(args.profile), "float32", args.profile_steps)

    env["loadavg_end"] = list(os.getloadavg())
    timings["total"] = round(time.monotonic() - started, 2)
    return {
        "benchmark": "transport",
        "tiny": args.tiny,
        "environment": env,
        "settings": {
            "sizes": args.sizes, "repeats": args.repeats, "warmup": args.warmup, "rounds": args.rounds,
            "iterations": {str(n): iterations_for(n, args.repeats) for n in args.sizes},
            "workers": args.workers, "wire_dtypes": args.wire_dtypes,
            "ps_runs": [{"wire_dtype": d, "workers": w, "shards": s} for d, w, s in args.ps_runs],
            "shards": args.shards,
            "torch_rpc_variants": args.torch_rpc_variants, "gloo_processes": args.gloo_processes,
            "chunk_bytes": 1 << 20, "loopback": "127.0.0.1", "benchmarks": args.benchmarks,
        },
        "definitions": {
            "mb": "10^6 bytes",
            "round_trip_mb_per_s": "(bytes up + bytes down, in the wire dtype) / wall time of the timed iterations",
            "ps_mb_per_s": "aggregate: all workers' bytes / (last worker's end - first worker's start); "
                           "mb_per_s_per_worker: the mean of each worker's bytes / its own step times",
            "gloo_mb_per_s": "bus bandwidth 2(n-1)/n * bytes / time; algbw_mb_per_s = bytes / time",
            "params_per_s": "parameters moved per second, up + down (gloo: bus parameters)",
            "ratio_to_grpc_ceiling": "row mb_per_s / grpc_stream_echo mb_per_s at the same size",
            "ratio_to_torch_rpc": "row mb_per_s / torch_rpc mb_per_s (TensorPipe defaults) at the same size",
            "ratio_to_one_shard": "push+pull row mb_per_s / the 1-shard row's with the same size, wire dtype and workers",
            "cpu_ms_per_step": "echo and push+pull rows: CPU time (user + system, all threads) per timed step of the "
                               "server process (from /proc, 10 ms ticks; with --shards the coordinator alone) and of "
                               "each client process (the mean over the workers)",
            "cores_busy": "(server + every client) CPU time / the wall window of the timed steps: how much of the "
                          "machine's cores the measurement used",
            "params_per_s_ratio_to_torch_rpc": "row params_per_s / torch_rpc params_per_s: bf16 rows' effective "
                                               "parameters/s against torch rpc's fp32",
        },
        "rows": rows,
        "server_overhead": overhead,
        "profile": profile,
        "shards": {"counts": args.shards, "note": shards_note(env["cpus_usable"], args.shard_workers, args.shard_target)},
        "targets": evaluate_targets(rows, overhead, args.sizes, args.shard_workers, args.shard_target),
        "timings_s": timings,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_resolved(build_parser(), argv, resolve_defaults)
    torch.set_num_threads(1)
    tune_malloc()  # this process is the echo client and runs the in-process overhead measurement
    with contextlib.ExitStack() as stack:
        if args.out is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="transport-bench-")))
        else:
            workdir = args.out
            workdir.mkdir(parents=True, exist_ok=True)
        procs = Processes(workdir)
        stack.callback(procs.stop_all)

        def on_term(signum: int, frame: Any) -> None:
            procs.terminated = signum
            raise SystemExit(128 + signum)

        for signum in (signal.SIGTERM, signal.SIGINT):
            stack.callback(signal.signal, signum, signal.signal(signum, on_term))
        try:
            report = run(args, procs)
        except SystemExit:  # SIGTERM or SIGINT (on_term)
            log("stopped by a signal; stopping every process it started")
            raise
        except RuntimeError as exc:
            log(f"error: {exc}")
            if args.out is None:
                log("(pass --out DIR to keep the child logs)")
            return 1
        text = json.dumps(report, indent=2)
        table = markdown(report)
        if args.out is not None:
            save_report(workdir, "transport", text, table)
    print_report(text, table, args.json)
    save_result(args, "transport", report, argv)
    return 0
