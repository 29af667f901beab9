"""Hostile members of a job, written from protos/ alone (no code of the project's): each joins with the
token as any worker would, then breaks the protocol's good faith from threads of its own, and counts
what the server answered it (`tally()`: call and status code, or what it did).

- `StalledPushes`: `count` ids, each heartbeating, open a push for the open round with its header and
  then send an empty chunk every `every_s`; evicted, each joins again by its name and stalls again.
- `RejoinLoop`: one name joins, heartbeats, never pushes, and joins again as soon as it hears it was
  evicted.
- `DepartedAtShards` (a job with --shards): an id joins and leaves, then with its old secret pulls its
  ranges at every shard and stages a zero slice there for every round the server opens.
- `StoreRewrites` (an --allreduce job): a member sets, compare-and-sets and deletes the keys the other
  ranks of its generation set (the workers' ``arrived/<rank>``, gloo's ``0//cpu//0/<rank>``), then fills
  the store with keys of its own until refused; evicted, it joins again.

`RoundClock` is no attacker: the benchmark's own Status poller, which times the round open when a run
ends (the server's summary times the rounds it closed).
"""

from __future__ import annotations

import collections
import functools
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Self

import grpc

from protos import ps_pb2, ps_pb2_grpc

RPC_S = 10.0
"""A unary call's deadline."""
JOIN_S = 120.0
"""A Join's: the server answers a late joiner at a round boundary."""
RETRY_S = 0.5
"""The pause after a refused Join, before the next."""
POLL_S = 0.2
"""How often a member looks at the server's round or generation."""
GONE = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND)
"""Codes that say the caller is no member (any more): evicted, left, or unknown."""
SHARD_POLL_S = 0.05
"""How often the departed id looks for a round to stage a slice for."""
FILL_MOST = 5000
"""Keys StoreRewrites sets at most in one generation (the store's documented bound is 4096)."""
CHUNK = 1 << 20
MESSAGES = 8  # the distinct messages a peer keeps of each refusal (call and code)


def shard_address(address: str, server: str) -> str:
    """A ShardInfo address, its host taken from the server's address when empty or a wildcard."""
    host, _, port = address.rpartition(":")
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = server.rpartition(":")[0]
    return f"{host}:{port}"


class Peer:
    """A member's client on one channel, the token in every call, its work on daemon threads until
    stop() (which cancels the calls still held by closing the channel)."""

    def __init__(self, target: str, token: str) -> None:
        self.target = target
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.counts: collections.Counter[str] = collections.Counter()
        self.said: dict[str, list[str]] = collections.defaultdict(list)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._channels: list[grpc.Channel] = []
        self.stub = ps_pb2_grpc.ParameterServerStub(self.channel(target))
        self._threads: list[threading.Thread] = []

    def channel(self, target: str) -> grpc.Channel:
        channel = grpc.insecure_channel(target)
        self._channels.append(channel)
        return channel

    def bodies(self) -> list[Callable[[], None]]:
        """What runs on the peer's threads, one each."""
        raise NotImplementedError

    def start(self) -> Self:
        for body in self.bodies():
            self.spawn(body)
        return self

    def spawn(self, body: Callable[[], None]) -> threading.Thread:
        thread = threading.Thread(target=self._guarded, args=(body,), daemon=True)
        self._threads.append(thread)
        thread.start()
        return thread

    def _guarded(self, body: Callable[[], None]) -> None:
        try:
            body()
        except (grpc.RpcError, ValueError) as exc:  # a call cut by stop(), or the channel closed under it
            if not self._stop.is_set():
                self.count(f"ended {type(exc).__name__}")

    def stop(self) -> None:
        self._stop.set()
        for channel in self._channels:
            channel.close()
        for thread in self._threads:
            thread.join(10)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counts[what] += n

    def tally(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

    def refused(self, call: str, exc: grpc.RpcError) -> grpc.StatusCode:
        code = exc.code()
        what = f"{call} {code.name}"
        self.count(what)
        with self._lock:
            if len(said := self.said[what]) < MESSAGES and (details := exc.details() or "") not in said:
                said.append(details)
        return code

    def drain(self, call: str, replies: Iterable[object]) -> None:
        """Read a streaming call's replies to its end: counted "CALL OK", or its refusal (unless stopping)."""
        try:
            for _ in replies:
                pass
            self.count(f"{call} OK")
        except grpc.RpcError as exc:
            if not self.stopped:
                self.refused(call, exc)

    def told(self) -> dict[str, str]:
        """The first message of each refusal (call and code) the peer met."""
        with self._lock:
            return {what: said[0] for what, said in self.said.items()}

    def heard(self, what: str) -> list[str]:
        """The distinct messages (the first MESSAGES) of the refusals `what` ("push FAILED_PRECONDITION")."""
        with self._lock:
            return list(self.said.get(what, []))

    # ------------------------------------------------------------------------------- membership
    def join(self, name: str) -> ps_pb2.JoinReply | None:
        """Join as `name` (None, after a pause, where the server refused)."""
        try:
            reply = self.stub.Join(ps_pb2.JoinRequest(name=name, cores=1.0), metadata=self.metadata, timeout=JOIN_S)
        except grpc.RpcError as exc:
            if self.stopped:  # the job ended before the server answered: say so, the attack was there
                self.count("join unanswered at the end")
            else:
                self.refused("join", exc)
                self._stop.wait(RETRY_S)
            return None
        self.count("joined")
        return reply

    def beat(self, member: ps_pb2.JoinReply, gone: threading.Event) -> None:
        """Heartbeat as `member` at its interval until the server says it is no member (`gone` set) or
        the job is done."""
        request = ps_pb2.HeartbeatRequest(worker_id=member.worker_id, secret=member.secret)
        while not self._stop.wait(member.heartbeat_interval_s or 1.0) and not gone.is_set():
            try:
                reply = self.stub.Heartbeat(request, metadata=self.metadata, timeout=RPC_S)
            except grpc.RpcError as exc:
                if self.stopped:
                    return
                if self.refused("heartbeat", exc) in GONE:
                    gone.set()
                    return
                continue
            if reply.done:
                self._stop.set()

    def beside(self, member: ps_pb2.JoinReply) -> tuple[threading.Event, threading.Thread]:
        """`member`'s heartbeat on a thread of its own; the event it sets once the member is gone."""
        gone = threading.Event()
        return gone, self.spawn(lambda: self.beat(member, gone))

    def plan(self, member: ps_pb2.JoinReply, gone: threading.Event) -> ps_pb2.ParamsHeader | None:
        """The header of `member`'s plan (round, batch, generation, rank), or None (`gone` set if so)."""
        request = ps_pb2.PullRequest(worker_id=member.worker_id, header_only=True, secret=member.secret)
        try:
            for message in self.stub.Pull(request, metadata=self.metadata, timeout=RPC_S):
                if message.HasField("header"):
                    return message.header
        except grpc.RpcError as exc:
            if not self.stopped and self.refused("pull", exc) in GONE:
                gone.set()
        return None

    def push_header(self, member: ps_pb2.JoinReply, plan: ps_pb2.ParamsHeader, num_values: int) -> ps_pb2.PushHeader:
        return ps_pb2.PushHeader(worker_id=member.worker_id, round=plan.round, version=plan.version,
                                 batch_size=plan.batch_size, compute_ms=1.0, wire_dtype="float32",
                                 num_values=num_values, secret=member.secret)


class StalledPushes(Peer):
    """`count` ids whose pushes send their header and then an empty chunk every `every_s`."""

    def __init__(self, target: str, token: str, count: int = 3, every_s: float = 5.0) -> None:
        super().__init__(target, token)
        self.names = [f"stall{k}" for k in range(count)]
        self.every_s = every_s

    def bodies(self) -> list[Callable[[], None]]:
        return [functools.partial(self._stall, name) for name in self.names]

    def _stall(self, name: str) -> None:
        while not self.stopped:
            member = self.join(name)
            if member is None:
                continue
            gone, _ = self.beside(member)
            while not self.stopped and not gone.is_set():
                plan = self.plan(member, gone)
                if plan is not None:
                    self._stalled_push(member, plan, gone)
                self._stop.wait(RETRY_S)

    def _stalled_push(self, member: ps_pb2.JoinReply, plan: ps_pb2.ParamsHeader, gone: threading.Event) -> None:
        header = self.push_header(member, plan, member.num_params)

        def chunks() -> Iterator[ps_pb2.PushChunk]:
            yield ps_pb2.PushChunk(header=header, seq=0)
            seq = 1
            while not self._stop.wait(self.every_s) and not gone.is_set():
                self.count("empty chunks")
                yield ps_pb2.PushChunk(seq=seq)
                seq += 1

        self.count("pushes opened")
        self.drain("push", self.stub.Push(chunks(), metadata=self.metadata))


class RejoinLoop(Peer):
    """One name that joins, heartbeats, never pushes, and joins again once evicted."""

    def __init__(self, target: str, token: str, name: str = "rejoiner") -> None:
        super().__init__(target, token)
        self.name = name

    def bodies(self) -> list[Callable[[], None]]:
        return [self._loop]

    def _loop(self) -> None:
        while not self.stopped:
            member = self.join(self.name)
            if member is not None:
                self.beat(member, threading.Event())


class DepartedAtShards(Peer):
    """An id that left, pulling its ranges and staging zero slices at the shards every round."""

    def __init__(self, target: str, token: str, name: str = "departed") -> None:
        super().__init__(target, token)
        self.name = name

    def bodies(self) -> list[Callable[[], None]]:
        return [self._run]

    def _run(self) -> None:
        member = None
        while member is None and not self.stopped:
            member = self.join(self.name)
        if member is None:
            return
        if not member.shards:
            self.count("no shards in the job")
            return
        try:
            self.stub.Leave(ps_pb2.LeaveRequest(worker_id=member.worker_id, secret=member.secret),
                            metadata=self.metadata, timeout=RPC_S)
            self.count("left")
        except grpc.RpcError as exc:
            self.refused("leave", exc)
        shards = [(ps_pb2_grpc.ParameterShardStub(self.channel(shard_address(s.address, self.target))), s.start, s.stop)
                  for s in member.shards]
        staged: dict[int, threading.Thread] = {}
        pulled = None
        while not self._stop.wait(SHARD_POLL_S):
            try:
                status = self.stub.Status(ps_pb2.StatusRequest(), metadata=self.metadata, timeout=RPC_S)
            except grpc.RpcError as exc:
                self.refused("status", exc)
                continue
            if status.done:
                return
            for k, (stub, start, stop) in enumerate(shards):
                if status.round != pulled:  # its ranges once a round, as a worker pulls them
                    self._pull(stub, member)
                if k not in staged or not staged[k].is_alive():  # a slice staged at every shard at all times
                    staged[k] = self.spawn(functools.partial(self._stage, stub, member, status, stop - start))
            pulled = status.round

    def _pull(self, stub: ps_pb2_grpc.ParameterShardStub, member: ps_pb2.JoinReply) -> None:
        self.drain("shard pull", stub.Pull(ps_pb2.PullRequest(worker_id=member.worker_id, secret=member.secret),
                                           metadata=self.metadata, timeout=RPC_S))

    def _stage(self, stub: ps_pb2_grpc.ParameterShardStub, member: ps_pb2.JoinReply, status: ps_pb2.StatusReply,
               num_values: int) -> None:
        plan = ps_pb2.ParamsHeader(round=status.round, version=status.version, batch_size=max(1, member.batch_size))
        header = self.push_header(member, plan, num_values)
        zeros = bytes(4 * num_values)
        parts = [zeros[i:i + CHUNK] for i in range(0, len(zeros), CHUNK)] or [b""]
        chunks = [ps_pb2.PushChunk(header=header if i == 0 else None, seq=i, data=p) for i, p in enumerate(parts)]
        self.drain("shard stage", stub.Push(iter(chunks), metadata=self.metadata, timeout=JOIN_S))


class StoreRewrites(Peer):
    """A member rewriting the other ranks' keys of its generation's store and filling it."""

    def __init__(self, target: str, token: str, name: str = "rewriter") -> None:
        super().__init__(target, token)
        self.name = name

    def bodies(self) -> list[Callable[[], None]]:
        return [self._run]

    def _run(self) -> None:
        while not self.stopped:
            member = self.join(self.name)
            if member is None:
                continue
            gone, _ = self.beside(member)
            attacked: set[int] = set()
            while not self.stopped and not gone.is_set():
                plan = self.plan(member, gone)
                if plan is not None and plan.generation not in attacked and 0 <= plan.rank < plan.world_size:
                    attacked.add(plan.generation)
                    self._rewrite(member, plan)
                self._stop.wait(POLL_S)

    def _store(self, member: ps_pb2.JoinReply, plan: ps_pb2.ParamsHeader, what: str, op: int, key: str,
               **fields: object) -> bool:
        request = ps_pb2.StoreRequest(worker_id=member.worker_id, secret=member.secret, generation=plan.generation,
                                      op=op, keys=[key], **fields)  # type: ignore[arg-type]
        try:
            self.stub.Rendezvous(request, metadata=self.metadata, timeout=RPC_S)
        except grpc.RpcError as exc:
            if not self.stopped:
                self.refused(what, exc)
            return False
        self.count(f"{what} OK")
        return True

    def _rewrite(self, member: ps_pb2.JoinReply, plan: ps_pb2.ParamsHeader) -> None:
        junk = b"10.6.6.6:6666"
        for rank in range(plan.world_size):
            if rank == plan.rank:
                continue
            for key in (f"arrived/{rank}", f"0//cpu//0/{rank}"):
                self._store(member, plan, "store set", ps_pb2.STORE_SET, key, value=junk)
                self._store(member, plan, "store compare_set", ps_pb2.STORE_COMPARE_SET, key, expected=b"", value=junk)
                self._store(member, plan, "store delete", ps_pb2.STORE_DELETE, key)
        filled = 0
        while filled < FILL_MOST and not self.stopped:
            if not self._store(member, plan, "store fill", ps_pb2.STORE_SET, f"fill/{plan.rank}/{filled}", value=b"x" * 64):
                break
            filled += 1


class RoundClock(Peer):
    """Status polled every `every_s`: the round open now and since when it was first seen."""

    def __init__(self, target: str, token: str, every_s: float = 0.5) -> None:
        super().__init__(target, token)
        self.every_s = every_s
        self._round: int | None = None
        self._since = 0.0

    def bodies(self) -> list[Callable[[], None]]:
        return [self._poll]

    def _poll(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                status = self.stub.Status(ps_pb2.StatusRequest(), metadata=self.metadata, timeout=RPC_S)
            except grpc.RpcError:
                continue
            with self._lock:
                if status.round != self._round:
                    self._round, self._since = status.round, time.monotonic()

    def open_for(self) -> float | None:
        """Seconds the round open now has stood at least (None: never seen)."""
        with self._lock:
            return None if self._round is None else time.monotonic() - self._since
