"""Messages serialized once (common/transport/serialized.py, chunk_frames.py): reply chunks framed once per
version exactly as protobuf would, chunk data parsed as a view, pushes sent as the messages serialized."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from protos import ps_pb2
from common.transport.wire import encode, split
from tests.rpc_calls import header, rand


def test_reply_chunks_are_serialized_once_per_version_and_exactly_as_protobuf_would() -> None:
    """The core's Payload, framed with params_chunk, holds for each ParamsChunk bytes that parse to
    the message (data 16-byte aligned by a zero pad field), built once per version; reply_messages only
    puts each reply's header message first."""
    from common.transport.messages import StepHeader, StepReply
    from common.transport.payload import Payload
    from common.transport.chunk_frames import params_chunk, reply_messages

    values = rand(3000, seed=5)
    raw = split(encode(values), 4096)
    assert len(raw) == 3 and len(raw[-1]) < 4096
    payload = Payload(params_chunk, chunk_bytes=4096)
    parts = payload.get(7, values, "float32")
    assert payload.get(7, values, "float32") is parts  # same version: the same chunks
    assert payload.get(8, values, "float32") is not parts

    def reply(batch_size: int, chunks: Sequence[bytes]) -> StepReply:
        return StepReply(StepHeader(round=2, version=3, epoch=1, batch_size=batch_size, done=False, lr=0.5,
                                    global_batch=8, wire_dtype="float32", num_values=3000, reason="r"), chunks)

    first, second = list(reply_messages(reply(3, parts))), list(reply_messages(reply(5, parts)))
    h = ps_pb2.ParamsHeader(round=2, version=3, epoch=1, batch_size=3, wire_dtype="float32", num_values=3000,
                            lr=0.5, global_batch=8, reason="r")
    expected = [ps_pb2.ParamsChunk(header=h, seq=0)]
    expected += [ps_pb2.ParamsChunk(seq=i, data=d) for i, d in enumerate(raw, start=1)]
    assert first[0] == expected[0].SerializeToString()
    assert [unpadded(m, ps_pb2.ParamsChunk) for m in first] == expected
    assert all((len(m) - len(d)) % 16 == 0 for m, d in zip(first[1:], raw, strict=True))  # data aligned
    assert ps_pb2.ParamsChunk.FromString(second[0]).header.batch_size == 5
    assert all(a is b for a, b in zip(first[1:], second[1:], strict=True))
    assert all(a is b for a, b in zip(first[1:], parts, strict=True))  # the payload's chunks, not copies
    assert list(reply_messages(reply(3, payload.empty()))) == [ps_pb2.ParamsChunk(header=h).SerializeToString()]


def test_chunk_data_is_parsed_as_a_view_and_the_rest_as_protobuf_would() -> None:
    """data_view_parser gives the same fields and data as FromString, data without a copy, and
    raises DecodeError for bytes FromString refuses or that end inside a field."""
    from google.protobuf.message import DecodeError

    from common.transport.serialized import data_view_parser

    parse = data_view_parser(ps_pb2.PushChunk)
    h = header("w", 3000, round=4)
    for message in [ps_pb2.PushChunk(header=h, seq=0, data=b"\x01\x02\x03\x04"), ps_pb2.PushChunk(seq=9, data=bytes(5000)),
                    ps_pb2.PushChunk(seq=3), ps_pb2.PushChunk()]:
        raw = message.SerializeToString()
        chunk = parse(raw)
        assert chunk.fields.HasField("header") == message.HasField("header")
        assert chunk.fields.header == message.header and chunk.fields.seq == message.seq
        assert bytes(chunk.data) == message.data and not chunk.fields.data
        if message.data:
            assert chunk.data.obj is raw  # a view of the received bytes
    # fields in any order, data repeated (the last wins), unknown fields skipped, as protobuf does
    odd = (ps_pb2.PushChunk(data=b"old").SerializeToString() + ps_pb2.PushChunk(seq=2).SerializeToString()
           + b"\x78\x05" + b"\x81\x01" + bytes(8) + ps_pb2.PushChunk(header=h, data=b"new").SerializeToString())
    chunk, reference = parse(odd), ps_pb2.PushChunk.FromString(odd)
    assert bytes(chunk.data) == reference.data == b"new"
    assert chunk.fields.seq == reference.seq == 2 and chunk.fields.header == reference.header
    good = ps_pb2.PushChunk(header=h, seq=1, data=bytes(100)).SerializeToString()
    for bad in [good[:-1], good[:3], b"\x1a\xff", b"\x10", b"\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
                b"\x00\x01", b"\x0b", b"\x0a\x02\xff\xff"]:
        with pytest.raises(DecodeError):
            parse(bad)


def test_pushes_are_sent_as_the_chunk_messages_serialized() -> None:
    """The client writes each push chunk straight from a view of the values (common/transport/serialized.py): without
    alignment exactly SerializeToString's bytes; aligned (the default), a zero pad field first, so that
    data starts at a multiple of 16 bytes into the message, and the same message once parsed."""
    from common.transport.serialized import with_data
    from common.transport.wire import views

    values = encode(rand(3000, seed=6))
    h = header("w", 3000)
    for seq, view in enumerate(views(values, 4096)):
        fields = ps_pb2.PushChunk(header=h if seq == 0 else None, seq=seq)
        expected = ps_pb2.PushChunk(header=h if seq == 0 else None, seq=seq, data=bytes(view))
        assert with_data(fields, view, align=1) == expected.SerializeToString()
        aligned = with_data(fields, view)
        assert unpadded(aligned, ps_pb2.PushChunk) == expected and (len(aligned) - len(view)) % 16 == 0


def unpadded(raw: bytes, message_type: type) -> Any:
    """The message `raw` parses to, after checking that its pad (alignment only) is zeros under 16
    bytes, with the pad cleared."""
    message = message_type.FromString(raw)
    assert len(message.pad) < 16 and not any(message.pad)
    message.ClearField("pad")
    return message
