"""Command-line options that may also come from environment variables; a flag on the command line wins.

Containers and Kubernetes pods pass settings as environment variables (a compose file's
``environment:``, a Deployment's ``env:`` with values from a Secret), so ``ps-worker`` reads each of
its settings from ``PS_<NAME>`` when the flag is not given. The value goes through the option's own
type and choices; a bad value is a usage error that names the variable. A repeatable option takes
a comma-separated list.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class _NotGiven:
    """Marks an option that the command line did not give."""

    def __repr__(self) -> str:
        return "<not given>"


_NOT_GIVEN = _NotGiven()


def env_help(variables: Mapping[str, str]) -> str:
    """An epilog line listing the variables, for ``--help``."""
    return "environment (a flag wins): " + ", ".join(
        f"{var} ({'--' + dest.replace('_', '-')})" for dest, var in variables.items()
    )


def parse_with_environment(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    variables: Mapping[str, str],
    environ: Mapping[str, str] | None = None,
    required: tuple[str, ...] = (),
) -> argparse.Namespace:
    """Parse ``argv``; an option in ``variables`` (``dest -> VARIABLE``) that is not on the command
    line takes the variable's value (when set and not empty), else its default.

    ``required`` names destinations that must come from one or the other; give them to the parser
    as optional (``required=False``) options.
    """
    environ = os.environ if environ is None else environ
    actions = {action.dest: action for action in parser._actions if action.dest in variables}
    missing = set(variables) - set(actions)
    if missing:
        raise ValueError(f"no such option(s): {', '.join(sorted(missing))}")
    # a repeatable option (default None) appends to what the namespace holds: None is its "not given"
    appended = {dest for dest, action in actions.items() if isinstance(action, argparse._AppendAction)}
    args = parser.parse_args(argv, argparse.Namespace(**{dest: _NOT_GIVEN for dest in actions if dest not in appended}))
    for dest, action in actions.items():
        if getattr(args, dest) is not (None if dest in appended else _NOT_GIVEN):
            continue  # the flag wins
        variable = variables[dest]
        raw = environ.get(variable, "")
        if raw.strip():
            setattr(args, dest, _convert(parser, action, variable, raw.strip()))
        elif dest in required:
            parser.error(f"the following arguments are required: {action.option_strings[0]} (or set {variable})")
        else:
            setattr(args, dest, action.default)
    return args


def _convert(parser: argparse.ArgumentParser, action: argparse.Action, variable: str, raw: str) -> Any:
    """``raw`` as the option would take it, or a usage error naming ``variable``."""

    def refuse(why: str) -> NoReturn:
        parser.error(f"{variable}={raw!r}: {why}")

    if isinstance(action, argparse._StoreTrueAction):
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        refuse("expected one of " + ", ".join(sorted(_TRUE | _FALSE)))
    if isinstance(action, argparse._AppendAction):
        return [_convert_one(action, variable, part.strip(), refuse) for part in raw.split(",") if part.strip()]
    if action.nargs not in (None, 1) and not isinstance(action, argparse._StoreAction):
        raise ValueError(f"option {action.dest} cannot come from the environment")
    return _convert_one(action, variable, raw, refuse)


def _convert_one(action: argparse.Action, variable: str, raw: str, refuse: Callable[[str], NoReturn]) -> Any:
    """One value of ``raw`` through the option's type and choices."""
    value: Any = raw
    if action.type is not None:
        try:
            value = action.type(raw)  # type: ignore[operator]
        except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
            refuse(str(exc) or f"invalid value for {action.option_strings[0]}")
    if action.choices is not None and value not in action.choices:
        refuse(f"invalid choice (choose from {', '.join(map(str, action.choices))})")
    return value
