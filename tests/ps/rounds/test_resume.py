"""ps/rounds/resume.py: why `--resume` found no checkpoint to try. Pure: no server, no file written
beyond tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.job.spec import JobSpec
from ps.rounds.resume import ResumeSearch


def _refusal(path: Path) -> str:
    with pytest.raises(ValueError) as error:
        ResumeSearch(path, JobSpec(), 10).next()
    return str(error.value)


def test_a_checkpoint_file_given_to_resume_is_told_to_pass_its_folder(tmp_path: Path) -> None:
    """`--resume DIR/ckpt-0000000045.pt` said "no checkpoint there" of a checkpoint file."""
    file = tmp_path / "ckpt-0000000045.pt"
    file.write_bytes(b"x")
    assert _refusal(file) == (f"--resume {file}: a file, not a folder; --resume takes the folder of the "
                              f"checkpoints (--resume {tmp_path})")


def test_a_missing_folder_and_an_empty_one_are_told_apart(tmp_path: Path) -> None:
    """A typo in the folder's name said the same as a folder without checkpoints."""
    assert _refusal(tmp_path / "nope") == f"--resume {tmp_path / 'nope'}: no such folder"
    assert _refusal(tmp_path) == f"--resume {tmp_path}: no checkpoint there (no ckpt-<step>.pt file)"
