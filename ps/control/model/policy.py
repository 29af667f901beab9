"""The model policy: Cannikin's OptPerf behind the batch-policy interface (Cannikin §3-4;
docs/policies.md tells the same life with its figures).

Per worker it fits the finish time f_i(b) = q_i·b + s_i (+ exposed communication, time_fit.py) from
the (batch, time) pairs the worker reports, learns the round's overhead c (the server's close-to-
close round time minus the slowest fitted finish of that round, per set of workers in the round),
and splits B in one step by minimising the predicted round max_i f_i(b_i) + c (optperf.py):

1. **Probe.** One batch size cannot separate q from s, so once every worker has `min_samples`
   observations at its first batch the policy asks for a decision at once (`decision_due`) and
   moves each worker to a second batch (Cannikin's Eq. 8, nudged by probes.PROBE_STEP).
2. **Solve.** Once the probes are measured it solves and installs the split, at once.
3. **Hold or re-solve.** A worker off its older fit by the deadband and the noise changed speed:
   its history is rescaled (observations.Observations.drift, rescale). A plan measured balanced is
   held. Otherwise the split is re-solved with the fits' uncertainty (time_fit.Finish.cautious) and
   installed if it beats the plan in force by more than MIN_GAIN or the model's error on that plan,
   and, unless a worker drifted, if the decision before found such a gain too; at once when B or
   the workers change (`replan`). The split installed is the one nearest the plan in force within
   half that margin of the optimum (optperf.nearest_plan), each worker moved at most trust.TRUST times.
4. **Park.** In BSP a worker whose fixed cost alone exceeds the round the others reach without it
   is planned at batch 0 where that predicts a shorter round (optperf.best_plan), Σb = B over the
   others; it is re-probed after parking.REPROBE_FIRST decisions, the wait doubling up to
   REPROBE_MAX, and long enough that its re-probes take parking.REPROBE_SHARE of the job's time at most. ASP never parks: the same fit splits B for equal step times.

Every decision's `report` carries the fits, c, the predicted round of the plan it leaves in force
and the measured median round of the plan before, so prediction error can be read from the log.

Each worker's observations and fit are held in worker_fits.py, the rounds behind c in rounds.py, the
parked workers in parking.py, the probes' plan in probes.py, the bounds of a re-solve in trust.py and
the policy's own checkpoint state in checkpoint.py; what it shares with the auto policy (the round's
overhead, the balance a plan is held on, replans and reports) in fitted_plan.py; this module decides.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ps.control.model.checkpoint import ModelPart, model_state, read_model_state
from ps.control.model.optperf import best_plan, nearest_plan, outlasting
from ps.control.model.fitted_plan import FittedPlan
from ps.control.model.probes import probe_plan
from ps.control.model.rounds import MIN_ERROR_ROUNDS, WorkerSetRounds, prediction_error
from ps.control.model.trust import trusted_bounds
from ps.control.model.worker_fits import WorkerFits
from ps.control.performance import FittedRounds
from ps.control.split import reachable
from ps.control.worker_plan import WorkerPlan

MAX_PROBES = 3
"""Probe decisions per worker before its fit is taken as it is (bounds may leave no second batch)."""
PROBE_SAMPLES = 2
"""A probe or the solve after it waits for this many times `min_samples` observations per worker:
two points one fit extrapolates from want less noise than a decision that only checks a plan."""
MIN_GAIN = 0.03
"""A new split replaces the plan in force only if its predicted round is this much shorter (or by the
model's error on the plan in force, if larger)."""


class ModelPolicy(FittedPlan):
    """Fitted per-worker times, a one-step optimal split, probes, and parking (fitted_plan.py)."""

    name = "model"
    extra_state_keys = frozenset({"model"})
    _rounds: WorkerSetRounds

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._held = self._fits = WorkerFits(config.min_samples, config.deadband)
        self._fits.before_jump = self._settle_rounds
        self._probing: set[str] = set()  # workers whose current batch is a probe not yet measured
        self._rounds = WorkerSetRounds()
        self._solved = False
        # a solve kept a small worker: its plan is checked once by its rounds (`_late_now`; in memory only)
        self._checking = False
        self._since_decision = 0  # observations since the last decision

    # ------------------------------------------------------------------ what the policy is told
    def _added(self, worker_id: str) -> None:
        self._fits.add(worker_id)

    def _removed(self, worker_id: str) -> None:
        self._fits.remove(worker_id)
        self._parking.forget(worker_id)
        self._probing.discard(worker_id)

    def _record(self, worker_id: str, batch: int, compute_ms: float, exposed_ms: float | None) -> None:
        if self._fits.record(worker_id, batch, compute_ms, exposed_ms):
            self._rounds.push(worker_id, batch)
            self._since_decision += 1

    # ------------------------------------------------------------------ fits
    def _identified(self, worker_id: str) -> bool:
        """Whether the worker's intercept is measured (two batch sizes), or cannot be (fixed batch,
        or probed MAX_PROBES times)."""
        w = self._workers[worker_id]
        return (w.min_batch == w.max_batch or self._fits.probes[worker_id] >= MAX_PROBES
                or self._fits.measured_batches(worker_id) >= 2)

    @property
    def overhead_ms(self) -> float:
        """c of the plan in force (`overhead_for`)."""
        return self.overhead_for(self.plan())

    def overhead_for(self, plan: Mapping[str, int]) -> float:
        """c for the workers `plan` puts in the round (rounds.WorkerSetRounds.overhead_for; 0 before
        any round, and in ASP). Kept in memory only: a resumed policy starts from the whole window."""
        return self._rounds.overhead_for(plan)

    def _overhead(self, plan: Mapping[str, int]) -> float:
        return self.overhead_for(plan)

    # ------------------------------------------------------------------ decisions
    def decision_due(self) -> bool:
        """A probe or the first solve can be made: every worker in the plan measured at its batch
        (`min_samples` times, and as many rounds since the last decision), and someone still to be
        probed, a probe measured, or no solve yet; or a solve that kept a small worker beside the
        carrying one is contradicted by its rounds (`_late_now`, asked once a solve): without it that
        plan would run until the next scheduled decision, an epoch by default."""
        active = self._active()
        if not active or any(w.batch is None for w in self._workers.values()):
            return False
        if self._since_decision < self._config.min_samples * len(active) or not self._measured_enough(active):
            return False
        if self._probing or not self._solved:
            return True
        if self._checking and len(self._rounds.measured) >= MIN_ERROR_ROUNDS:
            self._checking = False
            if self._late_now():
                return True
        return not all(self._identified(k) for k in active)

    def _measured_enough(self, active: list[str]) -> bool:
        """Every worker in the plan has enough observations at its batch for a decision: `min_samples`,
        PROBE_SAMPLES times that while probing (the probe's point and the one before it are what the
        first solve extrapolates from)."""
        need = self._config.min_samples
        probing = need * PROBE_SAMPLES
        return all(self._workers[k].samples >= (probing if k in self._probing or not self._solved else need)
                   for k in active)

    def _decision(self) -> dict[str, int] | None:
        active = self._active()
        current = self.plan()
        report: dict[str, Any] = self._opening()
        self._since_decision = 0
        self._checking = False
        self._parking.tick()
        if not self._measured_enough(active):
            self._report = {**report, "phase": "wait", **self._describe(current)}
            return None  # someone is not measured at its batch yet
        batches = {k: self._workers[k].batch for k in active}
        self._fits.fit_runs_bases(batches)  # what the drift tests read, at once
        drifted = [k for k in active if self._fits.drifted(k, batches[k])]
        self._probing.clear()
        self._fits.fit_all()  # every fit the decision reads (the drifted ones' after their rescale), at once
        unknown = [k for k in active if not self._identified(k)]
        if unknown:
            new, parked = self._parked_below_break_even(lambda out: self._probe(unknown, current, out))
            self._parking.park(parked)
            for k in unknown:
                self._fits.probes[k] += 1
            self._probing = {k for k in unknown if new[k] != current[k]}
            self._confirming = False
            self._report = {**report, "phase": "probe", "probe": sorted(self._probing), "drift": drifted,
                            **self._describe(new)}
            return new
        reprobe = self._reprobes_due()
        breaks_even = self._breaks_even(current)
        # the first solve's fits are new: the error of the plan they replace is not theirs
        min_gain = max(MIN_GAIN, prediction_error(report["previous"]) if self._solved else 0.0)
        in_force, means = self._in_force(current) if self._solved and not reprobe else (None, None)  # for both tests
        late = self._outlasting(current, report["previous"], in_force, means)
        if (self._solved and not reprobe and not self._parking.reprobed and breaks_even and not late
                and self._balanced_on(in_force, current, means)):
            self._confirming = False
            self._report = {**report, "phase": "hold", "balanced": True, "drift": drifted, **self._describe(current)}
            return None
        new, parked, compared = self._solve(forced_in=reprobe, min_gain=min_gain, trust=self._solved, parkable=late)
        parks_late = any(k in parked for k in late)  # the measured round asks for it: no hold, no confirmation
        reprobe = [k for k in reprobe if k not in parked]
        finishes = self._fits.times(cautious=True)
        compare = FittedRounds(finishes)
        gain = (compare.predict(current) - compare.predict(new)) / max(compare.predict(new), 1e-9)
        report["min_gain"] = round(min_gain, 4)
        # a new plan must beat the model's own error on the plan in force, parking included: where the
        # optimum is flat (a fixed cost dominates) noise in the fits must not move B back and forth, nor
        # near-equal workers swap places; the first solve and a re-probe are installed anyway
        if self._solved and not reprobe and breaks_even and not gain > min_gain and not parks_late:
            self._parking.reprobed, self._confirming = {}, False
            self._report = {**report, "phase": "hold", "drift": drifted, **self._describe(current)}
            return None
        # no worker drifted: the gain must be found twice in a row, one decision's is often noise
        if (self._solved and not reprobe and not self._parking.reprobed and not drifted and breaks_even
                and not self._confirming and not parks_late):
            self._confirming = True
            self._report = {**report, "phase": "hold", "confirm": True, "drift": drifted, **self._describe(current)}
            return None
        self._confirming = False
        if self._solved and self._exact_sum():
            lower, upper = self._bounds()
            new = nearest_plan(finishes, new, current, self._kept_at_break_even(new, lower, upper), upper,
                               slack=min_gain / 2)
        self._install_parking(parked, reprobe)
        if reprobe:
            self._reprobing(current, report)
        self._solved = True
        self._checking = not reprobe and self._keeps_small(new)
        self._report = {**report, "phase": "reprobe" if reprobe else "solve", "drift": drifted,
                        **({"outlasting": late} if late else {}),
                        **({"reprobe": reprobe} if reprobe else {}), **({"park": compared} if compared else {}),
                        **self._describe(new)}
        return new

    def _probe(self, unknown: list[str], current: Mapping[str, int], out: list[str]) -> dict[str, int] | None:
        """The probes' plan (probes.py) over `current` with the workers `out` at batch 0; None where the
        others' bounds cannot make B up."""
        lower, upper = self._bounds()
        base = {**current, **dict.fromkeys(out, 0)}
        rest = [k for k, b in base.items() if b > 0]
        if out and not reachable(rest, self._config.global_batch, lower, upper):
            return None
        return probe_plan(unknown, base, self._fits.finishes(), self._config.global_batch, lower, upper,
                          self._exact_sum(), self.round_for_time)

    def _solvable(self) -> bool:
        return all(self._fits.obs[k].items and self._identified(k) for k in self._workers)  # a fit, and two batch sizes

    def _solve_all(self) -> tuple[dict[str, int], list[str], dict[str, float]]:
        return self._solve(forced_in=[], min_gain=MIN_GAIN)

    def _unpark(self) -> None:
        self._parking.parked = {}  # those back for a re-probe stay so until a solve judges them

    def _solve(self, forced_in: list[str], min_gain: float, trust: bool = False,
               parkable: list[str] | None = None) -> tuple[dict[str, int], list[str], dict[str, float]]:
        """The best split of B over every worker (parked ones included: they are candidates like the
        others, except those brought back for a re-probe), and who is parked. `trust` (a re-solve):
        each worker with a batch, but one re-probed, stays within trust.TRUST times of it, up or down,
        and parks only from its minimum batch, or where the measured round outlasts the others'
        without it (`parkable`, `_outlasting`)."""
        times = self._fits.times(cautious=True)
        lower, upper = self._bounds()
        B = self._config.global_batch
        if not self._exact_sum():  # ASP whose bounds cannot meet B: everyone at the bound B pushes them to
            edge = upper if sum(upper.values()) < B else lower
            return dict(edge), [], {}
        may_park = [k for k in self._workers if k not in forced_in] if self._may_park() else []
        if trust:  # a re-probed worker, just measured where the split puts it, is free to go further
            now = {k: b if k not in forced_in and k not in self._parking.reprobed else 0 for k, b in self.plan().items()}
            lower, upper = trusted_bounds(now, B, lower, upper)
            # parking is a move like any other: only from the minimum batch (or parked already)
            may_park = [k for k in may_park if now[k] <= self._workers[k].min_batch or k in (parkable or ())]
        lower = self._reprobe_bounds(lower, upper, forced_in)
        incumbents = [k for k in may_park if k in self._parking.parked or k in self._parking.reprobed]
        plan, parked, compared = best_plan(times, B, lower, upper, may_park=may_park, overhead=self.overhead_ms,
                                           min_gain=min_gain, prefer=incumbents)
        # a re-probed worker the bounds left below its break-even is parked again, its re-probe put off;
        # where the trust bounds leave the others no room to take its share, they give way
        solved = plan
        plan, below = self._break_even(solved, times, lower, upper, list(self._workers))
        if trust and not self._breaks_even(plan):
            lower, upper = self._bounds()
            plan, below = self._break_even(solved, times, self._reprobe_bounds(lower, upper, forced_in), upper,
                                           list(self._workers))
        return plan, parked + below, compared

    def _keeps_small(self, plan: Mapping[str, int]) -> bool:
        """Whether `plan` keeps a worker beside others at no more than the deadband of B (one that
        `_outlasting` may park once the plan is measured)."""
        active = [b for b in plan.values() if b > 0]
        return len(active) > 1 and min(active) <= self._config.deadband * self._config.global_batch

    def _late_now(self) -> bool:
        """Whether the rounds of the plan in force so far ask to park a worker (`_outlasting`)."""
        measured, plan = self._rounds.measured, self.plan()
        return bool(self._outlasting(plan, {"measured_round_ms": statistics.median(measured), "rounds": len(measured)},
                                     *self._in_force(plan)))

    def _in_force(self, plan: Mapping[str, int]) -> tuple[dict[str, Sequence[float]] | None, dict[str, float] | None]:
        """The plan's times in force (WorkerTimes.in_force's; None: one not measured) and their means."""
        times = self._held.in_force(plan)
        return times, None if times is None else {k: statistics.fmean(ms) for k, ms in times.items()}

    def _outlasting(self, current: Mapping[str, int], previous: Mapping[str, Any],
                    in_force: Mapping[str, Sequence[float]] | None, means: Mapping[str, float] | None) -> list[str]:
        """The workers whose parking the plan in force's measured round (`previous`, RoundLog.closing's)
        asks for (optperf.outlasting: shares of B up to the deadband, the deadband as the margin, c of the
        plan in force), where it was measured over MIN_ERROR_ROUNDS rounds and more, in BSP; `in_force`
        and `means`: the plan's times in force (None: not measured) and their means. The margin is not
        the model's error on the plan in force: that error is the late workers' own, and the round
        without them is priced from the others' fits."""
        measured = previous.get("measured_round_ms")
        if (measured is None or previous.get("rounds", 0) < MIN_ERROR_ROUNDS or not self._may_park()
                or in_force is None or means is None):
            return []
        lower, upper = self._bounds()
        return outlasting(means, current,
                          self._fits.times(cautious=True), self._config.global_batch, lower, upper,
                          measured_round=float(measured), overhead=self.overhead_ms,
                          margin=self._config.deadband, share=self._config.deadband)

    def _install_parking(self, parked: list[str], reprobe: list[str]) -> None:
        """Record who is parked after a solve (parking.py); the re-probed workers are probes until measured."""
        self._parking.install(parked, reprobe)
        self._probing = set(reprobe)

    def _took_back(self) -> None:
        """The re-probed workers, parked again, are no probes to wait for."""
        self._probing.clear()

    # ------------------------------------------------------------------ what a decision reports
    def _describe(self, plan: Mapping[str, int]) -> dict[str, Any]:
        """The fits, c, the parked workers and the predicted round of `plan` (which becomes the plan in force)."""
        return self._described(plan, self._fits.report(plan, self._bounds()[0]), self._fits.times())

    # ------------------------------------------------------------------ resume and checkpoints
    def _keeps_plan_of(self, old: WorkerPlan) -> bool:
        return isinstance(old, ModelPolicy)

    def _adopted(self, old: WorkerPlan) -> None:
        """A model policy's fits carry over; its parking only where this one keeps the worker at 0."""
        if isinstance(old, ModelPolicy):
            state = old._extra_state()
            for k, entry in state["model"]["workers"].items():
                if self._workers[k].batch != 0:
                    entry["parked"] = None
            self._restore_extra(state)

    def _extra_state(self) -> dict[str, Any]:
        return {"model": model_state(self._fits, ModelPart(self._parking, self._probing, self._rounds, self._solved,
                                                           self._confirming, self._since_decision))}

    def _restore_extra(self, state: Mapping[str, Any]) -> None:
        """Load the model's state (checkpoint.py); a state without it (another policy's, or one written
        before this policy existed) leaves the fits empty: the policy probes again."""
        if state.get("model") is None:
            if self.parked():
                raise ValueError(f"workers {self.parked()} have batch 0 but the state has no model part")
            return
        part = read_model_state(state["model"], self.plan(), self._fits)
        self._parking, self._probing, self._rounds = part.parking, part.probing, part.rounds
        self._solved, self._confirming, self._since_decision = part.solved, part.confirming, part.since_decision

