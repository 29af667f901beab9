"""Hostile and malformed input: generated protocol sequences, a Join flood, message size limits.

Every call carries a deadline, so "the server answered" means a status code arrived in time (a
DEADLINE_EXCEEDED counts as a hang and fails the test). Expected codes are computed per input
class from the server's documented checks (docs/protocol.md, "Errors"); a call with several faults may
answer with the code of any of them, but never UNKNOWN or INTERNAL, and a refused call must leave
the server's state bit-for-bit as it was.
"""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import grpc
import pytest
import torch
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from protos import ps_pb2, ps_pb2_grpc
from ps.rounds.membership import MAX_CORES, MAX_NAME
from ps.server import GRPC_OPTIONS, MAX_MESSAGE_BYTES, Job, build_job
from common.transport.messages import MAX_COMPUTE_MS
from common.transport.wire import CHUNK_BYTES, FlatReceiver, decode, encode, split
from tests.conftest import InProcessServer, job_args
from tests.state_compare import assert_same, server_state

Code = grpc.StatusCode
OK = Code.OK
INVALID = Code.INVALID_ARGUMENT
PRECONDITION = Code.FAILED_PRECONDITION
TIMEOUT = 10.0  # per call: no answer within it is a hang
SMALL_CHUNK = 1024  # several chunks per push of the tiny test model
WIRE_DTYPES = ("float32", "bfloat16", "float16")
MiB = 1 << 20
HAS_KIND = "kind" in ps_pb2.PushHeader.DESCRIPTOR.fields_by_name  # PushKind: values, or --allreduce reports/snapshots
SECRETS: dict[str, str] = {}  # worker id -> the secret its Join returned (ids carry random digits: unique)


# ----------------------------------------------------------------------------- helpers
@dataclasses.dataclass
class Answer:
    """The outcome of one call: a status code and either the reply or the error details."""

    code: grpc.StatusCode
    details: str = ""
    value: Any = None


def ask(fn: Callable[[], Any]) -> Answer:
    """Run one RPC; any status is an answer, except a deadline (the server hung)."""
    try:
        return Answer(OK, value=fn())
    except grpc.RpcError as err:
        assert err.code() != Code.DEADLINE_EXCEEDED, f"no answer within {TIMEOUT}s: {err.details()}"
        return Answer(err.code(), err.details() or "")


def read_params(stream: Iterable[ps_pb2.ParamsChunk]) -> tuple[ps_pb2.ParamsHeader, torch.Tensor]:
    """Decode a parameter stream (header first) into (header, fp32 tensor)."""
    messages = list(stream)
    assert messages and messages[0].HasField("header")
    assert not any(m.HasField("header") for m in messages[1:])
    h = messages[0].header
    receiver = FlatReceiver(torch.empty(h.num_values), h.num_values, h.wire_dtype)
    for m in messages:
        receiver.feed(m.seq, m.data)
    return h, receiver.finish(check_finite=False)


def snapshot(server: InProcessServer) -> dict[str, Any]:
    """Everything a refused request must leave alone (tests/state_compare.py), copied on the
    server's loop; without the evaluator's accuracy, which lands from a background thread."""
    return server.call(lambda: server_state(server.coordinator, with_accuracy=False))


def start_server(*argv: str) -> InProcessServer:
    """Build a job like `ps-server` would (tiny mlp on digits) and serve it in-process."""
    job = build_job(job_args("--model-arg", "hidden=8", *argv))
    server = InProcessServer(job.coordinator)
    server.job = job
    return server.start()


def stop_server(server: InProcessServer) -> None:
    job: Job | None = server.job
    server.stop()
    if job is not None:
        job.evaluator.close()
        job.metrics.close()


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


# ------------------------------------------------------------------------ push messages
STREAM_FAULTS = (
    "empty",           # no message at all
    "no-header",       # the first chunk carries no header
    "second-header",   # a later chunk repeats the header
    "reorder",         # chunks sent out of order
    "duplicate",       # a chunk sent twice
    "skip",            # a sequence number missing
    "negative-seq",
    "drop-last",       # too few values
    "extra",           # one chunk too many
    "short",           # payload one value short of the declared count
    "long",            # payload two values over the declared count
    "odd-bytes",       # a chunk whose length is not a whole number of values
    "truncate-bytes",
    "dtype-mismatch",  # bytes in another dtype than the header declares
)


@dataclasses.dataclass(frozen=True)
class PushSpec:
    """One push as a client could send it: a header (any field may be wrong) and a chunk stream."""

    worker_id: str
    round: int
    version: int
    batch_size: int
    compute_ms: float
    wire_dtype: str
    num_values: int
    stream: str = "ok"
    poison: float | None = None  # one payload value replaced by this
    scale: float = 0.01
    seed: int = 0
    kind: int = 0  # PushKind; this job takes values (0) only
    fill: float | None = None  # every value this one (instead of random values times scale)
    secret: str | None = None  # None: the worker's own (SECRETS)


    @property
    def payload_dtype(self) -> str:
        dtype = self.wire_dtype if self.wire_dtype in WIRE_DTYPES else "float32"
        if self.stream == "dtype-mismatch":
            return "float32" if dtype != "float32" else "float16"
        return dtype

    def values(self) -> torch.Tensor:
        count = max(self.num_values, 0) + {"short": -1, "long": 2}.get(self.stream, 0)
        if self.fill is not None:
            return torch.full((max(count, 0),), self.fill)
        values = torch.randn(max(count, 0), generator=torch.Generator().manual_seed(self.seed)) * self.scale
        if self.poison is not None and len(values):
            values[len(values) // 2] = self.poison
        return values

    def payload_is_finite(self) -> bool:
        """Whether the decoded payload is finite (a finite fp32 value may overflow fp16 on the wire)."""
        if self.poison is None:
            return True
        wide = torch.tensor([self.poison]).to(getattr(torch, self.payload_dtype)).float()
        return bool(torch.isfinite(wide).all())

    def chunks(self) -> list[ps_pb2.PushChunk]:
        header = ps_pb2.PushHeader(
            worker_id=self.worker_id, round=self.round, version=self.version, batch_size=self.batch_size,
            compute_ms=self.compute_ms, wire_dtype=self.wire_dtype, num_values=self.num_values,
            secret=SECRETS.get(self.worker_id, "") if self.secret is None else self.secret,
        )
        if HAS_KIND:
            header.kind = self.kind
        parts = split(encode(self.values(), self.payload_dtype), SMALL_CHUNK)
        c = [ps_pb2.PushChunk(header=header if i == 0 else None, seq=i, data=p) for i, p in enumerate(parts)]
        fault = self.stream
        if fault == "empty":
            return []
        if fault == "no-header":
            c[0].ClearField("header")
        elif fault == "second-header":
            if len(c) > 1:
                c[1].header.CopyFrom(header)
            else:
                c.append(ps_pb2.PushChunk(header=header, seq=1))
        elif fault == "reorder":
            if len(c) >= 3:
                c[1], c[2] = c[2], c[1]
            elif len(c) == 2:
                c[0].seq, c[1].seq = 1, 0
            else:
                c[0].seq = 1
        elif fault == "duplicate":
            if len(c) >= 2:
                c.insert(2, copy.deepcopy(c[1]))
            else:
                c.append(ps_pb2.PushChunk(seq=0, data=c[0].data))
        elif fault == "skip":
            if len(c) >= 3:
                del c[1]
            else:
                c[-1].seq += 1
        elif fault == "negative-seq":
            c[0].seq = -1
        elif fault == "drop-last":
            if len(c) >= 2:
                c.pop()
            else:
                c[0].data = b""
        elif fault == "extra":
            c.append(ps_pb2.PushChunk(seq=len(c), data=bytes(encode(torch.ones(1), self.payload_dtype))))
        elif fault == "odd-bytes":
            c[self.seed % len(c)].data += b"\x00" * (1 + self.seed % 3)
        elif fault == "truncate-bytes":
            target = c[self.seed % len(c)]
            target.data = target.data[:-1] if target.data else b"\x00"
        return c


# ------------------------------------------------------------------------- strategies
NAMES = st.one_of(
    st.sampled_from(["", "x" * MAX_NAME, "x" * (MAX_NAME + 1), "é" * MAX_NAME, "é" * (MAX_NAME + 1), "\x00", "a b/c\n", "🚀"]),
    st.text(max_size=12),
)
CORES = st.one_of(
    st.floats(0.001, 64.0),
    st.sampled_from([0.0, -0.0, -1.0, math.nan, math.inf, -math.inf, MAX_CORES, MAX_CORES * (1 + 1e-12), 1e300, 5e-324]),
)
COMPUTE_MS = st.one_of(
    st.floats(0.0, 1e4),
    st.sampled_from([0.0, -0.0, 5e-324, MAX_COMPUTE_MS, MAX_COMPUTE_MS * (1 + 1e-12), -1e-9, -1.0, math.nan, math.inf, -math.inf, 1e300]),
)
DECLARED_DTYPES = st.sampled_from([*WIRE_DTYPES * 4, "int8", "", "FLOAT32", "float64", "bf16"])
POISON = st.sampled_from([None] * 6 + [math.nan, math.inf, -math.inf, 7e4])  # 7e4 overflows only fp16
UNKNOWN_IDS = st.one_of(st.sampled_from(["", "ghost-00000000", "w0", "w0-", "\x00", "x" * 300]), st.text(max_size=16))


def pick(data: st.DataObject, options: list[Any], label: str) -> Any:
    """One of `options`, drawn the same way whatever their number: they may come from the server's
    state, which concurrent calls leave in an order of their own (hypothesis replays must draw alike)."""
    return options[data.draw(st.integers(0, 7), label=label) % len(options)]


def worker_id_code(server_ids: dict[str, str], gone: dict[str, str], pending: set[str], worker_id: str,
                   secret: str, right: str) -> grpc.StatusCode:
    """The code a call naming worker_id with `secret` gets (`right`: that id's secret): an id the server
    never issued NOT_FOUND; a known one without a secret UNAUTHENTICATED, with another PERMISSION_DENIED;
    then active OK, evicted/pending FAILED_PRECONDITION, left NOT_FOUND."""
    if worker_id not in server_ids.values() and worker_id not in gone and worker_id not in pending:
        return Code.NOT_FOUND
    if not secret:
        return Code.UNAUTHENTICATED
    if secret != right:
        return Code.PERMISSION_DENIED
    if worker_id in server_ids.values():
        return OK
    if gone.get(worker_id) == "evicted" or worker_id in pending:
        return PRECONDITION
    return Code.NOT_FOUND


@dataclasses.dataclass
class View:
    """What the expected outcome of the next call depends on, read from the server between calls."""

    done: bool
    round: int
    version: int
    epoch: int
    samples: int
    plan: dict[str, int]
    pushed: set[str]
    pending: dict[str, str]  # worker id -> name
    flat: torch.Tensor
    told: dict[str, dict[int, set[int]]]  # active worker id -> {round (ASP: version): batch sizes told}

    def batches_told(self, worker_id: str, step: int) -> set[int]:
        return self.told.get(worker_id, {}).get(step, set())


# ---------------------------------------------------------------------------- machine
class HostileMachine(RuleBasedStateMachine):
    """Random valid and invalid calls against one in-process server; MODE is set by subclasses.

    Between rules the server is idle: BSP rounds open and close inside the `round` rule (the
    pushes run on a thread pool; hostile calls are made while the round is open), so a valid
    push never waits on a rule that will not come.
    """

    MODE = "bsp"

    def __init__(self) -> None:
        super().__init__()
        self.server: InProcessServer | None = None
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="hostile")
        self.ids: dict[str, str] = {}    # active name -> worker id
        self.gone: dict[str, str] = {}   # departed worker id -> "left" | "evicted"
        self.fresh = 0
        self.last_step = (0, 0)
        self.waiting: dict[str, concurrent.futures.Future] = {}  # name -> a BSP Join waiting for the round boundary

    # -------------------------------------------------------------- setup/teardown
    @initialize(
        workers=st.integers(2, 3),
        short_job=st.sampled_from([False, False, True]),
        controller=st.sampled_from(["dynamic", "static", "uniform"]),
        staleness=st.sampled_from([None, 0, 2]),
    )
    def start(self, workers: int, short_job: bool, controller: str, staleness: int | None) -> None:
        # a short job (B=600, 1 epoch over 1437 samples) ends after ~3 rounds, so "done" gets exercised
        self.global_batch, epochs = (600, 1) if short_job else (24, 100)
        self.max_workers = workers + 2
        self.max_staleness = staleness if self.MODE == "asp" else None
        argv = [
            "--mode", self.MODE, "--workers", str(workers), "--max-workers", str(self.max_workers),
            "--global-batch", str(self.global_batch), "--epochs", str(epochs), "--controller", controller,
            "--adjust-every", "2", "--evict-after", "60", "--lr", "0.05",
        ]
        if self.max_staleness is not None:
            argv += ["--max-staleness", str(self.max_staleness)]
        self.server = start_server(*argv)
        self.stub = ps_pb2_grpc.ParameterServerStub(self.server.channel())
        self.numel = self.server.coordinator.layout.numel
        names = [f"w{i}" for i in range(workers)]
        futures = {
            n: self.pool.submit(ask, lambda n=n, i=i: self.stub.Join(ps_pb2.JoinRequest(name=n, cores=1.0 + i), timeout=TIMEOUT))
            for i, n in enumerate(names)
        }
        for n, f in futures.items():
            answer = f.result(2 * TIMEOUT)
            assert answer.code == OK, answer
            self.ids[n] = answer.value.worker_id
            SECRETS[answer.value.worker_id] = answer.value.secret

    def teardown(self) -> None:
        if self.server is not None:
            stop_server(self.server)
        self.pool.shutdown(wait=True, cancel_futures=True)

    # ----------------------------------------------------------------------- views
    def view(self) -> View:
        def take() -> View:
            c = self.server.coordinator
            return View(
                c.done, c.round, c.version, c.epoch, c.samples, c.policy.plan(), set(c.bsp.pushed),
                {k: m.name for k, m in c.membership.pending.items()}, c.store.flat.clone(),
                {k: {step: set(b) for step, b in m.told.items()} for k, m in c.membership.active.items()},
            )

        return self.server.call(take)

    def name_of(self, worker_id: str) -> str | None:
        return next((n for n, i in self.ids.items() if i == worker_id), None)

    def draw_worker_id(self, data: st.DataObject, extra: Iterable[str] = ()) -> str:
        choices: list[st.SearchStrategy[str]] = [UNKNOWN_IDS]
        if self.ids:
            choices += [st.sampled_from(sorted(self.ids.values()))] * 3
        if self.gone:
            choices.append(st.sampled_from(sorted(self.gone)))
        if extra := sorted(extra):
            choices.append(st.sampled_from(extra))
        return data.draw(st.one_of(choices), label="worker id")

    def right_secret(self, worker_id: str) -> str:
        """The secret the server's Join gives (gave, or will give) that id."""
        return self.server.coordinator.keys.secret(worker_id)

    def draw_secret(self, data: st.DataObject, worker_id: str) -> str:
        """Mostly the worker's own secret; sometimes none, another worker's, or a made-up one."""
        others = sorted(SECRETS[i] for i in self.ids.values() if i != worker_id and i in SECRETS)
        choices = [st.just(self.right_secret(worker_id))] * 6 + [st.just(""), st.text(max_size=70)]
        if others:
            choices.append(st.sampled_from(others))
        return data.draw(st.one_of(choices), label="secret")

    def id_code(self, worker_id: str, v: View, secret: str) -> grpc.StatusCode:
        return worker_id_code(self.ids, self.gone, set(v.pending), worker_id, secret, self.right_secret(worker_id))

    def refused_leaves_no_trace(self, answer_of: Callable[[], Answer], expected: set[grpc.StatusCode], what: str) -> Answer:
        """Make a call expected to be refused; its code must be expected and the state unchanged."""
        before = snapshot(self.server)
        answer = answer_of()
        event(f"{what.partition('(')[0]}: {answer.code.name}")
        assert answer.code in expected, f"{what}: got {answer.code.name} ({answer.details}), expected {sorted(c.name for c in expected)}"
        if answer.code != OK:
            assert_same(before, snapshot(self.server))
        return answer

    # ------------------------------------------------------------------------ Join
    def draw_join(self, data: st.DataObject) -> tuple[str, float]:
        names = [st.builds(lambda: f"n{self.fresh}")] * 4 + [NAMES]
        if self.ids:
            names.append(st.sampled_from(sorted(self.ids)))
        name = data.draw(st.one_of(names), label="name")
        cores = data.draw(st.one_of(st.just(1.0), st.just(2.0), CORES), label="cores")
        return name, cores

    def join_codes(self, name: str, cores: float, v: View) -> set[grpc.StatusCode]:
        if v.done:
            return {PRECONDITION}
        codes = set()
        if not name or len(name) > MAX_NAME:
            codes.add(INVALID)
        if not (math.isfinite(cores) and 0 < cores <= MAX_CORES):
            codes.add(INVALID)
        if len(self.ids) + len(v.pending) >= self.max_workers:
            codes.add(PRECONDITION)
        if name in self.ids or name in v.pending.values():
            codes.add(Code.ALREADY_EXISTS)
        return codes or {OK}

    def join_call(self, name: str, cores: float) -> Answer:
        answer = ask(lambda: self.stub.Join(ps_pb2.JoinRequest(name=name, cores=cores), timeout=TIMEOUT))
        if answer.code == OK:
            SECRETS[answer.value.worker_id] = answer.value.secret
        return answer

    def admitted(self, name: str, answer: Answer, round_: int) -> None:
        reply = answer.value
        assert reply.worker_id.startswith(f"{name}-") and reply.num_params == self.numel
        assert reply.round == round_
        plan = self.server.call(self.server.coordinator.policy.plan)
        assert reply.batch_size == plan[name] >= 1
        assert reply.secret == self.right_secret(reply.worker_id)
        self.ids[name] = reply.worker_id
        if name == f"n{self.fresh}":
            self.fresh += 1

    def join_later(self, name: str, cores: float) -> None:
        """A BSP Join while workers compute the open round: it waits for the round to close."""
        self.waiting[name] = self.pool.submit(self.join_call, name, cores)
        wait_until(lambda: name in self.view().pending.values() or self.waiting[name].done(), "the late joiner to be pending")
        assert not self.waiting[name].done(), self.waiting[name].result()
        if name == f"n{self.fresh}":
            self.fresh += 1

    def settle_waiting(self, round_: int, done: bool) -> None:
        """The waiting Joins, once their round boundary came (or the job ended)."""
        for name, future in self.waiting.items():
            answer = future.result(2 * TIMEOUT)
            if done:  # the round ended the job: the late joiner is told so
                assert answer.code == PRECONDITION and "has ended" in answer.details, answer
            else:
                assert answer.code == OK, answer
                self.admitted(name, answer, round_)
        self.waiting = {}

    @rule(data=st.data())
    def join(self, data: st.DataObject) -> None:
        name, cores = self.draw_join(data)
        v = self.view()
        expected = self.join_codes(name, cores, v)
        if self.MODE == "bsp" and expected == {OK} and self.ids:
            self.join_later(name, cores)  # the members are computing the open round
            return
        answer = self.refused_leaves_no_trace(lambda: self.join_call(name, cores), expected, f"Join({name!r}, {cores})")
        if answer.code == OK:  # ASP, or nobody computing: admitted at once
            self.admitted(name, answer, v.round)

    # ---------------------------------------------------------- Leave/Pull/Heartbeat
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        worker_id = self.draw_worker_id(data)
        secret = self.draw_secret(data, worker_id)
        v = self.view()
        expected = {self.id_code(worker_id, v, secret)}
        answer = self.refused_leaves_no_trace(
            lambda: ask(lambda: self.stub.Leave(ps_pb2.LeaveRequest(worker_id=worker_id, secret=secret), timeout=TIMEOUT)),
            expected, "Leave",
        )
        if answer.code == OK:
            del self.ids[self.name_of(worker_id)]
            self.gone[worker_id] = "left"
            self.admit_waiting_if_alone(v)

    def admit_waiting_if_alone(self, v: View) -> None:
        """The last active worker went: the Joins waiting for its round are admitted at once."""
        if not self.ids and self.waiting:
            self.settle_waiting(v.round, v.done)

    def pull_checked(self, worker_id: str, v: View, secret: str) -> None:
        answer = self.refused_leaves_no_trace(
            lambda: ask(lambda: read_params(self.stub.Pull(ps_pb2.PullRequest(worker_id=worker_id, secret=secret), timeout=TIMEOUT))),
            {self.id_code(worker_id, v, secret)}, "Pull",
        )
        if answer.code == OK:
            h, params = answer.value
            assert (h.round, h.version, h.epoch, h.done) == (v.round, v.version, v.epoch, v.done)
            assert (h.num_values, h.wire_dtype) == (self.numel, "float32")
            assert h.batch_size == v.plan.get(self.name_of(worker_id), 0) and h.global_batch == sum(v.plan.values())
            assert torch.equal(params, v.flat)

    def heartbeat_checked(self, worker_id: str, v: View, secret: str) -> None:
        answer = self.refused_leaves_no_trace(
            lambda: ask(lambda: self.stub.Heartbeat(ps_pb2.HeartbeatRequest(worker_id=worker_id, secret=secret), timeout=TIMEOUT)),
            {self.id_code(worker_id, v, secret)}, "Heartbeat",
        )
        if answer.code == OK:
            beat = answer.value
            assert (beat.done, beat.epoch, beat.round, beat.version) == (v.done, v.epoch, v.round, v.version)

    @rule(data=st.data())
    def pull(self, data: st.DataObject) -> None:
        worker_id = self.draw_worker_id(data)
        self.pull_checked(worker_id, self.view(), self.draw_secret(data, worker_id))

    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        worker_id = self.draw_worker_id(data)
        self.heartbeat_checked(worker_id, self.view(), self.draw_secret(data, worker_id))

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        """A worker falls silent past --evict-after: the reaper evicts it (and only it)."""
        name = data.draw(st.sampled_from(sorted(self.ids)), label="silent worker")
        worker_id = self.ids[name]

        def silence_and_reap() -> tuple[bool, list[str]]:
            c = self.server.coordinator
            c.members[worker_id].last_seen = c.clock() - c.evict_after - 1.0
            return c.done, c.evict_stale()

        v = self.view()
        done, evicted = self.server.call(silence_and_reap)
        event(f"evict: {'after the end' if done else 'evicted'}")
        if done:
            assert evicted == []  # nobody is evicted once the job has ended
            return
        assert evicted == [name]
        del self.ids[name]
        self.gone[worker_id] = "evicted"
        self.admit_waiting_if_alone(v)

    # ------------------------------------------------------------------------ Push
    def draw_push(self, data: st.DataObject, v: View, extra_ids: Iterable[str] = ()) -> PushSpec:
        worker_id = self.draw_worker_id(data, extra_ids)
        round_ = v.round + data.draw(st.sampled_from([0] * 6 + [-1, 1, 2, -v.round - 1, 2**62]), label="round offset")
        version = v.version - data.draw(st.sampled_from([0] * 4 + [1, 2, 3, -1, -2, v.version + 1, -(2**62)]), label="staleness")
        told = sorted(v.batches_told(worker_id, round_ if self.MODE == "bsp" else version)) or [v.plan.get(self.name_of(worker_id) or "", 1)]
        planned = pick(data, told, "told batch")
        B = self.global_batch
        return PushSpec(
            worker_id=worker_id,
            round=round_,
            version=version,
            batch_size=data.draw(
                st.one_of(st.just(planned), st.just(planned), st.integers(1, B),
                          st.sampled_from([0, -1, -(2**31), B + 1, 2**31 - 1])),
                label="batch",
            ),
            compute_ms=data.draw(COMPUTE_MS, label="compute_ms"),
            wire_dtype=data.draw(DECLARED_DTYPES, label="wire dtype"),
            num_values=self.numel + data.draw(st.sampled_from([0] * 8 + [-1, 1, -self.numel, self.numel]), label="num_values offset"),
            stream=data.draw(st.sampled_from(["ok"] * 8 + list(STREAM_FAULTS)), label="stream"),
            poison=data.draw(POISON, label="poison"),
            scale=data.draw(st.sampled_from([0.01, 1.0, 1e3]), label="scale"),
            seed=data.draw(st.integers(0, 2**16), label="seed"),
            kind=data.draw(st.sampled_from([0] * 12 + [1, 2, 7, -3]), label="kind") if HAS_KIND else 0,
            secret=self.draw_secret(data, worker_id),
        )

    def push_codes(self, spec: PushSpec, v: View) -> set[grpc.StatusCode]:
        """Every code the push may get: one per fault it has (OK if none)."""
        if spec.stream in ("empty", "no-header"):
            return {INVALID}  # nothing else can be checked without a header
        codes = set()
        if (code := self.id_code(spec.worker_id, v, spec.secret or "")) != OK:
            codes.add(code)
        if spec.wire_dtype not in WIRE_DTYPES or spec.kind != 0:
            codes.add(INVALID)
        if not 0 < spec.batch_size <= self.global_batch:
            codes.add(INVALID)
        if not (math.isfinite(spec.compute_ms) and 0 <= spec.compute_ms <= MAX_COMPUTE_MS):
            codes.add(INVALID)
        if spec.num_values != self.numel:
            codes.add(INVALID)
        if spec.stream != "ok" or not spec.payload_is_finite():
            codes.add(INVALID)
        if not v.done:  # once the job has ended, any push just hears "done"
            if self.MODE == "bsp" and (spec.round != v.round or spec.worker_id in v.pushed):
                codes.add(PRECONDITION)
            too_old = self.max_staleness is not None and v.version - spec.version > self.max_staleness
            if self.MODE == "asp" and (not 0 <= spec.version <= v.version or too_old):
                codes.add(PRECONDITION)
            step = spec.round if self.MODE == "bsp" else spec.version
            if spec.batch_size not in v.batches_told(spec.worker_id, step):  # not the server's plan for it
                codes.add(PRECONDITION)
        return codes or {OK}

    def push_call(self, spec: PushSpec) -> Answer:
        chunks = spec.chunks()
        return ask(lambda: read_params(self.stub.Push(iter(chunks), timeout=TIMEOUT)))

    def hostile_push_now(self, data: st.DataObject, v: View, extra_ids: Iterable[str] = ()) -> None:
        """One generated push that cannot block: in BSP a push that would be valid gets a NaN compute time."""
        spec = self.draw_push(data, v, extra_ids)
        expected = self.push_codes(spec, v)
        if self.MODE == "bsp" and expected == {OK} and not v.done:
            spec = dataclasses.replace(spec, compute_ms=math.nan)
            expected = {INVALID}
        event(f"push stream: {spec.stream}")
        answer = self.refused_leaves_no_trace(lambda: self.push_call(spec), expected, f"Push({spec})")
        if answer.code != OK:
            return
        h, params = answer.value
        after = self.view()
        assert torch.equal(params, after.flat) and h.num_values == self.numel
        if v.done:
            assert h.done and after.version == v.version and torch.equal(after.flat, v.flat)
            return
        assert self.MODE == "asp"  # an ASP update is applied at once: θ + Δ, one version later
        delta = decode(split(encode(spec.values(), spec.payload_dtype)), self.numel, spec.payload_dtype)
        assert torch.equal(after.flat, v.flat + delta)
        assert h.version == after.version == v.version + 1
        assert after.samples == v.samples + spec.batch_size

    @rule(data=st.data())
    def hostile_push(self, data: st.DataObject) -> None:
        self.hostile_push_now(data, self.view())

    @rule(data=st.data())
    def another_hostile_push(self, data: st.DataObject) -> None:  # pushes are what most input goes into
        self.hostile_push_now(data, self.view())

    @rule()
    def status(self) -> None:
        self.check_status()

    # ------------------------------------------------------------------ BSP rounds
    def valid_push(self, data: st.DataObject, name: str, v: View, version: int | None = None) -> PushSpec:
        """A push as `name` of what the server told it for the open round (ASP: for `version`, default the current)."""
        version = v.version if version is None else version
        told = v.batches_told(self.ids[name], v.round if self.MODE == "bsp" else version)
        return PushSpec(
            worker_id=self.ids[name], round=v.round, version=version,
            batch_size=pick(data, sorted(told) or [v.plan.get(name, 1)], "batch"),
            compute_ms=data.draw(st.floats(0.0, 1e4), label="compute_ms"),
            wire_dtype=data.draw(st.sampled_from(WIRE_DTYPES), label="wire dtype"), num_values=self.numel,
            seed=data.draw(st.integers(0, 2**16), label="seed"),
        )

    def pushed_ids(self) -> set[str]:
        return self.server.call(lambda: set(self.server.coordinator.bsp.pushed))

    def run_round(self, data: st.DataObject) -> None:
        """A BSP round: some workers push (their calls wait), hostile calls hit the open round, then the
        others push or leave; the round closes on exactly the valid pushes and answers them all."""
        v = self.view()
        names = data.draw(st.permutations(sorted(self.ids)), label="push order")
        specs = {n: self.valid_push(data, n, v) for n in names}
        if v.done:  # every push hears at once that the job has ended
            answers = [f.result(2 * TIMEOUT) for f in [self.pool.submit(self.push_call, specs[n]) for n in names]]
            assert all(a.code == OK and a.value[0].done for a in answers), answers
            return
        first = data.draw(st.integers(1, len(names)), label="first pushers")
        waiting = {n: self.pool.submit(self.push_call, specs[n]) for n in names[:first]}
        late = len(self.waiting)
        if first < len(names):
            wait_until(lambda: self.pushed_ids() >= {self.ids[n] for n in waiting} or any(f.done() for f in waiting.values()),
                       "the first pushes to reach the round")
            assert not any(f.done() for f in waiting.values()), {n: f.result() for n, f in waiting.items() if f.done()}
            for op in data.draw(st.lists(st.sampled_from(["push", "push", "pull", "heartbeat", "join", "status"]), max_size=4), label="mid-round"):
                mid = self.view()
                assert mid.pushed == {self.ids[n] for n in waiting} and mid.round == v.round
                if op == "push":
                    self.hostile_push_now(data, mid, extra_ids=mid.pending)
                elif op == "pull":
                    worker_id = self.draw_worker_id(data, mid.pending)
                    self.pull_checked(worker_id, mid, self.draw_secret(data, worker_id))
                elif op == "heartbeat":
                    worker_id = self.draw_worker_id(data, mid.pending)
                    self.heartbeat_checked(worker_id, mid, self.draw_secret(data, worker_id))
                elif op == "status":
                    self.check_status()
                else:
                    name, cores = self.draw_join(data)
                    expected = self.join_codes(name, cores, mid)
                    if expected == {OK}:  # a late joiner waits for the round boundary
                        self.join_later(name, cores)
                    else:
                        self.refused_leaves_no_trace(lambda name=name, cores=cores: self.join_call(name, cores), expected,
                                                     f"Join({name!r}, {cores}) mid-round")
            rest = names[first:]
            leaving = data.draw(st.lists(st.booleans(), min_size=len(rest), max_size=len(rest)), label="leavers")
            for i, (name, leaves) in enumerate(zip(rest, leaving)):
                if leaves:
                    answer = ask(lambda name=name: self.stub.Leave(
                        ps_pb2.LeaveRequest(worker_id=self.ids[name], secret=SECRETS[self.ids[name]]), timeout=TIMEOUT))
                    assert answer.code == OK, answer
                    self.gone[self.ids.pop(name)] = "left"
                else:
                    waiting[name] = self.pool.submit(self.push_call, specs[name])
                    if i < len(rest) - 1:
                        wait_until(lambda name=name: self.ids[name] in self.pushed_ids() or waiting[name].done(), f"{name}'s push")
        answers = {n: f.result(2 * TIMEOUT) for n, f in waiting.items()}
        after = self.view()
        event(f"round: {len(names) - len(waiting)} left, {late} joins waiting before it and {len(self.waiting) - late} "
              f"during it, {'ended the job' if after.done else 'job goes on'}")
        assert after.round == v.round + 1 and after.version == v.version + 1, (v.round, after.round)
        assert after.samples == v.samples + sum(specs[n].batch_size for n in waiting)
        for n, answer in answers.items():
            assert answer.code == OK, (n, answer)
            h, params = answer.value
            assert (h.round, h.version, h.done) == (after.round, after.version, after.done)
            assert h.batch_size == after.plan.get(n, 0) and torch.equal(params, after.flat)
        self.settle_waiting(after.round, after.done)

    # ------------------------------------------------------------------ ASP bursts
    def run_burst(self, data: st.DataObject) -> None:
        """Every worker pushes a valid update at the same time; each is applied once, or (with a
        staleness limit the others' updates overtook) refused as too old."""
        v = self.view()
        specs = []
        for name in sorted(self.ids):  # each from a version it was told (the latest, mostly)
            told = sorted(v.told[self.ids[name]])
            version = told[-1] if data.draw(st.booleans(), label="latest version") else pick(data, told, "version")
            specs.append(self.valid_push(data, name, v, version))
        answers = [f.result(2 * TIMEOUT) for f in [self.pool.submit(self.push_call, s) for s in specs]]
        allowed = {OK} if self.max_staleness is None or v.done else {OK, PRECONDITION}
        assert all(a.code in allowed for a in answers), answers
        applied = sum(a.code == OK for a in answers)
        event(f"burst: {applied} of {len(answers)} applied{' (job done)' if v.done else ''}")
        after = self.view()
        if v.done:
            assert after.version == v.version
        elif after.done:  # the job ended during the burst: the pushes after that were not applied
            assert v.version < after.version <= v.version + applied
        else:
            assert after.version == v.version + applied

    # ------------------------------------------------------------------ invariants
    def check_status(self) -> None:
        """The Status RPC says what the coordinator holds."""
        reply = self.stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT)
        s = self.server.call(self.server.coordinator.status)
        assert (reply.mode, reply.controller, reply.round, reply.version, reply.epoch, reply.epochs, reply.done) == (
            s["mode"], s["controller"], s["round"], s["version"], s["epoch"], s["epochs"], s["done"])
        assert (reply.global_batch, reply.adjustments, reply.expected_workers) == (s["global_batch"], s["adjustments"], s["expected_workers"])
        assert [(w.worker_id, w.name, w.cores, w.batch_size, w.compute_ms, w.updates, w.mean_staleness) for w in reply.workers] == [
            (w["worker_id"], w["name"], w["cores"], w["batch_size"], w["compute_ms"], w["updates"], w["mean_staleness"]) for w in s["workers"]]

    @invariant()
    def server_is_consistent(self) -> None:
        if self.server is None:
            return

        def take() -> dict[str, Any]:
            c = self.server.coordinator
            return {
                "finite": bool(torch.isfinite(c.store.flat).all()),
                "step": (c.round, c.version),
                "done": c.done,
                "active": {k: m.name for k, m in c.membership.active.items()},
                "pending": {k: m.name for k, m in c.membership.pending.items()},
                "departed": dict(c.membership.departed),
                "plan": c.policy.plan(),
                "pushed": set(c.bsp.pushed),
                "acc_count": None if c.bsp.accumulator is None else c.bsp.accumulator.count,
                "status": c.status(),
            }

        s = self.server.call(take)
        assert s["finite"], "the parameters are not finite"
        assert s["step"][0] >= self.last_step[0] and s["step"][1] >= self.last_step[1], (self.last_step, s["step"])
        self.last_step = s["step"]
        if self.MODE == "bsp":
            assert s["step"][0] == s["step"][1]  # one version per round
            assert s["pushed"] == set() and s["acc_count"] == 0  # no round is open between rules
        else:
            assert s["step"][0] == 0
        active, pending, departed = s["active"], s["pending"], s["departed"]
        assert not (set(active) & set(pending)) and not (set(active) & set(departed)) and not (set(pending) & set(departed))
        names = [*active.values(), *pending.values()]
        assert len(names) == len(set(names)) <= self.max_workers
        assert active == {i: n for n, i in self.ids.items()}, "membership differs from the calls' outcomes"
        assert all(departed.get(i, "").startswith(r) for i, r in self.gone.items())
        if not s["done"]:
            assert sorted(pending.values()) == sorted(self.waiting)  # BSP: Joins waiting for the open round to close
            plan = s["plan"]
            assert set(plan) == set(active.values())
            assert all(1 <= b <= self.global_batch for b in plan.values()), plan
            if plan:  # ASP too: the workers' bounds (--min-batch 1, no --max-batch) can always meet B
                assert sum(plan.values()) == self.global_batch, plan
        status = s["status"]
        assert (status["round"], status["version"], status["done"]) == (*s["step"], s["done"])
        assert [w["worker_id"] for w in status["workers"]] == list(active)
        assert all(w["batch_size"] == s["plan"].get(w["name"], 0) for w in status["workers"])
        assert status["global_batch"] == sum(s["plan"].values())


class BSPMachine(HostileMachine):
    MODE = "bsp"

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def round(self, data: st.DataObject) -> None:
        self.run_round(data)

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def another_round(self, data: st.DataObject) -> None:
        self.run_round(data)


class ASPMachine(HostileMachine):
    MODE = "asp"

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def burst(self, data: st.DataObject) -> None:
        self.run_burst(data)


# HOSTILE_EXAMPLES=400 for a longer hunt than the default run's ~25 s
MACHINE_SETTINGS = settings(
    max_examples=int(os.environ.get("HOSTILE_EXAMPLES", "40")),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
TestHostileBSP = BSPMachine.TestCase
TestHostileBSP.settings = MACHINE_SETTINGS
TestHostileASP = ASPMachine.TestCase
TestHostileASP.settings = MACHINE_SETTINGS


# --------------------------------------------------------------------------- Join flood
def test_join_flood_admits_exactly_the_expected_workers() -> None:
    """300 concurrent Joins (60 names, each 5 times) against a job for 4 workers with --max-workers 4:
    exactly 4 get in, every other one is refused quickly (job full or name taken), Status keeps
    answering throughout, and the 4 then run a round."""
    server = start_server("--workers", "4", "--max-workers", "4", "--global-batch", "32")
    try:
        stubs = [ps_pb2_grpc.ParameterServerStub(server.channel()) for _ in range(4)]
        names = [f"flood-{i % 60}" for i in range(300)]
        names = names[::2] + names[1::2]  # duplicates spread through the flood

        stop = threading.Event()
        status_calls: list[tuple[float, float]] = []  # (answered at, latency)
        status_errors: list[str] = []

        def poll_status() -> None:
            stub = ps_pb2_grpc.ParameterServerStub(server.channel())
            while not stop.is_set():
                t = time.monotonic()
                answer = ask(lambda: stub.Status(ps_pb2.StatusRequest(), timeout=5.0))
                if answer.code != OK:
                    status_errors.append(f"{answer.code.name}: {answer.details}")
                status_calls.append((time.monotonic(), time.monotonic() - t))
                time.sleep(0.005)

        poller = threading.Thread(target=poll_status, name="status-poller")
        poller.start()
        try:
            start = time.monotonic()
            done_at: dict[int, float] = {}
            calls = [stubs[i % 4].Join.future(ps_pb2.JoinRequest(name=n, cores=1.0), timeout=30.0) for i, n in enumerate(names)]
            for i, call in enumerate(calls):
                call.add_done_callback(lambda _, i=i: done_at.setdefault(i, time.monotonic()))
            answers = [ask(call.result) for call in calls]
            flood_s = max(done_at.values()) - start
        finally:
            stop.set()
            poller.join(10)

        admitted = {names[i]: a.value.worker_id for i, a in enumerate(answers) if a.code == OK}
        SECRETS.update((a.value.worker_id, a.value.secret) for a in answers if a.code == OK)
        refused = [(i, a) for i, a in enumerate(answers) if a.code != OK]
        assert len(admitted) == 4 and len(refused) == 296
        codes = {a.code for _, a in refused}
        assert codes <= {PRECONDITION, Code.ALREADY_EXISTS}, codes
        assert all("job full" in a.details for _, a in refused if a.code == PRECONDITION)
        assert all("already in the job" in a.details for _, a in refused if a.code == Code.ALREADY_EXISTS)
        assert max(done_at[i] - start for i, _ in refused) < 10.0, "refusals were not quick"
        assert flood_s < 15.0
        during = [latency for at, latency in status_calls if start < at < start + flood_s]
        assert during, "no Status call was answered while the Joins were in flight"
        assert not status_errors and max(latency for _, latency in status_calls) < 5.0, status_errors

        state = snapshot(server)
        assert {m["name"]: k for k, m in state["active"].items()} == admitted
        assert state["pending"] == {} and state["departed"] == {} and state["joined"] == 4  # refusals used no index
        assert sorted(state["status"]["workers"][i]["batch_size"] for i in range(4)) == [8, 8, 8, 8]

        grad = torch.full((server.coordinator.layout.numel,), 0.01)
        specs = [PushSpec(wid, 0, 0, 8, 5.0, "float32", len(grad)) for wid in admitted.values()]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = [f.result(2 * TIMEOUT) for f in [pool.submit(lambda s=s: ask(lambda: read_params(stubs[0].Push(iter(s.chunks()), timeout=TIMEOUT)))) for s in specs]]
        assert all(a.code == OK and a.value[0].round == 1 for a in answers), answers
        assert server.call(lambda: server.coordinator.round) == 1
    finally:
        stop_server(server)


# ------------------------------------------------------------------- message size limits
def _chunk_of_size(header: ps_pb2.PushHeader | None, seq: int, size: int) -> ps_pb2.PushChunk:
    """A PushChunk whose serialized size is exactly `size` bytes (data length adjusted for the varint)."""
    chunk = ps_pb2.PushChunk(header=header, seq=seq, data=b"")
    data_len = size - chunk.ByteSize()
    while True:
        chunk.data = b"\x00" * data_len
        if chunk.ByteSize() == size:
            return chunk
        data_len -= chunk.ByteSize() - size


@pytest.fixture
def open_round():
    """A BSP job with workers a and b; a has pushed for round 0 (its call waits), b has not."""
    server = start_server("--global-batch", "32", "--lr", "0.1", "--momentum", "0")
    pool = concurrent.futures.ThreadPoolExecutor(4)
    try:
        stub = ps_pb2_grpc.ParameterServerStub(server.channel())
        joins = [pool.submit(lambda n=n: stub.Join(ps_pb2.JoinRequest(name=n, cores=1.0), timeout=TIMEOUT)) for n in "ab"]
        replies = [f.result(TIMEOUT) for f in joins]
        SECRETS.update((r.worker_id, r.secret) for r in replies)
        ids = dict(zip("ab", (r.worker_id for r in replies)))
        numel = server.coordinator.layout.numel
        pending = pool.submit(lambda: ask(lambda: read_params(stub.Push(iter(PushSpec(ids["a"], 0, 0, 16, 5.0, "float32", numel, seed=1).chunks()), timeout=3 * TIMEOUT))))
        wait_until(lambda: server.call(lambda: set(server.coordinator.bsp.pushed)) == {ids["a"]}, "a's push")
        yield server, stub, ids, numel, pending
    finally:
        stop_server(server)
        pool.shutdown(wait=True, cancel_futures=True)


def _finish_round(stub: Any, ids: dict[str, str], numel: int, pending: concurrent.futures.Future) -> None:
    """b's valid push closes round 0: both calls are answered with round 1."""
    b = ask(lambda: read_params(stub.Push(iter(PushSpec(ids["b"], 0, 0, 16, 5.0, "float32", numel, seed=2).chunks()), timeout=TIMEOUT)))
    a = pending.result(2 * TIMEOUT)
    assert a.code == b.code == OK and a.value[0].round == b.value[0].round == 1, (a, b)
    assert torch.equal(a.value[1], b.value[1])


def test_message_size_limits(open_round) -> None:
    """The limits on what a call may carry, and that going over them is refused without a trace:

    * one gRPC message is at most ``MAX_MESSAGE_BYTES`` = 8 MiB (its serialized size), each way
      (``ps/server.py: GRPC_OPTIONS``); gRPC itself refuses a bigger one with RESOURCE_EXHAUSTED
      before any handler runs, whichever RPC and wherever in a stream it comes. A client using the
      same options refuses to send it in the first place (RESOURCE_EXHAUSTED, "CLIENT: ...").
    * a push or a parameter reply is any number of messages, each payload chunk about
      ``CHUNK_BYTES`` = 1 MiB, that must add up to exactly the layout's values (INVALID_ARGUMENT).
    * Join: name 1-128 characters, cores in (0, 1e6]; Push: batch size in [1, B], compute_ms in
      [0, 24 h] (INVALID_ARGUMENT).
    """
    server, stub, ids, numel, pending = open_round
    assert MAX_MESSAGE_BYTES == 8 * MiB and CHUNK_BYTES == MiB and ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES) in GRPC_OPTIONS
    # a client that does not enforce the limit itself, so the server's limit is what is tested
    loose = ps_pb2_grpc.ParameterServerStub(server.channel(options=[("grpc.max_send_message_length", -1)]))
    header = ps_pb2.PushHeader(worker_id=ids["b"], round=0, batch_size=16, compute_ms=5.0, wire_dtype="float32", num_values=numel,
                               secret=SECRETS[ids["b"]])

    def push(chunks: list[ps_pb2.PushChunk], via: Any = loose) -> Answer:
        return ask(lambda: read_params(via.Push(iter(chunks), timeout=TIMEOUT)))

    def refused(call: Callable[[], Answer], code: grpc.StatusCode, fragment: str) -> None:
        before = snapshot(server)
        answer = call()
        assert answer.code == code and fragment in answer.details, answer
        assert_same(before, snapshot(server))

    too_big = "Received message larger than max"
    # exactly at the limit the message reaches the handler (and is refused there: far too many values) ...
    refused(lambda: push([_chunk_of_size(header, 0, MAX_MESSAGE_BYTES)]), INVALID, "chunk 0")
    # ... one byte over, gRPC refuses it: as the first message, or later in the stream
    refused(lambda: push([_chunk_of_size(header, 0, MAX_MESSAGE_BYTES + 1)]), Code.RESOURCE_EXHAUSTED, too_big)
    refused(lambda: push([ps_pb2.PushChunk(header=header, seq=0, data=bytes(8)), _chunk_of_size(None, 1, 9 * MiB)]), Code.RESOURCE_EXHAUSTED, too_big)
    refused(lambda: ask(lambda: loose.Join(ps_pb2.JoinRequest(name="x" * (9 * MiB), cores=1.0), timeout=TIMEOUT)), Code.RESOURCE_EXHAUSTED, too_big)
    refused(lambda: ask(lambda: list(loose.Pull(ps_pb2.PullRequest(worker_id="x" * (9 * MiB)), timeout=TIMEOUT))), Code.RESOURCE_EXHAUSTED, too_big)
    # a client with the project's options does not send it at all
    refused(lambda: push([_chunk_of_size(header, 0, 9 * MiB)], via=stub), Code.RESOURCE_EXHAUSTED, "CLIENT: Sent message larger than max")
    # the server is unharmed: the round closes on exactly a's and b's valid pushes
    assert not pending.done()
    _finish_round(stub, ids, numel, pending)


# -------------------------------------------------------------------- undecodable bytes
def _raw(server: InProcessServer, method: str, streaming: bool) -> Callable[..., Any]:
    """A call that sends bytes as they are (no protobuf encoding on the client side)."""
    channel = server.channel()
    path = f"/hetero_ps.ParameterServer/{method}"
    if streaming:
        return channel.stream_stream(path, request_serializer=bytes, response_deserializer=bytes)
    return channel.unary_unary(path, request_serializer=bytes, response_deserializer=bytes)


def test_undecodable_push_chunks_are_invalid_argument(open_round) -> None:
    """Bytes that are not a PushChunk, first in the stream or after a valid header, are INVALID_ARGUMENT."""
    server, stub, ids, numel, pending = open_round
    raw_push = _raw(server, "Push", streaming=True)
    header = ps_pb2.PushHeader(worker_id=ids["b"], round=0, batch_size=16, compute_ms=5.0, wire_dtype="float32", num_values=numel,
                               secret=SECRETS[ids["b"]])
    good = ps_pb2.PushChunk(header=header, seq=0, data=bytes(16)).SerializeToString()
    for messages in ([b"\xff\xff\xff"], [good, b"\x0a\x05\xff"], [good, b"\x1a\xff\xff\xff\xff\x0f"]):
        before = snapshot(server)
        answer = ask(lambda messages=messages: list(raw_push(iter(messages), timeout=TIMEOUT)))
        assert answer.code == INVALID and "not a valid" in answer.details, answer
        assert_same(before, snapshot(server))
    _finish_round(stub, ids, numel, pending)


UNARY_GARBAGE = [("Join", b"\x0a\x02\xff\xfe"), ("Pull", b"\xff\xff\xff"), ("Leave", b"\x0a\x01\x80"), ("Heartbeat", b"\x08")]


@pytest.mark.parametrize(("method", "garbage"), UNARY_GARBAGE, ids=[m for m, _ in UNARY_GARBAGE])
def test_undecodable_unary_request_is_invalid_argument(open_round, method: str, garbage: bytes) -> None:
    """An undecodable unary request is INVALID_ARGUMENT (not grpc's UNKNOWN) and changes nothing."""
    server, stub, ids, numel, pending = open_round
    before = snapshot(server)
    answer = ask(lambda: _raw(server, method, streaming=False)(garbage, timeout=TIMEOUT))
    assert answer.code == INVALID, answer
    assert "not a valid" in answer.details, answer
    assert_same(before, snapshot(server))
    _finish_round(stub, ids, numel, pending)


# ---------------------------------------------------------------------------- overflow
def _join_all(server: InProcessServer, names: Iterable[str]) -> dict[str, str]:
    stub = ps_pb2_grpc.ParameterServerStub(server.channel())
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        joins = {n: pool.submit(lambda n=n: stub.Join(ps_pb2.JoinRequest(name=n, cores=1.0), timeout=TIMEOUT)) for n in names}
        replies = {n: f.result(2 * TIMEOUT) for n, f in joins.items()}
    SECRETS.update((r.worker_id, r.secret) for r in replies.values())
    return {n: r.worker_id for n, r in replies.items()}


def _push(server: InProcessServer, spec: PushSpec) -> Answer:
    stub = ps_pb2_grpc.ParameterServerStub(server.channel())
    return ask(lambda: read_params(stub.Push(iter(spec.chunks()), timeout=TIMEOUT)))


def _events(path: Any, name: str) -> list[dict[str, Any]]:
    from ps.ops.metrics import read_metrics

    return [e for e in read_metrics(path) if e["event"] == name]


def test_a_gradient_near_the_fp32_limit_is_refused_and_changes_nothing(tmp_path: Any) -> None:
    """The issue's BSP case: one of four workers pushes finite values of 3e38 with b = 32 of B = 128.
    Summed in fp32 as b·g that made every parameter +Inf; now the push is refused (INVALID_ARGUMENT,
    the state bit for bit as it was, an `overflow_refused` event), and the round closes normally."""
    log = tmp_path / "metrics.jsonl"
    server = start_server("--workers", "4", "--global-batch", "128", "--controller", "uniform", "--lr", "0.1",
                          "--momentum", "0.9", "--metrics-log", str(log))
    try:
        ids = _join_all(server, ["a", "b", "c", "d"])
        numel = server.coordinator.layout.numel
        before = snapshot(server)
        answer = _push(server, PushSpec(ids["a"], 0, 0, 32, 5.0, "float32", numel, fill=3e38))
        assert answer.code == INVALID and "overflow" in answer.details, answer
        assert_same(before, snapshot(server))
        assert [e["worker"] for e in _events(log, "overflow_refused")] == ["a"]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda n: _push(server, PushSpec(ids[n], 0, 0, 32, 5.0, "float32", numel, seed=ord(n))), ids))
        assert all(a.code == OK and a.value[0].round == 1 for a in answers), answers
        assert bool(torch.isfinite(answers[0].value[1]).all())
    finally:
        stop_server(server)


def test_rounds_of_large_finite_gradients_never_make_the_model_non_finite() -> None:
    """Momentum adds up: rounds of gradients of 2e37 (each far from the fp32 limit) with lr 1 and
    momentum 0.9 reached +Inf within ten rounds. Now every round either steps to finite values or its
    pushes are refused, leaving the parameters and the momentum as they were (then both workers push
    zeros, until even that could overflow: the momentum alone would carry the parameters past it)."""
    server = start_server("--workers", "2", "--global-batch", "32", "--controller", "uniform", "--lr", "1",
                          "--momentum", "0.9", "--epochs", "1000")
    pool = concurrent.futures.ThreadPoolExecutor(2)
    try:
        ids = _join_all(server, ["a", "b"])
        numel = server.coordinator.layout.numel

        def both(round_: int, fill: float) -> list[Answer]:
            specs = [PushSpec(ids[n], round_, round_, 16, 5.0, "float32", numel, fill=fill) for n in ("a", "b")]
            return list(pool.map(lambda spec: _push(server, spec), specs))

        refused = 0
        for round_ in range(12):
            before = snapshot(server)
            answers = both(round_, 2e37)
            if all(a.code == INVALID and "overflow" in a.details for a in answers):
                assert_same(before, snapshot(server))
                refused += 1
                answers = both(round_, 0.0)
                if all(a.code == INVALID for a in answers):
                    assert_same(before, snapshot(server))
                    break
            assert all(a.code == OK for a in answers), answers
            store = server.coordinator.store
            state = server.call(lambda: [store.flat.clone(), store.flat_optimizer_state()])
            assert all(bool(torch.isfinite(t).all()) for t in state), f"round {round_}"
        assert refused, "no push was refused: the test no longer reaches the limit"
    finally:
        stop_server(server)
        pool.shutdown(wait=True, cancel_futures=True)


def test_asp_updates_that_could_overflow_are_refused_and_change_nothing() -> None:
    """The issue's ASP case: two updates of 2e38 made the parameters +Inf; each is refused now."""
    server = start_server("--mode", "asp", "--workers", "2", "--global-batch", "32")
    try:
        ids = _join_all(server, ["a", "b"])
        numel = server.coordinator.layout.numel
        for name in ("a", "b"):
            before = snapshot(server)
            answer = _push(server, PushSpec(ids[name], 0, 0, 16, 5.0, "float32", numel, fill=2e38))
            assert answer.code == INVALID and "overflow" in answer.details, answer
            assert_same(before, snapshot(server))
        assert bool(torch.isfinite(snapshot(server)["flat"]).all())
    finally:
        stop_server(server)
