"""What several ``ps-cluster`` subcommands share: the program's name, the subparsers they register on,
and the ``--mode``, ``--scale`` and port arguments, so each subcommand's module (deploy/k8s_command.py,
deploy/run_command.py, ...) declares them the same way."""

from __future__ import annotations

import argparse
from typing import TypeAlias

from common.ops.arg_types import positive_float, positive_int
from deploy.profiles import MODES, builtin_profiles

PROG = "ps-cluster"

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def port_in_range(text: str) -> int:
    """A TCP port, 1-65535."""
    port = positive_int(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"expected a port in 1-65535, got {text!r}")
    return port


def profile_argument(parser: argparse._ActionsContainer) -> None:
    """``--profile``: the heterogeneity profile, built-in or a file (a parser or one of its groups)."""
    parser.add_argument("--profile", default="hl8", metavar="NAME|PATH",
                        help=f"built-in profile ({', '.join(builtin_profiles())}) or a profile YAML file (default: hl8)")


def mode_argument(parser: argparse.ArgumentParser) -> None:
    """``--mode``: the training mode whose allocation of the profile to use."""
    parser.add_argument(
        "--mode", choices=MODES, default="bsp", type=str.lower,
        help="training mode whose allocation to use (default: bsp; asp also limits the server)",
    )


def scale_argument(parser: argparse.ArgumentParser) -> None:
    """``--scale``: a factor on the profile's cores."""
    parser.add_argument(
        "--scale", type=positive_float, default=1.0, metavar="F",
        help="multiply Table I cores by F, e.g. 0.25 on a 12-core host (default: 1, the paper's cores)",
    )
