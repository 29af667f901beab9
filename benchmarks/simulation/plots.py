"""The simulated policies' curves against the number of workers, from a `benchmarks.simulate` report
(its `rows`, one per policy and N): decisions to steady (before and after the speed change), the final
plan's round over the exact optimum, and the policy's CPU per decision, each goal drawn with it.

`python -m benchmarks.simulation.plots RESULT.json --out DIR` draws them from a saved result
(benchmarks/results/simulate-*.json) as DIR/simulate.png; `python -m benchmarks.simulate --out DIR`
draws them after its runs. The object API with the Agg canvas, as deploy/plots.py: headless, no
global state."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

FILE = "simulate.png"
STEADY_GOAL = 3
STEADY_AGAIN_GOAL = 2
OPTIMUM_GOAL = 1.05
CPU_GOALS = ((1024, 10.0), (10_000, 100.0))
"""(N, ms): the policy's CPU per decision the scaling goals allow."""

Row = Mapping[str, Any]


def _by_policy(rows: Sequence[Row]) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {}
    for row in sorted(rows, key=lambda r: r["workers"]):
        out.setdefault(str(row["policy"]), []).append(row)
    return out


def _series(rows: Sequence[Row], key: str) -> tuple[list[int], list[float]]:
    """N and the value of `key` per row; a missing value (None: not steady, no such phase) as NaN, a gap."""
    return [int(r["workers"]) for r in rows], [math.nan if r.get(key) is None else float(r[key]) for r in rows]


def plot_rows(rows: Sequence[Row], path: str | Path | None = None) -> Figure:
    """Three panels against N (log scale): decisions to steady (solid; after the change, dashed; a
    policy not steady is marked at the panel's top), round over the optimum (solid; compute alone,
    dotted; log scales: equal splits sit at 2-5, the adaptive policies near 1; linear where no row
    has one, as with the change at round 0, since a log axis needs a value) and CPU per decision
    (median solid, largest dotted; log scale), the goals in grey."""
    if not rows:
        raise ValueError("the report has no rows to plot")
    fig = Figure(figsize=(13.0, 4.2), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    steady_ax, optimum_ax, cpu_ax = fig.subplots(1, 3)
    policies = _by_policy(rows)
    top = max([STEADY_GOAL + 1.0, *(float(r[k]) for r in rows for k in ("decisions_to_steady", "steady_again")
                                    if r.get(k) is not None)]) * 1.15
    for i, (policy, series) in enumerate(policies.items()):
        colour = f"C{i}"
        n, steady = _series(series, "decisions_to_steady")
        _, again = _series(series, "steady_again")
        steady_ax.plot(n, steady, "o-", color=colour, label=policy)
        steady_ax.plot(n, again, "s--", color=colour, alpha=0.7)
        unsteady = [x for x, a, b in zip(n, steady, again) if math.isnan(a) or math.isnan(b)]
        steady_ax.plot(unsteady, [top] * len(unsteady), "x", color=colour, markersize=9)
        _, over = _series(series, "round_over_optimum")
        _, compute = _series(series, "compute_over_optimum")
        optimum_ax.plot(n, over, "o-", color=colour, label=policy)
        optimum_ax.plot(n, compute, ":", color=colour)
        _, median = _series(series, "decision_ms_median")
        _, largest = _series(series, "decision_ms_max")
        cpu_ax.plot(n, median, "o-", color=colour, label=policy)
        cpu_ax.plot(n, largest, ":", color=colour)
    steady_ax.axhline(STEADY_GOAL, color="grey", linewidth=0.8)
    steady_ax.axhline(STEADY_AGAIN_GOAL, color="grey", linewidth=0.8, linestyle="--")
    steady_ax.set(xscale="log", ylim=(0, top * 1.08), xlabel="workers")
    steady_ax.set_title("decisions to steady (dashed: after change, x: never)", fontsize="medium")
    optimum_ax.axhline(OPTIMUM_GOAL, color="grey", linewidth=0.8)
    if any(r.get(k) for r in rows for k in ("round_over_optimum", "compute_over_optimum")):
        optimum_ax.set(xscale="log", yscale="log")  # log axes need a value to place
    optimum_ax.set(xlabel="workers")
    optimum_ax.set_title("round / optimum (dotted: compute alone)", fontsize="medium")
    cpu_ax.plot([n for n, _ in CPU_GOALS], [ms for _, ms in CPU_GOALS], "v", color="grey", label="goal")
    cpu_ax.set(xscale="log", yscale="log", xlabel="workers")
    cpu_ax.set_title("CPU per decision, ms (dotted: largest)", fontsize="medium")
    for ax in (steady_ax, optimum_ax, cpu_ax):
        ax.grid(True, which="major", alpha=0.3)
    steady_ax.legend(fontsize="small")
    if path is not None:
        fig.savefig(path)
    return fig


def rows_of(result: Any) -> list[Row]:
    """The rows of a simulate report, or of a saved result holding one under `report`; ValueError otherwise."""
    report = result.get("report", result) if isinstance(result, Mapping) else None
    rows = report.get("rows") if isinstance(report, Mapping) else None
    if not isinstance(rows, list) or not all(isinstance(r, Mapping) and {"policy", "workers"} <= set(r) for r in rows):
        raise ValueError("not a benchmarks.simulate report: no rows of policy and workers")
    return rows


def build_parser() -> argparse.ArgumentParser:
    """`python -m benchmarks.simulation.plots`'s command line."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.simulation.plots",
                                description=f"Draw a benchmarks.simulate result's curves against N as DIR/{FILE}.")
    p.add_argument("result", type=Path, help="a simulate result file (benchmarks/results/simulate-*.json) or report")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="where to write the plot (made if missing)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        rows = rows_of(json.loads(args.result.read_text()))
    except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        p.error(f"{args.result}: {exc}")
    args.out.mkdir(parents=True, exist_ok=True)
    plot_rows(rows, args.out / FILE)
    print(f"wrote {args.out / FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
