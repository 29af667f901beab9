"""The default batch policy: the measured proportional step where a worker's law is not known (its
first decision, a change of speed), the fitted law's one-step solve and parking where it is
(OmniLearn's proportional control with Cannikin's OptPerf; docs/policies.md tells how it decides).

Each worker's times are fitted as t(b) = q·b + s (law.py). Seen at one batch size since it joined or
changed, its law is the line through the origin, and the solve over such lines is the proportional
step (equal times at the measured throughputs); seen at two far enough apart, its law has its fixed
cost, and the solve is the optimal split, parking a worker that surely only slows the round
(model/optperf.py). The second batch size comes from the first step: no probe. A worker whose newest
times leave its law by more than the noise for a few rounds changed speed (change.py): its points
from before the change are forgotten (worker_laws.py), the next decision, due at once, steps it from
its new times, and its law is fitted again from them.

A decision holds the plan while it is measured balanced (model/balance.py, within the deadband), or
while the solve predicts a round shorter by less than MIN_GAIN and the noise of the measured times;
a re-solve of laws that held must also beat their error on the plan in force, twice in a row. A
parked worker comes back for a re-probe now and then (parking.py).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

from ps.control.auto.change import ALONG_ROUNDS, ALONG_SDS
from ps.control.auto.law import SPREAD
from ps.control.auto.parking import ParkingSchedule
from ps.control.auto.rounds import RoundLog, prediction_error
from ps.control.auto.state import auto_part, read_auto_part
from ps.control.auto.worker_laws import WorkerLaws
from ps.control.checks import real
from ps.control.model.balance import measured_balanced
from ps.control.model.optperf import best_plan, nearest_plan
from ps.control.model.time_fit import CAUTION
from ps.control.performance import FinishTime, FittedRounds, round_time
from ps.control.split import fit_to_sum
from ps.control.worker_plan import WorkerPlan

MIN_GAIN = 0.03
"""A new split replaces the plan in force only if its predicted round is this much shorter, and by
GAIN_SDS standard errors of the noisiest worker's mean time; a re-solve of laws that held, by half the
deadband too (a smaller gain is not worth a move) and by their error on the plan in force."""
GAIN_SDS = 2.0
FOLLOW_UP = 2
"""A decision the policy asks for (after a step from proportional lines, a re-probe or a replan) waits
for this many times `min_samples` observations per worker: a law is fitted from them."""


class AutoPolicy(WorkerPlan):
    """Proportional steps until a worker's law is known, the law's solve and parking after."""

    name = "auto"
    parks = True
    extra_state_keys = frozenset({"auto"})

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._laws = WorkerLaws(config.min_samples, config.deadband)
        self._parking = ParkingSchedule()
        self._rounds = RoundLog()
        self._follow_up = True  # the plan in force asks for a decision as soon as it is measured
        self._confirming = False  # the last decision found a re-solve worth it and held to confirm it
        self._report: dict[str, Any] = {}

    # ------------------------------------------------------------------ what the policy is told
    def _added(self, worker_id: str) -> None:
        self._laws.add(worker_id)

    def _removed(self, worker_id: str) -> None:
        self._laws.remove(worker_id)
        self._parking.forget(worker_id)

    def _record(self, worker_id: str, batch: int, compute_ms: float, exposed_ms: float | None) -> None:
        if self._laws.record(worker_id, batch, compute_ms, exposed_ms):
            self._rounds.push(worker_id, batch)

    def observe_round(self, round_ms: float) -> None:
        ms = real("round_ms", round_ms)
        if ms < 0:
            raise ValueError(f"round_ms must be >= 0, got {ms}")
        self._rounds.close(ms, self._laws.finishes())

    # ------------------------------------------------------------------ laws
    def _identified(self, worker_id: str) -> bool:
        """Whether the worker's law is known (law.py), or its bounds fix its batch."""
        w, law = self._workers[worker_id], self._laws.law(worker_id)
        return w.min_batch == w.max_batch or (law is not None and law.known)

    def _times(self) -> dict[str, FinishTime]:
        """Each worker's finish time in its batch for comparing plans: a known law plus its uncertainty
        (time_fit.Finish.cautious); a proportional line as measured (new times are trusted at once);
        a worker not measured yet at the slowest measured time per sample, never predicted fast."""
        finishes = self._laws.finishes()
        per_sample = max((f.at(1) for f in finishes.values()), default=1.0)
        return {k: ((finishes[k].cautious if self._identified(k) else finishes[k].at) if k in finishes
                    else (lambda b, p=per_sample: p * b)) for k in self._workers}

    def _active(self) -> list[str]:
        return [k for k, w in self._workers.items() if w.batch]

    # ------------------------------------------------------------------ decisions
    def decision_due(self) -> bool:
        """A decision is wanted now: a worker changed speed, or the plan in force was set from
        proportional lines, a re-probe or a replan, and every worker in it is measured at its batch."""
        active = self._active()
        if not active or any(w.batch is None for w in self._workers.values()):
            return False
        changed = bool(self._laws.changed & set(active))
        need = self._config.min_samples * (1 if changed else FOLLOW_UP)
        return (self._follow_up or changed) and all(self._workers[k].samples >= need for k in active)

    def _decide(self) -> dict[str, int] | None:
        active, current = self._active(), self.plan()
        report: dict[str, Any] = {"policy": self.name, "previous": self._rounds.closing()}
        if not all(self._workers[k].samples >= self._config.min_samples for k in active):
            self._parking.tick()
            self._report = {**report, "phase": "wait", **self._describe(current)}
            return None
        # one event often moves several workers, and a plan measured out of balance may hide a change
        # under a move: look again at the others, less strictly
        if self._laws.changed or not self._balanced(current):
            for k in active:
                if k not in self._laws.changed:
                    self._laws.forget_before_change(k, ALONG_SDS, ALONG_ROUNDS)
        follow, changed = self._follow_up, sorted(self._laws.changed)
        if not (follow or changed):  # a parked worker waits for the server's decisions, not those asked for
            self._parking.tick()
        reprobe = self._parking.due()
        self._laws.changed, self._follow_up = set(), False
        report["speed_changed"] = changed
        times = self._times()
        new, parked, compared = self._solve(times, forced_in=reprobe)
        priced = FittedRounds(times)
        gain = priced.predict(current) / max(priced.predict(new), 1e-9) - 1.0
        resolve = not (reprobe or changed or follow)
        min_gain = max(MIN_GAIN, GAIN_SDS * self._time_error(current),
                       max(self._config.deadband / 2, prediction_error(report["previous"])) if resolve else 0.0)
        report.update(gain=round(gain, 4), min_gain=round(min_gain, 4))
        hold: dict[str, Any] = {}
        if not reprobe:
            balanced = set(parked) == set(self.parked()) and self._balanced(current)
            confirm = resolve and gain > min_gain and not balanced and not self._confirming
            self._confirming = confirm
            if balanced or confirm or not gain > min_gain:
                hold = {"phase": "hold", **({"balanced": True} if balanced else {}), **({"confirm": True} if confirm else {})}
        base = current if hold else new
        probes = self._probes(base, current, changed)
        probed = self._probe_plan(base, probes) if probes else None
        if probed is not None:
            new, parked = probed, [k for k, b in base.items() if b == 0]
        elif hold:
            self._report = {**report, **hold, **self._describe(current)}
            return None
        else:
            probes = {}
        self._confirming = False
        known = all(self._identified(k) for k, b in new.items() if b > 0)
        if known and resolve:  # a re-solve moves no more than its gain asks
            lower, upper = self._bounds()
            new = nearest_plan(times, new, current, lower, upper, slack=min_gain / 2)
        self._parking.install(parked, reprobe)
        self._follow_up = bool(reprobe or probes) or not known
        phase = "reprobe" if reprobe else "probe" if probes else "solve" if known else "step"
        self._report = {**report, "phase": phase, **({"reprobe": reprobe} if reprobe else {}),
                        **({"probe": sorted(probes)} if probes else {}),
                        **({"park": compared} if compared else {}), **self._describe(new)}
        return new

    def replan(self) -> dict[str, int]:
        """Split B over the current workers: the solve when every worker is measured, else by the
        measured throughputs where known (`dynamic_start` for the others); a decision is then due as
        soon as the new plan is measured."""
        if not self._workers:
            return {}
        report = {"policy": self.name, "previous": self._rounds.closing()}
        self._follow_up, self._confirming = True, False
        if all(k in self._laws.finishes() for k in self._workers):
            new, parked, compared = self._solve(self._times(), forced_in=[])
            self._parking.install(parked, [])
            self._apply(new)
            self._report = {**report, "phase": "replan", **({"park": compared} if compared else {}),
                            **self._describe(new)}
            return self.plan()
        self._parking.clear()
        self._apply(self._split(self._measured_weights()))
        self._report = {**report, "phase": "replan", **self._describe(self.plan())}
        return self.plan()

    def _probes(self, plan: Mapping[str, int], current: Mapping[str, int], changed: list[str]) -> dict[str, int]:
        """The changed workers at their minimum batch (one back from parking among them) still on a
        proportional line, that finish earlier than the slowest by more than the deadband, yet that
        `plan` (the decision's) does not move SPREAD up: each SPREAD up, whatever the gain, so that
        its next times give it a law. A proportional line through the smallest batch overprices a
        worker whose time is mostly fixed cost, and would hold it there."""
        means = {k: statistics.fmean(t) for k, b in current.items() if b > 0 and (t := self._laws.recent(k, b))}
        slowest = max(means.values(), default=0.0)
        lower, upper = self._bounds()
        out = {}
        for k in changed:
            b = current.get(k, 0)
            up = b + max(2, math.ceil(SPREAD * b))
            early = k in means and means[k] < (1.0 - self._config.deadband) * slowest
            if b == lower[k] and early and not self._identified(k) and plan[k] < up <= upper[k]:
                out[k] = up
        return out

    def _probe_plan(self, plan: Mapping[str, int], probes: Mapping[str, int]) -> dict[str, int] | None:
        """`plan` with the `probes` at their batches and the other planned workers scaled to what they
        leave of B (the same ones parked); None where their bounds cannot take it."""
        lower, upper = self._bounds()
        rest = [k for k, b in plan.items() if b > 0 and k not in probes]
        total = self._config.global_batch - sum(probes.values())
        if not self._exact_sum():
            return {**plan, **probes}
        if not rest or not sum(lower[k] for k in rest) <= total <= sum(upper[k] for k in rest):
            return None
        scaled = fit_to_sum({k: float(plan[k]) for k in rest}, total, {k: lower[k] for k in rest},
                            {k: upper[k] for k in rest}, self.round_for_time)
        return {**dict.fromkeys(plan, 0), **scaled, **probes}

    def _solve(self, times: Mapping[str, FinishTime],
               forced_in: list[str]) -> tuple[dict[str, int], list[str], dict[str, float]]:
        """The best split of B over every worker, parking those (not `forced_in`) that only slow the
        round, surely (`_surely_slower`); one parked now is favoured in a near-tie."""
        lower, upper = self._bounds()
        if not self._exact_sum():  # ASP whose bounds cannot meet B: everyone at the bound B pushes them to
            return dict(upper if sum(upper.values()) < self._config.global_batch else lower), [], {}
        may_park = [k for k in self._workers if k not in forced_in] if self._may_park() else []
        for _ in range(2):
            plan, parked, compared = best_plan(times, self._config.global_batch, lower, upper, may_park=may_park,
                                               overhead=self._rounds.overhead_ms, min_gain=MIN_GAIN,
                                               prefer=self.parked())
            level = round_time(times, plan) * (1.0 + MIN_GAIN)
            sure = [k for k in parked if self._surely_slower(k, lower[k], level)]
            if sure == parked:
                break
            may_park = sure
        return plan, parked, compared

    def _surely_slower(self, worker_id: str, batch: int, level: float) -> bool:
        """Whether even the most favourable reading of the worker's law (CAUTION standard errors below
        it) finishes `batch` after `level`: a fixed cost extrapolated from nearby batch sizes is too
        uncertain to park a worker on. A proportional line counts no fixed cost, so it is such a
        reading below the batch it was measured at: a worker whose law is not known is parked where
        even that line says so."""
        finishes = self._laws.finishes()
        if worker_id not in finishes:
            return False
        finish = finishes[worker_id]
        return finish.at(batch) - CAUTION * finish.line.sd(batch) > level

    def _time_error(self, plan: Mapping[str, int]) -> float:
        """The largest relative standard error of a planned worker's mean time at its batch: how far
        the noise alone may move a predicted gain."""
        errors = [0.0]
        for k, b in plan.items():
            recent = self._laws.recent(k, b) if b > 0 else None
            if recent and len(recent) > 1 and statistics.fmean(recent) > 0:
                errors.append(statistics.stdev(recent) / statistics.fmean(recent) / len(recent) ** 0.5)
        return max(errors)

    def _balanced(self, plan: Mapping[str, int]) -> bool:
        """Whether the plan in force is measured balanced, on each planned worker's times since it got
        its batch (model/balance.py)."""
        times = {}
        for k, b in plan.items():
            recent = self._laws.recent(k, b) if b > 0 else None
            if b > 0 and recent is None:
                return False
            if recent is not None:
                times[k] = recent
        lower, upper = self._bounds()
        return measured_balanced(times, plan, lower, upper, self._config.deadband)

    # ------------------------------------------------------------------ what the policy reports
    def report(self) -> dict[str, Any]:
        return dict(self._report)

    def predicted_round_ms(self, total: int) -> float | None:
        """The laws' round at the best split of `total` plus c; None until every law is known."""
        active, (lower, upper) = self._active(), self._bounds()
        finishes = self._laws.finishes()
        if not active or not all(k in finishes and self._identified(k) for k in active):
            return None
        upper = {k: total if self._config.max_batch is None else hi for k, hi in upper.items()}
        return FittedRounds({k: finishes[k].at for k in active}, self._rounds.overhead_ms, lower,
                            upper).predict_global(total)

    def _describe(self, plan: Mapping[str, int]) -> dict[str, Any]:
        """The laws (q, s, whether known), c, the parked workers and the predicted round of `plan`."""
        finishes = self._laws.finishes()
        fits = {k: {"q": round(f.line.q, 6), "s": round(f.line.s, 4), "law": self._identified(k)}
                for k, f in finishes.items()}
        c = self._rounds.overhead_ms if self._config.keep_global_sum else 0.0  # ASP: a step, no round
        known = bool(plan) and all(k in finishes for k, b in plan.items() if b > 0)
        predicted = FittedRounds({k: f.at for k, f in finishes.items()}, c).predict(plan) if known else None
        self._rounds.predicted = predicted
        return {"fits": fits, "overhead_ms": round(c, 3),
                "predicted_round_ms": None if predicted is None else round(predicted, 3),
                "parked": sorted(k for k, b in plan.items() if b == 0)}

    # ------------------------------------------------------------------ resume and checkpoints
    def _keeps_plan_of(self, old: WorkerPlan) -> bool:
        return isinstance(old, AutoPolicy)

    def _adopted(self, old: WorkerPlan) -> None:
        """An auto policy's laws carry over; its parking only where this one keeps the worker at 0."""
        if isinstance(old, AutoPolicy):
            state = old._extra_state()
            parked = state["auto"]["parking"]["parked"]
            state["auto"]["parking"]["parked"] = {k: v for k, v in parked.items() if self._workers[k].batch == 0}
            self._restore_extra(state)

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
