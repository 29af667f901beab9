"""benchmarks.chaos's invariants, read from a metrics log: every plan sums to B, a round of fewer
than B samples closes only while a member was removed from it, the step count equals the rounds
closed; and the stall hook a chaos run drives (worker/probes/stall_hook.py)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from benchmarks.chaos import Watch, main, report
from deploy.run_plan import DEFAULT_JOB
from worker.probes.stall_hook import STALL_DIR_ENV, stall_while_asked

B = DEFAULT_JOB["global_batch"]


def events(short_round_at: int, removed_at: int) -> list[dict]:
    return [
        {"event": "path", "time": 0.0},
        {"event": "adjust", "batch_sizes": {"a": B // 2, "b": B // 2}},
        {"event": "evict", "worker": "b", "step": removed_at},
        {"event": "adjust", "batch_sizes": {"a": B}},
        {"event": "short_round", "round": short_round_at, "batch": B // 2},
        {"event": "end", "time": 10.0},
        {"event": "summary", "reason": "finished", "epochs": 1, "rounds": 9, "first_round": 0, "rounds_closed": 9,
         "accuracy": 0.9, "exactly_once": {"overlaps": 0, "exact_epochs": [0]}},
    ]


def test_a_short_round_must_coincide_with_a_removal(tmp_path: Path) -> None:
    watch = Watch("127.0.0.1:1", tmp_path / "rounds.json", rounds_open=[0.5, 2.5])
    good = report("faulted", events(4, 4), watch, Counter({"worker-kill": 1}), 0.0)
    assert good["finished"] and good["every_plan_sums_to_B"] and good["short_rounds_all_at_a_removal"]
    assert good["steps_equal_rounds_closed"] and good["longest_round_open_s"] == 2.5
    assert good["plan_workers"] == [["a", "b"], ["a"]]
    assert good["no_sample_trained_twice"] and good["every_epoch_trained_once"]
    bad = report("faulted", events(5, 4), watch, Counter(), 0.0)
    assert not bad["short_rounds_all_at_a_removal"]
    twice = events(4, 4)
    twice[-1]["exactly_once"] = {"overlaps": 3, "exact_epochs": []}
    worse = report("faulted", twice, watch, Counter(), 0.0)
    assert not worse["no_sample_trained_twice"] and not worse["every_epoch_trained_once"]
    resumed = [*events(4, 4)[:-1], {"event": "resume", "epoch": 1, "time": 5.0}, events(4, 4)[-1]]
    resumed[-1] = {**resumed[-1], "epochs": 3, "exactly_once": {"overlaps": 0, "exact_epochs": [1, 2]}}
    assert report("faulted", resumed, watch, Counter(), 0.0)["every_epoch_trained_once"]


def test_the_stall_hook_waits_while_its_file_exists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stall_while_asked("w0")  # unset: no wait
    monkeypatch.setenv(STALL_DIR_ENV, str(tmp_path))
    flag = tmp_path / "w0"
    flag.touch()
    threading.Timer(0.3, flag.unlink).start()
    started = time.monotonic()
    stall_while_asked("w0")
    assert time.monotonic() - started >= 0.3


def test_an_out_folder_that_holds_runs_is_refused_before_anything_starts(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "free" / "ckpt").mkdir(parents=True)
    with pytest.raises(SystemExit) as exited:
        main(["--out", str(tmp_path), "--runs", "free"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"--out {tmp_path} already holds runs" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["free"]  # nothing written
