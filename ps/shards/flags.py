"""The shard flags' parts that load nothing: the shards' security flags checked against the server's
(`check_shard_security`) and their CA read (`read_shard_ca`), which ps-server runs before the data loads
or a shard starts and the launchers before they start or write anything, and the defaults ps-shard's
parser shows (ps/shards/server.py), so that `ps-shard --help` answers before torch loads."""

from __future__ import annotations

import argparse

from common.transport.security import read_pem
from ps.serving.call_budget import CallBounds

DEFAULT_MAX_LOAD_MIB = 16384
"""ps-shard --max-load-mib: a shard's range with its optimizer state (Adam: 3 values per parameter) up to
about 1.4 billion parameters."""
DEFAULT_BOUNDS = CallBounds.serving(1024)
"""The calls a shard holds at once, by kind and peer, unless its flags say otherwise."""


def check_shard_security(args: argparse.Namespace, servers: int) -> None:
    """ValueError (one line) for --shards flags that cannot give the shards the server's security;
    `servers`: the job's server count (--shards, or a --shard-addresses list's + 1). Reads no file:
    the launchers run it where the paths name files of another machine (a pod, a Slurm node)."""
    if servers <= 1:
        if args.shard_tls_ca is not None:
            raise ValueError("--shard-tls-ca is for --shards or --shard-addresses")
        return
    if args.tls_cert is not None and args.shard_tls_ca is None:
        raise ValueError("--shards with TLS needs --shard-tls-ca: the CA that signed the shard servers' certificates "
                         "(for --shards N, the CA of --tls-cert, which the shards it starts serve)")
    if args.shard_tls_ca is not None and args.tls_cert is None:
        raise ValueError("--shard-tls-ca needs --tls-cert and --tls-key: the shards speak TLS when the server does")


def read_shard_ca(args: argparse.Namespace) -> bytes | None:
    """--shard-tls-ca's PEM bytes (None: not given); ValueError naming the flag and file if it cannot be
    read or is not PEM: checked before the data loads or a shard starts."""
    return None if args.shard_tls_ca is None else read_pem("--shard-tls-ca", args.shard_tls_ca)
