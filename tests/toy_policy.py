"""A batch policy in one file, as a new policy is written (tests/ps/control/test_registry.py registers it
with one line): the first worker by name takes three shares of B, every other worker one; decisions
change nothing."""

from __future__ import annotations

from ps.control.worker_plan import WorkerPlan


class ToyPolicy(WorkerPlan):
    """Three shares for the first worker by name, one for each other."""

    name = "toy"

    def _plan_weights(self) -> dict[str, float]:
        first = min(self._workers)
        return {k: 3.0 if k == first else 1.0 for k in self._workers}
