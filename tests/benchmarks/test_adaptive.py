"""benchmarks.adaptive (time to accuracy, adaptive B against fixed ones) and benchmarks.gns_server
(the server's own noise scale against brute force), run small."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks import adaptive
from tests.processes import ENV


def test_the_arms_are_each_fixed_b_and_the_adaptive_run_within_them() -> None:
    task = adaptive.TASKS["digits"]
    arms = adaptive.arms(task)
    assert [a for a in arms if a.startswith("fixed_")] == [f"fixed_{b}" for b in task.batches]
    small, medium, large = task.batches
    flags = arms["adaptive"]
    assert flags[flags.index("--global-batch") + 1] == str(medium)
    assert (flags[flags.index("--min-global-batch") + 1], flags[flags.index("--max-global-batch") + 1]) == (str(small), str(large))
    assert arms["adaptive_sqrt"][-2:] == ["--lr-scaling", "sqrt"]


@pytest.mark.slow
def test_a_tiny_adaptive_benchmark_reports_every_arm_and_its_targets() -> None:
    out = subprocess.run([sys.executable, "-m", "benchmarks.adaptive", "--tiny", "--tasks", "digits", "--seeds", "0",
                          "--epochs", "2", "--json"], capture_output=True, text=True, env=ENV, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    runs = report["tasks"]["digits"]["seeds"]["0"]["runs"]
    assert set(runs) == {"fixed_32", "fixed_128", "fixed_512", "adaptive"}
    assert runs["adaptive"]["batches"] and all(32 <= b <= 512 for b in runs["adaptive"]["batches"])
    assert [t["op"] for t in report["targets"]] == ["<=", "<="]
    bad = subprocess.run([sys.executable, "-m", "benchmarks.adaptive", "--tasks", "imagenet"], capture_output=True,
                         text=True, env=ENV, timeout=60, check=False)
    assert bad.returncode == 2 and "unknown ['imagenet']" in bad.stderr


@pytest.mark.slow
def test_the_servers_noise_scale_is_compared_with_brute_force_at_frozen_weights() -> None:
    out = subprocess.run([sys.executable, "-m", "benchmarks.gns_server", "--dataset-arg", "size=2048",
                          "--model-arg", "hidden=32", "--global-batch", "64", "--points", "1", "--freeze-epochs", "1",
                          "--frozen-rounds", "20", "--json"], capture_output=True, text=True, env=ENV, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    report, _ = json.JSONDecoder().raw_decode(out.stdout)
    (point,) = report["points"]
    assert [point["split"][f"w{k}"] for k in range(4)] == [8, 8, 5, 43]  # the static split of 64 by cores 6/6/4/32
    assert point["rounds"] >= 40 and point["true_b_noise"] > 0 and point["phi"] is not None
    assert point["server_ratio"] == round(point["phi"] / point["true_b_noise"], 4)
