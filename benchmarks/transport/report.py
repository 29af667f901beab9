"""The report: ratios within a sweep, rounds combined, the issue's targets, the environment and the
markdown table."""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Sequence
from typing import Any

import torch

from benchmarks.transport.stats import human


def add_ratios(rows: list[dict[str, Any]]) -> None:
    by = {(r["benchmark"], r["numel"]): r for r in rows}
    for row in rows:
        ceiling = by.get(("grpc_stream_echo", row["numel"]))
        rpc = by.get(("torch_rpc", row["numel"]))
        rpc_tcp = by.get(("torch_rpc_tcp", row["numel"]))

        def ratio(value: float | None, base: dict[str, Any] | None, key: str) -> float | None:
            if value is None or base is None or not base.get(key):
                return None
            return round(value / base[key], 3)

        row["ratio_to_grpc_ceiling"] = ratio(row["mb_per_s"], ceiling, "mb_per_s")
        row["ratio_to_torch_rpc"] = ratio(row["mb_per_s"], rpc, "mb_per_s")
        row["ratio_to_torch_rpc_tcp"] = ratio(row["mb_per_s"], rpc_tcp, "mb_per_s")
        row["params_per_s_ratio_to_torch_rpc"] = ratio(row["params_per_s"], rpc, "params_per_s")
        if row["benchmark"] == "ps_push_pull":
            one_shard = next((r for r in rows if r["benchmark"] == "ps_push_pull" and r["numel"] == row["numel"]
                              and r["wire_dtype"] == row["wire_dtype"] and r["workers"] == row["workers"]
                              and r["shards"] == 1), None)
            row["ratio_to_one_shard"] = ratio(row["mb_per_s"], one_shard, "mb_per_s")
            row["ratio_to_grpc_ceiling_per_worker"] = ratio(row["mb_per_s_per_worker"], ceiling, "mb_per_s")
            row["params_per_s_per_worker_ratio_to_torch_rpc"] = ratio(row["params_per_s_per_worker"], rpc, "params_per_s")
            row["params_per_s_per_worker_ratio_to_torch_rpc_tcp"] = ratio(row["params_per_s_per_worker"], rpc_tcp, "params_per_s")


RATIO_KEYS = ("ratio_to_grpc_ceiling", "ratio_to_torch_rpc", "ratio_to_torch_rpc_tcp", "params_per_s_ratio_to_torch_rpc",
              "ratio_to_one_shard", "ratio_to_grpc_ceiling_per_worker", "params_per_s_per_worker_ratio_to_torch_rpc",
              "params_per_s_per_worker_ratio_to_torch_rpc_tcp")


def combine_rounds(rounds: Sequence[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per measurement from `--rounds` sweeps (each with its ratios already added; every sweep
    lists its rows in the same order): the row of the round with the median MB/s (the lower median
    for an even count), with every round's MB/s in ``rounds_mb_per_s``, and each ratio replaced by
    the median of the rounds' ratios. A ratio is taken within a round, between rows measured minutes
    apart, so a slow spell of the shared machine moves both sides of it; the median of those is
    steadier than a ratio of medians taken across rounds."""
    if len(rounds) == 1:
        return list(rounds[0])
    if len({len(r) for r in rounds}) != 1:
        raise ValueError("every round must measure the same rows")
    combined = []
    for same in zip(*rounds, strict=True):
        if len({(r["benchmark"], r["numel"], r.get("wire_dtype"), r.get("workers"), r.get("shards"), r.get("processes"))
                for r in same}) != 1:
            raise ValueError("the rounds list their rows in different orders")
        by_rate = sorted(same, key=lambda r: r["mb_per_s"])
        row = dict(by_rate[(len(by_rate) - 1) // 2])
        row["rounds_mb_per_s"] = [r["mb_per_s"] for r in same]
        for key in RATIO_KEYS:
            values = [r[key] for r in same if r.get(key) is not None]
            if key in row:
                row[key] = round(statistics.median(values), 3) if values else None
                row[f"{key}_rounds"] = [r.get(key) for r in same]
        combined.append(row)
    return combined


def target_sizes(sizes: Sequence[int]) -> list[int]:
    wanted = [n for n in sizes if n in (25_000_000, 100_000_000)]
    return wanted or [max(sizes)]


def evaluate_targets(rows: list[dict[str, Any]], overhead: dict[str, Any] | None, sizes: Sequence[int],
                     shard_workers: int = 4, shards: int = 2) -> list[dict[str, Any]]:
    """The issue's targets; the sharding one compares `shards` with 1 shard, fp32, `shard_workers` workers."""

    def find(benchmark: str, numel: int, **keys: Any) -> dict[str, Any] | None:
        for r in rows:
            if r["benchmark"] == benchmark and r["numel"] == numel and all(r.get(k) == v for k, v in keys.items()):
                return r
        return None

    def target(name: str, value: float | None, op: str, threshold: float, source: str) -> dict[str, Any]:
        passed = None if value is None else (value >= threshold if op == ">=" else value <= threshold)
        return {"name": name, "value": value, "op": op, "threshold": threshold, "pass": passed, "source": source}

    out = []
    for n in target_sizes(sizes):
        row = find("ps_push_pull", n, wire_dtype="float32", workers=1, shards=1)
        out.append(target(f"fp32 push+pull, 1 worker, {human(n)} params: ratio to the raw gRPC streaming ceiling",
                          None if row is None else row["ratio_to_grpc_ceiling"], ">=", 0.8,
                          f"ps_push_pull float32 W=1 numel={n} mb_per_s / grpc_stream_echo mb_per_s"))
    for n in target_sizes(sizes):
        row = find("ps_push_pull", n, wire_dtype="bfloat16", workers=1, shards=1)
        out.append(target(f"bf16 push+pull, 1 worker, {human(n)} params: effective parameters/s vs torch rpc",
                          None if row is None else row["params_per_s_ratio_to_torch_rpc"], ">=", 1.0,
                          f"ps_push_pull bfloat16 W=1 numel={n} params_per_s / torch_rpc params_per_s (TensorPipe defaults)"))
    for n in target_sizes(sizes):
        row = find("ps_push_pull", n, wire_dtype="float32", workers=shard_workers, shards=shards)
        out.append(target(f"fp32 push+pull, {shard_workers} workers, {human(n)} params: {shards} shards' aggregate MB/s "
                          f"vs 1 shard", row["ratio_to_one_shard"] if row else None, ">=", 1.5,
                          f"ps_push_pull float32 W={shard_workers} numel={n}: mb_per_s with --shards {shards} / "
                          f"mb_per_s with 1 shard"))
    value = overhead["inprocess"]["median_ms"] if overhead and overhead.get("inprocess") else None
    numel = overhead["inprocess"]["numel"] if overhead and overhead.get("inprocess") else None
    size = f"{human(numel)} params" if numel else "<= 1M params (not run)"
    out.append(target(f"server per-step overhead, {size}, 4 workers: median ms",
                      value, "<=", 2.0, "server_overhead.inprocess.median_ms"))
    return out


def markdown(report: dict[str, Any]) -> str:
    def fmt(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.3g}" if abs(v) < 10 else f"{v:,.0f}"
        return str(v)

    header = ("| benchmark | params | wire | procs | shards | MB/s | MB/s per worker | step ms p50 | vs 1 shard "
              "| vs gRPC ceiling | vs torch rpc | vs torch rpc (tcp) | params/s vs torch rpc |")
    lines = [header, "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['benchmark']} | {human(r['numel'])} | {r['wire_dtype']} | {r['processes']} | "
                     f"{fmt(r.get('shards'))} | {fmt(r['mb_per_s'])} | {fmt(r.get('mb_per_s_per_worker'))} | "
                     f"{fmt(r['median_ms'])} | {fmt(r.get('ratio_to_one_shard'))} | "
                     f"{fmt(r['ratio_to_grpc_ceiling'])} | {fmt(r['ratio_to_torch_rpc'])} | "
                     f"{fmt(r['ratio_to_torch_rpc_tcp'])} | {fmt(r['params_per_s_ratio_to_torch_rpc'])} |")
    lines.append("")
    lines.append("gloo rows: bus bandwidth 2(n-1)/n*bytes/time. Round trips: (up + down bytes) / time. MB = 10^6 bytes.")
    timed = [r for r in report["rows"] if r.get("cpu_ms_per_step")]
    if timed:
        lines += ["", "| CPU per step | params | wire | workers | shards | server ms | client ms | cores busy |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in timed:
            cpu = r["cpu_ms_per_step"]
            lines.append(f"| {r['benchmark']} | {human(r['numel'])} | {r['wire_dtype']} | {r['workers']} | "
                         f"{fmt(r.get('shards'))} | {fmt(cpu['server'])} | {fmt(cpu['client'])} | {fmt(r['cores_busy'])} |")
    rounds = report["settings"].get("rounds", 1)
    if rounds > 1:
        lines.append(f"{rounds} rounds: MB/s and step ms from the round with the median MB/s; ratios are the medians "
                     "of the rounds' own ratios (rounds_mb_per_s and *_rounds in the JSON)")
    lines.append(f"shards: {report['shards']['note']}")
    overhead = report.get("server_overhead") or {}
    for key in ("inprocess", "outside"):
        o = overhead.get(key)
        if o:
            lines.append(f"server overhead ({key}, {human(o['numel'])} params, {o['workers']} workers): "
                         f"median {o['median_ms']} ms, p90 {o['p90_ms']} ms")
    lines += ["", "| target | value | threshold | pass |", "|---|---|---|---|"]
    for t in report["targets"]:
        lines.append(f"| {t['name']} | {fmt(t['value'])} | {t['op']} {t['threshold']} | {t['pass']} |")
    return "\n".join(lines)


def shards_note(cpus: int, workers: int, shards: int) -> str:
    """What bounds the shard rows on this machine: the CPUs all processes of a run share (a fact, not a measurement)."""
    if shards < 2:
        return "no run with more than one shard (--shards)"
    processes = workers + shards
    fit = (f"{processes} processes on {cpus} CPUs: a shard adds a server process but no core, while sharding is "
           "meant to give each range its own core (or host); the shard rows here measure it with the CPUs shared"
           if processes > cpus else f"{processes} processes on {cpus} CPUs: each can have a core")
    return (f"every process of a push+pull run is on this machine ({cpus} usable CPUs, loopback): with {workers} "
            f"workers and {shards} shards, {workers} client processes, the coordinator (ps-server) and {shards - 1} "
            f"ps-shard process(es), {fit}")


def environment() -> dict[str, Any]:
    import grpc
    import numpy

    return {
        "python": platform.python_version(), "torch": torch.__version__, "grpc": grpc.__version__,
        "numpy": numpy.__version__, "platform": platform.platform(), "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "loadavg": list(os.getloadavg()),
    }
