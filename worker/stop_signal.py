"""How ps-worker stops on SIGTERM or Ctrl-C (SIGINT): it leaves the job, and it always exits.

The signal raises KeyboardInterrupt in the main thread, so a call blocked there (a Join held until the
job starts, a push waiting for its round) ends at once and the worker leaves the job on its way out.
That alone is not enough: Python runs the handler wherever the main thread is, and an exception raised
inside a finalizer (``__del__``, a weakref callback) is printed and dropped, and a main thread held in
C code does not run the handler at all. So the signal also does two things that do not depend on the
main thread:

- `requested` is set: the training loop leaves before its next step (the dropped interrupt's case);
- a watcher thread, woken by the signal itself (``signal.set_wakeup_fd``), exits the process
  `grace_s` seconds after the first signal if it is still running, with every thread's stack on stderr
  (the worker did not leave: the server evicts it after --evict-after), and at once on a second one.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
GRACE_S = 30.0  # a clean leave takes a Leave call and a channel close, each bounded by CLOSE_TIMEOUT_S


class StopSignal:
    """Installs the handlers (from the main thread) and the watcher; `requested` once a stop signal came."""

    def __init__(self, grace_s: float = GRACE_S) -> None:
        self.requested = threading.Event()
        self.grace_s = grace_s
        self._read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # set_wakeup_fd's requirement: the C handler never blocks
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        for number in STOP_SIGNALS:
            signal.signal(number, self._interrupt)
        threading.Thread(target=self._watch, name="stop-signal", daemon=True).start()

    def _interrupt(self, signum: int, frame: object) -> None:
        """The Python-level handler, run in the main thread when it next runs Python code."""
        self.requested.set()
        raise KeyboardInterrupt

    def _watch(self) -> None:
        """Read the signal numbers the C-level handler writes; a stop signal starts the grace, a second
        one ends the process."""
        stops = 0
        while True:
            try:
                numbers = os.read(self._read_fd, 64)
            except InterruptedError:
                continue
            for number in numbers:
                if number not in STOP_SIGNALS:
                    continue  # another handled signal (the DataLoader's SIGCHLD)
                stops += 1
                self.requested.set()
                if stops == 1:
                    threading.Thread(target=self._grace, name="stop-grace", daemon=True).start()
                else:
                    self._leave_now(f"a second {signal.Signals(number).name}")

    def _grace(self) -> None:
        time.sleep(self.grace_s)
        self._leave_now(f"still running {self.grace_s:g} s after the stop signal", stacks=True)

    def _leave_now(self, why: str, stacks: bool = False) -> None:
        print(f"ps-worker: {why}; exiting without leaving the job (the server evicts this worker after "
              "--evict-after)", file=sys.stderr, flush=True)
        if stacks:
            with contextlib.suppress(AttributeError, OSError, ValueError):  # a stderr that is no file
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stdout.flush()
        os._exit(0)  # as after a clean stop: a supervisor that restarts on failure leaves it stopped
