"""Smoke tests of the transport benchmark (``benchmarks.transport``): it runs end to end, reports every
field, and leaves no process behind, also when it is stopped half way.

Benchmarks are not tests: nothing here asserts a throughput or a target's pass/fail. The smoke run uses
``--tiny`` (1e5 parameters, one repeat, few processes); most of its time is processes importing torch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.transport.cli import build_parser, main, resolve_defaults
from benchmarks.transport.job import tiny_dataset
from benchmarks.transport.profiling import summarize_profile
from benchmarks.transport.report import add_ratios, combine_rounds, evaluate_targets
from benchmarks.transport.stats import iterations_for, stats
from tests.repo import ROOT

REPORT_KEYS = {"benchmark", "tiny", "environment", "settings", "definitions", "rows", "server_overhead", "profile",
               "shards", "targets", "timings_s"}
ROW_KEYS = {"benchmark", "numel", "wire_dtype", "processes", "workers", "bytes_per_iter", "iterations", "median_ms",
            "p90_ms", "mean_ms", "mb_per_s", "params_per_s", "ratio_to_grpc_ceiling", "ratio_to_torch_rpc",
            "ratio_to_torch_rpc_tcp", "params_per_s_ratio_to_torch_rpc"}
PS_KEYS = {"shards", "ratio_to_one_shard", "mb_per_s_per_worker", "per_worker_mb_per_s", "params_per_s_per_worker",
           "ratio_to_grpc_ceiling_per_worker", "params_per_s_per_worker_ratio_to_torch_rpc"}
OVERHEAD_KEYS = {"method", "numel", "workers", "iterations", "median_ms", "p90_ms"}
TARGET_KEYS = {"name", "value", "op", "threshold", "pass", "source"}


def processes_mentioning(text: str) -> list[int]:
    """Pids of live processes whose command line contains `text` (every child gets a path in --out)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            pids.append(int(entry.name))
    return pids


def bench(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "benchmarks.transport", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc to look for leftover processes")
def test_tiny_run_reports_every_field(tmp_path: Path) -> None:
    started = time.monotonic()
    out = tmp_path / "out"
    proc = bench("--tiny", "--json", "--out", str(out))
    try:
        stdout, stderr = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the benchmark stops its children on SIGTERM
        stdout, stderr = proc.communicate(timeout=30)
        raise AssertionError(f"benchmark timed out:\n{stderr[-3000:]}") from None
    assert proc.returncode == 0, stderr[-3000:]
    report, end = json.JSONDecoder().raw_decode(stdout)
    table = stdout[end:]
    assert json.loads((out / "transport.json").read_text()) == report
    assert (out / "transport.md").read_text().strip() == table.strip()

    assert REPORT_KEYS <= set(report)
    assert report["tiny"] is True and report["settings"]["sizes"] == [100_000]
    assert report["shards"]["counts"] == [1, 2] and "CPUs" in report["shards"]["note"]
    assert report["profile"] is None
    rows = report["rows"]
    for row in rows:
        assert ROW_KEYS <= set(row), (row["benchmark"], ROW_KEYS - set(row))
        assert row["numel"] == 100_000 and row["mb_per_s"] > 0 and row["params_per_s"] > 0
        assert row["iterations"] >= 1 and 0 < row["median_ms"] <= row["p90_ms"]
    kinds = {(r["benchmark"], r["wire_dtype"], r["workers"], r.get("shards")) for r in rows}
    assert {("grpc_stream_echo", "float32", 1, None), ("grpc_unary_echo", "float32", 1, None),
            ("torch_rpc", "float32", 1, None), ("ps_push_pull", "float32", 1, 1), ("ps_push_pull", "float32", 2, 1),
            ("ps_push_pull", "bfloat16", 1, 1), ("ps_push_pull", "float32", 2, 2),
            ("gloo_allreduce", "float32", 2, None)} <= kinds
    # --tiny shards only the largest worker count, fp32
    assert [(r["wire_dtype"], r["workers"]) for r in rows if r.get("shards", 1) > 1] == [("float32", 2)]

    echo = next(r for r in rows if r["benchmark"] == "grpc_stream_echo")
    assert echo["ratio_to_grpc_ceiling"] == 1.0 and echo["bytes_per_iter"] == 2 * 4 * 100_000
    for r in (r for r in rows if r["benchmark"] == "ps_push_pull"):
        assert PS_KEYS <= set(r)
        assert len(r["per_worker_mb_per_s"]) == r["workers"] and r["processes"] == r["workers"] + r["shards"]
        assert (r["ratio_to_one_shard"] == 1.0) == (r["shards"] == 1) and r["ratio_to_one_shard"] > 0
        width = 4 if r["wire_dtype"] == "float32" else 2
        assert r["bytes_per_iter"] == 2 * width * 100_000
        assert r["ratio_to_grpc_ceiling"] is not None and r["params_per_s_ratio_to_torch_rpc"] is not None
    for r in (r for r in rows if r["benchmark"] in ("grpc_stream_echo", "ps_push_pull")):
        cpu = r["cpu_ms_per_step"]  # the server's from /proc in 10 ms ticks: 0 is possible over a tiny run
        assert cpu["client"] > 0 and cpu["server"] is not None and cpu["server"] >= 0 and r["cores_busy"] > 0
    gloo = next(r for r in rows if r["benchmark"] == "gloo_allreduce")
    assert gloo["algbw_mb_per_s"] > 0 and "bus bandwidth" in gloo["note"]

    overhead = report["server_overhead"]
    for key in ("inprocess", "outside"):
        assert OVERHEAD_KEYS <= set(overhead[key])
        assert overhead[key]["workers"] == 4 and overhead[key]["numel"] <= 1_000_000
    assert overhead["inprocess"]["median_ms"] > 0
    assert set(overhead["inprocess"]["components_median_ms"]) == {
        "last_push_finish", "close_round", "payload_encode", "reply_serialize_all_workers"}

    targets = report["targets"]
    assert len(targets) == 4
    for t in targets:
        assert TARGET_KEYS <= set(t)
        assert isinstance(t["pass"], bool) and t["value"] is not None
    assert [t["op"] for t in targets] == [">=", ">=", ">=", "<="]
    sharded = next(r for r in rows if r.get("shards") == 2)
    assert "2 shards" in targets[2]["name"] and targets[2]["value"] == sharded["ratio_to_one_shard"]
    assert "| benchmark |" in table and "| shards |" in table and "| target |" in table and "| CPU per step |" in table
    assert processes_mentioning(str(out)) == []
    print(f"transport smoke run took {time.monotonic() - started:.1f} s")


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc to look for leftover processes")
def test_sigterm_stops_every_child(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = bench("--tiny", "--benchmarks", "ps_push_pull", "--workers", "1", "--wire-dtypes", "float32",
                 "--repeats", "1000", "--out", str(out))
    try:
        deadline = time.monotonic() + 60
        while not list(out.glob("*ps-client*.log")) or len(processes_mentioning(str(out))) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=10)[1][-3000:]
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    deadline = time.monotonic() + 5
    while processes_mentioning(str(out)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_mentioning(str(out)) == []


def test_help_and_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    text = subprocess.run([sys.executable, "-m", "benchmarks.transport", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert text.returncode == 0
    for flag in ("--sizes", "--repeats", "--tiny", "--json", "--profile"):
        assert flag in text.stdout
    for bad, flag in ((["--sizes", "lots"], "--sizes"), (["--benchmarks", "carrier_pigeon"], "--benchmarks"),
                      (["--overhead-params", "5e6"], "--overhead-params"), (["--rounds", "0"], "--rounds")):
        with pytest.raises(SystemExit) as exit_info:
            main(bad)
        assert exit_info.value.code == 2 and flag in capsys.readouterr().err


# ------------------------------------------------------------------ pure parts, on fixed inputs
def test_flat_model_and_dataset_match_the_job_contract() -> None:
    from common.job.datasets import Dataset
    from common.job.models import build_model

    data = tiny_dataset(0, size=64)
    assert isinstance(data, Dataset) and len(data.train_x) == 64
    model = build_model("benchmarks.transport.job:flat_model", data.input_shape, data.num_classes, {"numel": 1000}, 0)
    assert sum(p.numel() for p in model.parameters()) == 1000
    assert model(data.test_x).shape == (len(data.test_x), data.num_classes)


def _row(benchmark: str, numel: int, mb: float, **extra: Any) -> dict[str, Any]:
    return {"benchmark": benchmark, "numel": numel, "mb_per_s": mb, "params_per_s": mb * 1e6 / 4, **extra}


def test_ratios_and_targets() -> None:
    n = 25_000_000
    rows = [
        _row("grpc_stream_echo", n, 1000.0),
        _row("torch_rpc", n, 2000.0),
        _row("torch_rpc_tcp", n, 500.0),
        _row("ps_push_pull", n, 850.0, wire_dtype="float32", workers=1, shards=1, mb_per_s_per_worker=850.0,
             params_per_s_per_worker=850e6 / 4),
        {**_row("ps_push_pull", n, 600.0, wire_dtype="bfloat16", workers=1, shards=1, mb_per_s_per_worker=600.0,
                params_per_s_per_worker=600e6 / 2), "params_per_s": 600e6 / 2},
        _row("ps_push_pull", n, 1200.0, wire_dtype="float32", workers=4, shards=1, mb_per_s_per_worker=300.0,
             params_per_s_per_worker=300e6 / 4),
        _row("ps_push_pull", n, 1500.0, wire_dtype="float32", workers=4, shards=2, mb_per_s_per_worker=375.0,
             params_per_s_per_worker=375e6 / 4),
    ]
    add_ratios(rows)
    assert rows[3]["ratio_to_grpc_ceiling"] == 0.85 and rows[3]["ratio_to_torch_rpc"] == 0.425
    assert rows[4]["params_per_s_ratio_to_torch_rpc"] == 0.6  # 300 M params/s against 500 M
    assert [r["ratio_to_one_shard"] for r in rows[3:]] == [1.0, 1.0, 1.0, 1.25]  # each against its own 1-shard run
    targets = evaluate_targets(rows, {"inprocess": {"median_ms": 2.5, "numel": 1_000_000}}, [n])
    assert [(t["value"], t["pass"]) for t in targets] == [(0.85, True), (0.6, False), (1.25, False), (2.5, False)]
    # the bf16 row is not the fp32 one's 1-shard base; the shard target reads the 4-worker pair only
    assert "4 workers" in targets[2]["name"] and "2 shards" in targets[2]["name"]
    # a size that was not measured gives no value and no verdict, not a failure
    assert evaluate_targets([], None, [n])[0]["pass"] is None


def test_rounds_combine_to_the_median_round_and_the_median_ratio() -> None:
    """--rounds: each row is its median-MB/s round, each ratio the median of the rounds' own ratios."""
    n = 25_000_000

    def sweep(echo: float, ps: float) -> list[dict[str, Any]]:
        rows = [_row("grpc_stream_echo", n, echo),
                _row("ps_push_pull", n, ps, wire_dtype="float32", workers=1, shards=1, mb_per_s_per_worker=ps,
                     params_per_s_per_worker=ps * 1e6 / 4)]
        add_ratios(rows)
        return rows

    # a slow round slows both sides; its ratio stays in line
    combined = combine_rounds([sweep(1000.0, 800.0), sweep(500.0, 420.0), sweep(1200.0, 900.0)])
    echo, ps = combined
    assert echo["mb_per_s"] == 1000.0 and echo["rounds_mb_per_s"] == [1000.0, 500.0, 1200.0]
    assert ps["mb_per_s"] == 800.0 and ps["ratio_to_grpc_ceiling_rounds"] == [0.8, 0.84, 0.75]
    assert ps["ratio_to_grpc_ceiling"] == 0.8  # the median of the rounds' ratios
    assert combine_rounds([sweep(1.0, 1.0)]) == sweep(1.0, 1.0)
    with pytest.raises(ValueError):
        combine_rounds([sweep(1.0, 1.0), sweep(1.0, 1.0)[:1]])
    with pytest.raises(ValueError):
        combine_rounds([sweep(1.0, 1.0), list(reversed(sweep(1.0, 1.0)))])


def test_cpu_time_reads_processes_and_sums_a_row() -> None:
    from benchmarks.cpu_time import CpuWindow, cpu_fields, process_cpu_s

    if Path("/proc/self/stat").exists():
        window = CpuWindow(os.getpid())
        window.start()
        deadline = time.process_time() + 0.05
        while time.process_time() < deadline:
            pass
        window.stop()
        assert window.own_s >= 0.05 and window.other_s is not None and window.other_s >= 0
    assert process_cpu_s(2**22 + 1) is None  # above Linux's largest pid
    assert CpuWindow().other_s is None
    fields = cpu_fields(0.5, [0.2, 0.4], [10, 20], 1.0)
    assert fields == {"cpu_ms_per_step": {"server": 50.0, "client": 20.0}, "cores_busy": 1.1}
    assert cpu_fields(None, [0.2], [10], 1.0) == {"cpu_ms_per_step": {"server": None, "client": 20.0}, "cores_busy": None}


def test_iterations_and_stats() -> None:
    assert iterations_for(100_000_000, 5) == 5
    assert iterations_for(1_000_000, 5) == 50
    assert iterations_for(100_000, 1) == 10
    s = stats([0.001 * i for i in range(1, 11)])
    assert s["median_ms"] == 5.5 and s["p90_ms"] == 9.0


STACKS = (
    "thread (1): MainThread;run (uvloop/__init__.py:92);finish (common/transport/wire.py:148);abs_kernel (libtorch_cpu.so) 6",
    "thread (1): MainThread;run (uvloop/__init__.py:92);epoll_pwait (libc.so.6) 3",
    "thread (1): MainThread;run (uvloop/__init__.py:92);feed (common/transport/wire.py:141);0x7f00 (libc.so.6) 1",
    "thread (2): Thread-1 (_poll_wrapper);epoll_wait (libc.so.6) 10",
)


def test_profile_summary_groups_by_python_function() -> None:
    summary = summarize_profile("\n".join(STACKS))
    assert summary["samples"] == 20 and summary["main_thread_samples"] == 10
    assert summary["threads_pct"] == {"MainThread": 50.0, "Thread-1 (_poll_wrapper)": 50.0}
    functions = {f["function"]: f["pct"] for f in summary["main_thread_by_function"]}
    assert functions == {"finish (common/transport/wire.py)": 60.0, "<idle: epoll>": 30.0, "feed (common/transport/wire.py)": 10.0}
    assert summary["main_thread_by_line"][0] == {"line": "finish (common/transport/wire.py:148)", "pct": 60.0}


def test_shard_runs_follow_their_one_shard_run() -> None:
    def runs(*argv: str) -> list[tuple[str, int, int]]:
        args = build_parser().parse_args(list(argv))
        resolve_defaults(args)
        return args.ps_runs

    assert runs() == [("float32", 1, 1), ("float32", 1, 2), ("float32", 2, 1), ("float32", 2, 2), ("float32", 4, 1),
                      ("float32", 4, 2), ("bfloat16", 1, 1), ("bfloat16", 2, 1), ("bfloat16", 4, 1)]
    assert runs("--tiny") == [("float32", 1, 1), ("float32", 2, 1), ("float32", 2, 2), ("bfloat16", 1, 1)]
    assert runs("--shards", "1", "--wire-dtypes", "float32") == [("float32", 1, 1), ("float32", 2, 1), ("float32", 4, 1)]
    assert runs("--shards", "2", "--workers", "4", "--wire-dtypes", "bfloat16") == [("bfloat16", 4, 2)]


def test_server_work_benchmark_reports_every_row_and_refuses_bad_flags(tmp_path, capsys) -> None:
    """benchmarks.server_work runs the server's real cores on a tiny model (no throughput asserted)."""
    from benchmarks import server_work

    assert server_work.main(["--sizes", "3000,70000", "--wire-dtypes", "float32,bfloat16", "--steps", "2",
                             "--momentum", "0.9", "--json", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    report = json.JSONDecoder().raw_decode(text)[0]
    assert [(r["numel"], r["wire_dtype"]) for r in report["rows"]] == [
        (3000, "float32"), (3000, "bfloat16"), (70000, "float32"), (70000, "bfloat16")]
    for row in report["rows"]:
        assert row["steps"] == 2 and row["momentum"] == 0.9
        assert row["median_ms"] > 0 and row["copy_ms"] > 0 and row["copies"] > 0 and row["params_per_s"] > 0
    assert "| 70,000 | bfloat16 |" in text
    assert json.loads((tmp_path / "server_work.json").read_text())["rows"] == report["rows"]
    for bad in (["--steps", "0"], ["--sizes", "x"], ["--wire-dtypes", "int8"], ["--momentum", "1"]):
        with pytest.raises(SystemExit) as exc:
            server_work.main(bad)
        assert exc.value.code == 2
