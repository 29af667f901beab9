"""``ps-cluster``: emulate heterogeneous clusters from the profiles in ``deploy/profiles/``.

Each subcommand is registered by one ``add_*_command(subcommands)`` function listed in
:data:`COMMANDS`; a new subcommand is one more such function (its handler takes the parsed
arguments and returns an exit code), in a module of its own where it is more than a few lines
(deploy/k8s_command.py, run_command.py, slurm_command.py, make_data.py). Errors end with exit status
2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn, TypeAlias

from common.ops.arg_types import positive_float
from deploy import compose_env, docker_schedule
from deploy.cli_arguments import PROG, Subcommands, mode_argument, scale_argument
from deploy.k8s_command import add_k8s_command
from deploy.make_data import add_make_data_command
from deploy.profiles import builtin_profiles, builtin_schedules, load_profile, load_schedule
from deploy.run_command import add_run_command

Handler: TypeAlias = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _compose_env(args: argparse.Namespace) -> int:
    text = compose_env.render_env(load_profile(args.profile), args.mode, args.scale)
    if args.output is None:
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text, encoding="utf-8")
    return 0


def add_compose_env_command(subcommands: Subcommands) -> None:
    """``compose-env``: print the docker-compose env file of a profile."""
    parser = subcommands.add_parser(
        "compose-env",
        help="print the docker-compose env file (CPU quota per container) of a profile",
        description="Print the env file that gives deploy/docker-compose.yml the CPU allocation of a "
        "profile: MODE, CPU_PERIOD (the CFS period: 1 ms over the smallest share), PS_CPU_QUOTA and "
        "W<k>_CPUS / W<k>_CPU_QUOTA / W<k>_THREADS for worker0..worker3.",
        epilog="example: ps-cluster compose-env --profile hl8 --mode asp > deploy/hl8-asp.env",
    )
    parser.add_argument("--profile", required=True, metavar="NAME|PATH",
                        help=f"built-in profile ({', '.join(builtin_profiles())}) or a profile YAML file")
    mode_argument(parser)
    scale_argument(parser)
    parser.add_argument("--output", "-o", metavar="PATH", help="write to PATH instead of stdout")
    parser.set_defaults(handler=_compose_env)


def _docker_schedule(args: argparse.Namespace) -> int:
    schedule = load_schedule(args.schedule)
    every_seconds = args.every_seconds if args.every_seconds is not None else schedule.every_seconds
    if every_seconds is None:
        raise ValueError(
            f"schedule {schedule.name!r} switches every {schedule.interval:g} {schedule.unit}; "
            "docker updates run on a clock, so pass --every-seconds N"
        )
    phases = docker_schedule.plan(
        schedule, args.mode, every_seconds, scale=args.scale, project=args.project
    )
    if args.dry_run:
        sys.stdout.write(docker_schedule.render(phases, every_seconds))
    else:
        docker_schedule.apply(phases)
    return 0


def add_docker_schedule_command(subcommands: Subcommands) -> None:
    """``docker-schedule``: apply a dynamic schedule to running containers with docker update."""
    parser = subcommands.add_parser(
        "docker-schedule",
        help="change the running containers' CPU quotas along a schedule (docker update)",
        description="Apply a schedule's phases to the containers of deploy/docker-compose.yml with "
        "`docker update --cpu-period P --cpu-quota Q`: the first phase at once, the next one every N "
        "seconds. Start the "
        "cluster first, with the env file of the first phase.",
        epilog="example: ps-cluster docker-schedule --schedule dynamic --every-seconds 600 --dry-run",
    )
    parser.add_argument("--schedule", required=True, metavar="NAME|PATH",
                        help=f"built-in schedule ({', '.join(builtin_schedules())}) or a schedule YAML file")
    parser.add_argument("--every-seconds", type=positive_float, metavar="N",
                        help="seconds per phase (required unless the schedule gives every_seconds)")
    mode_argument(parser)
    scale_argument(parser)
    parser.add_argument("--project", default=docker_schedule.DEFAULT_PROJECT,
                        help="compose project name; containers are <project>-<service>-1 "
                        f"(default: {docker_schedule.DEFAULT_PROJECT})")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the commands as a shell script instead of running them")
    parser.set_defaults(handler=_docker_schedule)


def _list(args: argparse.Namespace) -> int:
    for name in builtin_profiles():
        profile = load_profile(name)
        for mode, allocation in profile.modes.items():
            server = "" if allocation.server is None else f", server {allocation.server:g}"
            cores = ", ".join(f"{w:g}" for w in allocation.workers)
            print(f"{name:8} {mode}: workers {cores}{server} (HL {allocation.heterogeneity:g})")
    for name in builtin_schedules():
        schedule = load_schedule(name)
        phases = " -> ".join(p.name for p in schedule.phases)
        print(f"{name:8} every {schedule.interval:g} {schedule.unit}: {phases}")
    return 0


def add_list_command(subcommands: Subcommands) -> None:
    """``list``: show the built-in profiles and schedules."""
    parser = subcommands.add_parser(
        "list", help="show the built-in profiles and schedules",
        description="Show the built-in profiles (cores per worker) and schedules (phases).",
    )
    parser.set_defaults(handler=_list)


def add_slurm_command(subcommands: Subcommands) -> None:
    """``slurm``: a heterogeneous Slurm batch job of a profile (deploy/slurm_command.py)."""
    from deploy.slurm_command import add_slurm_parser

    parser = add_slurm_parser(subcommands)
    mode_argument(parser)
    scale_argument(parser)


COMMANDS: list[Callable[[Subcommands], None]] = [
    add_compose_env_command,
    add_docker_schedule_command,
    add_k8s_command,
    add_list_command,
    add_make_data_command,
    add_run_command,
    add_slurm_command,
]
"""Subcommand registrations, in the order ``--help`` lists them."""


def build_parser(commands: Sequence[Callable[[Subcommands], None]] = COMMANDS) -> argparse.ArgumentParser:
    """The ``ps-cluster`` parser with every registered subcommand."""
    parser: argparse.ArgumentParser = _Parser(
        prog=PROG,
        description="Emulate heterogeneous clusters (OmniLearn Table I and Fig. 10) for the parameter "
        "server: on this machine, docker-compose allocations and dynamic CPU schedules, Kubernetes manifests.",
    )
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in commands:
        register(subcommands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``ps-cluster``; returns the exit status (2 with one stderr line on any error)."""
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
