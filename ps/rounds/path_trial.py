"""--allreduce auto on CPU workers: try both paths for a few rounds at one plan and keep the faster.

On GPUs of their own the fast path is chosen at the start (ps.rounds.fast_path). On CPU workers which
path wins depends on the model's size and the workers' quotas, so the job measures: it starts on the
PS path, and once a batch-policy decision has kept the plan (the policy has settled) it freezes the
plan (no decision until the trial ends), lets SETTLE_ROUNDS rounds pass and times MEASURE_ROUNDS
rounds, close to close. Then it switches to
the collective fast path at a round's close: that round's replies carry the parameters, the group
and path "allreduce", and each worker pulls the optimizer state and forms the group. After
SETTLE_ROUNDS rounds for the group to form, as many rounds are timed again at the same plan. The
faster path is kept; if that is the PS path, the job switches back at a round's close: the replies
say path "ps" and ask every member for a snapshot of its parameters and optimizer state (the
members' copies are equal: the first to arrive becomes the server's, before any gradient of the
next round is taken, since each worker sends it before its own push).

A membership change (a re-split the freeze does not hold; --adaptive-batch is not tried) starts the
current path's timing again, on the PS path from the next decision that keeps the plan. The trial needs --sampling independent: the fast path does not hand
out the epochs' slices, so with --sampling exact the job stays on the PS path and says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from common.errors import FailedPrecondition
from ps.rounds.bsp import BspRound
from ps.rounds.fast_path import FastPath
from ps.rounds.membership import Member
from ps.rounds.rendezvous import Rendezvous
from ps.rounds.state import JobState
from ps.rounds.whole_model import WholeModel

SETTLE_ROUNDS = 4  # rounds before a path is timed: a plan that just held, or a group still forming
MEASURE_ROUNDS = 16  # rounds timed on each path
PATHS = ("ps", "allreduce")


@dataclass
class _Window:
    """Rounds timed on one path: from the close of round `start_round` on."""

    path: str
    start_round: int
    start_time: float
    samples: int = 0

    def count(self, batch: int) -> None:
        self.samples += batch


class PathTrial:
    """The trial's phases: off, steady (the PS path waits for a decision that keeps the plan), settle
    (the plan frozen from here: rounds before the timing, for the group to form on the fast path),
    measure, awaiting (the switch back waits for a snapshot), decided."""

    def __init__(self, state: JobState, bsp: BspRound, fast_path: FastPath, whole_model: WholeModel,
                 stop: Callable[[str], None], adaptive: bool) -> None:
        """`stop` ends the job (the switch back lost every holder of the parameters); `adaptive`: the
        job runs --adaptive-batch (not tried). Offers itself to `fast_path`'s choice at the start."""
        self.state = state
        self.bsp = bsp
        self.fast_path = fast_path
        self.whole_model = whole_model
        self.stop = stop
        self.adaptive = adaptive
        fast_path.offer_trials(self.offer)
        self.phase = "off"
        self.why = ""  # what the path event and Status say
        self.rates: dict[str, float] = {}  # samples/s per path, as timed
        self._start_rendezvous: Callable[[], Rendezvous] | None = None
        self._plan: dict[str, int] = {}
        self._held_since = 0
        self._window: _Window | None = None  # the rounds being timed
        self._replies_carry_params = False  # the replies of the round that switched to the fast path
        self._snapshot_from: set[str] = set()  # the switch back: members asked for the parameters
        self._park = False  # parking as configured, restored on the PS path

    @property
    def active(self) -> bool:
        return self.phase not in ("off", "decided")

    @property
    def awaiting(self) -> bool:
        """The switch back waits for the parameters (a snapshot from a member)."""
        return self.phase == "awaiting"

    @property
    def holds_plan(self) -> bool:
        """No batch-policy decision while a path is timed (both are timed at one plan)."""
        return self.phase in ("settle", "measure", "awaiting")

    @property
    def blocked_by_job(self) -> str:
        """Why this job's flags rule the trial out (empty: the workers that start it decide)."""
        return ("the fast path does not hand out the epochs' slices, so --sampling exact stays on the PS path"
                if self.state.spec.exact_epochs else
                "--adaptive-batch moves the plan, so the paths are not tried" if self.adaptive else "")

    def offer(self, start_rendezvous: Callable[[], Rendezvous], why: str, starting: list[Member]) -> str:
        """--allreduce auto, at the start, where the fast path was not chosen (`why`): begin the trial
        if it can run for a job that starts with the members `starting`; what the path event says either way."""
        blocked = self.blocked_by_job or (
            "one worker has no group to all-reduce with" if len(starting) < 2 else
            "a worker cannot follow a switch (it shares its process with another session, or predates "
            "the trial), so the paths are not tried" if not all(m.switch_paths for m in starting) else "")
        if blocked:
            return f"{why}; {blocked}"
        self._start_rendezvous = start_rendezvous
        self.phase = "steady"
        self.why = f"{why}: trying both paths, the PS path first, {MEASURE_ROUNDS} rounds each at one plan"
        self._plan = dict(self.state.policy.plan())
        return self.why

    def decided(self, changed: bool) -> None:
        """A batch-policy decision: one that kept the plan lets the trial begin (the policy has settled)."""
        if self.phase == "steady" and not changed:
            self.phase, self._held_since = "settle", self.state.round

    # ------------------------------------------------------------------ rounds
    def round_closed(self, batch: int) -> None:
        """A round closed (the coordinator's round already counts it) with `batch` samples."""
        self._replies_carry_params = False
        if not self.active or self.state.done:
            return
        s = self.state
        plan = dict(s.policy.plan())
        path = "allreduce" if s.rendezvous is not None else "ps"
        if plan != self._plan:  # a join, a leave, an eviction (or a decision before the trial began)
            self._plan, self._held_since, self._window = plan, s.round, None
            if self.phase in ("settle", "measure"):  # time this path again: on the PS path once the policy settles
                self.phase = "steady" if path == "ps" else "settle"
            return
        if self.phase in ("steady", "awaiting"):
            return
        if self.phase == "settle":
            if s.round - self._held_since >= SETTLE_ROUNDS:
                self.phase, self._window = "measure", _Window(path, s.round, s.clock())
            return
        window = self._window
        assert window is not None
        window.count(batch)
        if s.round - window.start_round < MEASURE_ROUNDS:
            return
        elapsed = s.clock() - window.start_time
        self.rates[path] = window.samples / elapsed if elapsed > 0 else float("inf")
        if path == "ps":
            self._to_fast_path()
        else:
            self._decide()

    def _to_fast_path(self) -> None:
        s = self.state
        assert self._start_rendezvous is not None
        self._park = self.fast_path.enter(self._start_rendezvous())
        self.bsp.follow_path()
        self.fast_path.regroup()
        self._replies_carry_params = True
        self.phase, self._held_since, self._window = "settle", s.round, None
        self._write(True, "trying the collective fast path", switched=True)

    def _decide(self) -> None:
        ps, fast = self.rates["ps"], self.rates["allreduce"]
        if fast >= ps:
            self.phase = "decided"
            self.why = f"kept the collective fast path: {fast:.1f} samples/s against {ps:.1f} on the PS path"
            self._write(True, self.why)
            return
        self.why = f"kept the PS path: {ps:.1f} samples/s against {fast:.1f} on the collective fast path"
        self._to_ps_path()

    def _to_ps_path(self) -> None:
        s = self.state
        assert s.rendezvous is not None
        self._snapshot_from = {m.worker_id for m in s.planned()}  # the group's: a probationer holds no copy of it
        self.fast_path.leave(self._park)
        self.bsp.follow_path()
        self.phase = "awaiting"
        self.whole_model.request_snapshot(first=self._snapshot_loaded)  # checkpoints and evaluations wait for it too
        self._write(False, self.why, switched=True)

    def _write(self, allreduce: bool, why: str, switched: bool = False) -> None:
        s = self.state
        s.metrics.write("path", allreduce=allreduce, why=why, balance=s.spec.balance, step=s.step, epoch=s.epoch,
                        rates={k: round(v, 1) for k, v in self.rates.items()}, switched=switched)

    # ------------------------------------------------------------ the replies
    def reply_carries_params(self, ps_path: bool) -> bool:
        """Whether a reply carries the parameters: on the PS path (`ps_path`), but not while the switch
        back waits for them (the server's are stale; a worker's copy is the group's); on the fast path
        only in the round that switched to it (the workers' copies start from them)."""
        return (ps_path and self.phase != "awaiting") or self._replies_carry_params

    def path(self) -> str:
        """What every reply says of the path: "" when no trial runs (nothing to switch)."""
        if self.phase == "off":
            return ""
        return "allreduce" if self.state.rendezvous is not None else "ps"

    def asks_snapshot(self, member: Member) -> bool:
        """The switch back: every member is asked for its parameters until one snapshot arrived."""
        return self.phase == "awaiting" and member.worker_id in self._snapshot_from

    def was_asked(self, member: Member) -> bool:
        """The switch back asked `member` for a snapshot (answered or not: a late one is refused as not wanted)."""
        return member.worker_id in self._snapshot_from

    def check_snapshot(self, member: Member) -> None:
        """FailedPrecondition unless the switch back waits for this member's snapshot."""
        if not self.asks_snapshot(member):
            raise FailedPrecondition("no snapshot was requested")

    def _snapshot_loaded(self) -> None:
        """The switch back's snapshot is the server's parameters: the PS path's rounds go on from them."""
        if self.phase == "awaiting":
            self.phase = "decided"

    def check_gradient(self) -> None:
        """A gradient before the switch back's snapshot arrived would be taken into a round whose step
        starts from stale parameters: refused (the worker pulls and pushes again)."""
        if self.phase == "awaiting":
            raise FailedPrecondition("the server waits for the fast path's parameters (a snapshot) before it takes "
                                     "gradients again; pull and push the next batch")

    def removed(self, member: Member) -> None:
        self._snapshot_from.discard(member.worker_id)
        if self.phase == "awaiting" and not self._snapshot_from:
            self.stop("stopping: every worker holding the fast path's parameters left before one sent them")
