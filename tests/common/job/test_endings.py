"""How a job's end reason maps to ps-server's exit status (common/job/endings.py)."""

from __future__ import annotations

import pytest

from common.job.endings import ENDED_EARLY, FINISHED, STOPPING, ended_early, exit_status


@pytest.mark.parametrize("reason", [FINISHED, STOPPING])
def test_a_finished_or_stopped_job_exits_0(reason: str) -> None:
    assert not ended_early(reason) and exit_status(reason) == 0


@pytest.mark.parametrize("reason", [
    "the workers left cannot split --global-batch (the workers' max_batch sum to 64 < global_batch 128)",
    "stopping: shard 1 at 127.0.0.1:5 failed",
    "stopping: every worker holding the fast path's parameters left before one sent them",
])
def test_a_job_that_ended_early_exits_non_zero(reason: str) -> None:
    """Before: ps-server exited 0 after such an end, as after a finished job, so a script or Slurm
    counted it a success."""
    assert ended_early(reason) and exit_status(reason) == ENDED_EARLY != 0
