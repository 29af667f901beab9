"""ps-server once its flags are parsed: the job built (ps/server_job.py) and served over gRPC until it ends."""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
from typing import Any

import grpc
import torch

from common.job.endings import exit_status
from common.ops import address
from common.ops.collector import tune_collector
from common.transport.security import ServerSecurity, load_server_security
from ps.ops.health import NOT_SERVING, SERVING, Health
from ps.ops.port_file import PortFile
from ps.ops.prometheus import Endpoint, JobMetrics, MessageMetrics
from ps.rounds.resume import JobComplete
from ps.server_job import Job, build_job
from ps.servicer import ParameterServerServicer
from ps.serving.call_budget import CallBounds, calls_for_workers
from ps.serving.call_limits import CallLimits, stop_serving
from ps.serving.handlers import SERVICES, OnMessage, register
from ps.serving.server_options import on_stop_signal, run_loop, serving_options
from ps.shards.client import ShardFailure


def not_serving_at_end(health: Health, record: dict[str, Any]) -> None:
    """A metrics observer: the health service says NOT_SERVING from the job's end (finished or
    stopping) on, while the server drains (the workers hear of it, the final checkpoint)."""
    if record["event"] == "end":
        health.set_soon(NOT_SERVING)


def start_prometheus(job: Job, host: str, port: int, port_file: PortFile | None, token: str | None = None) -> tuple[Endpoint, OnMessage]:
    """--metrics-port: the job's metrics (fed by its metrics log) and the gRPC message sizes (fed by the
    handlers' hook it returns) at http://host:port/metrics, to `token`'s holders only (None: anyone). OSError if it cannot listen."""
    endpoint = Endpoint()
    status = job.coordinator.status()
    job_metrics = JobMetrics(endpoint.registry, mode=status.mode, controller=status.controller,
                             balance=job.spec.balance, path=status.path)
    job.metrics.observe(job_metrics.observe)
    messages = MessageMetrics(endpoint.registry)
    bound = endpoint.start(host, port, token)
    print(f"ps-server: metrics on http://{host}:{bound}/metrics{' (token required)' if token else ''}", flush=True)
    if port_file is not None:
        port_file.write(bound)
    return endpoint, messages.on_message


async def serve(
    job: Job, host: str, port: int, port_file: PortFile | None, grace: float, security: ServerSecurity | None = None,
    on_message: OnMessage | None = None,
) -> dict[str, Any]:
    """Serve the job until it ends (TLS and token check as `security` says); returns the summary record.
    `on_message`: told the size of every gRPC message (the Prometheus metrics)."""
    security = security or ServerSecurity()
    limits = CallLimits(job.calls or CallBounds.serving(calls_for_workers(job.spec.workers)))  # after the token check
    server = grpc.aio.server(options=serving_options(), interceptors=[*security.interceptors(), limits])
    health = Health([SERVICES["ParameterServer"].full_name])
    await health.add_to(server)
    job.metrics.observe(functools.partial(not_serving_at_end, health))
    register(ParameterServerServicer(job.coordinator), server, on_message=on_message)
    try:
        await job.coordinator.load_shards()
    except ShardFailure as exc:
        job.close_shards()
        raise OSError(str(exc)) from None
    try:
        bound = security.add_port(server, address.join(host, port))
    except OSError:
        job.close_shards()
        raise
    await server.start()
    await health.set(SERVING)  # ready: the job is built, its shards hold their ranges, the server listens
    mode = f"{job.spec.mode} allreduce" if job.rendezvous else job.spec.mode
    if job.coordinator.fast_path.undecided:
        mode += ", allreduce if every worker has a GPU of its own"
        if not job.coordinator.path_trial.blocked_by_job:
            mode += ", else the faster path after a trial of both"
    if job.coordinator.shards is not None:
        mode += f", {len(job.coordinator.shards.ranges)} shards"
    print(
        f"ps-server: listening on {host}:{bound} ({mode}, {security.description}, waiting for {job.spec.workers} workers)",
        flush=True,
    )
    loop = asyncio.get_running_loop()
    on_stop_signal(job.coordinator.stop)
    reaper = asyncio.create_task(job.coordinator.reap_forever(job.coordinator.heartbeat_interval))
    try:
        if port_file is not None:
            port_file.write(bound)
        await job.coordinator.wait_finished(grace)
        await loop.run_in_executor(None, job.evaluator.drain)
        job.coordinator.evaluation.drained()
        path = None
        if job.checkpointer is not None:
            try:
                await job.coordinator.whole_model.fetch()  # every range, for the checkpoint
            except ShardFailure as exc:  # the last checkpoint written stays the newest: its values match its step
                print(f"ps-server: error: no final checkpoint: {exc}", file=sys.stderr, flush=True)
            else:
                path = await loop.run_in_executor(None, job.final_checkpoint)
        if path is not None:
            job.metrics.write("checkpoint", path=str(path), step=job.coordinator.step, epoch=job.coordinator.epoch)
        return job.metrics.write("summary", **job.coordinator.summary())
    finally:
        await health.shut_down()
        reaper.cancel()
        # awaited, so that the loop never closes on it pending ("Task was destroyed but it is pending!")
        await asyncio.gather(reaper, return_exceptions=True)
        await stop_serving(server, limits)
        job.evaluator.close()
        if job.checkpointer is not None:
            job.checkpointer.close()
        job.metrics.close()
        if job.coordinator.shards is not None:
            await job.coordinator.shards.close()
        job.close_shards()


def run(args: argparse.Namespace) -> int:
    """ps-server's run from its parsed flags (ps/server.py parses them): the job built and served until it
    ends; its exit status, as ps-server's."""
    torch.set_num_threads(max(1, args.threads))
    try:
        if args.metrics_port_file is not None and args.metrics_port is None:
            raise ValueError("--metrics-port-file needs --metrics-port")
        security = load_server_security(args.tls_cert, args.tls_key, args.tls_client_ca, args.token)
        if problem := security.exposure_problem(args.host, args.insecure):
            raise ValueError(problem)
        port_file = PortFile(args.port_file) if args.port_file is not None else None
        metrics_port_file = PortFile(args.metrics_port_file, "--metrics-port-file") if args.metrics_port_file else None
        job = build_job(args)
    except JobComplete as exc:
        print(f"ps-server: {exc}", flush=True)
        return 0
    except (ValueError, OSError) as exc:  # OSError: a --metrics-log, --checkpoint-dir or port file that cannot be written
        print(f"ps-server: error: {exc}", file=sys.stderr)
        return 2
    if security.warning:
        print(f"ps-server: warning: {security.warning}", file=sys.stderr, flush=True)
    tune_collector()  # the job is built: what it holds stays out of every collection
    endpoint = on_message = None
    try:
        if args.metrics_port is not None:
            endpoint, on_message = start_prometheus(job, args.metrics_host, args.metrics_port, metrics_port_file,
                                                    None if args.metrics_without_token else security.token)
        summary = run_loop(serve(job, args.host, args.port, port_file, args.grace, security, on_message))
    except OSError as exc:
        job.close_shards()
        print(f"ps-server: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        if endpoint is not None:
            endpoint.close()
    code = exit_status(summary["reason"])
    if code and args.quiet:  # otherwise the `end` record's progress line has said why
        print(f"ps-server: the job ended early: {summary['reason']}", file=sys.stderr, flush=True)
    return code

