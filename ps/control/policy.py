"""The batch policy as the coordinator sees it: told who joined and left and what each push and each
round took, asked for the plan (each worker's batch, summing to the global batch B in BSP; 0 for a
parked worker), asked to decide at the granularity the server chooses or when the policy says a
decision is due, asked what its last decision was based on (for the metrics log), and saved in
checkpoints. Every policy (ps/control/roster.py's subclasses, built by ps/control/registry.py) is
one; the coordinator (ps/rounds) knows policies only through this interface."""

from __future__ import annotations

from typing import Any, Protocol

from ps.control.config import ControllerConfig


class BatchPolicy(Protocol):
    """What ps/rounds calls on a batch policy."""

    @property
    def config(self) -> ControllerConfig:
        """The settings (their policy name is what Status and the summary report)."""

    @property
    def adjustments(self) -> int:
        """How many decisions changed the plan."""

    def workers(self) -> list[str]:
        """The workers in the plan, by name."""

    def can_add(self, count: int = 1) -> bool:
        """Whether `count` more workers would still each get their minimum batch."""

    def add_worker(self, worker_id: str, cores: float = 1.0, min_batch: int | None = None,
                   max_batch: int | None = None) -> None:
        """A worker joins (its share of B comes at the next `replan`)."""

    def remove_worker(self, worker_id: str) -> None:
        """A worker left or was evicted."""

    def replan(self) -> dict[str, int]:
        """Split B over the current workers; the plan."""

    def plan(self) -> dict[str, int]:
        """Each worker's batch (0: parked, it skips rounds)."""

    def parked(self) -> list[str]:
        """The workers planned at batch 0."""

    def observe(self, worker_id: str, batch: int, compute_ms: float, exposed_ms: float = 0.0) -> None:
        """What a push of `batch` samples took: the time the policy balances, and `exposed_ms`, the
        communication the worker waited for between its last backward and this forward (ms; 0 when
        not measured, as on ASP and the --allreduce fast path)."""

    def observe_round(self, round_ms: float) -> None:
        """A BSP round closed, `round_ms` after the previous one (the server's clock)."""

    def smoothed_ms(self) -> dict[str, float | None]:
        """Each worker's smoothed time at its current batch (None: not measured yet)."""

    def decision_due(self) -> bool:
        """Whether the policy wants a decision now, ahead of the server's schedule."""

    def adjust(self) -> dict[str, int]:
        """One decision; the (possibly unchanged) plan."""

    def report(self) -> dict[str, Any]:
        """What the last decision or replan was based on: fields for its `adjust` record."""

    def state_dict(self) -> dict[str, Any]:
        """The whole state, as plain data, for a checkpoint."""
