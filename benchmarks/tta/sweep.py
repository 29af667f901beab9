"""The sweep of ``benchmarks.tta --sweep``: the arms from each B0 of a list, and the goals of an adaptive
batch that finds the best B from any start (docs/adaptive-batch.md): from every B0, the adaptive arm's
median time to the target within 1.1 of our best fixed B's (the ``model`` arm at the B0 whose median
is least), its worst seed within 1.3 of that B's worst, and its median at most 0.8 of DDP hand-split at
DDP's own best B0; no plan of the adaptive arm below a worker's break-even. Pure: no processes, no clock."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from benchmarks import analysis
from benchmarks.tta.report import SOURCE, targets_table

Runs = Mapping[str, Mapping[str, Any]]
"""B0 (as text) -> that B0's report (benchmarks.tta's, with its ``arms``)."""


def _times(runs: Runs, arm: str, which: str) -> dict[str, float]:
    """Each B0's `which` ("median" or "worst") time to the target of `arm`, where it reached it."""
    out = {}
    for b0, report in runs.items():
        record = (report.get("arms") or {}).get(arm)
        value = record["time_to_target_s"][which] if record else None
        if value is not None:
            out[b0] = float(value)
    return out


def best_fixed(runs: Runs, arm: str) -> str | None:
    """The B0 at which `arm` (fixed B) has the least median time to the target (None: none reached it)."""
    medians = _times(runs, arm, "median")
    return min(medians, key=medians.__getitem__) if medians else None


def sweep_targets(runs: Runs) -> list[dict[str, Any]]:
    """The goals of the sweep, one per B0 where the adaptive arm ran (each a ratio, null where a side did
    not reach the target), and the break-even count over every B0 and seed."""
    fixed, ddp = best_fixed(runs, "model"), best_fixed(runs, "ddp_split")
    median, worst = _times(runs, "model_adaptive", "median"), _times(runs, "model_adaptive", "worst")
    out = []
    for b0, report in runs.items():
        if "model_adaptive" not in (report.get("arms") or {}):
            continue
        checks = ((f"from B0 = {b0}: model_adaptive median / model's at its best fixed B ({fixed})", median.get(b0),
                   _times(runs, "model", "median").get(fixed) if fixed else None, 1.1),
                  (f"from B0 = {b0}: model_adaptive worst seed / model's worst at its best fixed B ({fixed})",
                   worst.get(b0), _times(runs, "model", "worst").get(fixed) if fixed else None, 1.3),
                  (f"from B0 = {b0}: model_adaptive median / ddp_split's at its best fixed B ({ddp})", median.get(b0),
                   _times(runs, "ddp_split", "median").get(ddp) if ddp else None, 0.8))
        for name, ours, theirs, threshold in checks:
            if theirs is None:
                continue
            result = analysis.target(name, None if ours is None else ours / theirs, "<=", threshold, SOURCE)
            result["pass"] = False if ours is None else result["pass"]  # the adaptive arm missed the target
            out.append(result)
    counts = [len(seed.get("below_break_even") or []) for report in runs.values()
              for seed in (((report.get("arms") or {}).get("model_adaptive") or {}).get("seeds") or {}).values()
              if seed.get("below_break_even") is not None]
    if counts:
        out.append(analysis.target("plans of model_adaptive with an active worker below its break-even batch, "
                                   "every B0", sum(counts), "<=", 0, SOURCE))
    return out


def render_sweep_table(report: Mapping[str, Any]) -> str:
    """The markdown summary of a sweep: per B0 each arm's median and worst time to the target, then the goals."""
    runs: Runs = report["runs"]
    arms = list(dict.fromkeys(arm for r in runs.values() for arm in r.get("arms") or {}))
    rows = []
    for b0, r in runs.items():
        row: list[Any] = [b0]
        for arm in arms:
            t = ((r.get("arms") or {}).get(arm) or {}).get("time_to_target_s") or {}
            row.append(f"{analysis.fmt(t.get('median'))} / {analysis.fmt(t.get('worst'))}" if t else "-")
        rows.append(row)
    parts = [analysis.markdown_table(["B0", *(f"{arm}: median / worst (s)" for arm in arms)], rows)]
    if report["targets"]:
        parts.append(targets_table(report["targets"]))
    return "\n\n".join(parts)
