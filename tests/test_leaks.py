"""The check that fails a session which leaves files behind (tests/leaks.py, conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.leaks import SuiteTmp, report, untracked


def test_the_suites_temporary_folder_collects_what_its_processes_leave() -> None:
    tmp = SuiteTmp()
    try:
        assert tempfile.gettempdir() == str(tmp.path) and os.environ["TMPDIR"] == str(tmp.path)
        fd, _ = tempfile.mkstemp(prefix="mine-")
        os.close(fd)
        subprocess.run([sys.executable, "-c", "import tempfile; tempfile.mkdtemp(prefix='child-')"], check=True)
        left = tmp.leftovers()
        assert [name.split("-")[0] for name in left] == ["child", "mine"]
    finally:
        assert tmp.close() == left
    assert not tmp.path.exists() and tempfile.gettempdir() != str(tmp.path)
    message = report(left, set())
    assert message is not None and message.startswith("the test suite left files behind in the temporary folder: child-")


def test_new_files_in_the_working_tree_are_seen_and_caches_are_not(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("*.log\n")
    before = untracked(tmp_path)
    assert before == {".gitignore"}
    (tmp_path / "ps-shards-x").mkdir()
    (tmp_path / "ps-shards-x" / "shard1.port").write_text("1")
    (tmp_path / "run.log").write_text("")
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "__pycache__" / "m.pyc").write_bytes(b"")
    after = untracked(tmp_path)
    assert after is not None and after - before == {"ps-shards-x/shard1.port", "run.log"}
    assert report([], after - before) == "the test suite left files behind in the working tree: ps-shards-x/shard1.port, run.log"
    assert report([], set()) is None


def test_a_session_that_leaves_a_temporary_file_fails(tmp_path: Path) -> None:
    """A session whose test leaves a file in the temporary folder fails, naming it (a clean session
    passing is the whole suite's own run)."""
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "conftest.py").write_text("from tests.conftest import nothing_left_behind  # noqa: F401\n")
    (tmp_path / "test_it.py").write_text("import tempfile\n\n\ndef test_it():\n    tempfile.mkstemp(prefix='leaked-')\n")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
         "--basetemp", str(tmp_path / "basetemp"), str(tmp_path / "test_it.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False, env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert result.returncode == 1, result.stdout
    assert "1 passed, 1 error" in result.stdout
    assert "the test suite left files behind in the temporary folder: leaked-" in result.stdout
