"""`connect()`: reach a parameter server, set torch's thread count, measure the job's memory per
sample where the caller gives no bound, and join, giving back the training Session."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import torch
from torch.utils.data import Dataset as TorchDataset

from worker.transport.client import PSClient
from worker.data.loader import LoaderOptions
from worker.data.memory_probe import declared_max_batch
from worker.transport.reconnect import Waiting, wait_for_server
from worker.probes.resources import DEFAULT_THREADS, default_cores
from worker.runtime import Session
from worker.data.slices import OwnData



def connect(
    target: str,
    name: str | None = None,
    cores: float | None = None,
    slowdown: float = 1.0,
    timeout: float = 60.0,
    *,
    retry_for: float = 120.0,
    device: torch.device | None = None,
    threads: int | None = DEFAULT_THREADS,
    step_overhead_ms: float = 0.0,
    max_batch: int | None = None,
    overlap: bool = True,
    loader: LoaderOptions = LoaderOptions(),
    dataset: TorchDataset | None = None,
    dataset_fingerprint: str = "",
    token: str | None = None,
    tls_ca: str | os.PathLike[str] | None = None,
    tls_cert: str | os.PathLike[str] | None = None,
    tls_key: str | os.PathLike[str] | None = None,
    allow_imports: Sequence[str] = (),
    allow_shard_hosts: Sequence[str] = (),
) -> Session:
    """Join the parameter server at `target` (HOST:PORT); blocks until the job starts.

    A server that does not answer is waited for up to `timeout` seconds, and one lost mid-job up to
    `retry_for`, saying so on the ``worker`` logger within a few seconds and then every ten. Every call
    to the server has a deadline from `timeout` too (``ps-worker --timeout``; worker/transport/call_bounds.py).
    `threads` sets torch's thread count for this process, as ``ps-worker --threads`` does (default 1:
    see :data:`DEFAULT_THREADS`; None leaves torch's own setting).
    `device` is where the model computes (default the CPU; `worker.device.resolve_device("auto")`
    picks a GPU when there is one). `step_overhead_ms` adds that much CPU work to every step (a fixed cost).
    `overlap` False pushes the whole gradient after backward even where the job streams buckets during
    it (``ps-worker --no-overlap``; the job's ``ps-server --no-overlap`` turns it off for every worker).
    `loader` says how batches are read: loader processes and batches prepared ahead (worker/data/loader.py).
    `tls_ca` (a PEM file) turns on TLS, `tls_cert`/`tls_key` add a client certificate (mutual TLS),
    and `token` is sent with every call; see docs/security.md.
    `allow_imports`: modules (and their submodules) a job's ``module:function`` model or dataset may
    come from (``ps-worker --allow-import``); the built-in ones need none, and a job naming any other
    module is refused before it is imported. `allow_shard_hosts`: hosts besides the server's own
    where this worker follows the server to its shard servers (``ps-worker --allow-shard-host``).
    `max_batch` is the most samples this worker's memory holds, told to the server at Join (None:
    measured on the job's model before joining, worker/data/memory_probe.py).
    `dataset` is your own training set, trained on instead of the job's (``session.batches()`` yields its
    batches, each the slice of the epoch's permutation the server hands out under ``--sampling exact``):
    its length, and `dataset_fingerprint` if given, are declared at Join, and a server whose training set
    has another length (or whose first worker declared another fingerprint) refuses the join
    (FAILED_PRECONDITION naming both). See docs/data.md.
    """
    if threads is not None and not (isinstance(threads, int) and threads >= 1):
        raise ValueError(f"threads must be a whole number >= 1 (or None: torch's own setting), got {threads!r}")
    who = name or f"{os.uname().nodename}-{os.getpid()}"
    client = PSClient(target, token=token, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key,
                      allowed_shard_hosts=allow_shard_hosts, timeout=timeout)
    try:
        waiting = Waiting(who, target, time.monotonic() + timeout, "--timeout")
        wait_for_server(client, waiting)
        waiting.recovered(f"server {target} answered")
        if threads is not None:
            torch.set_num_threads(threads)
        # the job spec from Status: its model is measured before joining (worker/data/memory_probe.py)
        declared = declared_max_batch(client.job_spec, device, max_batch, allow_imports)
        own = None if dataset is None else OwnData(dataset, dataset_fingerprint)
        client.declared = own.declared() if own is not None else (0, "")
        return Session(client, who, cores or default_cores(), slowdown, retry_for, device, step_overhead_ms,
                       declared.max_batch, declared.pass_samples, overlap=overlap, built=declared.built, loader=loader,
                       allowed_imports=allow_imports, data=own)
    except BaseException:
        client.close()
        raise
