"""`ps-shard`: a shard server for `ps-server --shards` / `--shard-addresses`.

It waits for its coordinator (a `ps-server`) to load a range of the parameters into it, then serves
the workers' pushes and pulls of that range until it is stopped (SIGTERM/SIGINT). `ps-server
--shards N` starts N-1 of these itself on loopback; on other hosts start them by hand and list them
with `ps-server --shard-addresses`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from common.ops.arg_types import DefaultsHelpFormatter, positive_int
from common.ops.memory import tune_malloc
from ps.ops.metrics_http import add_endpoint_flags
from ps.serving.server_options import add_call_flags, add_listen_flags
from ps.shards.flags import DEFAULT_BOUNDS, DEFAULT_MAX_LOAD_MIB


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ps-shard",
        description="Shard server: holds one range of the parameters for a ps-server coordinator (see ps-server --shards). "
                "Its control calls take only the coordinator's key, from $PS_SHARD_KEY or the file $PS_SHARD_KEY_FILE "
                "names (required; ps-server --shards N sets it for the shards it starts).",
        formatter_class=DefaultsHelpFormatter,
    )
    add_listen_flags(p, 0)
    add_endpoint_flags(p, "this shard's gRPC message bytes")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads for the optimizer step")
    p.add_argument("--tls-cert", type=Path, default=None, metavar="PATH", help="serve TLS with this PEM certificate (chain)")
    p.add_argument("--tls-key", type=Path, default=None, metavar="PATH", help="PEM private key of --tls-cert")
    p.add_argument("--tls-client-ca", type=Path, default=None, metavar="PATH",
                   help="mutual TLS: require client certificates signed by this PEM CA")
    p.add_argument("--token", default=None,
                   help="shared token every call must carry (unset: $PS_TOKEN, else the file $PS_TOKEN_FILE names, "
                        "else no check)")
    p.add_argument("--max-load-mib", type=positive_int, default=DEFAULT_MAX_LOAD_MIB, metavar="MIB",
                   help="the most one Load (the coordinator's range, round and optimizer state) may carry")
    add_call_flags(p, DEFAULT_BOUNDS.data.total, "Load, Commit, Fetch")
    p.add_argument("--parent-pid", type=positive_int, default=None,
                   help="exit when this process (the ps-server that started this shard) exits")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ps-shard; its exit status: 0 stopped, 1 failed while serving, 2 bad input. The flags are parsed
    first: the shard's core, torch with it, loads only for a command line that can run."""
    tune_malloc()
    args = build_parser().parse_args(argv)
    from ps.shards.shard_run import run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
