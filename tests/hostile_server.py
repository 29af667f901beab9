"""A parameter server written against protos/ alone (grpc and the generated messages), not against
ours, for tests of what a worker takes from its server: it answers Status, Join, Pull, Push, Heartbeat,
Rendezvous and Leave as a Scenario says (a good job the worker completes, but for the fields a scenario
overrides), with a shard server's Push and Pull where the scenario has one, and records the calls it got. `serving` runs one in this process; tests/e2e/
test_hostile_server.py runs a real ps-worker process against it, tests/worker/transport/
test_server_checks_wire.py the worker's own code in this process."""

from __future__ import annotations

import json
import math
import struct
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc

from protos import ps_pb2, ps_pb2_grpc

# mlp(hidden=16, layers=1) on digits (8x8 images, 10 classes): the worker builds this model itself
LAYOUT = [("1.weight", (16, 64)), ("1.bias", (16,)), ("3.weight", (10, 16)), ("3.bias", (10,))]
NUMEL = sum(math.prod(shape) for _, shape in LAYOUT)
GOOD_SPEC = {"workers": 1, "model": "mlp", "model_options": {"hidden": 16, "layers": 1}, "dataset": "digits",
             "global_batch": 16, "epochs": 1, "overlap": False}

@dataclass
class Scenario:
    """What the fake server says: the job spec, and fields of its replies that override good ones."""

    spec: dict[str, Any] = field(default_factory=lambda: dict(GOOD_SPEC))
    join: dict[str, Any] = field(default_factory=dict)
    pull: dict[str, Any] = field(default_factory=dict)
    values: list[float] | None = None  # the parameters a Pull sends (default NUMEL zeros)
    shards: list[tuple[str, int, int]] = field(default_factory=list)
    hang: str = ""  # "Join": never answered; "Pull-body", "Push-body": the first such reply stops after its header;
    # "Pull-empty": the first Pull's reply sends a chunk without values every 0.2 s after its header, until cancelled;
    # "Pull-trickle": one value every 0.2 s
    expected_workers: int = 1  # what Status says
    status_hangs_after: float | None = None  # seconds after the first Join from which Status is never answered
    header_on: str = "first"  # which chunks of a parameter reply carry its header: "first", "data" (not the first), "both"
    pushes: int = 1  # the push replies up to the one that ends the job; the others are as a Pull's
    push_values: list[float] | None = None  # the parameters of push replies that do not end the job (default: `values`; []: a header alone)
    shard_from: int = 0  # > 0: the server holds values [0, shard_from), a FakeShard on its host the rest
    shard: dict[str, Any] = field(default_factory=dict)  # fields of the shard's reply headers that override good ones
    shard_values: list[float] | None = None  # the values the shard's replies carry (default: zeros for its range)
    shard_push: dict[str, Any] = field(default_factory=dict)  # and of its push replies alone, over `shard`
    shard_push_values: list[float] | None = None  # the values its push replies carry (default: `shard_values`)
    store: dict[str, Any] = field(default_factory=dict)  # the fields of every Rendezvous reply (default: ready, nothing more)
    join_error: str = ""  # the details of a FAILED_PRECONDITION every Join ends with ("": answered)


class FakeServer(ps_pb2_grpc.ParameterServerServicer):
    """Serves `scenario`; records the calls it got."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.calls: list[str] = []
        self.times: dict[str, float] = {}  # each call's first arrival (time.monotonic)
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.shards = list(scenario.shards)  # what Join names (serving adds the FakeShard's range)

    def _spec_json(self) -> str:
        return json.dumps(self.scenario.spec)

    def _record(self, name: str) -> int:
        """Record a call; how many of its kind came before it."""
        with self.lock:
            self.calls.append(name)
            self.times.setdefault(name, time.monotonic())
            return self.calls.count(name) - 1

    def _hang(self, context: Any) -> None:
        """Answer nothing until the caller gives up or the test ends."""
        while context.is_active() and not self.stopped.wait(0.05):
            pass

    def Status(self, request: Any, context: Any) -> ps_pb2.StatusReply:
        self._record("Status")
        after = self.scenario.status_hangs_after
        if after is not None and "Join" in self.times and time.monotonic() - self.times["Join"] > after:
            self._hang(context)
        return ps_pb2.StatusReply(mode="bsp", job_json=self._spec_json(), global_batch=16,
                                  expected_workers=self.scenario.expected_workers)

    def Join(self, request: Any, context: Any) -> ps_pb2.JoinReply:
        self._record("Join")
        if self.scenario.hang == "Join":
            self._hang(context)
        if self.scenario.join_error:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, self.scenario.join_error)
        fields: dict[str, Any] = {
            "worker_id": "w0", "job_json": self._spec_json(), "num_params": NUMEL, "batch_size": 8,
            "heartbeat_interval_s": 1.0, "secret": "s" * 32,
            "layout": [ps_pb2.TensorSpec(name=n, shape=list(s), dtype="float32") for n, s in LAYOUT],
            "shards": [ps_pb2.ShardInfo(address=a, start=b, stop=c) for a, b, c in self.shards],
        }
        return ps_pb2.JoinReply(**{**fields, **self.scenario.join})

    def _params(self, done: bool, values: list[float] | None = None) -> Iterator[ps_pb2.ParamsChunk]:
        if values is None:
            values = [0.0] * (self.scenario.shard_from or NUMEL) if self.scenario.values is None else self.scenario.values
        fields: dict[str, Any] = {"round": 0, "batch_size": 8, "global_batch": 16, "wire_dtype": "float32",
                                  "num_values": len(values), "lr": 0.1, "done": done, "reason": "finished" if done else ""}
        if not done:
            fields.update(self.scenario.pull)
        header, on = ps_pb2.ParamsHeader(**fields), self.scenario.header_on
        yield ps_pb2.ParamsChunk(header=header if on != "data" else None, seq=0)
        yield ps_pb2.ParamsChunk(header=header if on != "first" else None, seq=1,
                                 data=struct.pack(f"<{len(values)}f", *values))

    def _reply(self, name: str, number: int, done: bool, context: Any,
               values: list[float] | None = None) -> Iterator[ps_pb2.ParamsChunk]:
        """The parameters (`values`, else the scenario's); the first reply of `name` stops after its
        header where the scenario says so."""
        chunks = self._params(done, values)
        yield next(chunks)
        if self.scenario.hang == f"{name}-body" and number == 0:
            self._hang(context)
            return
        if self.scenario.hang in (f"{name}-empty", f"{name}-trickle") and number == 0:
            data = next(chunks).data if self.scenario.hang.endswith("trickle") else b""
            seq = 1
            while context.is_active() and not self.stopped.wait(0.2) and (not data or (seq - 1) * 4 < len(data)):
                yield ps_pb2.ParamsChunk(seq=seq, data=data[(seq - 1) * 4:seq * 4])
                seq += 1
            return
        yield from chunks

    def Pull(self, request: Any, context: Any) -> Iterator[ps_pb2.ParamsChunk]:
        yield from self._reply("Pull", self._record("Pull"), False, context)

    def Push(self, request_iterator: Any, context: Any) -> Iterator[ps_pb2.ParamsChunk]:
        for _ in request_iterator:
            pass
        number = self._record("Push")
        done = number + 1 >= self.scenario.pushes
        yield from self._reply("Push", number, done, context, None if done else self.scenario.push_values)

    def Heartbeat(self, request: Any, context: Any) -> ps_pb2.HeartbeatReply:
        self._record("Heartbeat")
        return ps_pb2.HeartbeatReply()

    def Rendezvous(self, request: Any, context: Any) -> ps_pb2.StoreReply:
        self._record("Rendezvous")
        return ps_pb2.StoreReply(**{"ready": True, **self.scenario.store})

    def Leave(self, request: Any, context: Any) -> ps_pb2.LeaveReply:
        self._record("Leave")
        return ps_pb2.LeaveReply()


class FakeShard(ps_pb2_grpc.ParameterShardServicer):
    """The shard server of `scenario.shard_from`: answers Push and Pull with its range's values (as the
    scenario says); records the calls it got as "Shard-Push", "Shard-Pull" on `fake`."""

    def __init__(self, fake: FakeServer) -> None:
        self.fake = fake

    def _range(self, push: bool = False) -> Iterator[ps_pb2.ParamsChunk]:
        s = self.fake.scenario
        values = s.shard_push_values if push and s.shard_push_values is not None else s.shard_values
        values = [0.0] * (NUMEL - s.shard_from) if values is None else values
        fields: dict[str, Any] = {"round": 0, "wire_dtype": "float32", "num_values": len(values), **s.shard,
                                  **(s.shard_push if push else {})}
        yield ps_pb2.ParamsChunk(header=ps_pb2.ParamsHeader(**fields), seq=0)
        yield ps_pb2.ParamsChunk(seq=1, data=struct.pack(f"<{len(values)}f", *values))

    def Pull(self, request: Any, context: Any) -> Iterator[ps_pb2.ParamsChunk]:
        self.fake._record("Shard-Pull")
        yield from self._range()

    def Push(self, request_iterator: Any, context: Any) -> Iterator[ps_pb2.ParamsChunk]:
        for _ in request_iterator:
            pass
        self.fake._record("Shard-Push")
        yield from self._range(push=True)


def _start(add: Any) -> tuple[grpc.Server, int]:
    """A gRPC server on 127.0.0.1 (a free port) with the servicer `add` adds to it, started; its port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    add(server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


@contextmanager
def serving(scenario: Scenario) -> Iterator[tuple[FakeServer, str]]:
    """A FakeServer serving `scenario` on 127.0.0.1 (a free port), with its FakeShard where the scenario
    has one: it and its HOST:PORT, until the block ends."""
    fake = FakeServer(scenario)
    servers = []
    if scenario.shard_from:
        shard, shard_port = _start(lambda s: ps_pb2_grpc.add_ParameterShardServicer_to_server(FakeShard(fake), s))
        servers.append(shard)
        fake.shards.append((f"127.0.0.1:{shard_port}", scenario.shard_from, NUMEL))
    server, port = _start(lambda s: ps_pb2_grpc.add_ParameterServerServicer_to_server(fake, s))
    servers.append(server)
    try:
        yield fake, f"127.0.0.1:{port}"
    finally:
        fake.stopped.set()
        for each in servers:
            each.stop(grace=None)
