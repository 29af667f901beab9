"""What every benchmark process trains: one model, one data set, one optimizer, built the same way.

The parameter server, the solo runs (``benchmarks.solo``) and the DDP baseline
(``benchmarks.ddp_baseline``) all build their model and data from a :class:`Workload`, through the
same registry calls the server and the workers use (``common.job.models.build_model``,
``common.job.datasets.build_dataset``), so the throughput they report is for the same work.

This module also holds the small process helpers the benchmark drivers share: start a child in a
CPU cgroup before it execs, and stop exactly the children this process started.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from common.ops.memory import heap_reserve_mib, tune_for_training

CHILD_ENV = {
    **os.environ,
    "PYTHONUNBUFFERED": "1",
    "PYTHONWARNINGS": "ignore",
    # one compute thread per emulated worker; the quota is the only source of speed
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    # gloo picks an interface from the host name otherwise, which may not resolve in a sandbox
    "GLOO_SOCKET_IFNAME": "lo",
}


@dataclass(frozen=True)
class Workload:
    """Model, data and optimizer settings, as ``ps-server`` flags take them (``K=V`` options)."""

    model: str = "cnn"
    model_args: tuple[str, ...] = ()
    dataset: str = "synthetic"
    dataset_args: tuple[str, ...] = ("size=4096",)
    global_batch: int = 512
    lr: float = 0.02  # 0.05 spiked (loss back to ~2.3) after converging in ~1 run in 3, either path
    momentum: float = 0.9
    seed: int = 0

    def cli_args(self) -> list[str]:
        """The model/data/seed flags, accepted alike by ``ps-server`` and the benchmark children."""
        args = ["--model", self.model, "--dataset", self.dataset, "--seed", str(self.seed)]
        for option in self.model_args:
            args += ["--model-arg", option]
        for option in self.dataset_args:
            args += ["--dataset-arg", option]
        return args

    def describe(self) -> dict[str, Any]:
        """JSON form, for the report."""
        return {
            "model": self.model,
            "model_args": list(self.model_args),
            "dataset": self.dataset,
            "dataset_args": list(self.dataset_args),
            "global_batch": self.global_batch,
            "lr": self.lr,
            "momentum": self.momentum,
            "seed": self.seed,
        }


def add_child_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of :meth:`Workload.cli_args` plus the optimizer, for a child entry point."""
    parser.add_argument("--model", default="cnn", help="built-in model or package.module:function")
    parser.add_argument("--model-arg", action="append", default=[], metavar="K=V", help="model option")
    parser.add_argument("--dataset", default="synthetic", help="built-in data set or package.module:function")
    parser.add_argument("--dataset-arg", action="append", default=[], metavar="K=V", help="data set option")
    parser.add_argument("--seed", type=int, default=0, help="model initialisation and data split")
    parser.add_argument("--lr", type=float, default=Workload.lr, help="SGD learning rate")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")


def tune_like_a_worker(prog: str) -> bool:
    """Apply ps-worker's allocator settings (its heap reserve from $PS_WORKER_HEAP_RESERVE_MIB), so a
    baseline process is measured as the workers are; False, with one line on stderr, for a bad value."""
    try:
        reserve = heap_reserve_mib()
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return False
    tune_for_training(reserve)
    return True


def build(args: argparse.Namespace) -> tuple[Any, Any]:
    """``(model, dataset)`` from a child's parsed workload flags, seeded like the server's."""
    from common.job.datasets import build_dataset
    from common.job.models import build_model
    from ps.server_flags import parse_options

    dataset = build_dataset(args.dataset, parse_options(args.dataset_arg), args.seed)
    model = build_model(args.model, dataset.input_shape, dataset.num_classes, parse_options(args.model_arg), args.seed)
    return model, dataset


def spawn(
    argv: Sequence[str],
    *,
    preexec: Callable[[], None] | None = None,
    stdout: int | IO[Any] | None = subprocess.PIPE,
    log: Path | None = None,
) -> subprocess.Popen:
    """Start ``python argv...`` in its own session, placed by ``preexec`` (a cgroup) before it execs.

    stderr goes to ``log`` (or is dropped); the child's own session keeps a Ctrl-C in the terminal
    from reaching it before the driver has had the chance to stop it in order.
    """
    err = open(log, "w", encoding="utf-8") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    try:
        return subprocess.Popen(
            [sys.executable, *argv],
            stdout=stdout,
            stderr=err,
            env=CHILD_ENV,
            preexec_fn=preexec,  # noqa: PLW1509 -- the child must enter its cgroup before it execs
            start_new_session=True,
            text=True,
        )
    finally:
        if log is not None:
            err.close()  # type: ignore[union-attr]


def stop(procs: Sequence[subprocess.Popen], grace_s: float = 3.0) -> None:
    """Terminate, then kill, the given children (each by its own pid) and reap them."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
