"""The messages of protos/ps.proto to and from the plain values both sides hold
(common.transport.messages), each conversion written once: the servicers encode what the cores return
and decode what the workers send, the worker's client and the coordinator's shard client the other way
round. With common.transport.chunk_frames (the chunk messages), the only code that builds protobuf
messages (tests/test_layout.py checks it)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from protos import ps_pb2
from common.transport.layout import Layout, TensorEntry
from common.transport.messages import (
    STORE_OPS,
    Beat,
    Caller,
    LeaveAsk,
    GroupInfo,
    JobStatus,
    JoinAsk,
    JoinInfo,
    PullAsk,
    PushMeta,
    PushTimes,
    ShardAck,
    ShardCommit,
    ShardTarget,
    SliceRange,
    StepHeader,
    StoreAnswer,
    StoreCall,
    WorkerStatus,
)

# the wire's PushKind numbers for the kind names (common.transport.messages.PUSH_KINDS), and back
PUSH_KIND_NUMBERS = {"values": ps_pb2.PUSH_VALUES, "report": ps_pb2.PUSH_REPORT, "snapshot": ps_pb2.PUSH_SNAPSHOT}
PUSH_KIND_NAMES = {number: name for name, number in PUSH_KIND_NUMBERS.items()}
# the wire's StoreOp numbers for the op names (common.transport.messages.STORE_OPS: STORE_SET is 1), and back
STORE_OP_NUMBERS = {name: cast(ps_pb2.StoreOp, number) for number, name in enumerate(STORE_OPS, start=1)}
STORE_OP_NAMES = {number: name for name, number in STORE_OP_NUMBERS.items()}
DEFAULT_HEARTBEAT_S = 1.0  # a JoinReply that says no heartbeat interval (0)
UNKNOWN = -1.0  # StatusReply's number for a value not known yet (JobStatus: None)


def step_header_to_proto(h: StepHeader) -> ps_pb2.ParamsHeader:
    return ps_pb2.ParamsHeader(
        round=h.round, version=h.version, epoch=h.epoch, batch_size=h.batch_size, done=h.done,
        wire_dtype=h.wire_dtype, num_values=h.num_values, lr=h.lr, global_batch=h.global_batch, reason=h.reason,
        generation=h.group.generation, rank=h.group.rank, world_size=h.group.world_size, backend=h.group.backend,
        hub_rank=h.group.hub_rank, snapshot_requested=h.snapshot_requested, optimizer_state=h.optimizer_state,
        slice=_ranges_to_proto(h.slice), next_slice=_ranges_to_proto(h.next_slice), path=h.path, probe=h.probe,
    )


def step_header_from_proto(p: ps_pb2.ParamsHeader) -> StepHeader:
    return StepHeader(
        round=p.round, version=p.version, epoch=p.epoch, batch_size=p.batch_size, done=p.done, lr=p.lr,
        global_batch=p.global_batch, wire_dtype=p.wire_dtype, num_values=p.num_values, reason=p.reason,
        group=GroupInfo(p.generation, p.rank, p.world_size, p.backend, p.hub_rank),
        snapshot_requested=p.snapshot_requested, optimizer_state=p.optimizer_state,
        slice=_ranges_from_proto(p.slice), next_slice=_ranges_from_proto(p.next_slice), path=p.path, probe=p.probe,
    )


def _ranges_to_proto(ranges: tuple[SliceRange, ...]) -> list[ps_pb2.SliceRange]:
    return [ps_pb2.SliceRange(epoch=r.epoch, offset=r.offset, count=r.count) for r in ranges]


def _ranges_from_proto(ranges: Iterable[ps_pb2.SliceRange]) -> tuple[SliceRange, ...]:
    return tuple(SliceRange(r.epoch, r.offset, r.count) for r in ranges)


def join_ask_to_proto(a: JoinAsk) -> ps_pb2.JoinRequest:
    return ps_pb2.JoinRequest(
        name=a.name, cores=a.cores, cuda=a.cuda_device is not None, cuda_device=a.cuda_device or "",
        max_batch=a.max_batch, dataset_length=a.dataset_length, dataset_fingerprint=a.dataset_fingerprint,
        switch_paths=a.switch_paths,
    )


def join_ask_from_proto(p: ps_pb2.JoinRequest) -> JoinAsk:
    return JoinAsk(p.name, p.cores, p.cuda_device if p.cuda else None, p.max_batch, p.dataset_length,
                   p.dataset_fingerprint, p.switch_paths)


def join_to_proto(j: JoinInfo) -> ps_pb2.JoinReply:
    """The JoinReply; the group's hub_rank is not on it (every step's header says it)."""
    return ps_pb2.JoinReply(
        worker_id=j.worker_id, secret=j.secret, job_json=j.job_json,
        layout=[ps_pb2.TensorSpec(name=e.name, shape=e.shape, dtype=e.dtype) for e in j.layout.entries],
        num_params=j.layout.numel, batch_size=j.batch_size, round=j.round, version=j.version, epoch=j.epoch,
        index=j.index, heartbeat_interval_s=j.heartbeat_interval_s, rank=j.group.rank, world_size=j.group.world_size,
        generation=j.group.generation, backend=j.group.backend,
        shards=[ps_pb2.ShardInfo(address=s.address, start=s.start, stop=s.stop) for s in j.shards],
        global_batch=j.global_batch,
    )


def join_from_proto(p: ps_pb2.JoinReply) -> JoinInfo:
    return JoinInfo(
        worker_id=p.worker_id, index=p.index, batch_size=p.batch_size, round=p.round, version=p.version,
        epoch=p.epoch, job_json=p.job_json,
        layout=Layout(tuple(TensorEntry(t.name, tuple(t.shape), t.dtype) for t in p.layout)),
        heartbeat_interval_s=p.heartbeat_interval_s or DEFAULT_HEARTBEAT_S,
        group=GroupInfo(p.generation, p.rank, p.world_size, p.backend),
        shards=tuple(ShardTarget(s.address, s.start, s.stop) for s in p.shards), secret=p.secret,
        global_batch=p.global_batch,
    )


def push_times_to_proto(t: PushTimes) -> ps_pb2.PushEnd:
    return ps_pb2.PushEnd(compute_ms=t.compute_ms, exposed_ms=t.exposed_ms, own_exposed_ms=t.own_exposed_ms,
                          data_wait_ms=t.data_wait_ms)


def push_times_from_proto(p: ps_pb2.PushEnd | ps_pb2.PushHeader) -> PushTimes:
    """A push's times, from its PushEnd or (without offsets) its PushHeader."""
    return PushTimes(p.compute_ms, p.exposed_ms, p.own_exposed_ms, p.data_wait_ms)


def push_meta_to_proto(m: PushMeta) -> ps_pb2.PushHeader:
    return ps_pb2.PushHeader(
        worker_id=m.worker_id, round=m.round, version=m.version, batch_size=m.batch_size,
        compute_ms=m.times.compute_ms, exposed_ms=m.times.exposed_ms, own_exposed_ms=m.times.own_exposed_ms,
        data_wait_ms=m.times.data_wait_ms, wire_dtype=m.wire_dtype, num_values=m.num_values, kind=PUSH_KIND_NUMBERS[m.kind], generation=m.generation,
        secret=m.secret, offsets=m.offsets, local_sq_norm=m.local_sq_norm, global_sq_norm=m.global_sq_norm,
        sub_batch=m.sub_batch, sub_sq_norm=m.sub_sq_norm,
    )


def push_meta_from_proto(p: ps_pb2.PushHeader) -> PushMeta:
    """The header as the core sees it; a kind number it does not know is named so (the core refuses it)."""
    return PushMeta(
        p.worker_id, p.round, p.version, p.batch_size, push_times_from_proto(p), p.wire_dtype, p.num_values,
        kind=PUSH_KIND_NAMES.get(p.kind, f"unknown ({p.kind})"), generation=p.generation, secret=p.secret,
        offsets=p.offsets, local_sq_norm=p.local_sq_norm, global_sq_norm=p.global_sq_norm,
        sub_batch=p.sub_batch, sub_sq_norm=p.sub_sq_norm,
    )


def store_call_to_proto(c: StoreCall, worker_id: str, secret: str) -> ps_pb2.StoreRequest:
    return ps_pb2.StoreRequest(
        worker_id=worker_id, secret=secret, generation=c.generation, op=STORE_OP_NUMBERS[c.op], keys=c.keys,
        value=c.value, expected=c.expected, amount=c.amount, wait_s=c.wait_s,
    )


def store_call_from_proto(p: ps_pb2.StoreRequest) -> StoreCall:
    """The call as the core sees it; an op number it does not know is named so (the core refuses it)."""
    return StoreCall(p.generation, STORE_OP_NAMES.get(p.op, f"unknown ({p.op})"), tuple(p.keys), p.value,
                     p.expected, p.amount, p.wait_s)


def store_answer_to_proto(a: StoreAnswer) -> ps_pb2.StoreReply:
    return ps_pb2.StoreReply(ready=a.ready, value=a.value, number=a.number)


def store_answer_from_proto(p: ps_pb2.StoreReply) -> StoreAnswer:
    return StoreAnswer(p.ready, p.value, p.number)


def pull_ask_to_proto(a: PullAsk) -> ps_pb2.PullRequest:
    return ps_pb2.PullRequest(worker_id=a.worker_id, secret=a.secret, header_only=a.header_only,
                              optimizer_state=a.optimizer_state, wait_for_batch=a.wait_for_batch)


def pull_ask_from_proto(p: ps_pb2.PullRequest) -> PullAsk:
    return PullAsk(p.worker_id, p.secret, p.header_only, p.optimizer_state, p.wait_for_batch)


def leave_to_proto(ask: LeaveAsk) -> ps_pb2.LeaveRequest:
    return ps_pb2.LeaveRequest(worker_id=ask.worker_id, secret=ask.secret, reason=ask.reason)


def leave_from_proto(p: ps_pb2.LeaveRequest) -> LeaveAsk:
    return LeaveAsk(p.worker_id, p.secret, p.reason)


def heartbeat_to_proto(c: Caller) -> ps_pb2.HeartbeatRequest:
    return ps_pb2.HeartbeatRequest(worker_id=c.worker_id, secret=c.secret)


def caller_from_proto(p: ps_pb2.HeartbeatRequest) -> Caller:
    return Caller(p.worker_id, p.secret)


def leave_reply() -> ps_pb2.LeaveReply:
    """The LeaveReply (it says nothing)."""
    return ps_pb2.LeaveReply()


def beat_to_proto(b: Beat) -> ps_pb2.HeartbeatReply:
    return ps_pb2.HeartbeatReply(done=b.done, epoch=b.epoch, round=b.round, version=b.version)


def beat_from_proto(p: ps_pb2.HeartbeatReply) -> Beat:
    return Beat(p.done, p.epoch, p.round, p.version)


def status_request() -> ps_pb2.StatusRequest:
    """The StatusRequest (it asks nothing more)."""
    return ps_pb2.StatusRequest()


def job_status_to_proto(s: JobStatus) -> ps_pb2.StatusReply:
    """The StatusReply; a value not known yet is UNKNOWN (-1)."""
    return ps_pb2.StatusReply(
        job_json=s.job_json, mode=s.mode, controller=s.controller, round=s.round, version=s.version, epoch=s.epoch,
        epochs=s.epochs, done=s.done, global_batch=s.global_batch, adjustments=s.adjustments,
        last_accuracy=_or_unknown(s.last_accuracy), expected_workers=s.expected_workers, path=s.path,
        path_why=s.path_why, adaptive_batch=s.adaptive_batch, noise_scale=_or_unknown(s.noise_scale),
        efficiency=_or_unknown(s.efficiency), lr=s.lr,
        workers=[ps_pb2.WorkerStatus(
            worker_id=w.worker_id, name=w.name, cores=w.cores, batch_size=w.batch_size, compute_ms=w.compute_ms,
            updates=w.updates, mean_staleness=w.mean_staleness, parked=w.parked,
        ) for w in s.workers],
    )


def job_status_from_proto(p: ps_pb2.StatusReply) -> JobStatus:
    return JobStatus(
        p.mode, p.controller, p.round, p.version, p.epoch, p.epochs, p.done, p.global_batch, p.adjustments,
        _known(p.last_accuracy), p.expected_workers, p.path, p.path_why, p.adaptive_batch, _known(p.noise_scale),
        _known(p.efficiency), p.lr,
        tuple(WorkerStatus(w.worker_id, w.name, w.cores, w.batch_size, w.compute_ms, w.updates, w.mean_staleness,
                           w.parked) for w in p.workers),
        p.job_json,
    )


def _or_unknown(value: float | None) -> float:
    return UNKNOWN if value is None else value


def _known(value: float) -> float | None:
    return None if value == UNKNOWN else value


def shard_commit_to_proto(c: ShardCommit) -> ps_pb2.CommitRequest:
    return ps_pb2.CommitRequest(
        round=c.round, lr=c.lr, wait_s=c.wait_s,
        contributors=[ps_pb2.Contribution(worker_id=w, batch_size=b) for w, b in c.contributors], revoked=c.revoked,
    )


def shard_commit_from_proto(p: ps_pb2.CommitRequest) -> ShardCommit:
    return ShardCommit(p.round, tuple((c.worker_id, c.batch_size) for c in p.contributors), p.lr, p.wait_s,
                       tuple(p.revoked))


def shard_ack_to_proto(a: ShardAck) -> ps_pb2.ShardAck:
    return ps_pb2.ShardAck(round=a.round, applied_batch=a.applied_batch, missing=a.missing)


def shard_ack_from_proto(p: ps_pb2.ShardAck) -> ShardAck:
    return ShardAck(p.round, p.applied_batch, tuple(p.missing))


def fetch_request() -> ps_pb2.FetchRequest:
    """The FetchRequest (it asks nothing more)."""
    return ps_pb2.FetchRequest()
