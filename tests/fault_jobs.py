"""The job, the workers' flags and the polling that the fault tests with real processes share: a
server's status as a dict, and a wait that says what it waited for."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ps.checkpoint import checkpoint_files, read_checkpoint
from tests.processes import Cluster, start_server
from worker.transport.client import PSClient, ServerError

JOB = ["--mode", "bsp", "--workers", "4", "--model-arg", "hidden=256", "--dataset", "digits", "--global-batch", "128",
       "--lr", "0.1", "--evict-after", "3", "--grace", "5"]
NAMES = ["w0", "w1", "w2", "w3"]
TARGET = 0.90


def status(target: str) -> dict:
    client = PSClient(target)
    try:
        s = client.status()
        return {"round": s.round, "epoch": s.epoch, "done": s.done,
                "workers": {w.name: w.batch_size for w in s.workers}}
    finally:
        client.close()


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll until predicate() holds; returns the time it took."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            if predicate():
                return time.monotonic() - start
        except ServerError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


WORKER = ("--retry-for", "60", "--slowdown", "100")  # ~0.1 s steps: long enough to inject faults mid-run


def resume_after_kill(cluster: Cluster, ckpt: Path, workdir: Path, job: Sequence[str],
                      names: Sequence[str]) -> tuple[Cluster, int]:
    """`kill -9` of `cluster`'s server, then one started in `workdir` on its port with `job`, resumed
    from `ckpt` with --epochs two past the newest checkpoint's: the workers `names`, still retrying,
    rejoin and end with it (each exits 0). The resumed server and its --epochs. The kill waits for the
    first checkpoint's file: the server reports an epoch before its checkpoint is written in the background."""
    wait_for(lambda: bool(checkpoint_files(ckpt)), 60, "the first checkpoint")
    cluster.server.kill()
    cluster.server.wait()
    epochs = read_checkpoint(checkpoint_files(ckpt)[-1])["epoch"] + 2
    workdir.mkdir(exist_ok=True)
    resumed = start_server(workdir, [*job, "--epochs", str(epochs), "--resume", str(ckpt)], port=cluster.port)
    resumed.workers = cluster.workers
    assert resumed.wait(120) == 0, resumed.server_log()
    for name, proc in zip(names, cluster.workers, strict=True):
        assert proc.wait(30) == 0, cluster.worker_log(name)
        assert f"{name}: rejoined {cluster.target} as " in cluster.worker_log(name)
    return resumed, epochs


def wait_for_events(cluster: Cluster, kind: str, timeout: float = 60) -> list[dict]:
    """The metrics log's `kind` events, once there is one."""
    wait_for(lambda: bool(cluster.events(kind)), timeout, f"a {kind} event")
    return cluster.events(kind)
