"""The BSP collective fast path on a worker (`ps-server --allreduce`).

Every step: write `b_k·g_k` (then `b_k` and the round, as a check) into one contiguous buffer,
all-reduce it (SUM) over torch.distributed in buckets of at most 25 MB, divide by the reduced `Σ b`,
which gives the server's batch-weighted mean (Eq. 4b/4c), and take the server's optimizer step
(`common.params.store.ParameterStore`, the same optimizer and LR schedule) on this worker's copy of the
parameters. Every worker takes the identical step, so the copies stay equal without the server.

A process group lives for one generation; the server starts a new one at every membership change.
It meets at that generation's store (`stores`: worker.paths.group_store's, kept by the server). When a group
forms, its ranks agree on the most advanced copy (the highest round; the lowest rank among equals) and broadcast its
parameters and optimizer state, which brings a newcomer (started from the server's last snapshot)
up to date. NCCL needs CUDA tensors: with it the bucket lives on the worker's GPU (its compute device),
so the gradients reach it without a trip through the CPU; the optimizer's copy stays fp32 on the CPU.

The group of one generation is process_group.py's, the two ways its ranks sum a bucket bucket_sum.py's;
this module holds the worker's copy and its step.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from common.job.spec import JobSpec
from common.params.aggregation import squared_norm
from common.params.store import ParameterStore
from common.transport.layout import flatten_params
from common.transport.messages import StepHeader
from worker.paths.bucket_sum import BucketSum
from worker.paths.process_group import CollectiveError, ProcessGroup, most_advanced
from worker.transport.client import ServerError

BUCKET_BYTES = 25 * 1024 * 1024
ROUND_CHECK_MODULUS = 4096
"""Each rank adds its round modulo this into the fp32 bucket: the sum stays exact (under 2^24) for any
round and up to 4096 ranks, and a rank one round or a few out of step still shows."""


class Collective:
    """One worker's side of the fast path: the process group of the current generation, the
    bucketed batch-weighted all-reduce, and the optimizer step on the local parameter copy."""

    def __init__(
        self, spec: JobSpec, model: nn.Module, stores: Callable[[int, timedelta], dist.Store], timeout_s: float = 120.0,
        bucket_bytes: int = BUCKET_BYTES, device: torch.device | None = None,
    ) -> None:
        """`stores(generation, timeout)`: the store group `generation` meets at (its keys its own)."""
        self.spec = spec
        self.local = ParameterStore(flatten_params(model).cpu(), spec)
        self.process_group = ProcessGroup(stores, timedelta(seconds=timeout_s), device or torch.device("cpu"))
        self.sum = BucketSum(max(1, bucket_bytes // 4))
        self.sq_norms = (0.0, 0.0)  # the last reduce's |g_k|² and |g|² (float64; 0: not measured), for the round's report
        self.round = -1  # the round this copy is at (known once a group has formed)
        self.reduces = 0
        self._bucket: torch.Tensor | None = None

    @property
    def bucket_numel(self) -> int:
        """The most values one part of the bucket holds (BUCKET_BYTES of fp32)."""
        return self.sum.bucket_numel

    @property
    def params(self) -> torch.Tensor:
        """The local copy of the parameters (flat fp32); the worker's model is loaded from it."""
        return self.local.flat

    @property
    def state_numel(self) -> int:
        """How many values the optimizer's flat state holds once it has stepped (0: it keeps none)."""
        return self.local.optimizer_state_numel

    def snapshot(self) -> torch.Tensor:
        """What rank 0 sends when the server asks: the parameters, then the optimizer's flat state
        (common.params.flat_state) once it has stepped."""
        state = self.local.flat_optimizer_state()
        return self.params if state is None else torch.cat([self.params, state])

    def load_optimizer_state(self, values: torch.Tensor | None) -> None:
        """Take the server's optimizer state (None: not stepped yet) with its parameters, after a join."""
        self.local.load_flat_optimizer_state(values)

    def rejoined(self) -> None:
        """The worker joined again (a new id): the next step forms a new group."""
        self.close_group()
        self.round = -1  # the caller loads the server's parameters: a peer's copy wins at the next sync

    # --------------------------------------------------------------- the group
    def ensure_group(self, plan: StepHeader, is_current: Callable[[int], bool] | None = None) -> None:
        """Form the plan's generation unless this worker is already in it, and adopt the group's most
        advanced copy (`is_current`: process_group.ProcessGroup.join)."""
        group = plan.group
        if self.process_group.formed(group.generation):
            return
        store, device = self.process_group.prepare(group)
        try:
            self.process_group.join(group, store, device, is_current)
            self._sync(plan.round + 1)
        except (CollectiveError, ServerError):
            self.process_group.close()
            raise
        except (RuntimeError, ValueError, MemoryError) as exc:  # DistBackendError / DistNetworkError are RuntimeErrors;
            # a store value gloo cannot parse (a hostile server's) is a ValueError or std::bad_alloc's MemoryError
            self.process_group.close()
            raise CollectiveError(f"could not form group generation {group.generation}: {exc}") from exc

    def _sync(self, cap: int) -> None:
        """Adopt the most advanced copy in the group (highest round, then lowest rank) that is at most
        at round `cap` (the server's round, plus one for a copy that already applied it)."""
        pg = self.process_group
        rounds = torch.zeros(pg.world_size, dtype=torch.float64, device=pg.device)
        rounds[pg.rank] = float(self.round)  # -1: a copy from the server's snapshot, never preferred
        dist.all_reduce(rounds)
        src, best = most_advanced(rounds.tolist(), cap)
        flat = self.local.flat.to(pg.device)
        dist.broadcast(flat, src=src)
        state = self._broadcast_optimizer_state(src)
        if pg.rank != src:
            self.local.assign(flat)
            self.local.load_flat_optimizer_state(state)
        self.round = best

    def _broadcast_optimizer_state(self, src: int) -> torch.Tensor | None:
        """Rank `src`'s optimizer state (common.params.flat_state) on every rank, as one tensor broadcast: a flag
        (has it stepped yet) and the values. The hyperparameters are the job's on every rank."""
        n = self.local.optimizer_state_numel
        if n == 0:
            return None
        buffer = torch.zeros(n + 1, device=self.process_group.device)
        if self.process_group.rank == src:
            state = self.local.flat_optimizer_state()
            if state is not None:
                buffer[0] = 1.0
                buffer[1:].copy_(state)
        dist.broadcast(buffer, src=src)
        return buffer[1:].cpu() if float(buffer[0]) else None

    def close_group(self) -> None:
        """Leave the current process group (before re-forming, or at the end)."""
        self.process_group.close()

    def close(self) -> None:
        self.process_group.release()

    # -------------------------------------------------------------------- step
    def _bucket_for(self, numel: int) -> torch.Tensor:
        device = self.process_group.device
        if self._bucket is None or self._bucket.numel() != numel or self._bucket.device != device:
            self._bucket = torch.empty(numel, dtype=torch.float32, device=device)
        return self._bucket

    def reduce(
        self, grads: torch.Tensor, batch: int, plan: StepHeader, is_current: Callable[[int], bool] | None = None
    ) -> torch.Tensor | None:
        """All-reduce `batch`·`grads` with the group; returns the batch-weighted mean gradient.

        Returns None when the group's copy was already past `plan.round` (a peer completed this
        step before the previous group failed): its parameters were adopted, there is nothing to do.
        Raises CollectiveError when the group fails; the parameters are then unchanged.
        """
        self.ensure_group(plan, is_current)
        if self.round > plan.round:
            return None
        pg, n = self.process_group, grads.numel()
        norms = self.spec.gradient_norms  # the server's noise scale (--adaptive-batch): |g_k|², then |g|²
        local_sq = squared_norm(grads) if norms else 0.0
        hub = pg.world_size > 1 and self.spec.hub_reduce(pg.backend)
        bucket = self._bucket_for(n + 3)
        if grads.device == bucket.device:
            torch.mul(grads, batch, out=bucket[:n])  # one pass (a copy then a scale was two)
        else:  # a GPU worker in a gloo group: the bucket is on the CPU
            bucket[:n].copy_(grads).mul_(batch)
        bucket[n] = float(batch)
        round_mark = float(plan.round % ROUND_CHECK_MODULUS)
        bucket[n + 1] = round_mark
        bucket[n + 2] = float(plan.group.hub_rank)  # every rank must agree on the hub, as on the round
        try:
            if hub:
                self.sum.hub_sum(bucket, plan.group.hub_rank, pg)
            else:
                self.sum.all_reduce(bucket)
        except RuntimeError as exc:
            generation = pg.generation
            self.close_group()
            raise CollectiveError(f"all-reduce in group generation {generation} failed: {exc}") from exc
        total, rounds, hubs = bucket[n : n + 3].tolist()
        if rounds != round_mark * pg.world_size or (hub and hubs != float(plan.group.hub_rank) * pg.world_size):
            self.close_group()
            raise RuntimeError(
                f"collective out of step: this worker is at round {plan.round} (hub rank {plan.group.hub_rank}), the group's "
                f"rounds modulo {ROUND_CHECK_MODULUS} sum to {rounds:g} (hub ranks to {hubs:g}) over {pg.world_size} workers"
            )
        mean = bucket[:n].div_(total)
        self.sq_norms = (local_sq, squared_norm(mean)) if norms else (0.0, 0.0)
        return mean

    def apply(self, grad: torch.Tensor, plan: StepHeader) -> None:
        """Take the optimizer step with the mean gradient `reduce` returned (the same on every rank)."""
        self.local.set_lr(plan.lr if plan.lr > 0 else self.spec.lr_at(plan.epoch))  # the server's (--adaptive-batch)
        self.local.apply_gradient(grad if grad.device.type == "cpu" else grad.cpu())
        self.round = plan.round + 1
        self.reduces += 1

    def step(
        self, grads: torch.Tensor, batch: int, plan: StepHeader, is_current: Callable[[int], bool] | None = None
    ) -> bool:
        """`reduce` then `apply`; False when there was nothing to do (see `reduce`)."""
        grad = self.reduce(grads, batch, plan, is_current)
        if grad is None:
            return False
        self.apply(grad, plan)
        return True
