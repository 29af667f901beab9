"""What the coordinator's concerns share: the job's settings and collaborators, where the job stands
(round, version, epoch, samples; whether it ended and why) and who is in it.

The Coordinator is a JobState. Each concern of ps/rounds (admission, the BSP round, ASP updates,
epochs, the fast path, the whole model, push checks) is handed it as a JobState and keeps its own
state in an object of its own: a concern reads and moves the shared state, never another's."""

from __future__ import annotations

from collections.abc import Callable

from ps.control.policy import BatchPolicy
from common.job.spec import JobSpec
from ps.ops.metrics import MetricsLog
from common.params.store import ParameterStore
from ps.rounds.membership import Member, Membership
from ps.rounds.rendezvous import Rendezvous
from ps.shards.client import RemoteShards
from common.transport.layout import Layout
from common.transport.payload import Payload


class JobState:
    """The shared state (the Coordinator sets every field)."""

    spec: JobSpec  # --allreduce auto replaces it once, at the start
    policy: BatchPolicy  # a resume's start replaces it
    layout: Layout
    store: ParameterStore  # this server's parameters (--shards: range 0) and optimizer
    own_numel: int
    payload: Payload  # the parameters framed for replies, once per version
    membership: Membership
    metrics: MetricsLog
    clock: Callable[[], float]
    rendezvous: Rendezvous | None  # --allreduce: the workers' process groups
    shards: RemoteShards | None  # --shards: the shard servers of ranges 1..
    round: int  # BSP: the open round
    version: int  # the parameters' version (BSP: one per round; ASP: one per update)
    epoch: int
    samples: int  # trained on so far
    done: bool
    reason: str  # why the job ended

    @property
    def members(self) -> dict[str, Member]:
        """Active members by worker id."""
        return self.membership.active

    @property
    def step(self) -> int:
        """The step counter the batch policy and checkpoints use: BSP rounds, ASP updates."""
        return self.round if self.spec.mode == "bsp" else self.version
