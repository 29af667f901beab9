"""ps-cluster's command line run in this process, as a test reads it back."""

from __future__ import annotations

from typing import Any

import pytest

from deploy import cli


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`ps-cluster ARGV`'s exit status (argparse's own exits included), stdout and stderr."""
    try:
        code: Any = cli.main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err
