"""Progress, not only liveness: the deadlines a member is held to besides its heartbeat.

A heartbeat says a worker's process lives, not that it trains: a loader stuck on a network file
system, a hung kernel or a push stream that sent its header and then nothing keep a worker's heartbeat
going while every BSP round waits for it. So:

- A BSP round has a deadline D = max(floor, k·T̂) from the moment it opened, T̂ the round time the
  batch policy predicts or else the median of the recent rounds (the larger when both are known),
  k = ROUND_FACTOR. Until MIN_ROUNDS rounds were timed (the job's start, a resume) D is at least the
  warm-up bound W (--round-warmup, WARMUP_S): the first rounds carry the workers' first pulls and
  warm-up. So does the first round of a member present at the job's start (or a resume's), and of a
  member whose name enters the job for the first time while nobody planned trains: it is held to W at
  least; the same name back after an eviction or a leave is not (ps.rounds.rejoins). A newcomer to a
  running job is on probation instead, on every path (ps.rounds.probation): the plan does not hold it,
  so no round waits for it, until its probe push arrived; then it is held to D. A
  probationer whose probe has not arrived W after it was asked for is evicted (it holds a place among
  --max-workers, not a round; --round-deadline off lifts this bound too). A member
  that entered after the round opened counts from its entry. At its bound, a member the round
  waits for whose push is not complete is evicted (its next call hears "evicted at round R's deadline
  (the bound applied) ...; rejoin" and it rejoins as after any eviction); the round closes over the
  pushes that arrived, weighted by their samples, and B is re-split over the others from the next
  round (Σb = B). A round nobody's push reached has a deadline too, the larger of D and W (with
  --round-deadline auto): every member late is more likely the job slow than every member stuck, but
  members that only hold their streams open do not hold the round for ever.
- ASP with --staleness-bound: a running worker that holds others back (its clock is the slowest while
  some reply is held for it) and has not pushed for D (T̂: the median time between a worker's pushes)
  is evicted, which lets the held replies go.
- A worker that joined before the job started waits at most `join_wait_s` for the start.

`--round-deadline` sets D to a fixed number of seconds (no warm-up then), or `off`; `--round-deadline-floor`
the floor. The idle limit between the chunks of one push is the transport's (ps.serving.push_stream), the
wait of a push for room among the others ps.rounds.inflight's (--push-admit-wait)."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ps.rounds.asp import AspUpdates
from ps.rounds.bsp import BspRound
from ps.rounds.epochs import Epochs
from ps.rounds.inflight import ADMIT_WAIT_S
from ps.rounds.membership import Member
from ps.rounds.probation import Probation
from ps.rounds.state import JobState

ROUND_FACTOR = 4.0
"""k: a round may take this many times its predicted (or recent median) time before its late members go."""
WARMUP_S = 60.0
"""The least deadline before MIN_ROUNDS rounds (ASP: pushes) were timed."""
MIN_ROUNDS = 3
HISTORY = 20
"""How many recent rounds (ASP: push intervals) the median is taken over."""


@dataclass(frozen=True)
class Limits:
    """What a peer may make the server wait for or hold: --round-deadline ('auto', 'off' or seconds),
    --round-deadline-floor, --push-idle (seconds without data in a push), --join-wait (seconds before
    the start), --push-buffer (bytes of pushes streaming at once: ps.rounds.inflight), --round-warmup
    (the least deadline of the first rounds), --push-admit-wait (seconds a push waits for room)."""

    round_deadline: str | float = "auto"
    floor_s: float = 5.0
    push_idle_s: float | None = 10.0
    join_wait_s: float | None = 300.0
    push_bytes: int = 1 << 30
    warmup_s: float = WARMUP_S
    admit_wait_s: float = ADMIT_WAIT_S

    def __post_init__(self) -> None:
        if isinstance(self.round_deadline, str):
            if self.round_deadline not in ("auto", "off"):
                raise ValueError(f"--round-deadline must be auto, off or seconds > 0, got {self.round_deadline!r}")
        elif not self.round_deadline > 0:
            raise ValueError(f"--round-deadline must be > 0 seconds, got {self.round_deadline}")
        if not self.floor_s > 0:
            raise ValueError(f"--round-deadline-floor must be > 0 seconds, got {self.floor_s}")
        if not self.warmup_s > 0:
            raise ValueError(f"--round-warmup must be > 0 seconds, got {self.warmup_s}")
        if not self.admit_wait_s > 0:
            raise ValueError(f"--push-admit-wait must be > 0 seconds, got {self.admit_wait_s}")


class RoundTimes:
    """The recent round times and the deadline they give. Pure: times are passed in."""

    def __init__(self, settings: Limits) -> None:
        self.settings = settings
        self.recent: deque[float] = deque(maxlen=HISTORY)  # seconds

    def observe(self, seconds: float) -> None:
        self.recent.append(max(0.0, seconds))

    def deadline(self, predicted_s: float | None = None) -> float | None:
        """D in seconds (None: no deadline)."""
        s = self.settings
        if s.round_deadline == "off":
            return None
        if not isinstance(s.round_deadline, str):
            return float(s.round_deadline)
        if len(self.recent) < MIN_ROUNDS:
            return max(s.floor_s, s.warmup_s)
        expected = statistics.median(self.recent)
        if predicted_s is not None and predicted_s > expected:
            expected = predicted_s
        return max(s.floor_s, ROUND_FACTOR * expected)


class Deadlines:
    """Checks the deadlines (called by the coordinator's reaper) and evicts through `evict(worker_id, reason)`."""

    def __init__(self, state: JobState, bsp: BspRound, asp: AspUpdates, epochs: Epochs, probation: Probation,
                 settings: Limits, evict: Callable[[str, str], None]) -> None:
        self.state = state
        self.probation = probation
        self.epochs = epochs
        self.bsp = bsp
        self.asp = asp
        self.settings = settings
        self.evict = evict
        self.rounds = RoundTimes(settings)
        self.intervals = RoundTimes(settings)  # ASP: the time between a worker's pushes
        self._opened_at: float | None = None  # when the open BSP round opened (None: the job's start)
        self.longest_open_s = 0.0  # the longest any BSP round stayed open
        self.dropped = 0  # members evicted at a deadline
        self.rounds_closed = self.short_rounds = 0  # BSP rounds this server closed; those of fewer than B samples
        self.first_round: int | None = None  # the round this server started at (a resume's)

    def report(self) -> dict[str, float | int | None]:
        """The summary's fields: rounds closed here and short of B, the longest a round stayed open, drops."""
        return {"rounds_closed": self.rounds_closed, "short_rounds": self.short_rounds, "first_round": self.first_round,
                "longest_round_open_s": round(self.longest_open_s, 3), "deadline_drops": self.dropped}

    @property
    def opened_at(self) -> float | None:
        """When the open BSP round opened (None: the job has not started)."""
        if self.first_round is None and self.epochs.start_time is not None:
            self.first_round = self.state.round
        return self._opened_at if self._opened_at is not None else self.epochs.start_time

    def round_closed(self, batch: int) -> None:
        """A BSP round closed with `batch` samples: time it, count it; the next one opens now."""
        now = self.state.clock()
        self.rounds_closed += 1
        planned = self.state.policy.config.global_batch  # the round's B (--adaptive-batch moves it from the flag's)
        if batch != planned:  # a member left or was dropped while the round was open
            self.short_rounds += 1
            self.state.metrics.write("short_round", round=self.state.round, batch=batch,
                                     global_batch=planned, step=self.state.step)
        if self.opened_at is not None:
            self.rounds.observe(now - self.opened_at)
            self.longest_open_s = max(self.longest_open_s, now - self.opened_at)
        self._opened_at = now

    def pushed(self, member: Member) -> None:
        """A push from `member` arrived whole (ASP: time since its previous one)."""
        now = self.state.clock()
        if self.state.spec.mode == "asp" and member.pushed_at is not None:
            self.intervals.observe(now - member.pushed_at)
        member.pushed(now)

    def round_deadline_s(self) -> float | None:
        """The open BSP round's deadline, in seconds from its opening."""
        policy = self.state.policy
        predicted_ms = policy.predicted_round_ms(sum(policy.plan().values()))
        return self.rounds.deadline(None if predicted_ms is None else predicted_ms / 1000.0)

    def check(self) -> list[str]:
        """Evict the members past a deadline; their names."""
        s = self.state
        if s.done:
            return []
        if self.opened_at is None:
            return self._join_waits()
        if s.spec.mode == "bsp":
            return self._late_in_round() + self._probes_overdue()
        return self._holding_others()

    def _late_in_round(self) -> list[str]:
        deadline = self.round_deadline_s()
        opened = self.opened_at
        assert opened is not None
        if deadline is None or self.bsp.committing:
            return []
        now = self.state.clock()
        late = []
        for worker_id in sorted(self.bsp.parking.required() - self.bsp.pushed):
            member = self.state.members[worker_id]
            bound, why = self.member_bound(member, deadline)
            # a member that entered after the round opened (nobody was left in it) counts from its entry
            since = opened if member.pushed_at is None else max(opened, member.pushed_at)
            if now - since > bound:
                late.append((member, f"evicted at round {self.state.round}'s deadline ({bound:.1f} s{why}) "
                                     "without its push"))
        return self._drop(late)

    def member_bound(self, member: Member, deadline: float) -> tuple[float, str]:
        """The open round's bound for `member` (D, or with --round-deadline auto the warm-up's on its
        name's first round and on a round nobody's push reached) and what it is, for its eviction."""
        warmup = self.settings.warmup_s
        if self.settings.round_deadline != "auto" or warmup <= deadline:
            return deadline, ""
        if member.warmup and not member.updates:
            return warmup, ": its name's first round, the warm-up bound (--round-warmup)"
        if not self.bsp.pushed:
            return warmup, ": no push of the round arrived, the warm-up bound (--round-warmup)"
        return deadline, ""

    def _probes_overdue(self) -> list[str]:
        """Evict the probationers whose probe has not arrived within the warm-up bound W."""
        if self.settings.round_deadline == "off":
            return []
        bound = self.settings.warmup_s
        why = f"evicted: its probe push did not arrive within {bound:.1f} s of the ask (the warm-up bound, --round-warmup)"
        return self._drop([(m, why) for m in self.probation.overdue(self.state.clock(), bound)])

    def _holding_others(self) -> list[str]:
        if not self.asp.held or self.settings.round_deadline == "off":
            return []
        deadline = self.intervals.deadline()
        assert deadline is not None
        now = self.state.clock()
        clocks = self.asp.clocks
        slowest = clocks.slowest()
        late = [m for w, m in self.state.members.items()
                if w not in self.asp.held and clocks.clocks.get(w) == slowest
                and now - (m.pushed_at if m.pushed_at is not None else m.last_seen) > deadline]
        why = f"evicted: held other workers back (--staleness-bound) without a push for {deadline:.1f} s"
        return self._drop([(m, why) for m in late])

    def _drop(self, late: list[tuple[Member, str]]) -> list[str]:
        """Evict each member with its reason; their names."""
        for member, reason in late:
            self.dropped += 1
            self.state.metrics.write("deadline", worker=member.name, round=self.state.round, step=self.state.step,
                                     epoch=self.state.epoch, reason=reason)
            self.evict(member.worker_id, reason)
        return [m.name for m, _ in late]

    def _join_waits(self) -> list[str]:
        """Before the start: the pending members that waited longer than join_wait_s."""
        limit = self.settings.join_wait_s
        if limit is None:
            return []
        now = self.state.clock()
        late = [m for m in self.state.membership.pending.values() if now - m.last_seen > limit]
        for member in late:  # its Join wakes to hear why (Coordinator.join)
            member.turn_away(f"worker {member.name} waited {limit:g} s for the job to start (--join-wait); join again")
            self.state.membership.remove(member.worker_id, member.turned_away, now)
            self.state.metrics.write("join_wait", worker=member.name, waited_s=limit)
            member.activated.set()
        return [m.name for m in late]
