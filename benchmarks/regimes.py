"""`python -m benchmarks.regimes`: the default batch policy against the policies made for each regime,
over clusters drawn at random, by simulation.

Draws ``--clusters`` clusters from ``--seed`` (benchmarks/simulation/regimes.py: 2-64 workers of
lognormal speeds, time proportional to the batch or with a fixed cost per step, static or with a
swap, a tenant or a shift of speeds a third of the way in), runs each with the default policy and
with ``--against`` on the same workers and the same changes, and reports each one's whole simulated
time over the better of the others' and over the optimum's, per regime and over all.

    python -m benchmarks.regimes --json --save-result
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from benchmarks.cli_types import parse_resolved
from benchmarks.report_output import add_report_options, publish
from benchmarks.simulation.engine import simulate
from benchmarks.simulation.regimes import Cluster, draw, judge, optimum_ms, summary
from common.ops.arg_types import int_at_least, positive_int
from ps.control.registry import POLICIES

DEFAULT = "auto"
"""ps-server's and ps-cluster run's default policy."""
WORST_MAX = 1.05
"""Goal: the default's time over the better of the others', on every cluster."""
MEAN_MAX = 1.0
"""Goal: the same, geometric mean over the clusters."""


def _against(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in POLICIES or n == DEFAULT]
    if not names or bad:
        others = ", ".join(p for p in POLICIES if p != DEFAULT)
        raise argparse.ArgumentTypeError(f"a comma-separated list among {others}; got {text!r}")
    return list(dict.fromkeys(names))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.regimes", description=__doc__.split("\n\n")[0])
    run = p.add_argument_group("the clusters")
    run.add_argument("--clusters", type=positive_int, default=80,
                     help="clusters to draw, the regimes in turn (default 80: 20 a regime)")
    run.add_argument("--seed", type=int_at_least(0), default=0, help="draws the clusters and each step's noise")
    run.add_argument("--rounds", type=int_at_least(6), default=200, help="BSP rounds per run (default 200)")
    run.add_argument("--adjust-every", type=positive_int, default=5, help="rounds between scheduled decisions (default 5)")
    run.add_argument("--against", type=_against, default=["dynamic", "model"], metavar="NAME[,NAME...]",
                     help=f"the policies the default ({DEFAULT}) is judged against (default dynamic,model)")
    add_report_options(p.add_argument_group("output"), "regimes")
    return p


def _resolve(args: argparse.Namespace) -> None:
    args.drawn = draw(args.clusters, args.seed, args.rounds)


def run_cluster(cluster: Cluster, policies: Sequence[str], rounds: int, adjust_every: int, seed: int
                ) -> dict[str, Any]:
    """Every policy on one cluster; its record (regimes.judge)."""
    totals, optimum = {}, 0.0
    for policy in policies:
        trace = simulate(cluster.scenario(policy, rounds, adjust_every, seed + cluster.index))
        totals[policy] = sum(trace.round_ms)
        optimum = optimum_ms(trace)
    return judge(cluster, totals, optimum, DEFAULT)


def targets(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    overall = next(r for r in rows if r["regime"] == "all")
    return [
        {"name": f"simulated {DEFAULT} over the better of the others, worst of {overall['clusters']} clusters",
         "value": overall["worst"], "needs": f"≤ {WORST_MAX:g}", "pass": overall["worst"] <= WORST_MAX,
         "source": "issue: one default policy that wins on every kind of cluster"},
        {"name": f"simulated {DEFAULT} over the better of the others, geometric mean",
         "value": overall["default_over_better"], "needs": f"≤ {MEAN_MAX:g}",
         "pass": overall["default_over_better"] <= MEAN_MAX,
         "source": "issue: one default policy that wins on every kind of cluster"},
    ]


def table(rows: Sequence[dict[str, Any]], policies: Sequence[str]) -> str:
    head = (f"| regime | clusters | {DEFAULT} over the better (geometric mean) | worst | losing > 2% | "
            + " | ".join(f"{p} over the optimum" for p in policies) + " |\n"
            + "|---" * (5 + len(policies)) + "|")
    lines = [head]
    for r in rows:
        lines.append(f"| {r['regime']} | {r['clusters']} | {r['default_over_better']} | {r['worst']} "
                     f"| {r['lost_over_2pct']} | " + " | ".join(str(r["over_optimum"][p]) for p in policies) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_resolved(build_parser(), argv, _resolve)
    policies = [DEFAULT, *args.against]
    records = []
    for cluster in args.drawn:
        record = run_cluster(cluster, policies, args.rounds, args.adjust_every, args.seed)
        records.append(record)
        print(f"cluster {cluster.index + 1}/{len(args.drawn)} ({cluster.regime}, {cluster.workers} workers): "
              f"{DEFAULT} at {record['default_over_better']} of the better", file=sys.stderr, flush=True)
    rows = summary(records, policies)
    report = {"policies": policies, "rows": rows, "targets": targets(rows), "clusters": records}
    publish(args, "regimes", report, table(rows, policies), argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
