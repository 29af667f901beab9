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
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from common.job.spec import JobSpec
from common.params.aggregation import squared_norm
from common.params.store import ParameterStore
from common.transport.layout import flatten_params
from common.transport.messages import GroupInfo, StepHeader
from worker.transport.client import ServerError

BUCKET_BYTES = 25 * 1024 * 1024
CHECK_EVERY_S = 0.5  # while a group forms: how often to ask the server whether its generation still stands
ROUND_CHECK_MODULUS = 4096
"""Each rank adds its round modulo this into the fp32 bucket: the sum stays exact (under 2^24) for any
round and up to 4096 ranks, and a rank one round or a few out of step still shows."""


def most_advanced(rounds: Sequence[float], cap: int) -> tuple[int, int]:
    """(rank, round) of the copy a forming group adopts: the highest round at most `cap`, the lowest
    rank among equals. A member that claims a round beyond its server's (`cap`) is not believed: it
    would otherwise overwrite every peer's model with its own."""
    believed = [r if r <= cap else -math.inf for r in rounds]
    best = max(believed)
    return believed.index(best), int(best) if math.isfinite(best) else -1


class CollectiveError(RuntimeError):
    """The group failed (a peer left or crashed): wait for the next generation and retry the step."""


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
        self.compute_device = device or torch.device("cpu")
        self.timeout = timedelta(seconds=timeout_s)
        self.bucket_numel = max(1, bucket_bytes // 4)
        self.generation: int | None = None
        self.rank = 0
        self.world_size = 0
        self.backend = ""
        self.sq_norms = (0.0, 0.0)  # the last reduce's |g_k|² and |g|² (float64; 0: not measured), for the round's report
        self.round = -1  # the round this copy is at (known once a group has formed)
        self.reduces = 0
        self._device = torch.device("cpu")
        self._bucket: torch.Tensor | None = None
        self._inbox: list[torch.Tensor] = []
        self._stores = stores
        self._store: dist.Store | None = None  # the group's: held while the group lives (torch calls back into it)

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
        """Form the plan's generation unless this worker is already in it.

        `is_current(generation)` asks the server whether that generation still stands; while the
        others are awaited it is called every CHECK_EVERY_S, so a generation that a leave or an
        eviction replaced before it formed is given up at once instead of after the timeout.
        """
        group = plan.group
        if self.generation == group.generation and dist.is_initialized():
            return
        if not 0 <= group.rank < group.world_size:
            raise CollectiveError(f"this worker has no rank in group generation {group.generation}")
        self.close_group()
        store = self._store = self._stores(group.generation, self.timeout)
        device = self._group_device(group.backend)
        try:
            if device.type == "cuda":
                torch.cuda.set_device(device)
            self._arrive(store, group, is_current)
            dist.init_process_group(
                group.backend, store=store, rank=group.rank, world_size=group.world_size, timeout=self.timeout
            )
            self.generation, self.rank, self.world_size, self.backend = (
                group.generation, group.rank, group.world_size, group.backend
            )
            self._device = device
            self._sync(plan.round + 1)
        except (CollectiveError, ServerError):
            self.close_group()
            raise
        except (RuntimeError, ValueError) as exc:  # DistBackendError / DistNetworkError are RuntimeErrors
            self.close_group()
            raise CollectiveError(f"could not form group generation {group.generation}: {exc}") from exc

    def _group_device(self, backend: str) -> torch.device:
        """Where the bucket lives: NCCL needs the worker's GPU, gloo reduces on the CPU."""
        if backend != "nccl":
            return torch.device("cpu")
        if self.compute_device.type == "cuda":
            return self.compute_device
        if not torch.cuda.is_available():
            raise CollectiveError("the server planned an NCCL group but this worker has no CUDA device")
        return torch.device("cuda", torch.cuda.current_device())

    def _arrive(self, store: dist.Store, group: GroupInfo, is_current: Callable[[int], bool] | None) -> None:
        """Wait until every rank of the generation has arrived (a key each in the store)."""
        store.set(f"arrived/{group.rank}", "1")
        keys = [f"arrived/{r}" for r in range(group.world_size)]
        start = last_check = time.monotonic()
        delay = 0.002
        while not store.check(keys):
            now = time.monotonic()
            if now - start > self.timeout.total_seconds():
                raise CollectiveError(f"group generation {group.generation}: not every worker arrived within {self.timeout}")
            if is_current is not None and now - last_check >= CHECK_EVERY_S:
                last_check = now
                if not is_current(group.generation):
                    raise CollectiveError(f"group generation {group.generation} was replaced before it formed")
            time.sleep(delay)
            delay = min(0.05, delay * 2)

    def _sync(self, cap: int) -> None:
        """Adopt the most advanced copy in the group (highest round, then lowest rank) that is at most
        at round `cap` (the server's round, plus one for a copy that already applied it)."""
        rounds = torch.zeros(self.world_size, dtype=torch.float64, device=self._device)
        rounds[self.rank] = float(self.round)  # -1: a copy from the server's snapshot, never preferred
        dist.all_reduce(rounds)
        src, best = most_advanced(rounds.tolist(), cap)
        flat = self.local.flat.to(self._device)
        dist.broadcast(flat, src=src)
        state = self._broadcast_optimizer_state(src)
        if self.rank != src:
            self.local.assign(flat)
            self.local.load_flat_optimizer_state(state)
        self.round = best

    def _broadcast_optimizer_state(self, src: int) -> torch.Tensor | None:
        """Rank `src`'s optimizer state (common.params.flat_state) on every rank, as one tensor broadcast: a flag
        (has it stepped yet) and the values. The hyperparameters are the job's on every rank."""
        n = self.local.optimizer_state_numel
        if n == 0:
            return None
        buffer = torch.zeros(n + 1, device=self._device)
        if self.rank == src:
            state = self.local.flat_optimizer_state()
            if state is not None:
                buffer[0] = 1.0
                buffer[1:].copy_(state)
        dist.broadcast(buffer, src=src)
        return buffer[1:].cpu() if float(buffer[0]) else None

    def close_group(self) -> None:
        """Leave the current process group (before re-forming, or at the end)."""
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except (RuntimeError, ValueError):
                pass
        self.generation = None

    def close(self) -> None:
        self.close_group()
        self._store = None

    # -------------------------------------------------------------------- step
    def _bucket_for(self, numel: int) -> torch.Tensor:
        if self._bucket is None or self._bucket.numel() != numel or self._bucket.device != self._device:
            self._bucket = torch.empty(numel, dtype=torch.float32, device=self._device)
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
        n = grads.numel()
        norms = self.spec.gradient_norms  # the server's noise scale (--adaptive-batch): |g_k|², then |g|²
        local_sq = squared_norm(grads) if norms else 0.0
        hub = self.world_size > 1 and self.spec.hub_reduce(self.backend)
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
                self._hub_sum(bucket, plan.group.hub_rank)
            else:
                self._all_reduce(bucket)
        except RuntimeError as exc:
            generation = self.generation
            self.close_group()
            raise CollectiveError(f"all-reduce in group generation {generation} failed: {exc}") from exc
        total, rounds, hubs = bucket[n : n + 3].tolist()
        if rounds != round_mark * self.world_size or (hub and hubs != float(plan.group.hub_rank) * self.world_size):
            self.close_group()
            raise RuntimeError(
                f"collective out of step: this worker is at round {plan.round} (hub rank {plan.group.hub_rank}), the group's "
                f"rounds modulo {ROUND_CHECK_MODULUS} sum to {rounds:g} (hub ranks to {hubs:g}) over {self.world_size} workers"
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

    def _all_reduce(self, bucket: torch.Tensor) -> None:
        """torch.distributed.all_reduce (SUM), all buckets in flight at once."""
        parts = bucket.split(self.bucket_numel)
        if len(parts) == 1:
            dist.all_reduce(bucket)
            return
        for work in [dist.all_reduce(part, async_op=True) for part in parts]:
            work.wait()

    def _hub_sum(self, bucket: torch.Tensor, hub: int) -> None:
        """SUM at rank `hub`, which sends the sum back: each other rank sends and receives once.

        A ring all-reduce needs every rank at each of its 2(W-1) steps; a worker held to a small CPU
        quota is then scheduled late at every step. Here it takes part twice, and the hub (the worker
        with the largest batch, so the fastest) does the W-1 additions. The sum is taken in rank
        order and every rank receives the hub's bits, so the copies stay equal.
        """
        if not 0 <= hub < self.world_size:
            raise CollectiveError(f"hub rank {hub} is outside group generation {self.generation} of {self.world_size}")
        parts = bucket.split(self.bucket_numel)
        if self.rank != hub:
            _wait_all([dist.isend(part, dst=hub) for part in parts])
            _wait_all([dist.irecv(part, src=hub) for part in parts])
            return
        peers = [r for r in range(self.world_size) if r != hub]
        inbox = self._inbox_for(len(peers), parts[0].numel())
        sends = []
        for part in parts:
            received = [box[: part.numel()] for box in inbox]
            _wait_all([dist.irecv(box, src=peer) for box, peer in zip(received, peers)])
            for box in received:
                part.add_(box)
            sends += [dist.isend(part, dst=peer) for peer in peers]
        _wait_all(sends)

    def _inbox_for(self, peers: int, numel: int) -> list[torch.Tensor]:
        """The hub's receive buffers: one bucket part per peer, kept between steps."""
        if len(self._inbox) != peers or any(box.numel() != numel or box.device != self._device for box in self._inbox):
            self._inbox = [torch.empty(numel, dtype=torch.float32, device=self._device) for _ in range(peers)]
        return self._inbox


def _wait_all(works: list[dist.Work | None]) -> None:
    """Wait for point-to-point operations (torch types them as possibly None, which a process group never returns)."""
    for work in works:
        assert work is not None
        work.wait()
