"""ps-shard once its flags are parsed (ps/shards/server.py): serve one range of the parameters for its
coordinator until it is stopped, and exit with its parent ps-server where that started it."""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import signal
import sys

import grpc
import torch

from common.ops import address
from common.transport.security import ServerSecurity, load_server_security
from ps.ops.health import OVERALL, SERVING, Health
from ps.ops.port_file import PortFile
from ps.ops.prometheus import Endpoint, MessageMetrics
from ps.serving.call_budget import CallBounds
from ps.serving.call_limits import CallLimits, stop_serving
from ps.serving.handlers import SERVICES, OnMessage, register
from ps.serving.server_options import run_loop, serving_options, wait_for_stop_signal
from ps.shards.control_key import SHARD_KEY_ENV, SHARD_KEY_FILE_ENV, ControlKeyInterceptor, resolve_shard_key
from ps.shards.core import ShardCore
from ps.shards.flags import DEFAULT_BOUNDS, DEFAULT_MAX_LOAD_MIB
from ps.shards.servicer import ParameterShardServicer

PR_SET_PDEATHSIG = 1


def exit_with_parent(parent_pid: int) -> None:
    """Ask the kernel for SIGTERM when the parent exits (Linux); exit now if it already has."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:
        raise SystemExit(f"ps-shard: parent {parent_pid} is gone")


async def serve_shard(host: str, port: int, port_file: PortFile | None, security: ServerSecurity,
                      on_message: OnMessage | None = None, *, shard_key: str,
                      max_load_bytes: int = DEFAULT_MAX_LOAD_MIB << 20, bounds: CallBounds = DEFAULT_BOUNDS) -> None:
    """Serve one ShardCore until SIGTERM/SIGINT (`on_message`: told the size of every gRPC message;
    `bounds`: the calls it holds at once, by kind and peer).

    Health: the server ("") is SERVING once it listens (it takes its coordinator's Load then), the
    ParameterShard service once a Load gave it its range; both NOT_SERVING from SIGTERM/SIGINT on."""
    checks = [*security.interceptors(), ControlKeyInterceptor(shard_key)]  # before the limits: refusals are not counted
    limits = CallLimits(bounds)
    server = grpc.aio.server(options=serving_options(), interceptors=[*checks, limits])
    service = SERVICES["ParameterShard"].full_name
    health = Health([service])
    await health.add_to(server)
    register(ParameterShardServicer(ShardCore(), on_load=functools.partial(health.set, SERVING, [service]),
                                    max_load_bytes=max_load_bytes), server, "ParameterShard", on_message)
    bound = security.add_port(server, address.join(host, port))
    await server.start()
    await health.set(SERVING, [OVERALL])
    print(f"ps-shard: listening on {host}:{bound} ({security.description})", flush=True)
    try:
        if port_file is not None:
            port_file.write(bound)
        await wait_for_stop_signal()
    finally:
        await health.shut_down()
        await stop_serving(server, limits)


def run(args: argparse.Namespace) -> int:
    """ps-shard's run from its parsed flags (ps/shards/server.py parses them): serve until stopped; its exit
    status, as ps-shard's."""
    if args.parent_pid is not None:
        exit_with_parent(args.parent_pid)
    torch.set_num_threads(max(1, args.threads))
    try:
        if args.metrics_port_file is not None and args.metrics_port is None:
            raise ValueError("--metrics-port-file needs --metrics-port")
        security = load_server_security(args.tls_cert, args.tls_key, args.tls_client_ca, args.token)
        shard_key = resolve_shard_key()
        if shard_key is None:
            raise ValueError(f"no coordinator key: set ${SHARD_KEY_ENV} or ${SHARD_KEY_FILE_ENV} (the same as its "
                             "ps-server's; ps-server --shards N sets it for the shards it starts)")
        port_file = PortFile(args.port_file) if args.port_file is not None else None
        metrics_port_file = PortFile(args.metrics_port_file, "--metrics-port-file") if args.metrics_port_file else None
        bounds = CallBounds.serving(args.max_concurrent_rpcs, args.max_rpcs_per_peer)
    except (ValueError, OSError) as exc:
        print(f"ps-shard: error: {exc}", file=sys.stderr)
        return 2
    endpoint = on_message = None
    try:
        if args.metrics_port is not None:
            endpoint = Endpoint()
            on_message = MessageMetrics(endpoint.registry).on_message
            token = None if args.metrics_without_token else security.token
            bound = endpoint.start(args.metrics_host, args.metrics_port, token)
            print(f"ps-shard: metrics on http://{args.metrics_host}:{bound}/metrics{' (token required)' if token else ''}",
                  flush=True)
            if metrics_port_file is not None:
                metrics_port_file.write(bound)
        run_loop(serve_shard(args.host, args.port, port_file, security, on_message, shard_key=shard_key,
                             max_load_bytes=args.max_load_mib << 20, bounds=bounds))
    except OSError as exc:
        print(f"ps-shard: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if endpoint is not None:
            endpoint.close()
    return 0

