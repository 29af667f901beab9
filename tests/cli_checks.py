"""What a refused command line must look like: exit 2, one line naming the problem, none of Python's
own wording, and nothing listening."""

from __future__ import annotations

import pytest

from ps.server import main as server_main

# What an error meant for a user never shows: Python's own wording and argparse's defaults.
PYTHON_INTERNALS = ("Traceback", "invalid literal", "invalid int value", "invalid float value", "use None", "[Errno",
                    "unexpected keyword argument")


def server_refuses(args: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    """ps-server's main on `args` (in this process) exits 2 with `needle` in one line and starts nothing."""
    try:
        code = server_main(["--port", "0", *args])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert any(needle in line for line in lines), captured.err
    assert not any(internal in captured.err for internal in PYTHON_INTERNALS), captured.err
    assert "listening" not in captured.out
