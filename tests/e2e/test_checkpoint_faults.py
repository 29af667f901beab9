"""Checkpoint faults: a disk that fills up mid-job (a tiny tmpfs, with a real ps-server and workers),
then frees again; stale temporary files; a pending save superseded by a newer one; pruning after a
step below the older files'; and a resume past a checkpoint that verifies but does not load."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ps.checkpoint import Checkpointer, checkpoint_files, read_checkpoint, write_checkpoint
from ps.rounds.checkpoint_state import CHECKPOINT_FORMAT
from tests.processes import start_server
from tests.fault_jobs import wait_for

JOB = ["--workers", "2", "--model-arg", "hidden=256", "--dataset", "digits", "--global-batch", "128", "--lr", "0.1",
       "--grace", "5"]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs: a few checkpoints of the test model fit, a filler file can take the rest."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


def fill(path: Path) -> None:
    """Write zeros to `path` until the disk is full."""
    with open(path, "wb") as f:
        try:
            while True:
                f.write(bytes(64 << 10))
                f.flush()
        except OSError:
            pass


def test_a_full_disk_fails_writes_with_their_cause_and_a_good_final_save_follows(tmp_path: Path, small_disk: Path) -> None:
    ckpt = small_disk / "ckpt"
    port_file = tmp_path / "metrics-port"
    cluster = start_server(tmp_path, [*JOB, "--epochs", "100", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "5",
                                      "--keep-checkpoints", "1", "--metrics-port", "0", "--metrics-port-file", str(port_file)])
    try:
        for name in ("w0", "w1"):
            cluster.start_worker(name, "--slowdown", "20")
        wait_for(lambda: bool(checkpoint_files(ckpt)), 120, "the first checkpoint")
        fill(small_disk / "filler")
        wait_for(lambda: len(cluster.events("checkpoint_failed")) >= 2, 120, "two failed checkpoint writes")
        failed = cluster.events("checkpoint_failed")
        assert all("No space left" in e["error"] for e in failed), failed
        assert not [p.name for p in ckpt.iterdir() if p.name.endswith(".tmp")]  # each failure removed its file
        assert "checkpoint at step" in cluster.server_log() and "not written" in cluster.server_log()
        scrape = urllib.request.urlopen(f"http://127.0.0.1:{port_file.read_text().strip()}/metrics", timeout=10).read().decode()
        (line,) = [x for x in scrape.splitlines() if x.startswith("hetero_ps_checkpoint_failures_total ")]
        assert float(line.split()[1]) >= 2, line
        (small_disk / "filler").unlink()
        cluster.server.send_signal(signal.SIGTERM)
        assert cluster.wait(120) == 0, cluster.server_log()
    finally:
        cluster.stop()
    (summary,) = cluster.events("summary")
    final = cluster.events("checkpoint")[-1]
    state = read_checkpoint(final["path"])
    assert state["round"] == summary["rounds"] == final["step"], (state["round"], summary, final)
    assert [p.name for p in checkpoint_files(ckpt)] == [Path(final["path"]).name]


class Gate:
    """A state value whose pickling waits until the test opens it: a write held in progress."""

    opened = threading.Event()
    entered = threading.Event()

    def __reduce__(self) -> tuple[Any, ...]:
        Gate.entered.set()
        assert Gate.opened.wait(30)
        return (int, (0,))


def test_only_the_newest_pending_save_is_written_and_stale_temporaries_go(tmp_path: Path) -> None:
    stale = tmp_path / f".ckpt-0000000007.pt.{os.getpid() + 1}.tmp"
    tmp_path.mkdir(exist_ok=True)
    stale.write_bytes(b"half a checkpoint")
    keep = tmp_path / "notes.tmp"  # not a checkpoint's temporary: left alone
    keep.write_bytes(b"")
    checkpointer = Checkpointer(tmp_path, keep=10)
    try:
        assert not stale.exists() and keep.exists()
        checkpointer.save_async({"step": 1, "gate": Gate()}, 1)
        assert Gate.entered.wait(30)  # step 1 is being written
        checkpointer.save_async({"step": 2}, 2)
        checkpointer.save_async({"step": 3}, 3)  # replaces step 2, which never began
        Gate.opened.set()
        checkpointer.flush()
    finally:
        checkpointer.close()
    assert [int(p.name[5:15]) for p in checkpoint_files(tmp_path)] == [1, 3]
    assert [read_checkpoint(p)["step"] for p in checkpoint_files(tmp_path)[1:]] == [3]


def test_a_failed_write_is_told_and_the_next_save_succeeds(tmp_path: Path) -> None:
    told: list[tuple[int, str]] = []
    checkpointer = Checkpointer(tmp_path, keep=3, on_failure=lambda step, cause: told.append((step, cause)))
    try:
        checkpointer.save_async({"x": lambda: None}, 1)  # cannot be pickled
        checkpointer.flush()
        assert told and told[0][0] == 1 and "pickle" in told[0][1].lower(), told
        path = checkpointer.save({"x": 1}, 2)  # the final save is not stopped by the earlier failure
    finally:
        checkpointer.close()
    assert path is not None and read_checkpoint(path) == {"x": 1}
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_pruning_keeps_the_checkpoint_just_written(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        write_checkpoint(tmp_path, {"step": step}, step, keep=2)
    written = write_checkpoint(tmp_path, {"step": 5}, 5, keep=2)
    assert written.exists() and read_checkpoint(written) == {"step": 5}


def test_a_checkpoint_that_verifies_but_does_not_load_is_skipped_on_resume(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    (tmp_path / "first").mkdir()
    first = start_server(tmp_path / "first", [*JOB, "--epochs", "1", "--checkpoint-dir", str(ckpt)])
    try:
        for name in ("w0", "w1"):
            first.start_worker(name)
        assert first.wait(120) == 0, first.server_log()
    finally:
        first.stop()
    good = checkpoint_files(ckpt)[-1]
    state = read_checkpoint(good)
    del state["round"]  # passes the job checks, fails the restore
    write_checkpoint(ckpt, state, 900, keep=10)
    write_checkpoint(ckpt, {"format": CHECKPOINT_FORMAT}, 901, keep=10)  # no job to check against
    (tmp_path / "resumed").mkdir()
    resumed = start_server(tmp_path / "resumed", [*JOB, "--epochs", "2", "--resume", str(ckpt)])
    try:
        wait_for(lambda: bool(resumed.events("resume")), 60, "the resume")
        log = resumed.server_log()
        assert "skipping checkpoint ckpt-0000000901.pt: it verifies but cannot be loaded" in log, log
        assert "skipping checkpoint ckpt-0000000900.pt: it verifies but cannot be loaded" in log, log
        assert f"resuming from {good}" in log, log
        (event,) = resumed.events("resume")
        assert event["step"] == int(good.name[5:15])
    finally:
        resumed.stop()
