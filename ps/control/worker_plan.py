"""What every batch policy shares: the workers and the plan (roster.py: each worker's declared cores
and batch bounds, its current batch, the smoothed time and throughput measured at it, and the
exact-sum split of the global batch B within the bounds, shares.py), one decision at a time, and the
policy's state as plain data for checkpoints (plan_state.py) or a resume under new settings.

`WorkerPlan` is the base of every policy (uniform.py, static.py, dynamic.py, model/policy.py,
auto/policy.py). A policy says how B is split when the workers change (`_plan_weights`, or `replan`
itself) and what one decision does (`_decide`); the WorkerPlan does the bookkeeping, the bounds and
the sum rule (OmniLearn Eq. 8) and validates every input before it changes anything. Pure: no I/O,
no clock, no transport.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from ps.control.checks import integer, real
from ps.control.config import PolicyConfig
from ps.control.plan_state import check_planned_sum, plan_state, read_config, restore_worker, worker_entries
from ps.control.roster import WorkerRoster
from ps.control.settings import Setting
from ps.control.worker_record import own_bounds


class WorkerPlan(WorkerRoster):
    """The base of every batch policy: the roster's workers and plan (roster.py), the decisions asked
    of the policy, and its state for checkpoints and resumes.

    Usage: `add_worker`/`remove_worker` on membership changes, then `replan`; `observe` every push;
    `adjust` at the chosen granularity (e.g. each epoch). Every plan sums exactly to `global_batch`;
    without `keep_global_sum` (ASP) only where the bounds allow it, and B out of their reach is no error.
    """

    name: ClassVar[str] = ""
    """The `--controller` name of the policy (the registry's key)."""
    parks: ClassVar[bool] = False
    """Whether the policy may plan a batch of 0 (a parked worker)."""
    extra_state_keys: ClassVar[frozenset[str]] = frozenset()
    """Top-level state keys of the policy's own, beside the WorkerPlan's."""
    settings: ClassVar[tuple[Setting, ...]] = ()
    """The policy's own settings (its flags `--<name>-<setting>`); their values are `config.options`."""

    def __init__(self, config: PolicyConfig) -> None:
        if not isinstance(config, PolicyConfig):
            raise ValueError(f"config must be a PolicyConfig, got {type(config).__name__}")
        if config.policy != self.name:
            raise ValueError(f"a {self.name} policy cannot run under policy {config.policy!r}; build it from the registry")
        if config.micro_batch != 1:
            raise ValueError("a micro-batched plan is ps.control.micro.MicroBatched's; build it from the registry")
        super().__init__(config)
        self._adjustments = 0

    # ------------------------------------------------------------------ the interface
    @property
    def adjustments(self) -> int:
        """Number of `adjust` calls that changed the plan."""
        return self._adjustments

    def replan(self) -> dict[str, int]:
        """Split B over the current workers by the policy's `_plan_weights` and return the plan.

        The split is fitted to the bounds with an exact sum (ASP whose bounds cannot meet B: rounded
        and clipped). Raises ValueError, changing nothing, if the workers' max_batch cannot reach B
        under `keep_global_sum`.
        """
        if not self._workers:
            return {}
        self._apply(self._split(self._plan_weights()))
        return self.plan()

    def observe_round(self, round_ms: float, push_ms: float = 0.0) -> None:
        """A BSP round closed `round_ms` after the one before (the server's clock, close to close);
        `push_ms`: the server's CPU a push in it (0: not measured)."""
        real("round_ms", round_ms)
        real("push_ms", push_ms)

    def decision_due(self) -> bool:
        """Whether the policy wants a decision now, before the server's schedule (a probe measured)."""
        return False

    def adjust(self) -> dict[str, int]:
        """Make one decision (`_decide`) and return the (possibly unchanged) plan.

        Raises ValueError if a worker has no batch yet (call `replan` after `add_worker`).
        """
        unplanned = [k for k, w in self._workers.items() if w.batch is None]
        if unplanned:
            raise ValueError(f"workers {unplanned} have no batch yet; call replan() after add_worker()")
        if not self._workers:
            return self.plan()
        new_plan = self._decide()
        if new_plan is not None and self._apply(new_plan):
            self._adjustments += 1
        return self.plan()

    def report(self) -> dict[str, Any]:
        """What the last decision was based on, for its `adjust` record (a policy's own fields)."""
        return {}

    def predicted_round_ms(self, total: int) -> float | None:
        """The policy's predicted round time (ms) at a global batch of `total`; None: it has no model
        (--adaptive-batch then predicts from the measured times)."""
        return None

    def predicted_plan(self, total: int) -> dict[str, int] | None:
        """The plan that `predicted_round_ms(total)` prices; None: it has no model."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """Full state as plain JSON-serialisable data (for checkpoints; plan_state.py)."""
        return {**plan_state(self._config, self._workers, self._adjustments), **self._extra_state()}

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> WorkerPlan:
        """Rebuild a policy from `state_dict` output; raises ValueError on malformed or inconsistent state."""
        config = read_config(state, cls.extra_state_keys)
        ctl = cls(config)
        for entry in worker_entries(state):
            wid = entry["id"]
            ctl.add_worker(wid, entry["cores"], entry["min_batch"], entry["max_batch"])
            restore_worker(wid, ctl._workers[wid], entry, config, ctl._may_park())
        check_planned_sum(ctl.plan(), config)
        ctl._adjustments = integer("adjustments", state["adjustments"], minimum=0)
        ctl._restore_extra(state)
        return ctl

    def adopt(self, old: WorkerPlan) -> None:
        """Take `old`'s workers and measurements into this fresh policy (a resume under new settings).

        Each worker keeps its cores and measurements (batch, smoothed time, throughput), and the
        adjustment count carries over; a bound equal to the old config's default (so taken from it)
        becomes this config's, one given per worker stays. The plan is kept only where it still is one
        of this policy's (`_keeps_plan_of`, and every batch within its new bounds); otherwise B is
        re-split by `replan`. Raises ValueError if the workers' bounds cannot meet the global batch.
        """
        if self._workers:
            raise ValueError("adopt() takes the workers into a policy that has none yet")
        before, config = old.config, self._config
        self._adjustments = old.adjustments
        replan = config != before and not (
            (before.global_batch, before.keep_global_sum) == (config.global_batch, config.keep_global_sum)
            and self._keeps_plan_of(old))
        for wid, w in old._workers.items():
            self.add_worker(wid, w.cores, *own_bounds(w, before))
            new = self._workers[wid]
            new.throughput = w.throughput
            if w.batch is not None and (new.min_batch <= w.batch <= new.max_batch or (w.batch == 0 and self._may_park())):
                new.batch, new.ewma_ms, new.samples = w.batch, w.ewma_ms, w.samples
            elif w.batch is not None:
                replan = True
        self._adopted(old)
        if replan:
            self.replan()

    # ------------------------------------------------------------------ what a policy defines
    def _plan_weights(self) -> dict[str, float]:
        """Relative share of B per worker for `replan`."""
        raise NotImplementedError

    def _decide(self) -> dict[str, int] | None:
        """The plan after one decision (None: unchanged)."""
        return None

    def _keeps_plan_of(self, old: WorkerPlan) -> bool:
        """Whether `old`'s plan (same B and sum rule) stays a plan of this policy after a resume."""
        return False

    def _may_park(self) -> bool:
        """Whether this policy, under its settings, may plan a batch of 0."""
        return self.parks and self._config.park and self._config.keep_global_sum

    def _adopted(self, old: WorkerPlan) -> None:
        """Hook: `adopt` took `old`'s workers (a policy of the same kind may take its own state too)."""

    def _extra_state(self) -> dict[str, Any]:
        """The policy's own state keys for `state_dict`."""
        return {}

    def _restore_extra(self, state: Mapping[str, Any]) -> None:
        """Load and validate the policy's own state keys (after the WorkerPlan's)."""
