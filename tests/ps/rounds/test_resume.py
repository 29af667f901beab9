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


def test_a_checkpoint_renamed_to_a_later_step_is_skipped_for_the_one_its_step_names(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A copy of step 23's file named ckpt-0000000099.pt was resumed from as the newest, and outlived
    the checkpoints written after it (pruning goes by the name), so every later resume rewound to it."""
    from ps.checkpoint import checkpoint_files, write_checkpoint
    from ps.server_job import build_job
    from tests.conftest import job_args

    job = build_job(job_args("--epochs", "3"))
    try:
        state = job.coordinator.checkpoint_state()
        state["round"] = 23
        write_checkpoint(tmp_path, state, 23, keep=3)
        (older,) = checkpoint_files(tmp_path)
        renamed = tmp_path / "ckpt-0000000099.pt"
        renamed.write_bytes(older.read_bytes())
        search = ResumeSearch(tmp_path, job.spec, job.coordinator.layout.numel)
        path, held, _ = search.next()
    finally:
        job.evaluator.close()
        job.metrics.close()
    assert (path, held["round"]) == (older, 23)
    assert search.skipped == [("ckpt-0000000099.pt", "it verifies but cannot be loaded (its name says step 99 but it "
                                                    "holds step 23; rename it ckpt-0000000023.pt to resume from it)")]
    assert capsys.readouterr().err.count("its name says step 99") == 1  # the resume goes on: a warning says why


def test_a_refused_resume_says_its_reason_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three checkpoints (--keep-checkpoints' default) of a job with another --seed: a warning for each
    file and the error naming all three said the same reason six times. The error alone says it, once,
    naming the three files."""
    from ps.checkpoint import write_checkpoint
    from ps.server_job import build_job
    from tests.conftest import job_args

    job = build_job(job_args("--epochs", "3", "--seed", "4"))
    try:
        state = job.coordinator.checkpoint_state()
        for step in (23, 45, 68):
            write_checkpoint(tmp_path, {**state, "round": step}, step, keep=3)
        spec = JobSpec.from_json(state["spec"].replace('"seed": 4', '"seed": 0'))
        with pytest.raises(ValueError) as error:
            ResumeSearch(tmp_path, spec, job.coordinator.layout.numel).next()
    finally:
        job.evaluator.close()
        job.metrics.close()
    reason = "--seed differs (--seed: checkpoint 4, command line 0)"
    assert str(error.value).startswith(f"--resume {tmp_path}: no usable checkpoint there (ckpt-0000000023.pt, "
                                       "ckpt-0000000045.pt, ckpt-0000000068.pt: it verifies but cannot be loaded ("), error
    assert str(error.value).count(reason) == 1, error
    assert capsys.readouterr().err == ""  # ps-server prints the error once, as its one line
