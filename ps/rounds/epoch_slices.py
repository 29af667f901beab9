"""Exactly-once epochs at unequal, changing batch sizes: the server hands out each epoch's permutation
π_e (common.job.epoch_order) in ranges, so that every sample reaches the model once per epoch.

A cursor c runs through π_e. A holder (a worker) asks for `count` samples and gets ranges: first any
ranges put back (served before anything new, oldest epoch first), then π_e[c, c + count), c advancing.
Asked in a BSP round's plan order b_1..b_W, worker k gets [c + Σ_{j<k} b_j, c + Σ_{j≤k} b_j). A slice
is held until its samples reach the model (`consume`) or it is given up (`put_back`: the worker left or
was evicted, its push was refused, its round closed without it); ranges put back are served again
before their epoch ends. Epoch e ends when all N of its samples were consumed (`completed`).

The epoch's last slices wrap: when fewer than `count` samples of π_e are left, the slice takes them and
goes on into π_{e+1} (a range each), so every round keeps its planned size and its step stays exact,
weighted by the samples its pushes carry. Epoch e is counted over with the round that consumed its last
sample; that round also trained on the first samples of π_{e+1}, which count for epoch e+1.

Pure bookkeeping, no I/O: the coordinator drives it (ps.rounds.sampling)."""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from common.transport.messages import SliceRange


@dataclass(frozen=True)
class Held:
    """A slice handed to a holder and not yet consumed or put back; `key` says what it was for (a BSP round)."""

    key: int
    ranges: tuple[SliceRange, ...]
    asked: int  # the samples asked for (more than the ranges hold when the last epoch ran out)

    @property
    def count(self) -> int:
        return sum(r.count for r in self.ranges)


class Coverage:
    """The samples of one epoch consumed so far, as sorted disjoint [start, stop) intervals."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.stops: list[int] = []
        self.samples = 0

    def add(self, start: int, stop: int) -> bool:
        """Take [start, stop) in; False (and nothing taken) if it overlaps what is already in."""
        i = bisect.bisect_right(self.starts, start)
        if (i > 0 and self.stops[i - 1] > start) or (i < len(self.starts) and self.starts[i] < stop):
            return False
        self.samples += stop - start
        if i > 0 and self.stops[i - 1] == start:  # join the interval before
            i -= 1
            start = self.starts[i]
            del self.starts[i], self.stops[i]
        if i < len(self.starts) and self.starts[i] == stop:  # and the one after
            stop = self.stops[i]
            del self.starts[i], self.stops[i]
        self.starts.insert(i, start)
        self.stops.insert(i, stop)
        return True


class EpochSlices:
    """The cursor into the epochs' permutations, the slices out, those put back, what was consumed."""

    def __init__(self, num_samples: int, epoch: int = 0, cursor: int = 0, put_back: Iterable[SliceRange] = (),
                 last_epoch: int | None = None) -> None:
        """Start at π_epoch[cursor] with `put_back` still to serve (a checkpoint's state, `state_dict`);
        the epochs before `epoch` count as consumed, and so does π_epoch[0, cursor) but for `put_back`.
        `last_epoch`: no samples are handed out past π_last_epoch (the job's end)."""
        if num_samples < 1:
            raise ValueError(f"an epoch needs at least one sample, got {num_samples}")
        returned = sorted(put_back, key=lambda r: (r.epoch, r.offset))
        bad = [r for r in returned if not (r.epoch <= epoch and 0 <= r.offset and 0 < r.count
                                           and r.stop <= (cursor if r.epoch == epoch else num_samples))]
        if not 0 <= cursor <= num_samples or (last_epoch is not None and epoch > last_epoch) or bad:
            raise ValueError(f"slice state out of range: epoch {epoch}, cursor {cursor}, put back {returned}")
        self.num_samples, self.last_epoch = num_samples, last_epoch
        self.epoch, self.cursor = epoch, cursor
        self.returned: list[SliceRange] = returned
        self.held: dict[Hashable, Held] = {}
        self.coverage: dict[int, Coverage] = {}
        self.trained: dict[int, int] = {}  # epoch -> samples consumed (for the summary)
        self.put_back_samples = self.put_back_ranges = self.overlaps = 0
        first = min([r.epoch for r in returned] + [epoch])
        self.completed = first  # epochs wholly consumed, in order
        for e in range(first, epoch + 1):  # what the state says was consumed: all but the cursor's rest and put_back
            end = cursor if e == epoch else num_samples
            holes = [(r.offset, r.stop) for r in returned if r.epoch == e]
            self._cover(e, _gaps(end, holes))
        self._advance_completed()

    # ------------------------------------------------------------- handing out
    def take(self, count: int) -> tuple[SliceRange, ...]:
        """The next `count` samples: ranges put back first, then π's from the cursor (wrapping into the
        next epoch's permutation); fewer if that would pass `last_epoch`."""
        if count < 1:
            raise ValueError(f"a slice needs at least one sample, got {count}")
        out: list[SliceRange] = []
        need = count
        while need and self.returned:
            r = self.returned[0]
            part = SliceRange(r.epoch, r.offset, min(need, r.count))
            out.append(part)
            need -= part.count
            if part.count == r.count:
                self.returned.pop(0)
            else:
                self.returned[0] = SliceRange(r.epoch, r.offset + part.count, r.count - part.count)
        while need:
            if self.cursor == self.num_samples:
                if self.last_epoch is not None and self.epoch >= self.last_epoch:
                    break
                self.epoch, self.cursor = self.epoch + 1, 0
            part = SliceRange(self.epoch, self.cursor, min(need, self.num_samples - self.cursor))
            out.append(part)
            self.cursor += part.count
            need -= part.count
        return tuple(_merged(out))

    def next_epoch(self) -> int:
        """The epoch of the next sample `take` hands out."""
        if self.returned:
            return self.returned[0].epoch
        return self.epoch + 1 if self.cursor == self.num_samples else self.epoch

    def hand(self, holder: Hashable, count: int, key: int = 0, tally: bool = True) -> tuple[SliceRange, ...]:
        """`holder`'s slice of `count` samples for `key`: the one it holds if that was asked for the same
        size and key (a reply sent again), else a new one (what it held is put back, counted as
        `put_back` says of `tally`). Fewer samples, or none, once the last epoch ran out."""
        held = self.held.get(holder)
        if held is not None and held.key == key and held.asked == count:
            return held.ranges
        if held is not None:
            self.put_back(holder, tally)
        ranges = self.take(count)
        if ranges:
            self.held[holder] = Held(key, ranges, count)
        return ranges

    def promote(self, ahead: Hashable, holder: Hashable, count: int, key: int) -> bool:
        """Hand `holder` for `key` the slice handed ahead under `ahead` (the same samples, told a step
        early), if that was asked for this `count` and `key` and `holder` holds nothing; False otherwise
        (what `ahead` held goes back, to be served first)."""
        held = self.held.pop(ahead, None)
        if held is None:
            return False
        if held.key != key or held.asked != count or holder in self.held:
            self.held[ahead] = held
            self.put_back(ahead, tally=False)
            return False
        self.held[holder] = held
        return True

    def put_back(self, holder: Hashable, tally: bool = True) -> int:
        """`holder`'s slice never reached the model: serve it again first. The samples put back.
        `tally`: counted in the report (not for a slice handed ahead, which no step was told to train)."""
        held = self.held.pop(holder, None)
        if held is None:
            return 0
        self.returned = sorted(self.returned + list(held.ranges), key=lambda r: r.epoch)  # stable: FIFO in an epoch
        if tally:
            self.put_back_samples += held.count
            self.put_back_ranges += len(held.ranges)
        return held.count

    def consume(self, holder: Hashable) -> int:
        """`holder`'s slice reached the model; the samples it held (0: it held none)."""
        held = self.held.pop(holder, None)
        if held is None:
            return 0
        for r in held.ranges:
            self._cover(r.epoch, [(r.offset, r.stop)])
        self._advance_completed()
        return held.count

    def _cover(self, epoch: int, intervals: Iterable[tuple[int, int]]) -> None:
        coverage = self.coverage.setdefault(epoch, Coverage())
        for start, stop in intervals:
            if coverage.add(start, stop):
                self.trained[epoch] = self.trained.get(epoch, 0) + stop - start
            else:  # a bug if it ever happens: said in the summary, never trained twice in the count
                self.overlaps += 1

    def _advance_completed(self) -> None:
        while (c := self.coverage.get(self.completed)) is not None and c.samples == self.num_samples:
            del self.coverage[self.completed]
            self.completed += 1

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The cursor and every range not consumed yet (put back, or held: a resumed job serves them again)."""
        out = self.returned + [r for held in self.held.values() for r in held.ranges]
        out.sort(key=lambda r: (r.epoch, r.offset))
        return {"slice_epoch": self.epoch, "slice_cursor": self.cursor,
                "slices_put_back": [[r.epoch, r.offset, r.count] for r in out]}

    @classmethod
    def from_state(cls, num_samples: int, state: dict[str, Any], epoch: int,
                   last_epoch: int | None = None) -> EpochSlices:
        """From a checkpoint's `state_dict`; one without it (written before exact epochs) starts π_epoch afresh."""
        if "slice_cursor" not in state:
            return cls(num_samples, epoch, last_epoch=last_epoch)
        ranges = [SliceRange(int(e), int(o), int(c)) for e, o, c in state["slices_put_back"]]
        return cls(num_samples, int(state["slice_epoch"]), int(state["slice_cursor"]), ranges, last_epoch)

    def report(self) -> dict[str, Any]:
        """For the job's summary: samples trained per epoch (each an exact epoch when it equals N and no
        range was consumed twice), and the ranges put back and served again."""
        exact = [e for e, n in sorted(self.trained.items()) if n == self.num_samples and e < self.completed]
        return {"samples_per_epoch": self.num_samples, "trained": {str(e): n for e, n in sorted(self.trained.items())},
                "exact_epochs": exact, "overlaps": self.overlaps, "put_back_samples": self.put_back_samples,
                "put_back_ranges": self.put_back_ranges}


def _gaps(end: int, holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """[0, end) without the sorted, disjoint `holes`."""
    out, at = [], 0
    for start, stop in sorted(holes):
        if start > at:
            out.append((at, start))
        at = max(at, stop)
    if at < end:
        out.append((at, end))
    return out


def _merged(ranges: list[SliceRange]) -> list[SliceRange]:
    """Adjacent ranges of one epoch as one."""
    out: list[SliceRange] = []
    for r in ranges:
        if out and out[-1].epoch == r.epoch and out[-1].stop == r.offset:
            out[-1] = SliceRange(r.epoch, out[-1].offset, out[-1].count + r.count)
        else:
            out.append(r)
    return out
