"""gRPC health checking (grpc.health.v1) and server reflection for the service's servers.

Both come from the libraries made for them (grpcio-health-checking, grpcio-reflection). A server
reports one status for the whole server (service "", what `grpc_health_probe` and Kubernetes' `grpc:`
probes ask by default) and one per service it serves (e.g. "hetero_ps.ParameterServer"); the
servers decide when they are SERVING (ps.server, ps.shards.server). Reflection lists the services
and their descriptors, so that grpcurl and similar tools can call the API without the .proto file.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

OVERALL = ""
"""The service name that stands for the whole server."""

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Health:
    """The health service of one server and the reflection of its services.

    Every status starts NOT_SERVING; `set` changes them on the server's event loop, `set_soon` from
    any thread (a metrics observer), and `shut_down` makes them NOT_SERVING for good when the server
    stops. A Watch sees every change as it happens.
    """

    def __init__(self, services: Iterable[str]) -> None:
        self.services = tuple(services)
        self._servicer = health.aio.HealthServicer()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: set[asyncio.Task[None]] = set()

    async def add_to(self, server: grpc.aio.Server) -> None:
        """Register the health service and reflection (of the services, health and reflection itself)
        with `server`, every status NOT_SERVING (the library starts "" SERVING). On the server's loop,
        before it starts."""
        health_pb2_grpc.add_HealthServicer_to_server(self._servicer, server)
        reflection.enable_server_reflection((*self.services, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        self._loop = asyncio.get_running_loop()
        await self.set(NOT_SERVING)

    async def set(self, status: Any, services: Iterable[str] | None = None) -> None:
        """Set `services` (default: "" and every service) to `status`; ignored after shut_down."""
        for service in (OVERALL, *self.services) if services is None else services:
            await self._servicer.set(service, status)

    def set_soon(self, status: Any, services: Iterable[str] | None = None) -> None:
        """`set` from any thread: scheduled on the server's loop (after `add_to`)."""
        if self._loop is None:
            raise RuntimeError("Health.add_to(server) first")
        services = None if services is None else tuple(services)
        self._loop.call_soon_threadsafe(self._schedule, status, services)

    def _schedule(self, status: Any, services: tuple[str, ...] | None) -> None:
        task = asyncio.ensure_future(self.set(status, services))
        self._pending.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._pending.discard)

    async def shut_down(self) -> None:
        """NOT_SERVING for every service from now on (the server is stopping)."""
        await self._servicer.enter_graceful_shutdown()
