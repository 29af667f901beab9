"""What a worker's path needs beside its model: on the collective fast path (--allreduce) the group's
collective, whose copy of the parameters the model's are views of; on the PS path the flat parameters
the replies are decoded into and, in BSP, the gradient's buckets pushed while backward runs
(worker/paths/overlap.py) and the reply taken during the next forward (worker/paths/forward_order.py). Built at
the start and again when --allreduce auto's trial switches the job's path (ps/rounds/path_trial.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from common.job.spec import JobSpec
from common.transport.layout import load_flat
from worker.paths.collective import Collective
from worker.paths.forward_order import ForwardOrder
from worker.transport.arrivals import Arrivals
from worker.paths.overlap import BucketPush


class ProcessSession:
    """A session counted among its process's open ones until `close()`. torch.distributed keeps one
    process group per process, so only a process's only session can follow a switch onto the fast
    path (`only`: what JoinRequest.switch_paths says)."""

    _open = 0
    _lock = threading.Lock()

    def __init__(self) -> None:
        with ProcessSession._lock:
            ProcessSession._open += 1
            self.only = ProcessSession._open == 1
        self._counted = True

    def close(self) -> None:
        with ProcessSession._lock:
            if self._counted:
                self._counted = False
                ProcessSession._open -= 1


@dataclass
class PathParts:
    collective: Collective | None
    params: torch.Tensor  # flat fp32 on the CPU: the wire's and the collective's buffer
    grads: torch.Tensor
    on_device: tuple[torch.Tensor, torch.Tensor] | None  # a GPU's copy of (params, grads)
    buckets: BucketPush | None
    forward: ForwardOrder | None
    arrivals: Arrivals

    @classmethod
    def build(cls, spec: JobSpec, model: nn.Module, params: torch.Tensor, device: torch.device, overlap: bool,
              stores: Callable[[int, timedelta], dist.Store], timeout_s: float) -> PathParts:
        """The parts for `spec`'s path, from the flat parameters `params`, whose values the model holds
        (its parameters then views of the parts' params, or on a GPU loaded from them); `overlap`: the
        worker allows it."""
        collective = None
        if spec.allreduce:  # its copy starts from the model's values
            collective = Collective(spec, model, stores, timeout_s=timeout_s, device=device)
            params = collective.params
        grads = torch.empty_like(params)
        on_device = None
        if device.type != "cpu":
            on_device = (torch.empty_like(params, device=device), torch.empty_like(params, device=device))
        load_flat(model, params if on_device is None else on_device[0].copy_(params))
        buckets = BucketPush(model, grads) if overlap and spec.overlap and spec.mode == "bsp" and not spec.allreduce else None
        arrivals = Arrivals()
        views = on_device is None and all(p.dtype == params.dtype for p in model.parameters())
        forward = ForwardOrder(model, arrivals) if buckets is not None and views else None
        return cls(collective, params, grads, on_device, buckets, forward, arrivals)

    def close(self) -> None:
        """Remove the hooks and leave the group (before other parts take over, or at the end)."""
        for hooks in (self.buckets, self.forward):
            if hooks is not None:
                hooks.remove()
        if self.collective is not None:
            self.collective.close()
