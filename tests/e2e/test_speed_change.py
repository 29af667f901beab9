"""A change of speed in a real job: `ps-cluster run` on a schedule whose two phases swap two workers'
CPU quotas (cgroups, so the kernel changes the speeds while the processes run), under the default
batch policy. The plan must follow: the fast worker carries more of the batch before the swap; after
it the sped-up worker carries half as much again or more and the slowed one less, within a few
decisions of the switch. Skips where no cgroup CPU controller is writable (the slowdown fallback
cannot change a speed mid-run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.cgroups import detect_backend
from ps.ops.metrics import read_metrics
from tests.emulator_jobs import write_profile
from tests.processes import ENV

JOB = ["--model", "mlp", "--model-arg", "hidden=512", "--dataset", "synthetic", "--dataset-arg", "size=2048",
       "--dataset-arg", "image_size=16", "--dataset-arg", "channels=3", "--global-batch", "128", "--lr", "0.05"]
"""Steps of tens of ms at a quarter of a core: the compute, not the round's fixed cost, sets the split."""
EVERY = 4
"""Epochs per phase."""


@pytest.mark.skipif(detect_backend() is None, reason="no writable cgroup CPU controller (root with cgroup v1 or v2)")
def test_the_default_policy_follows_a_swap_of_two_workers_speeds(tmp_path: Path) -> None:
    # a third and two thirds of a core: both workers keep a batch (none parked), and swap speeds
    phases = [write_profile(tmp_path / "before.json", [1, 2]), write_profile(tmp_path / "after.json", [2, 1])]
    schedule = tmp_path / "swap.json"
    schedule.write_text(json.dumps({"kind": "schedule", "every_epochs": EVERY, "phases": [str(p) for p in phases]}))
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "deploy.cli", "run", "--out", str(out), "--schedule", str(schedule),
                           "--cpu-budget", "1", *JOB], capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr
    adjusts = [e for e in read_metrics(out / "metrics.jsonl") if e["event"] == "adjust"]
    before = [e for e in adjusts if e["epoch"] < EVERY]
    after = [e for e in adjusts if e["epoch"] >= EVERY]
    assert before[0]["policy"] == "auto", before[0]
    last = before[-1]["batch_sizes"]
    assert last["w1"] > last["w0"], [e["batch_sizes"] for e in before]
    final = after[-1]["batch_sizes"]  # the sped-up worker carries much more, the slowed one less
    assert final["w0"] >= 1.5 * last["w0"] and final["w1"] < last["w1"], \
        [(e["step"], e["batch_sizes"], e.get("phase")) for e in after]
    # the swap is acted on within the phase's first half of decisions (benchmarks.hetero --schedule
    # measures how many it takes against its target of 2)
    moved = [i for i, e in enumerate(after) if e["batch_sizes"]["w0"] > last["w0"]]
    assert moved and moved[0] <= 5, [(e["step"], e["batch_sizes"], e.get("phase")) for e in after]
