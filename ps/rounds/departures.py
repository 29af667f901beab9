"""Who leaves the job and what follows: a worker's leave, the eviction of one silent for longer than
--evict-after (or past a deadline: ps.rounds.deadlines), then B split again over the others and a
round that only waited on it closed with them (ps.rounds.round_close)."""

from __future__ import annotations

from collections.abc import Callable

from ps.rounds.admission import Admission
from ps.rounds.epochs import Epochs
from ps.rounds.fast_path import FastPath
from ps.rounds.job_end import JobEnd
from ps.rounds.round_close import RoundClose
from ps.rounds.state import JobState


class Departures:
    """Removes members; the concerns hear of it through RoundEvents.member_removed."""

    def __init__(self, state: JobState, admission: Admission, epochs: Epochs, fast_path: FastPath, end: JobEnd,
                 round_close: RoundClose, stop: Callable[[str], None], evict_after: float) -> None:
        """`stop` ends the job (the workers left cannot make up B); `evict_after`: seconds of silence."""
        self.state = state
        self.admission = admission
        self.epochs = epochs
        self.fast_path = fast_path
        self.end = end
        self.round_close = round_close
        self.stop = stop
        self.evict_after = evict_after

    def remove(self, worker_id: str, event: str, reason: str, said: str = "") -> None:
        """Drop a worker (`event`: leave or evict), re-split B over the others, close a round it held up.
        Its record counts the workers left (active or waiting to enter): at 0 a running job waits for a
        join, which its progress says (ps.ops.progress) rather than waiting silently. `said`: the
        worker's own reason for leaving, recorded as `why` when it gave one."""
        s = self.state
        member = s.membership.remove(worker_id, reason, s.clock())
        s.events.member_removed.emit(member)
        s.metrics.write(event, worker=member.name, reason=reason, step=s.step, epoch=s.epoch,
                        workers_left=len(s.membership.members()), done=s.done, **({"why": said} if said else {}))
        self.fast_path.regroup()
        if s.done:
            self.end.check()
            return
        planned = member.name in s.policy.plan()  # not one on probation (ps.rounds.probation): the plan stands
        if planned:
            s.policy.remove_worker(member.name)
        if planned and s.members and s.policy.plan():
            try:
                s.policy.replan()
            except ValueError as exc:  # the survivors' --max-batch cannot make up B: end, do not hang the round
                self.stop(f"the workers left cannot split --global-batch ({exc})")
                return
            self.epochs.log_adjust(changed=True)
        self.round_close.after_removal()

    def evict_stale(self) -> list[str]:
        """Evict workers silent for longer than evict_after; returns their names."""
        s = self.state
        if not self.admission.started.is_set() or s.done:
            return []
        gone = s.membership.stale(s.clock(), self.evict_after)
        for member in gone:
            self.remove(member.worker_id, "evict", f"evicted after {self.evict_after:g}s without a heartbeat")
        return [m.name for m in gone]
