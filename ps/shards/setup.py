"""`ps-server --shards` / `--shard-addresses`: the shard servers this coordinator uses, started or listed,
with the coordinator's key for their control calls and the same transport security as the server.

The key is fresh for the shards this server starts (handed to them in their environment); shards
started by hand share one with their coordinator through $PS_SHARD_KEY or $PS_SHARD_KEY_FILE. With
TLS the shards started here serve the server's certificate, and the coordinator checks every shard's
against `--shard-tls-ca` (with mutual TLS it presents the server's certificate as its own).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import grpc

from common.transport.security import read_pem, resolve_token
from ps.shards.client import RemoteShards
from ps.shards.control_key import SHARD_KEY_ENV, SHARD_KEY_FILE_ENV, resolve_shard_key
from ps.shards.processes import LocalShards
from ps.shards.ranges import split_ranges


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


def _credentials(args: argparse.Namespace) -> grpc.ChannelCredentials | None:
    if args.shard_tls_ca is None:
        return None
    mutual = args.tls_client_ca is not None
    return grpc.ssl_channel_credentials(
        root_certificates=read_shard_ca(args),
        private_key=read_pem("--tls-key", args.tls_key) if mutual else None,
        certificate_chain=read_pem("--tls-cert", args.tls_cert) if mutual else None,
    )


def _tls_flags(args: argparse.Namespace) -> Sequence[str]:
    flags: list[str] = []
    for flag, value in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key), ("--tls-client-ca", args.tls_client_ca)):
        if value is not None:
            flags += [flag, str(value)]
    return flags


def open_shards(args: argparse.Namespace, addresses: list[str] | None,
                numel: int) -> tuple[LocalShards | None, RemoteShards | None]:
    """The shard processes started here (None: listed or no shards) and the coordinator's side of
    them (None: one server holds everything)."""
    check_shard_security(args, args.shards)
    if args.shards <= 1:
        return None, None
    token = resolve_token(args.token)
    key = resolve_shard_key()
    if addresses is not None and key is None:
        raise ValueError(f"--shard-addresses needs the shards' coordinator key: set ${SHARD_KEY_ENV} or "
                         f"${SHARD_KEY_FILE_ENV} here and for every ps-shard")
    local = None
    if addresses is None:
        local = LocalShards(args.shards - 1, args.host, token, shard_key=key, tls_flags=_tls_flags(args))
        addresses, key = local.addresses, local.shard_key
    assert key is not None  # listed shards come with a key, started ones got one
    try:
        remote = RemoteShards(addresses, split_ranges(numel, args.shards), token, shard_key=key,
                              credentials=_credentials(args))
    except BaseException:
        if local is not None:
            local.stop()
        raise
    return local, remote
