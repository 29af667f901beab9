"""How a job ended, in the words of its `end` record and of ps-server's exit status: finished (every
epoch trained), stopped (SIGTERM or Ctrl-C: checkpointed, resumable) or ended early (any other
reason: the workers left cannot make up --global-batch, a shard failed, ...). A script, Slurm or
`ps-cluster run` tells an early end from a finished job by the exit status alone."""

from __future__ import annotations

FINISHED = "finished"
"""The reason of a job that trained every epoch it was asked for."""
STOPPING = "stopping"
"""The reason of a job stopped by SIGTERM or SIGINT (it checkpoints; --resume continues it)."""
ENDED_EARLY = 3
"""ps-server's exit status for a job that ended early (0: finished or stopped, 1: failed at run time,
2: bad input, before anything started)."""


def ended_early(reason: str) -> bool:
    """Whether a job that ended for `reason` stopped short of its epochs without being asked to."""
    return reason not in (FINISHED, STOPPING)


def exit_status(reason: str) -> int:
    """ps-server's exit status for a job that ended for `reason`."""
    return ENDED_EARLY if ended_early(reason) else 0
