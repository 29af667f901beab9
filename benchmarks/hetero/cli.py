"""`python -m benchmarks.hetero`: the flags, the settings they resolve to, the run and its output."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.cluster_run import run_in_workdir
from benchmarks.hetero.compose import COMPOSE_SUFFIX, compose_scale
from benchmarks.hetero.modes import BALANCE_TOLERANCE, bench_throughput, bench_tta
from benchmarks.hetero.report import environment, render_table
from benchmarks.hetero.runs import CASES, CONTROLLERS, OPT_IN, POLICIES
from benchmarks.hetero.schedules import bench_schedule
from benchmarks.hetero.settings import Settings, limiter_backend, log, resolve_emulation
from benchmarks.report_output import add_report_options, emit
from benchmarks.workload import Workload
from deploy.profiles import builtin_schedules, default_cpu_budget, load_profile, load_schedule
from deploy.run_plan import DEFAULT_POLICY, unreached
from common.job.registry import resolve
from common.job.spec import MAX_EPOCHS
from common.ops.arg_types import int_between, positive_float, positive_int


SCHEDULE_EPOCH_CAP = 10_000
"""--epochs of a run through a schedule on the wall clock, which stops it at the schedule's end."""


def _fraction(text: str) -> float:
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got {text!r}")
    return value


def _adjust_every(text: str) -> str:
    if text == "epoch" or (text.isdigit() and int(text) > 0):
        return text
    raise argparse.ArgumentTypeError(f"expected 'epoch' or a positive integer, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.hetero",
        description=(
            "Emulate a heterogeneous cluster with per-worker CPU quotas and measure, in one run and under the same "
            "quotas: each worker alone (the ideal), equal-batch PyTorch DDP, and our parameter server with the "
            "uniform/static/dynamic batch controllers. Progress on stderr; JSON (--json) then a markdown table on stdout."
        ),
        epilog=(
            "examples:\n"
            "  python -m benchmarks.hetero --profile hl8 --mode bsp --json\n"
            "  python -m benchmarks.hetero --profile hl8 --mode asp --json\n"
            "  python -m benchmarks.hetero --schedule swap --json    # quotas change every 20 s; DDP beside\n"
            "  python -m benchmarks.hetero --schedule tenant --every-seconds 15 --mode asp --json\n"
            "  python -m benchmarks.hetero --schedule dynamic --every-epochs 3 --json\n"
            "  python -m benchmarks.hetero --profile hl8 --tta 0.95 --json\n"
            "  python -m benchmarks.hetero --tiny --json            # smoke test (under a minute)\n"
            "  python -m benchmarks.hetero --profile hl8 --policies dynamic,dynamic_compose --no-baselines --json\n"
            "                                                       # the cgroup emulator beside docker compose\n"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = p.add_argument_group("what to measure")
    what.add_argument("--profile", default="hl8", metavar="NAME|PATH", help="heterogeneity profile (default: hl8)")
    what.add_argument("--mode", choices=["bsp", "asp"], default="bsp", help="training mode (default: bsp)")
    what.add_argument("--schedule", metavar="NAME|PATH",
                      help="speeds that change: step the quotas through this schedule's phases while the job runs "
                      f"(built-in: {', '.join(builtin_schedules())}; or a schedule YAML file) and measure each phase, "
                      "BSP with DDP beside it (equal batches, tuned to the first phase, re-tuned at every change); "
                      "replaces --profile")
    every = what.add_mutually_exclusive_group()
    every.add_argument("--every-epochs", type=positive_int, metavar="N",
                       help="--schedule: a phase lasts N epochs (default: the schedule's own length)")
    every.add_argument("--every-seconds", type=positive_float, metavar="S",
                       help="--schedule: a phase lasts S seconds on the wall clock, from the end of round 0 "
                       "(default: the schedule's own length)")
    what.add_argument("--tta", type=_fraction, metavar="TARGET",
                      help="time uniform and dynamic to this test accuracy (default workload: digits, cnn width=96, B=512)")
    what.add_argument("--controllers", dest="controllers", metavar="LIST", help=argparse.SUPPRESS)
    what.add_argument("--policies", dest="controllers", metavar="LIST", help="comma-separated runs to make, each a batch "
                      "policy or a variant of one (--controllers is the same flag; default: bsp uniform,static,dynamic; asp "
                      "uniform,dynamic,dynamic_no_lr_scaling; --schedule " + DEFAULT_POLICY + ", the default policy; --tta uniform,dynamic; bsp also "
                      "takes dynamic_allreduce, the collective fast path, and dynamic_allreduce_ring, the same with torch's "
                      "ring all_reduce instead of the hub, dynamic_allreduce_compute, the fast path at --balance compute, dynamic_auto_trial, --allreduce auto trying both paths (with --sampling independent), and dynamic_cycle, dynamic with --balance cycle; both take dynamic_busy and "
                      "dynamic_compute, dynamic with --balance busy or compute instead of the server's default, auto: busy "
                      "for BSP on one server, compute otherwise; bsp takes dynamic_no_overlap, dynamic on the serial path "
                      "(ps-server --no-overlap: no gradient push during backward), compared with dynamic in the report's "
                      "overlap record, beside ddp_split (DDP with per-rank batches at dynamic's final plan, measured after "
                      "dynamic and after the last run); both take uniform_compose and dynamic_compose, the same "
                      "job in deploy/docker-compose.yml's containers at the same quotas, which needs a Docker engine: "
                      "deploy/engine.sh)")
    what.add_argument("--case", choices=sorted(CASES),
                      help="a batch-policy case (dynamic, model and auto by default; replaces --profile and the workload): "
                      "quickstart (the README's quick start: MLP hidden=512 on digits, B=256, one worker 4x slower) or "
                      "hl8-fixed (HL8 with the CNN and 20 ms of CPU per step on every worker)")
    what.add_argument("--no-baselines", action="store_true",
                      help="skip the ideal and DDP measurements (the default for --mode asp and --tta; --schedule "
                      "measures only DDP, phase by phase)")
    what.add_argument("--baselines", action="store_true", help="measure the ideal and DDP in every mode (BSP)")
    job = p.add_argument_group("workload (default: cnn on synthetic 32x32 images, size=4096, global batch 512)")
    job.add_argument("--model", help="model for every run (default: cnn)")
    job.add_argument("--model-arg", action="append", metavar="K=V", help="model option (--tta default: width=96)")
    job.add_argument("--dataset", help="data set (default: synthetic; --tta: digits)")
    job.add_argument("--dataset-arg", action="append", metavar="K=V", help="data set option (default: size=4096)")
    job.add_argument("--global-batch", type=positive_int, help="global batch B (default: 512)")
    job.add_argument("--epochs", type=int_between(1, MAX_EPOCHS),
                     help="epochs per run (default: 12; --schedule: phases x every, and on the wall clock the schedule's end stops "
                     "the run; --tta: 60, a run stops at the target)")
    job.add_argument("--lr", type=positive_float, help="learning rate (default: 0.02; --tta: 0.1)")
    job.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default: 0.9)")
    job.add_argument("--seed", type=int, default=0, help="model initialisation and data split (default: 0)")
    job.add_argument("--adjust-every", type=_adjust_every, metavar="{epoch,N}",
                     help="controller granularity passed to ps-server (default: epoch; --case quickstart: 5)")
    job.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                     help="extra ps-server argument, repeatable (e.g. --server-arg=--deadband=0.05)")
    emu = p.add_argument_group("emulation")
    emu.add_argument("--cpu-budget", type=positive_float, metavar="CORES",
                     help="cores shared by the workers, in the profile's ratios (default: usable CPUs - 0.5)")
    emu.add_argument("--server-share", type=positive_float, metavar="CORES",
                     help="the server's reserved CPU quota (default: bsp unlimited; asp the profile's server cores, "
                     "scaled like the workers')")
    emu.add_argument("--period-us", type=int, metavar="US", help="CFS period (default: 1 ms / smallest share, e.g. 8000 for 1/8 core)")
    emu.add_argument("--limiter", choices=["auto", "cgroup", "slowdown"],
                     help="cgroup quotas, or software slowdown (default: auto; --tiny: slowdown)")
    meas = p.add_argument_group("measurement")
    meas.add_argument("--solo-seconds", type=float, default=6.0, help="timed seconds per solo run (default: 6)")
    meas.add_argument("--ddp-seconds", type=float, default=10.0, help="about this many timed seconds of DDP (default: 10)")
    meas.add_argument("--steady-fraction", type=_fraction, default=0.5,
                      help="last fraction of the epochs that counts as steady state (default: 0.5)")
    meas.add_argument("--run-timeout", type=positive_float, default=1800.0, help="seconds per run before giving up")
    out = p.add_argument_group("output")
    add_report_options(out, "<name>")
    out.add_argument("--tiny", action="store_true",
                     help="smoke test: tiny data and model, 2 epochs, a few steps per measurement, software slowdown")
    return p


def check_flags(args: argparse.Namespace) -> None:
    """ValueError naming a combination of flags that cannot run together, or a run not on --policies' list."""
    if args.tta is not None and args.schedule is not None:
        raise ValueError("choose one of --tta and --schedule")
    if args.baselines and args.no_baselines:
        raise ValueError("choose one of --baselines and --no-baselines")
    if args.case and (args.tta is not None or args.schedule is not None or args.mode != "bsp"):
        raise ValueError("--case is a BSP throughput case: leave out --tta, --schedule and --mode asp")
    if (args.every_epochs or args.every_seconds) and args.schedule is None:
        raise ValueError("--every-epochs / --every-seconds need --schedule")
    if args.controllers is not None:
        runs, allowed = _runs(args.controllers), _allowed_runs(args)
        unknown = [c for c in runs if c not in allowed]
        if unknown or not runs:
            raise ValueError(f"--policies/--controllers: unknown {unknown or 'empty'}; choose from {sorted(allowed)}")


def _runs(text: str) -> list[str]:
    return [c.strip() for c in text.split(",") if c.strip()]


def _allowed_runs(args: argparse.Namespace) -> set[str]:
    """The runs --policies may name: a throughput run's policies and opt-ins, or any policy."""
    if args.schedule is None and args.tta is None:
        return set(CONTROLLERS[args.mode]) | set(OPT_IN[args.mode])
    return set(POLICIES)


def settings(args: argparse.Namespace, workdir: Path) -> Settings:
    """The run the flags ask for; ValueError (bad input) names what is wrong with them."""
    check_flags(args)
    case = CASES.get(args.case or "")
    profile = load_profile(case.profile if case else args.profile)
    schedule = load_schedule(args.schedule) if args.schedule is not None else None
    if schedule is not None and (args.every_epochs or args.every_seconds):
        schedule = schedule.every(epochs=args.every_epochs, seconds=args.every_seconds)
    if schedule is not None:
        profile = schedule.phases[0]
    profile.allocation(args.mode)  # ValueError if the profile lacks the mode
    tta = args.tta is not None
    if case is not None:  # small enough for --tiny as it is
        workload = case.workload
    elif args.tiny:
        workload = Workload(model="cnn", model_args=("width=8",), dataset="synthetic",
                            dataset_args=("size=320", "image_size=16"), global_batch=64)
        if tta:
            workload = Workload(model="mlp", model_args=("hidden=32",), dataset="digits", dataset_args=(), global_batch=64)
    elif tta:
        # compute-bound on digits (a balanced step ~100 ms at HL8, as the throughput runs): the runs
        # then measure balancing, not the RPC's fixed cost per step
        workload = Workload(model="cnn", model_args=("width=96",), dataset="digits", dataset_args=(), global_batch=512)
    else:
        workload = Workload()
    lr = args.lr if args.lr is not None else ((case.workload.lr if case else Workload.lr) if not tta else 0.1)
    workload = replace(
        workload,
        model=args.model or workload.model,
        model_args=tuple(args.model_arg) if args.model_arg else workload.model_args,
        dataset=args.dataset or workload.dataset,
        dataset_args=tuple(args.dataset_arg) if args.dataset_arg else workload.dataset_args,
        global_batch=args.global_batch or workload.global_batch,
        lr=lr, momentum=args.momentum, seed=args.seed,
    )
    # torch only once the arguments are parsed: --help and bad arguments answer at once
    from common.job.datasets import DATASETS
    from common.job.models import MODELS

    resolve(workload.model, MODELS, "model")  # an unknown name is refused here, not by the first solo run's child
    resolve(workload.dataset, DATASETS, "dataset")
    if schedule is not None:
        # on the wall clock the schedule ends the run; --epochs only bounds it
        epochs = args.epochs or (int(schedule.interval) * len(schedule.phases) if schedule.every_epochs is not None
                                 else SCHEDULE_EPOCH_CAP)
        default_runs = [DEFAULT_POLICY]
    elif tta:
        epochs = args.epochs or (3 if args.tiny else 60)
        default_runs = ["uniform", "dynamic"]
    elif case is not None:
        epochs = args.epochs or (2 if args.tiny else case.epochs)
        default_runs = ["dynamic", "model", "auto"]
    else:
        epochs = args.epochs or (2 if args.tiny else 12)
        default_runs = CONTROLLERS[args.mode]
    controllers = _runs(args.controllers) if args.controllers is not None else default_runs
    baselines = (args.mode == "bsp" and not tta and case is None) \
        if not (args.baselines or args.no_baselines) else args.baselines
    return Settings(
        mode=args.mode, profile=profile, schedule=schedule, tta=args.tta, workload=workload, epochs=epochs,
        controllers=controllers, adjust_every=args.adjust_every or (case.adjust_every if case else "epoch"),
        cpu_budget=args.cpu_budget or default_cpu_budget(), server_share=args.server_share, period_us=args.period_us,
        limiter=args.limiter or ("slowdown" if args.tiny and schedule is None else "auto"),
        baselines=baselines,
        solo_seconds=0.0 if args.tiny else args.solo_seconds, solo_warmup=1 if args.tiny else 2,
        solo_min_steps=2 if args.tiny else 3,
        ddp_seconds=0.0 if args.tiny else args.ddp_seconds, ddp_warmup=1 if args.tiny else 3,
        ddp_min_steps=2 if args.tiny else 5,
        steady_fraction=args.steady_fraction,
        server_args=["--quiet", *args.server_arg], run_timeout=args.run_timeout, workdir=workdir, tiny=args.tiny,
    )


def report_name(s: Settings) -> str:
    if s.schedule is not None:
        return f"hetero-{s.mode}-schedule-{s.schedule.name}"
    if s.tta is not None:
        return f"hetero-{s.mode}-{s.profile.name}-tta"
    if s.profile.name in CASES:
        return f"hetero-case-{s.profile.name}"
    return f"hetero-{s.mode}-{s.profile.name}"


def run(s: Settings) -> dict[str, Any]:
    """Measure everything the settings ask for; the report as a dict."""
    emu = resolve_emulation(s)
    kind = "schedule" if s.schedule is not None else "tta" if s.tta is not None else "throughput"
    report: dict[str, Any] = {
        "benchmark": "hetero",
        "kind": kind,
        "mode": s.mode,
        "profile": s.profile.name,
        "schedule": None if s.schedule is None else {
            "name": s.schedule.name, "unit": s.schedule.unit, "every": s.schedule.interval,
            "phases": [p.name for p in s.schedule.phases]},
        "tiny": s.tiny,
        "environment": environment(s, emu),
        "workload": {**s.workload.describe(), "epochs": s.epochs, "adjust_every": s.adjust_every,
                     "steady_fraction": s.steady_fraction, "balance_tolerance": BALANCE_TOLERANCE,
                     "server_args": s.server_args},
        "ideal": None,
        "ddp_uniform": None,
        "ddp_split": None,
        "runs": {},
        "targets": [],
        "timings_s": {},
    }
    if s.schedule is not None and (left := unreached(s.schedule, s.epochs)):
        log(f"warning: {left}")
    env = report["environment"]
    log(f"{report_name(s)}: limiter {env['limiter']}, cpu budget {env['cpu_budget']}, shares {env['shares']}"
        + (f", server {env['server_share']}" if env["server_share"] else "") + f", period {env['period_us']} us, "
        f"load average {env['loadavg_start']}")
    started = time.monotonic()
    if kind == "schedule":
        bench_schedule(s, emu, report)
    elif kind == "tta":
        bench_tta(s, emu, report)
    else:
        bench_throughput(s, emu, report)
    report["timings_s"]["total"] = round(time.monotonic() - started, 1)
    env["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:  # every refusal of the flags (profiles, schedules, the limiter too) as argparse's, before any folder
        s = settings(args, Path())
        limiter_backend(s)
        if any(name.endswith(COMPOSE_SUFFIX) for name in s.controllers):  # else refused after the runs before it
            compose_scale(s, resolve_emulation(s))
    except ValueError as exc:
        parser.error(str(exc))  # exit 2
    code, report = run_in_workdir("hetero", args.out, lambda workdir: run(replace(s, workdir=workdir)))
    if report is None:
        return code
    emit(args, "hetero", report_name(s), report, render_table(report), argv)
    return 0
