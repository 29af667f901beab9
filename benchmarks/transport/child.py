"""Child processes of the transport benchmark (``benchmarks.transport``); not meant to be run by hand.

Each role runs in its own process, times its iterations and writes one JSON object to ``--result``:

- ``ps-client``: one parameter-server worker driven through ``worker.transport.client.PSClient``: join, pull,
  then push a fixed random gradient with the open round and receive the new parameters, per step.
- ``torch-rpc``: one rank of a ``torch.distributed.rpc`` pair (TensorPipe); rank 0 sends the tensor to
  rank 1, which returns it (``rpc_echo``).
- ``gloo``: one rank of a ``torch.distributed`` gloo group timing ``all_reduce``.

Times are ``time.perf_counter`` per iteration; ``start``/``end`` of the timed section are ``time.time``
(comparable across processes on one machine) so the parent can compute an aggregate window.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.cpu_time import CpuWindow
from common.ops.memory import tune_malloc


def _write(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record), encoding="utf-8")
    tmp.replace(path)


def _target_from_file(path: Path, timeout: float) -> str:
    """Wait for the server's --port-file (this process starts while the server is still starting)."""
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no server port in {path} after {timeout:.0f}s")
        time.sleep(0.02)
    return f"127.0.0.1:{int(path.read_text())}"


def ps_client(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from common.transport.messages import PushMeta, PushTimes
    from common.transport.wire import itemsize
    from worker.transport.client import PSClient, ServerError

    torch.set_num_threads(1)
    client = PSClient(args.target or _target_from_file(args.target_file, args.timeout))
    try:
        joined = client.join(args.name, cores=1.0, timeout=args.timeout)
        numel = joined.layout.numel
        out = torch.empty(numel)
        plan = client.pull(joined.worker_id, out)
        gen = torch.Generator().manual_seed(args.seed)
        grad = torch.randn(numel, generator=gen).mul_(1e-3)
        times: list[float] = []
        start = end = 0.0
        cpu = CpuWindow(args.server_pid)
        for i in range(args.warmup + args.steps):
            if i == args.warmup:
                start = time.time()
                cpu.start()
            t0 = time.perf_counter()
            plan = client.push(PushMeta(joined.worker_id, plan.round, plan.version, plan.batch_size, PushTimes(),
                                        args.wire_dtype), grad, out)
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
            if plan.done:
                raise RuntimeError(f"the job ended after step {i} ({plan.reason}); raise --epochs or the dataset size")
        end = time.time()
        cpu.stop()
        with contextlib.suppress(ServerError):  # the parent stops the server anyway
            client.leave(joined.worker_id)
    finally:
        client.close()
    return {"name": args.name, "numel": numel, "wire_dtype": args.wire_dtype,
            "bytes_per_step": 2 * numel * itemsize(args.wire_dtype), "times": times, "start": start, "end": end,
            "cpu_s": cpu.own_s, "server_cpu_s": cpu.other_s}


def torch_rpc(args: argparse.Namespace) -> dict[str, Any] | None:
    import torch
    from torch.distributed import rpc

    from benchmarks.echo import rpc_echo

    torch.set_num_threads(1)
    kwargs: dict[str, Any] = {"init_method": f"tcp://127.0.0.1:{args.port}", "rpc_timeout": args.timeout,
                              "num_worker_threads": 4}
    if args.tcp_only:
        kwargs.update(_transports=["uv"], _channels=["basic"])
    options = rpc.TensorPipeRpcBackendOptions(**kwargs)
    name = "caller" if args.rank == 0 else "callee"
    rpc.init_rpc(name, rank=args.rank, world_size=2, rpc_backend_options=options)
    record = None
    try:
        if args.rank == 0:
            tensor = torch.randn(args.numel)
            times: list[float] = []
            for i in range(args.warmup + args.steps):
                t0 = time.perf_counter()
                back = rpc.rpc_sync("callee", rpc_echo, args=(tensor,))
                if i >= args.warmup:
                    times.append(time.perf_counter() - t0)
                if back.numel() != tensor.numel():
                    raise RuntimeError("torch rpc returned a tensor of the wrong size")
                del back
            record = {"numel": args.numel, "bytes_per_iter": 2 * args.numel * 4, "times": times,
                      "tcp_only": args.tcp_only}
    finally:
        rpc.shutdown()
    return record


def gloo(args: argparse.Namespace) -> dict[str, Any] | None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world, timeout=timedelta(seconds=args.timeout))
    record = None
    try:
        tensor = torch.ones(args.numel)
        times: list[float] = []
        dist.barrier()
        for i in range(args.warmup + args.steps):
            t0 = time.perf_counter()
            dist.all_reduce(tensor)
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
            tensor.fill_(1.0)
        dist.barrier()
        if args.rank == 0:
            record = {"numel": args.numel, "world": args.world, "bytes": args.numel * 4, "times": times}
    finally:
        dist.destroy_process_group()
    return record


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.transport.child",
                                description="A child process of benchmarks.transport (not for direct use).")
    p.add_argument("role", choices=["ps-client", "torch-rpc", "gloo"])
    p.add_argument("--result", type=Path, required=True, help="write the JSON result here")
    p.add_argument("--steps", type=int, required=True, help="timed iterations")
    p.add_argument("--warmup", type=int, default=1, help="untimed iterations first")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for joins and collectives")
    p.add_argument("--target", help="ps-client: the server's HOST:PORT")
    p.add_argument("--target-file", type=Path, help="ps-client: or wait for the server's --port-file (127.0.0.1)")
    p.add_argument("--name", default="w0", help="ps-client: worker name")
    p.add_argument("--wire-dtype", default="float32", help="ps-client: dtype on the wire")
    p.add_argument("--seed", type=int, default=0, help="ps-client: seed of the random gradient")
    p.add_argument("--server-pid", type=int, default=0,
                   help="ps-client: also read this process's CPU time over the timed steps (0: none)")
    p.add_argument("--numel", type=int, help="torch-rpc/gloo: float32 values")
    p.add_argument("--port", type=int, help="torch-rpc/gloo: rendezvous port on 127.0.0.1")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--tcp-only", action="store_true", help="torch-rpc: TensorPipe uv transport and basic channel only")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    tune_malloc()  # as ps-server and ps-worker do, so every side of a comparison gets it
    args = build_parser().parse_args(argv)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("TP_SOCKET_IFNAME", "lo")
    role = {"ps-client": ps_client, "torch-rpc": torch_rpc, "gloo": gloo}[args.role]
    record = role(args)
    if record is not None:
        _write(args.result, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
