"""A hostile peer's tools for the in-process server: calls that record their status code instead of
raising, the pushes it builds (well-formed or broken on purpose), the strategies that draw them, and
the codes the server's documented checks expect (docs/protocol.md, "Errors")."""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import grpc
import torch
from hypothesis import strategies as st

from protos import ps_pb2
from ps.rounds.membership import MAX_CORES, MAX_NAME
from ps.rounds.rejoins import Rejoins
from ps.server_job import Job, build_job
from common.transport.messages import MAX_COMPUTE_MS
from common.transport.wire import FlatReceiver, encode, split
from tests.conftest import InProcessServer, job_args
from tests.state_compare import server_state

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


def first_pulls(stub: Any, replies: Iterable[ps_pb2.JoinReply]) -> None:
    """The Pull each joined worker of `replies` makes before its first push (the server refuses a push
    before it: ps.rounds.push_checks)."""
    for reply in replies:
        read_params(stub.Pull(ps_pb2.PullRequest(worker_id=reply.worker_id, secret=reply.secret), timeout=TIMEOUT))


def snapshot(server: InProcessServer) -> dict[str, Any]:
    """Everything a refused request must leave alone (tests/state_compare.py), copied on the
    server's loop; without the evaluator's accuracy, which lands from a background thread."""
    return server.call(lambda: server_state(server.coordinator, with_accuracy=False))


def start_server(*argv: str) -> InProcessServer:
    """Build a job like `ps-server` would (tiny mlp on digits) and serve it in-process. A name's backoff
    after a departure without a push lasts the whole test, so a join's code does not depend on how
    long the calls before it took (ps/rounds/rejoins.py; tests/ps/rounds/test_rejoins.py times it)."""
    job = build_job(job_args("--model-arg", "hidden=8", *argv))
    job.coordinator.membership.names = Rejoins(backoff_s=3600.0, max_backoff_s=3600.0)
    server = InProcessServer(job.coordinator)
    server.job = job
    return server.start()


def name_held_back(server: InProcessServer, worker_id: str) -> str | None:
    """The name of the active member `worker_id` when it has not pushed since its join (its departure
    then holds the name back), else None."""
    member = server.call(lambda: server.coordinator.members[worker_id])
    return None if member.updates else member.name


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
    return options[data.draw(st.integers(0, 63), label=label) % len(options)]


def pick_from(data: st.DataObject, pools: list[list[Any]], label: str) -> Any:
    """A member of one of the non-empty `pools` (a pool listed twice is drawn twice as often), drawn the
    same way whatever the pools hold: which of them are empty may depend on the server's replies too."""
    return pick(data, pick(data, [p for p in pools if p], f"{label}: kind"), label)


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
    pulled: set[str]  # the active worker ids that made a Pull since their Join (a push before it is refused)

    def batches_told(self, worker_id: str, step: int) -> set[int]:
        return self.told.get(worker_id, {}).get(step, set())


# ---------------------------------------------------------------------------- machine
