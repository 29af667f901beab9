"""What the token check reads of a call (common/transport/security.py): the peer's address, without
its port, as gRPC names it; whether an address is loopback."""

from __future__ import annotations

from common.transport.security import is_loopback, peer_host


def test_the_peer_address_is_the_host_without_its_port() -> None:
    assert peer_host("ipv4:10.0.0.2:5000") == "10.0.0.2"
    assert peer_host("ipv6:[::1]:5000") == "::1"
    assert peer_host("ipv6:%5B::1%5D:5000") == "::1"
    assert peer_host("ipv6:[::ffff:127.0.0.1]:5000") == "127.0.0.1"
    assert peer_host("unix:/tmp/s") == "localhost"
    assert peer_host("odd") == "odd"
    assert [is_loopback(peer_host(p)) for p in ("ipv4:127.0.0.1:1", "ipv6:[::1]:1", "unix:/s", "ipv4:10.0.0.2:1")] == [
        True, True, True, False]
