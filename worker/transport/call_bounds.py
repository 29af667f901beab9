"""How long a worker waits for each call to its server, all from `--timeout` (T): pure rules, no I/O.

- A call the server answers at once (Status, Heartbeat, Leave, a Pull's header) has T; a Rendezvous
  its long poll (`wait_s`) plus T; a parked worker's long poll (a Pull with `wait_for_batch`) the
  server's few seconds (LONG_POLL_S) plus T.
- A reply's values may pause at most T between two chunks, whatever its length: a body that stalls
  after its header ends there, not the whole transfer at a fixed time. Together they may take T plus
  a second for every MIN_VALUES_RATE bytes its header announces (at 4 bytes a value): a trickle of
  values, each within T, ends there too.
- A push's reply waits for its round: a BSP server holds it until every member pushed or the round's
  deadline evicted the late ones, at least 60 s while a member warms up (a newcomer's first round),
  else about ROUND_FACTOR times the recent round time (ps-server's `--round-deadline auto`). So the
  reply may take T + max(ROUND_MARGIN_S, ROUND_FACTOR x the median of this worker's recent rounds).
- A Join is held until the worker is admitted: before the job starts, until every expected worker is
  there (the server's `--join-wait` bounds that); after it, until the open round closes. The worker
  cannot tell a slow fleet from a server that never answers, so it asks: every T it calls Status
  (itself bounded by T), and `join_wait` reads the answer: what the Join still legitimately waits
  for, or why it should have been answered by now.
"""

from __future__ import annotations

import statistics
from collections import deque

from common.transport.messages import JobStatus
from worker.transport.server_error import ServerError

ROUND_MARGIN_S = 60.0
"""The least time a BSP server keeps a round open for a member's first push (ps-server's warm-up
bound, ps/rounds/deadlines.py): any round may carry a newcomer, so a reply may wait that long."""
ROUND_FACTOR = 4.0
"""A round's deadline in recent round times (ps-server's --round-deadline auto)."""
LONG_POLL_S = 5.0
"""The longest a server holds a parked worker's long poll before it answers with the unchanged plan."""
MIN_PARKED_POLL_S = 1.0
"""The least time between a parked worker's long polls: a server that answers one at once with the
unchanged plan (batch 0) is asked again after the rest of this, not in a busy loop of calls."""
MIN_VALUES_RATE = 256 * 1024
"""The slowest a reply's values may come in all, in bytes per second of the reader's waits."""
RECENT_ROUNDS = 20
"""How many of the latest intervals between push replies the round time is the median of."""


class CallBounds:
    """The bounds of one client's calls from `timeout_s` (--timeout), and the recent round times that
    a push's reply bound follows (`replied`, told at every push reply's header)."""

    def __init__(self, timeout_s: float) -> None:
        if not timeout_s > 0:
            raise ValueError(f"the call timeout must be > 0 s, got {timeout_s}")
        self.timeout_s = timeout_s
        self._rounds: deque[float] = deque(maxlen=RECENT_ROUNDS)
        self._last_reply: float | None = None

    @property
    def call_s(self) -> float:
        """A call answered at once, and the longest pause between a reply's chunks."""
        return self.timeout_s

    def values_s(self, num_values: int) -> float:
        """The reader's waits for a reply's `num_values` values, all together."""
        return self.timeout_s + 4 * max(0, num_values) / MIN_VALUES_RATE

    @property
    def long_poll_s(self) -> float:
        """A parked worker's long poll."""
        return self.timeout_s + LONG_POLL_S

    def round_s(self) -> float:
        """The longest a server may hold a round open: ROUND_MARGIN_S, or ROUND_FACTOR recent rounds."""
        recent = statistics.median(self._rounds) if self._rounds else 0.0
        return max(ROUND_MARGIN_S, ROUND_FACTOR * recent)

    def reply_s(self) -> float:
        """A push's reply: T plus the longest its round may stay open."""
        return self.timeout_s + self.round_s()

    def replied(self, now: float) -> None:
        """A push's reply header arrived at `now` (time.monotonic): one more round timed."""
        if self._last_reply is not None:
            self._rounds.append(max(0.0, now - self._last_reply))
        self._last_reply = now

    def rejoined(self) -> None:
        """A rejoin: the next reply starts a new interval (the time away is no round)."""
        self._last_reply = None

    def join_wait(self, target: str, status: JobStatus, waited_s: float) -> str:
        """What a Join to `target`, unanswered after `waited_s`, still waits for by the server's own
        `status`; a ServerError (DEADLINE_EXCEEDED, or FAILED_PRECONDITION once the job ended) where
        that status says the Join should have been answered by now."""
        t = self.timeout_s
        if status.done:
            raise ServerError("FAILED_PRECONDITION", f"the job at {target} has ended before it admitted this worker")
        started = bool(status.workers) or status.round > 0 or status.version > 0
        if not started:
            if status.expected_workers <= 1:
                raise ServerError("DEADLINE_EXCEEDED", f"the server at {target} did not answer this worker's Join "
                                  f"within {t:g} s (--timeout), though its job waits for no other worker")
            return f"the job to start (the server expects {status.expected_workers} workers)"
        if status.mode != "bsp" or not status.workers:
            raise ServerError("DEADLINE_EXCEEDED", f"the server at {target} did not answer this worker's Join "
                              f"within {t:g} s (--timeout), though its job admits a worker at once now")
        bound = self.reply_s()
        if waited_s > bound:
            raise ServerError("DEADLINE_EXCEEDED", f"the server at {target} did not admit this worker within "
                              f"{bound:.0f} s (--timeout {t:g} s + {self.round_s():.0f} s for the open round to close)")
        return "the open round to close (a worker enters the running job at the next round)"
