"""ps-worker's stop signal, in a child process that gets a real SIGTERM: the interrupt dropped inside a
finalizer still stops the loop at its next step; a main thread held in C code (the signal blocked in
it, delivered to another thread) is ended after the grace with every thread's stack; a second signal
ends the process at once."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

CHILD = """
import os, signal, sys, time
from worker.stop_signal import StopSignal
stop = StopSignal(grace_s=float(sys.argv[2]))
class Slow:
    def __del__(self):
        print("finalizing", flush=True)
        time.sleep(3)  # the SIGTERM lands here: the KeyboardInterrupt raised in __del__ is dropped
if sys.argv[1] == "finalizer":
    while not stop.requested.is_set():  # the training loop's check before a step
        Slow()
    print("left before the next step", flush=True)
    os._exit(0)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # the main thread never runs the handler
print("held", flush=True)
time.sleep(60)
print("woke", flush=True)
"""


def run_child(case: str, grace_s: float, signals: int) -> tuple[int, str, str, float]:
    """Start the child, send `signals` SIGTERMs once it says it is where the signal should land; its
    status, its stdout, its stderr and the seconds from the first signal to its exit."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, case, str(grace_s)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None
    first = child.stdout.readline()
    assert first.strip() in ("finalizing", "held"), first
    sent = time.monotonic()
    for _ in range(signals):
        child.send_signal(signal.SIGTERM)
        time.sleep(0.2)
    out, err = child.communicate(timeout=30)
    return child.returncode, first + out, err, time.monotonic() - sent


def test_an_interrupt_dropped_in_a_finalizer_still_stops_the_loop_before_its_next_step() -> None:
    code, out, err, took = run_child("finalizer", 60.0, 1)
    assert code == 0, err
    assert "left before the next step" in out, (out, err)
    assert "KeyboardInterrupt" in err  # Python's "Exception ignored in ... __del__": the interrupt was dropped
    assert took < 10


def test_a_main_thread_held_in_c_code_is_ended_after_the_grace_with_its_stacks() -> None:
    code, out, err, took = run_child("held", 1.0, 1)
    assert code == 0, err
    assert "woke" not in out
    assert "ps-worker: still running 1 s after the stop signal; exiting without leaving the job" in err
    assert "time.sleep" in err or "<string>" in err, err  # the stacks: where the main thread was held
    assert 1.0 <= took < 10


def test_a_second_signal_ends_the_process_at_once() -> None:
    code, out, err, took = run_child("held", 60.0, 2)
    assert code == 0, err
    assert "ps-worker: a second SIGTERM; exiting without leaving the job" in err
    assert "still running" not in err
    assert took < 10
