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
from ps.shards.flags import check_shard_security, read_shard_ca
from ps.shards.client import RemoteShards
from ps.shards.control_key import SHARD_KEY_ENV, SHARD_KEY_FILE_ENV, resolve_shard_key
from ps.shards.processes import LocalShards
from ps.shards.ranges import split_ranges


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
