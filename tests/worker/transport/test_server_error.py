"""A server's words as a worker shows them (worker/transport/server_error.py): one printable line, cut
to a bound, whatever the server put in an error's details."""

from __future__ import annotations

import grpc
import pytest

from tests.hostile_server import Scenario, serving
from worker.connection import connect
from worker.transport.server_error import MAX_TOLD, ServerError, printable


@pytest.mark.parametrize(("told", "shown"), [
    ("plain words, 'quoted' and ünïcode", "plain words, 'quoted' and ünïcode"),
    ("a\x1b[2J\nps-worker: job done\r\t", "a\\x1b[2J\\nps-worker: job done\\r\\t"),
    ("\u202eevil\x00", "\\u202eevil\\x00"),
], ids=["printable-as-is", "escapes-and-line-breaks", "bidi-and-nul"])
def test_what_is_not_printable_is_shown_as_its_escape(told: str, shown: str) -> None:
    assert printable(told) == shown


def test_a_long_text_is_cut_to_the_bound() -> None:
    assert printable("x" * 10, 8) == "xxxxx..." and printable("x" * 8, 8) == "x" * 8
    assert len(printable("\n" * 100_000)) == MAX_TOLD


def test_a_servers_error_details_become_one_printable_line() -> None:
    with serving(Scenario(join_error="no\x1b[31m\nps-worker: job done after 99 steps")) as (_, target):
        with pytest.raises(ServerError) as raised:
            connect(target, name="w", timeout=5.0, retry_for=0.0, max_batch=16, threads=None).close()
    assert raised.value.code == grpc.StatusCode.FAILED_PRECONDITION.name
    assert str(raised.value) == "FAILED_PRECONDITION: no\\x1b[31m\\nps-worker: job done after 99 steps"
