"""What every answer to a worker carries (a push's, a pull's): the header for its next step (where the
job stands, its batch and learning rate, its samples with --sampling exact, its group and path, whether
it is asked for a snapshot; on probation its probe's batch and samples, with no group, path or
snapshot: ps.rounds.probation) and the parameters when they go with it; and the batch each answer told
it, which its next push must be."""

from __future__ import annotations

from collections.abc import Sequence

from ps.rounds.adaptive_batch import AdaptiveBatchSizing
from ps.rounds.asp import AspUpdates
from ps.rounds.fast_path import FastPath
from ps.rounds.job_end import JobEnd
from ps.rounds.membership import Member
from ps.rounds.path_trial import PathTrial
from ps.rounds.probation import Probation
from ps.rounds.sampling import Sampling
from ps.rounds.state import JobState
from ps.rounds.whole_model import WholeModel
from common.transport.messages import GroupInfo, StepHeader, StepReply


class StepReplies:
    """Builds the replies from the concerns' state."""

    def __init__(self, state: JobState, sampling: Sampling, asp: AspUpdates, adaptive: AdaptiveBatchSizing,
                 fast_path: FastPath, path_trial: PathTrial, whole_model: WholeModel, end: JobEnd,
                 probation: Probation) -> None:
        self.state = state
        self.probation = probation
        self.sampling = sampling
        self.asp = asp
        self.adaptive = adaptive
        self.fast_path = fast_path
        self.path_trial = path_trial
        self.whole_model = whole_model
        self.end = end

    @property
    def params_dtype(self) -> str:
        """Wire dtype of the parameters the server sends (allreduce: fp32, they seed every worker's copy)."""
        return "float32" if self.state.rendezvous is not None else self.state.spec.wire_dtype

    def current_payload(self) -> Sequence[bytes]:
        s = self.state
        return s.payload.get(s.version, s.store, self.params_dtype)

    def tell(self, member: Member, batch: int) -> None:
        """Record the batch a join or a reply tells `member` for the open round (ASP: this version)."""
        s = self.state
        member.tell(s.step, batch, keep_after=s.round - 1 if s.spec.mode == "bsp" else None)

    def group(self, member: Member, plan: dict[str, int]) -> GroupInfo:
        """`member`'s place in the fast path's group (none on probation: the group does not hold it)."""
        return GroupInfo() if self.probation.on(member) else self.fast_path.group_info(member, plan)

    def reply(self, member: Member, params: bool | None = None) -> StepReply:
        """The header for the worker's next step, with the parameters unless `params` is False
        (default: only without --allreduce, whose workers keep the parameters themselves)."""
        s = self.state
        params = self.path_trial.reply_carries_params(s.rendezvous is None) if params is None else params
        plan = s.policy.plan()
        group = self.group(member, plan)
        probe = self.probation.on(member)
        if probe:  # its probe (ps.rounds.probation)
            batch, ranges, ahead = self.probation.probe_step(member, self.sampling.exact and not s.done)
        else:  # --sampling exact: its samples
            batch, ranges, ahead = self.sampling.slice_for(member, plan.get(member.name, 0))
        global_batch = sum(plan.values())
        lr = self.asp.lr(batch, global_batch) if s.spec.mode == "asp" else self.adaptive.lr_at(s.epoch)
        if s.done:
            self.end.told(member.worker_id)
        self.tell(member, batch)
        header = StepHeader(
            round=s.round, version=s.version, epoch=s.epoch, batch_size=batch, done=s.done, lr=lr,
            global_batch=global_batch, wire_dtype=self.params_dtype, num_values=s.own_numel if params else 0,
            reason=s.reason, group=group, slice=ranges, next_slice=ahead, path="" if probe else self.path_trial.path(),
            snapshot_requested=not probe and (self.whole_model.asks_snapshot(group) or self.path_trial.asks_snapshot(member)),
            probe=probe and not s.done,
        )
        return StepReply(header, self.current_payload() if params else s.payload.empty())
