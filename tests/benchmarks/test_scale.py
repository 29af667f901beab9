"""The scale benchmark: its flags, the fields it computes from /proc, and a smoke run of a real
ps-server and 4 real ps-worker processes, BSP, ASP and BSP with --shards 2.

The smoke runs go side by side (each on its own free port) so that their idle waits overlap: each
worker spends a few CPU-seconds importing torch, which is most of the time on a small machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import scale

WORKERS = 4
RUNS = {"bsp": ("bsp", 8, 1), "asp": ("asp", 40, 1), "bsp-shards": ("bsp", 8, 2)}  # run -> mode, target steps, shards


def settings(tmp_path: Path, **changes: object) -> scale.Settings:
    base = scale.Settings(workers=4, mode="bsp", rounds=5, global_batch=32, hidden=32, adjust_every=5, evict_after=120.0,
                          startup_timeout=60.0, run_timeout=60.0, poll=0.05, workdir=tmp_path)
    for name, value in changes.items():
        setattr(base, name, value)
    return base


def test_shards_default_to_one_server_and_reach_the_server_only_when_sharded(tmp_path: Path) -> None:
    assert scale.build_parser().parse_args([]).shards == 1
    assert scale.build_parser().parse_args(["--shards", "3"]).shards == 3
    dense = scale.server_argv(settings(tmp_path), tmp_path / "port", tmp_path / "metrics.jsonl")
    sharded = scale.server_argv(settings(tmp_path, shards=2), tmp_path / "port", tmp_path / "metrics.jsonl")
    assert "--shards" not in dense
    assert sharded[sharded.index("--shards") + 1] == "2"


@pytest.mark.parametrize("argv", [["--shards", "0"], ["--shards", "two"], ["--workers", "0"], ["--shards", "17"],
                                  ["--shards", "100000"]])
def test_a_bad_flag_is_one_line_and_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        scale.main(argv)
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("python -m benchmarks.scale: error:")


@pytest.mark.parametrize(("argv", "message"), [
    (["--workers", "8", "--global-batch", "4"], "--global-batch 4 is below --workers 8"),
    (["--mode", "asp", "--shards", "2"], "--shards 2 needs --mode bsp (ps-server shards BSP jobs only)"),
])
def test_flags_the_server_would_refuse_read_as_argparses_and_exit_2(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """They read 'scale: error: ...' with no usage line, unlike every other refusal of the flags."""
    with pytest.raises(SystemExit) as info:
        scale.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and err[0].startswith("usage: python -m benchmarks.scale")
    assert err[-1] == f"python -m benchmarks.scale: error: {message}"


def test_shards_are_capped_at_the_documented_most() -> None:
    """--shards 100000 was taken: the server would have started 99,999 ps-shard processes."""
    assert scale.build_parser().parse_args(["--shards", str(scale.MAX_SHARDS)]).shards == scale.MAX_SHARDS == 16
    with pytest.raises(SystemExit):
        scale.build_parser().parse_args(["--shards", str(scale.MAX_SHARDS + 1)])


def test_the_target_counts_errors_and_evictions() -> None:
    clean = scale.failure_target({"errors": [], "evictions": 0})
    assert (clean["value"], clean["pass"], clean["op"], clean["threshold"]) == (0, True, "<=", 0)
    failed = scale.failure_target({"errors": ["w01 exited with 1"], "evictions": 2})
    assert (failed["value"], failed["pass"]) == (3, False)
    assert scale.failure_target({"errors": ["no server"], "evictions": None})["value"] == 1


def test_the_decision_trace_is_each_window_between_two_decisions() -> None:
    """The plan in force between two `adjust` events of the window, the times the second measured it
    at and the mean round on the server's clock; decisions outside the window are left out."""
    events = [
        {"event": "adjust", "step": 2, "time": 9.0, "batch_sizes": {"w00": 8, "w01": 8}, "compute_ms": {}},
        {"event": "adjust", "step": 5, "time": 10.0, "batch_sizes": {"w00": 8, "w01": 8}, "compute_ms": {"w00": 40.0, "w01": 80.0}},
        {"event": "epoch", "step": 7, "time": 10.5},
        {"event": "adjust", "step": 10, "time": 11.0, "batch_sizes": {"w00": 11, "w01": 5}, "compute_ms": {"w00": 41.0, "w01": 79.0}},
        {"event": "adjust", "step": 15, "time": 11.5, "batch_sizes": {"w00": 11, "w01": 5}, "compute_ms": {"w00": 55.0, "w01": 50.0}},
    ]
    trace = scale.decision_trace(events, 5, 15)
    assert trace == [
        {"step": 10, "batch_sizes": {"w00": 8, "w01": 8}, "compute_ms": {"w00": 41.0, "w01": 79.0}, "round_ms": 200.0},
        {"step": 15, "batch_sizes": {"w00": 11, "w01": 5}, "compute_ms": {"w00": 55.0, "w01": 50.0}, "round_ms": 100.0},
    ]


@pytest.mark.slow
def test_scale_benchmark_smoke() -> None:
    procs = {
        run: subprocess.Popen(
            [sys.executable, "-m", "benchmarks.scale", "--workers", str(WORKERS), "--mode", mode, "--rounds", str(steps),
             "--shards", str(shards), "--startup-timeout", "200", "--run-timeout", "60", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for run, (mode, steps, shards) in RUNS.items()
    }
    try:
        outputs = {run: proc.communicate(timeout=300) for run, proc in procs.items()}
    finally:
        for proc in procs.values():  # the benchmark stops its own children when it is terminated
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)
    for run, (stdout, stderr) in outputs.items():
        assert procs[run].returncode == 0, f"{run}: exit {procs[run].returncode}\nstdout:\n{stdout}\nstderr:\n{stderr[-3000:]}"
        report = json.loads(stdout)
        mode, steps, shards = RUNS[run]
        unit = "rounds" if mode == "bsp" else "updates"
        assert (report["workers"], report["mode"], report[unit], report["shards"]) == (WORKERS, mode, steps, shards)
        assert report["errors"] == [] and report["evictions"] == 0
        assert report["global_batch"] >= WORKERS
        assert report["wall_s"] > 0 and report[f"{unit}_per_s"] > 0 and report["measured_steps"] >= 1
        assert report["startup_s"] > 0 and report["shutdown_s"] >= 0
        assert report["server_peak_rss_mb"] is None or report["server_peak_rss_mb"] > 0
        assert "workdir" not in report  # the temporary directory is removed
        assert report["server_cpu_s"] > 0 and report["server_cpu_ms_per_push"] > 0
        assert (report["server_cpu_ms_per_round"] is not None) == (mode == "bsp")
        assert len(report["shard_cpu_s"]) == len(report["shard_peak_rss_mb"]) == shards - 1
        assert report["worker_peak_rss_mb"]["max"] >= report["worker_peak_rss_mb"]["mean"] > 0
        assert report["worker_pss_mb_mean"] > 0
        assert [t["pass"] for t in report["targets"]] == [True]
        assert ("trace" in report) == (mode == "bsp") and report["adjust_every"] == 5
