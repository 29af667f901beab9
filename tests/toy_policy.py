"""A batch policy in one file, as a new policy is written (tests/ps/control/test_registry.py registers it
with one line): the first worker by name takes `share` shares of B (a setting of its own, so a
`--toy-share` flag), every other worker one; decisions change nothing."""

from __future__ import annotations

from ps.control.settings import Setting
from ps.control.worker_plan import WorkerPlan


class ToyPolicy(WorkerPlan):
    """`share` shares for the first worker by name, one for each other."""

    name = "toy"
    settings = (Setting("share", float, 3.0, "shares of B the first worker by name takes, one for each other",
                        low=1.0, high=16.0),)

    def _plan_weights(self) -> dict[str, float]:
        first = min(self._workers)
        return {k: self.config.options["share"] if k == first else 1.0 for k in self._workers}
