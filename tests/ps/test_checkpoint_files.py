"""Checkpoint files past the 10 digits of their names' steps (a resumed checkpoint's round may be up to
2^53): found, ordered by step and pruned like the others; a checksum-valid file whose pickle calls a
function: refused, in one line (the resume with real processes is tests/e2e/test_checkpoint_faults.py)."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from ps.checkpoint import (MAGIC, CorruptCheckpoint, checkpoint_files, latest_checkpoint, read_checkpoint,
                           remove_temporaries, write_checkpoint)

BIG = 10**12  # 13 digits


def test_steps_past_ten_digits_are_found_ordered_and_pruned(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, {"step": 18}, 18, keep=3)
    for step in (BIG + 3, BIG + 6, BIG + 9):
        write_checkpoint(tmp_path, {"step": step}, step, keep=3)
    assert [p.name for p in checkpoint_files(tmp_path)] == [f"ckpt-{s}.pt" for s in (BIG + 3, BIG + 6, BIG + 9)]
    found = latest_checkpoint(tmp_path, warn=lambda message: None)
    assert found is not None and found[1] == {"step": BIG + 9}


def test_a_ten_digit_step_sorts_below_an_eleven_digit_one(tmp_path: Path) -> None:
    for step in (10**10, 9_999_999_999):
        write_checkpoint(tmp_path, {"step": step}, step, keep=5)
    assert [p.name for p in checkpoint_files(tmp_path)] == ["ckpt-9999999999.pt", "ckpt-10000000000.pt"]


def test_a_long_step_s_temporary_is_removed(tmp_path: Path) -> None:
    stale = tmp_path / f".ckpt-{BIG}.pt.{os.getpid() + 1}.tmp"
    stale.write_bytes(b"half")
    assert remove_temporaries(tmp_path) == [stale] and not stale.exists()


class Touch:
    """Unpickled without weights_only, it would create `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


def test_a_pickle_that_calls_a_function_is_refused_in_one_line(tmp_path: Path) -> None:
    """torch's refusal spans nine lines and advises weights_only=False; the reason is one line naming
    the file and what was refused."""
    marker = tmp_path / "ran"
    buffer = io.BytesIO()
    torch.save({"params": Touch(marker)}, buffer)
    payload = buffer.getvalue()
    path = tmp_path / "ckpt-0000000001.pt"
    path.write_bytes(MAGIC + hashlib.sha256(payload).digest() + payload)
    with pytest.raises(CorruptCheckpoint) as caught:
        read_checkpoint(path)
    message = str(caught.value)
    assert "\n" not in message and "weights_only` set to `False`" not in message, message
    assert message.startswith(f"{path}: holds objects a checkpoint does not") and "system" in message, message
    assert not marker.exists()
