"""argparse types the benchmarks share: comma-separated parameter counts, integers and choices, a folder to write
into; the emulation options of the benchmarks that run an emulated cluster with --quick."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

from common.ops.arg_types import positive_float


def counts(least: int, most: float | None = None) -> Callable[[str], list[int]]:
    """Comma-separated parameter counts like 1e6,25e6, each in [least, most]."""
    bound = f">= {least}" + (f" and <= {most:g}" if most is not None else "")

    def parse(text: str) -> list[int]:
        try:
            values = [int(float(v)) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers like 1e6,25e6, got {text!r}") from None
        if not values or any(v < least or (most is not None and v > most) for v in values):
            raise argparse.ArgumentTypeError(f"expected comma-separated parameter counts {bound}, got {text!r}")
        return values

    return parse


def ints(text: str, least: int = 1) -> list[int]:
    """Comma-separated integers >= `least`."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < least for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= {least}, got {text!r}")
    return values


def distinct_ints(text: str, least: int, what: str) -> list[int]:
    """Comma-separated distinct integers >= `least`, named `what` in the error."""
    values = ints(text, least=least)
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"expected distinct {what}, got {text!r}")
    return values


def seeds(text: str) -> list[int]:
    """Comma-separated distinct seeds >= 0."""
    return distinct_ints(text, 0, "seeds")


def choices(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    """Comma-separated names, each one of `allowed`."""
    def parse(text: str) -> list[str]:
        values = [v.strip() for v in text.split(",") if v.strip()]
        bad = [v for v in values if v not in allowed]
        if not values or bad:
            raise argparse.ArgumentTypeError(f"choose from {','.join(allowed)}; got {text!r}")
        return values

    return parse


def folder(text: str) -> Path:
    """A folder to write into: one that exists, or a path where nothing does yet (made when written)."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a folder")
    return path


def parse_resolved(parser: argparse.ArgumentParser, argv: Sequence[str] | None,
                   resolve: Callable[[argparse.Namespace], None]) -> argparse.Namespace:
    """The parsed flags after ``resolve`` filled the defaults that depend on others; its ValueError (what the
    parser cannot check) ends the program as a bad flag does: one line and exit 2."""
    args = parser.parse_args(argv)
    try:
        resolve(args)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def emulation_arguments(parser: argparse.ArgumentParser) -> None:
    """The emulation group: --cpu-budget and --limiter (slowdown under --quick)."""
    emu = parser.add_argument_group("emulation")
    emu.add_argument("--cpu-budget", type=positive_float, metavar="CORES",
                     help="cores shared by the workers, in the profile's ratios (default: usable CPUs - 0.5)")
    emu.add_argument("--limiter", choices=["auto", "cgroup", "slowdown"],
                     help="cgroup quotas, or software slowdown (default: auto; --quick: slowdown)")
