"""What the model and auto policies share (model/policy.py, auto/policy.py): a plan over fitted
finish times, the BSP rounds behind their overhead c (rounds.py), the parked workers (parking.py),
the balance a plan is held on (balance.py), and each decision's report with the fits, c and the
predicted round of the plan it leaves in force. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from ps.control.checks import real
from ps.control.config import PolicyConfig
from ps.control.model.balance import measured_balanced
from ps.control.model.break_even import (break_even_batch, park_below_break_even, parked_one_by_one,
                                         raised_to_break_even)
from ps.control.model.optperf import best_plan
from ps.control.model.parking import ParkingSchedule
from ps.control.model.rounds import RoundLog
from ps.control.model.time_fit import Finish, slope_measured
from ps.control.model.worker_times import LONGEST_MS
from ps.control.performance import FinishTime, FittedRounds
from ps.control.split import fit_to_sum, reachable
from ps.control.worker_plan import WorkerPlan


class LeftPlan(NamedTuple):
    """The plan a re-probe left and its measured round. `judged`: taken back where the rounds since were
    slower; not for a recall (its cause slowed them too): those it brought back and parked again owe
    their cost beyond that round (parking.owe), the most it can have been."""

    plan: dict[str, int]
    round_ms: float
    judged: bool


class FittedTimes(Protocol):
    """Every worker's observations and fitted finish time (worker_fits.py, auto/worker_laws.py)."""

    def finishes(self) -> Mapping[str, Finish]: ...

    def in_force(self, plan: Mapping[str, int]) -> dict[str, Sequence[float]] | None: ...


class FittedPlan(WorkerPlan):
    """A plan solved from each worker's fitted finish time, with parking and a report per decision.
    A subclass sets `_held` (its workers' times) and `_rounds`, and says which workers are identified."""

    parks = True
    _held: FittedTimes
    _rounds: RoundLog

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__(config)
        self._parking = ParkingSchedule()
        self._confirming = False  # the last decision found a re-solve worth it and held to confirm it
        self._report: dict[str, Any] = {}
        self._before_reprobe: LeftPlan | None = None  # the plan a re-probe left
        self._judged_round: float | None = None  # while a decision judges a re-probe: the round it left

    def observe_round(self, round_ms: float, push_ms: float = 0.0) -> None:
        """The round's overhead c and the server's CPU a push (rounds.py)."""
        ms, push = real("round_ms", round_ms), real("push_ms", push_ms)
        if ms < 0 or push < 0:
            raise ValueError(f"round_ms and push_ms must be >= 0, got {ms} and {push}")
        self._rounds.close(min(ms, LONGEST_MS), self._held.finishes, min(push, LONGEST_MS))  # as a worker's time is kept
        self._parking.elapse(ms)

    def _settle_rounds(self) -> None:
        """The closed rounds' c, taken now (`_held.before_jump`: before a worker's fit jumps)."""
        self._rounds.settle()

    def _identified(self, worker_id: str) -> bool:
        """Whether the worker's fit is known well enough to solve with."""
        raise NotImplementedError

    def _decision(self) -> dict[str, int] | None:
        """The plan after one decision (None: unchanged), its report in `_report`."""
        raise NotImplementedError

    def _decide(self) -> dict[str, int] | None:
        """`_decision`, unless it judges a re-probe the rounds contradict (`_taken_back`)."""
        judged, self._before_reprobe = self._before_reprobe, None
        parking = self._parking.state() if judged is not None else None  # to restore on a take-back
        reprobed = list(self._parking.reprobed)
        self._judged_round = None if judged is None or not judged.judged else judged.round_ms
        try:
            new = self._decision()
        finally:
            self._judged_round = None
        if judged is None or parking is None:
            return new
        if self._report.get("phase") == "wait":  # not measured yet: the next decision judges it
            self._before_reprobe = judged
            return new
        cost = self._reprobe_cost(judged.round_ms)
        if not judged.judged:  # a recall: those parked again owe it
            self._parking.owe(reprobed, cost)
        if not judged.judged or set(self._report.get("speed_changed", ())) - set(reprobed):
            return new  # rounds across another's change judge nothing
        back = self._taken_back(judged, self._report["previous"]["measured_round_ms"],
                                new if new is not None else self.plan(), reprobed)
        if back is None:
            self._parking.owe(reprobed, cost)
            return new
        restored = ParkingSchedule.from_state(parking, self._workers)
        restored.keep_time(self._parking)
        self._parking = restored
        self._parking.install([k for k, b in back.items() if b == 0], [])
        self._parking.owe(reprobed, cost)
        self._before_reprobe, self._confirming = None, False
        self._took_back()
        opening = {k: v for k, v in self._report.items() if k in ("policy", "previous", "speed_changed")}
        self._report = {**opening, "phase": "revert", "reverted": sorted(reprobed), **self._describe(back)}
        return back

    def _reprobe_cost(self, before: float) -> float:
        """The ms of rounds the re-probe this decision judges cost beyond the plan it left (whose round
        was `before`): its rounds' measured median less that, times their count (0 where not measured)."""
        previous = self._report.get("previous", {})
        measured, rounds = previous.get("measured_round_ms"), previous.get("rounds", 0)
        return max(0.0, measured - before) * rounds if measured is not None else 0.0

    def _taken_back(self, judged: LeftPlan, measured: float | None,
                    outcome: Mapping[str, int], reprobed: list[str]) -> dict[str, int] | None:
        """The plan a re-probe left (with `break_even`, less the workers the laws now put below their
        break-even), where the decision that judges it keeps a re-probed worker in the
        round although the rounds since measured slower than that plan's by more than the deadband; None
        otherwise, and where B, the workers or their bounds changed since. The round is the judge, not
        the fits: a law fitted at larger batches misses the fixed costs of the few samples a re-probe
        runs at, and a fit through the re-probe's own times can favour the plan it made."""
        left, before = judged.plan, judged.round_ms
        if measured is None or not measured > before * (1.0 + self._config.deadband):
            return None
        if not any(outcome.get(k, 0) > 0 for k in reprobed):
            return None
        lower, upper = self._bounds()
        if (set(left) != set(self._workers) or sum(left.values()) != self._config.global_batch
                or any(b and not lower[k] <= b <= upper[k] for k, b in left.items())):
            return None
        # the laws have moved since that plan was made: one of its workers may now be below its break-even
        return self._with_break_even(left)[0]

    def _reprobing(self, left: Mapping[str, int], report: Mapping[str, Any], judged: bool = True) -> None:
        """A re-probe is installed over `left`: remember it and its measured round (`report`'s opening)
        for the decision that judges the re-probe (`judged`), or, a recall, that prices it (LeftPlan)."""
        measured = report["previous"]["measured_round_ms"]
        self._before_reprobe = None if measured is None else LeftPlan(dict(left), float(measured), judged)

    def _took_back(self) -> None:
        """Hook: a re-probe was taken back, the plan it left is in force again."""

    def _overhead(self, plan: Mapping[str, int]) -> float:
        """c for the workers of `plan`."""
        return self._rounds.overhead_ms

    def _active(self) -> list[str]:
        return [k for k, w in self._workers.items() if w.batch]

    def _opening(self) -> dict[str, Any]:
        """The start of a decision's report: the policy and the plan it leaves (rounds.RoundLog.closing)."""
        return {"policy": self.name, "previous": self._rounds.closing()}

    def _balanced(self, plan: Mapping[str, int]) -> bool:
        """Whether the plan in force is measured balanced (balance.measured_balanced), on each planned
        worker's finish times since it got its batch (at least `min_samples`)."""
        return self._balanced_on(self._held.in_force(plan), plan)

    def _balanced_on(self, times: Mapping[str, Sequence[float]] | None, plan: Mapping[str, int],
                     means: Mapping[str, float] | None = None) -> bool:
        """`_balanced` on the plan's times in force (WorkerTimes.in_force's; `means`: their means)."""
        lower, upper = self._bounds()
        return times is not None and measured_balanced(times, plan, lower, upper, self._config.deadband, means)

    def replan(self) -> dict[str, int]:
        """Split B over the current workers: solved from the fits when every worker has one that is
        identified (`_solvable`; parking included), else by measured throughputs where known
        (`dynamic_start` for the others) over those not parked (all, where those cannot make B up)."""
        if not self._workers:
            return {}
        report = self._opening()
        self._confirming = False
        self._before_reprobe = None
        self._replanning()
        if self._solvable():
            new, parked, compared = self._solve_all()
            self._install_parking(parked, [])
            self._apply(new)
            self._report = {**report, "phase": "replan", **({"park": compared} if compared else {}),
                            **self._describe(new)}
            return self.plan()
        weights = self._measured_weights()
        # those parked stay parked where the others make B up: a replan without the fits (a worker joined,
        # or --adaptive-batch moved B before a law was fitted at it) has no evidence against their parking
        kept = self.parked()
        if not kept or self._split_without(weights, kept) is None:
            self._unpark()
            kept = []
        plan, parked = self._parked_below_break_even(lambda out: self._split_without(weights, [*kept, *out]))
        self._parking.park(parked)
        self._apply(plan)
        self._report = {**report, "phase": "replan", **self._describe(self.plan())}
        return self.plan()

    def _split_without(self, weights: Mapping[str, float], out: list[str]) -> dict[str, int] | None:
        """B split by `weights` (`_split`) over the workers but those `out`, at batch 0; None where the
        others' bounds cannot make B up."""
        if not out:
            return self._split(weights)
        lower, upper = self._bounds()
        rest = [k for k in self._workers if k not in out]
        total = self._config.global_batch
        if not self._exact_sum() or not reachable(rest, total, lower, upper):
            return None
        return {**dict.fromkeys(out, 0), **fit_to_sum({k: weights[k] for k in rest}, total,
                                                      {k: lower[k] for k in rest}, {k: upper[k] for k in rest},
                                                      self.round_for_time)}

    def _parked_below_break_even(self, plan_without: Callable[[list[str]], dict[str, int] | None]
                                 ) -> tuple[dict[str, int], list[str]]:
        """The plan `plan_without([])` makes, with the workers whose law puts them below their
        break-even parked, the plan made again without them (break_even.parked_one_by_one), and those
        parked; as it is without `break_even`. For the plans a decision makes without a solve (a probe,
        a split by measured speeds): their shape is theirs, and no worker with a known law runs a round
        of its fixed cost for a few samples in them either."""
        laws = self._break_even_laws() if self._parks_below_break_even() else {}
        return parked_one_by_one(laws, plan_without, self._workers)

    def _replanning(self) -> None:
        """Hook: a replan starts."""

    def _solvable(self) -> bool:
        """Whether a replan can solve from the fits."""
        raise NotImplementedError

    def _solve_all(self) -> tuple[dict[str, int], list[str], dict[str, float]]:
        """A replan's solve: the split, who is parked, and the parking comparison."""
        raise NotImplementedError

    def _install_parking(self, parked: list[str], reprobe: list[str]) -> None:
        """Record who is parked after a solve (parking.py)."""
        self._parking.install(parked, reprobe)

    def _unpark(self) -> None:
        """A replan without the fits: nobody is parked."""
        self._parking.clear()

    def _describe(self, plan: Mapping[str, int]) -> dict[str, Any]:
        """What a decision reports of `plan` (`_described`)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ what a decision reports
    def report(self) -> dict[str, Any]:
        return dict(self._report)

    def predicted_round_ms(self, total: int) -> float | None:
        """The fits' round at the best split of `total` (a default bound follows it) plus c
        (performance.FittedRounds); None until every active worker is identified. Without parking
        (ASP, --no-park) the split is over the active workers; with it, the plan the policy would
        install over them and the parked workers whose law is known: optperf.best_plan's parking and,
        with `break_even` (--adaptive-batch), no active worker below its break-even batch
        (`_break_even`): a B is priced with the workers it would park parked. A worker whose time per
        sample is not measured is priced proportional to its batch above the batches it ran at
        (`vouched`), not at its fixed cost alone."""
        predicted = self._predicted(total)
        return None if predicted is None else predicted[0]

    def predicted_plan(self, total: int) -> dict[str, int] | None:
        """The plan `predicted_round_ms(total)` prices (None where it is None): which workers a B would train."""
        predicted = self._predicted(total)
        return None if predicted is None else predicted[1]

    def _predicted(self, total: int) -> tuple[float, dict[str, int]] | None:
        """The round and the plan at `total` (`predicted_round_ms`); None until every active worker is
        identified, or outside the bounds."""
        active, (lower, upper) = self._active(), self._bounds()
        finishes = self._held.finishes()
        if not active or not all(k in finishes and self._identified(k) for k in active):
            return None
        upper = {k: total if self._config.max_batch is None else hi for k, hi in upper.items()}
        # a law whose time per sample is not measured is not extrapolated upward (`vouched`)
        model = FittedRounds({k: vouched(finishes[k]) for k in active}, self._overhead(self.plan()), lower, upper)
        if not self._may_park() or not reachable(active, total, lower, upper):
            plan = model.plan_global(total)
            return None if plan is None else (model.predict(plan), plan)
        # the parked workers whose law is known are candidates too, as in a solve: a larger B may pay for them
        every = [k for k in self._workers if k in active or (k in finishes and self._identified(k))]
        times = {k: vouched(finishes[k]) for k in every}
        plan, _, _ = best_plan(times, total, lower, upper, may_park=every, overhead=model.overhead_ms)
        plan, _ = self._break_even(plan, times, lower, upper, every)
        return FittedRounds(times, model.overhead_ms).predict(plan), dict(plan)

    def _breaks_even(self, plan: Mapping[str, int]) -> bool:
        """Whether `plan` may be held: no parkable active worker below its break-even batch (always
        without `break_even`); a decision installs a solve over a plan that is not."""
        return not self._with_break_even(plan)[1]

    def _with_break_even(self, plan: Mapping[str, int]) -> tuple[dict[str, int], list[str]]:
        """`plan` with its active workers below their break-even parked, by the laws now (`_break_even`
        over the plan's own workers), and those parked; `plan` as it is where one active worker is not
        measured yet (nothing to judge by), and without `break_even`."""
        if not self._parks_below_break_even():
            return dict(plan), []
        active = [k for k, b in plan.items() if b > 0]
        times = {k: f.at for k, f in self._held.finishes().items() if k in plan}
        if not all(k in times for k in active):
            return dict(plan), []
        return self._break_even(plan, times, *self._bounds(), active)

    def _parks_below_break_even(self) -> bool:
        """`break_even` in the config (--adaptive-batch) where the policy parks."""
        return self._config.break_even and self._may_park()

    def _reprobes_due(self) -> list[str]:
        """The parked workers whose re-probe is due (parking.py); with `break_even`, those of them the
        total leaves room to bring back at their break-even batch (`_reprobe_bounds`): one brought back
        below it would run a round of its fixed cost for a few samples, the plan a break-even forbids.
        The others stay parked and are due again at the next decision (a larger B may make room), as
        are all of them at a decision that judges a re-probe: its rounds are no measure for another."""
        due = [] if self._judged_round is not None else self._parking.due()  # none starts at a decision judging one
        if not (self._parks_below_break_even() and due):
            return due
        lower, upper = self._bounds()
        raised = self._reprobe_bounds(lower, upper, due)
        laws = {k: f.at for k, f in self._held.finishes().items() if k in due and self._identified(k)}
        return [k for k in due if k not in laws or raised[k] >= break_even_batch(laws[k], upper[k])]

    def _reprobe_bounds(self, lower: Mapping[str, int], upper: Mapping[str, int],
                        reprobe: list[str]) -> dict[str, int]:
        """`lower` with the active workers at their break-even batch at least, then the workers brought
        back for a re-probe at theirs in what B leaves (with `break_even`; `lower` as it is without): a
        re-probe never crowds out a worker that carries the round."""
        if not (self._parks_below_break_even() and reprobe):
            return dict(lower)
        laws = {k: f.at for k, f in self._held.finishes().items() if self._identified(k)}
        active = [k for k, w in self._workers.items() if w.batch and k not in reprobe]
        kept = raised_to_break_even(laws, lower, upper, active, self._config.global_batch)
        return raised_to_break_even(laws, kept, upper, reprobe, self._config.global_batch)

    def _kept_at_break_even(self, plan: Mapping[str, int], lower: Mapping[str, int],
                            upper: Mapping[str, int]) -> dict[str, int]:
        """`lower` with each active worker of `plan` raised to its break-even batch (no higher than its
        batch in `plan`), for a move toward the plan in force (optperf.nearest_plan) that must not take
        a worker back below it (with `break_even`; `lower` as it is without)."""
        if not self._parks_below_break_even():
            return dict(lower)
        laws = self._break_even_laws()
        raised = dict(lower)
        for k, b in plan.items():
            if b > 0 and k in laws:
                raised[k] = max(lower[k], min(b, break_even_batch(laws[k], upper[k])))
        return raised

    def _break_even(self, plan: Mapping[str, int], times: Mapping[str, FinishTime], lower: Mapping[str, int],
                    upper: Mapping[str, int], may_park: list[str]) -> tuple[dict[str, int], list[str]]:
        """`plan` with the workers of `may_park` below their break-even batch by their identified law
        parked, their share split over the others by `times` (break_even.py), and those parked; `plan`
        as it is without `break_even` in the config or where the policy does not park. A law whose time
        per sample is not measured (time_fit.slope_measured) has no break-even: its fixed cost may be
        the noise's (a fast worker fitted flat between 51 and 59 samples was parked at B = 193)."""
        if not self._parks_below_break_even():
            return dict(plan), []
        return park_below_break_even(times, self._break_even_laws(), plan, lower, upper, may_park)

    def _break_even_laws(self) -> dict[str, FinishTime]:
        """The laws a break-even is taken from: each worker's identified law whose time per sample is
        measured (`_break_even`)."""
        return {k: f.at for k, f in self._held.finishes().items()
                if k in self._workers and self._identified(k) and slope_measured(f.line)}

    def _described(self, plan: Mapping[str, int], fits: dict[str, dict[str, Any]],
                   times: Mapping[str, FinishTime]) -> dict[str, Any]:
        """`fits`, c, the parked workers and the predicted round of `plan` over `times` (which becomes the
        plan in force)."""
        finishes = self._held.finishes()
        c = self._overhead(plan) if self._config.keep_global_sum else 0.0  # ASP: a step, no round
        known = bool(plan) and all(k in finishes for k, b in plan.items() if b > 0)
        predicted = FittedRounds(times, c).predict(plan) if known else None
        self._rounds.predicted = predicted
        return {"fits": fits, "overhead_ms": round(c, 3),
                "predicted_round_ms": None if predicted is None else round(predicted, 3),
                "parked": sorted(k for k, b in plan.items() if b == 0)}


def vouched(finish: Finish) -> FinishTime:
    """The finish time a prediction at another batch may rest on: `finish.at` where its line's time per
    sample is measured (`slope_measured`); else `finish.at` up to the line's centre (where it was
    measured) and proportional to the batch above it. Times at nearby batch sizes can fit a line flat
    by their noise alone, and extrapolated upward it prices any batch at its fixed cost alone: on
    HL8 a worker fitted at 16 samples (q = 4e-5 ms, s = 480 ms) was priced at 92 samples at 480 ms and
    ran them in 2,230. Nondecreasing like `at`, and equal to it at and below the centre."""
    line = finish.line
    if slope_measured(line):
        return finish.at
    centre = max(1.0, line.centre)
    at_centre = finish.at(centre)

    def time(batch: float) -> float:
        return finish.at(batch) if batch <= centre else at_centre * batch / centre

    return time
