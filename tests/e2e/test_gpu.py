"""Workers on a GPU (`ps-worker --device cuda`): real processes; skipped where torch sees no CUDA device.

One GPU is what the lent test machine has, and NCCL refuses two ranks on one GPU: one worker forms
an NCCL group (world size 1: the whole fast path, NCCL init, the bucket on the GPU, the sync
broadcast), and two workers on the same GPU must get a gloo group instead of a group that never forms.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ps.checkpoint import checkpoint_files, read_checkpoint
from tests.processes import ENV, start_server
from tests.fast_path_jobs import JOB, finish

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
# the fast path's workers draw their own batches (docs/data.md), so both paths sample independently
GPU_JOB = [*JOB, "--global-batch", "64", "--epochs", "2", "--lr-milestones", "1", "--momentum", "0.9", "--nesterov",
           "--weight-decay", "1e-4", "--sampling", "independent"]


def _run_job(workdir: Path, server_args: list[str], devices: list[str]) -> tuple[list[dict], dict[str, dict], list[str]]:
    """Run a job to its end: (metrics events, checkpoints by file name, each worker's output)."""
    workdir.mkdir()
    cluster = start_server(workdir, [*GPU_JOB, "--workers", str(len(devices)), "--checkpoint-dir", str(workdir / "ckpt"),
                                     *server_args])
    outputs = []
    try:
        for i, device in enumerate(devices):
            proc = subprocess.Popen(  # not --quiet: the worker says where it computes
                [sys.executable, "-m", "worker.cli", "--server", cluster.target, "--name", f"w{i}", "--device", device,
                 "--log-every", "1000"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV,
            )
            cluster.workers.append(proc)
        finish(cluster, 240)
        outputs = [proc.communicate(timeout=30)[0] for proc in cluster.workers]
        return cluster.events(), {p.name: read_checkpoint(p) for p in checkpoint_files(workdir / "ckpt")}, outputs
    finally:
        cluster.stop()


def test_nccl_fast_path_on_a_gpu_equals_the_ps_path_on_a_gpu(tmp_path: Path) -> None:
    """The same job, one GPU worker each way: the fast path over NCCL and the PS path end with the
    same parameters (to 1e-5) after every epoch. The fast path is the default's (--allreduce auto)
    choice for a worker on a GPU of its own; the PS path is pinned with --allreduce off."""
    events, fast, out = _run_job(tmp_path / "nccl", [], ["cuda"])
    assert "on cuda:0" in out[0], out[0]
    (path,) = [e for e in events if e["event"] == "path"]
    assert (path["allreduce"], path["why"]) == (True, "every worker computes on a GPU of its own"), path
    (regroup,) = [e for e in events if e["event"] == "regroup"]
    assert (regroup["backend"], regroup["why"]) == ("nccl", "")
    _, ps, out = _run_job(tmp_path / "ps", ["--allreduce", "off"], ["cuda"])
    assert "on cuda:0" in out[0], out[0]
    assert fast.keys() == ps.keys() and len(ps) == 2
    for name in ps:
        assert (fast[name]["round"], fast[name]["samples"]) == (ps[name]["round"], ps[name]["samples"])
        torch.testing.assert_close(fast[name]["params"], ps[name]["params"], rtol=0, atol=1e-5)


@pytest.mark.parametrize(("devices", "why"), [(["cuda", "cuda"], "share GPU"), (["cuda", "cpu"], "1 of 2 workers have no GPU")])
def test_workers_without_a_gpu_each_fall_back_to_gloo(tmp_path: Path, devices: list[str], why: str) -> None:
    events, ckpts, out = _run_job(tmp_path / "run", ["--allreduce"], devices)
    (regroup,) = [e for e in events if e["event"] == "regroup"]
    assert regroup["backend"] == "gloo" and why in regroup["why"], regroup
    (summary,) = [e for e in events if e["event"] == "summary"]
    assert summary["reason"] == "finished" and summary["epochs"] == 2, summary
    assert all(f"on {torch.device(d if d == 'cpu' else 'cuda:0')}" in o for d, o in zip(devices, out)), out
    assert bool(torch.isfinite(read_checkpoint(checkpoint_files(tmp_path / "run" / "ckpt")[-1])["params"]).all())


def test_the_measured_max_batch_fits_and_is_within_a_tenth_of_what_fits() -> None:
    """worker/data/memory_probe.py on the GPU against real steps until out of memory (benchmarks.memory_bound)."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.memory_bound"], capture_output=True, text=True, env=ENV,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["met"], report
    assert report["measured_b_max"] <= report["largest_fitting"], report  # a worker planned its b_max does not run out
