"""Serialized chunk messages (PushChunk, ParamsChunk) whose `data` is written and read without extra copies.

A message built to carry a 1 MiB chunk costs a copy of the chunk into the message and another into
the bytes gRPC serializes it to. Here the chunk goes straight into the serialized bytes, and the
channels' and the server's serializers pass bytes through as they are (`passthrough`), so a chunk
that many replies share is serialized once. On the way in, `data_view_parser` parses everything but
`data` and hands `data` out as a view of the received bytes (protobuf would copy it into a new
bytes object, twice with upb: once to parse, once on access).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

from google.protobuf.message import DecodeError, Message

_WIRE_VARINT, _WIRE_FIXED64, _WIRE_LENGTH, _WIRE_FIXED32 = 0, 1, 2, 5


@functools.lru_cache(maxsize=32)
def _data_field_prefix(message_type: type[Message], size: int) -> bytes:
    """What protobuf writes before `size` bytes of the message type's `data` field: its tag and length."""
    make: Callable[..., Message] = message_type  # a generated type takes its fields as keywords
    return make(data=bytes(size)).SerializeToString()[:-size] if size else b""


ALIGN = 16  # where `with_data` puts `data` in the message: at a multiple of this many bytes


def with_data(fields: Message, data: bytes | memoryview, align: int = ALIGN) -> bytes:
    """`fields` (a message without data) with `data` as its `data` field, serialized.

    A message may be sent as its fields' encodings one after the other; as long as `data` is the
    highest-numbered field set, these bytes are exactly what SerializeToString gives (protobuf writes
    fields in number order), and they parse to the same message in any case.

    With `align` (and a `pad` field in the message type) a `pad` field goes before `data`, sized so
    that `data` starts at a multiple of `align` bytes into the message. gRPC hands the receiver each
    message in a bytes object of its own whose buffer is 16-byte aligned, so the receiver's view of
    `data` is aligned too: torch's elementwise kernels read misaligned fp32 values at up to half
    speed. The bytes then differ from SerializeToString's order (pad comes before data, not after)
    and parse to the same message.
    """
    return b"".join((data_header(fields, len(data), align), data))


def data_header(fields: Message, size: int, align: int = ALIGN) -> bytes:
    """What `with_data` puts before `size` bytes of data: the fields, the pad, the data field's key
    and length (common.transport.message_buffer writes the data after it without a copy)."""
    head = fields.SerializeToString()
    # (the ignores: mypy takes a class object for unhashable when checking lru_cache's Hashable arguments)
    prefix = _data_field_prefix(fields.__class__, size)  # type: ignore[arg-type]
    pad_tag = _pad_tag(fields.__class__) if align > 1 and size else b""  # type: ignore[arg-type]
    if not pad_tag:
        return head + prefix
    used = len(head) + len(pad_tag) + 1 + len(prefix)  # the pad's length fits one varint byte (< align <= 127)
    return b"".join((head, pad_tag, bytes((-used % align,)), bytes(-used % align), prefix))


@functools.lru_cache(maxsize=32)
def _pad_tag(message_type: type[Message]) -> bytes:
    """The key of the message type's `pad` field (bytes), or b"" if it has none."""
    field = message_type.DESCRIPTOR.fields_by_name.get("pad")
    if field is None:
        return b""
    make: Callable[..., Message] = message_type  # a generated type takes its fields as keywords
    return make(pad=b"x").SerializeToString()[:-2]


def passthrough(serialize: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    """A gRPC serializer: `serialize` for messages, bytes (an already serialized message) as they are."""

    def run(message: Any) -> bytes:
        return message if isinstance(message, bytes) else serialize(message)

    return run


class DataChunk(NamedTuple):
    """A received chunk message: its fields but `data` (a parsed message), and `data` as a view."""

    fields: Any
    data: memoryview


def _varint(raw: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(raw) or shift > 63:
            raise DecodeError("truncated or overlong varint")
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def data_view_parser(message_type: type[Message]) -> Callable[[bytes], DataChunk]:
    """A gRPC deserializer for `message_type` (with a `bytes data` field): a DataChunk whose `data` is
    a view of the received bytes, not a copy. Raises DecodeError as `FromString` would (the fields
    but `data` are parsed by protobuf itself; groups, deprecated in proto3, are refused)."""
    data_number = message_type.DESCRIPTOR.fields_by_name["data"].number

    def parse(raw: bytes) -> DataChunk:
        view = memoryview(raw)
        other: list[memoryview] = []
        data = view[0:0]
        pos, end = 0, len(raw)
        while pos < end:
            start = pos
            key, pos = _varint(raw, pos)
            number, wire_type = key >> 3, key & 7
            if number == 0:
                raise DecodeError("field number 0")
            if wire_type == _WIRE_VARINT:
                _, pos = _varint(raw, pos)
            elif wire_type == _WIRE_FIXED64:
                pos += 8
            elif wire_type == _WIRE_FIXED32:
                pos += 4
            elif wire_type == _WIRE_LENGTH:
                length, pos = _varint(raw, pos)
                pos += length
                if number == data_number and pos <= end:
                    data = view[pos - length : pos]  # the last occurrence wins, as in protobuf
                    continue
            else:
                raise DecodeError(f"wire type {wire_type} (field {number}) is not supported")
            if pos > end:
                raise DecodeError("truncated message")
            other.append(view[start:pos])
        fields = message_type.FromString(b"".join(other))
        return DataChunk(fields, data)

    return parse
