"""The end of the job: it is over once it is done and every worker still in it has been told so (with
--allreduce, once the hub has sent the snapshot the last checkpoint waits for), or after a grace period."""

from __future__ import annotations

import asyncio

from ps.rounds.membership import Member
from ps.rounds.state import JobState
from ps.rounds.whole_model import WholeModel


class JobEnd:
    """Who has been told the job is done."""

    def __init__(self, state: JobState, whole_model: WholeModel) -> None:
        self.state = state
        self.whole_model = whole_model
        self.told_done: set[str] = set()
        self.finished = asyncio.Event()

    def told(self, worker_id: str) -> None:
        """A reply told `worker_id` the job is done."""
        self.told_done.add(worker_id)

    def forget(self, member: Member) -> None:
        """`member` left or was evicted (RoundEvents.member_removed): nobody waits to tell it."""
        self.told_done.discard(member.worker_id)

    def check(self) -> None:
        """Finished when done, every member told, and no snapshot still asked of a member."""
        s = self.state
        if s.done and set(s.members) <= self.told_done and not (self.whole_model.snapshot_requested and s.members):
            self.finished.set()

    async def wait(self, grace_s: float) -> None:
        """Wait until the job is done and every worker has heard so (or grace_s after done)."""
        while not self.state.done:
            await asyncio.sleep(0.05)
        self.check()
        try:
            await asyncio.wait_for(self.finished.wait(), timeout=grace_s)
        except TimeoutError:
            pass
