"""``ps-cluster k8s``: a profile's Kubernetes manifests (deploy/k8s.py), written to a folder or printed
for ``kubectl apply``; errors are ValueError, which ``ps-cluster`` turns into one line and exit status 2."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from deploy.cli_arguments import PROG, Subcommands, mode_argument, port_in_range, profile_argument, scale_argument
from deploy.profiles import load_profile


def _k8s(args: argparse.Namespace) -> int:
    import yaml

    from deploy import k8s
    from deploy.server_args import check_server_command, given_options, server_parser, split_server_args

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
    check_server_command(parser, k8s.server_command(options, job)[4:])  # the whole command line, as ps-server will see it
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
    profile_argument(parser)
    mode_argument(parser)
    scale_argument(parser)
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
