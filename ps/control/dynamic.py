"""The dynamic policy: OmniLearn's proportional control (Eq. 6-8).

Each decision moves a worker whose smoothed time is off the mean towards the batch it would finish
in the mean time at its measured throughput (Eq. 6), only outside the deadband (Eq. 7), and fits the
movers to an exact global batch within their bounds (Eq. 8 by water-filling). It assumes time
proportional to batch, so with a large fixed per-step cost it under-corrects and needs several
decisions (the model policy fits the cost instead). The law is in proportional.py."""

from __future__ import annotations

import math
from collections.abc import Mapping

from ps.control.proportional import outside_deadband, proportional_targets, total_preserving
from ps.control.worker_plan import WorkerPlan
from ps.control.split import clip, fit_to_sum, round_half_up, round_ms, round_to_sum, water_fill


class DynamicPolicy(WorkerPlan):
    """Deadband proportional control from the smoothed times."""

    name = "dynamic"

    def _plan_weights(self) -> dict[str, float]:
        """The measured throughputs where known (a worker without one is estimated by `dynamic_start`
        relative to the measured ones), else `dynamic_start`."""
        return self._measured_weights()

    def _keeps_plan_of(self, old: WorkerPlan) -> bool:
        return isinstance(old, DynamicPolicy)

    def _decide(self) -> dict[str, int]:
        """Eq. 6 targets from the smoothed times of the measured workers (those with `min_samples`
        observations at their current batch; the others keep their batch and stay out of t_bar);
        nothing moves unless some worker is outside the Eq. 7 deadband.

        ASP whose bounds cannot meet B: the movers' targets are rounded and clipped to the bounds.
        Otherwise (BSP, and ASP within its bounds) the movers are fitted to what the held workers
        leave of B; if that cannot bring every mover within the deadband of its target (the movers
        all want to move the same way, a bound binds, or the plan no longer sums to B after a
        removal), all measured workers are fitted to what the unmeasured ones leave of B instead
        (everyone, if bounds forbid that), so the sum rule cannot freeze an imbalance. Current
        batches that already are a rounding of that fit are kept.
        """
        cfg = self._config
        current = {k: w.batch for k, w in self._workers.items() if w.batch is not None}
        times = {k: w.ewma_ms for k, w in self._workers.items()
                 if w.ewma_ms is not None and w.ewma_ms > 0 and w.samples >= cfg.min_samples}
        targets = proportional_targets({k: current[k] for k in times}, times)
        targets = {k: v for k, v in targets.items() if math.isfinite(v)}
        if not cfg.keep_global_sum:
            targets = total_preserving(targets, current)
        whole = not self.round_for_time  # micro-batches round for the round's time, not to the nearest
        movers = [k for k, t in targets.items() if outside_deadband(current[k], t, cfg.deadband, whole=whole)]
        moving = set(movers)  # a list would be searched once a worker: n² at thousands of workers
        if not self._exact_sum():
            lower, upper = self._bounds()
            moved = {k: clip(round_half_up(targets[k]), lower[k], upper[k]) for k in movers}
            return {**current, **moved}
        held_sum = sum(b for k, b in current.items() if k not in moving)
        fitted = self._fit_subset({k: targets[k] for k in movers}, cfg.global_batch - held_sum, current)
        if fitted is not None and not any(outside_deadband(fitted[k], targets[k], cfg.deadband, whole=whole)
                                          for k in movers):
            return {**current, **fitted}
        if not movers and held_sum == cfg.global_batch:
            return current
        unmeasured_sum = sum(b for k, b in current.items() if k not in targets)
        fitted = self._fit_subset(targets, cfg.global_batch - unmeasured_sum, current)
        if fitted is not None:
            return {**current, **fitted}
        self._check_reachable()
        lower, upper = self._bounds()
        wanted = {k: targets.get(k, float(b)) for k, b in current.items()}
        return fit_to_sum(wanted, cfg.global_batch, lower, upper, self.round_for_time)

    def _fit_subset(
        self, targets: Mapping[str, float], total: int, current: Mapping[str, int]
    ) -> dict[str, int] | None:
        """`fit_to_sum` over the workers in `targets`; None if there are none or their bounds cannot meet `total`.

        Sticky rounding: if the `current` batches already are a rounding of the real-valued fit (each
        less than one unit from it, same sum), they are kept. Otherwise float noise in near-tied
        remainders could pass the odd sample back and forth between equally fast workers forever.
        With `round_for_time` (a unit is a micro-batch of many samples) they are kept only while
        their round at the targets' speeds is within the deadband of the new rounding's: a slow
        worker kept at 3 micro-batches of a 2.5 share makes every round a fifth longer.
        """
        if not targets:
            return None
        lower = {k: self._workers[k].min_batch for k in targets}
        upper = {k: self._workers[k].max_batch for k in targets}
        if not sum(lower.values()) <= total <= sum(upper.values()):
            return None
        exact, lo, hi = water_fill(targets, total, lower, upper)
        kept = {k: current[k] for k in targets}
        fresh = round_to_sum(exact, total, lo, hi, speeds=targets if self.round_for_time else None)
        if sum(kept.values()) == total and all(abs(b - exact[k]) < 1.0 for k, b in kept.items()):
            if not self.round_for_time or round_ms(kept, targets) <= round_ms(fresh, targets) * (1 + self._config.deadband):
                return kept
        return fresh
