"""--allreduce: how a worker learns of the server's group generations while its own group fails or
forms (header-only pulls: no parameters move)."""

from __future__ import annotations

import time

import torch

from common.transport.messages import StepHeader
from worker.transport.client import PSClient, ServerError


def generation_stands(client: PSClient, worker_id: str, params: torch.Tensor, generation: int) -> bool:
    """Whether the server still trains in `generation` (asked while a group forms)."""
    plan = client.pull(worker_id, params, header_only=True)
    return plan.group.generation == generation and not plan.done


def await_regroup(client: PSClient, worker_id: str, params: torch.Tensor, failed: StepHeader,
                  retry_for: float) -> StepHeader:
    """Poll the server (headers only) until it starts a group generation after `failed`'s, or ends the
    job; DEADLINE_EXCEEDED after `retry_for` seconds without one."""
    deadline = time.monotonic() + retry_for
    delay = 0.02
    while True:
        plan = client.pull(worker_id, params, header_only=True)
        if plan.done or plan.group.generation != failed.group.generation:
            return plan
        if time.monotonic() > deadline:
            raise ServerError(
                "DEADLINE_EXCEEDED",
                f"the process group of generation {failed.group.generation} failed and the server formed no new one "
                f"within {retry_for:.0f}s",
            )
        time.sleep(delay)
        delay = min(0.5, delay * 2)
