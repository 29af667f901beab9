"""The fitted finish times of many workers as arrays (performance.FinishTable): a solve at thousands
of workers prices every worker at dozens of levels, and one numpy expression over the workers costs
what a few Python calls do. Each row computes what its Finish's `at` or `cautious` computes, or a
`Priced` time over one of them, in the same order of the same float operations, so every value is
the call's, bit for bit; `table_of` builds the table only where every time is such a call. Pure."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from ps.control.model.time_fit import CAUTION, Finish
from ps.control.performance import FinishTime

_FUNCTIONS = {Finish.at: 0.0, Finish.cautious: CAUTION}
"""The Finish methods a row can be, with the standard errors each adds."""
FALSE_POSITIONS = 4
"""Steps of false position before a search bisects."""
_PLAIN = (1.0, math.inf, 0.0, 0.0, 0.0, 0.0)
"""Priced's columns of a plain call."""
MIN_ROWS = 64
"""Fewer workers are priced by their calls: a numpy expression's own cost is a few of them."""


@dataclass(frozen=True)
class Priced:
    """A Finish's time (`cautious` or `at`) as a policy prices it where plans are compared: `factor`
    times slower but no slower a sample than `cap` ms (and never faster than the time itself), and
    below the batch `below` no flatter than `fall` ms a sample from its time there, then `offset` ms
    later (the time its push waits behind those the server takes after it: auto/arrival.py). A
    FinishTime that `table_of` can put in a row."""

    finish: Finish
    cautious: bool = True
    factor: float = 1.0
    cap: float = math.inf
    below: int = 0
    fall: float = 0.0
    at_below: float = 0.0
    offset: float = 0.0

    def base(self, batch: float) -> float:
        time = self.finish.cautious(batch) if self.cautious else self.finish.at(batch)
        if self.factor != 1.0:
            time = max(time, min(self.factor * time, self.cap * batch))
        return time

    def __call__(self, batch: float) -> float:
        time = self.base(batch)
        time = time if batch >= self.below else min(time, self.at_below - self.fall * (self.below - batch))
        return time + self.offset

    def steeper_below(self, batch: int, fall: float | None = None) -> Priced:
        """This time, below `batch` no flatter than `fall` ms a sample nor than in proportion to
        `batch` (None: in proportion), in place of any hold below a batch it had."""
        at = self.base(batch)
        return Priced(self.finish, self.cautious, self.factor, self.cap, batch,
                      at / batch if fall is None else min(fall, at / batch), at, self.offset)


@dataclass(frozen=True)
class LineTable:
    """One column per row of `coef`: the line (q, s), the exposed communication's line and floor (0
    without it), the standard errors added (0 or CAUTION), the line's variances and covariance and
    the batch its errors count from, then Priced's factor, cap, below, fall, time at below and offset
    (1, inf, 0, 0, 0, 0 for a plain call); whether any row has exposed communication, is cautious, is
    slowed by a factor, is held below a batch or has an offset (the parts no row has are not computed)."""

    coef: np.ndarray
    exposed: bool = True
    cautious: bool = True
    scaled: bool = False
    held_below: bool = False
    offset: bool = False

    def at(self, batches: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Finish.at's `line.q * b + line.s + max(floor, exposed.q * b + exposed.s)` (+ 0.0 without
        exposure), plus Finish.cautious' standard errors where the row is cautious (+ 0.0 where not),
        then Priced's factor, its hold below a batch and its offset."""
        q, s, exposed_q, exposed_s, floor, caution, var_s, cov, var_q, centre, factor, cap, below, fall, at_below, offset = (
            self.coef if rows is None else self.coef[:, rows])
        b = batches.astype(np.float64)
        finish: np.ndarray = q * b + s
        if self.exposed:
            finish = finish + np.maximum(floor, exposed_q * b + exposed_s)
        if self.cautious:
            x = np.maximum(b, centre)
            finish = finish + caution * np.sqrt(np.maximum(0.0, var_s + 2.0 * x * cov + x * x * var_q))
        if self.scaled:  # fmin and fmax, as Python's min and max, pass over the NaN of inf * 0
            with np.errstate(invalid="ignore"):
                capped = cap * b
            finish = np.where(factor != 1.0, np.fmax(finish, np.fmin(factor * finish, capped)), finish)
        if self.held_below:
            finish = np.where(b >= below, finish, np.minimum(finish, at_below - fall * (below - b)))
        if self.offset:
            finish = finish + offset
        return finish

    def within(self, level: float, lo: np.ndarray, hi: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """performance.batch_within of every row: the largest batch in [lo, hi] whose time is within
        `level` (lo where none is). The times are nondecreasing, so the answer is one whatever the
        search: false position between the bracket's ends (a time is nearly a line in the batch)
        pricing each guess and the batch above it, which settles most rows in a step or two; bisection
        for the rows still open after FALSE_POSITIONS steps."""
        t = self if rows is None else self.take(rows)
        ends = t.at(np.concatenate([lo, hi]), np.tile(np.arange(len(lo)), 2))
        t_lo, t_hi = ends[:len(lo)], ends[len(lo):]
        out = np.where(t_hi <= level, hi, lo)
        todo = np.flatnonzero((t_hi > level) & (t_lo <= level))
        low, high = lo[todo], hi[todo]  # t(low) <= level < t(high), for the rows of `todo`
        f_lo, f_hi = t_lo[todo], t_hi[todo]
        step = 0
        while todo.size:
            open_ = np.flatnonzero(high - low > 1)
            if not open_.size:
                break
            l, h = low[open_], high[open_]
            if step < FALSE_POSITIONS:
                guess = l + np.floor((level - f_lo[open_]) / (f_hi[open_] - f_lo[open_]) * (h - l)).astype(np.int64)
                guess = np.minimum(np.maximum(guess, l + 1), h - 1)
            else:
                guess = (l + h) // 2
            above = np.minimum(guess + 1, h)
            priced = t.at(np.concatenate([guess, above]), np.concatenate([todo[open_], todo[open_]]))
            f_guess, f_above = priced[:len(guess)], priced[len(guess):]
            fits, fits_above = f_guess <= level, f_above <= level
            # the bracket shrinks to [guess, above] when guess fits and above does not
            new_low = np.where(fits_above, above, np.where(fits, guess, l))
            new_high = np.where(fits_above, h, np.where(fits, above, guess))
            f_lo[open_] = np.where(fits_above, f_above, np.where(fits, f_guess, f_lo[open_]))
            f_hi[open_] = np.where(fits_above, f_hi[open_], np.where(fits, f_above, f_guess))
            low[open_], high[open_] = new_low, new_high
            step += 1
        out[todo] = low
        return out

    def take(self, rows: np.ndarray) -> LineTable:
        return LineTable(self.coef[:, rows], self.exposed, self.cautious, self.scaled, self.held_below, self.offset)


def table_of(times: Mapping[str, FinishTime]) -> LineTable | None:
    """The table of `times` (rows in the order of its keys) where each is a Finish's `at` or
    `cautious` or a Priced time; None where one is anything else, or where they are fewer than MIN_ROWS."""
    if len(times) < MIN_ROWS:
        return None
    finishes: list[Finish] = []
    caution: list[float] = []
    priced: list[tuple[int, tuple[float, ...]]] = []
    for time in times.values():
        if isinstance(time, Priced):
            finishes.append(time.finish)
            caution.append(CAUTION if time.cautious else 0.0)
            priced.append((len(finishes) - 1,
                           (time.factor, time.cap, float(time.below), time.fall, time.at_below, time.offset)))
            continue
        finish, function = getattr(time, "__self__", None), getattr(time, "__func__", None)
        if not isinstance(finish, Finish) or function not in _FUNCTIONS:
            return None
        finishes.append(finish)
        caution.append(_FUNCTIONS[function])
    # the columns of every row at once, each value the one the row's own tuple held
    lines = np.array([f.line for f in finishes], dtype=np.float64).reshape(len(finishes), 5)
    q, s, var_s, cov, var_q = lines.T
    errors = np.array(caution, dtype=np.float64)
    cautious = errors != 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        centre = np.where(var_q > 0, -cov / var_q, 0.0)
    exposed = [(i, f.exposed, f.floor) for i, f in enumerate(finishes) if f.exposed is not None]
    coef = np.zeros((16, len(finishes)), dtype=np.float64)
    coef[0], coef[1], coef[5] = q, s, errors
    for column, values in zip((6, 7, 8, 9), (var_s, cov, var_q, centre), strict=True):
        coef[column] = np.where(cautious, values, 0.0)
    coef[10:12] = np.array(_PLAIN[:2], dtype=np.float64)[:, None]
    for i, line, floor in exposed:
        coef[2, i], coef[3, i], coef[4, i] = line.q, line.s, floor
    for i, row in priced:
        coef[10:, i] = row
    return LineTable(coef, exposed=bool(exposed), cautious=bool(cautious.any()), scaled=bool((coef[10] != 1.0).any()),
                     held_below=bool((coef[12] > 0).any()), offset=bool((coef[15] != 0).any()))


def offset_by(time: FinishTime, ms: float) -> FinishTime:
    """`time` `ms` later, as a row `table_of` can take where `time` is one (0: `time` itself)."""
    if ms == 0.0:
        return time
    if isinstance(time, Priced):
        return replace(time, offset=time.offset + ms)
    finish, function = getattr(time, "__self__", None), getattr(time, "__func__", None)
    if isinstance(finish, Finish) and function in _FUNCTIONS:
        return Priced(finish, cautious=function is Finish.cautious, offset=ms)
    return lambda batch: time(batch) + ms
