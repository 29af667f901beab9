"""Every worker's observations (model/worker_times.py: the first WARMUP after it joins are left out)
and its law (law.py): those numbered below its mark are settled and the newer ones tested against them
(change.py), and a change of speed forgets the points before it, so the law is fitted again from the
times after it. Pure."""

from __future__ import annotations

import math
from functools import lru_cache, partial
import statistics
from types import MappingProxyType
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from ps.control.auto.change import (ALONG_SDS, ALONG_TESTS, CHANGE_ROUNDS, CHANGE_SDS, change_start, change_starts,
                                    settled_mark)
from ps.control.auto.law import Choice, Law, choice, identifies_fixed_cost, law_of, laws_of, prefix_law
from ps.control.auto.many_workers import family_sds
from ps.control.model.item_rows import Item
from ps.control.model.observations import Observations
from ps.control.model.time_fit import Finish, slope_measured
from ps.control.performance import FinishTime
from ps.control.model.worker_times import WorkerTimes
from ps.control.stdev import rough_spreads, stdev

SLOWED = 1.5
"""A change of speed that makes a worker's times this many times its old law's is a slowdown that may
have moved elsewhere (a swap, a tenant): the parked workers, whose speeds are not measured, are probed
again. Noise that comes in spells passes the change test now and then, but seldom by this much in
the median of the new times (a stalled step is one time)."""

ROUGH = 1e-9
"""A relative error far above a float sum's over a few times: where the largest standard error is
sought, the exact one is taken only of those a float sum puts within this of it (`largest_error`)."""


class WorkerLaws(WorkerTimes):
    """Every worker's observations, its settled mark and its law; who changed speed since the last
    decision."""

    def __init__(self, min_samples: int, deadband: float) -> None:
        super().__init__(min_samples)
        self.deadband = deadband
        self.settled: dict[str, int] = {}
        self.changed: set[str] = set()  # changed speed since the last decision
        self.slowed: set[str] = set()  # of those, the ones whose times rose SLOWED times or more
        self.admitted: dict[str, int] = {}  # the batch of a change trusted on fewer than min_samples times
        self.lone: set[str] = set()  # of those, the changes found on one time alone (`rests_on_lone_time`)
        self.quick = False  # a change since the last decision was trusted on fewer times than `rounds`
        self.jumps: dict[str, float] = {}  # of the slowed, trusted on one time: how many times slower
        self.slowest: float | None = None  # the most ms a sample any planned worker has taken (`note_slowest`)
        self.shapes: dict[str, float] = {}  # a changed worker's fixed cost in samples, s/q of its law before the change
        # each worker's law with what it was fitted from: its observations, their version, the admitted batch
        self._laws: dict[str, tuple[Observations, int, int | None, Law | None]] = {}
        # each worker's settled law with what it was fitted from: its observations and the mark
        self._settled_laws: dict[str, tuple[Observations, int, Law | None]] = {}
        # each worker's law.choice with what it was made from: its observations, their layout, the
        # newest one's batch size and the admitted batch
        self._choices: dict[str, tuple[Observations, int, int, int | None, Choice]] = {}
        # each worker's change_start under change.ALONG_TESTS, found by its last push's test: its
        # observations, their version and mark then, the start by test
        self._along: dict[str, tuple[Observations, int, int, dict[tuple[float, int], int | None]]] = {}
        # `finishes` as of `revision`, which counts the changes of any worker's observations or admitted batch
        self.revision = 0
        self._finishes: tuple[int, Mapping[str, Finish]] | None = None
        self._known: frozenset[str] = frozenset()  # of the laws `_finishes` holds, the known ones

    def add(self, worker_id: str) -> None:
        super().add(worker_id)
        self.settled[worker_id] = 0
        self.revision += 1

    def remove(self, worker_id: str) -> None:
        super().remove(worker_id)
        self.revision += 1
        self.settled.pop(worker_id, None)
        self.changed.discard(worker_id)
        self.slowed.discard(worker_id)
        self.jumps.pop(worker_id, None)
        self.admitted.pop(worker_id, None)
        self.lone.discard(worker_id)
        self.shapes.pop(worker_id, None)
        self._laws.pop(worker_id, None)
        self._settled_laws.pop(worker_id, None)
        self._choices.pop(worker_id, None)
        self._along.pop(worker_id, None)

    def record(self, worker_id: str, batch: int, ms: float, exposed: float | None) -> bool:
        """Take one time (False: a warm-up step, left out) and test the newest against the law."""
        if not super().record(worker_id, batch, ms, exposed):
            return False
        self.revision += 1
        # the newest WINDOW are tested: the settled law is then the one a decision tests the worker against
        obs = self.obs[worker_id]
        mark = self.settled[worker_id] = settled_mark(obs.items, self.settled[worker_id])
        # the decision's laxer tests too, in the same pass: unless another push comes first, a decision
        # asks them of every worker that did not change
        own, along_tests = self._tests()
        start, *along = change_starts(obs.items, mark, self.min_samples, self.deadband, (own, *along_tests),
                                      lambda items, count: self._settled_law(worker_id, items, count))
        if start is not None:
            self._changed_at(worker_id, start, CHANGE_ROUNDS)
        else:
            self._along[worker_id] = (obs, obs.version, mark, dict(zip(along_tests, along, strict=True)))
        return True

    def _tests(self) -> tuple[tuple[float, int], tuple[tuple[float, int], ...]]:
        """A push's own change test and the laxer ones a decision puts the others to (change.py), as
        (sds, rounds): every worker is tested, so among more than many_workers.REFERENCE_WORKERS the
        standard errors grow to keep the chance that noise alone makes a change anywhere."""
        return _tests_among(len(self.obs))

    def forget_along(self, workers: Iterable[str], rounds: int) -> list[str]:
        """`forget_changed` under the laxer test of workers that may have changed along with another
        (change.ALONG_SDS on `rounds` newest times)."""
        return self.forget_changed(workers, family_sds(ALONG_SDS, len(self.obs)), rounds)

    def forget_before_change(self, worker_id: str, sds: float | None = None, rounds: int = CHANGE_ROUNDS) -> bool:
        """Whether the worker's newest times left its law (change.py) by `sds` standard errors (None:
        a push's own test's); if so the points before the change are forgotten and those after it
        settle as its law's."""
        return bool(self.forget_changed([worker_id], sds, rounds))

    def forget_changed(self, workers: Iterable[str], sds: float | None = None,
                       rounds: int = CHANGE_ROUNDS) -> list[str]:
        """`forget_before_change` of each of `workers`, in turn; those whose times left their law (a
        decision tests every worker that did not change, the test its last push made mostly kept)."""
        if sds is None:
            sds = self._tests()[0][0]
        found = []
        test = (sds, rounds)
        for k in workers:
            obs, mark = self.obs[k], self.settled[k]
            kept = self._along.get(k)
            if kept is not None and kept[0] is obs and kept[1] == obs.version and kept[2] == mark and test in kept[3]:
                start = kept[3][test]
            else:
                start = change_start(obs.items, mark, self.min_samples, self.deadband, sds, rounds,
                                     partial(self._settled_law, k))
            if start is not None:
                self._changed_at(k, start, rounds)
                found.append(k)
        return found

    def _changed_at(self, worker_id: str, start: int, rounds: int) -> None:
        """The worker changed speed at observation `start` (found on `rounds` times or fewer): the points
        before it are forgotten, those after it settle as its law's."""
        self.before_jump()
        obs = self.obs[worker_id]
        self._keep_shape(worker_id, self.law(worker_id))
        self.revision += 1
        before, found = [it for it in obs.items if it[0] < start], [it for it in obs.items if it[0] >= start]
        old = law_of(before, 1)
        # each new time over the old law's at its batch
        ratios = [] if old is None else [ms / max(old.fit.finish.at(b), 1e-9) for _, b, ms, _ in found]
        after = found[1:] if self._straddles(ratios) else found
        if ratios and after:
            ratio = statistics.median(ratios[len(found) - len(after):])
            if ratio >= SLOWED:
                self.slowed.add(worker_id)
                if len(found) == 1:  # its one time may straddle the change, showing less than there is
                    self.jumps[worker_id] = ratio
        self.obs[worker_id] = Observations(after, obs.seq)
        self.settled[worker_id] = obs.seq
        self.changed.add(worker_id)
        self.quick = self.quick or len(found) < rounds
        self.admitted.pop(worker_id, None)
        self.lone.discard(worker_id)
        if after and len(after) < self.min_samples and all(it[1] == after[0][1] for it in after):
            self.admitted[worker_id] = after[0][1]
            if len(found) == 1:
                self.lone.add(worker_id)

    def _keep_shape(self, worker_id: str, law: Law | None) -> None:
        """Keep the fixed cost in samples (s/q) of the worker's law in force when a change is found, where it
        is known with its time per sample measured and a fixed cost above 0, as the shape of its law
        after the change until that law is known (pricing.shaped); forget any older one."""
        self.shapes.pop(worker_id, None)
        line = None if law is None or not law.known else law.fit.line
        if line is not None and slope_measured(line) and line.s > 0:
            self.shapes[worker_id] = line.s / line.q

    def _straddles(self, ratios: list[float]) -> bool:
        """Whether the first of a change's times straddles it (its round began at the old speed; `ratios`:
        each time over the old law's): others follow it, and it lies between the old law and their
        median, off that median by more than the deadband. Such a time shows less of the change than
        there is."""
        if len(ratios) < 2:
            return False
        first, rest = ratios[0], statistics.median(ratios[1:])
        return min(1.0, rest) < first < max(1.0, rest) and abs(first / rest - 1.0) > self.deadband

    def _settled_law(self, worker_id: str, items: Sequence[Item], count: int) -> Law | None:
        """The law of the worker's settled observations, the first `count` of `items`, fitted when the
        mark moves (change.SETTLE_EVERY pushes) and kept until it moves again: the tests after each push
        and the decision's test of every worker share it. Observations are only ever dropped, never put
        back, so under the same object and mark the settled ones are those it was fitted from, less any
        that the newest pushed out (PER_BATCH a batch size)."""
        obs, mark = self.obs[worker_id], self.settled[worker_id]
        kept = self._settled_laws.get(worker_id)
        if kept is not None and kept[0] is obs and kept[1] == mark:
            return kept[2]
        law = prefix_law(obs, count, self.min_samples) if items is obs.items else law_of(items[:count], self.min_samples)
        self._settled_laws[worker_id] = (obs, mark, law)
        return law

    def rests_on_lone_time(self, worker_id: str) -> bool:
        """Whether the worker's law is known only through the one time its change was found on (admitted,
        `_changed_at`): no later time there could show whether it straddled the change (`_straddles`),
        and the batch sizes measured since do not identify the worker's fixed cost on their own."""
        if worker_id not in self.admitted or worker_id not in self.lone:
            return False
        law = self.law(worker_id)
        if law is None or not law.known:
            return False
        # known: unless the batch sizes measured min_samples times identify it alone, the admitted one did
        counts = self.obs[worker_id].counts
        return not identifies_fixed_cost([b for b, n in counts.items() if n >= self.min_samples])

    def lines(self, names: Iterable[str]) -> dict[str, tuple[FinishTime, int]]:
        """Of `names`, those whose law is a line through the origin: the line's finish time and the
        batch size it goes through (probes.line_entry)."""
        out: dict[str, tuple[FinishTime, int]] = {}
        for k in names:
            law = self.law(k) if k in self.obs else None
            if law is not None and not law.known and law.batch is not None:
                out[k] = (law.fit.finish.at, law.batch)
        return out

    def law(self, worker_id: str) -> Law | None:
        """The worker's law (law.py), fitted again only once its observations or admitted batch change:
        a decision asks for every law many times."""
        obs, admitted = self.obs[worker_id], self.admitted.get(worker_id)
        if self._kept(worker_id, obs, admitted):
            return self._laws[worker_id][3]
        law = law_of(obs.items, self.min_samples, admitted)
        self._laws[worker_id] = (obs, obs.version, admitted, law)
        return law

    def _kept(self, worker_id: str, obs: Observations, admitted: int | None) -> bool:
        """Whether the worker's kept law is of these observations, as they are, and this admitted batch."""
        kept = self._laws.get(worker_id)
        return kept is not None and kept[0] is obs and kept[1] == obs.version and kept[2] == admitted

    def _refit(self) -> None:
        """Fit every law whose observations or admitted batch changed, all at once (law.laws_of)."""
        stale = []
        kept_laws, admitted_of = self._laws, self.admitted
        for k, obs in self.obs.items():  # `_kept` written out: every worker is asked at a decision
            admitted = admitted_of.get(k)
            kept = kept_laws.get(k)
            if kept is None or kept[0] is not obs or kept[1] != obs.version or kept[2] != admitted:
                stale.append((k, obs, admitted))
        if stale:
            laws = laws_of([(obs, admitted) for _, obs, admitted in stale], self.min_samples,
                           [self._choice(k, obs, admitted) for k, obs, admitted in stale])
            for (k, obs, admitted), law in zip(stale, laws, strict=True):
                self._laws[k] = (obs, obs.version, admitted, law)

    def _choice(self, worker_id: str, obs: Observations, admitted: int | None) -> Choice | None:
        """law.choice of the worker's observations, kept while they hold as many times at each batch
        size (Observations.layout), the newest at the same one, measured, and the admitted batch is
        the same: the choice is then the same, and a worker at its batch for PER_BATCH pushes keeps it."""
        items = obs.items
        if not items:
            return None
        newest = items[-1][1]
        kept = self._choices.get(worker_id)
        if (kept is not None and kept[0] is obs and kept[1] == obs.layout and kept[2] == newest
                and kept[3] == admitted):
            return kept[4]
        picked = choice(items, obs.counts, self.min_samples, admitted)
        if obs.counts[newest] >= self.min_samples:  # else the newest measured batch is found among the older
            self._choices[worker_id] = (obs, obs.layout, newest, admitted, picked)
        return picked

    def finishes(self) -> Mapping[str, Finish]:
        """Each measured worker's fitted finish time: its law, or its proportional line (read-only, kept
        until `revision` moves: a decision asks for them several times, and no time comes in between)."""
        if self._finishes is None or self._finishes[0] != self.revision:
            self._refit()  # every kept law is of its worker's observations as they are
            laws = {k: self._laws[k][3] for k in self.obs}
            self._finishes = (self.revision, MappingProxyType({k: law.fit.finish for k, law in laws.items()
                                                               if law is not None}))
            self._known = frozenset(k for k, law in laws.items() if law is not None and law.known)
        return self._finishes[1]

    def known(self) -> frozenset[str]:
        """The workers whose law is known (law.Law.known), of the laws `finishes` holds."""
        self.finishes()
        return self._known

    def note_slowest(self, plan: Mapping[str, int], means: Mapping[str, float]) -> None:
        """Keep the most ms per sample among the planned workers' mean times at their batches (`means`),
        if more than any before: no worker this job has measured was slower, which bounds how slow a
        slowdown found on one time is taken to be (pricing.py)."""
        per_sample = [mean / plan[k] for k, mean in means.items() if plan.get(k, 0) > 0]
        if per_sample:
            self.slowest = max(self.slowest or 0.0, max(per_sample))

    def time_error(self, plan: Mapping[str, int], in_force: Mapping[str, Sequence[float]] | None = None) -> float:
        """The largest relative standard error of a planned worker's mean time at its batch: how far
        the noise alone may move a prediction made from them. `in_force`: `in_force(plan)` where the
        caller has it (the same times)."""
        runs: list[Sequence[float]]
        if in_force is None:
            runs = [recent for k, b in plan.items() if b > 0 and (recent := self.recent(k, b))]
        else:
            runs = [in_force[k] for k, b in plan.items() if b > 0]
        return largest_error([t for t in runs if len(t) > 1])


@lru_cache(maxsize=64)
def _tests_among(workers: int) -> tuple[tuple[float, int], tuple[tuple[float, int], ...]]:
    """`WorkerLaws._tests` among `workers` workers, kept: every push asks for them."""
    return ((family_sds(CHANGE_SDS, workers), CHANGE_ROUNDS),
            tuple((family_sds(sds, workers), rounds) for sds, rounds in ALONG_TESTS))


def largest_error(runs: Sequence[Sequence[float]]) -> float:
    """The largest standard error of the mean over the mean among `runs` (two or more times each):
    roughly for all at once (the runs of one length as one array), exactly (stdev.py) only for those
    the rough values put within ROUGH of the largest."""
    rough: list[tuple[np.ndarray, list[int]]] = []  # each length's errors (-1: none) and its runs' indices
    for index, times, mean, spread in rough_spreads(runs):
        if times.shape[1] < 2:
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            errors = np.where(mean > 0, spread / mean / math.sqrt(times.shape[1]), -1.0)
        rough.append((errors, index))
    valid = [errors[errors >= 0.0] for errors, _ in rough]
    top = max((float(e.max()) for e in valid if e.size), default=0.0) * (1.0 - ROUGH)
    picked = [runs[index[i]] for errors, index in rough
              for i in np.flatnonzero((errors >= 0.0) & (errors >= top)).tolist()]
    exact = [stdev(t) / statistics.fmean(t) / float(len(t)) ** 0.5 for t in picked]
    return max(exact, default=0.0)
