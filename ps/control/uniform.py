"""The uniform policy: every worker gets an equal share of B (within its bounds) and keeps it.

The baseline against which the others are measured, and the right choice on a homogeneous cluster,
where measuring and moving batches can only add noise."""

from __future__ import annotations

from ps.control.worker_plan import WorkerPlan


class UniformPolicy(WorkerPlan):
    """Equal split; decisions change nothing."""

    name = "uniform"

    def _plan_weights(self) -> dict[str, float]:
        return {k: 1.0 for k in self._workers}
