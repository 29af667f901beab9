"""ps-server arguments passed through another command (``--server-arg``), checked by ps-server's own parser.

``ps-cluster run``, ``ps-cluster k8s`` and ``ps-cluster slurm`` set some ps-server flags themselves and
pass the rest on; each refuses a flag it sets (abbreviated too: argparse takes ``--epoch=3`` for
``--epochs``) and lets ps-server's parser, and its checks of flags against each other, check the whole
command line before anything starts or is written.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable, Sequence
from typing import NoReturn

from ps.flag_checks import check_flags_together
from ps.server_flags import build_parser, settle_min_batch
from ps.shards.flags import read_shard_ca


def server_parser() -> argparse.ArgumentParser:
    """ps-server's own parser, raising ValueError where it would print its usage and exit."""
    parser = build_parser()

    def refuse(message: str) -> NoReturn:
        raise ValueError(f"ps-server would refuse these arguments: {message}")

    parser.error = refuse  # type: ignore[method-assign]
    return parser


def check_server_command(parser: argparse.ArgumentParser, argv: Sequence[str], files_here: bool = False) -> None:
    """ValueError if ps-server would refuse ``argv`` before building its job: its parser (from
    :func:`server_parser`), then its checks of flags against each other (--shard-addresses' entries and
    the TLS flags among them). `files_here`: the server runs on this machine, so the TLS files it and its
    shards read are read here too, as ps-server reads them (elsewhere they are a pod's or a node's). The
    model's BatchNorm floor on --min-batch is left to ps-server, which alone builds the model."""
    from common.transport.security import load_server_security

    args = parser.parse_args(list(argv))
    settle_min_batch(args, batchnorm=False)
    try:
        check_flags_together(args)
        if files_here:
            load_server_security(args.tls_cert, args.tls_key, args.tls_client_ca, args.token)
            read_shard_ca(args)
    except ValueError as exc:
        raise ValueError(f"ps-server would refuse these arguments: {exc}") from None


def option_named(flag: str, options: Sequence[str]) -> str:
    """The ps-server option that `flag` names: itself, or the one option it abbreviates."""
    if flag in options or not flag.startswith("--"):
        return flag
    matches = [option for option in options if option.startswith(flag)]
    return matches[0] if len(matches) == 1 else flag


def split_server_args(
    values: Sequence[str], parser: argparse.ArgumentParser, refused: Callable[[str], str | None]
) -> list[str]:
    """The ``--server-arg`` values split like a shell would; ValueError for a flag ``refused(flag)``
    gives a reason for (the text after the flag) or for ``--help``."""
    args: list[str] = []
    for value in values:
        args += shlex.split(value)
    options = [option for action in parser._actions for option in action.option_strings]
    for arg in args:
        given = arg.split("=", 1)[0]
        flag = option_named(given, options)
        shown = given if given == flag else f"{given} (that is {flag})"
        reason = refused(flag)
        if reason is not None:
            raise ValueError(f"--server-arg {shown}{reason}")
        if flag in ("-h", "--help"):
            raise ValueError("--server-arg --help: run ps-server --help to see its options")
    return args


def given_options(args: Sequence[str], parser: argparse.ArgumentParser) -> set[str]:
    """The ps-server options that ``args`` (already split) give, by their full names."""
    options = [option for action in parser._actions for option in action.option_strings]
    return {option_named(arg.split("=", 1)[0], options) for arg in args if arg.startswith("-")}
