"""A server's reply read into the worker's buffer (worker/transport/reply_receiver.py): a reply that ends
before its header is a server error."""

from __future__ import annotations

import pytest
import torch


def test_a_reply_that_ends_before_its_header_is_a_server_error() -> None:
    from worker.transport.client import ServerError
    from worker.transport.reply_receiver import receive

    with pytest.raises(ServerError, match="INTERNAL: the server's reply ended before its header"):
        receive(iter([]), torch.empty(0))
