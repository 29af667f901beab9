"""``ps-cluster run``'s signal handling (deploy/signals.py): a signal another thread takes or a
finalizer swallows still stops the run, one right after a fork leaves no process, and arming the
parent death signal starts none."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest


def test_a_signal_another_thread_takes_is_still_held_until_the_block_ends() -> None:
    """A process-directed SIGTERM goes to a thread that does not block it (here: a waiting helper
    thread, as the cluster-settle thread is), and CPython then runs the handler in the main thread at
    its next bytecode. The deferral still holds it until the block ends, then it raises."""
    import threading

    from deploy import signals

    sigint_before = signal.getsignal(signal.SIGINT)
    stop = threading.Event()
    helper = threading.Thread(target=stop.wait, daemon=True)
    helper.start()
    reached = []
    try:
        with signals.signals_as_exceptions(), pytest.raises(signals.Terminated):
            with signals.signals_deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                deadline = time.monotonic() + 0.5
                while time.monotonic() < deadline:  # bytecodes at which an undeferred handler would run
                    time.sleep(0.001)
                reached.append(True)
        assert reached == [True]
        assert signal.getsignal(signal.SIGINT) is sigint_before  # the deferral's handlers are gone again
    finally:
        stop.set()
        helper.join()


def test_a_ctrl_c_that_a_finalizer_swallows_still_stops_the_run() -> None:
    """Ctrl-C landing while a finalizer runs: Python prints "Exception ignored" and goes on, and the
    emulator ran its job to the end and exited 0. The signal is recorded, and the loop's check()
    raises it again."""
    import gc

    from deploy import signals

    class Finalized:
        def __del__(self) -> None:
            signal.raise_signal(signal.SIGINT)  # the handler runs here, inside the finalizer

    sigint_before = signal.getsignal(signal.SIGINT)
    unraisable: list[object] = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        with signals.signals_as_exceptions() as received:
            Finalized()
            gc.collect()
            assert len(unraisable) == 1  # the KeyboardInterrupt was swallowed...
            with pytest.raises(KeyboardInterrupt):
                received.check()  # ...and comes back at the check
    finally:
        sys.unraisablehook = hook
    assert signal.getsignal(signal.SIGINT) is sigint_before


def test_arming_the_parent_death_signal_starts_no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """ctypes.util.find_library ran ldconfig for every spawn: a short-lived extra child of the emulator."""
    from deploy import signals

    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr("subprocess.Popen", no_process)
    arm = signals.parent_death_signal()
    assert callable(arm)


def test_a_signal_right_after_a_fork_still_leaves_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM arriving just after the launcher forked a process (here: the instant Popen returns) is
    held until the process is recorded, so close() stops it. It used to raise before the record: under
    load, a signal to ps-cluster while its cluster started left a worker running after it."""
    import subprocess as real_subprocess
    import threading

    from deploy import launcher, signals

    started: list[real_subprocess.Popen[bytes]] = []
    real_popen = real_subprocess.Popen

    def popen_then_sigterm(*args: object, **kwargs: object) -> real_subprocess.Popen[bytes]:
        proc = real_popen(*args, **kwargs)  # type: ignore[call-overload]
        if "preexec_fn" in kwargs:  # the launcher's spawn (not ctypes' ldconfig lookup)
            started.append(proc)
            # to this (the main) thread: a process-directed signal may go to another thread of the test
            # process, whose handler can run late (test_a_signal_another_thread_takes_... covers that)
            signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
        return proc

    monkeypatch.setattr(real_subprocess, "Popen", popen_then_sigterm)  # the module cluster_processes spawns with
    cluster = launcher.LocalCluster([], [launcher.WorkerSpec("w0", 1.0)], tmp_path, limiter="slowdown")
    try:
        with signals.signals_as_exceptions(), pytest.raises(signals.Terminated):
            cluster.procs.spawn("w0", [sys.executable, "-c", "import time; time.sleep(60)"], None,
                                lambda proc: cluster.processes.__setitem__("w0", proc))
        assert [*cluster.processes.values()] == started  # recorded before the signal was let through
        assert started[0].poll() is None  # the child did not inherit the held signals' block...
        started[0].terminate()  # ...so SIGTERM ends it at once, as close() relies on
        assert started[0].wait(timeout=10) == -signal.SIGTERM
    finally:
        cluster.close()
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
