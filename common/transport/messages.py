"""The messages the server and the worker exchange, as plain frozen dataclasses: one type per message,
used by the server's cores (Coordinator, ShardCore), its servicers and the worker. No gRPC: each is
converted to and from its protobuf message in common/transport/proto_convert.py (the chunk messages
framed in common/transport/chunk_frames.py), and nowhere else. A message that carries nothing
(StatusRequest, LeaveReply, FetchRequest) has no type here, only its converter.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

from common.errors import InvalidArgument
from common.transport.layout import Layout

MAX_COMPUTE_MS = 24 * 3600 * 1000.0
PUSH_KINDS = ("values", "report", "snapshot")  # see PushKind in protos/ps.proto
STORE_OPS = ("set", "get", "add", "check", "wait", "compare_set", "delete", "num_keys")  # StoreOp in protos/ps.proto


@dataclass(frozen=True)
class PushTimes:
    """What a push says of the worker's step, in ms: what the batch policy balances and fits and the
    metrics show. Each is finite and in [0, MAX_COMPUTE_MS], data_wait_ms at most compute_ms and
    own_exposed_ms at most exposed_ms (`check`).

    compute_ms: data fetch + forward + backward of the step, without the forward's wait for parameters
    still streaming in; under --balance busy the worker adds its own part of its previous push (busy
    time). exposed_ms (BSP on the PS path; 0: not measured): how long the worker's previous step left it
    waiting on communication, from the end of its compute to the start of this one, plus the forward's
    wait for parameters. own_exposed_ms: of that, the worker's own part (its push still going out, and
    from the reply's first chunk to the parameters in its model), not the wait for the round.
data_wait_ms: of compute_ms, how long the step waited for its batch from the loader (a slow disk is a
slow worker: the policies balance the whole step, data wait included)."""

    compute_ms: float = 0.0
    exposed_ms: float = 0.0
    own_exposed_ms: float = 0.0
    data_wait_ms: float = 0.0

    @classmethod
    def of_step(cls, compute_ms: float, exposed_ms: float, push_ms: float, balance: str, mode: str,
                allreduce: bool, data_wait_ms: float = 0.0) -> PushTimes:
        """What a worker reports for a step that computed `compute_ms` (`data_wait_ms` of it waiting for
        its batch), after a previous step that left it `exposed_ms` exposed, `push_ms` of it its own
        push (the job's `balance`, `mode`, `allreduce`). The data wait is reported as at most the
        compute (`check`): it is measured inside the compute's window, but the compute is that window
        less the forward's wait for parameters, taken from a total that may hold waits outside it
        (worker.transport.arrivals), and clamped at 0; the compute is the measure the policies balance.
        The own part is reported as at most the exposed time: the two are taken on their own clocks and
        may come from different steps (after a dropped step the own part is the last push's)."""
        reported = compute_ms + (push_ms if balance == "busy" else 0.0)
        data_wait_ms = min(data_wait_ms, compute_ms)
        if mode != "bsp" or allreduce:  # exposed communication is measured in BSP rounds on the PS path
            return cls(reported, data_wait_ms=data_wait_ms)
        return cls(reported, exposed_ms, min(push_ms, exposed_ms), data_wait_ms)

    def check(self) -> None:
        """InvalidArgument unless each time is finite and in [0, MAX_COMPUTE_MS], the data wait no more
        than the compute it is part of (else the metrics' share of data wait exceeds the step), and the
        own exposed part no more than the exposed time it is part of."""
        for field in fields(self):
            ms = getattr(self, field.name)
            if not (math.isfinite(ms) and 0 <= ms <= MAX_COMPUTE_MS):
                raise InvalidArgument(f"{field.name} must be finite and in [0, {MAX_COMPUTE_MS:.0f}], got {ms}")
        if self.data_wait_ms > self.compute_ms:
            raise InvalidArgument(f"data_wait_ms {self.data_wait_ms} exceeds compute_ms {self.compute_ms}: the wait "
                                  "for the batch is part of the step's compute, so at most compute_ms")
        if self.own_exposed_ms > self.exposed_ms:
            raise InvalidArgument(f"own_exposed_ms {self.own_exposed_ms} exceeds exposed_ms {self.exposed_ms}: the "
                                  "worker's own part of the exposed time is part of it, so at most exposed_ms")

    def balanced_ms(self, balance: str, cycle_ms: float | None = None) -> float | None:
        """The time the batch policy balances for this push: the worker's compute_ms (its compute or busy
        time, as `balance` had it report), or under --balance cycle the server's own measure `cycle_ms`
        (None: not measured for this push)."""
        return cycle_ms if balance == "cycle" else self.compute_ms

    def fitted_exposed_ms(self, balance: str) -> float:
        """The exposed communication the batch policy fits beside the balanced time: the worker's own
        part under --balance compute; 0 otherwise (busy time and the cycle already hold it)."""
        return self.own_exposed_ms if balance == "compute" else 0.0


@dataclass(frozen=True)
class PushMeta:
    """The header of a push (PushHeader; its times from the PushEnd that closes it, where it has one)."""

    worker_id: str
    round: int
    version: int
    batch_size: int
    times: PushTimes
    wire_dtype: str
    num_values: int = 0  # of the payload (a worker's client sets it from the values it sends)
    kind: str = "values"  # "report" / "snapshot": the --allreduce fast path
    generation: int = 0  # a report's group generation (0: not said)
    secret: str = ""  # the worker's secret from Join (ps.serving.worker_keys)
    offsets: bool = False  # the chunks carry their offsets and arrive in any order (buckets sent during backward)
    local_sq_norm: float = 0.0  # a report's |g_k|² (float64; 0: not measured)
    global_sq_norm: float = 0.0  # a report's |g|² of the group's mean (float64; 0: not measured)
    sub_batch: int = 0  # a lone worker's first samples whose mean gradient's |g_s|² is sub_sq_norm (0: not measured)
    sub_sq_norm: float = 0.0

    def check_norms(self) -> None:
        """InvalidArgument unless every squared norm is finite and >= 0, on a push of any kind (a report's
        local and global norms are the noise scale's inputs, any other push's are held to the same rule),
        and a sub-batch, where one is said, is 1 to batch_size − 1 samples."""
        norms = (("local_sq_norm", self.local_sq_norm), ("global_sq_norm", self.global_sq_norm),
                 ("sub_sq_norm", self.sub_sq_norm))
        for name, norm in norms:
            if not (math.isfinite(norm) and norm >= 0):
                raise InvalidArgument(f"a push's {name} must be finite and >= 0 (0: not measured), got {norm}")
        if self.sub_batch == 0 and self.sub_sq_norm != 0:
            raise InvalidArgument(f"a push's sub_sq_norm ({self.sub_sq_norm}) needs the sub_batch it was measured on")
        if self.sub_batch != 0 and not 1 <= self.sub_batch < self.batch_size:
            raise InvalidArgument(f"a push's sub_batch must be 0 (not measured) or 1 to batch_size − 1 "
                                  f"({self.batch_size - 1}), got {self.sub_batch}")


@dataclass(frozen=True)
class GroupInfo:
    """--allreduce: a worker's place in the current process-group generation."""

    generation: int = 0
    rank: int = 0
    world_size: int = 0
    backend: str = ""
    hub_rank: int = 0  # the hub algorithm: the rank that sums this step (ps.rounds.rendezvous.hub_rank)


@dataclass(frozen=True)
class ShardTarget:
    """--shards: values [start, stop) of the flat buffer live at `address` (HOST:PORT)."""

    address: str
    start: int
    stop: int


@dataclass(frozen=True)
class JoinInfo:
    """What a Join answers (JoinReply): the worker's id, secret and place, its first batch, the job
    (`job_json`: common.job.spec.JobSpec's JSON) and the parameters' layout."""

    worker_id: str
    index: int  # join order, seeds this worker's data order
    batch_size: int
    round: int
    version: int
    epoch: int
    job_json: str
    layout: Layout
    heartbeat_interval_s: float  # how often the worker sends Heartbeat
    group: GroupInfo = GroupInfo()  # its hub_rank is not on the wire: every step's header says it
    shards: tuple[ShardTarget, ...] = ()  # --shards: the ranges other servers hold
    secret: str = ""  # what the worker's later calls must carry (ps.serving.worker_keys)
    global_batch: int = 0  # the B in force that batch_size is part of (0: not said; the spec's)


@dataclass(frozen=True)
class StoreCall:
    """--allreduce: one operation on a group generation's keys (StoreRequest, without the caller's id
    and secret); what each field means for each op is said at StoreOp in protos/ps.proto."""

    generation: int
    op: str  # one of STORE_OPS
    keys: tuple[str, ...] = ()
    value: bytes = b""
    expected: bytes = b""
    amount: int = 0
    wait_s: float = 0.0  # get and wait: how long the server may hold the call


@dataclass(frozen=True)
class StoreAnswer:
    """What a StoreCall gives back (StoreReply)."""

    ready: bool = True
    value: bytes = b""
    number: int = 0


@dataclass(frozen=True)
class SliceRange:
    """Samples π_epoch[offset : offset + count) of the epoch's permutation of the training
    indices (common.job.epoch_order): what the server hands a worker under --sampling exact, and all that travels."""

    epoch: int = 0
    offset: int = 0
    count: int = 0

    @property
    def stop(self) -> int:
        return self.offset + self.count


@dataclass(frozen=True)
class StepHeader:
    """What the server tells a worker for its next step (ParamsHeader), ahead of a reply's values."""

    round: int
    version: int
    epoch: int
    batch_size: int
    done: bool
    lr: float
    global_batch: int
    wire_dtype: str = "float32"  # of the values that follow
    num_values: int = 0
    reason: str = ""  # with done: "finished" or "stopping"
    group: GroupInfo = GroupInfo()  # --allreduce: the process group to train in (ps/rounds/rendezvous.py)
    snapshot_requested: bool = False  # --allreduce, the group's hub: push a snapshot of the parameters now
    optimizer_state: bool = False  # the values are the optimizer's flat state (common.params.flat_state), not parameters
    slice: tuple[SliceRange, ...] = ()  # --sampling exact: the samples of the next step (ps.rounds.sampling)
    next_slice: tuple[SliceRange, ...] = ()  # and of the step after, handed ahead while the plan holds
    path: str = ""  # --allreduce auto's trial: the path from this reply on ("allreduce", "ps"; "": not said)
    probe: bool = False  # BSP, on probation: the next step is a probe, its whole gradient pushed to this server (ps.rounds.probation)


@dataclass(frozen=True)
class StepReply:
    """A push's or pull's reply: the header, then the payload of framed chunks (common.transport.payload:
    built as a reply reaches them)."""

    header: StepHeader
    payload: Sequence[bytes]


@dataclass(frozen=True)
class JoinAsk:
    """What a worker says of itself when it asks to join (JoinRequest)."""

    name: str
    cores: float  # declared resources (cores or relative FLOPs), > 0
    cuda_device: str | None = None  # the UUID of the GPU it computes on ("": not known), None on CPU
    max_batch: int = 0  # the most samples its memory holds (0: no bound of its own)
    dataset_length: int = 0  # --sampling exact: the length of the training set it trains on (0: not declared)
    dataset_fingerprint: str = ""  # and the fingerprint the user gave it ("": none; MAX_FINGERPRINT printable characters at most)
    switch_paths: bool = False  # it can follow --allreduce auto's trial between the paths (ps.rounds.path_trial)


MAX_FINGERPRINT = 256
"""JoinRequest.dataset_fingerprint's cap in characters: the server refuses a longer one, or one not printable."""


MAX_LEAVE_REASON = 256
"""LeaveRequest.reason's cap in characters: the server refuses a longer reason, or one not printable."""


def bounded_reason(text: str) -> str:
    """`text` as a Leave's reason the server takes: each character that is not printable as '?', cut to
    MAX_LEAVE_REASON (ending in '...')."""
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= MAX_LEAVE_REASON else text[: MAX_LEAVE_REASON - 3] + "..."


@dataclass(frozen=True)
class Caller:
    """A worker calling as itself: its id and the secret its Join returned (HeartbeatRequest)."""

    worker_id: str
    secret: str = ""


@dataclass(frozen=True)
class LeaveAsk:
    """A worker leaving (LeaveRequest): its id, its secret, and why ("": not said; the server takes at
    most MAX_LEAVE_REASON printable characters, see bounded_reason)."""

    worker_id: str
    secret: str = ""
    reason: str = ""


@dataclass(frozen=True)
class PullAsk:
    """A Pull (PullRequest): the plan, and the parameters unless `header_only`."""

    worker_id: str
    secret: str = ""
    header_only: bool = False
    optimizer_state: bool = False  # --allreduce: the optimizer's flat state instead of the parameters
    wait_for_batch: bool = False  # a parked worker's long poll: answered once the plan gives it a batch

    def check(self) -> None:
        """InvalidArgument for a Pull that asks for the header alone and the optimizer's state with it."""
        if self.header_only and self.optimizer_state:
            raise InvalidArgument("a Pull asks for header_only or optimizer_state, not both: a header alone carries "
                                  "no optimizer state")


@dataclass(frozen=True)
class Beat:
    """What a Heartbeat answers (HeartbeatReply): where the job is, and whether it has ended."""

    done: bool
    epoch: int
    round: int
    version: int


@dataclass(frozen=True)
class WorkerStatus:
    """One worker as Status shows it: its plan, smoothed time, updates and staleness."""

    worker_id: str
    name: str
    cores: float
    batch_size: int
    compute_ms: float  # smoothed; 0 before the first push
    updates: int  # pushes accepted
    mean_staleness: float  # ASP
    parked: bool  # planned at batch 0


@dataclass(frozen=True)
class JobStatus:
    """What a Status call answers (StatusReply): where the job is and every worker in it. `path` is the
    one it runs on (ps, allreduce, or auto while --allreduce auto has not chosen), `path_why` the
    reason (--allreduce auto's; "" where the command line chose); None: not known yet."""

    mode: str
    controller: str
    round: int
    version: int
    epoch: int
    epochs: int
    done: bool
    global_batch: int
    adjustments: int
    last_accuracy: float | None
    expected_workers: int
    path: str
    path_why: str
    adaptive_batch: str  # "gns" or "off"
    noise_scale: float | None  # the gradient noise scale φ
    efficiency: float | None  # the statistical efficiency of the global batch in force
    lr: float  # the learning rate in force
    workers: tuple[WorkerStatus, ...]
    job_json: str  # the job spec (common.job.spec.JobSpec's JSON), as Join hands it


@dataclass(frozen=True)
class ShardCommit:
    """The coordinator closing a shard's open round (CommitRequest): the contributors whose slices enter
    the step, with their batch sizes, the step's learning rate, how long to wait for a slice, and the
    worker ids gone since the last commit, which the shard refuses from then on."""

    round: int
    contributors: tuple[tuple[str, int], ...]  # (worker id, batch size)
    lr: float
    wait_s: float
    revoked: tuple[str, ...] = ()

    def batches(self) -> dict[str, int]:
        """Each contributor's batch size; InvalidArgument unless the ids are distinct and the batches > 0."""
        batches: dict[str, int] = {}
        for worker_id, batch_size in self.contributors:
            if not worker_id or batch_size <= 0 or worker_id in batches:
                raise InvalidArgument(f"contributors need distinct worker ids and batch sizes > 0, got {worker_id!r}: {batch_size}")
            batches[worker_id] = batch_size
        return batches


@dataclass(frozen=True)
class ShardAck:
    """A shard's answer to a Load or a Commit (ShardAck)."""

    round: int  # the shard's open round after the call
    applied_batch: int = 0  # Commit: the samples whose slices entered the step
    missing: tuple[str, ...] = ()  # Commit: contributors whose slice did not arrive in time
