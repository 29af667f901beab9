"""A lone worker's sub-batch for the server's gradient noise scale (`--adaptive-batch`).

The noise scale needs the squared norms of mean gradients at two batch sizes. Two workers in a round
give them; one training alone (its batch the round's global batch) gives them where it measures
|g_s|² over the first part of its batch besides the whole batch's, which the server computes from the
push. The built-in loop does so over the first half (worker/accumulate.py: backward_with_sub_norm)
and the push carries it (PushHeader.sub_batch, sub_sq_norm)."""

from __future__ import annotations

import math

from common.job.spec import JobSpec
from common.transport.messages import StepHeader


class SubBatch:
    """The drawn batch's part to measure (`size`, 0: none) and what was measured, for the step's push."""

    def __init__(self) -> None:
        self.size = 0
        self._measured: tuple[int, float] = (0, 0.0)

    def draw(self, spec: JobSpec, plan: StepHeader, drawn: int, ps_path: bool) -> None:
        """A batch of `drawn` samples under `plan`: its first half is wanted where the job measures
        gradient norms and this worker trains alone on the PS path (its batch the round's global batch;
        two samples or more drawn, fewer than planned at an epoch's last slice)."""
        alone = spec.gradient_norms and ps_path and drawn >= 2 and plan.batch_size == plan.global_batch
        self.size = drawn // 2 if alone else 0
        self._measured = (0, 0.0)

    def note(self, size: int, sq_norm: float) -> None:
        """|g_s|² over the first `size` samples of the step's batch (the size asked for)."""
        if self.size == 0 or size != self.size:
            raise ValueError(f"this step's sub-batch is {self.size} samples (0: none asked for), got {size}")
        if not (math.isfinite(sq_norm) and sq_norm >= 0):
            raise ValueError(f"a sub-batch's squared gradient norm must be finite and >= 0, got {sq_norm}")
        self._measured = (size, float(sq_norm))

    @property
    def measured(self) -> tuple[int, float]:
        """The push header's sub_batch and sub_sq_norm: (0, 0.0) where nothing was measured."""
        return self._measured
