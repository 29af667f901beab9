"""One worker's recent step times as the model and auto policies keep them (`Observations`): the
newest PER_BATCH per batch size for the MAX_BATCHES batch sizes seen most recently, with the fit of
them (time_fit.fit_of) kept until they change, and many workers' fits made at once (`fit_each`).
Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ps.control.model.item_rows import ItemRows, joined, prefix_length
from ps.control.model.time_fit import Fit, fit_of
from ps.control.model.time_fits import fits_of_rows
from ps.control.stdev import stdev

PER_BATCH = 16
"""Observations kept per batch size (the newest)."""
MAX_BATCHES = 8
"""Batch sizes kept per worker (those observed most recently)."""


class Observations:
    """One worker's recent observations, oldest first: (sequence number, batch, ms, exposed ms or
    None). The newest PER_BATCH per batch size are kept, for the MAX_BATCHES batch sizes seen most
    recently, so a worker that stays at one batch keeps the other point its line needs. The
    observations change only through `add` and `rescale`: each fit is kept until they do (a decision
    asks for every worker's fit several times, and thousands of workers make that seconds), and
    `version` counts those changes, so that what else is derived from them can be kept as long."""

    def __init__(self, items: Sequence[tuple[int, int, float, float | None]] = (), seq: int = 0) -> None:
        self._fits: dict[int, Fit | None] = {}  # the fits of every observation, by min_samples
        self._before: dict[tuple[int, int, int], Fit | None] = {}  # the fits of all but the newest (`_slot`)
        self.version = 0
        self.items: list[tuple[int, int, float, float | None]] = sorted(items)
        self.rows = ItemRows()  # `items` as rows of an array, changed with it (item_rows.py)
        self.counts: dict[int, int] = {}  # the observations held at each batch size
        self.layout = 0  # counts the changes of `counts` (none where an add drops the oldest at its batch)
        self.seq = max(seq, self.items[-1][0] + 1 if self.items else 0)
        self._run_batch: int | None = None
        self._run: list[float] = []
        self._prune()

    def add(self, batch: int, ms: float, exposed: float | None) -> None:
        self._fits.clear()
        item = (self.seq, batch, ms, exposed)
        self.items.append(item)
        self.rows.append(item)
        self.seq += 1
        self.version += 1
        if batch == self._run_batch:
            self._run.append(ms + (exposed or 0.0))
        else:
            self._run_batch, self._run = batch, [ms + (exposed or 0.0)]
        # the others were within the limits: only the new one's batch size can be one over
        same = self.counts[batch] = self.counts.get(batch, 0) + 1
        if same <= PER_BATCH:  # else the oldest at the batch goes, and the counts are as they were
            self.layout += 1
        if same > PER_BATCH:
            oldest_at = next(i for i, item in enumerate(self.items) if item[1] == batch)
            del self.items[oldest_at]
            self.rows.delete(oldest_at)
            self.counts[batch] -= 1
            if len(self._run) == same:  # every time at the batch was in the run, the dropped one too
                del self._run[0]
        elif same == 1 and len(self.counts) > MAX_BATCHES:
            newest = {b: seq for seq, b, _, _ in self.items}
            oldest = min(newest, key=newest.__getitem__)
            self.items = [item for item in self.items if item[1] != oldest]
            self.rows.reset(self.items)
            del self.counts[oldest]

    def _prune(self) -> None:
        self._fits.clear()
        newest: dict[int, int] = {}
        for seq, b, _, _ in self.items:
            newest[b] = seq
        kept = set(sorted(newest, key=newest.__getitem__)[-MAX_BATCHES:])
        seen: dict[int, int] = {}
        out = []
        for item in reversed(self.items):
            b = item[1]
            if b in kept and seen.get(b, 0) < PER_BATCH:
                seen[b] = seen.get(b, 0) + 1
                out.append(item)
        self.items = out[::-1]
        self.rows.reset(self.items)
        self.counts = seen
        self.layout += 1
        self._new_run()

    def _count(self) -> None:
        self.counts = {}
        for _, b, _, _ in self.items:
            self.counts[b] = self.counts.get(b, 0) + 1
        self.layout += 1

    def _new_run(self) -> None:
        """The newest run of observations at one batch size, as finish times (ms + exposed), and its
        batch size (None without observations): `run` and `recent` read it, `add` extends it."""
        batch = self.items[-1][1] if self.items else None
        run: list[float] = []
        for _, b, ms, e in reversed(self.items):
            if b != batch:
                break
            run.append(ms + (e or 0.0))
        self._run_batch, self._run = batch, run[::-1]

    def fit(self, min_samples: int, exclude_last: int = 0) -> Fit | None:
        """The fit over every observation but the newest `exclude_last`; None without any."""
        if not exclude_last:  # `_slot` written out: a decision asks for every worker's fit many times
            if min_samples not in self._fits:
                self._fits[min_samples] = self._fit(min_samples, 0)
            return self._fits[min_samples]
        kept, key = self._slot(min_samples, exclude_last)
        if key not in kept:
            _keep(kept, key, self._fit(min_samples, exclude_last))
        return kept[key]

    def _slot(self, min_samples: int, exclude_last: int) -> tuple[dict[Any, Fit | None], int | tuple[int, int, int]]:
        """Where the fit over every observation but the newest `exclude_last` is kept, and its key
        there. A fit of all of them is kept until the next `add`; one of all but the newest (the times
        before a run, which the model policy's drift test fits at every decision) until a `rescale`,
        under the count and the newest sequence number of what it fits: an add only appends and
        drops, so the same count up to the same observation is the same observations, and a worker
        that stays at its batch keeps the fit of those before its run from one decision to the next."""
        if not exclude_last:
            return self._fits, min_samples
        stop = prefix_length(len(self.items), len(self.items) - exclude_last)
        return self._before, (min_samples, stop, self.items[stop - 1][0] if stop else -1)

    def _fit(self, min_samples: int, exclude_last: int) -> Fit | None:
        return fit_of(self.items[: len(self.items) - exclude_last] if exclude_last else self.items, min_samples)

    def run(self, batch: int) -> int:
        """How many of the newest observations in a row are at `batch`."""
        return len(self._run) if batch == self._run_batch else 0

    def recent(self, batch: int, count: int) -> list[float] | None:
        """The newest `count` (at least 1) finish times (ms + exposed) if they all are at `batch`, else None."""
        if count < 1:
            raise ValueError(f"recent takes at least one time, not {count}")
        if batch != self._run_batch or count > len(self._run):
            return None
        return self._run[len(self._run) - count:]

    def since(self, batch: int, least: int) -> Sequence[float] | None:
        """What `recent(batch, max(least, run(batch)))` copies, for `least` >= 1: the finish times of the
        newest run if it is at `batch` and holds `least` or more, else None. The run itself, read-only
        and changed by the next `add`: a decision reads every worker's, and thousands of copies kept
        through it were a tenth of its time at 10,000 workers, most of it the garbage collector's."""
        run = self._run
        return run if batch == self._run_batch and len(run) >= least else None

    def drift(self, batch: int, min_samples: int, deadband: float) -> float | None:
        """The factor by which the newest run of times at `batch` (`min_samples` or more) is off the
        fit of the observations before it, if it is off by the deadband or more and by more than twice
        its mean's standard error (a changed speed); else None."""
        recent = self.since(batch, min_samples)  # the whole run, read-only
        run = 0 if recent is None else len(recent)
        before = self.fit(min_samples, exclude_last=run) if recent is not None else None
        if recent is None or before is None or before.batches < 2:
            return None
        predicted, mean = before.finish.at(batch), math.fsum(recent) / run  # statistics.fmean's sum over its count
        ratio = mean / predicted if predicted > 0 else 1.0
        if abs(ratio - 1.0) < max(deadband, 1e-9):  # within the deadband whatever the noise: its exact stdev is not needed
            return None
        noise = 2.0 * stdev(recent) / math.sqrt(run) / mean if run > 1 and mean > 0 else 0.0
        return None if abs(ratio - 1.0) < max(deadband, noise, 1e-9) else ratio

    def rescale(self, factor: float, keep: int) -> None:
        """The worker's speed changed during its newest run of observations at one batch (`drift`):
        carry its history before the run over to the new speed (step times times `factor`: a CPU share
        scales the fixed cost with the per-sample cost), keep the newest `keep` of the run, and drop
        the rest of it, which may be from before the change or after."""
        self._fits.clear()
        self._before.clear()
        self.version += 1
        run = self.run(self.items[-1][1]) if self.items else 0
        cut = len(self.items) - run
        self.items = ([(q, b, ms * factor, e) for q, b, ms, e in self.items[:cut]]
                      + self.items[len(self.items) - min(keep, run):])
        self.rows.reset(self.items)
        self._count()
        self._new_run()


def fit_each(observations: Sequence[Observations], min_samples: int, exclude_last: Sequence[int] | None = None) -> None:
    """Make the fits that `obs.fit(min_samples, exclude)` of each of `observations` will ask for (each
    without its newest `exclude_last`, none unless given) at once from their rows (time_fits.fits_of_rows),
    where they are not kept already: a decision asks for every worker's fit, and one at a time they are
    tens of microseconds of Python a worker."""
    todo: list[tuple[Observations, int, dict[Any, Fit | None], int | tuple[int, int, int]]]
    if exclude_last is None:  # `_slot` written out for the fits of every observation
        todo = [(obs, 0, obs._fits, min_samples) for obs in observations if min_samples not in obs._fits]
    else:
        todo = [(obs, n, *slot) for obs, n in zip(observations, exclude_last, strict=True)
                if (slot := obs._slot(min_samples, n))[1] not in slot[0]]
    stops = [len(obs.items) - n if n else len(obs.items) for obs, n, _, _ in todo]
    counts = np.array([prefix_length(len(obs.items), stop) for (obs, _, _, _), stop in zip(todo, stops)], dtype=np.int64)
    fits = fits_of_rows(counts, joined([obs.rows for obs, _, _, _ in todo], stops), min_samples)
    for (_, _, kept, key), fit in zip(todo, fits, strict=True):
        _keep(kept, key, fit)


FITS_KEPT = 4
"""The fits of all but the newest kept per worker (`Observations._slot`): the one a run's decisions
share, and a few a worker left."""


def _keep(kept: dict[Any, Fit | None], key: int | tuple[int, int, int], fit: Fit | None) -> None:
    """Keep `fit` under `key`, the oldest kept let go first past FITS_KEPT."""
    if len(kept) >= FITS_KEPT:
        del kept[next(iter(kept))]
    kept[key] = fit
