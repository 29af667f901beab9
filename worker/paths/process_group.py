"""The fast path's process group of one generation on this worker: it meets at that generation's
store (worker.paths.group_store's, kept by the server) once every rank has arrived there, on the
device its bucket lives on (NCCL needs the worker's GPU, gloo reduces on the CPU), and is closed
before the next generation forms. A group that fails raises CollectiveError; the copy its ranks agree
on is the most advanced one they hold (`most_advanced`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from common.transport.messages import GroupInfo

CHECK_EVERY_S = 0.5  # while a group forms: how often to ask the server whether its generation still stands


class CollectiveError(RuntimeError):
    """The group failed (a peer left or crashed): wait for the next generation and retry the step."""


def most_advanced(rounds: Sequence[float], cap: int) -> tuple[int, int]:
    """(rank, round) of the copy a forming group adopts: the highest round at most `cap`, the lowest
    rank among equals. A member that claims a round beyond its server's (`cap`) is not believed: it
    would otherwise overwrite every peer's model with its own."""
    believed = [r if r <= cap else -math.inf for r in rounds]
    best = max(believed)
    return believed.index(best), int(best) if math.isfinite(best) else -1


class ProcessGroup:
    """This worker's membership of one generation's process group: its rank, the group's size and
    backend, and the device the group reduces on."""

    def __init__(self, stores: Callable[[int, timedelta], dist.Store], timeout: timedelta,
                 compute_device: torch.device) -> None:
        """`stores(generation, timeout)`: the store group `generation` meets at (its keys its own)."""
        self.timeout = timeout
        self.compute_device = compute_device
        self.generation: int | None = None
        self.rank = 0
        self.world_size = 0
        self.backend = ""
        self.device = torch.device("cpu")
        self._stores = stores
        self._store: dist.Store | None = None  # the group's: held while the group lives (torch calls back into it)

    def formed(self, generation: int) -> bool:
        """Whether this worker is in group `generation` already."""
        return self.generation == generation and dist.is_initialized()

    def prepare(self, group: GroupInfo) -> tuple[dist.Store, torch.device]:
        """Leave the group in force and take `group`'s store and device; CollectiveError (nothing
        changed) where this worker has no rank in it."""
        if not 0 <= group.rank < group.world_size:
            raise CollectiveError(f"this worker has no rank in group generation {group.generation}")
        self.close()
        store = self._store = self._stores(group.generation, self.timeout)
        return store, self._device_for(group.backend)

    def join(self, group: GroupInfo, store: dist.Store, device: torch.device,
             is_current: Callable[[int], bool] | None) -> None:
        """Wait for every rank at `store`, then form the process group (`prepare`'s store and device).

        `is_current(generation)` asks the server whether that generation still stands; while the
        others are awaited it is called every CHECK_EVERY_S, so a generation that a leave or an
        eviction replaced before it formed is given up at once instead of after the timeout.
        """
        if device.type == "cuda":
            torch.cuda.set_device(device)
        self._arrive(store, group, is_current)
        dist.init_process_group(
            group.backend, store=store, rank=group.rank, world_size=group.world_size, timeout=self.timeout
        )
        self.generation, self.rank, self.world_size, self.backend = (
            group.generation, group.rank, group.world_size, group.backend
        )
        self.device = device

    def _device_for(self, backend: str) -> torch.device:
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

    def close(self) -> None:
        """Leave the current process group (before re-forming, or at the end)."""
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except (RuntimeError, ValueError):
                pass
        self.generation = None

    def release(self) -> None:
        """Leave the group and let its store go (the worker's end)."""
        self.close()
        self._store = None
