"""How the auto policy prices each worker's finish time where it compares plans: a known law with its
uncertainty, a proportional line as measured (or with the shape of the worker's law before its
change), a slowdown seen on one time bounded by the slowest worker measured, a law resting on such a
time or on an unmeasured slope no flatter below the batch it runs at. Pure."""

from __future__ import annotations

import math
from itertools import repeat
from collections.abc import Callable, Mapping, Sequence

from ps.control.auto.worker_laws import WorkerLaws
from ps.control.model.finish_table import Priced
from ps.control.model.time_fit import SLOPE_SDS, Finish, Line
from ps.control.performance import FinishTime


def priced_times(laws: WorkerLaws, workers: Sequence[str], identified: Callable[[str], bool],
                 straddled: Mapping[str, float], current: Mapping[str, int]) -> dict[str, FinishTime]:
    """Each of `workers`' finish time in its batch for comparing plans: a known law (`identified`) plus
    its uncertainty (time_fit.Finish.cautious); a proportional line as measured (new times are trusted
    at once), or where the worker's law before its change of speed had a fixed cost (WorkerLaws.shapes)
    the line through its new times with that law's shape (`shaped`); for a worker of `straddled` (a
    slowdown trusted on its first time, how many times slower it was) that many times slower again,
    but no slower a sample than the slowest planned worker this job has measured (WorkerLaws.slowest);
    a worker not measured yet at the slowest measured time per sample, never predicted fast.

    A slowdown's first time straddles it (the round began at the old speed), so it shows less of
    the slowdown than there is; a worker given too many samples holds every other worker's round
    (an eighth of a core planned at 140 samples: rounds of 1.7 s where the optimum's are 0.6 s),
    one given too few only waits, until the next decision measures it at the batch it got. A first
    time that does not straddle shows all of it, and that many times slower again is far beyond
    any speed the job has seen (an eighth of a core taken for a sixty-fourth: 7-9 samples where the
    optimum gives 32); the slowest worker measured bounds both cases.

    A known law that rests on such a time (WorkerLaws.rests_on_lone_time) is, below the worker's batch
    in `current`, no more than in proportion to it: a straddled time makes its line the flattest the
    times allow, a fixed cost that a cut of the batch cannot save (an eighth of a core cut from 67
    samples to 2 where the optimum gives it 27). So is, no flatter than its slope's upper bound
    (SLOPE_SDS standard errors above it), one whose time per sample is not measured
    (time_fit.slope_measured): times at nearby batch sizes tilt a line flat by their noise alone,
    and a flat line asks for a cut several times the one the worker needs (at 1,024 simulated
    workers, one fitted at a quarter of its slope was cut from 50 samples to 33 where the optimum
    gives it 47, and moved back by later decisions)."""
    finishes = laws.finishes()
    per_sample = max(map(Finish.at, finishes.values(), repeat(1)), default=1.0)
    slowest = laws.slowest
    unmeasured = proportional(per_sample)
    lone = laws.lone  # rests_on_lone_time is False off it: asked only of those on it

    times: dict[str, FinishTime] = {}
    for k in workers:
        if k not in finishes:
            times[k] = unmeasured
        elif identified(k):
            line, batch = finishes[k].line, current.get(k, 0)
            if batch > 0 and k in lone and laws.rests_on_lone_time(k):
                times[k] = Priced(finishes[k]).steeper_below(batch)
            elif batch > 0 and not line.q > SLOPE_SDS * math.sqrt(line.var_q):  # slope_measured written out
                times[k] = Priced(finishes[k]).steeper_below(batch, line.q + SLOPE_SDS * math.sqrt(line.var_q))
            else:
                times[k] = finishes[k].cautious
        elif k in straddled:
            times[k] = Priced(finishes[k], cautious=False, factor=straddled[k],
                              cap=math.inf if slowest is None else slowest)
        elif k in laws.shapes and (law := laws.law(k)) is not None and law.batch:
            times[k] = shaped(finishes[k].at(law.batch), law.batch, laws.shapes[k])
        else:
            times[k] = finishes[k].at
    return times


def shaped(ms: float, batch: int, fixed: float) -> FinishTime:
    """The line through `ms` at `batch` whose fixed cost is `fixed` samples' time (a CPU share scales a
    worker's time per sample and fixed cost alike, so its law before a change of speed keeps its shape)."""
    q = ms / (batch + fixed)
    return Finish(Line(q, q * fixed)).at


def proportional(per_sample: float) -> FinishTime:
    """A time proportional to the batch at `per_sample` ms a sample (a Finish's, which a FinishTable prices at once)."""
    return Finish(Line(per_sample, 0.0)).at
