"""What the test suite leaves behind, in the temporary folder and in the working tree.

The suite's processes get a temporary folder of their own (``TMPDIR``, inherited by every process a
test starts), so what is in it at the end was left by the suite, whatever else the machine runs at
the same time; the working tree is compared with git before and after. pytest's own ``tmp_path``
folders live apart, in its base folder, and go with it at the end of a passing session.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.repo import ROOT

TMP_PREFIX = "hetero-ps-tests-"
# what running Python and pytest writes into a checkout: caches, not leftovers of a test
TREE_CACHES = ("__pycache__", ".pytest_cache", ".hypothesis", ".venv", ".egg-info", ".mypy_cache", ".ruff_cache")


class SuiteTmp:
    """A temporary folder made the default for this process and its children until `close`."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=TMP_PREFIX))
        self._previous = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = str(self.path)
        tempfile.tempdir = None  # gettempdir() reads TMPDIR again

    def leftovers(self) -> list[str]:
        """The names left in the folder."""
        return sorted(p.name for p in self.path.iterdir())

    def close(self) -> list[str]:
        """Restore the default temporary folder, remove this one; returns what was left in it."""
        left = self.leftovers()
        if self._previous is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = self._previous
        tempfile.tempdir = None
        shutil.rmtree(self.path, ignore_errors=True)
        return left


def untracked(root: Path = ROOT) -> set[str] | None:
    """The checkout's untracked and ignored paths, caches aside; None where git cannot tell."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--ignored", "--untracked-files=all"],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    paths = {line[3:] for line in out.splitlines() if line[:2] in ("??", "!!")}
    return {p for p in paths if not any(part.endswith(TREE_CACHES) for part in Path(p).parts)}


def report(tmp_left: list[str], tree_left: set[str]) -> str | None:
    """The failure message for what a session left behind; None when it left nothing."""
    parts = []
    if tmp_left:
        parts.append(f"in the temporary folder: {', '.join(tmp_left)}")
    if tree_left:
        parts.append(f"in the working tree: {', '.join(sorted(tree_left))}")
    return "the test suite left files behind " + "; ".join(parts) if parts else None
