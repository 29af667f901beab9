"""benchmarks.round_cpu, run small: real ps-server, ps-worker and DDP processes; every part and the ratio reported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import worker.probes.cpu_parts as cpu_parts
from benchmarks import round_cpu

PARTS = ("process", "data", "compute", "push", "push_copy", "push_check", "push_send", "receive", "copy", "rest")


@pytest.mark.slow
def test_the_round_cpu_benchmark_reports_every_part_next_to_ddp(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "benchmarks.round_cpu", "--cases", "tiny", "--batch", "8", "--warmup", "2",
                    "--rounds", "4", "--fast-path", "--out", str(tmp_path)], capture_output=True, text=True, timeout=180, check=True)
    report = json.loads((tmp_path / "round_cpu.json").read_text(encoding="utf-8"))
    (case,) = report["cases"]
    assert case["case"] == "tiny" and case["rounds"] == 4 and len(case["ps"]["per_worker"]) == 2
    for worker in case["ps"]["per_worker"]:
        assert all(worker[p] >= 0 for p in PARTS if p != "rest"), worker
        assert worker["compute"] > 0 and worker["push_send"] > 0 and worker["receive"] > 0
        assert worker["push"] == pytest.approx(worker["push_copy"] + worker["push_check"] + worker["push_send"], abs=0.003)
        named = sum(worker[p] for p in ("data", "compute", "push", "receive", "copy", "rest"))
        assert named == pytest.approx(worker["process"], abs=0.01)  # the rest is what the parts leave
        assert sum(worker["rest_detail"].values()) == pytest.approx(worker["rest"], abs=0.05)
        assert worker["rest_detail"]["step"] > 0
    assert set(PARTS) <= set(case["ps"]["mean"])
    for rank in case["ddp"]["per_rank"]:
        assert rank["process_cpu_ms"] > rank["solo_fwd_bwd_cpu_ms"] > 0 and rank["steps"] == 4
    assert case["ratio"] > 0 and case["comm_ratio"] > 0
    fast = case["fast_path"]  # --fast-path: the same job on the collective fast path
    assert len(fast["per_worker"]) == 2 and fast["mean"]["compute"] > 0 and fast["mean"]["rest"] > 0
    assert fast["ratio"] == pytest.approx(fast["mean"]["process"] / case["ddp"]["mean"]["process_cpu_ms"], abs=0.002)
    assert [t["value"] for t in report["targets"]] == [case["ratio"], case["comm_ratio"], fast["ratio"]]
    assert (tmp_path / "round_cpu.md").read_text(encoding="utf-8").startswith("| case |")


def test_a_batch_above_a_cases_training_set_is_one_usage_error_before_any_process(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """B = --workers x --batch above a case's training samples, which ps-server would refuse once
    started: exit 2, one line naming the flags and the case's size, and nothing run."""
    monkeypatch.setattr(round_cpu, "ps_run", lambda *_, **__: pytest.fail("a refused case was run"))
    with pytest.raises(SystemExit) as stop:
        round_cpu.main(["--cases", "tiny", "--batch", "128"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err, err
    assert ("error: --workers 2 x --batch 128 = 256 exceeds case tiny's 205 training samples (ps-server refuses a "
            "global batch above them): use --batch 102 or less, or leave tiny out of --cases") in err, err


def test_the_cpu_hooks_are_the_code_itself_when_off() -> None:
    """Without $PS_CPU_PARTS (as every test runs) the worker's probe is the one that does nothing: its
    hooks hand back what they wrap and record nothing."""
    probe = cpu_parts.PROBE
    assert not cpu_parts.ON and type(probe) is cpu_parts.Probe
    items = iter([1, 2])
    assert probe.iterated("push_send", items) is items
    assert probe.fed("push_send", len) is len
    assert probe.timed("receive", len) is len
    with probe.part("copy"):
        probe.round_begins(0)
        probe.batch_drawn()
        probe.compute_ends()
    assert cpu_parts.thread_kind("Thread-7 (channel_spin)") == "channel_spin" and cpu_parts.thread_kind("reply_0") == "reply"
    assert vars(probe) == {}  # nothing recorded: the probe that is off holds no state
