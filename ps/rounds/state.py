"""What the coordinator's concerns share: the job's settings and collaborators, where the job stands
(round, version, epoch, samples; whether it ended and why), who is in it and the round events.

The Coordinator is a JobState. Each concern of ps/rounds (admission, the BSP round, ASP updates,
epochs, the fast path, the whole model, push checks) is handed it as a JobState and keeps its own
state in an object of its own. Every object owns its fields: only its own methods assign them. A
concern reads the shared state and moves it through the methods below (the batch policy is replaced
by `replace_policy` alone); it changes another concern through that concern's methods or hears of
it through the round events, never by assigning its fields (tests/ps/rounds/test_state.py scans
ps/rounds for this)."""

from __future__ import annotations

from collections.abc import Callable

from ps.control.policy import BatchPolicy
from common.job.spec import JobSpec
from ps.ops.metrics import MetricsLog
from common.params.store import ParameterStore
from ps.rounds.events import RoundEvents
from ps.rounds.membership import Member, Membership
from ps.rounds.policy_calls import PolicyCalls
from ps.rounds.rendezvous import Rendezvous
from ps.shards.client import RemoteShards
from common.transport.layout import Layout
from common.transport.payload import Payload


class JobState:
    """The shared state (the Coordinator sets every field) and the one way each field moves."""

    spec: JobSpec  # --allreduce auto changes its path (take_path)
    layout: Layout
    store: ParameterStore  # this server's parameters (--shards: range 0) and optimizer
    own_numel: int
    payload: Payload  # the parameters framed for replies, once per version
    membership: Membership
    metrics: MetricsLog
    clock: Callable[[], float]
    events: RoundEvents
    rendezvous: Rendezvous | None  # --allreduce: the workers' process groups
    shards: RemoteShards | None  # --shards: the shard servers of ranges 1..
    round: int  # BSP: the open round
    version: int  # the parameters' version (BSP: one per round; ASP: one per update)
    epoch: int
    samples: int  # trained on so far
    done: bool
    reason: str  # why the job ended
    _policy: BatchPolicy
    policy_calls: PolicyCalls  # the policy's calls on every push and round, a failure in them contained

    @property
    def policy(self) -> BatchPolicy:
        """The batch policy in force."""
        return self._policy

    def replace_policy(self, policy: BatchPolicy) -> None:
        """The one way the batch policy is replaced (the job's first, a resume's start, a new B, parking
        switched with the path): nobody keeps the old one, everybody reads this one from here. Who
        changed the plan by it says so (RoundEvents.plan_changed)."""
        self._policy = policy

    @property
    def members(self) -> dict[str, Member]:
        """Active members by worker id."""
        return self.membership.active

    def planned(self) -> list[Member]:
        """The active members the batch policy plans (a parked one included; one on probation not)."""
        plan = self.policy.plan()
        return [m for m in self.members.values() if m.name in plan]

    @property
    def step(self) -> int:
        """The step counter the batch policy and checkpoints use: BSP rounds, ASP updates."""
        return self.round if self.spec.mode == "bsp" else self.version

    def count_samples(self, batch: int) -> None:
        """A step of `batch` samples was trained on."""
        self.samples += batch

    def next_version(self) -> None:
        """ASP: an update was applied."""
        self.version += 1

    def next_round(self) -> None:
        """BSP: the open round stepped; the next one opens, with the parameters' next version."""
        self.round += 1
        self.version += 1

    def next_epoch(self) -> None:
        self.epoch += 1

    def resume_at(self, round: int, version: int, epoch: int, samples: int) -> None:
        """Before the start: where a checkpoint's job stood."""
        self.round, self.version, self.epoch, self.samples = round, version, epoch, samples

    def take_path(self, spec: JobSpec, rendezvous: Rendezvous | None) -> None:
        """--allreduce auto: the job's spec and rendezvous on the path it takes (None: the PS path)."""
        self.spec, self.rendezvous = spec, rendezvous

    def finish(self, reason: str) -> None:
        """The job is done (finished or stopping): its `end` record, then who must hear of it (RoundEvents.ended)."""
        self.done, self.reason = True, reason
        self.metrics.write("end", reason=reason, step=self.step, epoch=self.epoch)
        self.events.ended.emit(reason)
