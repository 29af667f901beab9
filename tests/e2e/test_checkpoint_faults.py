"""Checkpoint faults: a disk that fills up mid-job (a tiny tmpfs, with a real ps-server and workers),
then frees again; stale temporary files; a pending save superseded by a newer one; pruning after a
step below the older files'; a resume past a checkpoint that verifies but does not load, and past
each kind of checksum-valid but bad file to the older good one; and a resume with no usable file."""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ps.checkpoint import Checkpointer, checkpoint_files, read_checkpoint, write_checkpoint
from ps.rounds.checkpoint_state import CHECKPOINT_FORMAT
from tests.processes import ENV, start_server
from tests.fault_jobs import resume_after_kill, status, wait_for

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


@pytest.fixture(scope="module")
def finished_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoints of a one-epoch job run to its end by a real server and workers."""
    workdir = tmp_path_factory.mktemp("finished")
    ckpt = workdir / "ckpt"
    cluster = start_server(workdir, [*JOB, "--epochs", "1", "--checkpoint-dir", str(ckpt)])
    try:
        for name in ("w0", "w1"):
            cluster.start_worker(name)
        assert cluster.wait(120) == 0, cluster.server_log()
    finally:
        cluster.stop()
    return ckpt


def test_a_checkpoint_that_verifies_but_does_not_load_is_skipped_on_resume(tmp_path: Path, finished_job: Path) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(finished_job, ckpt)
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


def bad_momentum(state: dict) -> None:
    state["optimizer"]["param_groups"][0]["momentum"] = math.nan


def bad_maximize(state: dict) -> None:
    state["optimizer"]["param_groups"][0]["maximize"] = True


def bad_dampening(state: dict) -> None:
    state["optimizer"]["param_groups"][0]["dampening"] = -5


def other_momentum(state: dict) -> None:
    state["optimizer"]["param_groups"][0]["momentum"] = 0.5  # in range, not the job's 0.9


def nan_parameter(state: dict) -> None:
    state["params"][3] = math.nan


BAD_FILES: dict[str, tuple[Callable[[dict], None], str]] = {
    # each: what spoils a good state, and the reason the server gives for skipping the file
    "spec-not-json": (lambda s: s.update(spec="{not json"), "its job spec: the job spec is not JSON"),
    "epoch-abc": (lambda s: s.update(epoch="abc"), "its epoch must be a whole number in [0, 1000000], got 'abc'"),
    "nan-parameter": (nan_parameter, "its params hold NaN or Inf values"),
    "junk-policy": (lambda s: s.update(controller={"junk": [1, 2]}), "its batch policy state does not restore"),
    "momentum-nan": (bad_momentum, "the optimizer's momentum must be a number in [0, 1), got nan"),
    "maximize": (bad_maximize, "the optimizer's maximize must be False, got True"),
    "dampening": (bad_dampening, "the optimizer's dampening must be a number in [0, 1], got -5"),
    "momentum-other": (other_momentum, "its optimizer's momentum is 0.5, the job's is 0.9"),
    "negative-round": (lambda s: s.update(round=-1), "its round must be a whole number in [0, 9007199254740992], got -1"),
    "huge-samples": (lambda s: s.update(samples=10**30), f"its samples must be a whole number in [0, 9007199254740992], got {10**30}"),
}


def spoiled_copy(finished_job: Path, target: Path, spoil: Callable[[dict], None], step: int) -> Path:
    """`target`: a copy of the job's checkpoints and a newer file, checksum-valid, of its newest state spoilt."""
    shutil.copytree(finished_job, target)
    state = read_checkpoint(checkpoint_files(target)[-1])
    spoil(state)
    return write_checkpoint(target, state, step, keep=10)


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_bad_newest_checkpoint_is_skipped_for_the_older_good_one(tmp_path: Path, finished_job: Path, case: str) -> None:
    spoil, reason = BAD_FILES[case]
    ckpt = tmp_path / "ckpt"
    good = checkpoint_files(finished_job)[-1]
    bad = spoiled_copy(finished_job, ckpt, spoil, 900)
    (tmp_path / "resumed").mkdir()
    resumed = start_server(tmp_path / "resumed", [*JOB, "--epochs", "2", "--resume", str(ckpt)])
    try:
        wait_for(lambda: bool(resumed.events("resume")), 60, "the resume")
        log = resumed.server_log()
        (line,) = [x for x in log.splitlines() if x.startswith(f"ps-server: warning: skipping checkpoint {bad.name}: ")]
        assert "it verifies but cannot be loaded (" in line and reason in line, log
        assert f"resuming from {ckpt / good.name}" in log, log
        (skipped,) = resumed.events("checkpoint_skipped")
        assert skipped["path"] == str(bad) and reason in skipped["reason"]
        (event,) = resumed.events("resume")
        assert event["step"] == int(good.name[5:15])
        for name in ("w0", "w1"):
            resumed.start_worker(name)
        assert resumed.wait(120) == 0, resumed.server_log()  # trains on to the end of epoch 2
    finally:
        resumed.stop()
    (summary,) = resumed.events("summary")
    assert summary["epochs"] == 2 and summary["rounds"] > event["round"]


def test_a_resume_with_no_usable_checkpoint_stops_naming_each_file_and_why(tmp_path: Path, finished_job: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    state = read_checkpoint(checkpoint_files(finished_job)[-1])
    named = {}
    for step, (case, (spoil, reason)) in enumerate(BAD_FILES.items(), start=900):
        spoilt = {**state, "optimizer": {**state["optimizer"], "param_groups": [dict(state["optimizer"]["param_groups"][0])]},
                  "params": state["params"].clone()}
        spoil(spoilt)
        named[write_checkpoint(ckpt, spoilt, step, keep=100).name] = reason
    (ckpt / "ckpt-0000000999.pt").write_bytes(b"HPSCKPT1 truncated")
    named["ckpt-0000000999.pt"] = "not a checkpoint (bad header or truncated)"
    done = subprocess.run([sys.executable, "-m", "ps.server", "--port", "0", *JOB, "--epochs", "2", "--resume", str(ckpt)],
                          capture_output=True, text=True, timeout=120, env=ENV, check=False)
    assert done.returncode == 2, done.stderr
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("ps-server: error:")]
    assert error.startswith(f"ps-server: error: --resume {ckpt}: no usable checkpoint there ("), error
    for name, reason in named.items():
        assert f"{name}: " in error and reason in error, (name, reason, error)
    assert "warning: skipping" not in done.stderr, done.stderr  # the error names each file and why, once
    assert "listening" not in done.stdout


def test_workers_rejoin_a_resume_that_changes_epochs(tmp_path: Path) -> None:
    """`kill -9` of the server, then --resume with --epochs shortened (a change the resume allows):
    the running workers rejoin and the job ends at the new last epoch. Before, each worker refused
    the job as "a different job" and the resumed server waited for ever."""
    ckpt = tmp_path / "ckpt"
    (tmp_path / "first").mkdir()
    cluster = start_server(tmp_path / "first", [*JOB, "--epochs", "40", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1"])
    try:
        for name in ("w0", "w1"):
            cluster.start_worker(name, "--retry-for", "60")
        wait_for(lambda: status(cluster.target)["epoch"] >= 1, 120, "epoch 1")
        resumed, epochs = resume_after_kill(cluster, ckpt, tmp_path / "second", JOB, ("w0", "w1"))
    finally:
        cluster.stop()
    (summary,) = resumed.events("summary")
    assert summary["epochs"] == epochs, summary
