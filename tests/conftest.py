"""Shared fixtures: an in-process gRPC parameter server on loopback, and small helpers around it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from protos import ps_pb2_grpc
from ps.rounds.coordinator import Coordinator
from ps.server_job import Job, build_job
from ps.server_flags import build_parser
from ps.servicer import ParameterServerServicer
from ps.serving.server_options import GRPC_OPTIONS
from ps.serving.handlers import register
from tests.leaks import SuiteTmp, report, untracked
from tests.tiers import SLOW, misplaced_marks, tier

START_TIMEOUT_S = 10.0


class InProcessServer:
    """A `grpc.aio` server for one Coordinator, on 127.0.0.1 (free port), on its own thread and event loop.

    `call` runs a function on the server's loop, so tests can read (or snapshot) the coordinator
    without racing the RPC handlers.
    """

    def __init__(self, coordinator: Coordinator, options: list[tuple[str, Any]] | None = None) -> None:
        self.coordinator = coordinator
        self._options = GRPC_OPTIONS if options is None else options
        self._loop = asyncio.new_event_loop()
        self._server: grpc.aio.Server | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ps-test-server", daemon=True)
        self.port = 0
        self._channels: list[grpc.Channel] = []
        self.job: Job | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> InProcessServer:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise RuntimeError("in-process server did not start")
        if self._error is not None:
            raise RuntimeError("in-process server failed to start") from self._error
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._start())
        except Exception as exc:  # noqa: BLE001 - reported to start()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        self._server = grpc.aio.server(options=self._options)
        register(ParameterServerServicer(self.coordinator), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        if self.port == 0:
            raise OSError("could not bind 127.0.0.1:0")
        await self._server.start()

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float = 10.0) -> Any:
        """Run fn(*args) on the server's loop (between RPC steps) and return its result."""

        async def run() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def channel(self, options: list[tuple[str, Any]] | None = None) -> grpc.Channel:
        channel = grpc.insecure_channel(self.target, options=self._options if options is None else options)
        self._channels.append(channel)
        return channel

    def stub(self) -> ps_pb2_grpc.ParameterServerStub:
        """A sync stub on a new channel (closed at stop)."""
        return ps_pb2_grpc.ParameterServerStub(self.channel())

    def stop(self) -> None:
        for channel in self._channels:
            channel.close()
        if self._thread.is_alive() and self._server is not None:
            asyncio.run_coroutine_threadsafe(self._server.stop(grace=None), self._loop).result(START_TIMEOUT_S)
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(START_TIMEOUT_S)
        if not self._loop.is_closed() and not self._loop.is_running():
            self._loop.close()


def job_args(*argv: str) -> Any:
    """`ps-server` arguments for a small quiet test job; argv overrides the defaults."""
    defaults = ["--quiet", "--model", "mlp", "--model-arg", "hidden=16", "--dataset", "digits", "--workers", "2"]
    return build_parser().parse_args([*defaults, *argv])


@pytest.fixture
def ps_server(threads: concurrent.futures.ThreadPoolExecutor) -> Iterator[Callable[..., InProcessServer]]:
    """Factory: `ps_server("--mode", "asp", ...)` builds a job like `ps-server` would and serves it.

    The server's `job` attribute holds the built Job. Every server (and its evaluator and metrics
    log) is stopped at the end of the test, before the `threads` pool is joined, so a client call
    still blocked in a thread (a Join, a BSP push) is cancelled rather than hanging the teardown.
    """
    started: list[tuple[InProcessServer, Job]] = []

    def start(*argv: str) -> InProcessServer:
        job = build_job(job_args(*argv))
        server = InProcessServer(job.coordinator)
        server.job = job
        started.append((server, job))
        return server.start()

    yield start
    for server, job in reversed(started):
        server.stop()
        job.evaluator.close()
        job.metrics.close()


@pytest.fixture
def threads() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    """A thread pool for calls that block (Join, BSP pushes); joined at the end of the test."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="ps-test-client")
    yield pool
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture
def signal_after(monkeypatch: pytest.MonkeyPatch) -> Callable[[Any, str], threading.Event]:
    """`signal_after(obj, "method")` wraps obj.method so a threading.Event is set after each call returns.

    A sync point without sleeps: e.g. wait until the server core has registered a call that is
    still blocked (a Join waiting for the others, a BSP push waiting for its round). Undone at teardown.
    """

    def install(obj: Any, name: str) -> threading.Event:
        original = getattr(obj, name)
        event = threading.Event()

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            event.set()
            return result

        monkeypatch.setattr(obj, name, wrapper)
        return event

    return install


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Fails the session when its tests or the processes they start leave anything in the temporary
    folder (theirs: tests/leaks.py) or in the working tree."""
    tmp_path_factory.getbasetemp()  # pytest's tmp_path folders stay where pytest keeps them
    # torch.compile's cache (by default TMPDIR/torchinductor_USER) goes with them
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("torchinductor")))
    before = untracked()
    tmp = SuiteTmp()
    try:
        yield
    finally:
        tmp_left = tmp.close()
    after = untracked()
    message = report(tmp_left, after - before if before is not None and after is not None else set())
    if message is not None:
        pytest.fail(message, pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the slow tier's tests slow (tests/tiers.py decides which) before `-m` selects a tier:
    the README's command runs the others, `-m slow` these."""
    marked = {item.nodeid: {mark.name for mark in item.iter_markers()} for item in items}
    both = misplaced_marks(marked)
    if both:
        raise pytest.UsageError(f"marked slow and compose, prometheus or slurm (one tier each): {both}")
    for item in items:
        if tier(item.path, marked[item.nodeid]) == SLOW:
            item.add_marker(pytest.mark.slow)
