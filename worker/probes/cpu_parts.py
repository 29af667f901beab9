"""Where a worker's CPU goes in a round, part by part: an audit hook for benchmarks.round_cpu.

Off unless $PS_CPU_PARTS names a file: then every hook below costs one test of a module flag and
changes nothing the worker does. On, each part is the CPU time (time.thread_time) of the thread
that does it, exclusive of the parts nested in it, summed per part and thread:

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
_NULL = contextlib.nullcontext()
_local = threading.local()
_lock = threading.Lock()
_sums: dict[str, dict[int, float]] = {}  # part -> thread (native id) -> CPU seconds
_kinds: dict[int, str] = {}  # thread (native id) -> its kind (thread_kind)
_seen: dict[int, float] = {}  # thread (native id) -> its CPU seconds when a part last ended on it
_snapshots: list[dict[str, Any]] = []


def _window() -> tuple[int, int]:
    text = os.environ.get(STEPS_ENV, "")
    first, _, last = text.partition(":")
    try:
        window = int(first), int(last)
    except ValueError:
        window = (-1, -1)
    if not 0 <= window[0] < window[1]:
        raise ValueError(f"${STEPS_ENV} must be A:B with 0 <= A < B, got {text!r}")
    return window


_WINDOW = _window() if ON else (-1, -1)


def thread_kind(name: str) -> str:
    """A thread's name without its number: "Thread-7 (channel_spin)" -> "channel_spin", "reply_0" -> "reply"."""
    match = re.fullmatch(r"Thread-\d+ \((.*)\)", name)
    return re.sub(r"_\d+$", "", match[1] if match else name)


def _add(part: str, seconds: float) -> None:
    thread = threading.current_thread()
    tid = thread.native_id or 0
    seen = time.thread_time()
    with _lock:
        _kinds.setdefault(tid, thread_kind(thread.name))
        _seen[tid] = seen
        per_thread = _sums.setdefault(part, {})
        per_thread[tid] = per_thread.get(tid, 0.0) + seconds


def _stack() -> list[list[Any]]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def begin(part: str) -> None:
    """`part` starts in this thread (ended by `end(part)`; one already open is ended first)."""
    if not ON:
        return
    end(part)
    _stack().append([part, time.thread_time(), 0.0])


def end(part: str) -> None:
    """`part` ends in this thread: its CPU time since `begin`, less its nested parts', is added."""
    if not ON:
        return
    stack = _stack()
    if not any(frame[0] == part for frame in stack):
        return
    while True:
        name, started, nested = stack.pop()
        elapsed = time.thread_time() - started
        _add(name, elapsed - nested)
        if stack:
            stack[-1][2] += elapsed
        if name == part:
            return


@contextlib.contextmanager
def _measured(part: str) -> Iterator[None]:
    begin(part)
    try:
        yield
    finally:
        end(part)


def part(name: str) -> contextlib.AbstractContextManager[None]:
    """`with part(name):` counts the block's CPU time (this thread's) to `name`."""
    return _measured(name) if ON else _NULL


def iterated(name: str, items: Iterator[T]) -> Iterator[T]:
    """`items`, iterated on a thread of its own (gRPC starts one per streaming call): that thread's CPU
    time from its start to the last item counted to `name`, with what it does between items (gRPC's
    send of each request). `items` itself when off."""
    return _iterated(name, items) if ON else items


def _iterated(name: str, items: Iterator[T]) -> Iterator[T]:
    thread = threading.get_ident()
    try:
        yield from items
    finally:
        if threading.get_ident() == thread:  # not a close from another thread (garbage collection)
            _add(name, time.thread_time())


def timed(name: str, function: Callable[[Any], T]) -> Callable[[Any], T]:
    """`function`, its CPU time counted to `name` (gRPC's response deserializer). `function` when off."""
    if not ON:
        return function

    def measured(data: Any) -> T:
        with _measured(name):
            return function(data)

    return measured


def round_begins(steps_done: int) -> None:
    """A batch is fetched: the main thread's `step` part ends and `data` begins; a snapshot at the
    window's ends."""
    if not ON:
        return
    end("step")
    if steps_done in _WINDOW and not any(s["steps"] == steps_done for s in _snapshots):
        _snapshots.append(_snapshot(steps_done))
    begin("data")


def batch_drawn() -> None:
    """The batch is in: `data` ends and `compute` begins."""
    if not ON:
        return
    end("data")
    begin("compute")


def compute_ends() -> None:
    """step() is called: `compute` ends and `step` begins."""
    if not ON:
        return
    end("compute")
    begin("step")


def _snapshot(steps_done: int) -> dict[str, Any]:
    """The process's CPU seconds, the parts' sums per thread, and every thread's CPU seconds and kind: a
    live thread's now, one that ended (gRPC starts threads per call) as its last part left it."""
    threads = thread_cpu()
    process_s = time.process_time()
    with _lock:
        sums = {part: {str(tid): s for tid, s in per_thread.items()} for part, per_thread in _sums.items()}
        kinds = {str(tid): kind for tid, kind in _kinds.items()}
        seen = {str(tid): s for tid, s in _seen.items()}
    kinds.update({tid: kind for tid, (kind, _) in threads.items()})
    return {"steps": steps_done, "process_s": process_s, "parts": sums, "kinds": kinds,
            "threads": {**seen, **{tid: s for tid, (_, s) in threads.items()}}}


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


def _write() -> None:
    record = {"pid": os.getpid(), "window": list(_WINDOW), "snapshots": _snapshots}
    Path(os.environ[ENV]).write_text(json.dumps(record), encoding="utf-8")


if ON:
    atexit.register(_write)
