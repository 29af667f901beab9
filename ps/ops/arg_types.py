"""argparse types for numbers and addresses that must be in range: a flag given nan, inf, a negative
count or a port that cannot exist is a usage error (exit 2) at once, never a value a program runs
with until it fails somewhere else."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def float_at_least(least: float) -> Callable[[str], float]:
    """A type for a finite number >= `least`."""

    def parse(text: str) -> float:
        value = _finite(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"expected a number >= {least:g}, got {text!r}")
        return value

    return parse


def positive_int(text: str) -> int:
    """A whole number > 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a whole number > 0, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """A whole number >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return value


def is_host_port(text: str) -> bool:
    """Whether `text` is HOST:PORT with a port in 1-65535 ([::1]:PORT for IPv6)."""
    host, sep, port = text.strip().rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) <= 65535)


def host_port(text: str) -> str:
    """HOST:PORT, as given (stripped), with a port in 1-65535."""
    if not is_host_port(text):
        raise argparse.ArgumentTypeError(f"expected HOST:PORT with a port in 1-65535, got {text!r}")
    return text.strip()


def port_number(text: str) -> int:
    """A TCP port, 0-65535 (0: the system picks a free one)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in 0-65535, got {text!r}")
    return value
