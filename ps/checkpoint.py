"""Checkpoints: atomic, checksummed files of the server's whole state; the last K are kept.

File layout: an 8-byte magic, the SHA-256 of the payload, then a `torch.save` payload. A file
that is truncated or corrupt fails the checksum and is skipped with a warning on resume.
To load the model into your own module::

    from ps.checkpoint import read_checkpoint
    model.load_state_dict(read_checkpoint("ckpts/ckpt-0000000120.pt")["model"])
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import io
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

MAGIC = b"HPSCKPT1"
NAME = re.compile(r"^ckpt-(\d{10})\.pt$")


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
    with open(tmp, "wb") as f:
        f.write(MAGIC)
        f.write(hashlib.sha256(payload).digest())
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    for old in checkpoint_files(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return final


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load and verify one checkpoint; raises CorruptCheckpoint when it is damaged."""
    data = Path(path).read_bytes()
    if len(data) < len(MAGIC) + 32 or not data.startswith(MAGIC):
        raise CorruptCheckpoint(f"{path}: not a checkpoint (bad header or truncated)")
    digest, payload = data[len(MAGIC) : len(MAGIC) + 32], data[len(MAGIC) + 32 :]
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptCheckpoint(f"{path}: checksum mismatch (truncated or corrupt)")
    return torch.load(io.BytesIO(payload), weights_only=True)


def checkpoint_files(directory: Path) -> list[Path]:
    """Checkpoint files in step order, oldest first."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if NAME.match(p.name))


def latest_checkpoint(directory: Path, warn: Callable[[str], None]) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that verifies; damaged newer ones are reported through `warn` and skipped."""
    for path in reversed(checkpoint_files(directory)):
        try:
            return path, read_checkpoint(path)
        except (CorruptCheckpoint, RuntimeError, EOFError, OSError) as exc:
            warn(f"skipping checkpoint {path.name}: {exc}")
    return None


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
    """Writes checkpoints on a background thread so the rounds do not wait on the disk."""

    def __init__(self, directory: Path, keep: int) -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1")
        _check_writable(directory)
        self.directory = directory
        self.keep = keep
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._last: concurrent.futures.Future | None = None
        self.written: list[Path] = []

    def save_async(self, state: dict[str, Any], step: int) -> None:
        """Queue a write of an already-snapshotted state."""
        self._last = self._pool.submit(self._write, state, step)

    def save(self, state: dict[str, Any], step: int) -> Path:
        """Write now (after any queued write), for shutdown."""
        self.flush()
        return self._write(state, step)

    def _write(self, state: dict[str, Any], step: int) -> Path:
        path = write_checkpoint(self.directory, state, step, self.keep)
        self.written.append(path)
        return path

    def flush(self) -> None:
        if self._last is not None:
            self._last.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
