"""The end of a ``ps-cluster run``: the summary (per worker its share, final batch and last epoch's
compute time; throughput, accuracy, adjustments), written to ``summary.json`` with the plots of
:mod:`deploy.plots` and printed as a table."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from deploy.run_plan import Plan
from deploy.schedule_phases import POLL_S


def _cores(share: float) -> str:
    return f"{share:.3g} core" + ("" if share == 1 else "s")


def write_report(plan: Plan, events: list[dict[str, Any]], phases: list[dict[str, Any]], final_phase: int,
                 summary: dict[str, Any], total_s: float, limiting: str, say: Callable[[str], None]) -> dict[str, Any]:
    """Write ``summary.json`` and the plots, print the table, and return what ``summary.json`` holds."""
    epochs = [e for e in events if e.get("event") == "epoch"]
    last = epochs[-1] if epochs else {}
    final_shares = plan.shares[final_phase]
    rows = []
    for name, share in zip(plan.names, final_shares, strict=True):
        rows.append({
            "worker": name,
            "share": share,
            "final_batch": (summary.get("batch_sizes") or {}).get(name),
            "compute_ms_last_epoch": (last.get("compute_ms") or {}).get(name),
        })
    labels = {n: f"{n} ({_cores(s)})" for n, s in zip(plan.names, plan.shares[0], strict=True)}
    if plan.schedule is not None:
        labels = {}
    where = f"schedule {plan.schedule.name}" if plan.schedule is not None else plan.profiles[0].name
    title = f"{where}, {plan.config.mode.upper()}, {plan.config.policy} policy"
    from deploy import plots  # matplotlib is slow to import; only needed here

    paths = plots.write_plots(events, plan.out, phases=phases, labels=labels, title=title)
    result = {
        "profile": plan.profiles[0].name if plan.schedule is None else None,
        "schedule": plan.schedule.name if plan.schedule is not None else None,
        "mode": plan.config.mode,
        "controller": plan.config.policy,
        "limiting": limiting,
        "period_us": plan.period_us,
        "server_args": plan.server_args,
        "workers": rows,
        "samples_per_s": summary.get("samples_per_s"),
        "train_wall_s": summary.get("wall_s"),
        "total_wall_s": round(total_s, 3),
        "accuracy": summary.get("accuracy"),
        "adjustments": summary.get("adjustments"),
        "epochs": summary.get("epochs"),
        "phases": phases,
        "phases_not_reached": phases_not_reached(plan, phases),
        "phases_skipped": phases_skipped(plan, phases),
        "plots": [str(p) for p in paths],
        "summary": summary,
    }
    summary_path = plan.out / "summary.json"
    summary_path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print_summary(plan, result, say)
    say("wrote " + ", ".join(str(p) for p in [summary_path, *paths]))
    return result


def print_summary(plan: Plan, result: dict[str, Any], say: Callable[[str], None]) -> None:
    """The summary as a table, one row per worker, and a line of totals."""
    share_head = "share (cores)" if plan.schedule is None else "final share"
    say("")
    measured = f"{result['summary'].get('balance') or 'compute'} ms, last epoch"
    say(f"{'worker':<8}{share_head:>14}{'final batch':>13}{measured:>24}")
    for row in result["workers"]:
        compute = row["compute_ms_last_epoch"]
        say(
            f"{row['worker']:<8}{row['share']:>14.3f}{row['final_batch'] if row['final_batch'] is not None else '-':>13}"
            f"{f'{compute:.0f}' if compute is not None else '-':>24}"
        )
    accuracy = result["accuracy"]
    say(
        f"throughput {result['samples_per_s']} samples/s | training {result['train_wall_s']} s "
        f"(total {result['total_wall_s']:.1f} s with startup) | final accuracy "
        + (f"{100 * accuracy:.1f}%" if accuracy is not None else "-")
        + f" | controller adjustments {result['adjustments']} | {result['limiting']}"
    )
    missed = result["phases_not_reached"]
    if missed:
        schedule = plan.schedule
        unit = "--every-epochs" if schedule is not None and schedule.every_epochs is not None else "--every-seconds"
        say(f"the job ended before the schedule's phase(s) {', '.join(missed)}: they never ran "
            f"(a shorter {unit} or more --epochs reaches them)")
    skipped = result.get("phases_skipped") or []
    if skipped:
        say(f"the schedule's phase(s) {', '.join(skipped)} were skipped: each was over before the "
            f"clock's next check, every {POLL_S:g} s or more (a longer --every-seconds runs them)")


def phases_not_reached(plan: Plan, phases: list[dict[str, Any]]) -> list[str]:
    """The schedule's phases after the last one a run entered, as 'index name': the job ended before
    them (none without a schedule)."""
    if plan.schedule is None:
        return []
    last = last_entered(phases)
    return [f"{i + 1} {p.name}" for i, p in enumerate(plan.profiles) if i > last]


def phases_skipped(plan: Plan, phases: list[dict[str, Any]]) -> list[str]:
    """The schedule's phases a run never entered although it entered a later one, as 'index name': on
    the wall clock a phase shorter than the time between the clock's checks is passed over."""
    if plan.schedule is None:
        return []
    reached = {int(r["phase"]) for r in phases}
    last = last_entered(phases)
    return [f"{i + 1} {p.name}" for i, p in enumerate(plan.profiles) if i < last and i not in reached]


def last_entered(phases: list[dict[str, Any]]) -> int:
    """The index of the last phase a run entered (the highest of its phase records), -1 before any."""
    return max((int(r["phase"]) for r in phases), default=-1)
