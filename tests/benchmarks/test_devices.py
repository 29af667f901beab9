"""Smoke test of the device benchmark (`python -m benchmarks.devices`). Without a GPU its "GPU"
worker is a CPU worker (`--gpu-device cpu`); the figures on an H100 are in docs/benchmarks.md."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.devices import plan, report
from tests.repo import ROOT



def test_scenarios_pick_devices_controller_and_transport() -> None:
    assert plan("cpu", 3) == (["--controller", "uniform", "--allreduce", "off"], ["cpu"])
    assert plan("gpu", 3) == (["--controller", "uniform", "--allreduce", "off"], ["gpu"])
    assert plan("gpu_allreduce", 3) == (["--controller", "uniform", "--allreduce", "on"], ["gpu"])
    assert plan("mixed_dynamic_allreduce", 2) == (["--controller", "dynamic", "--allreduce", "on"], ["gpu", "cpu", "cpu"])


def test_ideal_is_the_gpu_plus_each_cpu_worker_alone() -> None:
    records = {n: {"samples_per_s": r} for n, r in [("cpu", 10.0), ("gpu", 100.0), ("mixed_dynamic", 65.0), ("mixed_uniform", 26.0)]}
    result = report(records, 3)
    assert result["ideal_samples_per_s"] == 130.0
    assert result["ratios"] == {"gpu_to_cpu": 10.0, "mixed_dynamic_to_uniform": 2.5, "mixed_dynamic_to_ideal": 0.5}


@pytest.mark.slow
def test_runs_end_to_end_and_reports_each_scenario() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.devices", "--gpu-device", "cpu", "--scenarios", "cpu,mixed_dynamic_allreduce",
         "--epochs", "1", "--dataset-size", "512", "--global-batch", "128", "--cpu-workers", "1", "--cpu-threads", "1", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out, _ = json.JSONDecoder().raw_decode(result.stdout)
    cpu, mixed = out["scenarios"]
    assert (cpu["scenario"], cpu["devices"], cpu["backend"], cpu["batch_sizes"]) == ("cpu", ["cpu"], None, {"cpu0": 128})
    assert (mixed["devices"], mixed["backend"], sum(mixed["batch_sizes"].values())) == (["gpu", "cpu"], "gloo", 128)
    assert all(r["samples_per_s"] > 0 and r["accuracy"] is not None for r in (cpu, mixed))


def test_bad_arguments_change_nothing_and_say_why() -> None:
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "benchmarks.devices", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=60, check=False)

    assert "unknown scenario" in run("--scenarios", "cpu,fastest").stderr
    assert "expected a whole number > 0" in run("--epochs", "0").stderr
    assert "--device must be" in run("--gpu-device", "tpu").stderr
