"""Serialized chunk messages (PushChunk, ParamsChunk) whose `data` is written with one copy.

A message built to carry a 1 MiB chunk costs a copy of the chunk into the message and another into
the bytes gRPC serializes it to. Here the chunk goes straight into the serialized bytes, and the
channels' and the server's serializers pass bytes through as they are (`passthrough`), so a chunk
that many replies share is serialized once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from google.protobuf.message import Message


@functools.lru_cache(maxsize=32)
def _data_field_prefix(message_type: type, size: int) -> bytes:
    """What protobuf writes before `size` bytes of the message type's `data` field: its tag and length."""
    return message_type(data=bytes(size)).SerializeToString()[:-size] if size else b""


def with_data(fields: Message, data: bytes | memoryview) -> bytes:
    """`fields` (a message without data) with `data` as its `data` field, serialized.

    A message may be sent as its fields' encodings one after the other; as long as `data` is the
    highest-numbered field set, these bytes are exactly what SerializeToString gives (protobuf writes
    fields in number order), and they parse to the same message in any case.
    """
    return b"".join((fields.SerializeToString(), _data_field_prefix(fields.__class__, len(data)), data))


def passthrough(serialize: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    """A gRPC serializer: `serialize` for messages, bytes (an already serialized message) as they are."""

    def run(message: Any) -> bytes:
        return message if isinstance(message, bytes) else serialize(message)

    return run
