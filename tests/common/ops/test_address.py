"""HOST:PORT, one rule (common.ops.address): what it accepts, what it refuses and why, and the
addresses it builds, which gRPC binds as named."""

from __future__ import annotations

import argparse

import grpc
import pytest

from common.ops import address
from common.ops.arg_types import host_name, host_port


@pytest.mark.parametrize(("text", "expected"), [
    ("127.0.0.1:50051", ("127.0.0.1", 50051)),
    ("localhost:1", ("localhost", 1)),
    ("node-3.cluster:65535", ("node-3.cluster", 65535)),
    ("[::1]:50051", ("::1", 50051)),
    ("[fe80::1%eth0]:7", ("fe80::1%eth0", 7)),
])
def test_an_address_splits_into_its_host_without_brackets_and_its_port(text: str, expected: tuple[str, int]) -> None:
    assert address.split(text) == expected
    assert address.join(*expected) == text


@pytest.mark.parametrize(("text", "says"), [
    ("::1:50051", "an IPv6 host in brackets"),
    ("127.0.0.1", "expected HOST:PORT"),
    ("127.0.0.1:0", "a port in 1-65535"),
    ("127.0.0.1:65536", "a port in 1-65535"),
    ("127.0.0.1:+5", "a port in 1-65535"),
    ("127.0.0.1:٥", "a port in 1-65535"),  # a digit to str.isdigit, not to gRPC
    (":50051", "the host is empty"),
    ("my host:50051", "a host is a name or an IP address"),
    ("[127.0.0.1]:50051", "brackets hold an IPv6 address"),
    ("[::1:50051", "an IPv6 host in brackets"),
    ("[:::1]:5", "is not an IPv6 address"),
])
def test_an_address_gRPC_would_read_otherwise_is_refused_saying_why(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("[", r"\[").replace("(", r"\(")):
        address.split(text)
    with pytest.raises(argparse.ArgumentTypeError):
        host_port(text)


def test_an_empty_host_or_port_0_is_taken_only_where_asked() -> None:
    """A server may advertise ":PORT" (its own host); a listener asks for port 0 (any free one)."""
    assert address.split(":7001", empty_host=True) == ("", 7001)
    assert address.split("127.0.0.1:0", any_port=True) == ("127.0.0.1", 0)


@pytest.mark.parametrize(("text", "host"), [("::1", "::1"), ("[::1]", "::1"), (" 0.0.0.0 ", "0.0.0.0"),
                                            ("node-3", "node-3")])
def test_a_listen_host_is_given_with_or_without_brackets_and_kept_without(text: str, host: str) -> None:
    assert host_name(text) == host


@pytest.mark.parametrize("text", ["", "[]", "a b", "::1::2", "[node]", "host/24"])
def test_a_listen_host_that_is_no_host_is_a_usage_error(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        host_name(text)


def test_an_ipv6_host_joined_is_bound_by_gRPC_on_that_port() -> None:
    """The address built for --host ::1 is one gRPC binds (it refuses "::1:0", reading no port)."""
    server = grpc.server(thread_pool=None)  # type: ignore[arg-type]
    try:
        assert server.add_insecure_port(address.join("::1", 0)) > 0
    finally:
        server.stop(None)
