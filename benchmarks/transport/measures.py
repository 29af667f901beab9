"""The round-trip measurements, each server in its own process: the raw gRPC echo (the ceiling),
torch RPC, our push+pull on a real ps-server, and gloo's all_reduce."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.cpu_time import CpuWindow, cpu_fields
from benchmarks.transport.job import server_argv
from benchmarks.transport.processes import (
    START_TIMEOUT_S,
    Processes,
    child_argv,
    echo_argv,
    free_port,
    read_result,
    server_process,
)
from benchmarks.transport.stats import human, rate, stats


def payload_chunks(numel: int, chunk_bytes: int) -> list[bytes]:
    import numpy as np

    from common.transport.wire import split

    data = np.random.default_rng(0).standard_normal(numel, dtype=np.float32)
    chunks = split(memoryview(data).cast("B"), chunk_bytes)  # type: ignore[arg-type]  # numpy types ndarray as a buffer from Python 3.12 on
    del data
    return chunks


def measure_echo(procs: Processes, numel: int, iterations: int, warmup: int) -> list[dict[str, Any]]:
    from benchmarks.echo import EchoClient
    from ps.serving.server_options import MAX_MESSAGE_BYTES
    from common.transport.wire import CHUNK_BYTES

    rows = []
    with server_process(procs, "echo", echo_argv()) as target:
        client = EchoClient(target)
        try:
            client.wait_ready(START_TIMEOUT_S)
            chunks = payload_chunks(numel, CHUNK_BYTES)
            nbytes = sum(map(len, chunks))
            times = []
            cpu = CpuWindow(procs.find("echo").pid)
            for i in range(warmup + iterations):
                if i == warmup:
                    cpu.start()
                t0 = time.perf_counter()
                got = client.stream(chunks)
                if i >= warmup:
                    times.append(time.perf_counter() - t0)
                if got != nbytes:
                    raise RuntimeError(f"echo returned {got} bytes, sent {nbytes}")
            cpu.stop()
            rows.append(_round_trip_row("grpc_stream_echo", numel, 2 * nbytes, times,
                                        chunk_bytes=CHUNK_BYTES, chunks=len(chunks),
                                        **cpu_fields(cpu.other_s, [cpu.own_s], [len(times)], sum(times))))
            del chunks
            if numel * 4 + 1024 <= MAX_MESSAGE_BYTES:
                payload = payload_chunks(numel, numel * 4)[0]
                times = []
                for i in range(warmup + iterations):
                    t0 = time.perf_counter()
                    got = client.unary(payload)
                    if i >= warmup:
                        times.append(time.perf_counter() - t0)
                rows.append(_round_trip_row("grpc_unary_echo", numel, 2 * len(payload), times, chunks=1))
        finally:
            client.close()
    return rows


def _round_trip_row(name: str, numel: int, bytes_per_iter: int, times: Sequence[float], **extra: Any) -> dict[str, Any]:
    seconds = sum(times)
    return {"benchmark": name, "numel": numel, "wire_dtype": "float32", "processes": 2, "workers": 1,
            "bytes_per_iter": bytes_per_iter, "iterations": len(times), **stats(times),
            "mb_per_s": rate(bytes_per_iter * len(times), seconds),
            "params_per_s": round(bytes_per_iter / 4 * len(times) / seconds, 1), **extra}


def measure_torch_rpc(procs: Processes, numel: int, iterations: int, warmup: int, tcp_only: bool) -> dict[str, Any]:
    port = free_port()
    result = procs.workdir / f"rpc-{numel}-{int(tcp_only)}.json"
    common = ["--numel", str(numel), "--port", str(port), "--steps", str(iterations), "--warmup", str(warmup)]
    if tcp_only:
        common.append("--tcp-only")
    ranks = [procs.start(f"torch-rpc-{r}", child_argv("torch-rpc", result, *common, "--rank", str(r))) for r in (0, 1)]
    try:
        procs.wait_all(ranks, 600, "torch rpc")
    finally:
        for proc in ranks:
            procs.stop(proc)
    record = read_result(result)
    name = "torch_rpc_tcp" if tcp_only else "torch_rpc"
    note = ("TensorPipe uv (TCP) transport, basic channel" if tcp_only
            else "TensorPipe defaults (on one host it may use shared memory or CMA instead of TCP)")
    return _round_trip_row(name, numel, record["bytes_per_iter"], record["times"], note=note)


def measure_ps(procs: Processes, numel: int, workers: int, wire_dtype: str, iterations: int, warmup: int,
               shards: int = 1) -> dict[str, Any]:
    """One push+pull row; with `shards` > 1 the server runs ``--shards`` (it starts shards - 1 ps-shard children)."""
    from common.transport.wire import itemsize

    tag = f"{human(numel)}-w{workers}-{wire_dtype}-s{shards}"
    port_file = procs.workdir / f"ps-{tag}-{time.monotonic_ns()}.port"
    # TMPDIR: the ps-shard children's --port-file paths then name the workdir, like every other child's
    # command line (the smoke test looks for leftovers by it); they are in the server's process group
    # and die with it
    server = procs.start(f"ps-server-{tag}", [sys.executable, "-m", "ps.server", *server_argv(numel, workers, wire_dtype),
                                              "--shards", str(shards), "--port", "0", "--port-file", str(port_file)],
                         env={"TMPDIR": str(procs.workdir)})
    results = [procs.workdir / f"ps-{tag}-{k}.json" for k in range(workers)]
    # the clients start with the server (importing torch takes a while) and wait for its port file
    clients = [
        procs.start(f"ps-client-{tag}-{k}", child_argv("ps-client", results[k], "--target-file", str(port_file),
                                                        "--name", f"w{k}", "--wire-dtype", wire_dtype, "--seed", str(k),
                                                        "--server-pid", str(server.pid),
                                                        "--steps", str(iterations), "--warmup", str(warmup)))
        for k in range(workers)
    ]
    try:
        procs.wait_all(clients, 900, f"ps push+pull ({tag})", watch=[server])
    finally:
        for proc in clients:
            procs.stop(proc)
        procs.stop(server, grace=0.0)
    records = [read_result(r) for r in results]
    per_step = 2 * numel * itemsize(wire_dtype)
    per_worker = [rate(per_step * len(r["times"]), sum(r["times"])) for r in records]
    window = max(r["end"] for r in records) - min(r["start"] for r in records)
    total_steps = sum(len(r["times"]) for r in records)
    all_times = [t for r in records for t in r["times"]]
    return {
        "benchmark": "ps_push_pull", "numel": numel, "wire_dtype": wire_dtype, "processes": workers + shards,
        "workers": workers, "shards": shards, "bytes_per_iter": per_step, "iterations": iterations, **stats(all_times),
        "mb_per_s": rate(per_step * total_steps, window),
        "mb_per_s_per_worker": round(statistics.fmean(per_worker), 2),
        "per_worker_mb_per_s": per_worker,
        "params_per_s": round(2 * numel * total_steps / window, 1),
        "params_per_s_per_worker": round(statistics.fmean(2 * numel * len(r["times"]) / sum(r["times"]) for r in records), 1),
        # the server's CPU is read over worker 0's timed steps (the workers' windows differ by at most a step)
        **cpu_fields(records[0]["server_cpu_s"], [r["cpu_s"] for r in records],
                     [len(r["times"]) for r in records], window),
    }


def measure_gloo(procs: Processes, numel: int, world: int, iterations: int, warmup: int) -> dict[str, Any]:
    port = free_port()
    result = procs.workdir / f"gloo-{numel}-{world}.json"
    common = ["--numel", str(numel), "--port", str(port), "--world", str(world), "--steps", str(iterations),
              "--warmup", str(warmup)]
    ranks = [procs.start(f"gloo-{r}", child_argv("gloo", result, *common, "--rank", str(r))) for r in range(world)]
    try:
        procs.wait_all(ranks, 600, f"gloo all_reduce ({world} processes)")
    finally:
        for proc in ranks:
            procs.stop(proc)
    record = read_result(result)
    times, nbytes = record["times"], record["bytes"]
    seconds = sum(times)
    return {
        "benchmark": "gloo_allreduce", "numel": numel, "wire_dtype": "float32", "processes": world, "workers": world,
        "bytes_per_iter": nbytes, "iterations": len(times), **stats(times),
        "mb_per_s": rate(2 * (world - 1) / world * nbytes * len(times), seconds),
        "algbw_mb_per_s": rate(nbytes * len(times), seconds),
        "params_per_s": round(2 * (world - 1) / world * numel * len(times) / seconds, 1),
        "note": "mb_per_s is bus bandwidth 2(n-1)/n*bytes/time; algbw_mb_per_s is bytes/time",
    }
