"""The static policy (Eq. 4a): b_k = c_k / Σ c_j · B from the cores each worker declares at Join, and
no decision changes it.

For clusters whose speeds are known in advance and proportional to the declared resources; it
measures nothing, so a noisy neighbour or a fixed per-step cost is invisible to it."""

from __future__ import annotations

from ps.control.worker_plan import WorkerPlan


class StaticPolicy(WorkerPlan):
    """Split by declared cores; decisions change nothing."""

    name = "static"

    def _plan_weights(self) -> dict[str, float]:
        return {k: w.cores for k, w in self._workers.items()}
