"""benchmarks.hostile: a run's record and invariants from a metrics log, an attack against the clean run
(ratio, the round bound, held) and the targets; which attacks a job can have; and a --quick run that
reports every field for the clean run and each attack."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.hostile.cli import main
from benchmarks.hostile.peers import shard_address
from benchmarks.hostile.report import against_clean, run_record, targets
from benchmarks.hostile.runs import ATTACKS, NEEDS, chosen_attacks

B = 64
EXITS = {"w0": 0, "w1": 0}


def events(samples_per_s: float = 100.0, short_round_at: int | None = None, overlaps: int = 0,
           reason: str = "finished", loss: float = 0.5) -> list[dict[str, Any]]:
    log: list[dict[str, Any]] = [
        {"event": "adjust", "step": 0, "batch_sizes": {"w0": B // 2, "w1": B // 2}},
        {"event": "join", "worker": "rejoiner", "step": 3},
        {"event": "adjust", "step": 3, "batch_sizes": {"w0": 24, "w1": 24, "rejoiner": 16}},
        {"event": "deadline", "worker": "rejoiner", "round": 4, "reason": "evicted at round 4's deadline (60.0 s) without its push; rejoin"},
        {"event": "evict", "worker": "rejoiner", "step": 4},
    ]
    if short_round_at is not None:
        log.append({"event": "short_round", "round": short_round_at, "batch": 48})
    log.append({"event": "summary", "reason": reason, "epochs": 2, "wall_s": 20.0, "rounds_closed": 40,
                "samples_per_s": samples_per_s, "accuracy": 0.9, "loss": loss, "longest_round_open_s": 3.0,
                "deadline_drops": 1, "exactly_once": {"overlaps": overlaps, "exact_epochs": [0, 1]}})
    return log


def test_a_record_reads_the_invariants_and_an_attack_is_compared_with_the_clean_run() -> None:
    clean = run_record("clean", events(), EXITS, False, {}, B)
    assert clean["finished"] and all(clean["invariants"].values()), clean
    assert clean["deadlines_stated_s"] == [60.0] and clean["joins"] == 1 and clean["evictions"] == 1

    attacked = run_record("rejoin_loop", events(80.0, short_round_at=4), EXITS, False, {"joined": 3}, B)
    against_clean(clean, attacked, floor_s=5.0)
    assert attacked["ratio"] == 0.8 and attacked["held"] and attacked["attacker"] == {"joined": 3}
    # the deadline auto settles at: max(5 s, 4 x 20 s / 40 rounds); the clean run's longest round, 3 s, is larger
    assert attacked["deadline_s"] == 5.0 and attacked["round_bound_s"] == 6.0 and attacked["rounds_within_deadline"]

    # a short round with no removal, a sample twice, an infinite loss, a worker that failed: each breaks one
    broken = run_record("x", events(short_round_at=7, overlaps=2, loss=float("inf")), {"w0": 0, "w1": 1}, False, {}, B)
    assert {k for k, v in broken["invariants"].items() if v is False} == {
        "short_rounds_all_at_a_removal", "exactly_once", "model_finite", "workers_exit_0"}
    against_clean(clean, broken, floor_s=5.0)
    assert broken["finished"] and not broken["held"]

    # a run stopped at its time limit: unfinished, its open round timed by the poller counts as the longest
    stopped = run_record("stalled_pushes", events(1.0, reason="stopping"), EXITS, True, {}, B, open_at_end=59.5)
    against_clean(clean, stopped, floor_s=5.0)
    assert not stopped["finished"] and stopped["timed_out"] and stopped["longest_round_open_s"] == 59.5
    assert stopped["rounds_within_deadline"] is False and not stopped["held"] and stopped["ratio"] == 0.01

    goals = targets("hl4", {"rejoin_loop": attacked, "stalled_pushes": stopped})
    assert [t["pass"] for t in goals] == [False, False, False]
    assert goals[0]["value"] == [0.8, 0.01] and goals[1]["value"] == [3.0, 59.5] and goals[2]["value"] == ["yes", "no"]
    assert all(t["name"].endswith("(rejoin_loop/stalled_pushes)") for t in goals)
    assert [t["pass"] for t in targets("hl4", {"rejoin_loop": attacked})] == [True, True, True]


def test_an_attack_the_job_cannot_have_is_skipped_by_default_and_refused_when_asked_for() -> None:
    names, skipped = chosen_attacks(None, shards=1, allreduce=False)
    assert names == ["watches", "silent_pushes", "stalled_pushes", "rejoin_loop"] and skipped == NEEDS
    names, skipped = chosen_attacks(None, shards=2, allreduce=True)
    assert names == list(ATTACKS) and skipped == {}
    with pytest.raises(ValueError, match="store_rewrites runs with --allreduce only"):
        chosen_attacks(["watches", "store_rewrites"], shards=2, allreduce=False)
    assert shard_address(":7001", "127.0.0.1:5000") == "127.0.0.1:7001"
    assert shard_address("0.0.0.0:7001", "10.0.0.2:5000") == "10.0.0.2:7001"
    assert shard_address("10.0.0.3:7001", "127.0.0.1:5000") == "10.0.0.3:7001"


def test_a_flag_for_an_attack_the_job_cannot_have_ends_before_anything_starts(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--attacks", "departed_at_shards", "--out", str(tmp_path / "out")])
    assert exited.value.code == 2
    assert "--attacks departed_at_shards runs with --shards N" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # five whole jobs of real processes, a minute to four (a run that does not finish stops at 30 s)
def test_a_quick_run_reports_every_field_for_the_clean_run_and_each_attack(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick", "--json", "--run-timeout", "30", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "hostile.json").read_text())
    assert capsys.readouterr().out.startswith("{")
    attacks = ["watches", "silent_pushes", "stalled_pushes", "rejoin_loop"]
    assert list(report["runs"]) == ["clean", *attacks] and list(report["attacks"]) == attacks
    assert set(report["skipped"]) == {"departed_at_shards", "store_rewrites"}
    clean = report["runs"]["clean"]
    assert clean["finished"] and clean["held"] and clean["samples_per_s"] > 0, clean
    fields = {"finished", "timed_out", "samples_per_s", "accuracy", "longest_round_open_s", "open_at_end_s",
              "deadline_drops", "deadlines_stated_s", "invariants", "workers_exit", "attacker", "attacker_told",
              "ratio", "deadline_s", "round_bound_s", "rounds_within_deadline", "held"}
    invariants = {"every_plan_sums_to_B", "short_rounds_all_at_a_removal", "exactly_once", "model_finite",
                  "workers_exit_0"}
    for name in attacks:
        run = report["runs"][name]
        assert fields <= set(run) and set(run["invariants"]) == invariants, (name, run)
        assert run["ratio"] is not None and run["round_bound_s"] is not None and run["attacker"], (name, run)
        assert isinstance(run["held"], bool) and isinstance(run["rounds_within_deadline"], bool), (name, run)
    assert [len(t["value"]) for t in report["targets"]] == [4, 4, 4]
