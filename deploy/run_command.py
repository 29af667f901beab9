"""``ps-cluster run``: emulate a heterogeneous cluster on this machine (deploy/emulator.py) and train a job
on it; its exit status says whether the input was bad (2), the run failed (1), the job ended early (3, as
ps-server's) or it was stopped."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from common.job.endings import ENDED_EARLY, ended_early
from common.job.spec import MAX_EPOCHS
from common.ops.arg_types import int_between, positive_float, positive_int
from deploy.cli_arguments import PROG, Subcommands, profile_argument
from deploy.profiles import MODES, builtin_schedules, default_cpu_budget
from ps.control.registry import POLICIES


def _run(args: argparse.Namespace) -> int:
    from deploy import emulator
    from deploy.launcher import ServerStartError
    from deploy.signals import Terminated

    config = emulator.RunConfig(
        profile=args.profile, schedule=args.schedule, every_epochs=args.every_epochs,
        every_seconds=args.every_seconds, mode=args.mode, cpu_budget=args.cpu_budget,
        policy=args.policy, epochs=args.epochs, model=args.model, model_args=args.model_arg,
        dataset=args.dataset, dataset_args=args.dataset_arg, global_batch=args.global_batch, lr=args.lr,
        adjust_every=args.adjust_every, limiter=args.limiter, out=args.out, quick=args.quick,
        server_args=[*args.server_arg, *([] if args.overlap else ["--no-overlap"])],
    )
    try:
        result = emulator.run(config)
    except ServerStartError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2 if exc.returncode == 2 else 1
    except emulator.RunFailed as exc:
        print(f"{PROG}: error: run failed: {exc}", file=sys.stderr)
        return 1
    except Terminated as exc:
        print(f"{PROG}: {exc}; the run was stopped and its processes and cgroups removed", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; the run was stopped and its processes and cgroups removed", file=sys.stderr)
        return 130
    except (ValueError, TypeError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except (RuntimeError, OSError) as exc:
        print(f"{PROG}: error: run failed: {exc}", file=sys.stderr)
        return 1
    if ended_early(result["summary"]["reason"]):  # its report and plots are written: they show how far it came
        print(f"{PROG}: error: the job ended early, after {result['epochs']} of its epochs (the 'job ended' line above "
              "says why)", file=sys.stderr)
        return ENDED_EARLY
    return 0


def add_run_command(subcommands: Subcommands) -> None:
    """``run``: emulate a heterogeneous cluster on this machine and train the main job on it."""
    from deploy import emulator

    default = emulator.DEFAULT_JOB
    quick = emulator.QUICK_JOB
    parser = subcommands.add_parser(
        "run",
        help="train on an emulated heterogeneous cluster on this machine (CPU quotas per worker)",
        description=textwrap.fill("Start a parameter server and one worker process per worker of a profile on this "
        "machine, each worker confined to its share of the CPU budget (a cgroup CPU quota; where "
        "cgroups are not writable, a --slowdown factor with the same ratios), train, and print the "
        "batch size and compute time of every worker per epoch. Ends with a summary table and the "
        "plots batch_sizes.png, compute_times.png and accuracy.png in --out (ASP: asp.png too). "
        f"Without options: BSP, the {emulator.DEFAULT_POLICY} batch policy, {default['model']} on "
        f"{default['dataset']} ({' '.join(emulator.DEFAULT_DATASET_ARGS['patterns'])}), global batch "
        f"{default['global_batch']}, {default['epochs']} epochs, lr {default['lr']}: 1-3 minutes on 2 cores.", width=88),
        epilog="examples:\n"
        "  ps-cluster run --profile hl8                        # the main job\n"
        "  ps-cluster run --profile hl8 --quick                # a short run (about 30 s)\n"
        "  ps-cluster run --schedule dynamic --quick           # HL1->HL8->HL1, 2 epochs per phase\n"
        "  ps-cluster run --schedule swap --every-epochs 2 --quick   # HL8, fast and slow swapped, even, HL8\n"
        "  ps-cluster run --profile hl4 --policy uniform   # the baseline: equal batches\n"
        "  ps-cluster run --mode asp --server-arg=--staleness-bound=2   # ASP, stale-synchronous\n"
        "exit status: 0 done, 1 the run failed (a worker or the server died), 2 bad input, 3 the job ended early\n"
        "(ps-server's 3: the workers left could not make up --global-batch, ...; the report and plots are written).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = parser.add_argument_group("cluster")
    profile_argument(where)
    where.add_argument("--schedule", metavar="NAME|PATH",
                       help=f"change the profile over time instead: built-in schedule "
                       f"({', '.join(builtin_schedules())}) or a schedule YAML file; replaces --profile")
    interval = where.add_mutually_exclusive_group()
    interval.add_argument("--every-epochs", type=positive_int, metavar="N",
                          help="switch phases every N epochs (default: the schedule's; 2 with --quick)")
    interval.add_argument("--every-seconds", type=positive_float, metavar="S",
                          help="switch phases every S seconds of training instead")
    where.add_argument("--mode", choices=MODES, default="bsp", type=str.lower,
                       help="training mode and the profile's allocation for it (default: bsp; asp also "
                       "gives the server its quota)")
    where.add_argument("--cpu-budget", type=positive_float, metavar="CORES",
                       help="cores shared by the workers, in the profile's ratios (default: the usable "
                       f"CPUs minus 0.5 for the server, {default_cpu_budget():g} here)")
    where.add_argument("--limiter", choices=("auto", "cgroup", "slowdown"), default="auto",
                       help="auto: cgroup CPU quotas where writable, else --slowdown factors; cgroup: "
                       "quotas or fail; slowdown: force the fallback (default: auto)")
    job = parser.add_argument_group("job (passed to ps-server)")
    job.add_argument("--controller", dest="policy", choices=tuple(POLICIES), help=argparse.SUPPRESS)
    job.add_argument("--policy", choices=tuple(POLICIES),
                     help="batch policy (--controller is another name for this flag): equal batches, from the declared "
                          "cores, measured, fitted with parking, or auto: measured until each worker's time law is "
                          "fitted, then solved from the fits, and measured again when a worker's speed changes "
                          f"(docs/policies.md; default: {emulator.DEFAULT_POLICY}, as ps-server's, on a profile and "
                          "on a schedule)")
    job.add_argument("--epochs", type=int_between(1, MAX_EPOCHS),
                     help=f"passes over the training split (default: {default['epochs']}, "
                     f"{quick['epochs']} with --quick; with a schedule in epochs: phases x interval)")
    job.add_argument("--model", help=f"built-in model (mlp, cnn) or package.module:function (default: {default['model']})")
    job.add_argument("--model-arg", action="append", metavar="K=V", help="model option, e.g. width=16")
    job.add_argument("--dataset", help=f"built-in dataset (digits, synthetic, patterns, teacher) or package.module:function "
                     f"(default: {default['dataset']})")
    job.add_argument("--dataset-arg", action="append", metavar="K=V",
                     help="dataset option, e.g. size=8192 (default for patterns: "
                     f"{' '.join(emulator.DEFAULT_DATASET_ARGS['patterns'])}; with --quick "
                     f"{' '.join(emulator.QUICK_DATASET_ARGS['patterns'])})")
    job.add_argument("--global-batch", type=positive_int, metavar="B",
                     help=f"global batch split across the workers (default: {default['global_batch']}, "
                     f"{quick['global_batch']} with --quick)")
    job.add_argument("--lr", type=positive_float, help=f"learning rate (default: {default['lr']})")
    job.add_argument("--adjust-every", metavar="epoch|N",
                     help="batch policy decisions at every epoch end (default) or every N steps")
    job.add_argument("--server-arg", action="append", default=[], metavar="ARGS",
                     help="more ps-server arguments, e.g. --server-arg=--deadband=0.2 or "
                     "--server-arg='--momentum 0.5' (repeatable)")
    job.add_argument("--no-overlap", dest="overlap", action="store_false",
                     help="BSP: the serial path (ps-server --no-overlap): workers push the whole gradient after "
                     "backward and take the whole reply before the next forward, instead of streaming gradient buckets "
                     "while backward runs and the parameters back while the next forward runs")
    output = parser.add_argument_group("output")
    output.add_argument("--out", type=Path, metavar="DIR",
                        help="folder for the metrics log, server/worker logs, summary.json and plots "
                        "(default: runs/<timestamp>)")
    output.add_argument("--quick", action="store_true",
                        help=f"a short run: {quick['epochs']} epochs on a small dataset, for smoke tests "
                        "and first impressions")
    parser.set_defaults(handler=_run)
