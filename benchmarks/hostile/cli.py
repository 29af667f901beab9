"""`python -m benchmarks.hostile`: the flags, the job they resolve to, the clean run and one run per
attack, and the output."""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.cli_types import choices, emulation_arguments, parse_resolved
from benchmarks.cluster_run import run_in_workdir
from benchmarks.hostile.report import against_clean, held, render_table, targets
from benchmarks.hostile.runs import ATTACKS, EXTRA_MEMBERS, Job, chosen_attacks, run_once
from benchmarks.report_output import add_report_options, emit
from common.ops.arg_types import positive_float, positive_int
from deploy.profiles import load_profile
from deploy.run_plan import RunConfig, resolve
from ps.rounds.deadlines import Limits

QUICK_MODEL_ARGS = ["width=4"]
QUICK_DATASET_ARGS = ["size=384", "image_size=8", "shift=1", "separation=1.5"]
EPOCHS = 30
"""Of ps-cluster run's quick job: about 150 rounds, half a minute of training on two cores, so that an
attack has time to act (the round deadline is 5 s at least, a stalled push sends a chunk every 5 s)."""
QUICK_EPOCHS = 6
"""--quick's: a second or two of training, time for every attacker to be answered at least once."""
TIMEOUT_FACTOR = 3.0
"""A run under attack stops at this many times the clean run's time (its ratio then reads below 1/3)."""
LEAST_TIMEOUT_S = 60.0


def log(message: str) -> None:
    print(f"hostile: {message}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.hostile",
        description="An emulated heterogeneous job (HL4 by default) run once clean and once beside each attack "
        "of a hostile client written from protos/ alone: per attack the samples/s against the clean run's, the "
        "longest open round against the round deadline, and whether the job finished with every invariant held. "
        "Progress on stderr; JSON (--json) then a markdown table on stdout.",
        epilog="examples:\n"
        "  python -m benchmarks.hostile --json --save-result         # HL4: clean, then the four attacks\n"
        "  python -m benchmarks.hostile --profile hl8 --shards 2 --json   # and a departed id at the shards\n"
        "  python -m benchmarks.hostile --allreduce --attacks store_rewrites --json\n"
        "  python -m benchmarks.hostile --quick --json              # smoke test: a tiny job\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = p.add_argument_group("what to measure")
    what.add_argument("--profile", default="hl4", metavar="NAME|PATH", help="heterogeneity profile, e.g. hl8 (default: hl4)")
    what.add_argument("--attacks", type=choices(list(ATTACKS)), default=None, metavar="LIST",
                      help=f"comma-separated attacks, of {','.join(ATTACKS)} (default: every one the job has: "
                      "departed_at_shards needs --shards, store_rewrites --allreduce)")
    what.add_argument("--shards", type=positive_int, default=1, help="every run with ps-server --shards N (default: 1)")
    what.add_argument("--allreduce", action="store_true", help="every run on the --allreduce fast path")
    what.add_argument("--epochs", type=positive_int, default=None, help=f"epochs of each run (default: 30, about 150 rounds; --quick: {QUICK_EPOCHS})")
    what.add_argument("--run-timeout", type=positive_float, default=None, metavar="S",
                      help=f"seconds a run under attack may take before its server is stopped (default: "
                      f"{TIMEOUT_FACTOR:g} x the clean run's, at least {LEAST_TIMEOUT_S:g})")
    what.add_argument("--quick", action="store_true",
                      help=f"smoke test: a tiny CNN and data set, {QUICK_EPOCHS} epochs, software slowdown")
    emulation_arguments(p)
    add_report_options(p.add_argument_group("output"), "hostile")
    return p


def resolve_defaults(args: argparse.Namespace) -> None:
    """Fill the defaults that depend on --quick; ValueError for an attack the job cannot have."""
    args.epochs = args.epochs or (QUICK_EPOCHS if args.quick else EPOCHS)
    args.limiter = args.limiter or ("slowdown" if args.quick else "auto")
    args.attacks, args.skipped = chosen_attacks(args.attacks, args.shards, args.allreduce)


def build_job(args: argparse.Namespace, workdir: Path) -> Job:
    """The job every run starts: ps-cluster run's quick job (cnn on patterns, B 256) for --epochs on the
    profile, the dynamic policy, a fresh token, room for the attackers that join."""
    workers = len(load_profile(args.profile).allocation("bsp").workers)
    token = secrets.token_hex(16)
    extra = ["--token", token, "--max-workers", str(workers + EXTRA_MEMBERS)]
    extra += ["--shards", str(args.shards)] if args.shards > 1 else []
    extra += ["--allreduce", "on"] if args.allreduce else []
    config = RunConfig(profile=args.profile, policy="dynamic", quick=True, epochs=args.epochs, cpu_budget=args.cpu_budget,
                       limiter=args.limiter, out=workdir, server_args=extra,
                       model_args=QUICK_MODEL_ARGS if args.quick else None,
                       dataset_args=QUICK_DATASET_ARGS if args.quick else None,
                       global_batch=64 if args.quick else None)
    plan = resolve(config)
    global_batch = int(plan.server_args[plan.server_args.index("--global-batch") + 1])
    return Job(tuple(plan.server_args), tuple(plan.names), tuple(plan.shares[0]), plan.period_us, args.limiter, token,
               global_batch, workdir)


def shown_args(job: Job) -> list[str]:
    """The server's flags with the token's value left out."""
    return ["<token>" if previous == "--token" else a for previous, a in zip(["", *job.server_args], job.server_args)]


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The clean run, then each attack's; the report."""
    started = time.monotonic()
    job = build_job(args, workdir)
    log(f"{args.profile}: workers {dict(zip(job.names, job.shares))}, limiter {job.limiter}, attacks {args.attacks}")
    timings: dict[str, float] = {}
    t = time.monotonic()
    clean = run_once(job, None, float("inf"), log)
    timings["clean"] = round(time.monotonic() - t, 1)
    if not clean["finished"]:
        raise RuntimeError(f"the clean run did not finish (see {workdir / 'clean'}): nothing to compare with")
    timeout = args.run_timeout or max(LEAST_TIMEOUT_S, TIMEOUT_FACTOR * float(clean["wall_s"]))
    log(f"clean: {clean['samples_per_s']} samples/s, longest round {clean['longest_round_open_s']} s; "
        f"each attack's run stops at {timeout:g} s")
    clean["held"] = held(clean)
    runs: dict[str, dict[str, Any]] = {"clean": clean}
    floor = Limits().floor_s
    for attack in args.attacks:
        t = time.monotonic()
        record = runs[attack] = run_once(job, attack, timeout, log)
        timings[attack] = round(time.monotonic() - t, 1)
        against_clean(clean, record, floor)
        log(f"{attack}: {record['samples_per_s']} samples/s ({record['ratio']} of clean), longest round "
            f"{record['longest_round_open_s']} s (bound {record['round_bound_s']}), held {record['held']}")
    timings["total"] = round(time.monotonic() - started, 1)
    return {
        "benchmark": "hostile", "profile": args.profile, "quick": args.quick,
        "job": {"server_args": shown_args(job), "worker_shares": dict(zip(job.names, job.shares)),
                "limiter": job.limiter, "global_batch": job.global_batch, "epochs": args.epochs},
        "attacks": {a: ATTACKS[a] for a in args.attacks}, "skipped": args.skipped, "run_timeout_s": round(timeout, 1),
        "runs": runs, "targets": targets(args.profile, {a: runs[a] for a in args.attacks}), "timings_s": timings,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_resolved(build_parser(), argv, resolve_defaults)
    code, report = run_in_workdir("hostile", args.out, lambda workdir: run(args, workdir))
    if report is None:
        return code
    emit(args, "hostile", "hostile", report, render_table(report), argv)
    return 0
