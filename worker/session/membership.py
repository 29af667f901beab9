"""A worker's place in the job: joined under its name, kept alive by the heartbeat, joined again
after the server lost it, and left at the end."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

import torch

from common.transport.messages import StepHeader
from worker.device import gpu_uuid
from worker.paths.path_parts import ProcessSession
from worker.transport.client import LEAVE_TIMEOUT_S, Joined, PSClient, ServerError
from worker.transport.heartbeat import Heartbeat
from worker.transport.backoff import Backoff
from worker.transport.reconnect import TRANSIENT_CODES, lost_because, rejoin_with_backoff, told_wait

log = logging.getLogger("worker")


class Membership:
    """Joins at construction (blocking until admitted) and beats from then on: building the data and
    the model can take longer than --evict-after. `joined` is the latest Join's reply."""

    def __init__(self, client: PSClient, name: str, cores: float, device: torch.device, max_batch: int,
                 retry_for: float) -> None:
        self.client, self.name, self.cores, self.max_batch, self.retry_for = client, name, cores, max_batch, retry_for
        self._cuda_device = gpu_uuid(device)
        self.rejoins = 0
        self._counted = ProcessSession()
        client.switch_paths = self._counted.only
        try:
            self.joined: Joined = self._first_join()
        except BaseException:
            self._counted.close()
            raise
        self.worker_id = self.joined.worker_id
        self.heartbeat = Heartbeat(client.heartbeat, self.worker_id, self.joined.heartbeat_interval_s)

    def _first_join(self) -> Joined:
        """The first Join, retried within --retry-for while the server refuses it for now
        (RESOURCE_EXHAUSTED: at its bound of calls, or this name's wait after departures without a
        push), waiting at least as long as the refusal says."""
        waits = Backoff(total=self.retry_for).delays()
        while True:
            try:
                return self.client.join(self.name, self.cores, cuda_device=self._cuda_device, max_batch=self.max_batch)
            except ServerError as exc:
                delay = next(waits, None)
                if exc.code != "RESOURCE_EXHAUSTED" or delay is None:
                    raise
                wait = max(delay, told_wait(exc.message))
                log.warning("%s: %s; joining again in %.1f s (--retry-for)", self.name, lost_because(exc), wait)
                time.sleep(wait)

    def join_again(self, deadline: float) -> Joined:
        """Leave (if the server still knows this worker) and join again, by `deadline` (time.monotonic);
        the caller checks the reply before it `adopt`s it."""
        with contextlib.suppress(ServerError):
            bound = min(deadline - time.monotonic(), self.client.bounds.call_s, LEAVE_TIMEOUT_S)
            self.client.leave(self.worker_id, timeout=max(0.01, bound))
        return self.client.join(self.name, self.cores, timeout=max(0.01, deadline - time.monotonic()),
                                cuda_device=self._cuda_device, max_batch=self.max_batch)

    def adopt(self, joined: Joined) -> None:
        """Go on as the worker `joined` names, beating at its server's interval (a restarted server may
        give a new id and, from another --evict-after, another interval)."""
        self.joined, self.worker_id = joined, joined.worker_id
        self.heartbeat.retarget(joined.worker_id, joined.heartbeat_interval_s)
        self.rejoins += 1

    def recover(self, error: ServerError, plan: StepHeader, resync: Callable[[], StepHeader],
                rejoin: Callable[[float], StepHeader]) -> StepHeader:
        """After a failed call: `resync()` (a stale round or version), or `rejoin(deadline)` with
        backoff (server restarted or at its bound of calls held at once, this worker evicted,
        connection lost, a call past its deadline: worker.transport.call_bounds). A resync that fails
        (the server restarted meanwhile) goes on to rejoin, from its error. `plan`: the one in force."""
        if error.code == "FAILED_PRECONDITION" and "rejoin" not in error.message:
            try:
                return resync()
            except ServerError as exc:
                error = exc
        if error.code not in (*TRANSIENT_CODES, "DEADLINE_EXCEEDED", "NOT_FOUND", "FAILED_PRECONDITION"):
            raise error
        return rejoin_with_backoff(self.name, self.client, self.retry_for, error, rejoin, lambda: self.worker_id, plan)

    def leave(self, reason: str = "") -> None:
        """Tell the server this worker is going, and why ("": not said)."""
        self.client.leave(self.worker_id, reason=reason)

    def close(self) -> None:
        """Stop the heartbeat and leave the process's count of sessions."""
        self.heartbeat.stop()
        self._counted.close()

    def abandon(self) -> None:
        """A member that will never push (its set-up failed): close, and leave so that BSP peers need
        not wait for --evict-after."""
        self.close()
        with contextlib.suppress(ServerError):
            self.client.leave(self.worker_id)
