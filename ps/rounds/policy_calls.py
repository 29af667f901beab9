"""The batch policy's calls on every push and round, with a failure in them contained: a policy that
raises (a corner of its own state, or a policy added as docs/policies.md tells) loses the one time or
decision it failed on, and the job goes on at the plan in force. Uncontained, the exception would
answer the push that carried the time with UNKNOWN, and a worker ends on such an answer: one bad
observation would stop every worker of the job.

Each failure is counted; the first of each call, and then every power-of-two count of them, writes a
`policy_error` record (the call, the count, the exception) and the first also prints its traceback
to stderr, so that a policy failing on every push neither goes unseen nor floods the log."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from typing import TypeVar

from ps.control.policy import BatchPolicy
from ps.ops.metrics import MetricsLog

T = TypeVar("T")


class PolicyCalls:
    """The policy's `observe`, `observe_round`, `decision_due` and `adjust`, each failure contained
    and counted (`failures`, by call)."""

    def __init__(self, policy: Callable[[], BatchPolicy], metrics: MetricsLog,
                 where: Callable[[], tuple[int, int]]) -> None:
        """`policy`: the policy in force; `where`: the job's step and epoch, for the records."""
        self.policy_in_force, self.metrics, self.where = policy, metrics, where
        self.failures: dict[str, int] = {}

    def observe(self, worker: str, batch: int, ms: float, exposed_ms: float = 0.0) -> None:
        """The worker's time for the policy; lost if the policy fails on it."""
        self._contained("observe", lambda: self.policy_in_force().observe(worker, batch, ms, exposed_ms=exposed_ms), None)

    def observe_round(self, round_ms: float, push_ms: float = 0.0) -> None:
        """The round's time and the server's CPU a push in it for the policy; lost if the policy fails on it."""
        self._contained("observe_round", lambda: self.policy_in_force().observe_round(round_ms, push_ms), None)

    def decision_due(self) -> bool:
        """Whether the policy asks for a decision now (no, if asking fails)."""
        return self._contained("decision_due", self.policy_in_force().decision_due, False)

    def adjust(self) -> dict[str, int] | None:
        """One decision: the plan after it, or None where the policy failed (its plan stays in force)."""
        return self._contained("adjust", self.policy_in_force().adjust, None)

    def _contained(self, call: str, run: Callable[[], T], failed: T) -> T:
        try:
            return run()
        except Exception as exc:  # a policy's failure, whatever it is, must not end the push or the round
            count = self.failures[call] = self.failures.get(call, 0) + 1
            if count == 1:
                print(f"ps-server: error: the batch policy failed in {call}; the job goes on at the plan in force:\n"
                      + "".join(traceback.format_exception(exc)), file=sys.stderr, flush=True)
            if count & (count - 1) == 0:
                step, epoch = self.where()
                self.metrics.write("policy_error", step=step, epoch=epoch, call=call, count=count,
                                   policy=self.policy_in_force().config.policy, error=f"{type(exc).__name__}: {exc}")
            return failed
