"""Which checkpoint a `ps-server --resume` continues from, and what a checkpoint write that fails tells.

The newest checkpoint that verifies (ps.checkpoint) and loads: one that verifies but lacks what this
server reads is skipped like a corrupt one, with a warning naming it, for the next older."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from common.job.spec import JobSpec
from ps.ops.metrics import MetricsLog
from ps.rounds.checkpoint_state import resume_changes


class JobComplete(Exception):
    """--resume of a job whose checkpoint is at its last epoch: there is nothing to train."""


NOT_LOADABLE = (KeyError, TypeError, IndexError, AttributeError, RuntimeError)
"""What a checkpoint that verifies but lacks what this server reads raises while it is loaded."""


def warn(message: str) -> None:
    print(f"ps-server: warning: {message}", file=sys.stderr, flush=True)


def next_loadable(candidates: Iterator[tuple[Path, dict[str, Any]]], spec: JobSpec,
                  directory: Path) -> tuple[Path, dict[str, Any], dict[str, tuple[Any, Any]]]:
    """The next checkpoint (newest first) whose job matches `spec` and reads: (path, state, its job changes).
    ValueError when none is left; JobComplete when it is at the job's last epoch."""
    for path, state in candidates:
        try:
            changes = resume_changes(state, spec)
            epoch = int(state["epoch"])
        except NOT_LOADABLE as exc:
            warn(f"skipping checkpoint {path.name}: it verifies but cannot be loaded ({type(exc).__name__}: {exc})")
            continue
        if epoch >= spec.epochs:
            raise JobComplete(
                f"the job in {directory} is complete ({path.name}: epoch {epoch} of {spec.epochs}); "
                f"nothing to train: resume with --epochs above {epoch} to extend it"
            )
        return path, state, changes
    raise ValueError(f"--resume {directory}: no valid checkpoint there")


def checkpoint_failed(metrics: MetricsLog) -> Callable[[int, str], None]:
    """The Checkpointer's report of a write that failed: a warning and a `checkpoint_failed` record."""
    def report(step: int, cause: str) -> None:
        warn(f"checkpoint at step {step} not written: {cause}")
        metrics.write("checkpoint_failed", step=step, error=cause)
    return report
