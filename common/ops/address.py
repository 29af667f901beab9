"""HOST:PORT, one rule for every address the project reads, checks or builds: a name or an IPv4
address, or an IPv6 address in brackets (`[::1]:50051`), then a port in 1-65535. gRPC reads an
unbracketed IPv6 address (`::1:50051`) as a host with no port, and binds or dials another port than
the one named, so such an address is refused rather than passed on."""

from __future__ import annotations

import ipaddress

MAX_PORT = 65535
WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")
"""Hosts that bind every interface: one who reaches a service listening there dials another host of it."""


def listen_host(text: str) -> str:
    """A host to listen on or to name (`--host`): a name, an IPv4 address, or an IPv6 address with or
    without brackets; returned without brackets. ValueError naming what is wrong."""
    host = text.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if ":" not in host:
            raise ValueError(f"brackets hold an IPv6 address, got {text!r}")
    if not host:
        raise ValueError("the host is empty")
    if any(c.isspace() or c in "[]/" or not c.isprintable() for c in host):
        raise ValueError(f"a host is a name or an IP address, got {text!r}")
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{text!r} has a ':' but is not an IPv6 address") from None
    return host


def split(address: str, *, empty_host: bool = False, any_port: bool = False) -> tuple[str, int]:
    """(host without brackets, port) of HOST:PORT. `empty_host`: ":PORT" is allowed (the host is ""),
    `any_port`: port 0 is (a listener's "any free port"). ValueError naming what is wrong."""
    host, sep, port = address.rpartition(":")
    low = 0 if any_port else 1
    if not (sep and port.isascii() and port.isdigit() and low <= int(port) <= MAX_PORT):
        raise ValueError(f"expected HOST:PORT with a port in {low}-{MAX_PORT}, got {address!r}")
    bracketed = host.startswith("[") and host.endswith("]")
    if not bracketed and ":" in host:
        raise ValueError(f"expected HOST:PORT with an IPv6 host in brackets ([::1]:PORT), got {address!r}")
    if host or not empty_host:
        try:
            host = listen_host(host)
        except ValueError as exc:
            raise ValueError(f"expected HOST:PORT, got {address!r}: {exc}") from None
    return host, int(port)


def join(host: str, port: int) -> str:
    """HOST:PORT with an IPv6 host in brackets (`host` with or without them)."""
    host = host.strip("[]")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def host_of(address: str) -> str:
    """The host of HOST:PORT ([v6]:PORT too), without brackets; "" where there is none."""
    return address.rpartition(":")[0].strip("[]")
