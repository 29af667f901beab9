"""Signals in a program that starts processes: stop signals as exceptions, held during a cleanup, and the
child's side (SIGKILL when its parent dies, an exit status in words).

:func:`signals_as_exceptions` in a program's main thread makes SIGTERM and SIGHUP unwind through the
``finally`` blocks and ``__exit__`` methods that remove its processes, as Ctrl-C does;
:func:`signals_deferred` keeps a second signal from cutting such a cleanup short.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

PR_SET_PDEATHSIG = 1


class Terminated(Exception):
    """Raised in the main thread by :func:`signals_as_exceptions` when SIGTERM (or SIGHUP) arrives."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"terminated by {signal.Signals(signum).name}")


class ReceivedSignals:
    """The stop signals that arrived within :func:`signals_as_exceptions`, to raise again at a safe point.

    A handler's exception is lost when the signal lands while a finalizer (``__del__``, a weakref
    callback) runs: Python prints "Exception ignored" and goes on. :meth:`check` raises it again.
    """

    def __init__(self) -> None:
        self.received: list[int] = []

    def check(self) -> None:
        """Raise the first signal received (KeyboardInterrupt or Terminated); nothing if none was."""
        if self.received:
            raise _signal_exception(self.received[0])


def _signal_exception(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


@contextlib.contextmanager
def signals_as_exceptions() -> Iterator[ReceivedSignals]:
    """Within the block, SIGTERM and SIGHUP raise :class:`Terminated` and Ctrl-C KeyboardInterrupt, and
    each is recorded in the yielded :class:`ReceivedSignals`: a loop calls its ``check()`` so that a
    signal whose exception a finalizer swallowed still stops it.

    So ``with LocalCluster(...)`` unwinds and removes its processes and groups on those signals too.
    Only from the main thread (signal handlers can only be installed there); elsewhere it records nothing.
    """
    received = ReceivedSignals()
    if not _in_main_thread():
        yield received
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        received.received.append(signum)
        raise _signal_exception(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield received
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


HELD_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP until the block ends, so a second Ctrl-C cannot cut a cleanup short.

    A signal that arrives meanwhile is delivered (and raises) right after the block. Two layers: the
    main thread's mask holds a signal sent to it, and the Python-level handlers only note a signal
    that another thread took (the kernel hands a process-directed signal to any thread that does not
    block it, e.g. the cluster-settle thread, and CPython then runs the handler in the main thread at
    its next bytecode, inside the block). At the end the mask and handlers are restored and a noted
    signal is raised again.
    """
    if not _in_main_thread():
        yield
        return
    noted: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        noted.append(signum)

    # a handler installed outside Python (getsignal None) is left as it is: only the mask holds that one
    handlers = {signum: signal.signal(signum, note) for signum in sorted(HELD_SIGNALS) if signal.getsignal(signum) is not None}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # a held signal arrives now and is noted
        raised: BaseException | None = None
        for signum, handler in handlers.items():
            try:
                signal.signal(signum, handler)
            except BaseException as exc:  # noqa: BLE001 (a signal in this instant, raised by its restored handler)
                raised = raised or exc
        if raised is not None:
            raise raised
        for number in dict.fromkeys(noted):
            signal.raise_signal(number)  # delivered to this thread at once: its own handler raises


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def describe_status(code: int) -> str:
    """'exit 1' or 'killed by SIGKILL'."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


def parent_death_signal() -> Callable[[], None]:
    """A preexec step that makes the child get SIGKILL when its parent dies (Linux; no-op elsewhere)."""
    try:  # the C library this process has loaded: find_library("c") would start ldconfig every call
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        prctl = None
    if prctl is None:
        return lambda: None

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)

    return arm
