"""The default batch policy: the measured proportional step where a worker's law is not known (its
first decision, a change of speed), the fitted law's one-step solve and parking where it is
(OmniLearn's proportional control with Cannikin's OptPerf; docs/policies.md tells how it decides).

Each worker's times are fitted as t(b) = q·b + s (law.py). Seen at one batch size since it joined or
changed, its law is the line through the origin, and the solve over such lines is the proportional
step (equal times at the measured throughputs); seen at two far enough apart, its law has its fixed
cost, and the solve is the optimal split, parking a worker that surely only slows the round
(model/optperf.py). The second batch size comes from the first step: no probe. A worker whose newest
times leave its law by more than the noise for a few rounds (one round, four times off) changed speed
(change.py): its points from before the change are forgotten (worker_laws.py), the next decision,
due at once, steps it from its new times (and the others whose newest times moved with them), and
its law is fitted again from them.

A decision holds the plan while it is measured balanced or the new split gains too little (hold.py;
the bar: the noise of the measured times, and for a re-solve of laws that held, their error on the
plan in force and half the deadband unless workers measured idle would be raised).

A parked worker comes back for a re-probe now and then, and at once when an active worker's times
rise by half or more (model/parking.py), at a batch that measures its speed: what its known law
finishes within the round measured now, not the minimum a short solved round leaves it (probes.py),
a re-probe no further above its batches measured than in proportion where its law is flat. The next
decision judges it, at once where its times are change.QUICK's ratio off the round it left, and not on
rounds across another worker's change of speed (a recall's, slowed by its cause, are only priced).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ps.control.auto.arrival import planned, shifted
from ps.control.auto.change import ALONG_ROUNDS, BANDS
from ps.control.auto.hold import bar, verdict
from ps.control.auto.law_report import reported_laws
from ps.control.auto.imbalance import far_from_balance, idling, measured_step
from ps.control.auto.probes import entry_targets, far_off, probe_plan, probe_targets
from ps.control.model.rounds import RoundLog, prediction_error
from ps.control.model.time_fit import slope_measured
from ps.control.auto.pricing import priced_times
from ps.control.auto.solve import solve
from ps.control.auto.state import adopted_part, auto_part, read_auto_part
from ps.control.auto.worker_laws import WorkerLaws
from ps.control.model.fitted_plan import FittedPlan, vouched
from ps.control.split import reachable
from ps.control.model.optperf import nearest_plan
from ps.control.model.finish_table import offset_by, table_of
from ps.control.performance import FinishTable, FinishTime, FittedRounds
from ps.control.worker_plan import WorkerPlan

FOLLOW_UP = 2
"""A decision the policy asks for (after a step from proportional lines, a re-probe or a replan) waits
for this many times `min_samples` observations per worker: a law is fitted from them."""


class AutoPolicy(FittedPlan):
    """Proportional steps until a worker's law is known, the law's solve and parking after
    (model/fitted_plan.py)."""

    name = "auto"
    extra_state_keys = frozenset({"auto"})

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._held = self._laws = WorkerLaws(config.min_samples, config.deadband)
        self._laws.before_jump = self._settle_rounds
        self._rounds = RoundLog()
        self._follow_up = True  # the plan in force asks for a decision as soon as it is measured
        self._soon = False  # ... on min_samples times, not FOLLOW_UP times as many: a step after a far change

    # ------------------------------------------------------------------ what the policy is told
    def _added(self, worker_id: str) -> None:
        self._laws.add(worker_id)

    def _removed(self, worker_id: str) -> None:
        self._laws.remove(worker_id)
        self._parking.forget(worker_id)

    def _record(self, worker_id: str, batch: int, compute_ms: float, exposed_ms: float | None) -> None:
        if self._laws.record(worker_id, batch, compute_ms, exposed_ms):
            self._rounds.push(worker_id, batch)

    # ------------------------------------------------------------------ laws
    def _identified(self, worker_id: str) -> bool:
        """Whether the worker's law is known (law.py), or its bounds fix its batch."""
        return self._identified_all()(worker_id)

    def _times(self, straddled: Mapping[str, float] | None = None,
               current: Mapping[str, int] | None = None) -> dict[str, FinishTime]:
        """Each worker's finish time in its batch for comparing plans (pricing.py), its push's place in
        the server's queue added (arrival.py)."""
        times = priced_times(self._laws, list(self._workers), self._identified_all(), straddled or {}, current or {})
        offset = self._arrivals(current or self.plan())
        return {k: offset_by(t, offset.get(k, 0.0)) for k, t in times.items()} if offset else times

    def _arrivals(self, plan: Mapping[str, int]) -> dict[str, float]:
        """Each worker's slot offset in `plan` (arrival.py), by the server's measured time a push."""
        return planned(plan, self._laws.finishes(), *self._rounds.push_ms())

    def _identified_all(self) -> Callable[[str], bool]:
        """`_identified` for every worker at once, of the laws WorkerLaws.finishes holds (fitted as the
        observations are)."""
        known, workers = self._laws.known(), self._workers
        return lambda k: k in known or workers[k].min_batch == workers[k].max_batch

    # ------------------------------------------------------------------ decisions
    def decision_due(self) -> bool:
        """A decision is wanted now: a worker changed speed, or the plan in force was set from
        proportional lines, a re-probe or a replan, and every worker in it is measured at its batch."""
        active = self._active()
        if not active or any(w.batch is None for w in self._workers.values()):
            return False
        left = self._before_reprobe
        if left is not None and left.judged and self._reprobe_far_off(left.round_ms):
            return True
        changed = bool(self._laws.changed & set(active))
        need = self._config.min_samples * (1 if changed or self._soon else FOLLOW_UP)
        return (self._follow_up or changed) and self._measured_at(active, need)

    def _measured_at(self, active: Sequence[str], need: int) -> bool:
        """Whether each of `active` has `need` times at its batch or changed speed since the last decision
        (its change's times price it; ASP: a step slowed in flight ends at its old batch, policies.md)."""
        return all(self._workers[k].samples >= need or k in self._laws.changed for k in active)

    def _reprobe_far_off(self, before_ms: float | None) -> bool:
        """probes.far_off of the workers back for a re-probe, on their times since (`before_ms`: the
        measured round of the plan the re-probe left)."""
        times = {}
        for k in self._parking.reprobed:
            worker = self._workers.get(k)
            run = self._laws.recent(k, worker.batch, least=1) if worker is not None and worker.batch else None
            if worker is not None and run is not None:  # this re-probe's times, not an earlier one's at that batch
                times[k] = run[len(run) - min(len(run), worker.samples):]
        return before_ms is not None and far_off(times, before_ms)

    def _decision(self) -> dict[str, int] | None:
        active, current = self._active(), self.plan()
        report: dict[str, Any] = self._opening()
        if not (self._measured_at(active, self._config.min_samples) or self._reprobe_far_off(self._judged_round)):
            self._parking.tick()
            self._report = {**report, "phase": "wait", **self._describe(current)}
            return None
        in_force, means, measured_balanced = self._measured(active, current)
        follow, changed = self._follow_up, sorted(self._laws.changed)
        if not (follow or changed):  # a parked worker waits for the server's decisions, not those asked for
            self._parking.tick()
        slowed = bool(self._laws.slowed & set(changed))
        if slowed:  # the load may have moved to a parked worker's machine, unmeasured
            self._parking.recall()
        reprobe = self._reprobes_due()
        quick, self._soon, jumps = self._laws.quick, False, self._laws.jumps
        self._laws.changed, self._laws.slowed, self._laws.quick, self._follow_up = set(), set(), False, False
        self._laws.jumps = {}
        report["speed_changed"] = changed
        times = self._times(jumps, current)
        table = table_of(times)  # every worker priced at once, for the solve and the gain
        new, parked, compared = self._solve(times, forced_in=reprobe, table=table)
        reprobe = [k for k in reprobe if k not in parked]
        priced = FittedRounds(times, table=table)
        gain = priced.predict(current) / max(priced.predict(new), 1e-9) - 1.0
        resolve = not (reprobe or changed or follow)
        early = idling(in_force, means, self._config.deadband) if resolve and self._exact_sum() else []
        min_gain, idle = bar(time_error=self._laws.time_error(current, in_force), deadband=self._config.deadband,
                             laws_error=prediction_error(report["previous"]), resolve=resolve, gain=gain,
                             idle=lambda at: bool(early) and self._moves_by_deadband(
                                 self._nearest(times, new, current, at, early), current))
        report.update(gain=round(gain, 4), min_gain=round(min_gain, 4))
        hold: dict[str, Any] = {}
        stepped = far = False
        if not reprobe and self._breaks_even(current):
            balanced = set(parked) == set(self.parked()) and measured_balanced
            said = verdict(balanced=balanced, resolve=resolve, gains=gain > min_gain, confirming=self._confirming,
                           idle=idle, parks=any(current.get(k, 0) > 0 for k in parked), exact_sum=self._exact_sum(),
                           measured_far=lambda: self._far_from_balance(current, in_force, means))
            far, confirm = said.far, said.confirm
            if said.hold:
                hold = {"phase": "hold", **({"balanced": True} if balanced else {}), **({"confirm": True} if confirm else {})}
            if said.measured_step:
                measured = self._measured_step(current, means or {})
                if measured != current:
                    new, parked, hold, stepped, confirm = measured, self.parked(), {}, True, False
            self._confirming = confirm
        base = current if hold else new
        probes = self._probes(base, current, changed, slowed, means, times)
        entries = self._entries(base, current, means, recalled=slowed)
        lower, upper = self._bounds()
        # the workers the probes and entries make room from keep their break-even (with `break_even`)
        probed = probe_plan(base, {**probes, **entries}, self._config.global_batch,
                            self._kept_at_break_even(base, lower, upper), upper,
                            self._exact_sum(), self.round_for_time) if probes or entries else None
        if probed is not None:
            new, parked = probed, [k for k, b in base.items() if b == 0]
        elif hold:
            self._report = {**report, **hold, **self._describe(current)}
            return None
        else:
            probes = entries = {}
        self._confirming = False
        known = self._rests_on_laws(new, current) and not stepped
        if resolve and not stepped and not entries and not far:  # a re-solve moves no more than its gain asks
            new = self._nearest(times, new, current, min_gain, early)
        self._parking.install(parked, reprobe)
        if reprobe:  # a recall's rounds are slower for the slowdown that called it: priced, not judged
            self._reprobing(current, report, judged=not slowed)
        # a re-solve that moved a worker by the deadband asks for its new batch measured, as a step does
        moved = self._moves_by_deadband(new, current)
        self._follow_up = bool(reprobe or probes or entries) or not (known or (resolve and not moved))
        self._soon = quick and self._follow_up  # its rounds are long, and its laws are off by the change's size
        phase = "reprobe" if reprobe else "probe" if probes else "solve" if known else "step"
        if stepped or far:
            report["far_from_balance"] = True
        self._report = {**report, "phase": phase, **({"reprobe": reprobe} if reprobe else {}),
                        **({"probe": sorted(probes)} if probes else {}),
                        **({"park": compared} if compared else {}), **self._describe(new)}
        return new

    def _measured(self, active: Sequence[str], current: Mapping[str, int]
                  ) -> tuple[dict[str, Sequence[float]] | None, dict[str, float] | None, bool]:
        """Each worker's times in force at its batch as the server's queue sees them (arrival.py), their
        means, and whether they measure the plan balanced. One event often moves several workers, and a
        plan out of balance may hide a change under a move: the others are looked at again then, less
        strictly (change.ALONG_SDS)."""
        offset = self._arrivals(current)
        raw = self._laws.in_force(current)
        in_force = shifted(raw, offset)
        means = _means(in_force)
        measured_balanced = self._balanced_on(in_force, current, means)
        if self._laws.changed or not measured_balanced:
            along = 1 if self._laws.quick else ALONG_ROUNDS
            found = self._laws.forget_along([k for k in active if k not in self._laws.changed], along)
            if found:  # their times are those after the change now
                raw = self._laws.in_force(current)
                in_force = shifted(raw, offset)
                means = _means(in_force)
                measured_balanced = self._balanced_on(in_force, current, means)
        if (own := _means(raw)) is not None:
            self._laws.note_slowest(current, own)
        return in_force, means, measured_balanced

    def _nearest(self, times: Mapping[str, FinishTime], new: Mapping[str, int], current: Mapping[str, int],
                 min_gain: float, early: Sequence[str]) -> dict[str, int]:
        """The split nearest `current` within half of `min_gain` of `new`'s round, the workers measured
        `early` that the laws too finish the deadband early raised to their batches in `new`
        (optperf.nearest_plan)."""
        lower, upper = self._bounds()
        return nearest_plan(times, new, current, self._kept_at_break_even(new, lower, upper), upper, slack=min_gain / 2,
                            idle=early, band=self._config.deadband)

    def _rests_on_laws(self, new: Mapping[str, int], current: Mapping[str, int]) -> bool:
        """Whether `new` rests on known laws: every worker it plans has its law known, or keeps its batch
        in `current` within the deadband, where its proportional line runs through times it is measured
        at. Among a thousand workers a few seldom move far enough for a second batch size: were every
        plan with them a step, each decision would ask for the next at a step's bar, moving most
        workers every time."""
        return all(self._identified(k) or not self._moved_by_deadband(b, current.get(k, 0))
                   for k, b in new.items() if b > 0)

    def _moved_by_deadband(self, batch: int, was: int) -> bool:
        """Whether `batch` is the deadband of `was` or more away from it (any batch from 0)."""
        return abs(batch - was) >= self._config.deadband * was

    def _moves_by_deadband(self, new: Mapping[str, int], current: Mapping[str, int]) -> bool:
        """Whether `new` moves a worker active in both plans by the deadband of its batch in `current` or more."""
        return any(self._moved_by_deadband(b, current[k]) for k, b in new.items() if b > 0 and current.get(k, 0) > 0)

    def _far_from_balance(self, plan: Mapping[str, int], times: Mapping[str, Sequence[float]] | None,
                          means: Mapping[str, float] | None) -> bool:
        """Whether the plan in force is measured out of balance by BANDS deadbands beyond the noise
        (imbalance.py): the laws' solve would move it, unless they are wrong there (fitted through
        times from both sides of a change, or flattened by noise) or too uncertain away from the
        batches measured to vouch for a move, which only a move can cure. `means`: each worker's mean of `times`."""
        lower, upper = self._bounds()
        history = {k: self._laws.obs[k].items for k in plan}
        return times is not None and far_from_balance(times, history, plan, lower, upper,
                                                      BANDS * self._config.deadband, means)

    def _measured_step(self, plan: Mapping[str, int], means: Mapping[str, float]) -> dict[str, int]:
        """imbalance.measured_step of the plan, with `break_even` none stepped below it."""
        lower, upper = self._bounds()
        return measured_step(plan, means, self._config.global_batch, self._kept_at_break_even(plan, lower, upper), upper)

    def _replanning(self) -> None:
        """A decision is due as soon as the replan's plan is measured."""
        self._follow_up = True

    def _took_back(self) -> None:
        """The plan taken back was measured: no decision is asked for."""
        self._follow_up = self._soon = False

    def _solvable(self) -> bool:
        """Every worker is measured (its law need not be known)."""
        return all(k in self._laws.finishes() for k in self._workers)

    def _solve_all(self) -> tuple[dict[str, int], list[str], dict[str, float]]:
        return self._solve(self._times(), forced_in=[])

    def _solve(self, times: Mapping[str, FinishTime], forced_in: list[str],
               table: FinishTable | None = None) -> tuple[dict[str, int], list[str], dict[str, float]]:
        """The best split of B over every worker, parking those (not `forced_in`) that surely only
        slow the round (solve.py) and, with `break_even`, those it plans below their break-even; ASP whose bounds cannot meet B: everyone at the bound B pushes them to.
        `table`: `times` as a FinishTable where the caller has one."""
        lower, upper = self._bounds()
        if not self._exact_sum():
            return dict(upper if sum(upper.values()) < self._config.global_batch else lower), [], {}
        may_park = [k for k in self._workers if k not in forced_in] if self._may_park() else []
        lower = self._reprobe_bounds(lower, upper, forced_in)
        # a parked worker whose law is not known comes back by a re-probe only: a line through the origin,
        # fitted from a few samples' times, hides the fixed cost that parked it
        kept_out = [k for k in self.parked() if k not in forced_in and not self._identified(k)]
        rest = [k for k in self._workers if k not in kept_out]
        if kept_out and reachable(rest, self._config.global_batch, lower, upper):
            lower, upper = {**lower, **dict.fromkeys(kept_out, 0)}, {**upper, **dict.fromkeys(kept_out, 0)}
        else:
            kept_out = []
        plan, parked, compared = solve(times, self._laws.finishes(), self._config.global_batch, lower, upper,
                                       may_park=may_park, overhead=self._rounds.overhead_ms, prefer=self.parked(),
                                       table=table)
        parked = [*kept_out, *(k for k in parked if k not in kept_out)]
        # a re-probed worker the bounds left below its break-even is parked again, its re-probe put off
        plan, below = self._break_even(plan, times, lower, upper, [*may_park, *forced_in] if self._may_park() else [])
        return plan, parked + below, compared

    def _probes(self, plan: Mapping[str, int], current: Mapping[str, int], changed: list[str],
                slowed: bool, means: Mapping[str, float] | None, times: Mapping[str, FinishTime]) -> dict[str, int]:
        """The changed workers on a proportional line to move up whatever the gain (probes.py), and where
        a worker slowed, the unchanged ones too: the load may have moved to them, their speed-up hidden
        in a small batch's fixed cost. Without `means` (a change trusted on its first times, before each
        worker has `min_samples` times at its batch) on however few times each has: a later decision
        no longer sees the change, and would hold a worker at a batch its line overprices for good.
        `times`: the decision's priced finish times; a worker priced on its old law's shape
        (pricing.shaped) finishes at that price in the probes' round."""
        lower, upper = self._bounds()
        if means is None:  # a change trusted on its first times: not min_samples of them are in force yet
            means = _means(self._laws.in_force(current, least=1)) or {}
        candidates = [k for k in changed if not self._identified(k)]
        if slowed:
            candidates += [k for k in self._active() if k not in changed]
        shaped = {k: t for k, t in times.items() if k in self._laws.shapes and not self._identified(k)}
        return probe_targets(candidates, plan, current, means, lower, upper, self._config.deadband, shaped)

    def _entries(self, plan: Mapping[str, int], current: Mapping[str, int],
                 means: Mapping[str, float] | None, recalled: bool) -> dict[str, int]:
        """The parked workers `plan` brings back, at their batches of probes.entry_targets (on a line
        through the origin, by that line unless `recalled`: another's slowdown may be its speed-up)."""
        entering = [k for k, b in plan.items() if b > 0 and current.get(k, 0) == 0]
        if not entering:
            return {}
        lower, upper = self._bounds()
        lower = self._kept_at_break_even(plan, lower, upper)  # with `break_even`: each at its break-even at least
        finishes = self._laws.finishes()
        if means is None:
            means = {k: finishes[k].at(b) for k, b in current.items() if b > 0 and k in finishes}
        slowest = max(means.values(), default=0.0)
        cores = {k: w.cores for k, w in self._workers.items()}
        # a re-probe by a law fitted flat (any batch at its fixed cost) goes no further than in proportion;
        # a recall by the law as it is (the load that slowed another may have left its machine), where
        # its time per sample is measured: a flat one comes back at its cores' share, as one without a law
        known = {k: f.at if recalled else vouched(f) for k, f in finishes.items()
                 if self._identified(k) and (slope_measured(f.line) or not recalled)}
        lines = {} if recalled else self._laws.lines(k for k in entering if k not in known)
        return entry_targets(entering, plan, known, slowest, self._config.deadband, cores, self._config.global_batch,
                             lower, upper, lines)

    # ------------------------------------------------------------------ what the policy reports
    def _describe(self, plan: Mapping[str, int]) -> dict[str, Any]:
        """The laws (q, s, whether known, whether q is measured), c, the parked workers, the predicted round
        of `plan` and the server's time a push that orders the arrivals (arrival.py)."""
        finishes, identified = self._laws.finishes(), self._identified_all()
        described = self._described(plan, reported_laws(finishes, identified), {k: f.at for k, f in finishes.items()})
        return {**described, "push_ms": round(self._rounds.push_ms()[0], 3)}

    # ------------------------------------------------------------------ resume and checkpoints
    def _keeps_plan_of(self, old: WorkerPlan) -> bool:
        return isinstance(old, AutoPolicy)

    def _adopted(self, old: WorkerPlan) -> None:
        """An auto policy's laws carry over; its parking (and a recall's forgiving) only where this one keeps the worker at 0."""
        if isinstance(old, AutoPolicy):
            self._restore_extra({"auto": adopted_part(old._extra_state()["auto"], self.plan())})

    def _extra_state(self) -> dict[str, Any]:
        return {"auto": auto_part(self._laws, self._parking, self._rounds, self._follow_up, self._confirming)}

    def _restore_extra(self, state: Mapping[str, Any]) -> None:
        """Load the laws, parking and rounds; a state without them (another policy's) starts afresh."""
        if state.get("auto") is None:
            if self.parked():
                raise ValueError(f"workers {self.parked()} have batch 0 but the state has no auto part")
            return
        part = read_auto_part(state["auto"], self.plan(), self._laws)
        self._parking, self._rounds = part.parking, part.rounds
        self._follow_up, self._confirming = part.follow_up, part.confirming


def _means(in_force: Mapping[str, Sequence[float]] | None) -> dict[str, float] | None:
    """Each worker's mean of its times in force (None without them): the decision's tests share them."""
    # statistics.fmean's sum over its count, as it takes them of a list (every worker's, at once)
    return None if in_force is None else {k: math.fsum(t) / len(t) for k, t in in_force.items()}

