"""Where a worker's CPU goes in a round, part by part: an audit hook for benchmarks.round_cpu.

The worker's code calls one `Probe`, chosen once at import (`PROBE`): off (the base class, unless
$PS_CPU_PARTS names a file) every hook hands back what it wraps and records nothing; on (`CpuParts`),
each part is the CPU time (time.thread_time) of the thread that does it, exclusive of the parts
nested in it, summed per part and thread:

- ``data``: the main thread drawing a batch (worker.data.loader; a loader thread's own work is apart);
- ``compute``: the main thread from then to step(): forward and backward;
- ``push_copy``: the backward hooks' copies of gradients into the flat buffer and their hand-over
  to the push stream (worker.paths.overlap), and the buckets step() sends that backward left;
- ``push_check``: step()'s check that no gradient changed after its bucket went out (worker.paths.overlap);
- ``push_send``: the thread gRPC iterates a push's requests on (framing, chunking, dtype
  conversion, gRPC's send), from its start to the push's last chunk (worker.transport.bucket_stream, worker.transport.client);
- ``receive``: reading a reply (gRPC's receive and the chunks' parsing, on whichever thread does it)
  and checking its values;
- ``copy``: the reply's values decoded into the flat parameters, which the model's parameters are
  views of (common.transport.layout.load_flat);
- ``step``: the rest of the main thread: step() and the loop's own work up to the next fetch.

$PS_CPU_PARTS_STEPS="A:B" takes a snapshot as the worker fetches the batch of its step A and of its
step B (counting steps done): the process's CPU time, the parts' sums per thread, and every
thread's CPU time and kind (its Python name, or its kernel name for gRPC's C threads); the JSON
file, written at exit, holds them. The difference of the two is B - A rounds' worth, whatever
straddles a snapshot counted where it ends."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

ENV = "PS_CPU_PARTS"
STEPS_ENV = "PS_CPU_PARTS_STEPS"
ON = bool(os.environ.get(ENV))

T = TypeVar("T")
R = TypeVar("R")
_NULL = contextlib.nullcontext()


class Probe:
    """The hooks the worker's code calls, as they are when the audit is off: each hands back what it
    wraps and records nothing (`CpuParts` records)."""

    def part(self, name: str) -> contextlib.AbstractContextManager[None]:
        """`with part(name):` counts the block's CPU time (this thread's) to `name`."""
        return _NULL

    def iterated(self, name: str, items: Iterator[T]) -> Iterator[T]:
        """`items`, iterated on a thread of its own (gRPC starts one per streaming call): that thread's
        CPU time from its start to the last item counted to `name`, with what it does between items."""
        return items

    def fed(self, name: str, call: Callable[[Iterator[T]], R]) -> Callable[[Iterator[T]], R]:
        """`call` (a gRPC streaming call), its requests `iterated` under `name`."""
        return call

    def timed(self, name: str, function: Callable[[Any], T]) -> Callable[[Any], T]:
        """`function`, its CPU time counted to `name` (gRPC's response deserializer)."""
        return function

    def round_begins(self, steps_done: int) -> None:
        """A batch is fetched: the main thread's `step` part ends and `data` begins."""

    def batch_drawn(self) -> None:
        """The batch is in: `data` ends and `compute` begins."""

    def compute_ends(self) -> None:
        """step() is called: `compute` ends and `step` begins."""

    def write(self) -> None:
        """Write what was recorded (also run at exit; a worker that leaves by os._exit calls it first)."""


def thread_kind(name: str) -> str:
    """A thread's name without its number: "Thread-7 (channel_spin)" -> "channel_spin", "reply_0" -> "reply"."""
    match = re.fullmatch(r"Thread-\d+ \((.*)\)", name)
    return re.sub(r"_\d+$", "", match[1] if match else name)


def steps_window(text: str) -> tuple[int, int]:
    """$PS_CPU_PARTS_STEPS's "A:B" as (A, B); ValueError unless 0 <= A < B."""
    first, _, last = text.partition(":")
    try:
        window = int(first), int(last)
    except ValueError:
        window = (-1, -1)
    if not 0 <= window[0] < window[1]:
        raise ValueError(f"${STEPS_ENV} must be A:B with 0 <= A < B, got {text!r}")
    return window


class CpuParts(Probe):
    """The audit on: the parts' CPU per thread, and the snapshots of the window's two steps, written
    as JSON to `path` at exit."""

    def __init__(self, path: Path, window: tuple[int, int]) -> None:
        self.path, self.window = path, window
        self._local = threading.local()
        self._lock = threading.Lock()
        self._sums: dict[str, dict[int, float]] = {}  # part -> thread (native id) -> CPU seconds
        self._kinds: dict[int, str] = {}  # thread (native id) -> its kind (thread_kind)
        self._seen: dict[int, float] = {}  # thread (native id) -> its CPU seconds when a part last ended on it
        self.snapshots: list[dict[str, Any]] = []
        atexit.register(self.write)

    def _add(self, part: str, seconds: float) -> None:
        thread = threading.current_thread()
        tid = thread.native_id or 0
        seen = time.thread_time()
        with self._lock:
            self._kinds.setdefault(tid, thread_kind(thread.name))
            self._seen[tid] = seen
            per_thread = self._sums.setdefault(part, {})
            per_thread[tid] = per_thread.get(tid, 0.0) + seconds

    def _stack(self) -> list[list[Any]]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def begin(self, part: str) -> None:
        """`part` starts in this thread (ended by `end(part)`; one already open is ended first)."""
        self.end(part)
        self._stack().append([part, time.thread_time(), 0.0])

    def end(self, part: str) -> None:
        """`part` ends in this thread: its CPU time since `begin`, less its nested parts', is added."""
        stack = self._stack()
        if not any(frame[0] == part for frame in stack):
            return
        while True:
            name, started, nested = stack.pop()
            elapsed = time.thread_time() - started
            self._add(name, elapsed - nested)
            if stack:
                stack[-1][2] += elapsed
            if name == part:
                return

    @contextlib.contextmanager
    def _measured(self, part: str) -> Iterator[None]:
        self.begin(part)
        try:
            yield
        finally:
            self.end(part)

    def part(self, name: str) -> contextlib.AbstractContextManager[None]:
        return self._measured(name)

    def iterated(self, name: str, items: Iterator[T]) -> Iterator[T]:
        thread = threading.get_ident()
        try:
            yield from items
        finally:
            if threading.get_ident() == thread:  # not a close from another thread (garbage collection)
                self._add(name, time.thread_time())

    def fed(self, name: str, call: Callable[[Iterator[T]], R]) -> Callable[[Iterator[T]], R]:
        return lambda requests: call(self.iterated(name, requests))

    def timed(self, name: str, function: Callable[[Any], T]) -> Callable[[Any], T]:
        def measured(data: Any) -> T:
            with self._measured(name):
                return function(data)

        return measured

    def round_begins(self, steps_done: int) -> None:
        """Also a snapshot at the window's ends."""
        self.end("step")
        if steps_done in self.window and not any(s["steps"] == steps_done for s in self.snapshots):
            self.snapshots.append(self._snapshot(steps_done))
        self.begin("data")

    def batch_drawn(self) -> None:
        self.end("data")
        self.begin("compute")

    def compute_ends(self) -> None:
        self.end("compute")
        self.begin("step")

    def _snapshot(self, steps_done: int) -> dict[str, Any]:
        """The process's CPU seconds, the parts' sums per thread, and every thread's CPU seconds and kind: a
        live thread's now, one that ended (gRPC starts threads per call) as its last part left it."""
        threads = thread_cpu()
        process_s = time.process_time()
        with self._lock:
            sums = {part: {str(tid): s for tid, s in per_thread.items()} for part, per_thread in self._sums.items()}
            kinds = {str(tid): kind for tid, kind in self._kinds.items()}
            seen = {str(tid): s for tid, s in self._seen.items()}
        kinds.update({tid: kind for tid, (kind, _) in threads.items()})
        return {"steps": steps_done, "process_s": process_s, "parts": sums, "kinds": kinds,
                "threads": {**seen, **{tid: s for tid, (_, s) in threads.items()}}}

    def write(self) -> None:
        record = {"pid": os.getpid(), "window": list(self.window), "snapshots": self.snapshots}
        self.path.write_text(json.dumps(record), encoding="utf-8")


def thread_cpu() -> dict[str, tuple[str, float]]:
    """Every live thread of this process (by native id): its kind (a Python thread's thread_kind,
    another's kernel name: gRPC's C threads) and its CPU seconds (the thread's CPU clock)."""
    names = {t.native_id: thread_kind(t.name) for t in threading.enumerate()}
    found: dict[str, tuple[str, float]] = {}
    for task in Path("/proc/self/task").iterdir():
        tid = int(task.name)
        try:
            comm = (task / "comm").read_text().strip()
            seconds = time.clock_gettime((~tid << 3) | 6)  # the thread's CPU clock (glibc's pthread_getcpuclockid)
        except OSError:
            continue  # the thread ended meanwhile
        found[task.name] = (names.get(tid, f"native:{comm}"), seconds)
    return found


PROBE: Probe = CpuParts(Path(os.environ[ENV]), steps_window(os.environ.get(STEPS_ENV, ""))) if ON else Probe()
"""The worker's probe, chosen once: the recording one under $PS_CPU_PARTS, else the one that does nothing."""
