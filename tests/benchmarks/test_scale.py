"""Smoke run of the scale benchmark: a real ps-server and 4 real ps-worker processes, BSP and ASP.

The two runs go side by side (each on its own free port) so that their idle waits overlap: each
worker spends a few CPU-seconds importing torch, which is most of the time on a small machine.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

WORKERS = 4
RUNS = {"bsp": 8, "asp": 40}  # mode -> target rounds / updates


@pytest.mark.slow
def test_scale_benchmark_smoke() -> None:
    procs = {
        mode: subprocess.Popen(
            [sys.executable, "-m", "benchmarks.scale", "--workers", str(WORKERS), "--mode", mode, "--rounds", str(steps),
             "--startup-timeout", "150", "--run-timeout", "60", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for mode, steps in RUNS.items()
    }
    try:
        outputs = {mode: proc.communicate(timeout=240) for mode, proc in procs.items()}
    finally:
        for proc in procs.values():  # the benchmark stops its own children when it is terminated
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)
    for mode, (stdout, stderr) in outputs.items():
        assert procs[mode].returncode == 0, f"{mode}: exit {procs[mode].returncode}\nstdout:\n{stdout}\nstderr:\n{stderr[-3000:]}"
        report = json.loads(stdout)
        unit = "rounds" if mode == "bsp" else "updates"
        assert (report["workers"], report["mode"], report[unit]) == (WORKERS, mode, RUNS[mode])
        assert report["errors"] == [] and report["evictions"] == 0
        assert report["global_batch"] >= WORKERS
        assert report["wall_s"] > 0 and report[f"{unit}_per_s"] > 0 and report["measured_steps"] >= 1
        assert report["startup_s"] > 0 and report["shutdown_s"] >= 0
        assert report["server_peak_rss_mb"] is None or report["server_peak_rss_mb"] > 0
        assert "workdir" not in report  # the temporary directory is removed
