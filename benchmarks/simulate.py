"""`python -m benchmarks.simulate`: the batch policies at many workers, by simulation.

Drives the real policies of ps/control (any registered name) with simulated BSP workers whose step
takes t = q·b + s times lognormal noise (benchmarks/simulation/), at every N of ``--workers`` and
for every policy of ``--policies``, with and without a speed change of ``--change-fraction`` of the
workers halfway through. Per run it reports the decisions to a steady plan, the final plan's round
over the exact optimum, the policy's CPU per decision and per round, and after the change the
decisions to steady again; every plan is checked to sum to B. Run as a program, its process's garbage
collector is tuned as ps-server's (common/ops/collector.py), so a decision's CPU is the server's. A
policy's own settings are ps-server's flags, ``--<policy>-<setting>``. The definitions are
benchmarks/simulation/metrics.py's; the time law and its limits are docs/scaling.md's. With ``--out
DIR`` the curves against N are drawn too, as DIR/simulate.png (benchmarks/simulation/plots.py).

    python -m benchmarks.simulate --workers 16,256,1024,10000 --json --save-result
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.cli_types import parse_resolved
from benchmarks.report_output import add_report_options, publish
from benchmarks.simulation.engine import MAX_FACTOR, MAX_GLOBAL_BATCH, Event, Scenario
from benchmarks.simulation.plots import FILE as PLOT_FILE, plot_rows
from benchmarks.simulation.population import MAX_MS, MAX_SIGMA, MIN_Q_MS, SpeedLaw, parse_classes
from benchmarks.simulation.sweep import grid, scenarios, summary, table, targets
from common.ops.arg_types import float_between, from_value_error, int_at_least, positive_int
from common.ops.collector import tune_collector
from ps.control.registry import POLICIES, policy_settings
from ps.server_flags import add_policy_settings, setting_dest


def _sizes(text: str) -> list[int]:
    sizes = [int(x) for x in text.split(",") if x.strip()]
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"a comma-separated list of worker counts >= 1, got {text!r}")
    return sizes


def _policies(text: str) -> list[str]:
    names = list(POLICIES) if text == "all" else [x.strip() for x in text.split(",") if x.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"policies must be 'all' or among {', '.join(POLICIES)}; got {text!r}")
    return names


def _event(kind: str) -> Callable[[str], Event]:
    """The type of ``--<kind> ROUND:COUNT``: an Event, or a usage error that says what is wrong."""
    def parse(text: str) -> Event:
        try:
            at, count = (int(x) for x in text.split(":"))
        except ValueError:
            raise ValueError(f"expected ROUND:COUNT, got {text!r}") from None
        return Event(at, kind, count=count)
    return from_value_error(parse)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.simulate", description=__doc__.split("\n\n")[0])
    run = p.add_argument_group("the runs")
    run.add_argument("--workers", type=_sizes, default=[16, 256, 1024, 10_000], metavar="N[,N...]",
                     help="worker counts (default 16,256,1024,10000)")
    run.add_argument("--policies", type=_policies, default=list(POLICIES), metavar="NAME[,NAME...]|all",
                     help=f"registered policies to simulate (default all: {', '.join(POLICIES)})")
    run.add_argument("--rounds", type=positive_int, default=200, help="BSP rounds per run (default 200)")
    run.add_argument("--adjust-every", type=positive_int, default=5, help="rounds between scheduled decisions (default 5)")
    run.add_argument("--batch-per-worker", type=positive_int, default=64, help="global batch B = this times N (default 64)")
    run.add_argument("--seed", type=int_at_least(0), default=0)
    run.add_argument("--change", choices=("no", "yes", "both"), default="both",
                     help="runs without the speed change, with it, or both (default)")
    run.add_argument("--change-fraction", type=float_between(0.0, 1.0), default=0.2, help="share of the workers whose speed changes (default 0.2)")
    run.add_argument("--change-factor", type=float_between(1.0 / MAX_FACTOR, MAX_FACTOR), default=2.0,
                     help="each changed worker becomes this many times slower or faster, each way with equal chance (default 2)")
    run.add_argument("--join", type=_event("join"), action="append", default=[], metavar="ROUND:COUNT",
                     help="COUNT workers join during ROUND (repeatable)")
    run.add_argument("--leave", type=_event("leave"), action="append", default=[], metavar="ROUND:COUNT")
    run.add_argument("--fail", type=_event("fail"), action="append", default=[], metavar="ROUND:COUNT",
                     help="COUNT workers stop answering in ROUND; the round waits --evict-ms for them")
    law = p.add_argument_group("the workers' time law: t = q·b + s, times lognormal noise")
    law.add_argument("--q-ms", type=float_between(MIN_Q_MS, MAX_MS), default=0.5, help="median time per sample, ms (default 0.5)")
    law.add_argument("--sigma", type=float_between(0.0, MAX_SIGMA), default=0.5,
                     help=f"lognormal spread of the time per sample, at most {MAX_SIGMA:g} (default 0.5)")
    law.add_argument("--s-ms", type=float_between(0.0, MAX_MS), default=10.0, help="fixed cost per step, ms (default 10)")
    law.add_argument("--noise", type=float_between(0.0, MAX_SIGMA), default=0.05,
                     help=f"σ of each step's lognormal noise, at most {MAX_SIGMA:g} (default 0.05)")
    law.add_argument("--classes", type=from_value_error(parse_classes), default=[], metavar="NAME:Q:S[:WEIGHT],...",
                     help="a mix of device classes instead of lognormal speeds")
    server = p.add_argument_group("the server and the policy's settings")
    server.add_argument("--server-fixed-ms", type=float_between(0.0, MAX_MS), default=1.0, help="the server's cost per round, ms (default 1)")
    server.add_argument("--server-per-worker-ms", type=float_between(0.0, MAX_MS), default=0.02,
                        help="the server's cost per pushing worker per round, ms (default 0.02)")
    server.add_argument("--evict-ms", type=float_between(0.0, MAX_MS, low_open=True), default=10_000.0, help="wait before a failed worker is evicted")
    server.add_argument("--deadband", type=float_between(0.0, 1.0, high_open=True), default=0.1)
    server.add_argument("--min-batch", type=positive_int, default=1)
    server.add_argument("--max-batch", type=positive_int, default=None)
    server.add_argument("--micro-batch", type=positive_int, default=1)
    server.add_argument("--min-samples", type=positive_int, default=3)
    add_policy_settings(p.add_argument_group("the policies' own settings (as ps-server's flags)"))
    add_report_options(p.add_argument_group("output"), "simulate")
    return p


def own_settings(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The values given for the simulated policies' own settings, by policy and setting (the rest keep
    their defaults); ValueError for a setting's flag of a policy `--policies` leaves out."""
    options: dict[str, dict[str, Any]] = {}
    for policy in POLICIES:
        for setting in policy_settings(policy):
            if hasattr(args, setting_dest(policy, setting)):
                if policy not in args.policies:
                    raise ValueError(f"{setting.flag(policy)} is for policy {policy}, which --policies leaves out")
                options.setdefault(policy, {})[setting.name] = getattr(args, setting_dest(policy, setting))
    return options


FLAGS = {"global_batch": "B", "adjust_every": "--adjust-every", "min_batch": "--min-batch", "max_batch": "--max-batch",
         "micro_batch": "--micro-batch", "min_samples": "--min-samples", "server_fixed_ms": "--server-fixed-ms",
         "server_per_worker_ms": "--server-per-worker-ms", "evict_ms": "--evict-ms"}
"""A scenario's (and its policy's) settings by the flags that give them (B: --batch-per-worker x N)."""


def in_flags(message: str) -> str:
    """`message` with the scenario's field names put as the flags that set them, and a B to raise or
    lower as the flag that sets it here, --batch-per-worker (the simulator has no global batch flag)."""
    message = re.sub(rf"\b({'|'.join(FLAGS)})\b", lambda m: FLAGS[m.group(1)], message)
    return re.sub(r"\b(raise|lower) B\b", r"\1 --batch-per-worker", message)


def check_micro_batch(args: argparse.Namespace) -> None:
    """ValueError for a --micro-batch that leaves a run's B (--batch-per-worker x N) no whole number of
    micro-batches, naming the nearest values of --batch-per-worker and of --micro-batch that make every
    run's B whole and leave each worker room for its least batch (a --min-batch of whole micro-batches):
    the scenario's own refusal would suggest a global batch, which no flag here sets."""
    m, per = args.micro_batch, args.batch_per_worker
    short = next((n for n in args.workers if per * n % m), None)
    if short is None:
        return
    step = math.lcm(*(m // math.gcd(m, n) for n in args.workers))  # every B is whole for a multiple of it
    least = -(-args.min_batch // m) * m
    pers = [v for v in (per // step * step, max(per // step + 1, -(-least // step)) * step) if v >= least]
    whole = per * math.gcd(*args.workers)  # what every run's B is a multiple of
    fits = [d for d in _divisors(whole) if -(-args.min_batch // d) * d <= per]
    micros = [*[d for d in fits if d < m][-1:], *[d for d in fits if d > m][:1]]  # the nearest below and above
    other = f", or --micro-batch {' or '.join(map(str, micros))}" if micros else ""
    raise ValueError(f"B {per * short} (--batch-per-worker {per} x {short} workers) is not a multiple of --micro-batch "
                     f"{m}; use --batch-per-worker {' or '.join(map(str, pers))}{other}")


def _divisors(n: int) -> list[int]:
    """The divisors of `n` (>= 1), ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def check_global_batch(args: argparse.Namespace) -> None:
    """ValueError for a run whose B (--batch-per-worker x N) is above engine.py's MAX_GLOBAL_BATCH,
    naming the largest --batch-per-worker every run takes (before check_micro_batch factors B)."""
    most = max(args.workers)
    if args.batch_per_worker * most > MAX_GLOBAL_BATCH:
        raise ValueError(f"B {args.batch_per_worker * most} (--batch-per-worker {args.batch_per_worker} x {most} workers) "
                         f"is above 2**53; use --batch-per-worker {MAX_GLOBAL_BATCH // most} at most")


def check_event_rounds(args: argparse.Namespace) -> None:
    """ValueError for a --join, --leave or --fail event at or after --rounds: the run would never reach it."""
    for event in (*args.join, *args.leave, *args.fail):
        if event.round >= args.rounds:
            raise ValueError(f"--{event.kind} {event.round}:{event.count}: round {event.round} is past the run's "
                             f"last (rounds 0 to {args.rounds - 1} with --rounds {args.rounds})")


def resolve(args: argparse.Namespace) -> None:
    """Every run of the grid as `args.scenarios`, each checked as it is built (with the policies' own
    settings, `args.options`): ValueError says what no run could go through, naming the flags."""
    args.options = own_settings(args)
    if args.max_batch is not None and args.max_batch < args.min_batch:
        raise ValueError(f"--max-batch {args.max_batch} is below --min-batch {args.min_batch}")
    check_event_rounds(args)
    check_global_batch(args)
    check_micro_batch(args)
    try:
        args.scenarios = grid_scenarios(args)
    except ValueError as exc:
        raise ValueError(in_flags(str(exc))) from None


def grid_scenarios(args: argparse.Namespace) -> list[tuple[Scenario, int | None]]:
    """The grid's runs from the flags (sweep.scenarios), each checked as it is built."""
    law = SpeedLaw(q_ms=args.q_ms, s_ms=args.s_ms, sigma=args.sigma, noise=args.noise, classes=args.classes)
    base = Scenario(policy=args.policies[0], workers=args.workers[0], global_batch=args.batch_per_worker * args.workers[0],
                    rounds=args.rounds, adjust_every=args.adjust_every, law=law, seed=args.seed,
                    deadband=args.deadband, min_batch=args.min_batch, max_batch=args.max_batch,
                    micro_batch=args.micro_batch, min_samples=args.min_samples,
                    server_fixed_ms=args.server_fixed_ms, server_per_worker_ms=args.server_per_worker_ms,
                    evict_ms=args.evict_ms, events=(*args.join, *args.leave, *args.fail), policy_options=args.options)
    return scenarios(base, args.policies, args.workers, args.batch_per_worker, args.change,
                     args.change_fraction, args.change_factor)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_resolved(build_parser(), argv, resolve)
    runs = grid(args.scenarios, progress=lambda line: print(line, file=sys.stderr, flush=True))
    rows = summary(runs)
    report = {"rows": rows, "targets": targets(rows, args.change_fraction), "runs": runs}
    publish(args, "simulate", report, table(rows), argv)
    if args.out is not None:  # the curves against N beside the report
        plot_rows(rows, args.out / PLOT_FILE)
    return 0


if __name__ == "__main__":
    tune_collector()  # as ps-server does, in this process alone (not in a caller of main's)
    sys.exit(main())
