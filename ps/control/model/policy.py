"""The model policy: Cannikin's OptPerf behind the batch-policy interface (Cannikin §3-4;
docs/policies.md tells the same life with its figures).

Per worker it fits the finish time f_i(b) = q_i·b + s_i (+ exposed communication, time_fit.py) from
the (batch, time) pairs the worker reports, learns the round's overhead c (the server's close-to-
close round time minus the slowest fitted finish of that round, per set of workers in the round),
and splits B in one step by minimising the predicted round max_i f_i(b_i) + c (optperf.py):

1. **Probe.** One batch size cannot separate q from s, so once every worker has `min_samples`
   observations at its first batch the policy asks for a decision at once (`decision_due`) and
   moves each worker to a second batch (Cannikin's Eq. 8, nudged by PROBE_STEP).
2. **Solve.** Once the probes are measured it solves and installs the split, at once.
3. **Hold or re-solve.** A worker off its older fit by the deadband and the noise changed speed:
   its history is rescaled (time_fit.Observations.drift, rescale). A plan measured balanced is
   held. Otherwise the split is re-solved with the fits' uncertainty (time_fit.Finish.cautious) and
   installed if it beats the plan in force by more than MIN_GAIN or the model's error on that plan,
   and, unless a worker drifted, if the decision before found such a gain too; at once when B or
   the workers change (`replan`). The split installed is the one nearest the plan in force within
   half that margin of the optimum (optperf.nearest_plan), each worker moved at most TRUST times.
4. **Park.** In BSP a worker whose fixed cost alone exceeds the round the others reach without it
   is planned at batch 0 where that predicts a shorter round (optperf.best_plan), Σb = B over the
   others; it is re-probed after REPROBE_FIRST decisions, the wait doubling up to REPROBE_MAX. ASP
   never parks: the same fit splits B for equal step times.

Every decision's `report` carries the fits, c, the predicted round of the plan it leaves in force
and the measured median round of the plan before, so prediction error can be read from the log.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ps.control.model.balance import measured_balanced
from ps.control.checks import integer, real
from ps.control.model.optperf import best_plan, nearest_plan
from ps.control.worker_plan import WorkerPlan
from ps.control.model.state import flag, model_part, nonnegative, observations, parking_pair, state_list
from ps.control.performance import FinishTime, FittedRounds
from ps.control.split import clip, fit_to_sum
from ps.control.model.time_fit import Fit, Finish, Observations

PROBE_STEP = 0.3
"""A probe moves a worker's batch by at least this fraction (and 2 samples)."""
MAX_PROBES = 3
"""Probe decisions per worker before its fit is taken as it is (bounds may leave no second batch)."""
WARMUP = 2
"""Each worker's first observations after it joins are not fitted: they hold its first steps'
allocations and caches, not its speed."""
PROBE_SAMPLES = 2
"""A probe or the solve after it waits for this many times `min_samples` observations per worker:
two points one fit extrapolates from want less noise than a decision that only checks a plan."""
MIN_GAIN = 0.03
"""A new split replaces the plan in force only if its predicted round is this much shorter (or by the
model's error on the plan in force, if larger)."""
TRUST = 2
"""A re-solve moves a worker's batch at most this factor up (or to an equal share) or down, and parks
only a worker at its minimum: a fit is surest near the batches it was measured at."""
MIN_ERROR_ROUNDS = 3
"""Rounds of a plan that its prediction error is taken from."""
REPROBE_FIRST = 2
"""Decisions a parked worker waits before its first re-probe."""
REPROBE_MAX = 32
"""The longest wait between re-probes, in decisions."""
OVERHEAD_ROUNDS = 32
"""Rounds whose overhead (round time minus slowest finish) the median of c is taken over."""
MEASURED_ROUNDS = 256


@dataclass
class _Parked:
    """A parked worker: decisions since it was parked, and how many it waits before a re-probe."""

    waited: int
    every: int


class ModelPolicy(WorkerPlan):
    """Fitted per-worker times, a one-step optimal split, probes, and parking."""

    name = "model"
    parks = True
    extra_state_keys = frozenset({"model"})

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._obs: dict[str, Observations] = {}
        self._probes: dict[str, int] = {}  # probe decisions per worker
        self._probing: set[str] = set()  # workers whose current batch is a probe not yet measured
        self._park: dict[str, _Parked] = {}
        self._reprobed: dict[str, int] = {}  # brought back for a re-probe: the wait it had while parked
        self._warmup: dict[str, int] = {}  # observations still to be skipped per worker (WARMUP)
        self._overhead: deque[float] = deque(maxlen=OVERHEAD_ROUNDS)
        self._overhead_of: dict[frozenset[str], deque[float]] = {}  # c per set of workers in the round
        self._round_batches: dict[str, int] = {}  # who pushed what in the open round
        self._measured: list[float] = []  # round times under the plan in force
        self._predicted: float | None = None  # predicted round of the plan in force
        self._solved = False
        self._confirming = False  # the last decision found a re-solve worth it and held to confirm it
        self._since_decision = 0  # observations since the last decision
        self._report: dict[str, Any] = {}

    # ------------------------------------------------------------------ observations
    def _added(self, worker_id: str) -> None:
        self._obs[worker_id] = Observations()
        self._probes[worker_id] = 0
        self._warmup[worker_id] = WARMUP

    def _removed(self, worker_id: str) -> None:
        for table in (self._obs, self._probes, self._park, self._reprobed, self._warmup):
            table.pop(worker_id, None)
        self._probing.discard(worker_id)

    def _record(self, worker_id: str, batch: int, compute_ms: float, exposed_ms: float | None) -> None:
        if self._warmup.get(worker_id, 0) > 0:
            self._warmup[worker_id] -= 1
            return
        self._obs[worker_id].add(batch, compute_ms, exposed_ms)
        self._round_batches[worker_id] = batch
        self._since_decision += 1

    def observe_round(self, round_ms: float) -> None:
        """The round's overhead c is its time past the slowest fitted finish of the batches pushed in
        it: what the server and the wire add, and the expected excess of the slowest of several noisy
        finishes over the slowest expected one (so predictions of whole rounds are not biased low)."""
        ms = real("round_ms", round_ms)
        if ms < 0:
            raise ValueError(f"round_ms must be >= 0, got {ms}")
        finishes = self._finishes()
        if self._round_batches and all(k in finishes for k in self._round_batches):
            c = max(0.0, ms - max(finishes[k].at(b) for k, b in self._round_batches.items()))
            self._overhead.append(c)
            self._overhead_of.setdefault(frozenset(self._round_batches), deque(maxlen=OVERHEAD_ROUNDS)).append(c)
        self._measured.append(ms)
        del self._measured[:-MEASURED_ROUNDS]
        self._round_batches = {}

    # ------------------------------------------------------------------ fits
    def _fit(self, worker_id: str) -> Fit | None:
        return self._obs[worker_id].fit(self._config.min_samples)

    def _identified(self, worker_id: str) -> bool:
        """Whether the worker's intercept is measured (two batch sizes), or cannot be (fixed batch,
        or probed MAX_PROBES times)."""
        w = self._workers[worker_id]
        fit = self._fit(worker_id)
        return (w.min_batch == w.max_batch or self._probes[worker_id] >= MAX_PROBES
                or (fit is not None and fit.batches >= 2))

    def _finishes(self) -> dict[str, Finish]:
        """Every measured worker's fitted finish time."""
        out = {}
        for k in self._workers:
            fit = self._fit(k)
            if fit is not None:
                out[k] = fit.finish
        return out

    @property
    def overhead_ms(self) -> float:
        """c of the plan in force (`overhead_for`)."""
        return self.overhead_for(self.plan())

    def overhead_for(self, plan: Mapping[str, int]) -> float:
        """c for the workers `plan` puts in the round: the median over the recent rounds of that set
        once it has MIN_ERROR_ROUNDS of them, else over every recent round (0 before any, and in
        ASP). A re-probed worker adds a slow, noisy finish whose excess c must not carry over to the
        rounds without it. Kept in memory only: a resumed policy starts from the whole window."""
        own = self._overhead_of.get(frozenset(k for k, b in plan.items() if b > 0), ())
        values = own if len(own) >= MIN_ERROR_ROUNDS else self._overhead
        return statistics.median(values) if values else 0.0

    def _active(self) -> list[str]:
        return [k for k, w in self._workers.items() if w.batch]

    # ------------------------------------------------------------------ decisions
    def decision_due(self) -> bool:
        """A probe or the first solve can be made: every worker in the plan measured at its batch
        (`min_samples` times, and as many rounds since the last decision), and someone still to be
        probed, a probe measured, or no solve yet."""
        active = self._active()
        if not active or any(w.batch is None for w in self._workers.values()):
            return False
        if self._since_decision < self._config.min_samples * len(active) or not self._measured_enough(active):
            return False
        return bool(self._probing) or not self._solved or not all(self._identified(k) for k in active)

    def _measured_enough(self, active: list[str]) -> bool:
        """Every worker in the plan has enough observations at its batch for a decision: `min_samples`,
        PROBE_SAMPLES times that while probing (the probe's point and the one before it are what the
        first solve extrapolates from)."""
        need = self._config.min_samples
        probing = need * PROBE_SAMPLES
        return all(self._workers[k].samples >= (probing if k in self._probing or not self._solved else need)
                   for k in active)

    def _decide(self) -> dict[str, int] | None:
        active = self._active()
        current = self.plan()
        report: dict[str, Any] = {"policy": self.name, **self._closing_measurement()}
        self._since_decision = 0
        for entry in self._park.values():
            entry.waited += 1
        if not self._measured_enough(active):
            self._report = {**report, "phase": "wait", **self._describe(current)}
            return None  # someone is not measured at its batch yet
        drifted = [k for k in active if self._drifted(k)]
        self._probing.clear()
        unknown = [k for k in active if not self._identified(k)]
        if unknown:
            new = self._probe_plan(unknown, current)
            for k in unknown:
                self._probes[k] += 1
            self._probing = {k for k in unknown if new[k] != current[k]}
            self._confirming = False
            self._report = {**report, "phase": "probe", "probe": sorted(self._probing), "drift": drifted,
                            **self._describe(new)}
            return new
        reprobe = [k for k, e in self._park.items() if e.waited >= e.every]
        if self._solved and not reprobe and not self._reprobed and self._balanced(current):
            self._confirming = False
            self._report = {**report, "phase": "hold", "balanced": True, "drift": drifted, **self._describe(current)}
            return None
        # the first solve's fits are new: the error of the plan they replace is not theirs
        min_gain = max(MIN_GAIN, _error(report["previous"]) if self._solved else 0.0)
        new, parked, compared = self._solve(forced_in=reprobe, min_gain=min_gain, trust=self._solved)
        finishes = self._times(cautious=True)
        compare = FittedRounds(finishes)
        gain = (compare.predict(current) - compare.predict(new)) / max(compare.predict(new), 1e-9)
        report["min_gain"] = round(min_gain, 4)
        # a new plan must beat the model's own error on the plan in force, parking included: where the
        # optimum is flat (a fixed cost dominates) noise in the fits must not move B back and forth, nor
        # near-equal workers swap places; the first solve and a re-probe are installed anyway
        if self._solved and not reprobe and not gain > min_gain:
            self._reprobed, self._confirming = {}, False
            self._report = {**report, "phase": "hold", "drift": drifted, **self._describe(current)}
            return None
        # no worker drifted: the gain must be found twice in a row, one decision's is often noise
        if self._solved and not reprobe and not self._reprobed and not drifted and not self._confirming:
            self._confirming = True
            self._report = {**report, "phase": "hold", "confirm": True, "drift": drifted, **self._describe(current)}
            return None
        self._confirming = False
        if self._solved and self._exact_sum():
            lower, upper = self._bounds()
            new = nearest_plan(finishes, new, current, lower, upper, slack=min_gain / 2)
        self._install_parking(parked, reprobe)
        self._solved = True
        self._report = {**report, "phase": "reprobe" if reprobe else "solve", "drift": drifted,
                        **({"reprobe": reprobe} if reprobe else {}), **({"park": compared} if compared else {}),
                        **self._describe(new)}
        return new

    def replan(self) -> dict[str, int]:
        """Split B over the current workers: solved from the fits when every worker has one (parking
        included), else by measured throughputs where known (`dynamic_start` for the others)."""
        if not self._workers:
            return {}
        report = {"policy": self.name, **self._closing_measurement()}
        self._confirming = False
        if all(self._fit(k) is not None for k in self._workers) and all(self._identified(k) for k in self._workers):
            new, parked, compared = self._solve(forced_in=[], min_gain=MIN_GAIN)
            self._install_parking(parked, [])
            self._apply(new)
            self._report = {**report, "phase": "replan", **({"park": compared} if compared else {}),
                            **self._describe(new)}
            return self.plan()
        self._park.clear()
        self._apply(self._split(self._measured_weights()))
        self._report = {**report, "phase": "replan", **self._describe(self.plan())}
        return self.plan()

    def report(self) -> dict[str, Any]:
        return dict(self._report)

    def predicted_round_ms(self, total: int) -> float | None:
        """The fits' round at the best split of `total` (a default bound follows it) plus c
        (performance.FittedRounds); None until identified."""
        active, (lower, upper) = self._active(), self._bounds()
        if not active or not all(self._fit(k) is not None and self._identified(k) for k in active):
            return None
        upper = {k: total if self._config.max_batch is None else hi for k, hi in upper.items()}
        times = self._times()
        return FittedRounds({k: times[k] for k in active}, self.overhead_ms, lower, upper).predict_global(total)

    def _times(self, cautious: bool = False) -> dict[str, FinishTime]:
        """Each worker's finish time as a function of its batch (a worker not measured yet: the
        slowest measured per-sample time, so it is never predicted fast); `cautious`: plus the fit's
        uncertainty where a plan extrapolates (time_fit.Finish.cautious), for choosing between plans."""
        finishes = self._finishes()
        per_sample = max((f.at(1) for f in finishes.values()), default=1.0)
        return {k: ((finishes[k].cautious if cautious else finishes[k].at) if k in finishes
                    else (lambda b: per_sample * b)) for k in self._workers}

    def _solve(self, forced_in: list[str], min_gain: float,
               trust: bool = False) -> tuple[dict[str, int], list[str], dict[str, float]]:
        """The best split of B over every worker (parked ones included: they are candidates like the
        others, except those brought back for a re-probe), and who is parked. `trust` (a re-solve):
        each worker with a batch, but one re-probed, stays within TRUST times of it, up or down."""
        times = self._times(cautious=True)
        lower, upper = self._bounds()
        B = self._config.global_batch
        if not self._exact_sum():  # ASP whose bounds cannot meet B: everyone at the bound B pushes them to
            edge = upper if sum(upper.values()) < B else lower
            return dict(edge), [], {}
        may_park = [k for k in self._workers if k not in forced_in] if self._may_park() else []
        if trust:  # a re-probed worker, just measured where the split puts it, is free to go further
            now = {k: b if k not in forced_in and k not in self._reprobed else 0 for k, b in self.plan().items()}
            lo = {k: max(lo, math.ceil(now[k] / TRUST)) if now[k] else lo for k, lo in lower.items()}
            equal = math.ceil(B / len(self._workers))  # a small worker may always grow to an equal share
            hi = {k: min(hi, max(TRUST * now[k], equal)) if now[k] else hi for k, hi in upper.items()}
            if sum(lo.values()) <= B <= sum(hi.values()):  # else (parked workers at their minimum) as it is
                lower, upper = lo, hi
            # parking is a move like any other: only from the minimum batch (or parked already)
            may_park = [k for k in may_park if now[k] <= self._workers[k].min_batch]
        incumbents = [k for k in may_park if k in self._park or k in self._reprobed]
        return best_plan(times, B, lower, upper, may_park=may_park, overhead=self.overhead_ms, min_gain=min_gain,
                         prefer=incumbents)

    def _install_parking(self, parked: list[str], reprobe: list[str]) -> None:
        """Record who is parked after a solve: a worker parked again right after its re-probe waits
        twice as long as before (up to REPROBE_MAX), a newly parked one REPROBE_FIRST decisions, one
        still parked keeps counting; the re-probed workers are probes until measured."""
        entries = {}
        for k in parked:
            if k in self._park:
                entries[k] = self._park[k]
            elif k in self._reprobed:
                entries[k] = _Parked(0, min(REPROBE_MAX, 2 * self._reprobed[k]))
            else:
                entries[k] = _Parked(0, REPROBE_FIRST)
        self._reprobed = {k: self._park[k].every for k in reprobe if k in self._park}
        self._park = entries
        self._probing = set(reprobe)

    def _probe_plan(self, unknown: list[str], current: Mapping[str, int]) -> dict[str, int]:
        """A plan that moves each worker of `unknown` to a second batch size (Cannikin Eq. 8: shares
        inversely proportional to the measured time per sample, moved at least PROBE_STEP)."""
        lower, upper = self._bounds()
        fits = self._finishes()
        active = [k for k, b in current.items() if b > 0]
        speed = {k: current[k] / fits[k].at(current[k]) if k in fits and fits[k].at(current[k]) > 0 else 1.0
                 for k in active}
        total = self._config.global_batch if self._exact_sum() else sum(current[k] for k in active)
        mass = math.fsum(speed.values())
        target = {k: speed[k] / mass * total for k in active}
        mean = total / len(active)
        for k in unknown:
            b, step = current[k], max(2.0, PROBE_STEP * current[k])
            if abs(target[k] - b) < step:
                down = target[k] < b or (target[k] == b and b > mean)
                target[k] = b - step if down and b - step >= lower[k] else b + step
            target[k] = min(max(target[k], lower[k]), upper[k])
        target = {k: max(v, 1e-6) for k, v in target.items()}
        if not self._exact_sum():
            return {**current, **{k: clip(round(target[k]), lower[k], upper[k]) for k in active}}
        inside = {k: current[k] for k in current if k not in active}
        lo = {k: lower[k] for k in active}
        hi = {k: upper[k] for k in active}
        if not sum(lo.values()) <= total <= sum(hi.values()):
            return dict(current)
        return {**inside, **fit_to_sum(target, total, lo, hi, self.round_for_time)}

    def _balanced(self, plan: Mapping[str, int]) -> bool:
        """Whether the plan in force is measured balanced (balance.measured_balanced), on each planned
        worker's finish times since it got its batch (at least `min_samples`)."""
        times = {}
        for k, b in plan.items():
            if b > 0:
                recent = self._obs[k].recent(b, max(self._config.min_samples, self._obs[k].run(b)))
                if recent is None:
                    return False
                times[k] = recent
        lower, upper = self._bounds()
        return measured_balanced(times, plan, lower, upper, self._config.deadband)

    def _drifted(self, worker_id: str) -> bool:
        """Whether the worker's speed changed during its current run at its batch (time_fit.
        Observations.drift); if so its history is rescaled to the new speed."""
        b, n = self._workers[worker_id].batch, self._config.min_samples
        ratio = self._obs[worker_id].drift(b, n, self._config.deadband) if b else None
        if ratio is None:
            return False
        self._obs[worker_id].rescale(ratio, keep=n)
        return True

    # ------------------------------------------------------------------ what a decision reports
    def _closing_measurement(self) -> dict[str, Any]:
        """The plan in force until now: its prediction and its measured median round; then the
        measurements start again for the next plan."""
        measured = statistics.median(self._measured) if self._measured else None
        out = {"previous": {"predicted_round_ms": _round(self._predicted), "measured_round_ms": _round(measured),
                            "rounds": len(self._measured)}}
        self._measured = []
        return out

    def _describe(self, plan: Mapping[str, int]) -> dict[str, Any]:
        """The fits, c, the parked workers and the predicted round of `plan` (which becomes the plan in force)."""
        finishes = self._finishes()
        fits = {}
        for k, f in finishes.items():
            fit = self._fit(k)
            b = plan.get(k) or self._workers[k].min_batch
            entry: dict[str, Any] = {"q": round(f.line.q, 6), "s": round(f.line.s, 4),
                                     "batches": fit.batches if fit else 0, "bound": f.bound(b)}
            if f.exposed is not None:
                entry["exposed_ms"] = round(f.exposed_at(b), 4)
            fits[k] = entry
        known = all(k in finishes for k, b in plan.items() if b > 0)
        c = self.overhead_for(plan) if self._config.keep_global_sum else 0.0  # ASP: a step, no round
        predicted = FittedRounds(self._times(), c).predict(plan) if known and plan else None
        self._predicted = predicted
        return {"fits": fits, "overhead_ms": _round(c), "predicted_round_ms": _round(predicted),
                "parked": sorted(k for k, b in plan.items() if b == 0)}

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
        return {"model": {
            "workers": {
                k: {"obs": [list(item) for item in self._obs[k].items], "seq": self._obs[k].seq, "probes": self._probes[k],
                    "parked": None if k not in self._park else [self._park[k].waited, self._park[k].every]}
                for k in self._workers
            },
            "probing": sorted(self._probing), "reprobed": dict(self._reprobed),
            "overhead": list(self._overhead), "measured": list(self._measured), "predicted": self._predicted,
            "solved": self._solved, "confirming": self._confirming, "since_decision": self._since_decision,
        }}

    def _restore_extra(self, state: Mapping[str, Any]) -> None:
        """Load the model's state; a state without it (another policy's, or one written before this
        policy existed) leaves the fits empty: the policy probes again."""
        raw = state.get("model")
        if raw is None:
            if self.parked():
                raise ValueError(f"workers {self.parked()} have batch 0 but the state has no model part")
            return
        raw = model_part(raw)
        workers = raw["workers"]
        if not isinstance(workers, Mapping) or set(workers) != set(self._workers):
            raise ValueError("model policy state must have one entry per worker of the policy")
        for k, entry in workers.items():
            if not isinstance(entry, Mapping) or set(entry) != {"obs", "seq", "probes", "parked"}:
                raise ValueError(f"model state of {k!r} must have the keys obs, seq, probes, parked")
            self._obs[k] = Observations(observations(k, entry["obs"]), integer(f"seq of {k!r}", entry["seq"], minimum=0))
            self._probes[k] = integer(f"probes of {k!r}", entry["probes"], minimum=0)
            if entry["parked"] is not None:
                waited, every = parking_pair(k, entry["parked"])
                if self._workers[k].batch != 0:
                    raise ValueError(f"worker {k!r} is parked in the model state but has batch {self._workers[k].batch}")
                self._park[k] = _Parked(waited, every)
            elif self._workers[k].batch == 0:
                raise ValueError(f"worker {k!r} has batch 0 but is not parked in the model state")
        probing = raw["probing"]
        if not isinstance(probing, list) or not set(probing) <= set(self._workers):
            raise ValueError("model state 'probing' must list workers of the policy")
        self._probing = set(probing)
        reprobed = raw["reprobed"]
        if not isinstance(reprobed, Mapping) or not set(reprobed) <= set(self._workers):
            raise ValueError("model state 'reprobed' must map workers of the policy to their wait")
        self._reprobed = {k: integer(f"re-probe wait of {k!r}", v, minimum=1) for k, v in reprobed.items()}
        self._overhead = deque((nonnegative("overhead", v) for v in state_list("overhead", raw["overhead"])),
                               maxlen=OVERHEAD_ROUNDS)
        self._measured = [nonnegative("measured", v) for v in state_list("measured", raw["measured"])][-MEASURED_ROUNDS:]
        self._predicted = None if raw["predicted"] is None else nonnegative("predicted", raw["predicted"])
        self._solved = flag("solved", raw["solved"])
        self._confirming = flag("confirming", raw.get("confirming", False))
        self._since_decision = integer("since_decision", raw["since_decision"], minimum=0)


def _error(previous: Mapping[str, Any]) -> float:
    """The relative error of the plan in force's predicted round against its measured median (0 when
    either is missing, or fewer than `MIN_ERROR_ROUNDS` rounds measured it)."""
    predicted, measured = previous.get("predicted_round_ms"), previous.get("measured_round_ms")
    if not predicted or not measured or previous.get("rounds", 0) < MIN_ERROR_ROUNDS:
        return 0.0
    error: float = abs(predicted - measured) / measured
    return error


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)
