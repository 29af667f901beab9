"""The committed generated code matches protos/ps.proto, and so do the Python mappings of its enums
and messages (common/transport/proto_convert.py): every field of a message's dataclass goes through
its protobuf message and back, and every field of that message is written."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import pytest

from protos import ps_pb2
from protos.generate import stale_files
from common.transport.messages import SliceRange
from common.transport import proto_convert
from common.transport.layout import Layout, TensorEntry
from common.transport.messages import (
    Beat,
    Caller,
    GroupInfo,
    JobStatus,
    JoinAsk,
    JoinInfo,
    LeaveAsk,
    PullAsk,
    PushMeta,
    PushTimes,
    ShardAck,
    ShardCommit,
    ShardTarget,
    StepHeader,
    StoreAnswer,
    StoreCall,
)


def test_generated_code_is_fresh() -> None:
    assert stale_files() == [], "run: python -m protos.generate"


def test_push_kinds_match_the_proto_enum() -> None:
    """The core's push kinds, the wire's PushKind numbers and their inverse are one mapping."""
    from common.transport.messages import PUSH_KINDS
    from common.transport.proto_convert import PUSH_KIND_NAMES, PUSH_KIND_NUMBERS

    assert set(PUSH_KIND_NUMBERS) == set(PUSH_KINDS)
    assert sorted(PUSH_KIND_NUMBERS.values()) == sorted(ps_pb2.PushKind.values())
    assert all(PUSH_KIND_NAMES[number] == name for name, number in PUSH_KIND_NUMBERS.items())


# Values no field has by default, for the field types the messages use: a field of a type not here
# fails the test until it gets one (and its conversion is checked like the others').
SAMPLES: dict[Any, Any] = {
    Layout: Layout((TensorEntry("fc.weight", (3, 2)), TensorEntry("fc.bias", (3,), "bfloat16"))),
    tuple[ShardTarget, ...]: (ShardTarget("10.0.0.2:50052", 6, 9), ShardTarget("[::1]:50053", 9, 12)),
    tuple[SliceRange, ...]: (SliceRange(3, 90, 10), SliceRange(4, 0, 22)),
    tuple[str, ...]: ("hetero/0", "arrived/1"),
    tuple[tuple[str, int], ...]: (("w-1", 12), ("w-2", 20)),
    str | None: "GPU-8f1c",
    float | None: 0.75,
    bytes: b"\x00\xffbytes",
}
KINDS = {"kind": "report", "op": "compare_set"}  # fields whose values are names from a fixed list


def sample(cls: type, offset: int = 0) -> Any:
    """An instance of the dataclass `cls` with every field set apart from its default and the others."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for k, field in enumerate(dataclasses.fields(cls), start=offset + 1):
        kind = hints[field.name]
        if field.name in KINDS:
            values[field.name] = KINDS[field.name]
        elif kind in SAMPLES:
            values[field.name] = SAMPLES[kind]
        elif dataclasses.is_dataclass(kind):
            values[field.name] = sample(kind, offset=10 * k)
        elif typing.get_origin(kind) is tuple and dataclasses.is_dataclass(typing.get_args(kind)[0]):
            values[field.name] = (sample(typing.get_args(kind)[0], offset=10 * k), sample(typing.get_args(kind)[0], offset=20 * k))
        elif kind is bool:
            values[field.name] = True
        elif kind in (int, float):
            values[field.name] = kind(k) + (0.25 if kind is float else 0)
        elif kind is str:
            values[field.name] = f"{field.name}-{k}"
        else:
            pytest.fail(f"{cls.__name__}.{field.name}: no sample value for {kind}; add one to SAMPLES")
    instance = cls(**values)
    for field in dataclasses.fields(cls):
        default = field.default if field.default is not dataclasses.MISSING else None
        assert getattr(instance, field.name) != default, f"{cls.__name__}.{field.name} sampled as its default"
    return instance


def all_written(message: Any) -> list[str]:
    """The fields of `message` left at their default (a field a conversion forgot to write)."""
    written = {f.name for f, _ in message.ListFields()}
    return [f.name for f in message.DESCRIPTOR.fields if f.name not in written]


def test_a_step_header_goes_through_its_params_header_field_for_field() -> None:
    header = sample(StepHeader)
    message = proto_convert.step_header_to_proto(header)
    assert all_written(message) == []
    assert proto_convert.step_header_from_proto(ps_pb2.ParamsHeader.FromString(message.SerializeToString())) == header


def test_a_join_goes_through_its_join_reply_field_for_field() -> None:
    """All but the group's hub rank, which the JoinReply does not carry (each step's header does)."""
    join = sample(JoinInfo)
    message = proto_convert.join_to_proto(join)
    assert all_written(message) == []
    assert message.num_params == join.layout.numel
    back = proto_convert.join_from_proto(ps_pb2.JoinReply.FromString(message.SerializeToString()))
    assert back == dataclasses.replace(join, group=dataclasses.replace(join.group, hub_rank=0))


def test_a_push_header_and_its_end_go_through_their_messages_field_for_field() -> None:
    meta = sample(PushMeta)
    message = proto_convert.push_meta_to_proto(meta)
    assert all_written(message) == []
    assert proto_convert.push_meta_from_proto(ps_pb2.PushHeader.FromString(message.SerializeToString())) == meta
    times = sample(PushTimes)
    end = proto_convert.push_times_to_proto(times)
    assert all_written(end) == []
    assert proto_convert.push_times_from_proto(end) == times


def test_store_ops_match_the_proto_enum() -> None:
    """The core's store ops are the wire's StoreOp values but the unspecified 0, each named STORE_<OP>."""
    from common.transport.messages import STORE_OPS

    assert set(proto_convert.STORE_OP_NUMBERS) == set(STORE_OPS)
    assert sorted(proto_convert.STORE_OP_NUMBERS.values()) == sorted(v for v in ps_pb2.StoreOp.values() if v != 0)
    assert all(ps_pb2.StoreOp.Name(n) == f"STORE_{op.upper()}" for op, n in proto_convert.STORE_OP_NUMBERS.items())
    assert proto_convert.store_call_from_proto(ps_pb2.StoreRequest(op=0)).op == "unknown (0)"


def test_a_store_call_and_its_answer_go_through_their_messages_field_for_field() -> None:
    call = sample(StoreCall)
    message = proto_convert.store_call_to_proto(call, "w-1", "s3cret")
    assert all_written(message) == [] and (message.worker_id, message.secret) == ("w-1", "s3cret")
    assert proto_convert.store_call_from_proto(ps_pb2.StoreRequest.FromString(message.SerializeToString())) == call
    for answer in (StoreAnswer(True, b"\x00value", 7), StoreAnswer(False)):
        reply = proto_convert.store_answer_to_proto(answer)
        assert all_written(reply) == ([] if answer.ready else ["ready", "value", "number"])
        assert proto_convert.store_answer_from_proto(ps_pb2.StoreReply.FromString(reply.SerializeToString())) == answer


def test_a_join_reply_without_a_heartbeat_interval_reads_as_the_default() -> None:
    """A server that says no interval (0) gets heartbeats every DEFAULT_HEARTBEAT_S."""
    join = proto_convert.join_from_proto(ps_pb2.JoinReply(worker_id="w"))
    assert join.heartbeat_interval_s == proto_convert.DEFAULT_HEARTBEAT_S and join.group == GroupInfo()


def round_trip(value: Any, to_proto: Any, from_proto: Any, message_type: Any) -> Any:
    """`value` through its message and its bytes and back; every field of the message written."""
    message = to_proto(value)
    assert all_written(message) == []
    return from_proto(message_type.FromString(message.SerializeToString()))


def test_the_requests_go_through_their_messages_field_for_field() -> None:
    ask = sample(JoinAsk)
    assert round_trip(ask, proto_convert.join_ask_to_proto, proto_convert.join_ask_from_proto, ps_pb2.JoinRequest) == ask
    pull = sample(PullAsk)
    assert round_trip(pull, proto_convert.pull_ask_to_proto, proto_convert.pull_ask_from_proto, ps_pb2.PullRequest) == pull
    leaving = sample(LeaveAsk)
    assert round_trip(leaving, proto_convert.leave_to_proto, proto_convert.leave_from_proto, ps_pb2.LeaveRequest) == leaving
    caller = sample(Caller)
    assert round_trip(caller, proto_convert.heartbeat_to_proto, proto_convert.caller_from_proto,
                      ps_pb2.HeartbeatRequest) == caller
    commit = sample(ShardCommit)
    assert round_trip(commit, proto_convert.shard_commit_to_proto, proto_convert.shard_commit_from_proto,
                      ps_pb2.CommitRequest) == commit
    for empty, message_type in ((proto_convert.status_request, ps_pb2.StatusRequest),
                                (proto_convert.fetch_request, ps_pb2.FetchRequest),
                                (proto_convert.leave_reply, ps_pb2.LeaveReply)):
        assert isinstance(empty(), message_type) and empty().SerializeToString() == b""


def test_a_join_on_cpu_says_no_cuda_and_one_on_an_unknown_gpu_says_cuda() -> None:
    """cuda_device None (CPU) is the JoinRequest's cuda false; "" (a GPU of unknown UUID) is cuda true."""
    for device, cuda in ((None, False), ("", True), ("GPU-1", True)):
        message = proto_convert.join_ask_to_proto(JoinAsk("w", 1.0, device))
        assert (message.cuda, message.cuda_device) == (cuda, device or "")
        assert proto_convert.join_ask_from_proto(message).cuda_device == device


def test_the_replies_go_through_their_messages_field_for_field() -> None:
    beat = sample(Beat)
    assert round_trip(beat, proto_convert.beat_to_proto, proto_convert.beat_from_proto, ps_pb2.HeartbeatReply) == beat
    status = sample(JobStatus)
    assert len(status.workers) == 2 and status.workers[0] != status.workers[1]
    assert round_trip(status, proto_convert.job_status_to_proto, proto_convert.job_status_from_proto,
                      ps_pb2.StatusReply) == status
    message = proto_convert.job_status_to_proto(status)
    assert all(all_written(w) == [] for w in message.workers)
    ack = sample(ShardAck)
    assert round_trip(ack, proto_convert.shard_ack_to_proto, proto_convert.shard_ack_from_proto, ps_pb2.ShardAck) == ack


def test_a_status_value_not_known_yet_is_minus_one_on_the_wire() -> None:
    status = dataclasses.replace(sample(JobStatus), last_accuracy=None, noise_scale=None, efficiency=None, workers=())
    message = proto_convert.job_status_to_proto(status)
    assert (message.last_accuracy, message.noise_scale, message.efficiency) == (-1.0, -1.0, -1.0)
    assert proto_convert.job_status_from_proto(message) == status


def test_a_commits_contributors_are_distinct_with_batches_above_zero() -> None:
    from common.errors import InvalidArgument

    assert ShardCommit(3, (("a", 2), ("b", 5)), 0.1, 1.0).batches() == {"a": 2, "b": 5}
    for bad in ((("a", 2), ("a", 3)), (("", 2),), (("a", 0),)):
        with pytest.raises(InvalidArgument, match="distinct worker ids and batch sizes > 0"):
            ShardCommit(3, bad, 0.1, 1.0).batches()
