"""``ps-cluster slurm``: write a profile's heterogeneous Slurm job (deploy/slurm.py), and submit and follow it.

:func:`deploy.cli.add_slurm_command` registers it (and adds ``--mode`` and ``--scale``); errors are
ValueError/RuntimeError, which ``ps-cluster`` turns into one line and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from datetime import datetime
from pathlib import Path

from common.ops.arg_types import positive_int
from deploy import k8s, slurm, slurm_follow
from deploy.cli_arguments import profile_argument
from deploy.profiles import load_profile
from deploy.server_args import check_server_command, given_options, server_parser, split_server_args


def _slurm(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    profile.allocation(args.mode)  # ValueError if the profile lacks the mode
    parser = server_parser()
    extra = split_server_args(
        args.server_arg, parser,
        lambda flag: " is set by ps-cluster slurm (from the profile and the job folder)" if flag in slurm.SET_HERE else None,
    )
    out: Path | None = args.out
    if out is None and args.submit:
        out = Path("runs") / datetime.now().strftime("slurm-%Y%m%d-%H%M%S")
    options = slurm.SlurmOptions(
        profile=profile, mode=args.mode, scale=args.scale, job_args=k8s.job_args(extra, given_options(extra, parser)),
        job_name=args.job_name, job_dir=None if out is None else out.resolve(), python=args.python or sys.executable,
        partition=args.partition, account=args.account, time=args.time, memory=args.memory, gres=args.gres,
        server_cpus=args.server_cpus, limiter=args.limiter, listen=args.listen,
    )
    check_server_command(parser, [*slurm.server_args(options), "--port", "0"])  # the whole job, as ps-server will see it
    text = slurm.render(options)
    if out is None:
        sys.stdout.write(text)
        return 0
    try:
        out.mkdir(parents=True, exist_ok=True)
        script = out / slurm.SCRIPT_NAME
        script.write_text(text, encoding="utf-8")
        script.chmod(0o755)
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None
    if any((out / slurm.CHECKPOINTS).glob("ckpt-*.pt")):
        print(f"{args.prog}: {out / slurm.CHECKPOINTS} holds checkpoints: the job resumes from the newest", file=sys.stderr)
    if not args.submit:
        print(f"{args.prog}: wrote {script}: sbatch {script}", file=sys.stderr)
        return 0
    job_id = slurm_follow.submit(script)
    print(f"job {job_id}: submitted {script}; output in {out.resolve()}/", flush=True)
    try:
        return slurm_follow.follow(job_id, out)
    except KeyboardInterrupt:
        print(f"{args.prog}: stopped following; job {job_id} goes on (scancel {job_id} stops it)", file=sys.stderr)
        return 130


def add_slurm_parser(subcommands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``slurm`` to ``ps-cluster``'s subcommands; its parser, for the options every subcommand shares."""
    parser = subcommands.add_parser(
        "slurm",
        help="write (and submit) a heterogeneous Slurm job for a profile: the server and each class of worker",
        description=textwrap.fill(
            "Write the batch script of a heterogeneous Slurm job for a profile: the parameter server as the "
            "first component, then one component per class of worker (the workers with the same cores and "
            "GPUs), each task with the profile's cores times --scale as its CPUs and its GPUs as --gres. The "
            "script keeps the token in a 0600 file of the job folder and hands it to the steps in PS_TOKEN, "
            "starts the server on the first component's node, passes its address to the workers, keeps the "
            "metrics log, logs and checkpoints in the job folder, and is requeue-safe: a requeued job resumes "
            "from its newest checkpoint. --limiter also puts each task under the profile's CPU quota inside "
            "the allocation, as ps-cluster run does, so one Slurm node can emulate the cluster. See "
            "docs/slurm.md.", width=88),
        epilog="examples:\n"
        "  ps-cluster slurm --profile hl4 --out jobs/hl4                     # then: sbatch jobs/hl4/hetero-ps.sbatch\n"
        "  ps-cluster slurm --profile my-cluster.yaml --partition gpu --time 2:00:00 --out jobs/mine --submit\n"
        "  ps-cluster slurm --profile hl4 --scale 0.03125 --limiter auto --server-arg='--epochs 3' --submit\n"
        "exit status: the job's with --submit; else 0 written, 2 bad input (nothing written).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    profile_argument(parser)
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="the job folder: the script goes to DIR/" + slurm.SCRIPT_NAME + " and the job runs there "
                        "(default: the script on stdout, the job in the folder sbatch runs in; with --submit "
                        "runs/slurm-<timestamp>)")
    parser.add_argument("--submit", action="store_true",
                        help="submit with sbatch and follow the job: its state, the server's progress, its exit status")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARGS",
                        help="the job, as ps-server flags (repeatable; default: "
                        "--model cnn --dataset synthetic --controller dynamic --epochs 10 --global-batch 512)")
    parser.add_argument("--python", metavar="PATH",
                        help="the Python, on every node, that has hetero-ps installed (default: this one)")
    parser.add_argument("--job-name", default="hetero-ps", help="sbatch --job-name (default: hetero-ps)")
    parser.add_argument("--partition", help="sbatch --partition of every component (default: the cluster's)")
    parser.add_argument("--account", help="sbatch --account (default: yours)")
    parser.add_argument("--time", metavar="LIMIT", help="sbatch --time of every component, e.g. 2:00:00")
    parser.add_argument("--memory", metavar="SIZE", help="sbatch --mem of every component, e.g. 8G")
    parser.add_argument("--gres", default="gpu", metavar="NAME[:TYPE]",
                        help="the generic resource a profile's gpus are asked for: --gres=NAME:N (default: gpu)")
    parser.add_argument("--server-cpus", type=positive_int, default=1,
                        help="the server's CPUs where the profile gives it none (ASP: its server cores) (default: 1)")
    parser.add_argument("--limiter", choices=slurm.LIMITERS, default="none",
                        help="none: Slurm's allocation is the heterogeneity; auto/cgroup/slowdown: also the profile's "
                        "CPU quota per task inside it, as ps-cluster run does (default: none)")
    parser.add_argument("--listen", metavar="ADDR",
                        help="the server's --host (default: its node's address, which the workers dial)")
    parser.set_defaults(handler=_slurm, prog=parser.prog)
    return parser

