"""``ps-cluster``: emulate heterogeneous clusters from the profiles in ``deploy/profiles/``.

Each subcommand is registered by one ``add_*_command(subcommands)`` function listed in
:data:`COMMANDS`; a new subcommand is one more such function (its handler takes the parsed
arguments and returns an exit code). Errors end with exit status 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn, TypeAlias

from deploy import compose_env, docker_schedule
from deploy.make_data import add_make_data_command
from deploy.profiles import (
    MODES,
    builtin_profiles,
    builtin_schedules,
    default_cpu_budget,
    load_profile,
    load_schedule,
)
from ps.control.registry import POLICIES
from common.ops.arg_types import positive_float, positive_int


def port_in_range(text: str) -> int:
    """A TCP port, 1-65535."""
    port = positive_int(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"expected a port in 1-65535, got {text!r}")
    return port

PROG = "ps-cluster"

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Handler: TypeAlias = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _mode_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mode", choices=MODES, default="bsp", type=str.lower,
        help="training mode whose allocation to use (default: bsp; asp also limits the server)",
    )


def _scale_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scale", type=positive_float, default=1.0, metavar="F",
        help="multiply Table I cores by F, e.g. 0.25 on a 12-core host (default: 1, the paper's cores)",
    )


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
    _mode_argument(parser)
    _scale_argument(parser)
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
    _mode_argument(parser)
    _scale_argument(parser)
    parser.add_argument("--project", default=docker_schedule.DEFAULT_PROJECT,
                        help="compose project name; containers are <project>-<service>-1 "
                        f"(default: {docker_schedule.DEFAULT_PROJECT})")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the commands as a shell script instead of running them")
    parser.set_defaults(handler=_docker_schedule)


def _k8s(args: argparse.Namespace) -> int:
    import yaml

    from deploy import k8s
    from deploy.server_args import given_options, server_parser, split_server_args

    profile = load_profile(args.profile)
    profile.allocation(args.mode)  # ValueError if the profile lacks the mode
    if args.namespace is not None:
        k8s.check_name(args.namespace, "--namespace", 63)
    if args.token_secret is not None:
        k8s.check_name(args.token_secret, "--token-secret", 253)
    if args.tls_secret is not None:
        k8s.check_name(args.tls_secret, "--tls-secret", 253)
    parser = server_parser()
    extra = split_server_args(
        args.server_arg, parser,
        lambda flag: " is set by ps-cluster k8s (from the profile and its options)" if flag in k8s.SET_HERE else None,
    )
    job = k8s.job_args(extra, given_options(extra, parser))
    options = k8s.K8sOptions(
        profile=profile, mode=args.mode, scale=args.scale, image=k8s.check_image(args.image),
        name=k8s.check_name(args.name, "--name"), namespace=args.namespace, port=args.port, server_args=extra,
        checkpoint_size=k8s.check_quantity(args.checkpoint_size, "--checkpoint-size"),
        storage_class=args.storage_class,
        memory=None if args.memory is None else k8s.check_quantity(args.memory, "--memory"),
        gpu_resource=k8s.check_resource_name(args.gpu_resource), tls_secret=args.tls_secret,
        token_secret=args.token_secret,
    )
    parser.parse_args(k8s.server_command(options, job)[4:])  # the whole command line, as ps-server will see it
    documents = k8s.render(options, job)
    if args.out is None:
        sys.stdout.write(yaml.safe_dump_all(documents, sort_keys=False))
        return 0
    out: Path = args.out
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".ps-cluster-write-test"
        probe.write_text("", encoding="utf-8")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None
    for document in documents:
        path = out / k8s.filename(document)
        path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
        if document["kind"] == "Secret":
            path.chmod(0o600)
    print(f"{PROG}: wrote {len(documents)} manifests to {out}: kubectl apply -f {out}", file=sys.stderr)
    return 0


def add_k8s_command(subcommands: Subcommands) -> None:
    """``k8s``: Kubernetes manifests of a profile (server StatefulSet, worker Jobs, Services, Secret)."""
    from deploy import k8s

    parser = subcommands.add_parser(
        "k8s",
        help="write Kubernetes manifests for a profile (CPU limits / GPUs per worker, as the kubelet enforces them)",
        description=textwrap.fill(
            "Write the Kubernetes manifests of a profile: the parameter server as a StatefulSet with a "
            "checkpoint volume (a restarted pod resumes from its newest checkpoint) and gRPC health probes, "
            "a Service for it, a headless Service that gives the server pod the stable name the workers "
            "dial, one Job per worker with the profile's CPU "
            "cores (times --scale) as its CPU request and limit and its GPUs as GPU limits, and a Secret "
            "with a new token that every call carries. See docs/kubernetes.md.", width=88),
        epilog="examples:\n"
        "  ps-cluster k8s --profile hl8 --image registry.example/hetero-ps:0.1 --out k8s/\n"
        "  ps-cluster k8s --profile hl8 --scale 0.25 --server-arg='--epochs 20 --lr 0.05' | kubectl apply -f -\n"
        "exit status: 0 written, 2 bad input (nothing written).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--profile", default="hl8", metavar="NAME|PATH",
                        help=f"built-in profile ({', '.join(builtin_profiles())}) or a profile YAML file (default: hl8)")
    _mode_argument(parser)
    _scale_argument(parser)
    parser.add_argument("--image", default="hetero-ps:local", metavar="REF",
                        help="the image built from deploy/Dockerfile, as the cluster pulls it (default: hetero-ps:local)")
    parser.add_argument("--out", type=Path, metavar="DIR", help="write one file per object here instead of stdout")
    parser.add_argument("--name", default=k8s.APP, help=f"prefix of every object's name (default: {k8s.APP})")
    parser.add_argument("--namespace", help="namespace of every object (default: none: kubectl's)")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARGS",
                        help="the job, as ps-server flags (repeatable; default: "
                        f"{' '.join(f'{k} {v}' for k, v in k8s.JOB_DEFAULTS.items())})")
    parser.add_argument("--port", type=port_in_range, default=50051, help="the server's gRPC port (default: 50051)")
    parser.add_argument("--checkpoint-size", default="1Gi", metavar="QUANTITY",
                        help="the checkpoint volume's size (default: 1Gi)")
    parser.add_argument("--storage-class", metavar="NAME", help="the checkpoint volume's storage class (default: the cluster's)")
    parser.add_argument("--memory", metavar="QUANTITY",
                        help="memory request and limit of every pod, e.g. 4Gi (default: none)")
    parser.add_argument("--gpu-resource", default="nvidia.com/gpu", metavar="NAME",
                        help="the resource a profile's gpus request (default: nvidia.com/gpu)")
    parser.add_argument("--tls-secret", metavar="NAME",
                        help="serve TLS from this existing Secret (tls.crt, tls.key; workers trust its ca.crt)")
    parser.add_argument("--token-secret", metavar="NAME",
                        help="take the token from this existing Secret's 'token' key instead of a new one")
    parser.set_defaults(handler=_k8s)


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
        emulator.run(config)
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
        f"Without options: BSP, the model batch policy, {default['model']} on "
        f"{default['dataset']} ({' '.join(emulator.DEFAULT_DATASET_ARGS['patterns'])}), global batch "
        f"{default['global_batch']}, {default['epochs']} epochs, lr {default['lr']}: 1-3 minutes on 2 cores.", width=88),
        epilog="examples:\n"
        "  ps-cluster run --profile hl8                        # the main job\n"
        "  ps-cluster run --profile hl8 --quick                # a short run (about 30 s)\n"
        "  ps-cluster run --schedule dynamic --quick           # HL1->HL8->HL1, 2 epochs per phase\n"
        "  ps-cluster run --profile hl4 --policy uniform   # the baseline: equal batches\n"
        "  ps-cluster run --mode asp --server-arg=--staleness-bound=2   # ASP, stale-synchronous\n"
        "exit status: 0 done, 1 the run failed (a worker or the server died), 2 bad input.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = parser.add_argument_group("cluster")
    where.add_argument("--profile", default="hl8", metavar="NAME|PATH",
                       help=f"built-in profile ({', '.join(builtin_profiles())}) or a profile YAML file "
                       "(default: hl8)")
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
                          "cores, measured, or fitted with parking "
                          "(docs/policies.md; default: model on a profile, where it measured ahead of dynamic on "
                          "HL8; dynamic with --schedule, whose changing speeds it follows better)")
    job.add_argument("--epochs", type=positive_int,
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


def add_slurm_command(subcommands: Subcommands) -> None:
    """``slurm``: a heterogeneous Slurm batch job of a profile (deploy/slurm_command.py)."""
    from deploy.slurm_command import add_slurm_parser

    parser = add_slurm_parser(subcommands)
    _mode_argument(parser)
    _scale_argument(parser)


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
