"""The collective fast path's jobs and calls, shared by its tests: the tiny in-process job, reports and
snapshots as a rank sends them, the job for real processes and the check that all of them ended well."""

from __future__ import annotations

import concurrent.futures
import signal
import subprocess

import grpc
import torch

from protos import ps_pb2
from tests.processes import Cluster
from tests.rpc_calls import TIMEOUT, header, push_chunks

Code = grpc.StatusCode
# a tiny job for the in-process tests: 64 training samples, so an epoch is two rounds of 32
TINY = ["--allreduce", "--dataset", "synthetic", "--dataset-arg", "size=80", "--dataset-arg", "image_size=4",
        "--dataset-arg", "channels=1", "--global-batch", "32", "--controller", "uniform", "--epochs", "2"]


def call(stub, chunks: list[ps_pb2.PushChunk]) -> ps_pb2.ParamsHeader:
    """A push whose reply carries no parameters: returns the header."""
    messages = list(stub.Push(iter(chunks), timeout=TIMEOUT))
    assert messages[0].header.num_values == 0 and all(not m.data for m in messages)
    return messages[0].header


def report(worker_id: str, round: int, batch: int = 16, generation: int = 0) -> list[ps_pb2.PushChunk]:
    return push_chunks(header(worker_id, 0, round=round, batch_size=batch, kind=ps_pb2.PUSH_REPORT, generation=generation),
                       torch.empty(0))


def snapshot_push(worker_id: str, values: torch.Tensor, round: int) -> list[ps_pb2.PushChunk]:
    return push_chunks(header(worker_id, values, round=round, batch_size=0, kind=ps_pb2.PUSH_SNAPSHOT), values)


def report_round(ps_server_stub, threads: concurrent.futures.Executor, ids: dict[str, str], round: int) -> dict[str, ps_pb2.ParamsHeader]:
    futures = {name: threads.submit(call, ps_server_stub(), report(wid, round)) for name, wid in ids.items()}
    return {name: f.result(TIMEOUT) for name, f in futures.items()}


JOB = ["--model-arg", "hidden=16", "--dataset", "digits", "--controller", "uniform", "--evict-after", "60", "--grace", "5"]


def finish(cluster: Cluster, timeout: float, killed: subprocess.Popen | None = None) -> None:
    code = cluster.wait(timeout)
    assert code == 0, cluster.server_log()
    for i, proc in enumerate(cluster.workers):
        assert proc.returncode == (-signal.SIGKILL if proc is killed else 0), cluster.worker_log(f"w{i}")
