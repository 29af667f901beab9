"""How the fast path's group sums one bucket (SUM over its ranks): torch.distributed's all-reduce with
every part of at most `bucket_numel` values in flight at once, or the hub's sum, where each other rank
sends and receives once and the hub (the worker with the largest batch) adds in rank order."""

from __future__ import annotations

import torch
import torch.distributed as dist

from worker.paths.process_group import CollectiveError, ProcessGroup


class BucketSum:
    """The two ways to sum a bucket over a group, in parts of `bucket_numel` values, and the hub's
    receive buffers kept between steps."""

    def __init__(self, bucket_numel: int) -> None:
        self.bucket_numel = bucket_numel
        self._inbox: list[torch.Tensor] = []

    def all_reduce(self, bucket: torch.Tensor) -> None:
        """torch.distributed.all_reduce (SUM), all parts in flight at once."""
        parts = bucket.split(self.bucket_numel)
        if len(parts) == 1:
            dist.all_reduce(bucket)
            return
        for work in [dist.all_reduce(part, async_op=True) for part in parts]:
            work.wait()

    def hub_sum(self, bucket: torch.Tensor, hub: int, group: ProcessGroup) -> None:
        """SUM at rank `hub`, which sends the sum back: each other rank sends and receives once.

        A ring all-reduce needs every rank at each of its 2(W-1) steps; a worker held to a small CPU
        quota is then scheduled late at every step. Here it takes part twice, and the hub (the worker
        with the largest batch, so the fastest) does the W-1 additions. The sum is taken in rank
        order and every rank receives the hub's bits, so the copies stay equal.
        """
        if not 0 <= hub < group.world_size:
            raise CollectiveError(f"hub rank {hub} is outside group generation {group.generation} of {group.world_size}")
        parts = bucket.split(self.bucket_numel)
        if group.rank != hub:
            _wait_all([dist.isend(part, dst=hub) for part in parts])
            _wait_all([dist.irecv(part, src=hub) for part in parts])
            return
        peers = [r for r in range(group.world_size) if r != hub]
        inbox = self._inbox_for(len(peers), parts[0].numel(), group.device)
        sends = []
        for part in parts:
            received = [box[: part.numel()] for box in inbox]
            _wait_all([dist.irecv(box, src=peer) for box, peer in zip(received, peers)])
            for box in received:
                part.add_(box)
            sends += [dist.isend(part, dst=peer) for peer in peers]
        _wait_all(sends)

    def _inbox_for(self, peers: int, numel: int, device: torch.device) -> list[torch.Tensor]:
        """The hub's receive buffers: one bucket part per peer, kept between steps."""
        if len(self._inbox) != peers or any(box.numel() != numel or box.device != device for box in self._inbox):
            self._inbox = [torch.empty(numel, dtype=torch.float32, device=device) for _ in range(peers)]
        return self._inbox


def _wait_all(works: list[dist.Work | None]) -> None:
    """Wait for point-to-point operations (torch types them as possibly None, which a process group never returns)."""
    for work in works:
        assert work is not None
        work.wait()
