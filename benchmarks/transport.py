"""Transport benchmark: our push+pull against raw gRPC, torch RPC and gloo, on loopback, in one run.

``python -m benchmarks.transport --json`` measures, for flat models of ``--sizes`` float32 parameters
(default 1 M, 25 M, 100 M), every server in its own process:

- ``grpc_stream_echo``: a raw gRPC stream-stream echo (``benchmarks.echo``: bytes messages, no protobuf,
  the same ``grpc.aio`` server stack and channel options as ours) of the same bytes in 1 MiB chunks:
  the client streams the payload up, the server streams it back once it is all in. The ceiling for
  our transport. ``grpc_unary_echo`` (one message each way) where the payload fits the 8 MiB limit.
- ``torch_rpc``: ``torch.distributed.rpc`` (TensorPipe, 127.0.0.1) round trip of the same tensor, two
  processes (OmniLearn's transport): TensorPipe's defaults (may pick shared memory / CMA on one host)
  and ``torch_rpc_tcp`` (uv transport, basic channel: what two hosts or containers would use).
- ``ps_push_pull``: a real ``ps-server`` process (BSP, ``--momentum 0``, uniform batches, a job that
  cannot end mid-measure) serving ``flat_model`` (one parameter of exactly N values), driven by W
  client processes using ``worker.client.PSClient`` (join, pull, then per step: push a random
  gradient for the open round and receive the new parameters), fp32 and bf16 on the wire. Each row
  has ``shards``: 1 is one server process; with ``--shards`` counts above 1 (default 1,2) the fp32 runs
  are repeated with ``ps-server --shards S`` (the server keeps range 0 and starts S-1 ``ps-shard``
  children; the workers push and pull every range in parallel), right after the matching 1-shard run,
  and ``ratio_to_one_shard`` compares them. ``report["shards"]["note"]`` says what the machine's
  CPU count means for those rows: clients, coordinator and shards all share it.
- ``gloo_allreduce``: ``torch.distributed.all_reduce`` (gloo) over 2 and 4 processes.
- ``server_overhead``: the server's per-step cost for a small model with 4 workers (see
  ``measure_overhead_inprocess`` and ``measure_overhead_outside``).

``--rounds R`` repeats the whole sweep R times; each row then reports the round with the median MB/s
and, for each ratio, the median of the R ratios taken within a round (``combine_rounds``), so a slow
spell of the shared machine moves both sides of a ratio.

Definitions: MB = 10^6 bytes. Round trips (echo, torch RPC, push+pull) count the bytes moved both
ways: MB/s = (bytes up + bytes down) / wall time, in the wire dtype. A multi-worker row's ``mb_per_s``
is the aggregate (all workers' bytes over the common window); ``mb_per_s_per_worker`` is their mean.
gloo rows report bus bandwidth, 2(n-1)/n * bytes / time (NCCL-tests' definition), and ``algbw_mb_per_s``
= bytes / time. ``params_per_s`` = parameters moved per second (up + down), so bf16 rows compare the
useful work with torch RPC's fp32. Ratios are taken against the same size in the same run.

Every process (servers, echo, clients, this one) calls ``ps.memory.tune_malloc`` first, as ``ps-server``,
``ps-shard`` and ``ps-worker`` do, so the ceiling and our path run with the same glibc malloc settings.

Progress goes to stderr; stdout gets the JSON report (with ``--json``) followed by a markdown table.
Every process the benchmark starts is killed on every exit path (also when the benchmark itself is
killed: children get SIGKILL from the kernel when their parent dies).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.cli_types import choices, counts, ints
from benchmarks.cpu_time import CpuWindow, cpu_fields
from benchmarks.report_output import print_report, save_report
from ps.memory import tune_malloc

REPO = Path(__file__).resolve().parents[1]
ALL_BENCHMARKS = ("grpc_stream_echo", "torch_rpc", "ps_push_pull", "gloo_allreduce", "server_overhead")
START_TIMEOUT_S = 120.0


def log(message: str) -> None:
    print(f"[transport] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ the job the server runs
class FlatModel(nn.Module):
    """One parameter of exactly `numel` values; the forward pass only exists so evaluation works."""

    def __init__(self, numel: int, num_classes: int) -> None:
        super().__init__()
        if numel < num_classes:
            raise ValueError(f"flat_model needs numel >= num_classes ({num_classes}), got {numel}")
        self.num_classes = num_classes
        self.flat = nn.Parameter(torch.zeros(numel))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(len(x), -1).sum(1, keepdim=True) * self.flat[: self.num_classes]


def flat_model(input_shape: tuple[int, ...], num_classes: int, numel: float = 1_000_000) -> nn.Module:
    """Model factory for ``ps-server --model benchmarks.transport:flat_model --model-arg numel=N``."""
    return FlatModel(int(numel), num_classes)


def tiny_dataset(seed: int, size: int = 1 << 20, num_classes: int = 2) -> Any:
    """Dataset factory: `size` one-feature training samples (so an epoch spans size/B steps), 2 test samples."""
    from ps.datasets import Dataset

    g = torch.Generator().manual_seed(seed)
    return Dataset(
        torch.zeros(int(size), 1),
        torch.randint(0, num_classes, (int(size),), generator=g),
        torch.zeros(2, 1),
        torch.tensor([0, 1]) % num_classes,
        num_classes,
    )


def server_argv(numel: int, workers: int, wire_dtype: str) -> list[str]:
    """`ps-server` flags for a push+pull measurement: nothing but transport and one SGD step per round."""
    return ["--mode", "bsp", "--workers", str(workers), "--global-batch", str(workers), "--controller", "uniform",
            "--model", "benchmarks.transport:flat_model", "--model-arg", f"numel={numel}",
            "--dataset", "benchmarks.transport:tiny_dataset", "--dataset-arg", f"size={1 << 20}",
            "--epochs", "1000000", "--lr", "0.001", "--momentum", "0", "--wire-dtype", wire_dtype,
            "--evict-after", "3600", "--grace", "0", "--quiet"]


# ------------------------------------------------------------------ processes
class Processes:
    """Every child process of the run; `stop_all` (also at exit and on SIGTERM) kills what is left."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._procs: list[tuple[str, subprocess.Popen]] = []
        self._counter = 0
        # set by the SIGTERM handler: its SystemExit is swallowed when the signal lands in an at-fork
        # hook (e.g. logging's, run inside Popen), so the places that start or wait on children check it
        self.terminated: int | None = None

    def check_terminated(self) -> None:
        if self.terminated is not None:
            raise SystemExit(128 + self.terminated)

    def start(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        self._counter += 1
        log_path = self.workdir / f"{self._counter:03d}-{name}.log"
        with open(log_path, "w", encoding="utf-8") as out:
            # benchmarks.guard execs argv with a kernel SIGKILL armed for when this process dies
            proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.guard", str(os.getpid()), *argv], cwd=REPO, stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore",
                     "GLOO_SOCKET_IFNAME": "lo", "TP_SOCKET_IFNAME": "lo", **(env or {})},
                start_new_session=True,
            )
        proc.log_path = log_path  # type: ignore[attr-defined]
        self._procs.append((name, proc))
        self.check_terminated()
        return proc

    @staticmethod
    def log_tail(proc: subprocess.Popen, chars: int = 2000) -> str:
        try:
            return Path(proc.log_path).read_text(encoding="utf-8", errors="replace")[-chars:]  # type: ignore[attr-defined]
        except OSError:
            return ""

    def find(self, name: str) -> subprocess.Popen:
        """The newest running child started under `name`."""
        for n, proc in reversed(self._procs):
            if n == name:
                return proc
        raise KeyError(name)

    def stop(self, proc: subprocess.Popen, grace: float = 5.0) -> None:
        """SIGTERM its process group, SIGKILL after `grace` seconds (at once with grace 0).

        Signals go only to a child not yet reaped, so its pid (and group) cannot have been reused.
        """
        if proc.poll() is None:
            if grace > 0:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=grace)
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._procs = [(n, p) for n, p in self._procs if p is not proc]

    def stop_all(self) -> None:
        for _, proc in reversed(list(self._procs)):
            self.stop(proc, grace=2.0)

    def wait_all(self, procs: Sequence[subprocess.Popen], timeout: float, what: str,
                 watch: Sequence[subprocess.Popen] = ()) -> None:
        """Wait for children to exit 0; raise with a log tail on a failure, a timeout, or a `watch`ed
        process (a server) exiting first. The caller stops them."""
        deadline = time.monotonic() + timeout
        pending = list(procs)
        while pending:
            self.check_terminated()
            for proc in watch:
                if proc.poll() is not None:
                    raise RuntimeError(f"{what}: the server exited {proc.returncode}:\n{self.log_tail(proc)}")
            for proc in list(pending):
                code = proc.poll()
                if code is None:
                    continue
                pending.remove(proc)
                if code != 0:
                    raise RuntimeError(f"{what}: a process exited {code}:\n{self.log_tail(proc)}")
            if pending and time.monotonic() > deadline:
                raise RuntimeError(f"{what}: no result within {timeout:.0f}s:\n{self.log_tail(pending[0])}")
            if pending:
                time.sleep(0.05)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port_file(proc: subprocess.Popen, path: Path, what: str, timeout: float = START_TIMEOUT_S) -> int:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited {proc.returncode} before listening:\n{Processes.log_tail(proc)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not listen within {timeout:.0f}s:\n{Processes.log_tail(proc)}")
        time.sleep(0.05)
    return int(path.read_text())


@contextlib.contextmanager
def server_processes(procs: Processes, servers: Sequence[tuple[str, Sequence[str]]]) -> Iterator[list[str]]:
    """Start servers (name, argv) that write their port to --port-file, all at once; yields their
    HOST:PORT targets once all listen, and stops them afterwards."""
    started: list[tuple[str, subprocess.Popen, Path]] = []
    try:
        for name, argv in servers:
            port_file = procs.workdir / f"{name}-{time.monotonic_ns()}.port"
            started.append((name, procs.start(name, [*argv, "--port", "0", "--port-file", str(port_file)]), port_file))
        yield [f"127.0.0.1:{wait_port_file(proc, path, name)}" for name, proc, path in started]
        for name, proc, _ in started:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited {proc.returncode} during the measurement:\n{procs.log_tail(proc)}")
    finally:
        for _, proc, _ in started:
            procs.stop(proc, grace=0.0)  # measured already: no need to wait for a graceful exit


@contextlib.contextmanager
def server_process(procs: Processes, name: str, argv: Sequence[str]) -> Iterator[str]:
    """One server: yields HOST:PORT once it listens and stops it afterwards."""
    with server_processes(procs, [(name, argv)]) as targets:
        yield targets[0]


def echo_argv() -> list[str]:
    """The echo server (its default gRPC options are ps-server's, ps.server_options.GRPC_OPTIONS)."""
    return [sys.executable, "-m", "benchmarks.echo"]


def child_argv(role: str, result: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.transport_child", role, "--result", str(result), *args]


def read_result(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


# ------------------------------------------------------------------ statistics
def stats(times: Sequence[float]) -> dict[str, float]:
    ordered = sorted(times)
    p90 = ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]
    return {"median_ms": round(1e3 * statistics.median(ordered), 3), "p90_ms": round(1e3 * p90, 3),
            "mean_ms": round(1e3 * statistics.fmean(ordered), 3)}


def rate(nbytes: float, seconds: float) -> float:
    return round(nbytes / seconds / 1e6, 2) if seconds > 0 else 0.0


def iterations_for(numel: int, repeats: int) -> int:
    """Timed iterations: `repeats` from 10 M parameters up, proportionally more below (at most 10x)."""
    return max(repeats, min(10 * repeats, math.ceil(repeats * 1e7 / numel)))


def warmup_for(iterations: int, warmup: int) -> int:
    return max(warmup, iterations // 10)


def human(numel: int) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if numel >= div:
            value = numel / div
            return f"{value:g}{suffix}" if value == int(value) else f"{value:.3g}{suffix}"
    return str(numel)


# ------------------------------------------------------------------ measurements
def payload_chunks(numel: int, chunk_bytes: int) -> list[bytes]:
    import numpy as np

    from ps.wire import split

    data = np.random.default_rng(0).standard_normal(numel, dtype=np.float32)
    chunks = split(memoryview(data).cast("B"), chunk_bytes)
    del data
    return chunks


def measure_echo(procs: Processes, numel: int, iterations: int, warmup: int) -> list[dict[str, Any]]:
    from benchmarks.echo import EchoClient
    from ps.server import MAX_MESSAGE_BYTES
    from ps.wire import CHUNK_BYTES

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
    from ps.wire import itemsize

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


# ------------------------------------------------------------------ server overhead
class _Context:
    """Stands in for grpc.aio.ServicerContext: the servicer only calls abort()."""

    async def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"{code}: {details}")


def _timed(fn: Callable[..., Any], sink: list[float]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - t0)

    return wrapper


def _marked(chunks: Sequence[bytes], mark: dict[str, float]) -> Iterator[bytes]:
    """Yield the chunks, then note the time in mark["sent"] (gRPC asks for the next one once the last is written)."""
    yield from chunks
    mark["sent"] = time.perf_counter()


def _push_chunks(header: Any, payload: Sequence[bytes], mark: dict[str, float]) -> Iterator[Any]:
    """A push as PushClient sends it (header on the first chunk); mark["sent"] after the last."""
    from protos import ps_pb2

    for seq, data in enumerate(payload):
        yield ps_pb2.PushChunk(header=header if seq == 0 else None, seq=seq, data=data)
    mark["sent"] = time.perf_counter()


async def _apush_chunks(header: Any, payload: Sequence[bytes], mark: dict[str, float] | None) -> Any:
    """The same as an async request stream, each chunk parsed from its bytes as the server's request
    deserializer does (ps.handlers); with `mark`, notes when the stream has ended."""
    from protos import ps_pb2
    from ps.serialized import data_view_parser, with_data

    parse = data_view_parser(ps_pb2.PushChunk)
    for seq, data in enumerate(payload):
        yield parse(with_data(ps_pb2.PushChunk(header=header if seq == 0 else None, seq=seq), data))
    if mark is not None:
        mark["sent"] = time.perf_counter()


async def _serialize_all(replies: Any, serialize_s: list[float], done: list[float]) -> None:
    """Drain a servicer's reply stream, serializing each message as gRPC would; note when it is all out."""
    async for message in replies:
        t0 = time.perf_counter()
        if not isinstance(message, bytes):  # bytes: a reply chunk serialized once for every worker
            message.SerializeToString()
        serialize_s[0] += time.perf_counter() - t0
    done.append(time.perf_counter())


def measure_overhead_inprocess(numel: int, workers: int, iterations: int, warmup: int) -> dict[str, Any]:
    """The real servicer and coordinator in this process, driven the way gRPC drives them.

    Per step, `workers - 1` pushes go in first and wait for the round; then the last push's chunks are
    fed and the clock starts when its request stream ends (the last push has arrived). It stops when
    every worker's reply messages have been produced by ``ParameterServerServicer.Push`` and
    serialized as gRPC's response serializer does before writing them (``SerializeToString``; a chunk the
    servicer already serialized, bytes, passes through as it is). This is the Python
    work between the last push arriving and the replies leaving: payload check, accumulate, optimizer
    step (begun when the round closes and applied a piece at a time as the first reply streams),
    epoch bookkeeping, encoding the parameters once, building and serializing the replies.
    gRPC's own socket writes are not in it (``measure_overhead_outside`` has those).
    """
    from protos import ps_pb2
    from ps.server import build_job, build_parser, run_loop
    from ps.servicer import ParameterServerServicer
    from ps.wire import CHUNK_BYTES, encode, split

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as ps-server --threads 1
    args = build_parser().parse_args([*server_argv(numel, workers, "float32"), "--port", "0"])
    job = build_job(args)
    core = job.coordinator
    # components, timed by wrapping the instance's methods (the server's code is not touched); a method
    # that a later version renames just leaves its component null
    close_round: list[float] = []
    encode_times: list[float] = []
    finish_times: list[float] = []
    wrapped = {name: hasattr(core, name) for name in ("_close_round", "_current_payload", "begin_push")}
    if wrapped["_close_round"]:
        core._close_round = _timed(core._close_round, close_round)  # type: ignore[method-assign]
    if wrapped["_current_payload"]:
        core._current_payload = _timed(core._current_payload, encode_times)  # type: ignore[method-assign]
    if wrapped["begin_push"]:
        begin_push = core.begin_push

        def timed_begin_push(meta: Any) -> Any:
            receiver = begin_push(meta)
            receiver.finish = _timed(receiver.finish, finish_times)
            return receiver

        core.begin_push = timed_begin_push  # type: ignore[method-assign]
    servicer = ParameterServerServicer(core)
    ctx = _Context()
    grads = [split(encode(torch.randn(numel).mul_(1e-3)), CHUNK_BYTES) for _ in range(workers)]
    totals: list[float] = []
    serialize: list[float] = []
    close_per_step: list[float] = []
    encode_per_step: list[float] = []
    finish_last: list[float] = []

    async def run() -> None:
        joins = await asyncio.gather(*(servicer.Join(ps_pb2.JoinRequest(name=f"w{k}", cores=1.0), ctx)
                                       for k in range(workers)))
        ids = [j.worker_id for j in joins]
        secrets = [j.secret for j in joins]
        batch = [j.batch_size for j in joins]
        round_ = joins[0].round

        def push(k: int, mark: dict[str, float] | None, round_: int, ser: list[float], done: list[float]) -> Any:
            header = ps_pb2.PushHeader(worker_id=ids[k], round=round_, version=0, batch_size=batch[k],
                                       compute_ms=1.0, wire_dtype="float32", num_values=numel, secret=secrets[k])
            return _serialize_all(servicer.Push(_apush_chunks(header, grads[k], mark), ctx), ser, done)

        for step in range(warmup + iterations):
            marks: dict[str, float] = {}
            done: list[float] = []
            ser = [0.0]
            before = sum(w["updates"] for w in core.status()["workers"])
            first = [asyncio.create_task(push(k, None, round_, ser, done)) for k in range(workers - 1)]
            while sum(w["updates"] for w in core.status()["workers"]) < before + workers - 1:
                await asyncio.sleep(0)
            for _ in range(10):  # let the early pushes settle on the round future
                await asyncio.sleep(0)
            n_close, n_encode = len(close_round), len(encode_times)
            await asyncio.gather(*first, asyncio.create_task(push(workers - 1, marks, round_, ser, done)))
            if step >= warmup:
                totals.append(max(done) - marks["sent"])
                serialize.append(ser[0])
                close_per_step.append(sum(close_round[n_close:]))
                encode_per_step.append(sum(encode_times[n_encode:]))
                finish_last.append(finish_times[-1] if finish_times else 0.0)
            round_ += 1

    def component(values: list[float], method: str) -> float | None:
        return round(1e3 * statistics.median(values), 3) if wrapped[method] and values else None

    try:
        run_loop(run())
    finally:
        job.evaluator.close()
        job.metrics.close()
        torch.set_num_threads(threads)
    return {
        "method": "in-process: the real ParameterServerServicer.Push + Coordinator, fed PushChunk streams on an "
                  "asyncio (uvloop) loop; from the end of the last push's request stream to all replies "
                  "produced and serialized (SerializeToString, or bytes serialized by the servicer); gRPC socket I/O excluded",
        "numel": numel, "workers": workers, "wire_dtype": "float32", "iterations": len(totals),
        **stats(totals),
        "components_median_ms": {
            "last_push_finish": component(finish_last, "begin_push"),
            "close_round": component(close_per_step, "_close_round"),
            "payload_encode": component(encode_per_step, "_current_payload"),
            "reply_serialize_all_workers": round(1e3 * statistics.median(serialize), 3),
        },
        "components_note": "last_push_finish: ChunkReceiver.finish of the last push (length check; NaN/Inf was "
                           "checked chunk by chunk as they arrived); "
                           "close_round: Coordinator._close_round (accumulate result, begin the optimizer step, bookkeeping; "
                           "the step itself runs a piece at a time as the first reply streams, ps.store); "
                           "payload_encode: Coordinator._current_payload (the version's lazily framed chunks, ps.payload; "
                           "the framing happens as the replies are produced, inside the total); "
                           "reply_serialize_all_workers: SerializeToString of every reply message not already serialized",
    }


def measure_overhead_outside(procs: Processes, numel: int, workers: int, iterations: int, warmup: int) -> dict[str, Any]:
    """From the outside: `workers` client threads in this process, one channel each, released by a barrier
    to push at the same instant. Per step, the gap from the last push fully sent to the last worker's
    first reply chunk, on a real ps-server, minus the same gap on the echo server (store-and-forward,
    same bytes, same threads); medians of each. Noisy: client threads share this process and the CPUs."""
    import grpc

    from benchmarks.echo import STREAM_METHOD
    from protos import ps_pb2, ps_pb2_grpc
    from ps.wire import CHUNK_BYTES, FlatReceiver, encode, split
    from worker.client import CHANNEL_OPTIONS

    options = [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
    grads = [split(encode(torch.randn(numel).mul_(1e-3)), CHUNK_BYTES) for _ in range(workers)]

    def run_threads(body: Callable[[int, threading.Barrier, list[dict[str, float]]], None]) -> list[float]:
        barrier = threading.Barrier(workers)
        marks: list[list[dict[str, float]]] = [[] for _ in range(workers)]
        errors: list[BaseException] = []

        def target(k: int) -> None:
            try:
                body(k, barrier, marks[k])
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                barrier.abort()

        threads = [threading.Thread(target=target, args=(k,), daemon=True) for k in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        if any(t.is_alive() for t in threads):
            raise RuntimeError("overhead measurement: a client thread did not finish within 600 s")
        if errors:
            raise RuntimeError(f"overhead measurement failed: {errors[0]!r}") from errors[0]
        gaps = []
        for step in range(warmup, warmup + iterations):
            sent = max(marks[k][step]["sent"] for k in range(workers))
            first = max(marks[k][step]["first"] for k in range(workers))
            gaps.append(first - sent)
        return gaps

    argv = [sys.executable, "-m", "ps.server", *server_argv(numel, workers, "float32")]
    with server_processes(procs, [("ps-server-overhead", argv),
                                  ("echo-overhead", echo_argv())]) as (ps_target, echo_target):
        def ps_body(k: int, barrier: threading.Barrier, marks: list[dict[str, float]]) -> None:
            channel = grpc.insecure_channel(ps_target, options=options)
            try:
                stub = ps_pb2_grpc.ParameterServerStub(channel)
                joined = stub.Join(ps_pb2.JoinRequest(name=f"w{k}", cores=1.0), wait_for_ready=True, timeout=120)
                out = torch.empty(numel)
                round_, batch = joined.round, joined.batch_size
                for _ in range(warmup + iterations):
                    mark: dict[str, float] = {}
                    header = ps_pb2.PushHeader(worker_id=joined.worker_id, round=round_, version=0, batch_size=batch,
                                               compute_ms=1.0, wire_dtype="float32", num_values=numel,
                                               secret=joined.secret)

                    barrier.wait(60)
                    receiver = None
                    for message in stub.Push(_push_chunks(header, grads[k], mark)):
                        if receiver is None:
                            mark["first"] = time.perf_counter()
                            receiver = FlatReceiver(out, message.header.num_values, message.header.wire_dtype)
                            round_, batch = message.header.round, message.header.batch_size
                        receiver.feed(message.seq, message.data)
                    marks.append(mark)
                stub.Leave(ps_pb2.LeaveRequest(worker_id=joined.worker_id, secret=joined.secret))
            finally:
                channel.close()

        def echo_body(k: int, barrier: threading.Barrier, marks: list[dict[str, float]]) -> None:
            channel = grpc.insecure_channel(echo_target, options=options)
            stream = channel.stream_stream(STREAM_METHOD)
            try:
                for _ in range(warmup + iterations):
                    mark: dict[str, float] = {}

                    barrier.wait(60)
                    for i, _chunk in enumerate(stream(_marked(grads[k], mark))):
                        if i == 0:
                            mark["first"] = time.perf_counter()
                    marks.append(mark)
            finally:
                channel.close()

        ps_gaps = run_threads(ps_body)
        echo_gaps = run_threads(echo_body)

    ps_stats, echo_stats = stats(ps_gaps), stats(echo_gaps)
    return {
        "method": "outside: 4 client threads (one channel each) released by a barrier; per step the gap from the "
                  "last push fully sent to the last worker's first reply chunk, ps-server minus the echo server "
                  "(median_ms and p90_ms are differences of the two servers' percentiles, so p90 may be under the median)",
        "numel": numel, "workers": workers, "iterations": iterations,
        "median_ms": round(ps_stats["median_ms"] - echo_stats["median_ms"], 3),
        "p90_ms": round(ps_stats["p90_ms"] - echo_stats["p90_ms"], 3),
        "ps_gap": ps_stats, "echo_gap": echo_stats,
    }


# ------------------------------------------------------------------ profile
_PY_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*\.py):(?P<line>\d+)\)$")


def summarize_profile(raw_text: str, top: int = 12) -> dict[str, Any]:
    """Collapsed py-spy stacks (``--threads --native``) to hot spots.

    Per thread, the share of samples; for the thread running the event loop (MainThread), the share
    by innermost Python function (``<idle: epoll>`` when the leaf is an epoll wait), each with its
    hottest native leaves, and the hottest Python source lines.
    """
    threads: dict[str, int] = {}
    by_function: dict[str, int] = {}
    leaves: dict[str, dict[str, int]] = {}
    by_line: dict[str, int] = {}
    main = 0
    for line in raw_text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = frames[0] if frames[0].startswith("thread (") else "?"
        thread_name = thread.split(": ", 1)[-1]
        threads[thread_name] = threads.get(thread_name, 0) + count
        if thread_name != "MainThread":
            continue
        main += count
        leaf = frames[-1]
        python = [m for m in map(_PY_FRAME.match, frames) if m]
        if "epoll" in leaf.split(" ", 1)[0]:
            key = "<idle: epoll>"
        elif python:
            key = f"{python[-1]['func']} ({python[-1]['file']})"
            where = f"{python[-1]['func']} ({python[-1]['file']}:{python[-1]['line']})"
            by_line[where] = by_line.get(where, 0) + count
        else:
            key = "<no Python frame>"
        by_function[key] = by_function.get(key, 0) + count
        native = leaf if not _PY_FRAME.match(leaf) else "(Python)"
        native = re.sub(r"^0x[0-9a-f]+ \((.*)\)$", r"\1 (unnamed: memcpy-like)", native)
        short = native if len(native) <= 110 else native[:107] + "..."
        leaves.setdefault(key, {})
        leaves[key][short] = leaves[key].get(short, 0) + count

    def pct(n: int, total: int) -> float:
        return round(100.0 * n / max(1, total), 1)

    total = sum(threads.values())
    return {
        "samples": total,
        "threads_pct": {name: pct(n, total) for name, n in sorted(threads.items(), key=lambda kv: -kv[1])},
        "main_thread_samples": main,
        "main_thread_by_function": [
            {"function": name, "pct": pct(n, main),
             "native_leaves": [{"leaf": leaf, "pct": pct(m, main)}
                               for leaf, m in sorted(leaves[name].items(), key=lambda kv: -kv[1])[:3]]}
            for name, n in sorted(by_function.items(), key=lambda kv: -kv[1])[:top]
        ],
        "main_thread_by_line": [{"line": name, "pct": pct(n, main)}
                                for name, n in sorted(by_line.items(), key=lambda kv: -kv[1])[:top]],
    }


def profile_server(procs: Processes, numel: int, wire_dtype: str, steps: int) -> dict[str, Any]:
    """A one-worker push+pull with py-spy attached to the ps-server (``--native --threads``).

    py-spy attaches once the server listens (startup is not in the profile) and stops with SIGINT
    (it then writes its collapsed stacks) after the client's last step.
    """
    import shutil

    pyspy = shutil.which("py-spy")
    if pyspy is None:
        return {"error": "py-spy is not installed (pip install py-spy)"}
    raw = procs.workdir / f"profile-{numel}-{wire_dtype}.txt"
    result = procs.workdir / f"profile-client-{numel}.json"
    argv = [sys.executable, "-m", "ps.server", *server_argv(numel, 1, wire_dtype)]
    with server_process(procs, "ps-server-profiled", argv) as target:
        server = procs.find("ps-server-profiled")
        spy = procs.start("py-spy", [pyspy, "record", "--pid", str(server.pid), "--rate", "200", "--native",
                                     "--threads", "--format", "raw", "--output", str(raw)])
        time.sleep(1.0)  # let py-spy attach
        if spy.poll() is not None:
            return {"error": f"py-spy exited {spy.returncode}: {procs.log_tail(spy)}"}
        client = procs.start("ps-client-profiled", child_argv("ps-client", result, "--target", target,
                                                              "--wire-dtype", wire_dtype, "--steps", str(steps),
                                                              "--warmup", "1"))
        try:
            procs.wait_all([client], 900, "profiled push+pull")
        finally:
            procs.stop(client)
        spy.send_signal(signal.SIGINT)  # py-spy writes the profile on Ctrl-C
        try:
            spy.wait(timeout=60)
        finally:
            procs.stop(spy)
    if not raw.exists():
        return {"error": f"py-spy wrote no profile: {procs.log_tail(spy)}"}
    times = read_result(result)["times"]
    from ps.wire import itemsize

    return {
        "tool": "py-spy record --native --threads --rate 200, attached to ps-server (1 worker) after it listens",
        "numel": numel, "wire_dtype": wire_dtype, "workers": 1, "steps": len(times), **stats(times),
        "mb_per_s_while_profiled": rate(2 * numel * itemsize(wire_dtype) * len(times), sum(times)),
        **summarize_profile(raw.read_text(encoding="utf-8", errors="replace")),
        "raw": str(raw),
    }


# ------------------------------------------------------------------ report
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
                          row and row["ratio_to_grpc_ceiling"], ">=", 0.8,
                          f"ps_push_pull float32 W=1 numel={n} mb_per_s / grpc_stream_echo mb_per_s"))
    for n in target_sizes(sizes):
        row = find("ps_push_pull", n, wire_dtype="bfloat16", workers=1, shards=1)
        out.append(target(f"bf16 push+pull, 1 worker, {human(n)} params: effective parameters/s vs torch rpc",
                          row and row["params_per_s_ratio_to_torch_rpc"], ">=", 1.0,
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


# ------------------------------------------------------------------ command line
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
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        resolve_defaults(args)
    except ValueError as exc:
        parser.error(str(exc))
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
