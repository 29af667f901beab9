"""From the arms' records over the seeds to the report's figures: each arm's median and worst time to
the target and accuracy within the budget, the issue's goals, and the markdown table. Pure: no
processes and no clock."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks import analysis
from benchmarks.tta.arms import PS_ARMS

SOURCE = "issue: time to accuracy, end to end (median over the seeds)"


def _finite(value: float) -> float | None:
    return None if math.isinf(value) else round(value, 3)


def spread(times: Sequence[float | None], accuracies: Sequence[float | None]) -> dict[str, Any]:
    """Median and worst over the seeds: of the time to the target (a seed that missed it counts as
    slower than every seed that reached it; null where that decides the figure) and of the accuracy
    within the budget (a seed with no evaluation that early counts as 0)."""
    seconds = [math.inf if t is None else float(t) for t in times]
    reached = [a or 0.0 for a in accuracies]
    return {
        "time_to_target_s": {"median": _finite(statistics.median(seconds)) if seconds else None,
                             "worst": _finite(max(seconds)) if seconds else None,
                             "reached": sum(1 for t in times if t is not None), "seeds": len(times)},
        "accuracy_at_budget": {"median": round(statistics.median(reached), 5) if reached else None,
                               "worst": round(min(reached), 5) if reached else None},
    }


def summarize(arms: Mapping[str, Mapping[str, dict]]) -> dict[str, dict]:
    """Per arm: its seeds' records and their :func:`spread`."""
    out = {}
    for arm, seeds in arms.items():
        records = list(seeds.values())
        out[arm] = {**spread([r["time_to_target_s"] for r in records], [r["accuracy_at_budget"] for r in records]),
                    "seeds": dict(seeds)}
    return out


def ratio_target(name: str, ours: float | None, theirs: float | None, threshold: float,
                 ours_missed: bool, theirs_missed: bool) -> dict[str, Any]:
    """``ours / theirs <= threshold``: false where ours missed the target and theirs did not, null where
    either is unknown otherwise (theirs missed it: raise --epochs)."""
    if ours is not None and theirs:
        return analysis.target(name, ours / theirs, "<=", threshold, SOURCE)
    result = analysis.target(name, None, "<=", threshold, SOURCE)
    if ours_missed and not theirs_missed:
        result["pass"] = False
    return result


def targets(summary: Mapping[str, dict], seeds: Sequence[int]) -> list[dict[str, Any]]:
    """The issue's goals for benchmarks.tta (each met true, false or null where not measured)."""
    median = {arm: r["time_to_target_s"]["median"] for arm, r in summary.items()}
    missed = {arm: t is None for arm, t in median.items()}  # the median seed missed the target
    ours = {arm: t for arm, t in median.items() if arm in PS_ARMS and t is not None}
    best = min(ours, key=ours.__getitem__) if ours else None
    best_s = ours.get(best) if best else None
    ours_missed = any(arm in PS_ARMS for arm in summary) and not ours
    out = []
    for baseline, threshold in (("ddp_uniform", round(1 / 3, 4)), ("ddp_split", 0.8)):
        if baseline in summary:
            out.append(ratio_target(f"time to target: our best configuration / {baseline}", best_s,
                                    median.get(baseline), threshold, ours_missed, missed[baseline]))
            out[-1]["best"] = best
    if "model_adaptive" in summary and "model" in summary:
        out.append(ratio_target("time to target: model_adaptive / model (fixed B0)", median["model_adaptive"],
                                median["model"], 0.9, missed["model_adaptive"], missed["model"]))
        out.append(worst_seed(summary["model_adaptive"]["seeds"], summary["model"]["seeds"], seeds))
    if "model_adaptive" in summary:
        out.append(break_even_target(summary["model_adaptive"]["seeds"]))
    return out


def break_even_target(seeds: Mapping[str, dict]) -> dict[str, Any]:
    """No plan of the adaptive arm puts an active worker below its break-even batch, on any seed (the
    metrics log's decisions, analysis.below_break_even): the count of such workers in plans; null
    where no seed's record has the check."""
    found = [r["below_break_even"] for r in seeds.values() if r.get("below_break_even") is not None]
    value = sum(len(f) for f in found) if found else None
    return analysis.target("plans of model_adaptive with an active worker below its break-even batch", value,
                           "<=", 0, SOURCE)


def worst_seed(adaptive: Mapping[str, dict], fixed: Mapping[str, dict], seeds: Sequence[int]) -> dict[str, Any]:
    """The largest ratio over the seeds of the adaptive run's time to the target to the fixed-B0 run's on
    the same seed (false where the adaptive run missed the target on a seed where the fixed one did not)."""
    name = "time to target: model_adaptive / model (fixed B0), worst seed"
    ratios, failed = [], False
    for seed in map(str, seeds):
        mine, theirs = adaptive[seed]["time_to_target_s"], fixed[seed]["time_to_target_s"]
        if mine is not None and theirs:
            ratios.append(mine / theirs)
        elif mine is None and theirs is not None:
            failed = True
    complete = len(ratios) == len(seeds)
    result = analysis.target(name, max(ratios) if complete else None, "<=", 1.1, SOURCE)
    if failed:
        result["pass"] = False
    return result


def render_table(report: dict) -> str:
    """The markdown summary printed after the JSON."""
    rows = []
    for arm, r in report["arms"].items():
        t, a = r["time_to_target_s"], r["accuracy_at_budget"]
        plans = [s.get("batch_sizes") for s in r["seeds"].values()]
        rows.append([arm, t["median"], t["worst"], f"{t['reached']} of {t['seeds']}", a["median"], a["worst"],
                     plans[0] if plans else None])
    w = report["workload"]
    parts = [analysis.markdown_table(
        ["arm", "time to target, median (s)", "worst (s)", "reached", f"accuracy in {w['budget_s']:g} s, median",
         "worst", "batches (first seed)"], rows)]
    if report["targets"]:
        parts.append(targets_table(report["targets"]))
    env = report["environment"]
    parts.append(f"target accuracy {w['target']}, {len(report['seeds'])} seeds, {w['model']} on {w['dataset']} "
                 f"(B {w['global_batch']}, lr {w['lr']}), limiter {env['limiter']}, cpu budget {env['cpu_budget']}, "
                 f"load average at start {env['loadavg_start']}, torch {env['torch']}")
    return "\n\n".join(parts)


def targets_table(goals: Sequence[Mapping[str, Any]]) -> str:
    """The goals as a markdown table: each one's value, what it needs and whether it is met."""
    return analysis.markdown_table(["target", "value", "needs", "met"], [
        [t["name"], t["value"], f"{t['op']} {t['threshold']}", {True: "yes", False: "no"}.get(t["pass"], "-")]
        for t in goals])
