"""A serialized message built in place: its bytes object is allocated first and its data written
straight into it, so framing costs no copy of values already written once.

gRPC's Python API sends `bytes` only, and a bytes object is normally made from a buffer that
already holds its contents: framing a parameter chunk then means writing the values (the optimizer
step, a bf16 narrowing) and copying them again into the message. CPython's C API has the other way,
the one its own code uses to build bytes: `PyBytes_FromStringAndSize(NULL, n)` allocates an object
whose contents are filled before anything else sees it. `MessageBuffer` does that through ctypes and
hands out the data region as a writable tensor; `finish()` returns the object, which nothing writes
to from then on. Where that is not available (another Python implementation, or the layout check
below fails) it falls back to a bytearray and one copy at `finish()`, with the same result.
"""

from __future__ import annotations

import ctypes
import platform
import sys

import torch

# where a bytes object's contents start (sizeof(PyBytesObject) counts the trailing NUL as well)
_DATA_OFFSET = sys.getsizeof(b"") - 1


def _bytes_constructor() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if platform.python_implementation() != "CPython":
        return None
    try:
        make = ctypes.pythonapi.PyBytes_FromStringAndSize
    except AttributeError:
        return None
    make.restype = ctypes.py_object
    make.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)
    return make


_make_bytes = _bytes_constructor()


def _writable(obj: bytes, offset: int, nbytes: int) -> ctypes.Array[ctypes.c_char]:
    """A ctypes array over `nbytes` of `obj`'s contents from `offset`; it keeps `obj` alive."""
    array = (ctypes.c_char * nbytes).from_address(id(obj) + _DATA_OFFSET + offset)
    array._owner = obj  # type: ignore[attr-defined]  # ctypes arrays take attributes; frombuffer keeps the array
    return array


def _in_place_works() -> bool:
    """Whether a bytes object built here reads back what was written into it (the layout assumed)."""
    if _make_bytes is None:
        return False
    try:
        obj = _make_bytes(None, 8)
        ctypes.memmove(_writable(obj, 0, 8), b"\x01\x02\x03\x04\x05\x06\x07\x08", 8)
        return bytes(obj) == b"\x01\x02\x03\x04\x05\x06\x07\x08" and len(obj) == 8
    except (OSError, TypeError, ValueError, MemoryError):
        return False


IN_PLACE = _in_place_works()


class MessageBuffer:
    """`header` followed by `nbytes` of data that the caller writes through `data` (a uint8 tensor,
    or `values(dtype)`) before `finish()`. Write every byte: the data starts uninitialized."""

    def __init__(self, header: bytes, nbytes: int, in_place: bool | None = None) -> None:
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        self._finished = False
        size = len(header) + nbytes
        self._in_place = IN_PLACE if in_place is None else in_place and IN_PLACE
        if self._in_place and nbytes:
            assert _make_bytes is not None
            self._message: bytes | bytearray = _make_bytes(None, size)
            if header:
                ctypes.memmove(_writable(self._message, 0, len(header)), header, len(header))
            self.data = torch.frombuffer(_writable(self._message, len(header), nbytes), dtype=torch.uint8)
        else:
            self._in_place = False
            self._message = bytearray(size)
            self._message[: len(header)] = header
            region = memoryview(self._message)[len(header) :]
            self.data = torch.frombuffer(region, dtype=torch.uint8) if nbytes else torch.empty(0, dtype=torch.uint8)

    def values(self, dtype: torch.dtype) -> torch.Tensor:
        """The data region as `dtype` values (its size must be a whole number of them)."""
        if self.data.numel() % dtype.itemsize:
            raise ValueError(f"{self.data.numel()} bytes are not whole {dtype} values")
        return self.data.view(dtype) if self.data.numel() else torch.empty(0, dtype=dtype)

    def finish(self) -> bytes:
        """The message; the buffer must not be written after this."""
        if self._finished:
            raise RuntimeError("MessageBuffer.finish() was already called")
        self._finished = True
        self.data = torch.empty(0, dtype=torch.uint8)
        return self._message if isinstance(self._message, bytes) else bytes(self._message)
