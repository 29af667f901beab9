"""benchmarks.tta (time to accuracy, our server's policies against DDP): its pure figures, and a quick run
end to end with real processes that reports every arm and every goal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import analysis
from benchmarks.analysis import global_batch_curve
from benchmarks.ddp_baseline import rank_counts
from benchmarks.tta import report, sweep
from benchmarks.tta.arms import ARMS, PS_ARMS, Goal, ps_flags
from benchmarks.tta.plots import write_plots
from tests.processes import ENV
from tests.repo import ROOT

PROFILE = "kind: profile\nname: tiny2\nbsp:\n  workers: [1, 3]\n"
GOALS = ["time to target: our best configuration / ddp_uniform", "time to target: our best configuration / ddp_split",
         "time to target: model_adaptive / model (fixed B0)",
         "time to target: model_adaptive / model (fixed B0), worst seed",
         "plans of model_adaptive with an active worker below its break-even batch"]


def arm(*times: float | None) -> dict[str, dict]:
    """An arm's records over seeds 0, 1, ...: these times to the target, an accuracy within the budget each."""
    return {str(k): {"time_to_target_s": t, "accuracy_at_budget": None if t is None else 0.9} for k, t in enumerate(times)}


def goals(**arms: dict[str, dict]) -> dict[str, dict]:
    return {t["name"]: t for t in report.targets(report.summarize(arms), [0, 1, 2])}


def test_the_server_curve_counts_training_seconds_from_the_end_of_round_0() -> None:
    events = [{"event": "first_round", "wall_s": 2.0}, {"event": "eval", "epoch": 1, "accuracy": 0.4, "wall_s": 5.0},
              {"event": "eval", "epoch": 2, "accuracy": 0.85, "wall_s": 9.5},
              {"event": "eval", "epoch": 3, "accuracy": 0.8, "wall_s": 12.0}]
    curve = analysis.accuracy_curve(events)
    assert [p["seconds"] for p in curve] == [3.0, 7.5, 10.0]
    assert analysis.time_to_accuracy(curve, 0.8) == 7.5 and analysis.time_to_accuracy(curve, 0.9) is None
    assert analysis.accuracy_within(curve, 8.0) == 0.85 and analysis.accuracy_within(curve, 1.0) is None


def test_a_run_stops_only_at_the_target_once_the_budget_has_passed() -> None:
    goal = Goal(0.8, 60.0)
    assert not goal.reached(0.9, 30.0) and not goal.reached(0.7, 90.0) and goal.reached(0.8, 60.0)


def test_the_adaptive_arm_is_the_model_policy_with_gns_within_its_bounds() -> None:
    assert ps_flags("dynamic", 128, 2048) == ("dynamic", [])
    assert ps_flags("model_adaptive", 128, 2048) == (
        "model", ["--adaptive-batch", "gns", "--min-global-batch", "128", "--max-global-batch", "2048"])


def test_ddp_splits_each_step_in_the_ranks_proportions_the_last_one_too() -> None:
    assert rank_counts([40, 9, 9, 6], 64) == [40, 9, 9, 6]
    short = rank_counts([40, 9, 9, 6], 21)
    assert sum(short) == 21 and short[0] == 13


def test_median_and_worst_count_a_missed_seed_as_the_slowest() -> None:
    s = report.spread([10.0, None, 12.0], [0.9, None, 0.7])
    assert s["time_to_target_s"] == {"median": 12.0, "worst": None, "reached": 2, "seeds": 3}
    assert s["accuracy_at_budget"] == {"median": 0.7, "worst": 0.0}
    assert report.spread([None, None, 5.0], [0.1, 0.1, 0.1])["time_to_target_s"]["median"] is None


def test_the_goals_compare_our_best_arm_with_ddp_and_adaptive_with_fixed_b0() -> None:
    met = goals(ddp_uniform=arm(90, 100, 120), ddp_split=arm(40, 50, 60), uniform=arm(80, 85, 90),
                dynamic=arm(35, 38, 40), model=arm(30, 32, 34), model_adaptive=arm(31, 27, 40))
    best = met[GOALS[0]]
    assert best["best"] == "model_adaptive" and best["value"] == round(31 / 100, 4) and best["pass"] is True
    assert met[GOALS[1]]["value"] == round(31 / 50, 4) and met[GOALS[1]]["pass"] is True
    assert met[GOALS[2]]["value"] == round(31 / 32, 4) and met[GOALS[2]]["pass"] is False
    assert met[GOALS[3]]["value"] == round(40 / 34, 4) and met[GOALS[3]]["pass"] is False


def test_a_plan_below_a_known_break_even_is_found_in_the_log_and_fails_the_goal() -> None:
    def adjust(step: int, plan: dict[str, int], fits: dict[str, dict]) -> dict:
        return {"event": "adjust", "step": step, "batch_sizes": plan, "fits": fits}

    model_law = {"q": 35.0, "s": 82.0, "batches": 2}  # break-even ceil(82 / 35) = 3
    events = [adjust(1, {"a": 30, "b": 2, "c": 4}, {"a": {"q": 7.0, "s": 0.0, "batches": 2}, "b": model_law,
                                                      "c": {**model_law, "batches": 1}}),  # c: no law yet
              adjust(2, {"a": 33, "b": 3, "c": 0}, {"b": model_law}),  # at its break-even
              adjust(3, {"a": 0, "b": 2, "c": 0}, {"b": model_law}),  # the last worker in the round
              adjust(4, {"a": 30, "b": 1, "c": 1}, {"b": {"q": 35.0, "s": 82.0, "law": True},
                                                    "c": {"q": 35.0, "s": 82.0, "law": False}}),  # auto's reports
              {**adjust(5, {"a": 30, "b": 1, "c": 0}, {"b": model_law}), "phase": "wait"},  # decides nothing
              adjust(6, {"a": 30, "b": 1}, {"b": {**model_law, "slope_measured": False}}),  # q within its noise
              {"event": "epoch", "batch_sizes": {"a": 1, "b": 1}}]
    found = analysis.below_break_even(events)
    assert found == [{"step": 1, "worker": "b", "batch": 2, "break_even": 3},
                     {"step": 4, "worker": "b", "batch": 1, "break_even": 3}]
    seeds = {"0": {"below_break_even": []}, "1": {"below_break_even": found}}
    assert report.break_even_target(seeds)["value"] == 2 and report.break_even_target(seeds)["pass"] is False
    assert report.break_even_target({"0": {"below_break_even": []}})["pass"] is True
    assert report.break_even_target({"0": {}})["pass"] is None


def test_a_plan_at_its_break_even_within_the_reports_rounding_is_not_below() -> None:
    """q is reported to 6 decimals and s to 4: 28 samples of the law q = 0.16942838, s = 4.74399 break
    even, its report (0.169428, 4.744) says 27.99999 samples short by 0.00002 ms."""
    rounded = {"q": 0.169428, "s": 4.744, "law": True}
    events = [{"event": "adjust", "step": 1, "batch_sizes": {"a": 36, "b": 28}, "fits": {"b": rounded}},
              {"event": "adjust", "step": 2, "batch_sizes": {"a": 37, "b": 27}, "fits": {"b": rounded}}]
    assert analysis.below_break_even(events) == [{"step": 2, "worker": "b", "batch": 27, "break_even": 28}]


def test_a_missed_target_is_a_failed_goal_where_the_other_side_reached_it_else_unknown() -> None:
    met = goals(ddp_uniform=arm(None, None, 100), ddp_split=arm(40, 50, 60), model=arm(30, 32, 34),
                model_adaptive=arm(31, None, None))
    assert met[GOALS[0]]["value"] is None and met[GOALS[0]]["pass"] is None  # DDP missed: raise --epochs
    assert met[GOALS[0]]["best"] == "model"
    assert met[GOALS[2]]["value"] is None and met[GOALS[2]]["pass"] is False
    assert met[GOALS[3]]["value"] is None and met[GOALS[3]]["pass"] is False


@pytest.mark.slow
def test_a_quick_run_reports_every_arm_and_every_goal(tmp_path: Path) -> None:
    profile = tmp_path / "tiny2.yaml"
    profile.write_text(PROFILE, encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "benchmarks.tta", "--quick", "--json", "--epochs", "1", "--profile",
                          str(profile), "--out", str(tmp_path / "out")],
                         cwd=ROOT, capture_output=True, text=True, env=ENV, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    result, end = json.JSONDecoder().raw_decode(out.stdout)
    assert json.loads((tmp_path / "out" / "tta.json").read_text(encoding="utf-8")) == result
    assert list(result["arms"]) == list(ARMS) and result["seeds"] == [0]
    for name, record in result["arms"].items():
        assert set(record) == {"time_to_target_s", "accuracy_at_budget", "seeds"}, name
        (seed,) = record["seeds"].values()
        curve = seed["curve"]  # evaluated at each quarter of the epoch it reached (tta.cli.EVALS_PER_EPOCH)
        assert seed["epochs"] == 1 and 2 <= len(curve) <= 4 and curve[-1]["epoch"] == 1, name
        assert [p["epoch"] for p in curve] == sorted({p["epoch"] for p in curve}) and curve[0]["seconds"] >= 0, name
        assert [p["seconds"] for p in curve] == sorted(p["seconds"] for p in curve), name
        assert 0 <= seed["best_accuracy"] <= 1 and seed["accuracy_at_budget"] == seed["best_accuracy"], name
        assert sum(seed["batch_sizes"].values()) >= 1, name
    assert [t["name"] for t in result["targets"]] == GOALS
    assert all({"value", "op", "threshold", "pass"} <= set(t) for t in result["targets"])
    split = result["arms"]["ddp_split"]["seeds"]["0"]["batch_sizes"]
    assert split == {n: max(1, b) for n, b in result["split"]["batch_sizes"].items()}
    assert set(result["arms"]) - set(PS_ARMS) == {"ddp_uniform", "ddp_split"}
    assert "| ddp_uniform |" in out.stdout[end:] and "| target |" in out.stdout[end:]
    # the quick B0 (64) leaves its tiny epoch fewer than 8 rounds: the adaptive arm moves B in at its
    # first round, so B over time is plotted too
    adaptive = result["arms"]["model_adaptive"]["seeds"]["0"]
    assert adaptive["global_batches"] and adaptive["global_batches"][0] < 64
    assert result["plots"] == [str(tmp_path / "out" / name) for name in ("accuracy-seed0.png", "global_batch.png")]
    for name in ("accuracy-seed0.png", "global_batch.png"):
        assert (tmp_path / "out" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_adaptive_arms_b_over_time_and_every_arms_curve_are_plotted(tmp_path: Path) -> None:
    events = [{"event": "first_round", "wall_s": 1.0, "elapsed_s": 2.0},
              {"event": "adapt", "elapsed_s": 5.5, "current": 128, "global_batch": 256},
              {"event": "adapt", "elapsed_s": 9.0, "current": 256, "global_batch": 256}]
    curve = global_batch_curve(events)
    assert curve == [{"seconds": 0.0, "global_batch": 128}, {"seconds": 3.5, "global_batch": 256},
                     {"seconds": 7.0, "global_batch": 256}]
    assert global_batch_curve(events[:1]) == []
    points = [{"epoch": 1, "accuracy": 0.4, "seconds": 3.0}, {"epoch": 2, "accuracy": 0.8, "seconds": 6.0}]
    report = {"arms": {"ddp_uniform": {"seeds": {"0": {"curve": points}, "1": {"curve": points}}},
                       "model_adaptive": {"seeds": {"0": {"curve": points, "global_batch_curve": curve}}}}}
    paths = write_plots(report, tmp_path)
    assert [p.name for p in paths] == ["accuracy-seed0.png", "accuracy-seed1.png", "global_batch.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)


def test_a_sweep_judges_the_adaptive_arm_from_every_b0_against_the_best_fixed_b_of_model_and_of_ddp() -> None:
    def at(**arms: dict[str, dict]) -> dict:
        return {"arms": report.summarize(arms)}

    runs = {"64": at(model=arm(50, 60, 70), model_adaptive=arm(40, 45, 80), ddp_split=arm(60, 60, 60)),
            "256": at(model=arm(30, 35, 40), model_adaptive=arm(30, 33, 36), ddp_split=arm(45, 50, 55)),
            "1024": at(model=arm(100, 110, 120), model_adaptive=arm(None, 38, 40), ddp_split=arm(90, 90, 90))}
    assert sweep.best_fixed(runs, "model") == "256" and sweep.best_fixed(runs, "ddp_split") == "256"
    met = {t["name"]: t for t in sweep.sweep_targets(runs)}
    median = {b0: met[f"from B0 = {b0}: model_adaptive median / model's at its best fixed B (256)"] for b0 in runs}
    assert median["64"]["value"] == round(45 / 35, 4) and median["64"]["pass"] is False
    assert median["256"]["value"] == round(33 / 35, 4) and median["256"]["pass"] is True
    assert median["1024"]["value"] == round(40 / 35, 4)  # a seed that missed counts as the slowest
    worst = met["from B0 = 64: model_adaptive worst seed / model's worst at its best fixed B (256)"]
    assert worst["value"] == round(80 / 40, 4) and worst["pass"] is False
    worst = met["from B0 = 1024: model_adaptive worst seed / model's worst at its best fixed B (256)"]
    assert worst["value"] is None and worst["pass"] is False  # the adaptive arm missed the target on a seed
    ddp = met["from B0 = 256: model_adaptive median / ddp_split's at its best fixed B (256)"]
    assert ddp["value"] == round(33 / 50, 4) and ddp["pass"] is True
    assert len(met) == 9  # no seed record has the break-even check
    table = sweep.render_sweep_table({"runs": runs, "targets": list(met.values())})
    assert "| 64 | 60 / 70 | 45 / 80 | 60 / 60 |" in table


@pytest.mark.parametrize("args, error", [
    (["--arms", "ddp_uniform,sgd"], "choose from"),
    (["--arms", "ddp_split"], "ddp_split takes model's split"),
    (["--seeds", "0,0"], "distinct"),
    (["--global-batch", "64", "--min-global-batch", "128"], "--min-global-batch <= every B0"),
    (["--sweep", "64,128", "--min-global-batch", "128"], "--min-global-batch <= every B0"),
    (["--sweep", "64,64"], "distinct B0s"),
    (["--sweep", "64,128", "--global-batch", "64"], "leave out --global-batch"),
])
def test_bad_arguments_are_one_line_and_exit_2(args: list[str], error: str) -> None:
    out = subprocess.run([sys.executable, "-m", "benchmarks.tta", *args], cwd=ROOT, capture_output=True, text=True,
                         env=ENV, timeout=60, check=False)
    assert out.returncode == 2 and error in out.stderr, out.stderr
