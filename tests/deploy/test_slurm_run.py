"""Real Slurm: a heterogeneous job from the HL4 profile trains on the local cluster of deploy/slurm.sh,
and the same job, requeued with `scontrol requeue`, resumes from its checkpoint.

Marked `slurm`, which the default `python -m pytest -q` deselects: run it with
`python -m pytest -q -m slurm`. It needs slurmctld and the emulated nodes of deploy/slurm.sh (which
it starts, as root, where they are not running); it is skipped, saying why, only where they cannot
start. The job is small (synthetic 16x16 images, a few epochs, the profile's cores x 1/32 as CPU
quotas): a few minutes on 2 cores.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest

from deploy import slurm, slurm_follow
from deploy.cgroups import detect_backend
from ps.ops.metrics import read_metrics
from tests.repo import ROOT

pytestmark = pytest.mark.slurm

START = ROOT / "deploy" / "slurm.sh"
GLOBAL_BATCH = 256
SCALE = "0.03125"  # HL4's 48 cores -> 1.5 cores of CPU quota for the workers
NODES_NEEDED = 4  # the server and HL4's three classes of worker, each on a node of its own


def job_args(epochs: int, size: int) -> list[str]:
    return [f"--server-arg=--epochs {epochs} --global-batch {GLOBAL_BATCH} --lr 0.05 --dataset-arg size={size} "
            "--dataset-arg image_size=16"]


def slurm_up() -> str | None:
    """None when slurmctld answers and enough nodes are idle, else what is missing."""
    if shutil.which("scontrol") is None:
        return "Slurm is not installed"
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
    if "is UP" not in ping.stdout:
        return "slurmctld does not answer"
    nodes = subprocess.run(["sinfo", "-h", "-N", "-t", "idle,mixed", "-o", "%N"], capture_output=True, text=True, timeout=30)
    if len(set(nodes.stdout.split())) < NODES_NEEDED:
        return f"fewer than {NODES_NEEDED} idle nodes: {nodes.stdout.split()}"
    return None


@pytest.fixture(scope="module")
def cluster() -> None:
    """The local Slurm of deploy/slurm.sh, started if it is not running; skip (with the reason) where it cannot."""
    missing = slurm_up()
    if missing is None:
        return
    if os.geteuid() != 0:
        pytest.skip(f"{missing}, and deploy/slurm.sh needs root to start it")
    started = subprocess.run([str(START)], capture_output=True, text=True, timeout=900)
    missing = slurm_up()
    if missing is not None:
        lines = (started.stderr or started.stdout).strip().splitlines()
        pytest.skip(f"Slurm cannot start here: {lines[-1] if lines else missing}")


@pytest.fixture
def jobs() -> Iterator[list[int]]:
    """Job ids to cancel when a test ends early."""
    submitted: list[int] = []
    yield submitted
    for job in submitted:
        subprocess.run(["scancel", str(job)], capture_output=True, timeout=30)


def events(job: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in read_metrics(job / slurm.METRICS_LOG) if e.get("event") == kind]


def check_plans(job: Path) -> None:
    """Every plan the controller made splits exactly the global batch."""
    plans = events(job, "adjust")
    assert plans
    for plan in plans:
        assert sum(plan["batch_sizes"].values()) == GLOBAL_BATCH, plan


def test_a_job_from_the_hl4_profile_trains(cluster: None, jobs: list[int], tmp_path: Path) -> None:
    job = tmp_path / "hl4"
    done = subprocess.run(
        [sys.executable, "-m", "deploy.cli", "slurm", "--profile", "hl4", "--scale", SCALE, "--limiter", "auto",
         "--out", str(job), "--submit", *job_args(3, 1536)],
        capture_output=True, text=True, timeout=600,
    )
    found = re.search(r"job (\d+): submitted", done.stdout)
    if found:
        jobs.append(int(found[1]))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "COMPLETED, exit status 0" in done.stdout
    (summary,) = events(job, "summary")
    assert summary["reason"] == "finished" and summary["epochs"] == 3
    assert summary["accuracy"] >= 0.6, summary
    assert sum(summary["batch_sizes"].values()) == GLOBAL_BATCH
    check_plans(job)
    assert "done: 3 epochs" in done.stdout and "test accuracy after epoch 3" in done.stdout

    (output,) = job.glob("slurm-*.out")
    placed = re.search(r"components on nodes((?: \d+:\S+)+)", output.read_text(encoding="utf-8"))
    assert placed is not None
    nodes = dict(item.split(":") for item in placed[1].split())
    assert sorted(nodes) == ["0", "1", "2", "3"] and len(set(nodes.values())) == 4  # server + three classes
    quotas = {name: (job / f"{name}.log").read_text(encoding="utf-8").splitlines()[0] for name in ("w0", "w1", "w2", "w3")}
    limited = detect_backend() is not None  # the nodes share this machine: its cgroups are theirs
    for name, cores, factor in (("w0", "0.28125", "2.66667"), ("w2", "0.1875", "4"), ("w3", "0.75", None)):
        expected = f"quota of {cores} cores" if limited else f"--slowdown {factor}" if factor else "allocation only"
        assert expected in quotas[name], quotas

    token_file = job / slurm.TOKEN_FILE
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text(encoding="utf-8").strip()
    for path in job.iterdir():
        if path.is_file() and path != token_file:
            assert token not in path.read_text(encoding="utf-8", errors="replace"), path


def test_a_requeued_job_resumes_from_its_checkpoint(cluster: None, jobs: list[int], tmp_path: Path) -> None:
    job = tmp_path / "requeued"
    written = subprocess.run(
        [sys.executable, "-m", "deploy.cli", "slurm", "--profile", "hl4", "--scale", SCALE, "--limiter", "auto",
         "--out", str(job), *job_args(6, 3072)],
        capture_output=True, text=True, timeout=120,
    )
    assert written.returncode == 0, written.stderr
    job_id = slurm_follow.submit(job / slurm.SCRIPT_NAME)
    jobs.append(job_id)
    deadline = time.monotonic() + 300
    while not list((job / slurm.CHECKPOINTS).glob("ckpt-*.pt")):
        state = slurm_follow.query(job_id)
        assert state is None or not state.ended, f"the job ended before its first checkpoint: {state}"
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        time.sleep(0.5)
    requeued = subprocess.run(["scontrol", "requeue", str(job_id)], capture_output=True, text=True, timeout=30)
    assert requeued.returncode == 0, requeued.stderr

    out = StringIO()
    code = slurm_follow.follow(job_id, job, out, poll_s=1.0)
    followed = out.getvalue()
    assert code == 0, followed
    assert f"job {job_id}: COMPLETED, exit status 0" in followed and "requeued 1x" in followed
    (resumed,) = events(job, "resume")
    assert resumed["epoch"] >= 1
    finished = [s for s in events(job, "summary") if s["reason"] == "finished"]
    assert len(finished) == 1 and finished[0]["epochs"] == 6, events(job, "summary")
    assert finished[0]["accuracy"] >= 0.6
    check_plans(job)
    output = next(job.glob("slurm-*.out")).read_text(encoding="utf-8")
    assert "run 2," in output and "resuming from the newest checkpoint" in output
    assert "resuming from" in (job / "server.log").read_text(encoding="utf-8")
