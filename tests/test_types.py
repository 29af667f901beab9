"""The type checker passes: mypy, run as `mypy` from the repository root with pyproject.toml's
[tool.mypy] settings (strict on common/ and ps/control/), finds no error in any package it checks.

Its cache is the checkout's .mypy_cache (ignored by git): the first run in a fresh checkout takes
about half a minute (torch's stubs), later ones about a second.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import pytest

from tests.repo import ROOT


def configured_modules() -> set[str]:
    """The modules of the folders [tool.mypy] `files` names (a stub and its .py count once)."""
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]["files"]
    return {str(p.relative_to(ROOT).with_suffix("")) for folder in folders
            for p in (ROOT / folder).rglob("*.py*") if p.suffix in (".py", ".pyi") and "__pycache__" not in p.parts}


def test_mypy_finds_no_type_errors_in_any_module() -> None:
    try:
        import mypy  # noqa: F401
    except ImportError:
        pytest.fail("mypy is not installed: pip install -e '.[test]'")
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                            check=False)
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 0, f"mypy found type errors (run `mypy` from the repository root):\n{output}"
    checked = re.search(r"no issues found in (\d+) source files", output)
    assert checked is not None, output
    assert int(checked.group(1)) == len(configured_modules()), (
        f"mypy checked {checked.group(1)} modules of the {len(configured_modules())} in [tool.mypy] files: {output}")
