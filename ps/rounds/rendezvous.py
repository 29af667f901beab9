"""The collective fast path's meeting point (`ps-server --allreduce`).

The server keeps the key-value store the workers build their process group on (ps.rounds.group_store),
served by its own Rendezvous RPC: only a member of the job that holds a rank in the generation it
names reaches it, and a generation's keys go when the next one starts. Every change of the planned
members (a join, or a newcomer's entry after its probation: ps.rounds.probation; a leave, an eviction)
starts a new generation: ranks follow join order over the planned workers, and the
backend is NCCL only when every one of them computes on its own CUDA device (gloo otherwise: NCCL
refuses two ranks on one GPU, "Duplicate GPU detected", so workers sharing a GPU fall back to gloo
instead of failing to form a group).
`plan_group` and `fast_path_fits` (`--allreduce auto`: does this job take the fast path?) are the pure
part; `Rendezvous` adds the store and says who may use it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from common.errors import PermissionDenied
from common.transport.messages import StoreAnswer, StoreCall
from ps.rounds.group_store import GroupStore, StoreLimits


@dataclass(frozen=True)
class Group:
    """One generation of the workers' process group: worker ids in rank order."""

    generation: int
    members: tuple[str, ...]
    backend: str
    why: str = ""  # gloo although some worker has CUDA: the reason

    @property
    def world_size(self) -> int:
        return len(self.members)

    def rank(self, worker_id: str) -> int:
        """The worker's rank, or -1 when it is not in this generation."""
        try:
            return self.members.index(worker_id)
        except ValueError:
            return -1


def plan_group(generation: int, worker_ids: Sequence[str], cuda: Mapping[str, str | None]) -> Group:
    """The group of `worker_ids` (already in join order). `cuda` maps a worker to the UUID of the GPU
    it computes on ("" when unknown), or None for a CPU worker. NCCL iff every worker has a GPU and no
    two share one (unknown UUIDs count as distinct)."""
    members = tuple(worker_ids)
    devices = [cuda.get(w) for w in members]
    on_gpu = [d for d in devices if d is not None]
    if not on_gpu:
        return Group(generation, members, "gloo")
    if len(on_gpu) < len(members):
        cpu = [w for w, d in zip(members, devices) if d is None]
        return Group(generation, members, "gloo", f"{len(cpu)} of {len(members)} workers have no GPU")
    owners: dict[str, str] = {}
    for worker, device in zip(members, devices):
        if device and device in owners:
            return Group(generation, members, "gloo", f"{owners[device]} and {worker} share GPU {device}")
        owners.setdefault(device or f"?{worker}", worker)
    return Group(generation, members, "nccl")


def fast_path_fits(worker_ids: Sequence[str], cuda: Mapping[str, str | None]) -> tuple[bool, str]:
    """`ps-server --allreduce auto`: whether the workers starting a job should take the collective fast
    path, and why. Yes when every one computes on a GPU of its own (an NCCL group: gradients are
    reduced on the GPUs and the server is out of the data path); no otherwise, since on CPU workers
    the fast path moves the aggregation and the optimizer step from the server onto the workers'
    own cores (HL8 on CPU quotas: 0.9-1.0 of the PS path's samples/s)."""
    group = plan_group(0, worker_ids, cuda)
    if group.backend == "nccl":
        return True, "every worker computes on a GPU of its own"
    return False, group.why or "no worker has a GPU"


def hub_rank(group: Group, batches: Mapping[str, int]) -> int:
    """The rank that sums a hub all-reduce: the member with the largest planned batch (`batches` by
    worker id; the batch policy gives the fastest worker the most samples), the lowest rank among equals."""
    if not group.members:
        return 0
    return max(range(group.world_size), key=lambda r: (batches.get(group.members[r], 0), -r))


class Rendezvous:
    """The current Group and its store (empty until the first group forms)."""

    def __init__(self, limits: StoreLimits | None = None) -> None:
        self.group = Group(0, (), "gloo")
        self.store = GroupStore(limits)

    async def call(self, worker_id: str, call: StoreCall) -> StoreAnswer:
        """`worker_id`'s call on its group's store (the caller proved it is that member), as its rank:
        refused unless it names the current generation (GroupStore) and the worker holds a rank in it."""
        rank = self.group.rank(worker_id)
        if call.generation == self.group.generation and rank < 0:
            raise PermissionDenied(f"worker {worker_id!r} holds no rank in group generation {self.group.generation}")
        return await self.store.call(call, rank)

    def regroup(self, worker_ids: Sequence[str], cuda: Mapping[str, str | None]) -> Group | None:
        """Start a new generation if the active workers (in join order) changed; returns it, or None.
        `cuda`: what each declared at Join, as `plan_group` takes it."""
        if tuple(worker_ids) == self.group.members:
            return None
        self.group = plan_group(self.group.generation + 1, worker_ids, cuda)
        self.store.begin(self.group.generation, self.group.world_size)
        return self.group

    def rank(self, worker_id: str) -> int:
        return self.group.rank(worker_id)
