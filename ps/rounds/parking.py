"""Parked workers (BSP): a worker the batch policy plans at batch 0 stays joined and heartbeats, but the
round does not wait for it, and it waits for a batch with a long poll instead of computing.

Its Pull with `wait_for_batch` returns once the plan gives it a batch (a decision at a round's close,
a re-probe, or a re-split after a membership change) or the job ends, or after PARKED_POLL_S with the
unchanged plan. It then pulls the parameters and computes the open round like the others: its model
is current whenever it computes. The round's close wakes the waiting polls at once; a re-split in the
middle of a round is seen within RECHECK_S."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from ps.rounds.membership import Member
from ps.rounds.state import JobState

PARKED_POLL_S = 5.0
"""The longest a parked worker's poll waits before it is answered with the unchanged plan."""
RECHECK_S = 0.1
"""How often a waiting poll looks at the plan between round closes."""


class Parking:
    """Who is parked, and the long polls of the parked."""

    def __init__(self, state: JobState, resting: Callable[[Member], bool] = lambda member: False) -> None:
        """`resting`: whether a member the plan gives a batch was handed no samples for the open round
        (ps.rounds.sampling: the job's last epoch ran out); it waits like a parked one."""
        self.state = state
        self.resting = resting
        self._closed = asyncio.Event()  # set (and replaced) whenever a round closes or the job stops

    def is_parked(self, member: Member) -> bool:
        """Planned at batch 0 (only BSP plans one), or resting for the open round."""
        return self.state.policy.plan().get(member.name) == 0 or self.resting(member)

    def required(self) -> set[str]:
        """The members a BSP round waits for: every active member the plan gives a batch (not one on
        probation, which the plan does not hold: ps.rounds.probation) and the round's samples reach."""
        plan = self.state.policy.plan()
        return {wid for wid, m in self.state.members.items() if plan.get(m.name, 0) > 0 and not self.resting(m)}

    def wake(self) -> None:
        """A round closed or the job stopped: the waiting polls look again."""
        self._closed.set()
        self._closed = asyncio.Event()

    async def wait_for_batch(self, member: Member) -> None:
        """Return once `member` is planned a batch or the job ended, or after PARKED_POLL_S."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PARKED_POLL_S
        while self.is_parked(member) and not self.state.done and member.worker_id in self.state.members:
            left = deadline - loop.time()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closed.wait(), min(RECHECK_S, left))
