"""argparse types for numbers and addresses that must be in range: a flag given nan, inf, a negative
count or a port that cannot exist is a usage error (exit 2) at once, never a value a program runs
with until it fails somewhere else."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar

from common.ops import address

T = TypeVar("T")


def from_value_error(parse: Callable[[str], T]) -> Callable[[str], T]:
    """`parse` as an argparse type whose ValueError is a usage error with its own message (argparse
    turns a ValueError into "invalid <name> value", which says nothing of why)."""

    def checked(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    checked.__name__ = getattr(parse, "__name__", "value")
    return checked


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


def float_between(low: float, high: float, *, low_open: bool = False, high_open: bool = False) -> Callable[[str], float]:
    """A type for a finite number in the interval from `low` to `high`, each end open or closed."""
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"

    def parse(text: str) -> float:
        value = _finite(text)
        if value < low or value > high or (low_open and value == low) or (high_open and value == high):
            raise argparse.ArgumentTypeError(f"expected a number in {interval}, got {text!r}")
        return value

    return parse


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def int_at_least(least: int) -> Callable[[str], int]:
    """A type for a whole number >= `least`."""

    def parse(text: str) -> int:
        value = _whole(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {least}, got {text!r}")
        return value

    return parse


def int_between(low: int, high: int) -> Callable[[str], int]:
    """A type for a whole number from `low` to `high`, both included."""

    def parse(text: str) -> int:
        value = _whole(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected a whole number in [{low}, {high}], got {text!r}")
        return value

    return parse


def positive_int(text: str) -> int:
    """A whole number > 0."""
    value = _whole(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a whole number > 0, got {text!r}")
    return value


class EvalInterval(tuple[int, int]):
    """Epochs between evaluations as (every, per_epoch): every N-th epoch's end (N, 1), or K times an
    epoch, at each K-th of its samples (1, K)."""

    @property
    def every(self) -> int:
        return self[0]

    @property
    def per_epoch(self) -> int:
        return self[1]

    def flag(self) -> str:
        """The value as `eval_interval` reads it back."""
        return str(self.every) if self.per_epoch == 1 else repr(1.0 / self.per_epoch)


def eval_interval(text: str) -> EvalInterval:
    """Epochs between evaluations: a whole number N >= 1 (every N-th epoch), or 1/K for a whole K (0.5,
    0.25, 0.1: K times an epoch)."""
    value = positive_float(text)
    if value >= 1:
        if value != int(value):
            raise argparse.ArgumentTypeError(f"expected a whole number of epochs or 1/K (0.5, 0.25, ...), got {text!r}")
        return EvalInterval((int(value), 1))
    per_epoch = round(1.0 / value)
    if abs(per_epoch * value - 1.0) > 1e-6:
        raise argparse.ArgumentTypeError(f"expected a whole number of epochs or 1/K (0.5, 0.25, ...), got {text!r}")
    return EvalInterval((1, per_epoch))


def epoch_or_steps(text: str) -> int | None:
    """`epoch` -> None (at every epoch end), or a whole number of steps > 0."""
    if text == "epoch":
        return None
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected 'epoch' or a whole number of steps > 0, got {text!r}") from None


def increasing_ints(text: str) -> tuple[int, ...]:
    """Comma-separated whole numbers >= 1 in increasing order ("" for none), e.g. epochs `5,8`."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, e.g. 5,8, got {text!r}")
    values = tuple(int(p) for p in parts)
    if any(v < 1 for v in values) or any(b <= a for a, b in zip(values, values[1:])):
        raise argparse.ArgumentTypeError(f"expected increasing whole numbers >= 1, got {text!r}")
    return values


def _host_port(text: str) -> str:
    address.split(text.strip())
    return text.strip()


host_port = from_value_error(_host_port)
"""HOST:PORT, as given (stripped), with a port in 1-65535 ([::1]:PORT for IPv6: address.split)."""
host_name = from_value_error(address.listen_host)
"""--host: a name, an IPv4 address or an IPv6 one (brackets optional), without brackets."""


def port_number(text: str) -> int:
    """A TCP port, 0-65535 (0: the system picks a free one)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in 0-65535, got {text!r}")
    return value


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's `(default: X)` after each flag's help, but not on a flag that stores False, whose default
    True would read as the flag being on (`--no-park (default: True)`), nor where the default is None
    (unset), which says nothing the help does not."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if isinstance(action, argparse._StoreFalseAction) or action.default is None:
            return action.help
        return super()._get_help_string(action)
