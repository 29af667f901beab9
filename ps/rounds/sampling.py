"""The coordinator's side of exactly-once epochs (`--sampling exact`, the default on the PS path): the
slices of each epoch's permutation its replies hand the workers (ps.rounds.epoch_slices), when a slice
counts as trained or goes back, the epoch count that follows them, and the check of a joining worker's
dataset against the job's.

BSP: at the first reply of a round every member the plan gives a batch gets its slice, in join order, so
worker k trains on [c + Σ_{j<k} b_j, c + Σ_{j≤k} b_j); a member told another batch for the same round
(a re-split after a removal) gets a new slice and the old one goes back. With each slice the reply hands
the member's slice of the round after, taken in the same order one round early: at that round's first
reply it becomes the member's slice if its batch held, and goes back otherwise (so a worker's loader
reads a step ahead; what it read of a slice taken back is dropped). The slices of the pushes in the
round's sum are consumed when it closes, every other slice of that round goes back (its worker left, was
evicted, or was dropped from the round). ASP: each reply hands the worker its next slice (and the one after, ahead, as in BSP); a push's
slice is consumed when its update is applied; a pull sends the slice held again (a refused push: the
same samples are trained again). A parked worker (batch 0) holds none. With --sampling independent
(and on the --allreduce fast path, whose workers read a step's reply a step late) no slices are handed:
each worker samples its own permutation, and epochs are counted from the samples trained."""

from __future__ import annotations

from typing import Any

from common.errors import FailedPrecondition, InvalidArgument
from common.transport.messages import MAX_FINGERPRINT, SliceRange
from ps.rounds.epoch_slices import EpochSlices
from ps.rounds.membership import Member
from ps.rounds.state import JobState


class Sampling:
    """Which samples each worker trains on next, and which of them reached the model."""

    def __init__(self, state: JobState, num_samples: int) -> None:
        self.state = state
        self.num_samples = num_samples
        self.slices = EpochSlices(num_samples, last_epoch=self._last_epoch())
        self.fingerprint: str | None = None  # the first worker's declared dataset fingerprint ("" none)
        self._declared = 0  # the joins, waiting or done, that declared it
        self._opened: int | None = None  # BSP: the round whose slices were handed out
        self._in_sum: set[str] = set()  # BSP: the workers whose push is in the open round's sum
        self._ran_out: set[str] = set()  # BSP: the workers handed no samples for the open round (resting)

    @property
    def exact(self) -> bool:
        return self.state.spec.exact_epochs

    def _last_epoch(self) -> int:
        """The last permutation handed out: BSP's last round wraps into π_E (E = --epochs) to keep its
        planned size; ASP has no round to fill, and stops at the job's last epoch, π_(E-1): a worker that
        stalls on a slice of an earlier epoch would otherwise let the others train up to all of π_E, an
        epoch the job never asked for, before its eviction served that slice again."""
        epochs = self.state.spec.epochs
        return epochs if self.state.spec.mode == "bsp" else epochs - 1

    def check_join(self, length: int, fingerprint: str) -> None:
        """A worker's declared dataset (`length` 0: not declared) is the job's, or it is refused: a
        malformed length or fingerprint InvalidArgument, another dataset FailedPrecondition."""
        if length < 0:
            raise InvalidArgument(f"dataset_length must be >= 0 (0: not declared), got {length}")
        if len(fingerprint) > MAX_FINGERPRINT or not fingerprint.isprintable():
            raise InvalidArgument(f"dataset_fingerprint must be at most {MAX_FINGERPRINT} printable characters "
                                  f"(empty: none), got {fingerprint!r:.80}")
        if length and length != self.num_samples:
            raise FailedPrecondition(f"this worker's dataset has {length} samples, the job's training set has "
                                     f"{self.num_samples}: every worker must train on the same dataset")
        if fingerprint and self.fingerprint and fingerprint != self.fingerprint:
            raise FailedPrecondition(f"this worker's dataset fingerprint {fingerprint!r} differs from the job's "
                                     f"{self.fingerprint!r} (the first worker's)")
        if fingerprint:
            self.fingerprint = fingerprint
            self._declared += 1

    def withdraw(self, fingerprint: str) -> None:
        """A join checked with `fingerprint` did not end in the job (cancelled while it waited, turned
        away): the job's fingerprint is kept only while a worker that declared it is joining or has
        joined, so that one that never trained cannot refuse every later worker."""
        if fingerprint and fingerprint == self.fingerprint:
            self._declared -= 1
            if self._declared == 0:
                self.fingerprint = None

    def slice_for(self, member: Member, batch: int) -> tuple[int, tuple[SliceRange, ...], tuple[SliceRange, ...]]:
        """The batch a reply tells `member` for its next step, planned at `batch`, the ranges it hands it
        (none: independent sampling), and the ranges handed ahead for the step after (none: the last
        epoch runs out first). The batch is smaller, or 0, only where the job's last epoch ran out (BSP:
        π_E, which the last round wraps into; ASP: π_(E-1), at the job's end and while a stalled worker
        holds slices of an earlier epoch until it pushes or is evicted)."""
        s = self.state
        if not self.exact or s.done or member.worker_id not in s.members:
            return batch, (), ()  # a reply to a worker removed meanwhile (its push's round closed after) hands nothing
        wid = member.worker_id
        if batch <= 0:  # parked: what it was handed ahead goes back
            self.slices.put_back(_ahead(wid), tally=False)
            return batch, (), ()
        if s.spec.mode != "bsp":
            if wid not in self.slices.held:
                self.slices.promote(_ahead(wid), wid, batch, key=0)
            return self._with_ahead(wid, self.slices.hand(wid, batch), batch, key=0)
        if self._opened != s.round:
            self._open(s.round)
        return self._with_ahead(wid, self._hand(wid, batch, s.round), batch, key=s.round + 1)

    def _hand(self, wid: str, batch: int, round: int) -> tuple[SliceRange, ...]:
        """`wid`'s slice of `batch` samples for BSP `round`, noting whether the last epoch left it none."""
        ranges = self.slices.hand(wid, batch, key=round)
        if ranges:
            self._ran_out.discard(wid)
        else:
            self._ran_out.add(wid)
        return ranges

    def resting(self, member: Member) -> bool:
        """BSP: the open round's slices are handed, and the job's last epoch left `member` none of them
        (its reply told it 0 while the plan gives it a batch: ps.rounds.parking asks only then). It waits
        for the round's close like a parked worker, and the round does not wait for its push."""
        wid = member.worker_id
        return wid in self._ran_out and wid not in self._in_sum and not self.state.done

    def _open(self, round: int) -> None:
        """BSP, the first reply of `round`: every member the plan gives a batch gets its slice, in the
        plan's order (the one handed ahead, if it was for this batch), then its slice ahead; an ahead
        slice its member is not planned for, or not at that size, goes back."""
        s = self.state
        self._opened = round
        plan = s.policy.plan()
        order = [m for m in sorted(s.members.values(), key=lambda m: m.index)  # the plan's fixed order
                 if plan.get(m.name, 0) > 0 and m.worker_id not in self._in_sum]
        planned = {m.worker_id for m in order}
        for holder in [h for h in self.slices.held if isinstance(h, tuple) and h[0] not in planned]:
            self.slices.put_back(holder, tally=False)
        for m in order:
            self.slices.promote(_ahead(m.worker_id), m.worker_id, plan[m.name], key=round)
        self._ran_out.clear()
        for m in order:
            self._hand(m.worker_id, plan[m.name], round)
        for m in order:
            self._hand_ahead(m.worker_id, plan[m.name], key=round + 1)

    def _with_ahead(self, wid: str, now: tuple[SliceRange, ...], batch: int,
                    key: int) -> tuple[int, tuple[SliceRange, ...], tuple[SliceRange, ...]]:
        """(batch, `now`, the slice ahead for `key`); none ahead where `now` is short (the job's last samples)."""
        return (*_sized(now), self._hand_ahead(wid, batch, key) if sum(r.count for r in now) == batch else ())

    def _hand_ahead(self, wid: str, batch: int, key: int) -> tuple[SliceRange, ...]:
        """`wid`'s slice ahead for `key`, only whole, and none that would start in π_E, which the job's
        last round only wraps into (it would be read and never trained); a short one goes back."""
        if _ahead(wid) not in self.slices.held and self.slices.next_epoch() >= self.state.spec.epochs:
            return ()
        ahead = self.slices.hand(_ahead(wid), batch, key=key, tally=False)
        if ahead and sum(r.count for r in ahead) != batch:
            self.slices.put_back(_ahead(wid), tally=False)
            return ()
        return ahead

    def pushed(self, member: Member, batch: int) -> None:
        """`member`'s push of `batch` samples is in: ASP, its update is applied; BSP, its gradient is in the
        round's sum. A push whose slice no reply handed takes the slice it is owed now; one from a worker
        that made no Pull since its Join never gets here (ps.rounds.push_checks refuses it)."""
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
        self._ran_out.clear()

    def removed(self, member: Member) -> None:
        """`member` left or was evicted: its slice goes back unless its push is in the open round's sum."""
        self._ran_out.discard(member.worker_id)
        if member.worker_id not in self._in_sum:
            self.slices.put_back(member.worker_id)
        self.slices.put_back(_ahead(member.worker_id), tally=False)

    def completed_epochs(self) -> int | None:
        """Epochs whose every sample reached the model (None: independent sampling counts samples instead)."""
        return self.slices.completed if self.exact else None

    def state_dict(self) -> dict[str, Any]:
        return self.slices.state_dict() if self.exact else {}

    def restore(self, state: dict[str, Any]) -> None:
        """From a checkpoint (one without slices: the resumed epoch starts its permutation afresh)."""
        # an ASP checkpoint may hold a cursor in π_E, where its last epoch once wrapped
        last = max(self._last_epoch(), int(state.get("slice_epoch", 0)))
        self.slices = EpochSlices.from_state(self.num_samples, state, int(state["epoch"]), last)

    def report(self) -> dict[str, Any]:
        return {"sampling": self.state.spec.sampling if self.exact else "independent",
                **({"exactly_once": self.slices.report()} if self.exact else {})}


def _ahead(worker_id: str) -> tuple[str, str]:
    """The holder of `worker_id`'s slice handed ahead (the step after its next)."""
    return worker_id, "ahead"


def _sized(ranges: tuple[SliceRange, ...]) -> tuple[int, tuple[SliceRange, ...]]:
    return sum(r.count for r in ranges), ranges
