"""The coordinator's side of exactly-once epochs (`--sampling exact`, the default on the PS path): the
slices of each epoch's permutation its replies hand the workers (ps.rounds.epoch_slices), when a slice
counts as trained or goes back, the epoch count that follows them, and the check of a joining worker's
dataset against the job's.

BSP: at the first reply of a round every member the plan gives a batch gets its slice, in join order, so
worker k trains on [c + Σ_{j<k} b_j, c + Σ_{j≤k} b_j); a member told another batch for the same round
(a re-split after a removal) gets a new slice and the old one goes back. The slices of the pushes in the
round's sum are consumed when it closes, every other slice of that round goes back (its worker left, was
evicted, or was dropped from the round). ASP: each reply hands the worker its next slice; a push's
slice is consumed when its update is applied; a pull sends the slice held again (a refused push: the
same samples are trained again). A parked worker (batch 0) holds none. With --sampling independent
(and on the --allreduce fast path, whose workers read a step's reply a step late) no slices are handed:
each worker samples its own permutation, and epochs are counted from the samples trained."""

from __future__ import annotations

from typing import Any

from common.errors import FailedPrecondition
from common.transport.messages import SliceRange
from ps.rounds.epoch_slices import EpochSlices
from ps.rounds.membership import Member
from ps.rounds.state import JobState


class Sampling:
    """Which samples each worker trains on next, and which of them reached the model."""

    def __init__(self, state: JobState, num_samples: int) -> None:
        self.state = state
        self.num_samples = num_samples
        self.slices = EpochSlices(num_samples, last_epoch=state.spec.epochs)
        self.fingerprint: str | None = None  # the first worker's declared dataset fingerprint ("" none)
        self._opened: int | None = None  # BSP: the round whose slices were handed out
        self._in_sum: set[str] = set()  # BSP: the workers whose push is in the open round's sum

    @property
    def exact(self) -> bool:
        return self.state.spec.exact_epochs

    def check_join(self, length: int, fingerprint: str) -> None:
        """A worker's declared dataset (`length` 0: not declared) is the job's, or it is refused."""
        if length and length != self.num_samples:
            raise FailedPrecondition(f"this worker's dataset has {length} samples, the job's training set has "
                                     f"{self.num_samples}: every worker must train on the same dataset")
        if fingerprint and self.fingerprint and fingerprint != self.fingerprint:
            raise FailedPrecondition(f"this worker's dataset fingerprint {fingerprint!r} differs from the job's "
                                     f"{self.fingerprint!r} (the first worker's)")
        if fingerprint and not self.fingerprint:
            self.fingerprint = fingerprint

    def slice_for(self, member: Member, batch: int) -> tuple[int, tuple[SliceRange, ...]]:
        """The batch a reply tells `member` for its next step, planned at `batch`, and the ranges it hands
        it (none: independent sampling). The batch is smaller, or 0, only where the job's last epoch
        (π_E, which the last round wraps into) ran out: in ASP, while a stalled worker holds slices
        of an earlier epoch until it pushes or is evicted."""
        s = self.state
        if not self.exact or batch <= 0 or s.done or member.worker_id not in s.members:
            return batch, ()  # a reply to a worker removed meanwhile (its push's round closed after) hands nothing
        if s.spec.mode != "bsp":
            return _sized(self.slices.hand(member.worker_id, batch))
        if self._opened != s.round:
            self._opened = s.round
            plan = s.policy.plan()
            for other in sorted(s.members.values(), key=lambda m: m.index):  # the plan's fixed order
                if plan.get(other.name, 0) > 0 and other.worker_id not in self._in_sum:
                    self.slices.hand(other.worker_id, plan[other.name], key=s.round)
        return _sized(self.slices.hand(member.worker_id, batch, key=s.round))

    def pushed(self, member: Member, batch: int) -> None:
        """`member`'s push of `batch` samples is in: ASP, its update is applied; BSP, its gradient is in the
        round's sum. A push whose slice no reply handed (a client that pushes right after Join, without
        the Pull a worker makes first) takes the slice it is owed now."""
        if not self.exact:
            return
        bsp = self.state.spec.mode == "bsp"
        held = self.slices.held.get(member.worker_id)
        if held is None or (bsp and held.key != self.state.round):
            self.slice_for(member, batch)
        if bsp:
            self._in_sum.add(member.worker_id)
        else:
            self.slices.consume(member.worker_id)

    def round_closed(self) -> None:
        """BSP: the open round stepped; its slices in the sum are trained, the others go back."""
        closing = self.state.round
        for holder, held in list(self.slices.held.items()):
            if held.key == closing and holder in self._in_sum:
                self.slices.consume(holder)
            elif held.key <= closing:
                self.slices.put_back(holder)
        self._in_sum.clear()

    def removed(self, member: Member) -> None:
        """`member` left or was evicted: its slice goes back unless its push is in the open round's sum."""
        if member.worker_id not in self._in_sum:
            self.slices.put_back(member.worker_id)

    def completed_epochs(self) -> int | None:
        """Epochs whose every sample reached the model (None: independent sampling counts samples instead)."""
        return self.slices.completed if self.exact else None

    def state_dict(self) -> dict[str, Any]:
        return self.slices.state_dict() if self.exact else {}

    def restore(self, state: dict[str, Any]) -> None:
        """From a checkpoint (one without slices: the resumed epoch starts its permutation afresh)."""
        self.slices = EpochSlices.from_state(self.num_samples, state, int(state["epoch"]), self.state.spec.epochs)

    def report(self) -> dict[str, Any]:
        return {"sampling": self.state.spec.sampling if self.exact else "independent",
                **({"exactly_once": self.slices.report()} if self.exact else {})}


def _sized(ranges: tuple[SliceRange, ...]) -> tuple[int, tuple[SliceRange, ...]]:
    return sum(r.count for r in ranges), ranges
