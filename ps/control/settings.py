"""A batch policy's own settings, declared by the policy: each setting's name, type, default, bounds or
choices and help. PolicyConfig checks a policy's values against its declarations (and fills in the
defaults); ps/server_flags.py makes each one a `--<policy>-<setting>` flag. Pure: no argparse here."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ps.control.checks import integer, real

KINDS: tuple[type, ...] = (int, float, bool, str)


@dataclass(frozen=True)
class Setting:
    """One setting a policy declares (`WorkerPlan.settings`): a number within [low, high] (an end None
    is unbounded; `low_open`/`high_open` leave it out), a choice among `choices`, or a switch (bool)."""

    name: str
    """A Python identifier; the flag is `--<policy>-<name>` with `_` as `-`."""
    kind: type
    default: Any
    help: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"a setting's name must be an identifier, got {self.name!r}")
        if self.kind not in KINDS:
            raise ValueError(f"setting {self.name}: kind must be one of int, float, bool, str, got {self.kind!r}")
        if self.choices and self.kind is not str:
            raise ValueError(f"setting {self.name}: choices are for str settings")
        if (self.low is not None or self.high is not None) and self.kind not in (int, float):
            raise ValueError(f"setting {self.name}: bounds are for int and float settings")
        object.__setattr__(self, "default", self.check(self.default))

    def check(self, value: Any) -> Any:
        """`value` as this setting's type, or ValueError saying what it must be."""
        if self.kind is bool:
            if not isinstance(value, bool):
                raise ValueError(f"{self.name} must be true or false, got {value!r}")
            return value
        if self.kind is str:
            if not isinstance(value, str) or (self.choices and value not in self.choices):
                allowed = f"one of {', '.join(self.choices)}" if self.choices else "a string"
                raise ValueError(f"{self.name} must be {allowed}, got {value!r}")
            return value
        number = integer(self.name, value) if self.kind is int else real(self.name, value)
        if not self._within(number):
            raise ValueError(f"{self.name} must be in {self.interval()}, got {number}")
        return number

    def parse(self, text: str) -> Any:
        """A value given as text (a flag's), checked."""
        if self.kind is bool:
            words = {"true": True, "on": True, "1": True, "false": False, "off": False, "0": False}
            if text.lower() not in words:
                raise ValueError(f"{self.name} must be true or false, got {text!r}")
            return self.check(words[text.lower()])
        if self.kind is str:
            return self.check(text)
        try:
            number = int(text) if self.kind is int else float(text)
        except ValueError:
            raise ValueError(f"{self.name} must be {'a whole number' if self.kind is int else 'a number'}, "
                             f"got {text!r}") from None
        return self.check(number)

    def interval(self) -> str:
        """The bounds as an interval, "[1, 8)"; "(-inf, inf)" when unbounded."""
        low = "-inf" if self.low is None else f"{self.low:g}"
        high = "inf" if self.high is None else f"{self.high:g}"
        return f"{'(' if self.low_open or self.low is None else '['}{low}, {high}{')' if self.high_open or self.high is None else ']'}"

    def flag(self, policy: str) -> str:
        """The ps-server flag of this setting of `policy`."""
        return setting_flag(policy, self.name)

    def _within(self, number: float) -> bool:
        if isinstance(number, float) and not math.isfinite(number):
            return False
        low_ok = self.low is None or (number > self.low if self.low_open else number >= self.low)
        high_ok = self.high is None or (number < self.high if self.high_open else number <= self.high)
        return low_ok and high_ok


def setting_flag(policy: str, name: str) -> str:
    """`--<policy>-<name>`, underscores as dashes."""
    return f"--{policy}-{name}".replace("_", "-")


def setting_key(policy: str, name: str) -> str:
    """How a change of the setting is named where a resume reports it: `<policy>.<name>`."""
    return f"{policy}.{name}"


def checked_options(policy: str, declared: tuple[Setting, ...], given: Mapping[str, Any]) -> dict[str, Any]:
    """`given` values of `policy`'s settings, checked, with the declared defaults for the rest, in the
    declared order; ValueError for a setting the policy does not declare or a value out of bounds."""
    if not isinstance(given, Mapping):
        raise ValueError(f"options must be a mapping of {policy}'s settings, got {type(given).__name__}")
    names = {s.name for s in declared}
    unknown = sorted(set(given) - names)
    if unknown:
        has = f"its settings are {', '.join(sorted(names))}" if names else "it declares none"
        raise ValueError(f"policy {policy} has no setting {', '.join(map(repr, unknown))} ({has})")
    return {s.name: s.check(given[s.name]) if s.name in given else s.default for s in declared}
