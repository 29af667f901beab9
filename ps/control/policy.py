"""The batch policy as the coordinator sees it: told who joined and left and what each push took, asked
for the plan (each worker's batch, summing to the global batch B in BSP), asked to decide at the
granularity the server chooses, and saved in checkpoints. BatchController (controller.py) is one;
the coordinator (ps/rounds) knows policies only through this interface."""

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
        """Each worker's batch."""

    def observe(self, worker_id: str, batch: int, compute_ms: float) -> None:
        """What a push of `batch` samples took."""

    def smoothed_ms(self) -> dict[str, float | None]:
        """Each worker's smoothed time at its current batch (None: not measured yet)."""

    def adjust(self) -> dict[str, int]:
        """One decision; the (possibly unchanged) plan."""

    def state_dict(self) -> dict[str, Any]:
        """The whole state, as plain data, for a checkpoint."""

    def with_config(self, config: ControllerConfig) -> BatchPolicy:
        """The same workers and measurements under `config` (a resume with other settings)."""

