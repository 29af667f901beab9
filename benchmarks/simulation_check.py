"""`python -m benchmarks.simulation_check RESULT.json ...`: the simulator against real runs.

Reads `benchmarks.hetero` result files of one setup (BSP, a policy deciding every epoch; the fast
path's runs are left out), or `benchmarks.scale` BSP result files of one setup (N workers, the
dynamic policy deciding every few rounds: the windows between its decisions stand for epochs), fits
each worker's time law, its steps' noise and the round's overhead from all runs but one, simulates
that one (benchmarks/simulation/replay.py) and compares its steady round time, plan changes and
final plan with the real run's, for every run in turn. Targets: the
steady round within 10% of the real one in every run, and the plan changes equal to the real ones
within one.

    python -m benchmarks.simulation_check benchmarks/results/hetero-2026-11-27-{2,3,4,5,6}.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.analysis import target
from benchmarks.report_output import add_report_options, publish
from benchmarks.simulation.replay import leave_one_out, read_runs

ROUND_ERROR = 0.10
"""The simulated steady round is within this fraction of the real one."""
CHANGES_OFF = 1
"""The simulated plan changes are within this many of the real ones."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.simulation_check", description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", type=Path, metavar="RESULT.json",
                   help="benchmarks.hetero or benchmarks.scale result files (or reports) of one setup, two runs at least")
    p.add_argument("--seed", type=int, default=0, help="the simulation's seed (default 0)")
    add_report_options(p.add_argument_group("output"), "simulation_check")
    return p


def load(path: Path) -> dict[str, Any]:
    """A result file's report (or a bare report); ValueError when it cannot be read."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read it as JSON: {exc}") from None
    report = data.get("report", data) if isinstance(data, dict) else None
    if not isinstance(report, dict):
        raise ValueError(f"{path}: not a benchmark report")
    return report


def targets(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    worst = max(abs(r["round_error"]) for r in rows)
    changes = max(abs(r["simulated"]["plan_changes"] - r["real"]["plan_changes"]) for r in rows)
    source = "issue targets (the simulator against the real runs)"
    return [target("simulated steady round over the real one, worst run, |error|", round(worst, 4), "<=", ROUND_ERROR, source),
            target("simulated plan changes against the real ones, worst run, |difference|", changes, "<=", CHANGES_OFF, source)]


def table(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| run | real round ms | simulated | error | real plan changes | simulated | final plan off (of B) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['run']} | {r['real']['round_ms']} | {r['simulated']['round_ms']} | {r['round_error']:+.1%} "
                     f"| {r['real']['plan_changes']} | {r['simulated']['plan_changes']} | {r['plan_error']:.1%} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    resolved = [path.resolve() for path in args.results]
    twice = next((path for path, full in zip(args.results, resolved, strict=True) if resolved.count(full) > 1), None)
    if twice is not None:  # leave one out would predict its runs from themselves
        parser.error(f"{twice} is given twice: each run is predicted from the others, so give each file once")
    try:
        runs = [run for path in args.results for run in read_runs(load(path), path.name)]
        rows = leave_one_out(runs, args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    report = {"rows": rows, "targets": targets(rows)}
    publish(args, "simulation_check", report, table(rows), argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
