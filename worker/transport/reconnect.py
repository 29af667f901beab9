"""Waiting for a server that does not answer, out loud: a worker that cannot reach its server says so
within a few seconds, names what it will do, and repeats it every few seconds until the server
answers or its time is up. The lines go to the ``worker`` logger (on stderr unless the program
configures logging otherwise; ``ps-worker`` prints them as they are)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import replace

from common.job.endings import FINISHED
from common.transport.messages import StepHeader
from worker.transport.backoff import Backoff
from worker.transport.client import PSClient, ServerError

log = logging.getLogger("worker")

FIRST_NOTE_S = 2.0  # silence before the first "unreachable" line
NOTE_EVERY_S = 10.0  # then one line this often


class Waiting:
    """The lines of one wait for the server at `target`, which gives up at `deadline` (time.monotonic).

    `first` is the first line's reason (e.g. "unreachable", "lost ..."), `flag` the setting that
    bounds the wait, named so that a user knows what to change."""

    def __init__(self, who: str, target: str, deadline: float, flag: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.who, self.target, self.deadline, self.flag = who, target, deadline, flag
        self._clock = clock
        self.started = clock()
        self.notes = 0  # lines said so far
        self.next_note = self.started + FIRST_NOTE_S

    def remaining(self) -> float:
        return max(0.0, self.deadline - self._clock())

    def elapsed(self) -> float:
        return self._clock() - self.started

    def say(self, line: str) -> None:
        log.warning("%s: %s", self.who, line)
        self.notes += 1
        self.next_note = self._clock() + NOTE_EVERY_S

    def note_if_due(self) -> None:
        """Say that the server is still unreachable, if a line is due."""
        if self._clock() < self.next_note:
            return
        if self.notes == 0:
            self.say(f"server {self.target} unreachable, retrying for {self.remaining():.0f} s ({self.flag})")
        else:
            self.say(f"server {self.target} still unreachable after {self.elapsed():.0f} s, "
                     f"retrying for {self.remaining():.0f} s more")

    def given_up(self) -> ServerError:
        """The error that ends the wait."""
        waited = self.deadline - self.started
        return ServerError("UNAVAILABLE", f"server {self.target} unreachable for {waited:.0f} s ({self.flag}); giving up")

    def recovered(self, what: str) -> None:
        """Say that the wait ended well, if anything was said while it lasted."""
        if self.notes:
            log.warning("%s: %s after %.0f s", self.who, what, self.elapsed())


def wait_for_server(client: PSClient, waiting: Waiting) -> None:
    """Block until the server at `client.target` accepts a connection, saying so while it does not;
    `waiting.given_up()` when its deadline passes first."""
    while True:
        step = min(waiting.deadline, waiting.next_note) - time.monotonic()
        try:
            client.wait_ready(max(0.05, step))
            return
        except ServerError:
            pass
        if waiting.remaining() <= 0:
            raise waiting.given_up()
        waiting.note_if_due()


def lost_because(error: ServerError) -> str:
    """What a failed call says about this worker's place in the job, for a person (gRPC's detail cut
    to its last clause: "Connection refused", "Socket closed")."""
    if error.code == "UNAVAILABLE":
        return f"lost the server ({error.message.splitlines()[0].rsplit(': ', 1)[-1][:120] or 'unavailable'})"
    if error.code == "NOT_FOUND":
        return "the server does not know this worker (restarted?)"
    if error.code == "RESOURCE_EXHAUSTED":
        return f"the server turned a call away for now ({error.message.splitlines()[0][:200]})"
    if error.code == "DEADLINE_EXCEEDED":
        return f"the server did not answer in time ({error.message.splitlines()[0][:200]})"
    return f"the server dropped this worker ({error.message.splitlines()[0][:200]})"


def what_next(retry_for: float) -> str:
    """What a worker that lost its server does next (--retry-for)."""
    if retry_for <= 0:
        return "not retrying (--retry-for 0)"
    return f"rejoining, for up to {retry_for:.0f} s (--retry-for), then giving up"


def told_wait(message: str) -> float:
    """The wait a refusal names ("... join again in 4.0 s ..."), in seconds; 0 where it names none."""
    found = _TOLD_WAIT.search(message)
    return min(float(found.group(1)), MAX_TOLD_WAIT_S) if found else 0.0


def ended_reason(message: str) -> str:
    """The reason a refusal of a job that has ended names ("the job has ended (REASON)":
    ps/rounds/admission.py), for the worker's last line and exit status; FINISHED where it names none."""
    found = _ENDED.search(message)
    return found.group(1) if found else FINISHED


_TOLD_WAIT = re.compile(r"again in (\d+(?:\.\d+)?) s")
_ENDED = re.compile(r"has ended \((.*)\)$", re.DOTALL)
MAX_TOLD_WAIT_S = 300.0
"""The longest wait a server's refusal can impose on a worker (a bound on what a server is trusted for)."""

TRANSIENT_CODES = ("UNAVAILABLE", "RESOURCE_EXHAUSTED")
"""Codes of a server that may answer otherwise soon (out of reach, or at its bound of calls held at
once: ps/serving/call_budget.py): retried with backoff within --retry-for, never the end of a worker."""
REJOIN_CODES = (*TRANSIENT_CODES, "DEADLINE_EXCEEDED", "ALREADY_EXISTS", "FAILED_PRECONDITION", "NOT_FOUND")


def rejoin_with_backoff(who: str, client: PSClient, retry_for: float, error: ServerError,
                        rejoin: Callable[[float], StepHeader], joined_as: Callable[[], str], plan: StepHeader) -> StepHeader:
    """After `error` (the server restarted, the worker was evicted, the connection lost): wait for the
    server and `rejoin(deadline)` with backoff, within `retry_for` seconds for the waits and the
    attempts together, said at once and while it runs. The plan it returns (`joined_as()`: the new
    worker id); `plan` ended if the job has; ServerError once the time is up (with `error`'s reason
    where no rejoin was tried)."""
    waiting = Waiting(who, client.target, time.monotonic() + retry_for, "--retry-for")
    waiting.say(f"{lost_because(error)}; {what_next(retry_for)}")
    tried = False
    for delay in Backoff(total=retry_for).delays():
        time.sleep(min(max(delay, told_wait(error.message)), waiting.remaining()))
        if waiting.remaining() <= 0:
            break
        tried = True
        try:
            wait_for_server(client, waiting)
            rejoined = rejoin(waiting.deadline)
        except ServerError as exc:
            if exc.code not in REJOIN_CODES:
                raise
            if "has ended" in exc.message:
                return replace(plan, done=True, reason=ended_reason(exc.message))
            error = exc
            continue
        waiting.recovered(f"rejoined {client.target} as {joined_as()}")
        return rejoined
    if error.code == "UNAVAILABLE" or (error.code == "DEADLINE_EXCEEDED" and tried):
        raise waiting.given_up()
    raise ServerError(error.code, f"gave up after {retry_for:.0f} s of retries (--retry-for): {error.message}")
