"""Checkpoints: atomic, checksummed files of the server's whole state; the last K are kept.

File layout: an 8-byte magic, the SHA-256 of the payload, then a `torch.save` payload. A file
that is truncated or corrupt fails the checksum and is skipped with a warning on resume, as is one
that verifies but holds a field the server cannot use (ps.rounds.checkpoint_checks). A write that fails (a full disk, a folder made read-only) is
reported with its cause, its temporary file removed, and the job goes on: the next save tries again.
To load the model into your own module::

    from ps.checkpoint import read_checkpoint
    model.load_state_dict(read_checkpoint("ckpts/ckpt-0000000120.pt")["model"])
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

MAGIC = b"HPSCKPT1"
NAME = re.compile(r"^ckpt-(\d{10,})\.pt$")
"""ckpt-<step>.pt, the step zero-padded to 10 digits; a step past them (a resumed checkpoint's may be
up to 2^53) takes more, and the files are ordered by the number, not the name."""
TEMPORARY = re.compile(r"^\.ckpt-\d{10,}\.pt\.\d+\.tmp$")


class CorruptCheckpoint(ValueError):
    """The file is not a complete checkpoint written by this server."""


def write_checkpoint(directory: Path, state: dict[str, Any], step: int, keep: int) -> Path:
    """Write state as ckpt-<step>.pt via a temporary file, fsync and rename; prune to `keep` files."""
    directory.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    final = directory / f"ckpt-{step:010d}.pt"
    tmp = directory / f".{final.name}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC)
            f.write(hashlib.sha256(payload).digest())
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    for old in checkpoint_files(directory)[:-keep]:
        if old != final:  # a step below older files' (a resume of an earlier one) keeps the file just written
            old.unlink(missing_ok=True)
    return final


def remove_temporaries(directory: Path) -> list[Path]:
    """Delete the temporary files writes that never finished left (a crash, a full disk); the ones removed."""
    if not directory.is_dir():
        return []
    stale = [p for p in directory.iterdir() if TEMPORARY.match(p.name)]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load and verify one checkpoint; raises CorruptCheckpoint when it is damaged."""
    data = Path(path).read_bytes()
    if len(data) < len(MAGIC) + 32 or not data.startswith(MAGIC):
        raise CorruptCheckpoint(f"{path}: not a checkpoint (bad header or truncated)")
    digest, payload = data[len(MAGIC) : len(MAGIC) + 32], data[len(MAGIC) + 32 :]
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptCheckpoint(f"{path}: checksum mismatch (truncated or corrupt)")
    try:
        return torch.load(io.BytesIO(payload), weights_only=True)
    except pickle.UnpicklingError as exc:  # torch's message spans lines and advises weights_only=False
        raise CorruptCheckpoint(f"{path}: holds objects a checkpoint does not (refused by torch.load's weights_only: "
                                f"{_refusal(exc)})") from None


def _refusal(exc: Exception) -> str:
    """The line of a weights_only refusal that names what was refused (torch's other lines are advice)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    named = [line for line in lines if not line.startswith(("Weights only load failed", "Check the documentation"))]
    return (named[0] if named else "not plain data")[:200]


def checkpoint_files(directory: Path) -> list[Path]:
    """Checkpoint files in step order, oldest first."""
    if not directory.is_dir():
        return []
    steps = [(int(m.group(1)), p) for p in directory.iterdir() if (m := NAME.match(p.name))]
    return [p for _, p in sorted(steps)]


UNREADABLE = (CorruptCheckpoint, RuntimeError, EOFError, OSError, pickle.UnpicklingError, ValueError)
"""What reading a checkpoint file raises when it cannot be read back (damaged, or not ours)."""


def readable_checkpoints(directory: Path, skipped: Callable[[Path, str], None]) -> Iterator[tuple[Path, dict[str, Any]]]:
    """The checkpoints that verify and unpickle, newest first; the others are told to `skipped` with
    the reason, and skipped."""
    for path in reversed(checkpoint_files(directory)):
        try:
            state = read_checkpoint(path)
        except UNREADABLE as exc:
            skipped(path, str(exc))
            continue
        yield path, state


def latest_checkpoint(directory: Path, warn: Callable[[str], None]) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that verifies; damaged newer ones are reported through `warn` and skipped."""
    return next(readable_checkpoints(directory, lambda path, why: warn(f"skipping checkpoint {path.name}: {why}")), None)


def _check_writable(directory: Path) -> None:
    """Create `directory` if needed and write a file in it: OSError naming it now, at start, instead of
    every checkpoint of the run failing on a background thread."""
    probe = directory / f".write-test-{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise OSError(f"checkpoint directory {directory} is not writable: {exc.strerror or exc}") from None


def check_no_other_job(directory: Path, resume: Path | None) -> None:
    """ValueError when `directory` already holds checkpoints and this run does not continue them
    (`--resume` of that same folder): a new job writing there would prune the earlier job's files as
    its own steps pass theirs, and a later `--resume` could pick the earlier job's newest."""
    existing = checkpoint_files(directory)
    if not existing or (resume is not None and resume.resolve() == directory.resolve()):
        return
    raise ValueError(
        f"--checkpoint-dir {directory} already holds {len(existing)} checkpoint(s) of another run (newest "
        f"{existing[-1].name}): continue that job with --resume {directory}, or give this one a folder of its own"
    )


class Checkpointer:
    """Writes checkpoints on a background thread so the rounds do not wait on the disk.

    Only the newest pending save is kept: a save queued while another is written replaces the one
    still waiting. A write that fails is told to `on_failure(step, cause)` (the metrics log: a
    `checkpoint_failed` record, counted by Prometheus), its temporary file removed; the next save
    tries again, the final one included. Stale temporary files are removed at the start."""

    def __init__(self, directory: Path, keep: int, on_failure: Callable[[int, str], None] | None = None) -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1")
        _check_writable(directory)
        remove_temporaries(directory)
        self.directory = directory
        self.keep = keep
        self.on_failure = on_failure
        self.written: list[Path] = []
        self.failures: list[tuple[int, str]] = []  # (step, cause) of every write that failed
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending: tuple[dict[str, Any], int] | None = None
        self._writing = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="checkpoint", daemon=True)
        self._thread.start()

    def save_async(self, state: dict[str, Any], step: int) -> None:
        """Queue a write of an already-snapshotted state (replacing a queued one not yet begun)."""
        with self._lock:
            self._pending = (state, step)
            self._idle.notify_all()

    def save(self, state: dict[str, Any], step: int) -> Path | None:
        """Write now (after the write under way; a queued one is superseded), for shutdown; None if it failed."""
        with self._lock:
            self._pending = None
            while self._writing:
                self._idle.wait()
            self._writing = True
        try:
            return self._write(state, step)
        finally:
            with self._lock:
                self._writing = False
                self._idle.notify_all()

    def _run(self) -> None:
        while True:
            with self._lock:
                while self._pending is None and not self._closed:
                    self._idle.wait()
                if self._pending is None:
                    return
                (state, step), self._pending = self._pending, None
                self._writing = True
            try:
                self._write(state, step)
            finally:
                with self._lock:
                    self._writing = False
                    self._idle.notify_all()

    def _write(self, state: dict[str, Any], step: int) -> Path | None:
        try:
            path = write_checkpoint(self.directory, state, step, self.keep)
        except Exception as exc:  # noqa: BLE001 (a disk that fails must not stop the job; the cause is told)
            cause = f"{type(exc).__name__}: {exc}"
            self.failures.append((step, cause))
            if self.on_failure is not None:
                self.on_failure(step, cause)
            return None
        self.written.append(path)
        return path

    def flush(self) -> None:
        """Wait until no save is queued or under way."""
        with self._lock:
            while self._pending is not None or self._writing:
                self._idle.wait()

    def close(self) -> None:
        """Finish the queued save, then stop the thread."""
        with self._lock:
            self._closed = True
            self._idle.notify_all()
        self._thread.join()
