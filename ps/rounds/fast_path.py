"""The collective fast path's coordination (--allreduce): whether the job takes it (--allreduce auto
decides at the start), the planned workers' group generations with their ranks, hub and store (a
newcomer on probation is in none: ps.rounds.probation), and the record of a round closed without every
report because a newer generation replaced the group that stepped it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from ps.control.policy import reconfigured
from common.job.spec import JobSpec
from ps.rounds.membership import Member
from ps.rounds.rendezvous import Rendezvous, fast_path_fits, hub_rank
from ps.rounds.state import JobState
from ps.shards.client import RemoteShards
from common.errors import FailedPrecondition
from common.transport.messages import GroupInfo, StepReply, StoreAnswer, StoreCall
from common.transport.payload import FramedChunks, Payload, TensorSource


PARKING_OFF = "the --allreduce fast path's process group holds every member, so no worker can skip a round"


def check_paths(spec: JobSpec, rendezvous: Rendezvous | None, shards: RemoteShards | None,
                on_gpus: Callable[[], Rendezvous] | None) -> None:
    """ValueError for a combination of paths the coordinator does not serve."""
    if spec.allreduce and rendezvous is None:
        raise ValueError("an allreduce job needs a Rendezvous")
    if shards is not None and (spec.mode != "bsp" or spec.allreduce):
        raise ValueError("--shards serves BSP jobs without --allreduce")
    if on_gpus is not None and (spec.mode != "bsp" or spec.allreduce or shards is not None):
        raise ValueError("the fast path on GPUs is chosen for BSP jobs on one server that are not --allreduce already")


class FastPath:
    """Group generations over the state's rendezvous (None: the PS path)."""

    def __init__(self, state: JobState, on_gpus: Callable[[], Rendezvous] | None) -> None:
        self.state = state
        self.on_gpus = on_gpus  # --allreduce auto, until the start: starts the rendezvous if the path fits
        self.why = ""  # --allreduce auto: why the job took its path (Status)
        # --allreduce auto where the fast path does not fit at the start (ps.rounds.path_trial.PathTrial.offer):
        # (start_rendezvous, why, the starting members) -> what the path event says
        self.offer_trial: Callable[[Callable[[], Rendezvous], str, list[Member]], str] | None = None

    def offer_trials(self, offer: Callable[[Callable[[], Rendezvous], str, list[Member]], str]) -> None:
        """Where the fast path is not chosen at the start, `offer` a trial of both paths (ps.rounds.path_trial)."""
        self.offer_trial = offer

    @property
    def undecided(self) -> bool:
        """--allreduce auto, before the start: the path is still to be chosen."""
        return self.on_gpus is not None

    def choose(self) -> bool:
        """--allreduce auto: take the fast path if the starting workers all compute on GPUs of their
        own. Before any worker is active, so nothing of the PS path has run yet. Returns whether it
        took it (the spec then says allreduce, and balances compute time)."""
        s = self.state
        start_rendezvous, self.on_gpus = self.on_gpus, None
        assert start_rendezvous is not None
        starting = sorted(s.membership.pending.values(), key=lambda m: m.index)
        fits, why = fast_path_fits([m.worker_id for m in starting], {m.worker_id: m.cuda_device for m in starting})
        rendezvous = start_rendezvous() if fits else None
        if rendezvous is not None:
            self.enter(rendezvous, balance="compute")
        elif self.offer_trial is not None:
            why = self.offer_trial(start_rendezvous, why, starting)
        self.why = why
        s.metrics.write("path", allreduce=rendezvous is not None, why=why, balance=s.spec.balance, step=s.step,
                        epoch=s.epoch)
        return rendezvous is not None

    def enter(self, rendezvous: Rendezvous, **spec_changes: Any) -> bool:
        """The job runs on the fast path from now: the spec says allreduce (with `spec_changes`), the
        rendezvous keeps its groups, and parking is off. Returns whether parking was on (for `leave`)."""
        s = self.state
        s.take_path(replace(s.spec, allreduce=True, **spec_changes), rendezvous)
        parked = s.policy.config.park
        if parked:  # the process group has every member: no parked ranks
            self._set_parking(False, PARKING_OFF)
        return parked

    def leave(self, park: bool) -> None:
        """The job runs on the PS path again (--allreduce auto's trial): no rendezvous, the spec says
        so, and parking as it was before `enter` (`park`)."""
        s = self.state
        s.take_path(replace(s.spec, allreduce=False), None)
        if park:
            self._set_parking(True, "the PS path")

    def _set_parking(self, on: bool, why: str) -> None:
        s = self.state
        s.replace_policy(reconfigured(s.policy, replace(s.policy.config, park=on)))
        s.metrics.write("parking", on=on, why=why, step=s.step, epoch=s.epoch)

    def generation(self) -> int:
        """The current group generation (0 before the first group, and on the PS path)."""
        return self.state.rendezvous.group.generation if self.state.rendezvous is not None else 0

    def regroup(self) -> None:
        """A change of the planned members starts a new group generation (ranks in join order); a member
        on probation holds no rank until it enters the plan (ps.rounds.probation)."""
        s = self.state
        if s.rendezvous is None:
            return
        ordered = sorted(s.planned(), key=lambda m: m.index)
        group = s.rendezvous.regroup([m.worker_id for m in ordered], {m.worker_id: m.cuda_device for m in ordered})
        if group is not None:
            s.metrics.write(
                "regroup", generation=group.generation, world_size=group.world_size, backend=group.backend, why=group.why,
                algorithm="hub" if s.spec.hub_reduce(group.backend) else "ring",
                ranks={m.name: group.rank(m.worker_id) for m in ordered}, step=s.step, epoch=s.epoch,
            )

    def group_info(self, member: Member, plan: dict[str, int]) -> GroupInfo:
        """The member's place in the current generation; `plan` (by name) picks the hub."""
        s = self.state
        if s.rendezvous is None:
            return GroupInfo()
        group = s.rendezvous.group
        batches = {m.worker_id: plan.get(m.name, 0) for m in s.members.values()}
        return GroupInfo(group.generation, group.rank(member.worker_id), group.world_size, group.backend,
                         hub_rank(group, batches))

    async def store_call(self, worker_id: str, call: StoreCall) -> StoreAnswer:
        """A member's call on its group's store (ps.rounds.rendezvous); FailedPrecondition on the PS path."""
        if self.state.rendezvous is None:
            raise FailedPrecondition("this job is not on the collective fast path (no --allreduce): it keeps no group store")
        return await self.state.rendezvous.call(worker_id, call)

    def note_close_without(self, pushed: set[str]) -> None:
        """The `close_without` record: the open round closes before every member reported it, because a
        group that a leave or eviction has since replaced took its step (a report follows a successful
        all-reduce).

        That group may have failed part way (a peer gone before the hub's send to some ranks): the
        ranks with the sum reported, the others wait for the next generation and retry the round
        there, where they would wait for the reporters, which wait for the round to close. Closing
        it lets them meet at the next round instead: the next generation adopts a reporter's copy
        (the most advanced one), a rank whose copy is then past its plan's round skips its
        all-reduce, and its late report of the closed round is refused and answered with a pull."""
        s = self.state
        missing = sorted(m.name for m in s.members.values() if m.worker_id not in pushed)
        s.metrics.write("close_without", round=s.round, workers=missing, step=s.step, epoch=s.epoch)


def with_optimizer_state(reply: StepReply, state: torch.Tensor | None, payload: Payload) -> StepReply:
    """A header-only `reply` carrying the optimizer's flat state instead of parameters: an --allreduce
    worker starting from the server's copy (num_values 0: the optimizer has not stepped yet)."""
    header = replace(reply.header, wire_dtype="float32", optimizer_state=True)
    if state is None:
        return StepReply(header, reply.payload)
    chunks = FramedChunks(TensorSource(state), "float32", payload.frame, payload.chunk_bytes)
    return StepReply(replace(header, num_values=state.numel()), chunks)
