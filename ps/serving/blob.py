"""Whole objects of tensors and plain values as chunked bytes (shard loads and fetches).

Pure: no I/O. A torch.save archive split into ~1 MiB chunks; reading it back uses
`weights_only=True`, so a blob can carry tensors, numbers, strings, lists and dicts and nothing
that runs code.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable
from typing import Any

import torch

from common.errors import InvalidArgument
from common.transport.wire import CHUNK_BYTES, split


def pack(obj: Any, chunk_bytes: int = CHUNK_BYTES) -> list[bytes]:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return split(buffer.getbuffer(), chunk_bytes)


def unpack(parts: Iterable[bytes | memoryview]) -> Any:
    """The object, or InvalidArgument for bytes that are not a safe torch archive."""
    data = b"".join(parts)
    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, KeyError) as exc:
        raise InvalidArgument(f"not a valid tensor archive ({len(data)} bytes): {str(exc).splitlines()[0][:200]}") from None
