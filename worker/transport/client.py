"""The worker's gRPC client (PSClient): the calls a worker makes (Join, Push, Pull, Leave, Heartbeat,
Rendezvous, Status) with plain values in and out (common.transport.messages, converted by
common.transport.proto_convert): a Joined record at Join, a StepHeader after every push or pull, the new
parameters decoded straight into a caller-owned fp32 buffer (worker.transport.reply_receiver), over the
coordinator and any shard servers (worker.transport.shard_fanout). It keeps the secret each Join
returned and sends it with every later call that names that worker id (ps/serving/worker_keys.py).
A refused or failed call raises ServerError (worker.transport.server_error), importable from here.
Every call has a deadline from the client's `timeout` (ps-worker --timeout): a unary call's own, a
streaming reply's per message (worker.transport.watchdog), a Join's by asking the server what it waits
for (worker.transport.call_bounds). The pushes and pulls of parameters are worker.transport.push_pull's.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import grpc
import torch

from protos import ps_pb2_grpc
from common.job.spec import JobSpec
from common.transport.messages import (Beat, Caller, JobStatus, JoinAsk, JoinInfo, LeaveAsk, PullAsk, StoreAnswer,
                                       StoreCall, bounded_reason)
from common.transport.proto_convert import (beat_from_proto, heartbeat_to_proto, job_status_from_proto, join_ask_to_proto,
                                            join_from_proto, leave_to_proto, pull_ask_to_proto, status_request,
                                            store_answer_from_proto, store_call_to_proto)
from common.transport.security import PathArg
from common.transport.wire import CHUNK_BYTES
import worker.transport.server_checks as server_checks
from worker.transport.bucket_stream import PushTiming
from worker.transport.call_bounds import CallBounds
from worker.transport.channel import open_channel
from worker.transport.reply_receiver import first_chunk, receive_into
from worker.transport.server_error import ServerError, server_error
from worker.transport.push_pull import PushPull
from worker.transport.shard_fanout import ShardFanOut, shard_address
from worker.transport.stream_calls import pull_call, push_call
from worker.transport.watchdog import Watchdog

__all__ = ["CLOSE_TIMEOUT_S", "DEFAULT_TIMEOUT_S", "LEAVE_TIMEOUT_S", "Joined", "PSClient", "ServerError"]

log = logging.getLogger(__name__)
said = logging.getLogger("worker")  # lines for people (ps-worker prints them: worker.transport.reconnect)

CLOSE_TIMEOUT_S = 5.0  # PSClient.close: how long a channel close may take before it is given up
LEAVE_TIMEOUT_S = 10.0  # PSClient.leave: the longest wait for the server to answer a Leave
DEFAULT_TIMEOUT_S = 60.0  # ps-worker --timeout's default: the bound of every call (worker.transport.call_bounds)


@dataclass(frozen=True, kw_only=True)
class Joined(JoinInfo):
    """A Join's reply as the worker holds it: the job spec decoded, the shards' addresses reachable."""

    spec: JobSpec

    @classmethod
    def of(cls, info: JoinInfo, spec: JobSpec) -> Joined:
        return cls(**{f.name: getattr(info, f.name) for f in fields(info)}, spec=spec)


class PSClient(PushPull):
    """Blocking client for one parameter server. Calls name a worker id; the client adds the secret its
    Join returned for that id (none for an id it did not join as: the server refuses the call). The
    pushes and pulls of parameters are PushPull's (worker.transport.push_pull)."""

    def __init__(
        self,
        target: str,
        chunk_bytes: int = CHUNK_BYTES,
        *,
        token: str | None = None,
        tls_ca: PathArg | None = None,
        tls_cert: PathArg | None = None,
        tls_key: PathArg | None = None,
        allowed_shard_hosts: Sequence[str] = (),
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """`allowed_shard_hosts`: hosts other than the server's own where this client follows the
        server to shard servers (worker.transport.server_checks.shard_ranges); `timeout`: what every
        call's deadline derives from (worker.transport.call_bounds)."""
        self.target = target
        self.bounds = CallBounds(timeout)
        self._watchdog = Watchdog()
        self.allowed_shard_hosts = tuple(allowed_shard_hosts)
        self.chunk_bytes = max(4, chunk_bytes - chunk_bytes % 4)  # whole values of every wire dtype
        self.last_push = PushTiming()  # the latest push's (not recorded with --shards)
        self.declared: tuple[int, str] = (0, "")  # the training set every Join declares: (length, fingerprint)
        self.switch_paths = False  # every Join says whether the worker can follow --allreduce auto's trial
        self._open_channel = functools.partial(open_channel, token=token, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key)
        self._channel = self._open_channel(target)
        self._stub = ps_pb2_grpc.ParameterServerStub(self._channel)
        self._push = push_call(self._channel, "ParameterServer")
        self._pull = pull_call(self._channel, "ParameterServer")
        self._fanout = ShardFanOut(self._open_channel)  # --shards: each shard one range after the coordinator's
        self._secrets: dict[str, str] = {}  # worker id -> the secret its Join returned
        self.job: JobSpec | None = None  # the spec the server gave last (Status, Join): every later one is checked against it

    def secret(self, worker_id: str) -> str:
        """The secret this client's Join got for `worker_id` ("" if none)."""
        return self._secrets.get(worker_id, "")

    def job_spec(self) -> JobSpec:
        """The job spec in the server's Status, checked (server_checks.job_spec, and same_job against
        the one it gave before)."""
        return self._held(self.status().job_json, "Status")

    def _held(self, text: str, reply: str) -> JobSpec:
        """The spec `text` of the server's `reply`, checked, held as the job this worker is in."""
        spec = server_checks.job_spec(text)
        if self.job is not None:
            server_checks.same_job(self.job, spec, reply)
        self.job = spec
        return spec

    def use_secret(self, worker_id: str, secret: str) -> None:
        """Send `secret` with the calls naming `worker_id` (a worker that joined through another client)."""
        self._secrets[worker_id] = secret

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> bool:
        """Close the channels; False if that did not finish within `timeout` seconds and was given up.

        A call interrupted by an exception from a signal handler (SIGTERM or Ctrl-C while it waits)
        can make gRPC's channel close wait forever (grpc/grpc#19973); the close then runs on a
        daemon thread, so the caller can still leave and exit."""
        def close_all() -> None:
            self._fanout.close()
            self._channel.close()

        self._watchdog.close()
        closer = threading.Thread(target=close_all, name="ps-client-close", daemon=True)
        closer.start()
        closer.join(timeout)
        if closer.is_alive():
            log.warning("closing the connection to %s did not finish within %g s; giving it up", self.target, timeout)
            return False
        return True

    def wait_ready(self, timeout: float) -> None:
        """Return once the channel connects; UNAVAILABLE after `timeout` s (worker/transport/reconnect.py: slices)."""
        future = grpc.channel_ready_future(self._channel)
        try:
            future.result(timeout=timeout)
        except grpc.FutureTimeoutError as exc:
            future.cancel()  # no subscription left behind per slice
            raise ServerError("UNAVAILABLE", f"no parameter server answered at {self.target} within {timeout:.0f}s") from exc

    def join(self, name: str, cores: float, timeout: float | None = None, cuda_device: str | None = None,
             max_batch: int = 0) -> Joined:
        """Join; blocks until admitted (a server holds a Join until its job starts, and in a running BSP
        job until the open round closes), or `timeout` seconds (None: no bound of the caller's). While
        it waits the server is asked what for, every --timeout (`_admitted`): a server that does not
        answer, or whose answer says the Join should have been answered, ends the wait. `cuda_device`:
        the UUID of the GPU this worker computes on, None on CPU; `max_batch`: the most samples its
        memory holds (0: no bound of its own)."""
        try:
            ask = JoinAsk(name, cores, cuda_device, max_batch, *self.declared, switch_paths=self.switch_paths)
            call = self._stub.Join.future(join_ask_to_proto(ask), wait_for_ready=True, timeout=timeout)
            reply = self._admitted(name, call, timeout)
        except grpc.RpcError as exc:
            raise server_error(exc) from None
        info = join_from_proto(reply)
        self._secrets[info.worker_id] = info.secret
        self.bounds.rejoined()
        try:
            return self._joined(info, max_batch, reply.num_params)
        except server_checks.UntrustedReply:  # a member that will never push: leave at once
            with contextlib.suppress(ServerError):
                self.leave(info.worker_id, timeout=CLOSE_TIMEOUT_S)
            raise

    def _admitted(self, name: str, call: Any, timeout: float | None) -> Any:
        """The reply of the Join `call` (its deadline `timeout`); every --timeout without it, the
        server's Status says what the Join waits for (CallBounds.join_wait, said once per reason), or
        why it should have been answered: the Join is then cancelled and that is the ServerError."""
        started, told = time.monotonic(), ""
        t = self.bounds.call_s
        while True:
            left = None if timeout is None else started + timeout - time.monotonic()
            if left is not None and left <= t:  # the caller's deadline comes first: gRPC's ends the wait
                return call.result()
            try:
                return call.result(timeout=t)
            except grpc.FutureTimeoutError:
                pass
            try:
                status = self.status()
            except ServerError as exc:
                if exc.code == "RESOURCE_EXHAUSTED":  # it answers, at its bound of calls: ask again later
                    continue
                call.cancel()
                raise ServerError("DEADLINE_EXCEEDED", f"the server at {self.target} did not answer this worker's "
                                  f"Join within {t:g} s (--timeout), nor its Status ({exc})") from None
            try:
                self._held(status.job_json, "Status")
                waits_for = self.bounds.join_wait(self.target, status, time.monotonic() - started)
            except (ServerError, server_checks.UntrustedReply):
                call.cancel()
                raise
            if waits_for != told:
                said.warning("%s: waiting for %s; asking %s every %g s (--timeout)", name, waits_for, self.target, t)
                told = waits_for

    def _joined(self, info: JoinInfo, max_batch: int, num_params: int) -> Joined:
        """The Join reply as a Joined record, checked (worker.transport.server_checks) before a shard is
        reached; `num_params`: the reply's, which JoinInfo does not keep (its layout says it)."""
        server_checks.joined(info)
        server_checks.num_params(num_params, info.layout)
        spec = self._held(info.job_json, "Join reply")
        server_checks.join_epoch(info.epoch, spec)
        server_checks.shard_addresses([s.address for s in info.shards])
        shards = tuple(replace(s, address=shard_address(s.address, self.target)) for s in info.shards)
        server_checks.shard_ranges([(s.address, s.start, s.stop) for s in shards], info.layout.numel, self.target,
                                   self.allowed_shard_hosts)
        server_checks.batch_size(info.batch_size, info.global_batch or spec.global_batch, max_batch, spec.micro_batch)
        heartbeat_s = server_checks.heartbeat_interval(info.heartbeat_interval_s)
        self._fanout.use(shards, info.layout.numel)
        return Joined.of(replace(info, shards=shards, heartbeat_interval_s=heartbeat_s), spec)

    def pull_optimizer_state(self, worker_id: str, numel: int) -> torch.Tensor | None:
        """--allreduce: the server's optimizer state, `numel` fp32 values (common.params.flat_state), or None when
        its optimizer has not stepped yet, or when the server predates optimizer-state pulls (it sends
        parameters instead, and says nothing of a state: a warning, and the momentum starts at zero)."""
        request = pull_ask_to_proto(PullAsk(worker_id, self.secret(worker_id), optimizer_state=True))
        try:
            stream = self._pull_reply(self._pull(request))
            first = first_chunk(stream)
            if not first.fields.header.optimizer_state:
                stream.cancel()
                log.warning("the server sends no optimizer state (an older version): the momentum starts at zero")
                return None
            out = torch.empty(numel)
            header = receive_into(stream, out, first=first, optimizer_state=True)
        except grpc.RpcError as exc:
            raise server_error(exc) from None
        return out if header.num_values else None

    def leave(self, worker_id: str, timeout: float | None = None, reason: str = "") -> None:
        """Tell the server this worker is going, and why (`reason`, bounded to what the server takes;
        "": not said); DEADLINE_EXCEEDED after `timeout` s (default: --timeout, at most
        LEAVE_TIMEOUT_S: a server that is reachable but does not answer must not hold up an exit or a
        rejoin)."""
        timeout = min(self.bounds.call_s, LEAVE_TIMEOUT_S) if timeout is None else timeout
        try:
            request = leave_to_proto(LeaveAsk(worker_id, self.secret(worker_id), bounded_reason(reason)))
            self._stub.Leave(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise server_error(exc) from None
        self._secrets.pop(worker_id, None)

    def heartbeat(self, worker_id: str) -> Beat:
        try:
            request = heartbeat_to_proto(Caller(worker_id, self.secret(worker_id)))
            return beat_from_proto(self._stub.Heartbeat(request, timeout=self.bounds.call_s))
        except grpc.RpcError as exc:
            raise server_error(exc) from None

    def rendezvous(self, worker_id: str, call: StoreCall) -> StoreAnswer:
        """--allreduce: one call on the group's store as `worker_id` (worker.paths.group_store); the server may
        hold it for `call.wait_s` seconds (the call's deadline: that and --timeout)."""
        request = store_call_to_proto(call, worker_id, self.secret(worker_id))
        try:
            return store_answer_from_proto(self._stub.Rendezvous(request, timeout=call.wait_s + self.bounds.call_s))
        except grpc.RpcError as exc:
            raise server_error(exc) from None

    def status(self) -> JobStatus:
        try:
            return job_status_from_proto(self._stub.Status(status_request(), timeout=self.bounds.call_s))
        except grpc.RpcError as exc:
            raise server_error(exc) from None
