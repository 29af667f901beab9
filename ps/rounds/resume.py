"""Which checkpoint a `ps-server --resume` continues from, and what a checkpoint write that fails tells.

The newest checkpoint that verifies (ps.checkpoint), passes every check of its fields
(ps.rounds.checkpoint_checks) and loads: any other is skipped, with a `checkpoint_skipped` event, for
the next older; a resume from an older one warns of each skipped file and why. Only when none is left
does the resume stop, with one error naming each file and its reason and no warnings besides, files
skipped for the same reason under it once (flags that differ from the job's make every file fail alike)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from common.job.spec import JobSpec
from ps.checkpoint import NAME, readable_checkpoints
from ps.ops.metrics import MetricsLog
from ps.rounds.checkpoint_checks import InvalidCheckpoint, check_checkpoint


class JobComplete(Exception):
    """--resume of a job whose checkpoint is at its last epoch: there is nothing to train."""


NOT_LOADABLE = (InvalidCheckpoint, ValueError, KeyError, TypeError, IndexError, AttributeError, RuntimeError)
"""What a checkpoint that verifies but holds what this server cannot use raises while it is checked or loaded."""


def warn(message: str) -> None:
    print(f"ps-server: warning: {message}", file=sys.stderr, flush=True)


Candidate = tuple[Path, dict[str, Any], dict[str, tuple[Any, Any]]]
"""A checkpoint that passed its checks: (path, state, the job settings that differ from it)."""


def _check_named_step(path: Path, state: dict[str, Any], spec: JobSpec) -> None:
    """The step in the file's name is the one it holds (BSP: its round, ASP: its version): files are
    taken newest first by that name, and pruned by it, so a renamed older file would be resumed from,
    and outlive the newer ones, again at every later resume."""
    named = NAME.match(path.name)
    held = state["round"] if spec.mode == "bsp" else state["version"]
    if named is not None and int(named.group(1)) != held:
        raise InvalidCheckpoint(f"its name says step {int(named.group(1))} but it holds step {held}; "
                                f"rename it ckpt-{held:010d}.pt to resume from it")


def by_reason(skipped: Iterable[tuple[str, str]]) -> list[tuple[list[str], str]]:
    """`(file name, reason)` pairs as `(file names, reason)`, one per reason, in the order each first comes."""
    grouped: dict[str, list[str]] = {}
    for name, reason in skipped:
        grouped.setdefault(reason, []).append(name)
    return [(names, reason) for reason, names in grouped.items()]


class ResumeSearch:
    """The checkpoints of `--resume DIR`, newest first, each skipped with its reason until one is usable."""

    def __init__(self, directory: Path, spec: JobSpec, numel: int) -> None:
        self.directory = directory
        self.spec = spec
        self.numel = numel
        self.skipped: list[tuple[str, str]] = []  # (file name, why), oldest skip first
        self._warned = 0  # of those, how many a warning has named
        self._metrics: MetricsLog | None = None
        self._candidates = readable_checkpoints(directory, self._skip)

    def report_to(self, metrics: MetricsLog) -> None:
        """Write a `checkpoint_skipped` event for every file skipped so far, and for the later ones."""
        self._metrics = metrics
        for name, reason in self.skipped:
            metrics.write("checkpoint_skipped", path=str(self.directory / name), reason=reason)

    def skip(self, path: Path, exc: BaseException) -> None:
        """A checkpoint that verifies but cannot be used: skipped with its reason."""
        reason = str(exc) if isinstance(exc, InvalidCheckpoint) else f"{type(exc).__name__}: {exc}"
        self._skip(path, f"it verifies but cannot be loaded ({reason})")

    def next(self) -> Candidate:
        """The next usable checkpoint (newest first). ValueError naming every file skipped when none is
        left; JobComplete when it is at the job's last epoch."""
        for path, state in self._candidates:
            try:
                changes = check_checkpoint(state, self.spec, self.numel)
                _check_named_step(path, state, self.spec)
            except NOT_LOADABLE as exc:
                self.skip(path, exc)
                continue
            self._warn_skipped()
            epoch = state["epoch"]
            if epoch >= self.spec.epochs:
                raise JobComplete(
                    f"the job in {self.directory} is complete ({path.name}: epoch {epoch} of {self.spec.epochs}); "
                    f"nothing to train: resume with --epochs above {epoch} to extend it"
                )
            return path, state, changes
        if not self.skipped:
            raise ValueError(f"--resume {self.directory}: {self._why_none()}")
        reasons = "; ".join(f"{', '.join(names)}: {reason}" for names, reason in by_reason(reversed(self.skipped)))
        raise ValueError(f"--resume {self.directory}: no usable checkpoint there ({reasons})")

    def _warn_skipped(self) -> None:
        """A usable checkpoint was found: one warning per reason for the files skipped since the last."""
        for names, reason in by_reason(self.skipped[self._warned:]):
            warn(f"skipping checkpoint{'s' if len(names) > 1 else ''} {', '.join(names)}: {reason}")
        self._warned = len(self.skipped)

    def _why_none(self) -> str:
        """Why the folder gave no file to try: it is a file (a checkpoint's own path), it does not exist,
        or it holds no ckpt-*.pt."""
        if self.directory.is_file():
            return f"a file, not a folder; --resume takes the folder of the checkpoints (--resume {self.directory.parent})"
        if not self.directory.exists():
            return "no such folder"
        return "no checkpoint there (no ckpt-<step>.pt file)"

    def _skip(self, path: Path, reason: str) -> None:
        self.skipped.append((path.name, reason))
        if self._metrics is not None:
            self._metrics.write("checkpoint_skipped", path=str(path), reason=reason)


def checkpoint_failed(metrics: MetricsLog) -> Callable[[int, str], None]:
    """The Checkpointer's report of a write that failed: a warning and a `checkpoint_failed` record."""
    def report(step: int, cause: str) -> None:
        warn(f"checkpoint at step {step} not written: {cause}")
        metrics.write("checkpoint_failed", step=step, error=cause)
    return report
