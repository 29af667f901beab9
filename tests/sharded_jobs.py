"""The --shards jobs of the end-to-end tests: the job, two workers joined at the static plan's batch
sizes training on fixed gradients, and the comparison of parameters up to fp32 rounding."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from common.transport.messages import PushMeta, PushTimes
from worker.transport.client import Joined, PSClient

JOB = ["--mode", "bsp", "--workers", "2", "--model-arg", "hidden=32", "--dataset", "digits", "--global-batch", "64",
       "--controller", "static", "--lr", "0.05", "--momentum", "0.9", "--weight-decay", "0.001", "--epochs", "50",
       "--grace", "1", "--quiet"]
BATCHES = (20, 44)  # the static plan of the workers' declared cores
ROUNDS = 6


def both(work: Callable[[int], Any]) -> list[Any]:
    """work(0) and work(1) on two threads at once (BSP: each waits for the other's push); their results."""
    results: dict[int, Any] = {}
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            results[k] = work(k)
        except BaseException as exc:  # noqa: BLE001 (re-raised in the test thread)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return [results[0], results[1]]


def join_two(target: str) -> list[tuple[PSClient, Joined]]:
    """Workers w0 and w1 joined (cores BATCHES: the static plan gives them those batch sizes)."""
    def join(k: int) -> tuple[PSClient, Joined]:
        client = PSClient(target)
        return client, client.join(f"w{k}", float(BATCHES[k]), timeout=60)

    return both(join)


def train(workers: list[tuple[PSClient, Joined]], rounds: int = ROUNDS) -> torch.Tensor:
    """Both workers push fixed gradients (seeded by round and worker) for `rounds` rounds; the
    parameters they end with (both must agree)."""
    def work(k: int) -> torch.Tensor:
        client, joined = workers[k]
        params = torch.empty(joined.layout.numel)
        plan = client.pull(joined.worker_id, params)
        for r in range(rounds):
            grad = torch.randn(joined.layout.numel, generator=torch.Generator().manual_seed(1000 * r + k))
            assert plan.batch_size == BATCHES[k]
            plan = client.push(PushMeta(joined.worker_id, plan.round, plan.version, plan.batch_size, PushTimes(1.0),
                                        "float32"), grad, params)
        return params.clone()

    results = both(work)
    assert torch.equal(results[0], results[1])
    return results[0]


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to fp32 rounding: torch's vectorized loops may fuse a multiply-add (FMA) where the
    scalar tail at a range's end does not, so a value can differ in its last bit (1e-7 here)."""
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-6, atol=1e-6)
