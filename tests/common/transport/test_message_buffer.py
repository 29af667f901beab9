"""A message built in place (common.transport.message_buffer) holds exactly the header and the data written into it."""

from __future__ import annotations

import pytest
import torch

from common.transport.message_buffer import IN_PLACE, MessageBuffer


def test_this_interpreter_builds_messages_in_place() -> None:
    """CPython here: the in-place construction's layout check passes (otherwise framing pays a copy)."""
    assert IN_PLACE


@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("header", [b"", b"abc", bytes(range(16))])
def test_a_message_is_its_header_then_the_values_written(in_place: bool, header: bytes) -> None:
    values = torch.randn(1000)
    message = MessageBuffer(header, values.numel() * 4, in_place=in_place)
    message.values(torch.float32).copy_(values)
    out = message.finish()
    assert type(out) is bytes
    assert out == header + values.numpy().tobytes()


@pytest.mark.parametrize("in_place", [True, False])
def test_narrowing_into_a_message_equals_the_encoding(in_place: bool) -> None:
    values = torch.randn(999)
    message = MessageBuffer(b"h", values.numel() * 2, in_place=in_place)
    message.values(torch.bfloat16).copy_(values)
    assert message.finish()[1:] == values.to(torch.bfloat16).view(torch.int16).numpy().tobytes()


def test_an_empty_message_and_misuse() -> None:
    assert MessageBuffer(b"xy", 0).finish() == b"xy"
    assert MessageBuffer(b"xy", 0).values(torch.float32).numel() == 0
    with pytest.raises(ValueError, match="nbytes"):
        MessageBuffer(b"", -1)
    with pytest.raises(ValueError, match="whole"):
        MessageBuffer(b"", 6).values(torch.float32)
    message = MessageBuffer(b"", 4)
    message.data.fill_(7)
    assert message.finish() == b"\x07" * 4
    with pytest.raises(RuntimeError, match="already"):
        message.finish()


def test_many_messages_are_freed() -> None:
    """The bytes built through the C API are owned once: dropping them frees them (no leak per chunk)."""
    import gc
    import weakref

    message = MessageBuffer(b"h", 1 << 16)
    message.data.fill_(1)
    out = message.finish()
    view = message  # noqa: F841 (the buffer object itself may go too)
    probe = weakref.ref(message)
    del message, view
    gc.collect()
    assert probe() is None
    assert out == b"h" + b"\x01" * (1 << 16)
