"""Checkpoint files past the 10 digits of their names' steps (a resumed checkpoint's round may be up to
2^53): found, ordered by step and pruned like the others (the resume with real processes is
tests/e2e/test_checkpoint_faults.py)."""

from __future__ import annotations

import os
from pathlib import Path

from ps.checkpoint import checkpoint_files, latest_checkpoint, remove_temporaries, write_checkpoint

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
