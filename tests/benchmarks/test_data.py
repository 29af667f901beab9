"""benchmarks.data, run small: each figure against its baseline."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_the_data_benchmark_reports_each_figure_against_its_baseline() -> None:
    out = subprocess.run([sys.executable, "-m", "benchmarks.data", "--files", "300", "--image-size", "8", "--batch", "16",
                          "--cnn-steps", "5", "--memory-files", "60", "--memory-image-side", "64"],
                         capture_output=True, text=True, timeout=300, check=True)
    report = json.loads(out.stdout)
    assert report["files"] == 300 and report["throughput"]["samples"] == 4 * ((240 // 16 - 1) // 4) * 16
    assert report["throughput"]["ours_samples_per_s"] > 0 and report["throughput"]["dataloader_samples_per_s"] > 0
    assert 0 <= report["cnn_step"]["wait_fraction"] <= 1 and report["cnn_step"]["steps"] == 4
    assert report["memory"]["folder_mb"] > 0 and report["memory"]["trainer_peak_rss_mb"] > 0
    assert [t["name"] for t in report["targets"]] and all(isinstance(t["pass"], bool) for t in report["targets"])
