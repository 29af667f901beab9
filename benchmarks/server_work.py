"""The server's own data work per BSP step, without gRPC: what ps-server does besides moving bytes.

``python -m benchmarks.server_work --json`` times, in this one process, one worker's step as the
server's cores run it, for each size and wire dtype:

1. receive the push's chunks (``common.transport.wire.ChunkReceiver``: views of the bytes, NaN/Inf check per chunk);
2. aggregate them (``common.params.aggregation.WeightedMean``) and begin the optimizer step (``common.params.store``);
3. frame every reply chunk as a serialized ``ParamsChunk`` (``common.transport.payload`` with the servicer's
   framing), which applies the deferred step piece by piece.

The chunks are fresh bytes objects every step, as gRPC hands them over (making them is not timed).
Baseline, measured in the same run: one copy of the parameters' fp32 bytes into fresh 1 MiB bytes
objects, the least any framing costs. ``copies`` = our step / that copy: how many such memory passes
the server's work is worth (the transport benchmark's ``ps_push_pull`` rows show what it costs in a
real step, where gRPC's own copies and the client share the machine). The optimizer is plain SGD,
as in the transport benchmark; ``--momentum`` adds momentum.

Progress goes to stderr; stdout gets the JSON report (with ``--json``) and a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.cli_types import choices, counts
from benchmarks.report_output import add_result_options, print_report, save_report, save_result
from common.ops.memory import tune_malloc

WIRE_DTYPES = ("float32", "bfloat16", "float16")


def log(message: str) -> None:
    print(f"[server_work] {message}", file=sys.stderr, flush=True)


def fresh(chunks: Sequence[bytes]) -> list[bytes]:
    """New bytes objects with the same contents (what a receive gets from gRPC)."""
    return [bytes(memoryview(c)) for c in chunks]


def measure(numel: int, wire_dtype: str, steps: int, momentum: float) -> dict[str, Any]:
    """One row: our step's times and the copy baseline's, `steps` each after one warm-up."""
    from common.job.spec import JobSpec
    from common.params.aggregation import WeightedMean
    from common.params.store import ParameterStore
    from common.transport.payload import Payload
    from common.transport.chunk_frames import params_chunk
    from common.transport.wire import CHUNK_BYTES, ChunkReceiver, encode, split

    gen = torch.Generator().manual_seed(0)
    store = ParameterStore(torch.randn(numel, generator=gen), JobSpec(lr=1e-3, momentum=momentum))
    payload = Payload(params_chunk)
    store.before_change.append(payload.complete)
    mean = WeightedMean(numel)
    pushed = [bytes(c) for c in split(encode(torch.randn(numel, generator=gen).mul_(1e-3), wire_dtype))]
    ours: list[float] = []
    for step in range(steps + 1):
        chunks = fresh(pushed)
        started = time.perf_counter()
        store.settle()
        receiver = ChunkReceiver(numel, wire_dtype)
        for seq, data in enumerate(chunks):
            receiver.feed(seq, data)
        mean.add(receiver.finish(), 1)
        store.begin_step(mean.result())
        mean.reset()
        framed = list(payload.get(step, store, wire_dtype))
        if step:
            ours.append(time.perf_counter() - started)
        del chunks, framed
    values = memoryview(store.flat.numpy()).cast("B")  # type: ignore[arg-type]  # numpy types ndarray as a buffer from Python 3.12 on
    copies: list[float] = []
    for step in range(steps + 1):
        started = time.perf_counter()
        copied = [bytes(values[i : i + CHUNK_BYTES]) for i in range(0, len(values), CHUNK_BYTES)]
        if step:
            copies.append(time.perf_counter() - started)
        del copied
    median, copy = statistics.median(ours), statistics.median(copies)
    return {
        "numel": numel, "wire_dtype": wire_dtype, "momentum": momentum, "steps": steps,
        "median_ms": round(median * 1e3, 3), "min_ms": round(min(ours) * 1e3, 3),
        "p90_ms": round(sorted(ours)[int(0.9 * (len(ours) - 1))] * 1e3, 3),
        "copy_ms": round(copy * 1e3, 3), "copies": round(median / copy, 2),
        "params_per_s": round(numel / median, 1),
    }


def markdown(report: dict[str, Any]) -> str:
    lines = ["| params | wire | our step ms (p50) | one fp32 copy ms | copies | params/s |", "|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['numel']:,} | {r['wire_dtype']} | {r['median_ms']:.1f} | {r['copy_ms']:.1f} | "
                     f"{r['copies']:.2f} | {r['params_per_s']:,.0f} |")
    return "\n".join(lines)


def _bounded(cast: Callable[[str], Any], ok: Callable[[Any], bool], what: str) -> Callable[[str], Any]:
    """An argparse type: `cast(text)`, refused with `what` unless `ok` holds."""
    def parse(text: str) -> Any:
        try:
            value = cast(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"{what}, got {text!r}")
        return value
    return parse


_steps = _bounded(int, lambda v: 1 <= v <= 1000, "steps must be an integer in [1, 1000]")
_momentum = _bounded(float, lambda v: 0 <= v < 1, "momentum must be in [0, 1)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.server_work",
        description="Time the server's own work per BSP step (receive, aggregate, step, frame; one worker) "
                    "in one process, without gRPC, against one memory copy of the parameters measured in the same run.",
    )
    p.add_argument("--sizes", type=counts(1, 1e9), default=[1_000_000, 25_000_000, 100_000_000],
                   help="parameter counts, comma-separated (default 1e6,25e6,100e6)")
    p.add_argument("--wire-dtypes", type=choices(WIRE_DTYPES), default=["float32", "bfloat16"],
                   help="wire dtypes of the push and the reply (default float32,bfloat16)")
    p.add_argument("--steps", type=_steps, default=10, help="timed steps per row, after one warm-up (default 10)")
    p.add_argument("--momentum", type=_momentum, default=0.0, help="SGD momentum (default 0, as the transport benchmark)")
    p.add_argument("--json", action="store_true", help="print the JSON report before the table")
    p.add_argument("--out", type=Path, default=None, help="also write server_work.json and server_work.md here")
    add_result_options(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    tune_malloc()  # as ps-server does
    torch.set_num_threads(1)
    rows = []
    for numel in args.sizes:
        for wire_dtype in args.wire_dtypes:
            log(f"{numel:,} parameters, {wire_dtype} ({args.steps} steps)")
            rows.append(measure(numel, wire_dtype, args.steps, args.momentum))
            log(f"  -> {rows[-1]['median_ms']:.1f} ms a step, {rows[-1]['copies']:.2f} copies")
    report = {"benchmark": "server_work", "torch": torch.__version__, "rows": rows}
    text, table = json.dumps(report, indent=2), markdown(report)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        save_report(args.out, "server_work", text, table)
    print_report(text, table, args.json)
    save_result(args, "server_work", report, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
