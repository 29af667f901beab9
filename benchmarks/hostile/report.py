"""From benchmarks.hostile's runs to its report: each run's record from the server's metrics log, each
attack against the clean run (samples/s ratio, the longest round against its deadline, the job held),
the issue's targets and the markdown table. Pure: no processes and no clock."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from benchmarks import analysis
from ps.rounds.deadlines import ROUND_FACTOR

SOURCE = "issue 49: hold the job under hostile load"
RATIO_LEAST, RATIO_GOAL = 0.8, 0.95
REAPER_S = 1.0
"""How late a deadline may act: the server's reaper looks once a heartbeat interval (at most 1 s)."""
STATED = re.compile(r"deadline \(([0-9.]+) ?s\)")


def _finite(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def run_record(run: str, events: Sequence[Mapping[str, Any]], exits: Mapping[str, int | None], timed_out: bool,
               tally: Mapping[str, int], global_batch: int, open_at_end: float | None = None) -> dict[str, Any]:
    """One run's figures and invariants, read from its metrics log; `exits`: the honest workers' exit
    statuses, `tally`: what the attacker was answered, `open_at_end`: how long the round open when a
    run that timed out was stopped had stood (the summary times only the rounds the server closed)."""
    summaries = [e for e in events if e.get("event") == "summary"]
    summary: Mapping[str, Any] = summaries[-1] if summaries else {}
    plans = [e["batch_sizes"] for e in events if e.get("event") == "adjust"]
    removed_in = {e.get("step") for e in events if e.get("event") in ("evict", "leave")}
    shorts = [e for e in events if e.get("event") == "short_round"]
    exact = summary.get("exactly_once")
    epochs = int(summary.get("epochs") or 0)
    stated = sorted({float(m) for e in events if e.get("event") == "deadline"
                     for m in STATED.findall(str(e.get("reason", "")))})
    return {
        "run": run,
        "finished": summary.get("reason") == "finished" and not timed_out,
        "timed_out": timed_out,
        "epochs": epochs,
        "wall_s": summary.get("wall_s"),
        "samples_per_s": summary.get("samples_per_s"),
        "accuracy": summary.get("accuracy"),
        "loss": summary.get("loss"),
        "rounds_closed": summary.get("rounds_closed"),
        "longest_round_open_s": longest_open(summary.get("longest_round_open_s"), open_at_end),
        "open_at_end_s": None if open_at_end is None else round(open_at_end, 3),
        "deadline_drops": summary.get("deadline_drops"),
        "deadlines_stated_s": stated,
        "joins": sum(1 for e in events if e.get("event") == "join"),
        "evictions": sum(1 for e in events if e.get("event") == "evict"),
        "short_rounds": len(shorts),
        "invariants": {
            "every_plan_sums_to_B": bool(plans) and all(sum(p.values()) == global_batch for p in plans),
            "short_rounds_all_at_a_removal": all(e.get("round") in removed_in for e in shorts),
            # None where the log does not show it (--sampling independent, or no summary)
            "exactly_once": None if not isinstance(exact, Mapping) else (
                exact.get("overlaps") == 0 and exact.get("exact_epochs") == list(range(epochs))),
            "model_finite": None if summary.get("loss") is None and summary.get("accuracy") is None else (
                _finite(summary.get("loss")) and _finite(summary.get("accuracy"))),  # None: never evaluated
            "workers_exit_0": bool(exits) and all(code == 0 for code in exits.values()),
        },
        "workers_exit": dict(exits),
        "attacker": dict(tally),
    }


def longest_open(closed: Any, open_at_end: float | None) -> float | None:
    """The longest a round stood open: the summary's over the rounds closed, or the one open at the end."""
    known = [float(v) for v in (closed, open_at_end) if _finite(v)]
    return round(max(known), 3) if known else None


def steady_deadline(clean: Mapping[str, Any], floor_s: float) -> float | None:
    """The round deadline `--round-deadline auto` settles at in the clean run: max(floor, k x its mean round)."""
    wall, rounds = clean.get("wall_s"), clean.get("rounds_closed")
    if not _finite(wall) or not rounds:
        return None
    return round(max(floor_s, ROUND_FACTOR * float(wall) / int(rounds)), 3)


def held(record: Mapping[str, Any]) -> bool:
    """Finished, and every invariant the log shows held."""
    return bool(record["finished"]) and all(v is not False for v in record["invariants"].values())


def against_clean(clean: Mapping[str, Any], attacked: dict[str, Any], floor_s: float) -> None:
    """Add to `attacked` its ratio to the clean run's samples/s, the bound its rounds are held to and
    whether the longest kept it (the steady deadline; the clean run's longest round, its first with
    the warm-up, passes too; plus the reaper's lateness), and whether the job held."""
    ours, theirs = attacked.get("samples_per_s"), clean.get("samples_per_s")
    attacked["ratio"] = round(ours / theirs, 3) if _finite(ours) and _finite(theirs) and theirs > 0 else None
    deadline = steady_deadline(clean, floor_s)
    attacked["deadline_s"] = deadline
    bound = None if deadline is None else round(max(deadline, clean.get("longest_round_open_s") or 0.0) + REAPER_S, 3)
    attacked["round_bound_s"] = bound
    longest = attacked.get("longest_round_open_s")
    attacked["rounds_within_deadline"] = None if bound is None or not _finite(longest) else longest <= bound
    attacked["held"] = held(attacked)


def targets(profile: str, attacks: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets over the attacks run (in their order): each samples/s ratio >= 0.8 (the goal
    0.95), no round open past its bound (the clean run's, alike for every attack), the job finished
    with every invariant held."""
    if not attacks:
        return []
    names = "/".join(attacks)
    ratios = [a.get("ratio") for a in attacks.values()]
    within = [a.get("rounds_within_deadline") for a in attacks.values()]
    kept = [bool(a.get("held")) for a in attacks.values()]
    bound = next(iter(attacks.values())).get("round_bound_s")
    return [
        {"name": f"{profile}: samples/s under attack / clean ({names})", "value": ratios, "op": ">=",
         "threshold": RATIO_LEAST, "goal": RATIO_GOAL, "needs": f"≥ {RATIO_LEAST} each (goal {RATIO_GOAL})",
         "pass": all(r is not None and r >= RATIO_LEAST for r in ratios), "source": SOURCE},
        {"name": f"{profile}: longest round open, s ({names})",
         "value": [a.get("longest_round_open_s") for a in attacks.values()], "op": "<=", "threshold": bound,
         "needs": f"≤ {analysis.fmt(bound)} each (the round deadline)", "pass": all(w is True for w in within),
         "source": SOURCE},
        {"name": f"{profile}: job finished, every invariant held ({names})", "value": ["yes" if k else "no" for k in kept],
         "needs": "yes each", "pass": all(kept), "source": SOURCE},
    ]


def render_table(report: Mapping[str, Any]) -> str:
    """One row per run: throughput, ratio, longest round and its bound, finished, invariants, the attacker's tally."""
    fmt = analysis.fmt
    lines = ["| run | samples/s | / clean | longest round s | bound s | finished | invariants held | attacker answered |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in report["runs"].items():
        broken = [k for k, v in r["invariants"].items() if v is False]
        tally = ", ".join(f"{k} {v}" for k, v in sorted(r["attacker"].items())) or "-"
        lines.append(f"| {name} | {fmt(r['samples_per_s'])} | {fmt(r.get('ratio'))} | {fmt(r['longest_round_open_s'])} "
                     f"| {fmt(r.get('round_bound_s'))} | {fmt(r['finished'])} | {'yes' if not broken else 'no: ' + ', '.join(broken)} "
                     f"| {tally} |")
    for name, why in report.get("skipped", {}).items():
        lines.append(f"| {name} | - | - | - | - | - | - | skipped: {why} |")
    return "\n".join(lines)
