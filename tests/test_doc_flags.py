"""Every flag the README and docs/ give a command exists on that command's parser, by its full name.

A command line is a code span, or a line of a code block (a line ending in ``\\`` joined to the next);
a flag counts only after a command's name on it: ``ps-server``, ``ps-worker``, ``ps-shard``,
``ps-cluster SUBCOMMAND``, ``python -m ps.server``, ``python -m worker.cli``, ``python -m benchmarks.X``.
A bare flag in prose is not checked, nor what ``--`` ends or a ``#`` comment holds, nor a flag's value
but ``--server-arg``'s, whose flags are ps-server's (``ps-cluster run --server-arg=--deadband=0.2``).
The commands' parsers are the ones docs/cli.md is rendered from (deploy/cli_reference.py); a
benchmark's is its module's ``build_parser()``, or its package's ``cli.build_parser()``, which a
benchmark the docs name must have.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from deploy import cli_reference
from tests.repo import ROOT

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
COMMAND = re.compile(
    r"(?<![\w./-])(ps-server|ps-worker|ps-shard|ps-cluster|python3? -m (?:ps\.server|worker\.cli|benchmarks(?:\.\w+)+))"
    r"(?![\w-])")
SEPARATOR = re.compile(r"\s(?:&&|\|\||[|;&])\s|\s#|(?:^|\s)--(?:\s|$)")
FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")
# ps-cluster's subcommands pass this flag's value on to ps-server, whose flags it holds.
PASSED_ON = "--server-arg"
# The setting of docs/policies.md's example policy, a flag only where that policy is registered.
EXAMPLE_FLAGS = {"--toy-share"}
ALIASES = {"python -m ps.server": "ps-server", "python -m worker.cli": "ps-worker"}


def command_lines(text: str) -> Iterator[str]:
    """The code spans of a page's prose and the lines of its code blocks."""
    prose: list[str] = []
    block: list[str] | None = None
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if block is None:
                block = []
            else:
                yield from block
                block = None
        elif block is not None:
            if block and block[-1].endswith("\\"):
                block[-1] = block[-1][:-1] + " " + line.strip()
            else:
                block.append(line)
        else:
            prose.append(line)
    yield from (" ".join(span.split()) for span in re.findall(r"`([^`]+)`", "\n".join(prose)))


def shell_words(text: str) -> list[str]:
    """The words a shell splits `text` into, quotes kept together (plain whitespace if they do not pair)."""
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def cited_flags(line: str) -> Iterator[tuple[str, str]]:
    """(command, flag) for each flag after a command's name on one command line, and (command, "") for
    the command itself."""
    matches = list(COMMAND.finditer(line))
    for match, following in zip(matches, [*matches[1:], None]):
        rest = line[match.end():following.start() if following else len(line)]
        end = SEPARATOR.search(rest)
        rest = rest[:end.start()] if end else rest
        command = re.sub(r"^python3 ", "python ", match.group(1))
        command = ALIASES.get(command, command)
        words = shell_words(rest)
        if command == "ps-cluster" and words and not words[0].startswith("-"):
            command, words = f"ps-cluster {words[0]}", words[1:]
        yield command, ""
        words.reverse()
        while words:
            word = words.pop()
            flag = FLAG.match(word)
            if flag:
                yield command, flag.group()
            if flag and flag.group() == PASSED_ON:
                value = word.partition("=")[2] if "=" in word else words.pop() if words else ""
                yield from (("ps-server", name) for name in FLAG.findall(value) if name not in EXAMPLE_FLAGS)


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """A parser's subcommands by name."""
    return {name: sub for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for name, sub in action.choices.items()}


@cache
def parsers() -> dict[str, argparse.ArgumentParser]:
    """The four commands' parsers and ps-cluster's subcommands', by the name the docs use."""
    found: dict[str, argparse.ArgumentParser] = {}
    for parser in cli_reference._commands():
        found[parser.prog] = parser
        found.update({sub.prog: sub for sub in subcommands(parser).values()})
    return found


@cache
def benchmark_parser(module: str) -> argparse.ArgumentParser | None:
    """`python -m benchmarks.X`'s parser from its build_parser(), or None when it has none."""
    imported = importlib.import_module(module)
    build = getattr(imported, "build_parser", None)
    if build is None and hasattr(imported, "__path__"):
        build = getattr(importlib.import_module(f"{module}.cli"), "build_parser", None)
    return build() if build is not None else None


def parser_of(command: str) -> argparse.ArgumentParser | None:
    """The parser of a command as the docs write it; None for a benchmark without one."""
    if command.startswith("python -m benchmarks."):
        return benchmark_parser(command.removeprefix("python -m "))
    return parsers().get(command)


def option_names(parser: argparse.ArgumentParser) -> set[str]:
    return {name for action in parser._actions for name in action.option_strings}


def drifts(text: str) -> list[str]:
    """'command --flag' for each flag a page gives a command that the command's parser lacks."""
    wrong = []
    for line in command_lines(text):
        for command, flag in cited_flags(line):
            try:
                parser = parser_of(command)
            except ModuleNotFoundError:
                wrong += [] if flag else [f"{command}: no such module"]
                continue
            if parser is None and command.startswith("ps-cluster ") and not flag:
                wrong.append(f"{command}: no such subcommand")
            elif parser is None and not flag:
                wrong.append(f"{command}: no build_parser()")
            elif parser is not None and flag and flag not in option_names(parser):
                wrong.append(f"{command} {flag}")
    return wrong


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_flag_a_page_gives_a_command_is_on_its_parser(page: Path) -> None:
    assert drifts(page.read_text(encoding="utf-8")) == []


def test_the_check_catches_a_made_up_flag() -> None:
    page = ("Run `ps-server --no-such-flag 3` or\n\n```bash\nps-worker --server h:1 \\\n  --made-up\n"
            "ps-cluster run --profile hl8 --quick && python -m benchmarks.scale --nope\n```\n"
            "`ps-cluster run --epoch 3` (a prefix), `ps-cluster nothing --x`, `--bare` in prose,\n"
            "`ps-cluster slurm --server-arg='--lr 1 --made-up'`, `python -m benchmarks.no_such --x`,\n"
            "`python -m benchmarks.cli_types --x`.\n")
    assert drifts(page) == ["ps-worker --made-up", "python -m benchmarks.scale --nope", "ps-server --no-such-flag",
                            "ps-cluster run --epoch", "ps-cluster nothing: no such subcommand", "ps-server --made-up",
                            "python -m benchmarks.no_such: no such module",
                            "python -m benchmarks.cli_types: no build_parser()"]


def test_a_flag_belongs_to_the_command_before_it() -> None:
    line = "ps-shard --port 1 & ps-worker --server=h:1 --name 'a --b' -- --ignored  # --comment"
    assert [pair for pair in cited_flags(line) if pair[1]] == [
        ("ps-shard", "--port"), ("ps-worker", "--server"), ("ps-worker", "--name")]


def test_server_arg_holds_ps_servers_flags() -> None:
    line = "ps-cluster k8s --server-arg='--epochs 2' --server-arg '--lr 1' --server-arg=--toy-share=5 --out x"
    assert [pair for pair in cited_flags(line) if pair[1]] == [
        ("ps-cluster k8s", "--server-arg"), ("ps-server", "--epochs"), ("ps-cluster k8s", "--server-arg"),
        ("ps-server", "--lr"), ("ps-cluster k8s", "--server-arg"), ("ps-cluster k8s", "--out")]

