"""ps-server's flags checked against each other (each flag's own range is its argparse type's), before
anything is built: ps-server runs these checks, and so do the launchers (`ps-cluster run`, `k8s`,
`slurm`) on the flags they pass it, before they start or write anything. Loads no model, data or
transport, so a launcher refuses a bad command line at once. ValueErrors name the flags."""

from __future__ import annotations

import argparse

from common.job.spec import busy_time_measured, cycle_measured
from common.ops import address
from common.transport.security import check_tls_pairs
from ps.control.registry import POLICIES, policy_class
from ps.server_flags import adaptive_config, check_micro_batch_flags
from ps.shards.flags import check_shard_security


def check_flags_together(args: argparse.Namespace) -> None:
    """The checks of flags against each other (each flag's own range is its argparse type's): a
    ValueError naming the flags, before anything is built."""
    check_paths_together(args)
    check_shard_flags(args)
    if args.global_batch < args.workers:
        raise ValueError(f"--global-batch {args.global_batch} must be >= --workers {args.workers} (one sample each at least)")
    if args.max_batch is not None and args.max_batch < args.min_batch:
        raise ValueError(f"--max-batch {args.max_batch} is below --min-batch {args.min_batch}")
    if args.workers * args.min_batch > args.global_batch:
        raise ValueError(f"--workers {args.workers} x --min-batch {args.min_batch} exceeds --global-batch {args.global_batch}")
    if args.max_batch is not None and args.workers * args.max_batch < args.global_batch:
        raise ValueError(f"--workers {args.workers} x --max-batch {args.max_batch} cannot make up --global-batch {args.global_batch}")
    if args.micro_batch > 1:
        check_micro_batch_flags(args)
    if args.max_workers is not None and args.max_workers < args.workers:
        raise ValueError(f"--max-workers {args.max_workers} must be >= --workers {args.workers}")
    if args.nesterov and args.momentum == 0:
        raise ValueError("--nesterov needs --momentum > 0")
    if not args.park and not policy_class(args.policy).parks:
        parking = " or ".join(name for name in POLICIES if policy_class(name).parks)
        raise ValueError(f"--no-park is for --policy {parking}, the policies that park a worker; --policy {args.policy} "
                         "never parks one")
    if args.mode != "asp" and (args.staleness_bound is not None or args.staleness_lr != "off"):
        raise ValueError(f"--staleness-bound and --staleness-lr are for --mode asp, not --mode {args.mode}")
    if (args.max_update_norm is not None or args.clip_outliers is not None) and (args.shards > 1 or args.allreduce == "on"):
        raise ValueError("--max-update-norm and --clip-outliers bound the pushes this server aggregates whole: not "
                         "with --shards (each shard sees a slice) or --allreduce on (the workers sum their gradients)")
    adaptive_config(args)


def check_paths_together(args: argparse.Namespace) -> None:
    """The collective fast path, --shards and --balance against each other (ValueError naming the flags)."""
    allreduce = args.allreduce == "on"
    shards = server_count(args)
    if allreduce and args.mode != "bsp":
        raise ValueError("--allreduce is the BSP collective fast path; it cannot run with --mode asp")
    if shards > 1 and (args.mode != "bsp" or allreduce):
        raise ValueError("--shards serves BSP jobs without --allreduce (ASP and the collective fast path keep one server)")
    if args.balance == "busy" and not busy_time_measured(shards):
        raise ValueError("--balance busy is measured with one server only; it cannot run with --shards")
    if args.balance == "cycle" and not cycle_measured(args.mode, allreduce, shards):
        raise ValueError("--balance cycle is measured in BSP rounds on the PS path with one server only; it cannot "
                         "run with --mode asp, --allreduce or --shards")
    if args.allreduce_algorithm != "auto" and not (allreduce or may_take_fast_path(args, shards)):
        raise ValueError("--allreduce-algorithm needs --allreduce (on, or auto in a BSP job that may take it)")


def may_take_fast_path(args: argparse.Namespace, shards: int) -> bool:
    """--allreduce auto, where the path chosen when the job starts can be the fast path at all."""
    return args.allreduce == "auto" and args.mode == "bsp" and shards == 1 and args.balance in ("auto", "compute")


def server_count(args: argparse.Namespace) -> int:
    """The job's servers: --shards, or a --shard-addresses list's (+1: this server)."""
    if args.shard_addresses is None:
        return int(args.shards)
    return len(listed_shards(args.shard_addresses)) + 1


def listed_shards(text: str) -> list[str]:
    """A --shard-addresses list's addresses, as given (not checked)."""
    return [a.strip() for a in text.split(",") if a.strip()]


def shard_addresses(args: argparse.Namespace) -> list[str] | None:
    """A --shard-addresses list's addresses, each checked, and --shards against their count (ValueError
    naming the entry or the flags); None: no list. Leaves args.shards as it is."""
    if args.shard_addresses is None:
        return None
    addresses = listed_shards(args.shard_addresses)
    for entry in addresses:
        try:
            address.split(entry)
        except ValueError as exc:
            raise ValueError(f"--shard-addresses: {exc}") from None
    if not addresses:
        raise ValueError("--shard-addresses lists no address")
    if args.shards not in (1, len(addresses) + 1):
        raise ValueError(f"--shards {args.shards} disagrees with the {len(addresses)} --shard-addresses (+1: this server)")
    return addresses


def parse_shard_addresses(args: argparse.Namespace) -> list[str] | None:
    """Check --shards/--shard-addresses (setting args.shards from the list); None: no listed shards."""
    addresses = shard_addresses(args)
    if addresses is not None:
        args.shards = len(addresses) + 1
    if args.shards < 1:
        raise ValueError(f"--shards must be >= 1, got {args.shards}")
    check_shard_security(args, args.shards)
    return addresses


def check_shard_flags(args: argparse.Namespace) -> None:
    """--shard-addresses' entries and the TLS flags the server and its shards share, as ps-server refuses
    them (ValueError, its message), for a launcher to refuse before it starts or writes anything. Reads
    no file: the paths may name another machine's (a pod's, a Slurm node's)."""
    shard_addresses(args)
    check_tls_pairs(args.tls_cert, args.tls_key, args.tls_client_ca)
    check_shard_security(args, server_count(args))
