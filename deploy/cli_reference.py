"""docs/cli.md, the command-line reference, rendered from the entry points' own argparse parsers.

Run from the repository root:  python -m deploy.cli_reference
(``--check`` compares instead of writing; the test suite uses it to catch a stale reference.)
The parsers are the one source of every flag, default and help text; this module only lays them
out as markdown, one table per argument group.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "cli.md"

PREAMBLE = """\
# Command-line reference

Every flag of the four commands, generated from their parsers (`python -m deploy.cli_reference`
rewrites this file; a test fails when it is stale). `COMMAND --help` prints the same.

Bad input on any command is one line on stderr, `PROG: error: ...`, naming the flag, and exit status
2, before anything starts: numbers must be finite and in range (`--lr inf`, `--weight-decay nan`,
`--port 70000`, `--min-batch 100 --max-batch 10` are refused), a port in use, a `--metrics-log` or
`--checkpoint-dir` that cannot be written, a TLS file that is not PEM are one-line errors too.
`ps-worker` takes every setting from an environment variable as well (`PS_SERVER`, `PS_NAME`, ...:
the list is under its table): a flag on the command line wins, and a bad value is refused like the
flag's, naming the variable.
"""

# Help texts that name something of the machine they run on, replaced so that the file is the same everywhere.
MACHINE_SPECIFIC = (
    (re.compile(r"minus 0\.5 for the server, [0-9.]+ here\)"), "minus 0.5 for the server)"),
)


def _commands() -> list[argparse.ArgumentParser]:
    from deploy.cli import build_parser as cluster_parser
    from ps.server_flags import build_parser as server_parser
    from ps.shards.server import build_parser as shard_parser
    from worker.flags import build_parser as worker_parser

    return [server_parser(), worker_parser(), cluster_parser(), shard_parser()]


def _cell(text: str) -> str:
    """Text for one table cell: one line, pipes escaped."""
    text = " ".join(text.split())
    for pattern, replacement in MACHINE_SPECIFIC:
        text = pattern.sub(replacement, text)
    return text.replace("|", "\\|")


def _flag(action: argparse.Action) -> str:
    names = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}`"
    if action.nargs == 0:
        return names
    if action.metavar is not None:
        value = action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    elif action.choices is not None:
        value = "{" + ",".join(str(c) for c in action.choices) + "}"
    else:
        value = action.dest.upper()
    if action.nargs == "?":
        value = f"[{value}]"
    return f"{names} `{value}`".replace("|", "\\|")


def _default(action: argparse.Action) -> str:
    default = action.default
    if default is None or default is argparse.SUPPRESS or default is False or default in ("", [], ()) or action.nargs == 0:
        return ""
    return f"`{action.default}`"


def _help(action: argparse.Action, parser: argparse.ArgumentParser) -> str:
    text = action.help or ""
    if "%(" in text:
        text = text % {**vars(action), "prog": parser.prog}
    return _cell(text)


def _table(actions: Sequence[argparse.Action], parser: argparse.ArgumentParser) -> Iterator[str]:
    rows = [a for a in actions if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)
            and not isinstance(a, argparse._SubParsersAction)]
    if not rows:
        return
    yield "| flag | default | meaning |"
    yield "|---|---|---|"
    for action in rows:
        yield f"| {_flag(action)} | {_default(action)} | {_help(action, parser)} |"
    yield ""


def _parser_section(title: str, parser: argparse.ArgumentParser, level: str) -> Iterator[str]:
    yield f"{level} {title}"
    yield ""
    if parser.description:
        yield _cell(parser.description)
        yield ""
    for group in parser._action_groups:
        actions = group._group_actions
        if not any(a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction) for a in actions):
            continue
        if group.title not in ("options", "optional arguments", "positional arguments"):
            yield f"**{group.title}**"
            yield ""
        yield from _table(actions, parser)
    if parser.epilog and parser.formatter_class is argparse.RawDescriptionHelpFormatter:
        yield "```text"
        yield from (line.rstrip() for line in parser.epilog.strip().splitlines())
        yield "```"
        yield ""
    elif parser.epilog:
        yield _cell(parser.epilog)
        yield ""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parser_section(f"`{sub.prog}`", sub, level + "#")


def render(commands: Callable[[], list[argparse.ArgumentParser]] = _commands) -> str:
    """The whole reference as markdown."""
    lines = [PREAMBLE]
    for parser in commands():
        lines.extend(_parser_section(f"`{parser.prog}`", parser, "##"))
    return "\n".join(lines).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.cli_reference", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/cli.md is stale instead of writing it")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT.relative_to(ROOT)} is stale: run python -m deploy.cli_reference", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
